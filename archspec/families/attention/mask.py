"""Head kind ``mask``: MaiT's attention masks (Li et al. 2022, eq. 2 and 4), torch-free rules.

A mask keeps a ``rows x cols`` window of patches around each query.  Three modes act on the logits
before the softmax: ``hard`` (eq. 2: non-neighbours get logit exactly 0, weight ``e^0``), ``soft`` (eq. 4:
non-neighbour logits scaled by a learned ``alpha`` in (0, 1) per head) and ``strict`` (non-neighbours
``-inf``; not in the paper, a separately named option).  Class and distillation tokens are neighbours of
every token.  The torch side is :mod:`archspec.families.attention.mask_terms` (the mask tables and the one
mask rule that :class:`~archspec.families.attention.module.Attention` and CaiT's talking heads share) and
the linear-time hard-mask kernel of :mod:`archspec.families.attention.kernels`; which heads take that
kernel, and what it executes, is :mod:`archspec.families.attention.rules`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from archspec._util.pydantic_base import StrictModel

__all__ = ["MaskSpec", "FIELD", "SHORTHANDS", "LEGEND", "WINDOW_PATTERN", "parse_window", "letter", "params", "macs",
           "tables", "problems", "alpha_to_logit", "NO_WEIGHT_DECAY"]

FIELD = "mask"
SHORTHANDS = {"mask": {"mask": {}}, "hard_mask": {"mask": {"mode": "hard"}}, "soft_mask": {"mask": {"mode": "soft"}},
              "strict_mask": {"mask": {"mode": "strict"}}}
LEGEND = {"M": "hard mask (MaiT)", "S": "soft mask", "X": "strict mask (-inf)"}
NO_WEIGHT_DECAY = frozenset({"mask_alpha_logit"})  # a placement parameter, not a weight
#: ``rows x cols`` as YAML writes a window (``3x5``, ``3 X 5``); the JSON Schema uses the same pattern
WINDOW_PATTERN = r"\s*(\d+)\s*[xX]\s*(\d+)\s*"
MAX_WINDOW_SIDE = 129
F32, BOOL = 4, 1


def parse_window(text: str) -> tuple[int, int]:
    """``'3x5'`` -> ``(3, 5)``.

    Raises:
        ValueError: the text is not ``rows x cols``.
    """
    match = re.fullmatch(WINDOW_PATTERN, text)
    if not match:
        raise ValueError(f"window must look like '3x3' or '3x5', got {text!r}")
    return int(match.group(1)), int(match.group(2))


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

    window: tuple[int, int] = Field(
        (3, 3), strict=False, description="Window 'rows x cols' on the patch grid, e.g. 3x3, 3x5, 5x5."
    )
    depth: int | None = Field(
        None, ge=1, le=64,
        description="MaiT 'mask depth': 1 = 3x3, 2 = 5x5, d = (2d+1)x(2d+1). Overrides window when given.",
    )
    mode: Literal["hard", "soft", "strict"] = Field(
        "hard", description="hard (paper eq. 2), soft (eq. 4), or strict (-inf)."
    )
    alpha_init: float = Field(
        0.5, gt=0, lt=1, description="Initial alpha of a soft mask, in (0, 1); stored as its logit."
    )

    @field_validator("window", mode="before")
    @classmethod
    def _parse_window(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_window(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return (value, value)
        return value

    @model_validator(mode="after")
    def _apply_depth(self) -> MaskSpec:
        if self.depth is not None:
            size = 2 * self.depth + 1
            object.__setattr__(self, "window", (size, size))
        rows, cols = self.window
        if rows < 1 or cols < 1 or rows > MAX_WINDOW_SIDE or cols > MAX_WINDOW_SIDE:
            raise ValueError(f"window {rows}x{cols} must have sides between 1 and {MAX_WINDOW_SIDE}")
        if rows % 2 == 0 or cols % 2 == 0:
            raise ValueError(
                f"window {rows}x{cols} has an even side: MaiT windows are centred on the query, "
                "use odd sizes such as 3x3 or 3x5"
            )
        return self


def letter(spec: MaskSpec) -> str:
    """Table letter: ``M`` hard, ``S`` soft, ``X`` strict."""
    return {"hard": "M", "soft": "S", "strict": "X"}[spec.mode]


def alpha_to_logit(alpha: float) -> float:
    """``logit(alpha) = log(alpha / (1 - alpha))``: the raw soft-mask parameter for a given initial alpha.

    Raises:
        ValueError: unless ``0 < alpha < 1``.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"soft-mask alpha must lie in (0, 1), got {alpha}")
    return math.log(alpha / (1.0 - alpha))


def _modes(heads: Sequence) -> list[str]:
    return [h.mask.mode for h in heads if h.mask is not None]


def params(heads: Sequence, grid: tuple[int, int]) -> int:
    """One learned alpha (``mask_alpha_logit``) per soft-masked head; hard and strict masks have no parameters."""
    return _modes(heads).count("soft")


def macs(heads: Sequence, grid: tuple[int, int]) -> int:
    """A mask is a multiply or fill of the logits: 0 MACs (the papers' convention)."""
    return 0


def tables(heads: Sequence, n_tokens: int, n_patches: int) -> int:
    """Bytes of the constant mask tables: the bool ``(n_mask, N, N)`` neighbourhoods, and for each distinct window of
    the hard heads the linear-time kernel's float32 tables ``outside`` ``(N_p, rows cols)`` and ``n0`` ``(N_p,)``
    (:func:`archspec.families.attention.kernels.window_tables`; the hard term the explicit paths cache is the
    layer's, :func:`archspec.families.attention.rules.caches`)."""
    modes = _modes(heads)
    windows = {tuple(h.mask.window) for h in heads if h.mask is not None and h.mask.mode == "hard"}
    return BOOL * len(modes) * n_tokens * n_tokens + sum(F32 * n_patches * (r * c + 1) for r, c in windows)


def problems(heads: Sequence, grid: tuple[int, int], n_prefix: int, where: tuple) -> list[tuple[tuple, str, str]]:
    """A window larger than the token grid (the first such head of the layer)."""
    for h_index, head in enumerate(heads):
        if head.mask is None:
            continue
        rows, cols = head.mask.window
        if rows > grid[0] or cols > grid[1]:
            path = where + (h_index, "mask", "window") if where[-1] == "heads" else where + ("mask", "window")
            return [(path, f"mask window {rows}x{cols} is larger than the {grid[0]}x{grid[1]} token grid",
                     f"use at most a {grid[0] - 1 + grid[0] % 2}x{grid[1] - 1 + grid[1] % 2} window, or a "
                     "larger token grid (larger input or smaller patches)")]
    return []
