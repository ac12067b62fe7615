"""A Markdown reference of every spec field, generated from the pydantic models' descriptions.

``archspec schema --markdown`` prints it; ``docs/spec-reference.md`` is its output, kept current by a test.
"""

from __future__ import annotations

import re
import types
import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from archspec.families.attention.heads import HEAD_SHORTHANDS, KINDS, HeadSpec, head_letters_legend
from archspec.spec import (
    ArchSpec,
    AttentionMixerSpec,
    BlockPoolSpec,
    ClassAttentionSpec,
    ConvBNActStageSpec,
    ConvStageSpec,
    ConvStemSpec,
    ConvTokenizerStemSpec,
    DownsampleSpec,
    GPSAMixerSpec,
    HeadOutSpec,
    IdentityStemSpec,
    InputSpec,
    LayerOverride,
    MapToTokensSpec,
    MaxxVitStemSpec,
    MBConvSESpec,
    MBConvStageSpec,
    MixerSpec,
    MobileViTStageSpec,
    MobileViTStemSpec,
    MobileViTTransformerSpec,
    MV2StageSpec,
    PatchStemSpec,
    ResNetStemSpec,
    SESpec,
    ShrinkSpec,
    StageSpec,
    TokensSpec,
)

SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("spec (top level)", ArchSpec), ("input", InputSpec), ("stem (kind: patch)", PatchStemSpec),
    ("stem (kind: conv)", ConvStemSpec), ("stem (kind: conv_tokenizer)", ConvTokenizerStemSpec),
    ("stem (kind: identity)", IdentityStemSpec),
    ("stem (kind: resnet)", ResNetStemSpec), ("stem (kind: maxxvit)", MaxxVitStemSpec),
    ("stem (kind: mobilevit)", MobileViTStemSpec), ("tokens", TokensSpec),
    ("stages[]", StageSpec), ("stages[].downsample", DownsampleSpec),
    ("stages[].downsample (kind: pool)", BlockPoolSpec),
    ("stages[] (kind: conv)", ConvStageSpec), ("stages[].se", SESpec),
    ("stages[].mixer (kind: conv stages, gpsa)", GPSAMixerSpec),
    ("stages[].mixer (kind: conv stages, attention)", AttentionMixerSpec),
    ("stages[] (kind: conv, block: mbconv)", MBConvStageSpec), ("stages[].se (block: mbconv)", MBConvSESpec),
    ("stages[] (kind: conv, block: mv2)", MV2StageSpec),
    ("stages[] (kind: conv, block: mobilevit)", MobileViTStageSpec),
    ("stages[].transformer (block: mobilevit)", MobileViTTransformerSpec),
    ("stages[] (kind: conv, block: conv_bn_act)", ConvBNActStageSpec),
    ("stages[].layers[]", LayerOverride), ("mixer", MixerSpec),
    ("stages[].shrink", ShrinkSpec), ("stages[].from_map", MapToTokensSpec),
    ("head kind (stages[].attention, layers[].heads[])", HeadSpec),
    *((kind.field, kind.spec) for kind in KINDS),  # each head kind's model, in registry order
    ("class_attention", ClassAttentionSpec), ("head", HeadOutSpec),
]


def _type_name(annotation: typing.Any) -> str:
    # A union prints as ``Union[A, B]`` or ``A | B`` depending on how it was written and on the Python version;
    # the reference always writes ``A | B`` (the table turns ``|`` into ``/``).
    if typing.get_origin(annotation) is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if typing.get_origin(annotation) is list and any(typing.get_origin(a) is typing.Annotated
                                                     for a in typing.get_args(annotation)):
        return f"list[{_type_name(typing.get_args(annotation)[0])}]"  # the stages' tagged union
    # drop module paths (archspec.spec.X, archspec.families.stem.rules.X): the reference names classes only
    text = re.sub(r"\barchspec(?:\.\w+)*\.(?=[A-Z])", "", str(annotation).replace("typing.", ""))
    text = text.replace("<class '", "").replace("'>", "").replace("NoneType", "None")
    return text


def _default(field) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "**required**"
    value = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(value, BaseModel):
        return "see below"
    return f"`{value!r}`" if value is not None else "`None`"


def markdown() -> str:
    """The whole reference as Markdown text."""
    lines = ["# Spec reference", "",
             "Generated from the pydantic models by `archspec schema --markdown`; `archspec schema` prints the "
             "JSON Schema (for editor completion).", ""]
    for title, model in SECTIONS:
        doc = re.sub(r"\n\s*", " ", (model.__doc__ or "").strip().split("\n\n")[0])
        lines += [f"## {title}", "", doc, "", "| field | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            desc = (field.description or "").replace("|", "\\|")
            lines.append(f"| `{name}` | {_type_name(field.annotation).replace('|', '/')} | "
                         f"{_default(field)} | {desc} |")
        lines.append("")
    shorthands = ", ".join(f"`{k}`" for k in HEAD_SHORTHANDS)
    arguments = "".join(f"`{arg.example}` gives {arg.meaning}; " for kind in KINDS
                        if (arg := kind.shorthand_argument) is not None)
    lines += ["## head kind shorthands", "", f"A head may be written as one of {shorthands}; "
              f"{arguments.removesuffix('; ')}. Letters in tables: {head_letters_legend()}.", ""]
    return "\n".join(lines)
