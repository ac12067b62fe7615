"""What one attention head is: MHSA plus any of the head kinds, composed (torch-free).

A head is plain content attention (MHSA) unless it names one or more head kinds, each a file of this
folder with its spec model and rules:

* ``gpsa``     -- ConViT gated positional self-attention (:mod:`.gpsa`, d'Ascoli et al. 2021, eq. 5-7),
* ``rel_bias`` -- an additive relative position bias: LeViT's table on absolute offsets or CMHSA's on
  signed offsets (:mod:`.rel_bias`),
* ``mask``     -- a MaiT attention mask on the patch grid (:mod:`.mask`, Li et al. 2022, eq. 2 and 4),
* ``gauss_mask`` -- a learned Gaussian locality bias, two parameters per head (:mod:`.gauss_mask`, GMM-Mask,
  Li & Zhang, arXiv 2309.05375),
* ``rel_logits`` -- BoTNet's query-dependent relative position logits (:mod:`.rel_logits`, Srinivas et al. 2021),
  in a bottleneck's attention mixer only.

They compose: a head may carry a relative bias *and* a mask, or GPSA gating on top of masked
content attention.  YAML shorthands (``mhsa``, ``gpsa``, ``mask``, ``soft_mask``, ``strict_mask``,
``levit_bias``, ``signed_bias``, ``gauss_mask``) expand to these models; ``mask:3x5`` picks a window.

:data:`KINDS` lists the kinds in the order their letters compose (``PM``, ``LM``); a new head kind is a
file here, a line in :data:`KINDS` and its field on :class:`HeadSpec` (see ``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field, model_validator

from archspec._util.pydantic_base import HINT, StrictModel

from . import gauss_mask, gpsa, mask, rel_bias, rel_logits
from .gauss_mask import FIELD as FIELD_GAUSS
from .gauss_mask import GaussMaskSpec
from .gpsa import GPSASpec
from .mask import MaskSpec
from .rel_bias import RelBiasSpec
from .rel_logits import RelLogitsSpec

__all__ = ["HeadSpec", "GPSASpec", "RelBiasSpec", "RelLogitsSpec", "MaskSpec", "GaussMaskSpec", "KINDS",
           "HEAD_SHORTHANDS", "HEAD_LETTERS", "head_letters_legend", "coerce_heads", "StrictModel",
           "NEW_KINDS", "without_unused_new_kinds"]

#: The head kinds, in the order their letters compose.
KINDS = (gpsa, rel_bias, mask, gauss_mask, rel_logits)

HEAD_SHORTHANDS: dict[str, dict[str, Any]] = {"mhsa": {}, "global": {}}
for _kind in KINDS:
    HEAD_SHORTHANDS.update(_kind.SHORTHANDS)

# The letters of HeadSpec.letter, for table legends: A plain MHSA, each kind's own, C class attention (whose
# heads are not HeadSpecs: CaiT's class-attention blocks, archspec.families.class_attention).
HEAD_LETTERS: dict[str, str] = {"A": "plain MHSA"}
for _kind in KINDS:
    HEAD_LETTERS.update(_kind.LEGEND)
HEAD_LETTERS["C"] = "class attention (CaiT)"


def head_letters_legend(used: str | None = None) -> str:
    """One line explaining the head letters of the tables, e.g. ``A plain MHSA, P GPSA (ConViT), ...``.

    ``used``: the text of a table's heads column; only the letters in it are explained (all when None).
    Raises nothing."""
    letters = [k for k in HEAD_LETTERS if used is None or k in used]
    composed = used is None or any(len(word) > 1 for word in used.split())
    return ", ".join(f"{k} {HEAD_LETTERS[k]}" for k in letters) + (
        "; composed heads concatenate letters (PM)" if composed else "")


class HeadSpec(StrictModel):
    """What one attention head is: MHSA plus any of GPSA gating, relative bias, a MaiT mask and a Gaussian bias.

    YAML accepts a shorthand string (``mhsa``, ``gpsa``, ``mask``, ``soft_mask``, ``strict_mask``,
    ``levit_bias``, ``signed_bias``, ``gauss_mask``; a mask shorthand may carry a window: ``mask:3x5``) or a mapping.
    """

    gpsa: GPSASpec | None = Field(None, description="Gated positional self-attention (ConViT).")
    rel_bias: RelBiasSpec | None = Field(None, description="Additive relative position bias (LeViT / CMHSA).")
    mask: MaskSpec | None = Field(None, description="MaiT attention mask.")
    gauss_mask: GaussMaskSpec | None = Field(
        None, description="Learned Gaussian locality bias alpha exp(-d^2 / (2 (sigma^2 + 1e-5))) on the logits, two "
        "parameters per head (GMM-Mask, arXiv 2309.05375; shorthand gauss_mask).")
    rel_logits: RelLogitsSpec | None = Field(
        None, description="BoTNet's relative position logits q . R[offset] (Srinivas et al. 2021; shorthand "
        "botnet_rel); in a bottleneck's attention mixer only.")

    @model_validator(mode="before")
    @classmethod
    def _expand_shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            name, _, window = value.strip().partition(":")
            if name not in HEAD_SHORTHANDS:
                known = ", ".join(sorted(HEAD_SHORTHANDS))
                raise ValueError(f"unknown head kind {name!r}; expected one of {known} or a mapping")
            expanded = {k: dict(v) for k, v in HEAD_SHORTHANDS[name].items()}
            if window:
                if "mask" not in expanded:
                    hint = (f"{HINT}a gauss_mask head has no window: its width is learned; start it wider with "
                            "{gauss_mask: {sigma_init: 2.0}}") if FIELD_GAUSS in expanded else ""
                    raise ValueError(f"only mask heads take a window, got {value!r}{hint}")
                expanded["mask"]["window"] = window
            return expanded
        return value

    @property
    def letter(self) -> str:
        """Letters used in tables (legend: :data:`HEAD_LETTERS`): A plain MHSA, P GPSA, L LeViT bias, R signed
        (CMHSA) bias, M/S/X hard/soft/strict mask, D Gaussian decay bias.  No 'G', which readers take for GPSA.

        Composed heads concatenate letters (``PM`` = GPSA over a hard-masked content attention).
        """
        parts = "".join(kind.letter(getattr(self, kind.FIELD)) for kind in KINDS
                        if getattr(self, kind.FIELD) is not None)
        return parts or "A"

    @property
    def kinds(self) -> frozenset[str]:
        """The head kinds this head composes, by field name (``gpsa``, ``rel_bias``, ``mask``, ``gauss_mask``,
        ``rel_logits``: :data:`KINDS`' ``FIELD``); empty for plain MHSA.  What a family that takes only some kinds
        checks against, so that a new kind is refused there until it is supported.  Raises nothing."""
        return frozenset(kind.FIELD for kind in KINDS if getattr(self, kind.FIELD) is not None)

    @property
    def is_plain(self) -> bool:
        """True for plain content attention (no GPSA, bias, mask or Gaussian bias)."""
        return not self.kinds


#: head kinds added after digests and keys were stored (saved builds, the search tables): a head that does not use
#: one is hashed without its field, so what was stored before keeps its digest (:func:`without_unused_new_kinds`)
NEW_KINDS = (gauss_mask.FIELD,)


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


def coerce_heads(heads: Sequence[HeadSpec | str | dict]) -> tuple[HeadSpec, ...]:
    """Turn shorthands (``'mhsa'``, ``'gpsa'``, ``'mask:3x5'``, ...) or mappings into :class:`HeadSpec` objects.

    Raises:
        ValueError: for an empty list or an invalid head (pydantic's ``ValidationError`` is a ``ValueError``).
    """
    out = tuple(h if isinstance(h, HeadSpec) else HeadSpec.model_validate(h) for h in heads)
    if not out:
        raise ValueError("an attention layer needs at least one head")
    return out
