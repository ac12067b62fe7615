"""Per-head attention specs: which locality mechanisms one attention head composes.

A head is plain content attention (MHSA) unless it names one or more of:

* ``gpsa``     -- ConViT gated positional self-attention (d'Ascoli et al. 2021, eq. 5-7),
* ``rel_bias`` -- an additive relative position bias: LeViT's table on absolute offsets
  (Graham et al. 2021, eq. 1) or CMHSA's table on signed offsets (Li et al. 2021, eq. 4),
* ``mask``     -- a MaiT attention mask on the patch grid (Li et al. 2022, eq. 2 and 4).

They compose: a head may carry a relative bias *and* a mask, or GPSA gating on top of masked
content attention.  YAML shorthands (``mhsa``, ``gpsa``, ``mask``, ``soft_mask``, ``strict_mask``,
``levit_bias``, ``signed_bias``) expand to these models; ``mask:3x5`` picks a window.

These models are shared by the spec (:mod:`archspec.spec`) and the blocks
(:mod:`archspec.blocks`), which is why they live in a module of their own.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class StrictModel(BaseModel):
    """Base for every spec model: unknown keys are errors, types are strict, values are validated on assignment.

    Strict types mean ``depth: true`` or ``heads: "4"`` are errors rather than silently 1 and 4; the
    tuple-valued fields (resolution, window, layer range, drop path) opt out so YAML lists work.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


class GPSASpec(StrictModel):
    """Gated positional self-attention for one head (ConViT, eq. 5-7).

    ``A = normalize[(1 - sigmoid(lambda)) softmax(Q K^T / sqrt(d)) + sigmoid(lambda) softmax(v_pos . r)]``
    with ``r_ij = (dx, dy, dx^2 + dy^2)`` between key ``j`` and query ``i`` on the patch grid.
    """

    gating_init: float = Field(
        1.0, ge=-20, le=20,
        description="Initial gating parameter lambda; sigmoid(1) = 0.73 weighs positional attention (ConViT default 1).",
    )
    locality_strength: float = Field(
        1.0, gt=0, le=100,
        description="alpha in the convolutional init v_pos = -alpha (1, -2 Delta_1, -2 Delta_2); larger is more local.",
    )
    conv_init: bool = Field(
        True,
        description="Convolutional ('local') init: the GPSA heads of a layer get the kernel offsets of a "
        "sqrt(H) x sqrt(H) grid centred on the query, and the value projection the identity. "
        "The number of conv-initialised GPSA heads in a layer must be a perfect square.",
    )
    gating_trainable: bool = Field(True, description="Train the gating parameter (False freezes it, ConViT Tab. 3 ablation).")


class RelBiasSpec(StrictModel):
    """Additive learned relative position bias on the patch-patch logits of one head."""

    table: Literal["absolute", "signed"] = Field(
        "absolute",
        description="'absolute': LeViT's B[|dx|, |dy|] (one scalar per absolute offset); "
        "'signed': CMHSA's b(dx, dy) (one scalar per signed offset, (2H-1)(2W-1) entries).",
    )


_WINDOW_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


class MaskSpec(StrictModel):
    """MaiT attention mask for one head (MaiT eq. 2 and 4).

    The window is ``rows x cols`` patches centred on the query (``3x5`` = 3 rows, 5 columns).
    ``hard``: logits are multiplied by M in {0, 1} *before* the softmax, so non-neighbours keep
    logit 0 (weight e^0), exactly as the paper states.  ``soft``: non-neighbour logits are scaled by a
    learned alpha in (0, 1) per head, ``alpha = sigmoid(a)``.  ``strict``: non-neighbours get -inf
    (not in the paper; a separately named option).  Class and distillation tokens are treated as
    neighbours of every token, in both directions: they attend to all tokens and every patch keeps
    its logit towards them (our reading of MaiT Fig. 1, where the class token "still attends to
    all the patches").
    """

    window: tuple[int, int] = Field((3, 3), strict=False, description="Window 'rows x cols' on the patch grid, e.g. 3x3, 3x5, 5x5.")
    depth: int | None = Field(
        None, ge=1, le=64,
        description="MaiT 'mask depth': 1 = 3x3, 2 = 5x5, d = (2d+1)x(2d+1). Overrides window when given.",
    )
    mode: Literal["hard", "soft", "strict"] = Field("hard", description="hard (paper eq. 2), soft (eq. 4), or strict (-inf).")
    alpha_init: float = Field(
        0.5, gt=0, lt=1, description="Initial alpha of a soft mask, in (0, 1); stored as its logit."
    )

    @field_validator("window", mode="before")
    @classmethod
    def _parse_window(cls, value: Any) -> Any:
        if isinstance(value, str):
            match = _WINDOW_RE.match(value)
            if not match:
                raise ValueError(f"window must look like '3x3' or '3x5', got {value!r}")
            return (int(match.group(1)), int(match.group(2)))
        if isinstance(value, int) and not isinstance(value, bool):
            return (value, value)
        return value

    @model_validator(mode="after")
    def _apply_depth(self) -> "MaskSpec":
        if self.depth is not None:
            size = 2 * self.depth + 1
            object.__setattr__(self, "window", (size, size))
        rows, cols = self.window
        if rows < 1 or cols < 1 or rows > 129 or cols > 129:
            raise ValueError(f"window {rows}x{cols} must have sides between 1 and 129")
        if rows % 2 == 0 or cols % 2 == 0:
            raise ValueError(
                f"window {rows}x{cols} has an even side: MaiT windows are centred on the query, use odd sizes such as 3x3 or 3x5"
            )
        return self


