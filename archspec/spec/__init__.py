"""The spec language: the pydantic models of a spec (:mod:`archspec.spec.models`), YAML loading with line
numbers (:mod:`~archspec.spec.yaml_source`), the JSON Schema (:mod:`~archspec.spec.schema`) and the Markdown
field reference (:mod:`~archspec.spec.reference`).

Torch-free.  The names of :mod:`archspec.spec.models` are re-exported here, so ``from archspec.spec import
ArchSpec`` is the way users import them.
"""

from archspec.spec.models import (
    SPEC_DIR,
    AnyStage,
    ArchSpec,
    AttentionMixerSpec,
    ClassAttentionSpec,
    ConvStageSpec,
    ConvStemSpec,
    GPSAMixerSpec,
    GPSASpec,
    HeadOutSpec,
    HeadSpec,
    IdentityStemSpec,
    InputSpec,
    LayerOverride,
    LayerPlan,
    MapToTokensSpec,
    MaskSpec,
    MixerSpec,
    PatchStemSpec,
    RelBiasSpec,
    ResNetStemSpec,
    SESpec,
    ShrinkSpec,
    StageSpec,
    TokensSpec,
    parse_spec,
    shipped_specs,
    spec_to_yaml,
)

__all__ = [
    "ArchSpec", "InputSpec", "PatchStemSpec", "ConvStemSpec", "IdentityStemSpec", "ResNetStemSpec", "TokensSpec",
    "StageSpec", "ConvStageSpec", "SESpec", "GPSAMixerSpec", "AttentionMixerSpec", "MapToTokensSpec", "AnyStage",
    "LayerOverride", "MixerSpec", "ShrinkSpec", "HeadOutSpec", "LayerPlan", "ClassAttentionSpec",
    "HeadSpec", "GPSASpec", "RelBiasSpec", "MaskSpec", "parse_spec", "spec_to_yaml", "shipped_specs", "SPEC_DIR",
]
