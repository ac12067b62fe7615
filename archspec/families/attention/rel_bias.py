"""Head kind ``rel_bias``: an additive learned relative position bias, torch-free rules.

Two tables: LeViT's attention bias on absolute offsets (Graham et al. 2021, eq. 1; one scalar per
``(|dx|, |dy|)``, ``H W`` entries per head) and CMHSA's signed relative bias (Li et al. 2021, eq. 4; one
scalar per ``(dx, dy)``, ``(2H - 1)(2W - 1)`` entries).  The module side is
:class:`archspec.families.attention.module.Attention` (``attention_biases``, ``signed_biases``) and the index
tables of :mod:`archspec.families.attention.tables`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from archspec._util.pydantic_base import StrictModel

__all__ = ["RelBiasSpec", "FIELD", "SHORTHANDS", "LEGEND", "letter", "params", "macs", "tables", "problems",
           "NO_WEIGHT_DECAY", "RESAMPLED_TABLES", "table_grid"]

FIELD = "rel_bias"
SHORTHANDS = {"levit_bias": {"rel_bias": {"table": "absolute"}}, "signed_bias": {"rel_bias": {"table": "signed"}}}
LEGEND = {"L": "LeViT bias (absolute offsets)", "R": "signed bias (CMHSA)"}
NO_WEIGHT_DECAY = frozenset({"attention_biases", "signed_biases"})  # position tables, as timm LeViT
#: parameter leaf -> table kind; the tables are resampled bicubically when the grid changes
RESAMPLED_TABLES = {"attention_biases": "absolute", "signed_biases": "signed"}
I64 = 8


class RelBiasSpec(StrictModel):
    """Additive learned relative position bias on the patch-patch logits of one head."""

    table: Literal["absolute", "signed"] = Field(
        "absolute",
        description="'absolute': LeViT's B[|dx|, |dy|] (one scalar per absolute offset); "
        "'signed': CMHSA's b(dx, dy) (one scalar per signed offset, (2H-1)(2W-1) entries).",
    )


def letter(spec: RelBiasSpec) -> str:
    """Table letter: ``L`` (LeViT, absolute offsets) or ``R`` (CMHSA, signed offsets)."""
    return {"absolute": "L", "signed": "R"}[spec.table]


def table_grid(table: str, grid: tuple[int, int]) -> tuple[int, int]:
    """The offset grid a table of kind ``table`` holds for a patch ``grid``: ``(H, W)`` or ``(2H-1, 2W-1)``."""
    return grid if table == "absolute" else (2 * grid[0] - 1, 2 * grid[1] - 1)


def _tables(heads: Sequence) -> list[str]:
    return [h.rel_bias.table for h in heads if h.rel_bias is not None]


def params(heads: Sequence, grid: tuple[int, int]) -> int:
    """Table entries of the layer's biased heads (one table row per head)."""
    sizes = [table_grid(t, grid) for t in _tables(heads)]
    return sum(rows * cols for rows, cols in sizes)


def macs(heads: Sequence, grid: tuple[int, int]) -> int:
    """A bias is an addition: 0 MACs (the papers' convention)."""
    return 0


def tables(heads: Sequence, n_tokens: int, n_patches: int) -> int:
    """Bytes of the constant index tables: an int64 ``(N_p, N_p)`` table per table kind used (the eval-mode bias
    cache is the layer's, :func:`archspec.families.attention.rules.caches`)."""
    return I64 * n_patches * n_patches * len(set(_tables(heads)))


def problems(heads: Sequence, grid: tuple[int, int], n_prefix: int, where: tuple) -> list[tuple[tuple, str, str]]:
    """No shape problems: a table fits any grid (the prefix tokens get no bias)."""
    return []
