"""What one attention head is: MHSA plus any of the head kinds, composed (torch-free).

A head is plain content attention (MHSA) unless it names one or more head kinds.  The kinds are the registry's
(:data:`~archspec.families.attention.kinds.HEAD_KINDS`, one module each under :mod:`.kinds`): ConViT's ``gpsa``,
LeViT's and CMHSA's ``rel_bias``, MaiT's ``mask``, GMM-Mask's ``gauss_mask``, BoTNet's ``rel_logits``, and any kind
registered before this module is imported.  :class:`HeadSpec` is built from that registry -- one optional field per
kind, in the order their letters compose (``PM``, ``LM``) -- as are the YAML shorthands (:data:`HEAD_SHORTHANDS`,
``mask:3x5`` picks a window) and the table letters (:data:`HEAD_LETTERS`).

Kinds compose: a head may carry a relative bias *and* a mask, or GPSA gating on top of masked content attention.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field, create_model, model_validator

from archspec._util.pydantic_base import StrictModel

from .kinds import HeadKind, seal_head_kinds
from .kinds.gauss_mask import GaussMaskSpec
from .kinds.gpsa import GPSASpec
from .kinds.mask import MaskSpec
from .kinds.rel_bias import RelBiasSpec
from .kinds.rel_logits import RelLogitsSpec

__all__ = ["HeadSpec", "GPSASpec", "RelBiasSpec", "RelLogitsSpec", "MaskSpec", "GaussMaskSpec", "KINDS",
           "HEAD_SHORTHANDS", "HEAD_LETTERS", "head_letters_legend", "coerce_heads", "StrictModel",
           "NEW_KINDS", "without_unused_new_kinds", "at_other_resolution"]

#: The head kinds (the registry's, fixed from now on), in the order their letters compose.
KINDS: tuple[HeadKind, ...] = seal_head_kinds()

HEAD_SHORTHANDS: dict[str, dict[str, Any]] = {"mhsa": {}, "global": {}}
for _kind in KINDS:
    HEAD_SHORTHANDS.update(_kind.shorthands)

# The letters of HeadSpec.letter, for table legends: A plain MHSA, each kind's own, C class attention (whose
# heads are not HeadSpecs: CaiT's class-attention blocks, archspec.families.class_attention).
HEAD_LETTERS: dict[str, str] = {"A": "plain MHSA"}
for _kind in KINDS:
    HEAD_LETTERS.update(_kind.legend)
HEAD_LETTERS["C"] = "class attention (CaiT)"

#: the kinds whose shorthands take a ``:text`` argument (``mask:3x5``)
_ARGUMENT_KINDS = tuple(kind for kind in KINDS if kind.shorthand_argument is not None)


def head_letters_legend(used: str | None = None) -> str:
    """One line explaining the head letters of the tables, e.g. ``A plain MHSA, P GPSA (ConViT), ...``.

    ``used``: the text of a table's heads column; only the letters in it are explained (all when None).
    Raises nothing."""
    letters = [k for k in HEAD_LETTERS if used is None or k in used]
    composed = used is None or any(len(word) > 1 for word in used.split())
    return ", ".join(f"{k} {HEAD_LETTERS[k]}" for k in letters) + (
        "; composed heads concatenate letters (PM)" if composed else "")


def _expand(value: str) -> dict[str, Any]:
    """A shorthand (``'mask:3x5'``) as the mapping it stands for.

    Raises:
        ValueError: an unknown name, or an argument to a shorthand none of whose kinds takes one.
    """
    name, _, argument = value.strip().partition(":")
    if name not in HEAD_SHORTHANDS:
        known = ", ".join(sorted(HEAD_SHORTHANDS))
        raise ValueError(f"unknown head kind {name!r}; expected one of {known} or a mapping")
    expanded = {k: dict(v) for k, v in HEAD_SHORTHANDS[name].items()}
    if argument:
        takers = [kind for kind in _ARGUMENT_KINDS if kind.field in expanded]
        if not takers:
            hint = "".join(kind.argument_hint for kind in KINDS if kind.field in expanded)
            which = "; ".join(f"{kind.field} heads take {kind.shorthand_argument.noun}" for kind in _ARGUMENT_KINDS)
            raise ValueError(f"only {which}, got {value!r}{hint}")
        expanded[takers[0].field][takers[0].shorthand_argument.field] = argument
    return expanded


class HeadSpecBase(StrictModel):
    """What every :class:`HeadSpec` has whatever kinds are registered: the shorthand expansion and the head's
    letters and kinds (its fields are the registry's, added by :class:`HeadSpec`)."""

    @model_validator(mode="before")
    @classmethod
    def _expand_shorthand(cls, value: Any) -> Any:
        return _expand(value) if isinstance(value, str) else value

    @property
    def letter(self) -> str:
        """Letters used in tables (legend: :data:`HEAD_LETTERS`): A plain MHSA, each kind's own (P GPSA, L LeViT
        bias, R signed (CMHSA) bias, M/S/X hard/soft/strict mask, D Gaussian decay bias, B BoTNet's logits; no 'G',
        which readers take for GPSA).

        Composed heads concatenate letters in registry order (``PM`` = GPSA over a hard-masked content attention).
        """
        parts = "".join(kind.letter(getattr(self, kind.field)) for kind in KINDS
                        if getattr(self, kind.field) is not None)
        return parts or "A"

    @property
    def kinds(self) -> frozenset[str]:
        """The head kinds this head composes, by field name (``gpsa``, ``rel_bias``, ``mask``, ``gauss_mask``,
        ``rel_logits``: :data:`KINDS`' ``field``); empty for plain MHSA.  What a layer that takes only some kinds
        checks against (:func:`~archspec.families.attention.kinds.hosted_by`), so that a new kind is refused there
        until it is supported.  Raises nothing."""
        return frozenset(kind.field for kind in KINDS if getattr(self, kind.field) is not None)

    @property
    def is_plain(self) -> bool:
        """True for plain content attention (no head kind)."""
        return not self.kinds

    def at_layer(self, layer: int) -> HeadSpecBase:
        """This head as the stage-local block ``layer`` runs it: each kind's ``HeadKind.at_layer`` applied (Swin's
        ``shift: alternate`` becomes the shift of that block); ``self`` when no kind says anything per layer.  Raises
        nothing."""
        updates = {kind.field: kind.at_layer(getattr(self, kind.field), layer) for kind in KINDS
                   if kind.at_layer is not None and getattr(self, kind.field) is not None}
        return self.model_copy(update=updates) if updates else self


#: HeadSpec's description (schema, reference).  Written out, not generated from the registry: the search spaces'
#: schema (archspec/search/spaces/archspec-space.schema.json) embeds it.
_HEADSPEC_DOC = (
    "What one attention head is: MHSA plus any of GPSA gating, relative bias, a MaiT mask and a Gaussian bias.\n\n"
    "YAML accepts a shorthand string (``mhsa``, ``gpsa``, ``mask``, ``soft_mask``, ``strict_mask``,\n"
    "``levit_bias``, ``signed_bias``, ``gauss_mask``; a mask shorthand may carry a window: ``mask:3x5``) or a mapping.")

HeadSpec: type[HeadSpecBase] = create_model(
    "HeadSpec", __base__=HeadSpecBase, __module__=__name__, __doc__=_HEADSPEC_DOC,
    **{kind.field: (kind.spec | None, Field(None, description=kind.description)) for kind in KINDS})
"""What one attention head is: MHSA plus any registered head kinds -- a pydantic model (a
:class:`HeadSpecBase`) with one optional field per kind of :data:`KINDS`, in registry order (``gpsa``, ``rel_bias``,
``mask``, ``gauss_mask``, ``rel_logits``, then any plug-in), each of its kind's model (``GPSASpec``, ...).

YAML accepts a shorthand string (:data:`HEAD_SHORTHANDS`; ``mask:3x5`` gives a hard mask with a 3x5 window) or a
mapping.  ``letter`` and ``kinds`` name what a head composes; ``is_plain`` is plain MHSA."""


#: head kinds added after digests and keys were stored (saved builds, the search tables): a head that does not use
#: one is hashed without its field, so what was stored before keeps its digest (:func:`without_unused_new_kinds`)
NEW_KINDS = tuple(kind.field for kind in KINDS if not kind.hashed_when_unused)


def without_unused_new_kinds(value: Any) -> Any:
    """``value`` (a JSON-ready dump of a spec or of parts of one) with each head's unused :data:`NEW_KINDS` field
    (``None``) removed, for hashes that must not change when a head kind is added (``spec_digest``,
    ``architecture_key``).  A head using the kind keeps it.  Raises nothing."""
    if isinstance(value, list):
        return [without_unused_new_kinds(v) for v in value]
    if isinstance(value, dict):
        head = set(HeadSpec.model_fields) <= set(value)  # a HeadSpec's dump
        return {k: without_unused_new_kinds(v) for k, v in value.items()
                if not (head and k in NEW_KINDS and v is None)}
    return value


def at_other_resolution(value: Any) -> Any:
    """``value`` (a dump of a spec, ``model_dump()``, or of parts of one) as it is moved to another input size: in
    each head's dump, each kind's ``HeadKind.at_other_resolution`` applied to its field (Swin's windows clamp to a
    smaller grid there, as timm's do).  Raises nothing."""
    if isinstance(value, list):
        return [at_other_resolution(v) for v in value]
    if not isinstance(value, dict):
        return value
    if set(HeadSpec.model_fields) <= set(value):  # a HeadSpec's dump
        head = dict(value)
        for kind in KINDS:
            if kind.at_other_resolution is not None and head.get(kind.field) is not None:
                spec = head[kind.field]
                spec = kind.spec.model_validate(spec) if isinstance(spec, dict) else spec
                head[kind.field] = kind.at_other_resolution(spec).model_dump()
        return head
    return {k: at_other_resolution(v) for k, v in value.items()}


def coerce_heads(heads: Sequence[HeadSpec | str | dict]) -> tuple[HeadSpec, ...]:
    """Turn shorthands (``'mhsa'``, ``'gpsa'``, ``'mask:3x5'``, ...) or mappings into :class:`HeadSpec` objects.

    Raises:
        ValueError: for an empty list or an invalid head (pydantic's ``ValidationError`` is a ``ValueError``).
    """
    out = tuple(h if isinstance(h, HeadSpec) else HeadSpec.model_validate(h) for h in heads)
    if not out:
        raise ValueError("an attention layer needs at least one head")
    return out