HEAD_SHORTHANDS: dict[str, dict[str, Any]] = {
    "mhsa": {},
    "global": {},
    "gpsa": {"gpsa": {}},
    "mask": {"mask": {}},
    "hard_mask": {"mask": {"mode": "hard"}},
    "soft_mask": {"mask": {"mode": "soft"}},
    "strict_mask": {"mask": {"mode": "strict"}},
    "levit_bias": {"rel_bias": {"table": "absolute"}},
    "signed_bias": {"rel_bias": {"table": "signed"}},
}


# The letters of HeadSpec.letter, for table legends.
HEAD_LETTERS: dict[str, str] = {
    "A": "plain MHSA", "P": "GPSA (ConViT)", "L": "LeViT bias (absolute offsets)", "R": "signed bias (CMHSA)",
    "M": "hard mask (MaiT)", "S": "soft mask", "X": "strict mask (-inf)", "C": "class attention (CaiT)",
}


def head_letters_legend(used: str | None = None) -> str:
    """One line explaining the head letters of the tables, e.g. ``A plain MHSA, P GPSA (ConViT), ...``.

    ``used``: the text of a table's heads column; only the letters in it are explained (all when None).
    Raises nothing."""
    letters = [k for k in HEAD_LETTERS if used is None or k in used]
    composed = used is None or any(len(word) > 1 for word in used.split())
    return ", ".join(f"{k} {HEAD_LETTERS[k]}" for k in letters) + (
        "; composed heads concatenate letters (PM)" if composed else "")


class HeadSpec(StrictModel):
    """What one attention head is: MHSA plus any of GPSA gating, relative bias and a MaiT mask.

    YAML accepts a shorthand string (``mhsa``, ``gpsa``, ``mask``, ``soft_mask``, ``strict_mask``,
    ``levit_bias``, ``signed_bias``; a mask shorthand may carry a window: ``mask:3x5``) or a mapping.
    """

    gpsa: GPSASpec | None = Field(None, description="Gated positional self-attention (ConViT).")
    rel_bias: RelBiasSpec | None = Field(None, description="Additive relative position bias (LeViT / CMHSA).")
    mask: MaskSpec | None = Field(None, description="MaiT attention mask.")

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
                    raise ValueError(f"only mask heads take a window, got {value!r}")
                expanded["mask"]["window"] = window
            return expanded
        return value

    @property
    def letter(self) -> str:
        """Letters used in tables (legend: :data:`HEAD_LETTERS`): A plain MHSA, P GPSA, L LeViT bias, R signed
        (CMHSA) bias, M/S/X hard/soft/strict mask.  No 'G', which readers take for GPSA.

        Composed heads concatenate letters (``PM`` = GPSA over a hard-masked content attention).
        """
        parts = ""
        if self.gpsa is not None:
            parts += "P"
        if self.rel_bias is not None:
            parts += {"absolute": "L", "signed": "R"}[self.rel_bias.table]
        if self.mask is not None:
            parts += {"hard": "M", "soft": "S", "strict": "X"}[self.mask.mode]
        return parts or "A"

    @property
    def is_plain(self) -> bool:
        """True for plain content attention (no GPSA, bias or mask)."""
        return self.gpsa is None and self.rel_bias is None and self.mask is None
