"""Head kind ``grid``: attention among the pixels of equal offset -- a strided partition of the token grid.

MobileViT-v1 (Mehta & Rastegari 2022, "MobileViT: Light-weight, General-purpose, and Mobile-friendly Vision
Transformer", sec. 3.1 and fig. 1b): the map is unfolded into ``p x p`` patches and the transformer attends, for each
pixel position ``(i, j)`` inside a patch, among the pixels at that position in every patch (timm
``mobilevit.MobileVitBlock``'s unfold into
``(B * P, N, C)``, ``P = p^2`` sequences of ``N = HW / P`` tokens).  On the token grid that is a partition by
residue: a head of stride ``(s_h, s_w)`` lets token ``(i, j)`` attend token ``(i', j')`` iff ``i' = i mod s_h`` and
``j' = j mod s_w``.  MaxViT's grid attention (Tu et al. 2022, sec. 3.2) is the same partition with stride ``H / G``
for a ``G x G`` grid; it adds a relative-position bias over the ``G x G`` positions, which this kind will take as a
further field of :class:`GridSpec` (the partition and its fast path stay the same).

What archspec computes, per grid head: ``softmax(Q K^T / sqrt(d) - inf [i != i' mod s_h or j != j' mod s_w]) V``,
as the ``block`` logit term (the dense reference, and SDPA's additive mask when the head composes with a bias); a
head whose one term it is runs on the kind's path ``grid``: q, k and v reshaped into the ``s_h s_w`` sequences per
head (the reshape / permute of timm's unfold) and one SDPA call over them, then folded back -- exact, ``s_h s_w``
times fewer pairs.

Where it runs (``hosts``): archspec's ``Attention`` on token grids without class or distillation tokens (a token
stage that starts from the stem, a hierarchical or hybrid stage; a bottleneck's pixel attention), and timm's own
``MobileVitBlock`` (``mobilevit_block``, built by :mod:`archspec.families.mobilevit`), whose transformer runs the
same partition once per block for all its layers.  The stride must tile the token grid (a located error otherwise;
only MobileViT's block resizes its map to whole patches, timm's bilinear interpolation), and a class token is on no
grid (refused).

Counts: no parameters; the papers' MACs of a grid head in archspec's ``Attention`` are the registry's dense
``N^2 (d_qk + d_v)`` (a ``block`` term counts 0, as MaiT's strict masks); the ``grid`` path executes ``N^2 / (s_h
s_w)`` pairs (:func:`path_macs`).  In MobileViT's block the family's rules count the partitioned pairs, which is all
timm's module computes and what the MobileViT paper counts (``O(N^2 P d)`` for ``N`` patches of ``P`` pixels).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from archspec._util.lazy import lazy_module
from archspec._util.pydantic_base import HINT, StrictModel

from .layer_terms import KindTerms
from .mask import WINDOW_PATTERN
from .registry import HeadKind, PathContext, ShorthandArgument, register_head_kind

if TYPE_CHECKING:  # annotations only
    from torch import Tensor

__all__ = ["GridSpec", "FIELD", "HOST", "PATH", "SHORTHANDS", "LEGEND", "STRIDE_PATTERN", "letter", "terms", "problems",
           "path", "path_macs", "partitioned_pairs", "residue_classes", "grid_attention", "GridTerms", "KIND"]

torch = lazy_module("torch")
F = lazy_module("torch.nn.functional")

FIELD = "grid"
#: timm's MobileVitBlock, which runs the partition itself (archspec.families.mobilevit)
HOST = "mobilevit_block"
PATH = "grid"
SHORTHANDS = {"grid": {"grid": {}}}
LEGEND = {"O": "grid attention: the pixels of equal offset (MobileViT; MaxViT's grid)"}
#: ``rows x cols`` as YAML writes a stride (``2x2``), the mask windows' pattern
STRIDE_PATTERN = WINDOW_PATTERN
MAX_STRIDE = 64


class GridSpec(StrictModel):
    """Grid attention of one head (MobileViT sec. 3.1, fig. 1b; MaxViT's grid partition): token ``(i, j)`` attends the
    tokens ``(i', j')`` with ``i' = i mod s_h`` and ``j' = j mod s_w`` -- the pixels at the same offset inside every
    ``s_h x s_w`` cell.  MobileViT's patch ``p`` is ``stride: [p, p]``; MaxViT's ``G x G`` grid is stride ``H / G``."""

    stride: tuple[int, int] = Field(
        (2, 2), strict=False, description="Cell [s_h, s_w] (an int: square; or 'hxw'): tokens attend the tokens at "
        "their offset in every cell (MobileViT's patch size: 2; MaxViT's grid: H / G).  It must tile the token grid.")

    @field_validator("stride", mode="before")
    @classmethod
    def _parse_stride(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return (value, value)
        if isinstance(value, str) and value.strip().isdigit():  # grid:2, as window:7 is a square
            return int(value), int(value)
        if isinstance(value, str):
            match = re.fullmatch(STRIDE_PATTERN, value)
            if not match:
                raise ValueError(f"a grid stride looks like '2x2' or an int, got {value!r}{HINT}write grid:2x2, or "
                                 "{grid: {stride: [2, 2]}}")
            return int(match.group(1)), int(match.group(2))
        return value

    @field_validator("stride")
    @classmethod
    def _range(cls, value: tuple[int, int]) -> tuple[int, int]:
        if not all(1 <= s <= MAX_STRIDE for s in value):
            raise ValueError(f"grid stride {value[0]}x{value[1]} must have sides between 1 and {MAX_STRIDE}"
                             f"{HINT}MobileViT's patches are 2x2 (stride: 2)")
        return value


def letter(spec: GridSpec) -> str:
    """Table letter: ``O`` (offset; ``G`` reads as GPSA)."""
    return "O"


def terms(spec: GridSpec) -> frozenset[str]:
    """The pairs of other offsets are blocked (``-inf``): the ``block`` term, which SDPA takes."""
    return frozenset({"block"})


def _divisors(side: int) -> list[int]:
    return [d for d in range(1, min(side, MAX_STRIDE) + 1) if side % d == 0]


def problems(heads: Sequence, grid: tuple[int, int], n_prefix: int, where: tuple) -> list[tuple[tuple, str, str]]:
    """A layer's grid heads on a token grid ``grid``: a class or distillation token present (it has no offset on the
    grid), a stride that does not tile the grid (the first such head)."""
    grids = [(k, getattr(h, FIELD)) for k, h in enumerate(heads) if getattr(h, FIELD, None) is not None]
    if not grids:
        return []
    out = []
    if n_prefix:
        out.append((where, "grid heads partition the token grid by offset (MobileViT's pixels of equal offset), but a "
                    "class or distillation token sits on no grid", "use tokens.cls_token: none and head.pool: mean "
                    "(a token stage from the stem), or mhsa / window heads on this stage"))
    for k, spec in grids:
        (sh, sw), (rows, cols) = spec.stride, grid
        if rows % sh or cols % sw:
            path = where + (k, FIELD, "stride") if where and where[-1] == "heads" else where + (FIELD, "stride")
            out.append((path, f"grid stride {sh}x{sw} does not tile the {rows}x{cols} token grid (every cell of the "
                        "partition must be whole; only MobileViT's block resizes its map)",
                        f"use a stride dividing it (rows: {', '.join(map(str, _divisors(rows)[-4:]))}; cols: "
                        f"{', '.join(map(str, _divisors(cols)[-4:]))}), or an input size whose grid here is a "
                        f"multiple of {sh}x{sw}"))
            break
    return out


def partitioned_pairs(grid: tuple[int, int], stride: tuple[int, int]) -> int:
    """(query, key) pairs of one head partitioned by ``stride`` on ``grid`` (sides multiples of it): ``N^2 / (s_h
    s_w)``, each of the ``N`` tokens against the ``N / (s_h s_w)`` of its offset."""
    n = grid[0] * grid[1]
    return n * (n // (stride[0] * stride[1]))


def path(spec: GridSpec, context: PathContext) -> tuple | None:
    """A head whose only kind is a grid (its one term the block) on a grid without prefix tokens runs partitioned,
    ``("grid", (s_h, s_w))``, under every implementation but ``dense`` (it always pays: ``s_h s_w`` times fewer
    pairs, no mask); a grid composed with other kinds takes the generic paths (SDPA with ``-inf`` in its mask)."""
    if context.kinds != {FIELD} or context.terms != {"block"} or context.n_prefix:
        return None
    return (PATH, tuple(spec.stride))


def path_macs(key: tuple, grid: tuple[int, int], n_prefix: int, qk_dim: int, v_dim: int) -> int:
    """The partitioned path's saving per head, ``(N^2 / (s_h s_w) - N^2) (d_qk + d_v)`` (negative)."""
    n = grid[0] * grid[1]
    return (partitioned_pairs(grid, key[1]) - n * n) * (qk_dim + v_dim)


