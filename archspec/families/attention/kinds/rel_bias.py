"""Head kind ``rel_bias``: an additive learned relative position bias.

Two tables: LeViT's attention bias on absolute offsets (Graham et al. 2021, eq. 1; one scalar per
``(|dx|, |dy|)``, ``H W`` entries per head) and CMHSA's signed relative bias (Li et al. 2021, eq. 4; one
scalar per ``(dx, dy)``, ``(2H - 1)(2W - 1)`` entries).  The rules are torch-free; the torch side
(:class:`RelBiasTerms`) holds the tables ``attention_biases`` and ``signed_biases`` (as timm ``levit.Attention``),
their index buffers (:mod:`archspec.families.attention.tables`), and resamples them when the grid changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from archspec._util.lazy import lazy_module
from archspec._util.pydantic_base import StrictModel

from .layer_terms import KindTerms
from .registry import HeadKind, register_head_kind

if TYPE_CHECKING:  # annotations only
    from torch import Tensor

__all__ = ["RelBiasSpec", "FIELD", "SHORTHANDS", "LEGEND", "letter", "terms", "params", "macs", "tables", "problems",
           "NO_WEIGHT_DECAY", "RESAMPLED_TABLES", "table_grid", "RelBiasTerms", "KIND"]

torch = lazy_module("torch")
nn = lazy_module("torch.nn")
grid_tables = lazy_module("archspec.families.attention.tables")

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


def terms(spec: RelBiasSpec) -> frozenset[str]:
    """A relative bias adds to the logits: ``bias`` (SDPA takes it as its float mask)."""
    return frozenset({"bias"})


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


# ----------------------------------------------------------------------------------- torch side
#: per table kind: the parameter, its index buffer, and the index table's function in attention/tables.py
_TABLES = {"absolute": ("attention_biases", "attention_bias_idxs", "levit_bias_idxs"),
           "signed": ("signed_biases", "signed_bias_idxs", "signed_bias_idxs")}


class RelBiasTerms(KindTerms):
    """Relative biases in one layer: LeViT's ``attention_biases`` ``(n_absolute, H*W)`` (LeViT eq. 1, timm
    ``levit.Attention``) and CMHSA's ``signed_biases`` ``(n_signed, (2H-1)(2W-1))`` (CMHSA eq. 4), each with its
    non-persistent index buffer ``(N_p, N_p)`` (``attention_bias_idxs``, ``signed_bias_idxs``).  Publishes
    ``layer.abs_bias_heads`` and ``layer.signed_bias_heads`` (head indices)."""

    def __init__(self, layer: Any, heads: Sequence[int]) -> None:
        super().__init__(layer, heads)
        specs = layer.head_specs
        self.by_table = {table: [i for i in self.heads if specs[i].rel_bias.table == table] for table in _TABLES}
        layer.abs_bias_heads, layer.signed_bias_heads = self.by_table["absolute"], self.by_table["signed"]
        for table, rows in self.by_table.items():
            if rows:
                entries = table_grid(table, layer.grid)
                setattr(layer, _TABLES[table][0], nn.Parameter(torch.zeros(len(rows), entries[0] * entries[1])))

    def reset_parameters(self, layer: Any) -> None:
        """Tables at 0, as LeViT / timm (CMHSA states no init: its head starts as plain MHSA too)."""
        for table, rows in self.by_table.items():
            if rows:
                getattr(layer, _TABLES[table][0]).zero_()

    def build_grid_tables(self, layer: Any, device: Any) -> None:
        """The index buffers of the tables used (:func:`~archspec.families.attention.tables.levit_bias_idxs`,
        :func:`~archspec.families.attention.tables.signed_bias_idxs`)."""
        for table, rows in self.by_table.items():
            if rows:
                _, index, make = _TABLES[table]
                layer.register_buffer(index, getattr(grid_tables, make)(layer.grid).to(device), persistent=False)

    def resize_grid(self, layer: Any, old: tuple[int, int], new: tuple[int, int]) -> None:
        """Each table resampled bicubically on its offset grid (:func:`table_grid`;
        :func:`~archspec.families.attention.tables.resample_bias_table`, as timm
        ``resize_rel_pos_bias_table_levit``): ``(h, H*W) -> (h, H'*W')``,
        ``(h, (2H-1)(2W-1)) -> (h, (2H'-1)(2W'-1))``."""
        for table, rows in self.by_table.items():
            if rows:
                name = _TABLES[table][0]
                param = getattr(layer, name)
                resized = grid_tables.resample_bias_table(param.data, table_grid(table, old), table_grid(table, new))
                setattr(layer, name, nn.Parameter(resized, requires_grad=param.requires_grad))

    def bias(self, layer: Any) -> list[tuple[Any, Tensor]]:
        """Each table gathered on its index buffer: ``(heads, (h, N_p, N_p))`` per table kind used."""
        return [(rows, getattr(layer, _TABLES[table][0])[:, getattr(layer, _TABLES[table][1])])
                for table, rows in self.by_table.items() if rows]


KIND = register_head_kind(HeadKind(
    field=FIELD, spec=RelBiasSpec, description="Additive relative position bias (LeViT / CMHSA).",
    shorthands=SHORTHANDS, legend=LEGEND, letter=letter, terms=terms, params=params, macs=macs, tables=tables,
    problems=problems, no_weight_decay=NO_WEIGHT_DECAY, resampled_tables=RESAMPLED_TABLES, hashed_when_unused=True,
    layer_terms=RelBiasTerms))
