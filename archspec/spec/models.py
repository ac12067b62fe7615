"""The spec language: pydantic models of an architecture (reading one from YAML: :mod:`archspec.spec.parsing`).

Step 1 of 3 on the way from YAML to ``nn.Module`` (spec -> :mod:`archspec.ir.plan` ->
:mod:`archspec.nn.compiler`).  This module checks everything a single field or model can check
(types, ranges, unknown keys, per-head list lengths, layer ranges); checks that need shapes
(token grids, mask windows against the grid, head-count arithmetic) happen while the graph is
built, and :func:`archspec.ir.checked.load_spec` runs both so that a loaded spec is known to compile
(:func:`archspec.spec.parsing.parse_spec` is the schema step only; this package imports nothing of the later
steps).

A minimal spec (DeiT-Ti)::

    input: {channels: 3, resolution: 224}
    stem: {kind: patch, patch_size: 16}
    stages:
      - {depth: 12, dim: 192, heads: 3}
    head: {num_classes: 1000}

Layer indices in ``stages[i].layers[*].range`` are local to the stage; ``tokens.cls_token`` as an
integer is a *global* block index (blocks counted across stages from 0).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from archspec._util.pydantic_base import DropPathRate, StrictModel
from archspec.families.attention.heads import GPSASpec, HeadSpec, MaskSpec, RelBiasSpec
from archspec.families.attention.kinds import HEAD_KINDS
from archspec.families.attention.rules import check_value_dim
from archspec.families.block.rules import check_mlp_ratio
from archspec.families.class_attention.rules import ClassAttentionSpec
from archspec.families.conv_block.rules import (
    AttentionMixerSpec,
    ConvStageBase,
    ConvStageSpec,
    GPSAMixerSpec,
    SESpec,
)
from archspec.families.downsample.rules import AnyDownsample, BlockPoolSpec, DownsampleSpec
from archspec.families.head.rules import HeadOutSpec
from archspec.families.interface.rules import MapToTokensSpec
from archspec.families.mbconv.rules import MBConvSESpec, MBConvStageSpec
from archspec.families.mobilevit.rules import (
    ConvBNActStageSpec,
    MobileViTStageSpec,
    MobileViTTransformerSpec,
    MV2StageSpec,
)
from archspec.families.shrink.rules import ShrinkSpec
from archspec.families.stem.rules import (
    ConvStemSpec,
    ConvTokenizerStemSpec,
    IdentityStemSpec,
    MaxxVitStemSpec,
    MobileViTStemSpec,
    PatchStemSpec,
    ResNetStemSpec,
    StemSpec,
)
from archspec.families.tokens.rules import TokensSpec

__all__ = [
    "ArchSpec", "InputSpec", "PatchStemSpec", "ConvStemSpec", "ConvTokenizerStemSpec", "IdentityStemSpec",
    "ResNetStemSpec", "MaxxVitStemSpec", "MobileViTStemSpec", "TokensSpec", "StageSpec", "ConvStageBase",
    "ConvStageSpec", "SESpec", "MBConvStageSpec", "MBConvSESpec", "MV2StageSpec", "MobileViTStageSpec",
    "MobileViTTransformerSpec", "ConvBNActStageSpec", "GPSAMixerSpec", "AttentionMixerSpec",
    "MapToTokensSpec", "AnyStage", "LayerOverride", "MixerSpec", "ShrinkSpec", "DownsampleSpec", "BlockPoolSpec",
    "HeadOutSpec",
    "LayerPlan", "ClassAttentionSpec", "HeadSpec", "GPSASpec", "RelBiasSpec", "MaskSpec", "spec_to_yaml",
]

# Sane caps: a spec must never be able to exhaust memory before a check can stop it.
MAX_RESOLUTION = 1024
MAX_DIM = 4096
MAX_HEADS = 64
MAX_DEPTH = 64
# A spec name is a plain file name: it names the build directory, so no '/', and no leading '.'
# (which excludes '.' and '..' and hidden names).
NAME_PATTERN = r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]*"
NAME_MAX = 100


class InputSpec(StrictModel):
    """Input images, ``(B, channels, H, W)``."""

    channels: int = Field(3, ge=1, le=64, description="Image channels (3 for RGB).")
    resolution: tuple[int, int] = Field(
        (224, 224), strict=False, description="Input resolution in pixels, an int or [H, W]."
    )

    @field_validator("resolution", mode="before")
    @classmethod
    def _square(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return (value, value)
        return value

    @field_validator("resolution")
    @classmethod
    def _range(cls, value: tuple[int, int]) -> tuple[int, int]:
        for side in value:
            if not 8 <= side <= MAX_RESOLUTION:
                raise ValueError(f"resolution sides must be between 8 and {MAX_RESOLUTION} pixels, got {side}")
        return value


class MixerSpec(StrictModel):
    """Token mixer of a layer: attention (default) or a K x K convolution (CMHSA phase 1).

    ``kind: conv`` is the CMHSA convolution phase (Thm. 1, App. A.2): a K x K convolution over the *pixel view*
    of the tokens -- a token of width ``d = P^2 c`` is a ``P x P x c`` block of pixels -- so the conv runs on
    the ``(H P) x (W P)`` pixel grid with ``c = d / P^2`` channels.  ``patch`` = ``P``; by default the stem's
    ``patch_size``.  ``patch: 1`` (shorthand ``token_conv3``) is a conv on the token grid with ``d`` channels.
    ``pad_tokens`` (attention only) surrounds the token grid with that many rings of zero tokens that the
    queries may attend to (App. A.2: the transferred conv stays exact on border patches).
    """

    kind: Literal["attention", "conv"] = Field("attention", description="'attention' or 'conv'.")
    kernel: int = Field(3, ge=1, le=15, description="Conv kernel K (odd), for kind 'conv'.")
    patch: int | None = Field(None, ge=1, le=64, description=(
        "Conv: pixel-view patch side P (token = P x P x d/P^2 pixels); default: the stem's patch_size; "
        "1 = conv on the token grid."))
    pad_tokens: int = Field(0, ge=0, le=4, description=(
        "Attention: rings of zero-padding tokens around the grid, attended to but not output (CMHSA App. A.2)."))

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            match = re.fullmatch(r"\s*(token_)?conv(\d+)?\s*", value)
            if value.strip() == "attention":
                return {"kind": "attention"}
            if match:
                kernel = int(match.group(2) or 3)
                return ({"kind": "conv", "kernel": kernel, "patch": 1} if match.group(1)
                        else {"kind": "conv", "kernel": kernel})
            raise ValueError(f"mixer must be 'attention', 'conv', 'conv5', 'token_conv3' or a mapping, got {value!r}")
        return value

    @model_validator(mode="after")
    def _odd(self) -> MixerSpec:
        if self.kind == "conv" and self.kernel % 2 == 0:
            raise ValueError(f"conv mixer kernel must be odd (centred, 'same' padding), got {self.kernel}")
        if self.kind == "conv" and self.pad_tokens:
            raise ValueError("pad_tokens applies to attention mixers only (a conv pads its pixels itself)")
        if self.kind == "attention" and self.patch is not None:
            raise ValueError("patch applies to conv mixers only")
        return self


_RANGE_RE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


class LayerOverride(StrictModel):
    """Per-layer override inside a stage: a layer range and what its heads (or mixer) are."""

    range: tuple[int, int] = Field(
        ..., strict=False, description="Stage-local layers, inclusive: '0-7', '8' or [0, 7]."
    )
    heads: list[HeadSpec] | None = Field(
        None,
        description="One entry per head, e.g. [mask, mask, mhsa] (MaiT Sch.2). Length must equal the stage's heads."
    )
    attention: HeadSpec | None = Field(None, description="The same head kind for every head of these layers.")
    mixer: MixerSpec | None = Field(None, description="Token mixer for these layers (default: the stage's).")

    @field_validator("range", mode="before")
    @classmethod
    def _parse_range(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return (value, value)
        if isinstance(value, str):
            match = _RANGE_RE.match(value)
            if not match:
                raise ValueError(f"layer range must look like '0-7' or '8', got {value!r}")
            start = int(match.group(1))
            return (start, int(match.group(2)) if match.group(2) is not None else start)
        return value

    @field_validator("range")
    @classmethod
    def _ordered(cls, value: tuple[int, int]) -> tuple[int, int]:
        if value[0] < 0 or value[1] < value[0]:
            raise ValueError(f"layer range {value[0]}-{value[1]} is empty or negative")
        return value

    @field_validator("heads")
    @classmethod
    def _kind_checks(cls, value: list[HeadSpec] | None) -> list[HeadSpec] | None:
        # each head kind's check of one layer's heads (GPSA: one gating_param tensor, trainable or frozen as a whole)
        for kind in HEAD_KINDS.values():
            if kind.check_heads is not None:
                kind.check_heads(value or [])
        return value

    @model_validator(mode="after")
    def _one_of(self) -> LayerOverride:
        if self.heads is not None and self.attention is not None:
            raise ValueError("give either 'heads' (one per head) or 'attention' (all heads), not both")
        if self.heads is None and self.attention is None and self.mixer is None:
            raise ValueError("a layer override needs 'heads', 'attention' or 'mixer'")
        return self


class StageSpec(StrictModel):
    """A stage: ``depth`` blocks at one width and one token grid (``kind: attention``, the default)."""

    depth: int = Field(..., ge=1, le=MAX_DEPTH, description="Number of blocks.")
    dim: int = Field(..., ge=8, le=MAX_DIM, description="Token width C.")
    heads: int = Field(..., ge=1, le=MAX_HEADS, description="Attention heads H per block.")
    head_dim: int | None = Field(
        None, ge=1, le=MAX_DIM,
        description="Per-head q/k/v dim; default dim / heads (must divide). Decoupled as CMHSA needs (d_H = d).",
    )
    key_dim: int | None = Field(
        None, ge=1, le=512, description="LeViT key dim: per-head q/k dim (overrides head_dim for q/k)."
    )
    attn_ratio: float | None = Field(
        None, gt=0, le=8, description="LeViT attn ratio: per-head value dim = attn_ratio * key_dim."
    )
    mlp_ratio: float = Field(4.0, gt=0, le=16, description="MLP hidden = mlp_ratio * dim (ViT 4, LeViT 2).")
    norm: Literal["layernorm", "batchnorm"] = Field(
        "layernorm",
        description="'layernorm': pre-norm ViT blocks; 'batchnorm': LeViT blocks (BatchNorm after every linear, "
        "no pre-norm, "
        "activation on A V before the projection).",
    )
    norm_eps: float = Field(1e-6, gt=0, le=1e-2, description="LayerNorm epsilon (timm ViT/ConViT: 1e-6).")
    act: Literal["gelu", "gelu_tanh", "hardswish", "relu"] = Field(
        "gelu", description="MLP (and LeViT attention) activation; gelu_tanh: TensorFlow's approximation (the MaxViT "
        "tf ports).")
    init: Literal["trunc_normal", "xavier"] = Field(
        "trunc_normal", description="Initialisation of the blocks' linears: 'trunc_normal' timm ViT's (std .02, zero "
        "biases); 'xavier' timm MaxxVit's weight_init='vit_eff' (xavier-uniform, zero biases but the MLP's "
        "normal(1e-6): CoAtNet, MaxViT).")
    qkv_bias: bool = Field(True, description="Bias on q/k/v projections (DeiT True, ConViT False); LeViT has none.")
    drop_path: DropPathRate = Field(
        0.0, description="Stochastic depth: one rate for every block, or [first, last] linearly spaced over the stage."
    )
    layer_scale: float | None = Field(None, gt=0, le=1, description="LayerScale init (CaiT / MaiT*); None = off.")
    talking_heads: bool = Field(
        False, description="CaiT talking-heads attention: logits mixed across heads before the softmax (proj_l) "
        "and probabilities after it (proj_w); heads may be mhsa or masks (the mask acts after proj_l).",
    )
    attention: HeadSpec | None = Field(
        None,
        description="Head kind of every head not set by 'layers'. When omitted and 'layers' is given, the ranges "
        "must cover every layer; when both are omitted, every head is MHSA.",
    )
    mixer: MixerSpec = Field(default_factory=MixerSpec, description="Token mixer of the stage's blocks.")
    layers: list[LayerOverride] = Field(
        default_factory=list, description="Per-layer overrides (non-overlapping ranges)."
    )
    shrink: ShrinkSpec | None = Field(None, description="LeViT shrinking attention at the stage's entry (not stage 0).")
    downsample: AnyDownsample | None = Field(
        None, description="Hierarchical downsampling at the stage's entry (not with shrink, no class token): "
        "'patch_merging' (Swin) or 'conv' (NAT), not on stage 0, the grid halving (ceil); or 'pool' (CoAtNet): the "
        "stage's first block pools inside itself, the grid halving (even sides).  The width becomes dim.")
    from_map: MapToTokensSpec | None = Field(
        None, description="The first attention stage after conv stages: how their feature map becomes its tokens "
        "(pooling to a grid, 1x1 projection; LeViT sec. 3.2 grafting).  Default: every pixel a token, projected "
        "when the widths differ.")

    @model_validator(mode="before")
    @classmethod
    def _kind(cls, value: Any) -> Any:
        # 'kind: attention' names the default stage kind; it is not stored (the resolved YAML stays as before).
        if isinstance(value, dict) and value.get("kind") == "attention":
            value = {k: v for k, v in value.items() if k != "kind"}
        return value

    @field_validator("attn_ratio")
    @classmethod
    def _value_dim(cls, value: float | None, info: ValidationInfo) -> float | None:
        data = info.data
        if value is None or not {"dim", "heads"} <= data.keys():
            return value
        qk = next((d for d in (data.get("key_dim"), data.get("head_dim")) if d is not None),
                  data["dim"] // data["heads"])
        return value if qk < 1 else check_value_dim(value, qk, "per-head value dim")

    @field_validator("mlp_ratio")
    @classmethod
    def _hidden(cls, value: float, info: ValidationInfo) -> float:
        return check_mlp_ratio(info.data.get("dim"), value)


#: a conv stage's ``block`` -> the tag of its stage model when it is not ResNet's (:class:`ConvStageSpec`)
CONV_BLOCK_TAGS = {"mbconv": "mbconv_stage", "mv2": "mv2_stage", "mobilevit": "mobilevit_stage",
                   "conv_bn_act": "conv_bn_act_stage"}


def _stage_kind(value: Any) -> str | None:
    """Which stage model a ``stages[]`` entry is: ``kind: conv`` a :class:`ConvStageSpec` (ResNet's blocks), or with
    ``block: mbconv`` an :class:`MBConvStageSpec`, ``mv2`` / ``mobilevit`` / ``conv_bn_act`` MobileViT's
    (:data:`CONV_BLOCK_TAGS`); no kind or ``kind: attention`` a :class:`StageSpec`; anything else names no stage
    kind."""
    get = value.get if isinstance(value, dict) else lambda key, default=None: getattr(value, key, default)
    kind, block = get("kind", "attention"), get("block")
    if kind == "conv" and isinstance(block, str) and block in CONV_BLOCK_TAGS:
        return CONV_BLOCK_TAGS[block]
    return {"attention": "attention_stage", "conv": "conv_stage"}.get(kind) if isinstance(kind, str) else None


#: a ``stages[]`` entry: an attention stage (the default) or a conv stage (``kind: conv``: ResNet's, MBConv or
#: MobileViT's blocks)
AnyStage = Annotated[Annotated[StageSpec, Tag("attention_stage")] | Annotated[ConvStageSpec, Tag("conv_stage")]
                     | Annotated[MBConvStageSpec, Tag("mbconv_stage")] | Annotated[MV2StageSpec, Tag("mv2_stage")]
                     | Annotated[MobileViTStageSpec, Tag("mobilevit_stage")]
                     | Annotated[ConvBNActStageSpec, Tag("conv_bn_act_stage")],
                     Discriminator(_stage_kind, custom_error_type="stage_kind",
                                   custom_error_message="a stage's kind must be 'attention' (the default) or 'conv'")]


class ArchSpec(StrictModel):
    """A whole architecture.  Build it with :func:`archspec.compile`."""

    name: str = Field("model", min_length=1, max_length=NAME_MAX, json_schema_extra={"pattern": f"^{NAME_PATTERN}$"},
                      description="Plain name: letters, digits, '_', '-', '.', not starting with '.'; "
                      "the build directory is build/<name>/.")
    description: str | None = Field(None, max_length=2000, description="Free text.")
    source: str | None = Field(None, max_length=2000, description="Paper and table the spec follows.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the deterministic initialisation.")
    input: InputSpec = Field(default_factory=InputSpec, description="Input images.")
    stem: StemSpec = Field(default_factory=PatchStemSpec,
                           description="Stem: patch, conv, conv_tokenizer, identity, resnet, maxxvit or mobilevit.")
    tokens: TokensSpec = Field(
        default_factory=TokensSpec, description="Class/distillation tokens and position embedding (left out: a class "
        "token and a learned position embedding; none of either for a conv net, whose stages are all kind: conv)."
    )
    stages: list[AnyStage] = Field(..., min_length=1, max_length=8, description="Stages, in order: attention "
                                   "stages (the default kind) or conv stages (kind: conv; block: basic, bottleneck, "
                                   "mbconv, mv2, mobilevit or conv_bn_act).  Conv stages before the attention stages "
                                   "need a resnet, maxxvit or mobilevit stem; conv stages after them (a conv tail: "
                                   "conv, attention, conv) take the tokens as a map on the last token grid, class and "
                                   "distillation tokens dropped, and end the model on ResNet's head (pool: mean).")
    class_attention: ClassAttentionSpec | None = Field(
        None, description="CaiT class-attention stage after the last stage (needs tokens.cls_token: <total depth>).")
    head: HeadOutSpec = Field(default_factory=HeadOutSpec, description="Classifier head (head.pool left out: cls; "
                              "mean for a conv net).")
    @model_validator(mode="before")
    @classmethod
    def _convnet_defaults(cls, data: Any) -> Any:
        """A conv net (every stage ``kind: conv``) that leaves out ``tokens`` (or some of its keys) or ``head.pool``
        gets the only values it can have -- no class token, no position embedding, an average pool -- not the token
        models' defaults (which its checks would then refuse)."""
        if not (isinstance(data, dict) and _all_conv_stages(data.get("stages"))):
            return data
        data = dict(data)
        tokens = data.get("tokens", {})
        if isinstance(tokens, dict):  # what it leaves out; what it states is checked as stated
            data["tokens"] = {"cls_token": "none", "pos_embed": "none", **tokens}
        head = data.get("head", {})
        if isinstance(head, dict) and "pool" not in head:
            data["head"] = {**head, "pool": "mean"}
        return data

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        # The name becomes a directory name (build/<name>/): '/', '.' or '..' would write outside it.
        if not re.fullmatch(NAME_PATTERN, value):
            raise PydanticCustomError(
                "string_pattern_mismatch",  # reuses that kind's hint: the characters allowed
                "must be a plain name, not starting with '.' (it names the build directory build/<name>/)")
        return value

    @property
    def depth(self) -> int:
        """Number of token blocks across the attention stages (the index space of ``tokens.cls_token``); every
        block for a conv net."""
        if self.is_convnet:
            return sum(s.depth for s in self.stages)
        return sum(s.depth for s in self.stages[self.n_conv_stages:self.tail_start])

    @property
    def plan(self) -> str:
        """The stage plan in CoAtNet's letters (Dai et al. 2021, sec. 3.2): ``C`` a conv stage (whatever its block
        or mixer), ``T`` an attention stage, joined by ``-`` (``C-C-T-T``)."""
        return "-".join("C" if isinstance(s, ConvStageBase) else "T" for s in self.stages)

    @property
    def is_convnet(self) -> bool:
        """Whether every stage is a conv stage (a ResNet-like model: feature maps, average pool, classifier)."""
        return all(isinstance(s, ConvStageBase) for s in self.stages)

    @property
    def n_conv_stages(self) -> int:
        """Conv stages before the first attention stage: > 0 for a hybrid (LeViT's grafting), 0 for a token
        model, ``len(stages)`` for a conv net."""
        n = 0
        while n < len(self.stages) and isinstance(self.stages[n], ConvStageBase):
            n += 1
        return n

    @property
    def tail_start(self) -> int:
        """Index of the first conv stage after the attention stages (a conv-attention-conv sandwich: the tokens
        become a map again there, class and distillation tokens dropped); ``len(stages)`` when there is none."""
        n = self.n_conv_stages
        while n < len(self.stages) and not isinstance(self.stages[n], ConvStageBase):
            n += 1
        return n if n > self.n_conv_stages else len(self.stages)

    @property
    def has_conv_tail(self) -> bool:
        """Whether conv stages follow the attention stages (the model ends on a feature map, ResNet's head)."""
        return self.tail_start < len(self.stages)

    @property
    def is_hybrid(self) -> bool:
        """Whether conv stages come first and attention stages after them (the map becomes tokens in between)."""
        return 0 < self.n_conv_stages < len(self.stages)

    def pixel_patch(self, mixer: MixerSpec) -> int | None:
        """Patch side ``P`` of a conv mixer's pixel view: ``mixer.patch``, else the patch/identity stem's
        ``patch_size``; ``None`` for a conv stem without ``mixer.patch`` (its tokens have no pixel layout)."""
        if mixer.patch is not None:
            return mixer.patch
        return getattr(self.stem, "patch_size", None) if self.stem.kind in ("patch", "identity") else None

    def layer_plans(self, stage_index: int) -> list[LayerPlan]:
        """Resolve the stage's defaults and overrides into one :class:`LayerPlan` per block."""
        stage = self.stages[stage_index]
        default = stage.attention if stage.attention is not None else HeadSpec()
        plans = []
        for layer in range(stage.depth):
            heads = [default] * stage.heads
            mixer = stage.mixer
            origin: tuple = ("stages", stage_index, "attention")
            for j, override in enumerate(stage.layers):
                if override.range[0] <= layer <= override.range[1]:
                    if override.heads is not None:
                        heads = list(override.heads)
                        origin = ("stages", stage_index, "layers", j, "heads")
                    elif override.attention is not None:
                        heads = [override.attention] * stage.heads
                        origin = ("stages", stage_index, "layers", j, "attention")
                    if override.mixer is not None:
                        mixer = override.mixer
            if isinstance(stage.drop_path, tuple):
                first, last = stage.drop_path
                rate = first + (last - first) * (layer / max(stage.depth - 1, 1))
            else:
                rate = stage.drop_path
            heads = [head.at_layer(layer) for head in heads]  # what a kind says per layer (Swin's shift: alternate)
            plans.append(LayerPlan(heads=heads, mixer=mixer, drop_path=rate, origin=origin))
        return plans

    def to_yaml(self) -> str:
        """The resolved spec (every default explicit) as YAML; ``load_spec`` of it gives an equal spec."""
        return spec_to_yaml(self)


def _all_conv_stages(stages: Any) -> bool:
    """Whether raw ``stages`` (before validation) is a non-empty list whose every stage says ``kind: conv``."""
    return isinstance(stages, list) and bool(stages) and all(
        isinstance(s, ConvStageBase) or (isinstance(s, dict) and s.get("kind") == "conv") for s in stages)


class LayerPlan(StrictModel):
    """What one block is after defaults and overrides are resolved (not part of the YAML)."""

    heads: list[HeadSpec]
    mixer: MixerSpec
    drop_path: float
    origin: tuple = Field((), description="Spec path the heads came from, for error messages.")


def spec_to_yaml(spec: ArchSpec) -> str:
    """Dump a spec with every default made explicit (``mode='json'`` so tuples become lists)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False, default_flow_style=None, width=100)