# ----------------------------------------------------------------------------------- torch side
def residue_classes(grid: tuple[int, int], stride: tuple[int, int], device: Any = None) -> Tensor:
    """Long ``(N,)``: the offset class ``(i mod s_h) s_w + (j mod s_w)`` of each token ``(i, j)``, row-major."""
    rows, cols = grid
    i = torch.arange(rows, device=device).repeat_interleave(cols)
    j = torch.arange(cols, device=device).repeat(rows)
    return (i % stride[0]) * stride[1] + j % stride[1]


def grid_attention(q: Tensor, k: Tensor, v: Tensor, grid: tuple[int, int], stride: tuple[int, int],
                   scale: float) -> Tensor:
    """Attention partitioned by offset: q, k ``(B, h, N, d_qk)``, v ``(B, h, N, d_v)`` with ``N = rows cols`` tokens
    row-major -> ``(B, h, N, d_v)``.  Token ``(a s_h + i, b s_w + j)`` goes to sequence ``(i, j)`` at position ``(a,
    b)`` (timm ``MobileVitBlock``'s unfold, per head), the ``h s_h s_w`` sequences run in one SDPA call, and the
    output is folded back.  Raises nothing (the rules check that the stride tiles the grid)."""
    (rows, cols), (sh, sw) = grid, stride
    b, h = q.shape[:2]

    def unfold(t: Tensor) -> Tensor:
        d = t.shape[-1]
        t = t.reshape(b, h, rows // sh, sh, cols // sw, sw, d).permute(0, 1, 3, 5, 2, 4, 6)
        return t.reshape(b, h * sh * sw, (rows // sh) * (cols // sw), d)

    out = F.scaled_dot_product_attention(unfold(q), unfold(k), unfold(v), scale=scale)
    d = out.shape[-1]
    out = out.reshape(b, h, sh, sw, rows // sh, cols // sw, d).permute(0, 1, 4, 2, 5, 3, 6)
    return out.reshape(b, h, rows * cols, d)


class GridTerms(KindTerms):
    """Grid heads in one ``Attention`` layer: no parameters or buffers; the blocked pairs ``(H, N, N)`` (other
    offsets) for the dense reference and SDPA's mask, built from the layer's grid when asked; the ``grid`` path
    (:func:`grid_attention`).  Publishes ``layer.grid_heads`` (head indices).

    Raises:
        ValueError: grid heads in a layer with prefix tokens, or a stride that does not tile the grid (the IR's own
            checks, :func:`problems`).
    """

    def __init__(self, layer: Any, heads: Sequence[int]) -> None:
        super().__init__(layer, heads)
        layer.grid_heads = self.heads

    def build_grid_tables(self, layer: Any, device: Any) -> None:
        """No tables: the IR's checks of the grid heads on the layer's grid (at construction and on ``set_grid``).

        Raises:
            ValueError: a prefix token, or a stride that does not tile ``layer.grid`` (:func:`problems`).
        """
        for _, message, hint in problems(layer.head_specs, layer.grid, layer.num_prefix_tokens, ()):
            raise ValueError(f"{message} ({hint})")

    def blocked_pairs(self, layer: Any) -> Tensor | None:
        """Bool ``(H, N, N)``: for each grid head the pairs of other offsets, False for every other head."""
        if not self.heads:
            return None
        n, device = layer.num_tokens, layer.parameter_device
        blocked = torch.zeros(layer.num_heads, n, n, dtype=torch.bool, device=device)
        for head in self.heads:
            classes = residue_classes(layer.grid, tuple(getattr(layer.head_specs[head], FIELD).stride), device)
            blocked[head] = classes[:, None] != classes[None, :]
        return blocked

    def path_forward(self, layer: Any, key: tuple, heads: list[int], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``("grid", (s_h, s_w))``: :func:`grid_attention` of the group's heads."""
        return grid_attention(q, k, v, layer.grid, key[1], layer.scale)


KIND = register_head_kind(HeadKind(
    field=FIELD, spec=GridSpec,
    description="Grid attention (MobileViT's pixels of equal offset; MaxViT's grid partition; shorthand grid, "
    "grid:2x2): each token attends the tokens at its offset in every s_h x s_w cell of the token grid.",
    shorthands=SHORTHANDS, legend=LEGEND, letter=letter, terms=terms, problems=problems,
    hosts=frozenset({"attention", HOST}),
    shorthand_argument=ShorthandArgument("stride", STRIDE_PATTERN, "a stride", "grid:2x2",
                                         "grid attention among the pixels of equal offset in 2x2 cells"),
    schema_alternatives={"stride": ({"type": "integer", "description": "square cell"},
                                    {"type": "string", "pattern": "^" + STRIDE_PATTERN.replace("(", "").replace(")", "")
                                     + "$", "description": "'rows x cols', e.g. '2x2'"})},
    paths=frozenset({PATH}), path=path, path_macs=path_macs, layer_terms=GridTerms))
