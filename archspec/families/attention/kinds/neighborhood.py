"""Head kind ``neighborhood``: NAT's neighbourhood attention (Hassani et al. 2022), dilated as DiNAT's (Hassani & Shi
2022).

A neighbourhood head's query attends the ``k x k`` keys nearest to it, the window clamped inside the grid (near a
border it shifts inward, never shrinks), with dilation ``d`` on the sub-grid of positions congruent to the query
mod ``d``, plus NAT's learned relative-position bias ``rpb`` ``(2k - 1, 2k - 1)`` per head: NATTEN's rules
(:mod:`archspec.families.attention.local_rules`, ``na_window_start`` / ``na_bias_start``), what Hugging Face's
``NeighborhoodAttention`` computes with ``natten2dqkrpb`` and ``natten2dav``.  As logit terms it is ``bias`` (the
table read at each pair's offset) and ``block`` (every pair outside the window ``-inf``), so the generic paths --
the dense reference and one SDPA call with an additive mask -- compute it exactly, ``O(N^2)``.  Its own path,
chosen at construction where it pays (:func:`tiled_path_pays`), is the tiled gather kernel
:func:`archspec.families.attention.local_kernels.neighborhood_attention`, ``O(N k^2)``, forward and backward.

Readings (docs/papers.md, "NAT and DiNAT"): the grid must hold the dilated window, ``k d <= side`` (NATTEN's check;
Hugging Face pads a smaller grid with zero tokens instead, which a spec is refused rather than silently attending);
no prefix (class) token (NAT has none); the kernel is odd (NAT's window is centred); one ``rpb`` tensor per layer,
``(heads with a bias, 2k - 1, 2k - 1)`` as NAT's and Hugging Face's, so the biased heads of a layer share their
kernel; ``rpb`` initialised ``trunc_normal_(std=0.02)`` as NAT's ``NeighborhoodAttention`` (Hugging Face leaves it
at zeros) and kept out of weight decay (NAT's ``no_weight_decay_keywords``).

Counts (the papers' MACs): ``Q K^T`` and ``A V`` over the ``H W k^2`` attended pairs (NAT's complexity analysis,
sec. 3.2: ``2 H W C k^2`` per layer besides the projections); the bias is an addition, 0 MACs; ``(2k - 1)^2``
parameters per biased head.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from archspec._util.lazy import lazy_module
from archspec._util.pydantic_base import HINT, StrictModel

from ..local_rules import (
    NA_TILE,
    check_neighborhood,
    check_no_prefix_tokens,
    neighborhood_bias_macs,
    neighborhood_executed_pairs,
    neighborhood_pairs,
)
from .layer_terms import KindTerms
from .registry import HeadKind, PathContext, ShorthandArgument, register_head_kind

if TYPE_CHECKING:  # annotations only
    from torch import Tensor

__all__ = ["NeighborhoodSpec", "FIELD", "SHORTHANDS", "LEGEND", "PATH", "letter", "terms", "params", "tables", "pairs",
           "problems", "tiled_path_pays", "path", "path_macs", "path_memory", "NO_WEIGHT_DECAY",
           "NeighborhoodTerms", "KIND"]

torch = lazy_module("torch")
nn = lazy_module("torch.nn")
timm_layers = lazy_module("timm.layers")
local_kernels = lazy_module("archspec.families.attention.local_kernels")

FIELD = "neighborhood"
SHORTHANDS = {"neighborhood": {"neighborhood": {}}}
LEGEND = {"N": "neighbourhood attention (NAT; dilated: DiNAT)"}
NO_WEIGHT_DECAY = frozenset({"rpb"})  # NAT's no_weight_decay_keywords
#: the tiled gather kernel's path
PATH = "neighborhood"
MAX_KERNEL, MAX_DILATION = 127, 128
I64 = 8
_KERNEL_TEXT = r"\s*\d+\s*"


class NeighborhoodSpec(StrictModel):
    """Neighbourhood attention for one head (NAT, Hassani et al. 2022; DiNAT, Hassani & Shi 2022).

    The query attends the ``kernel x kernel`` keys nearest to it, the window clamped inside the token grid (NATTEN's
    rule: near a border it shifts inward, never shrinks); with ``dilation`` d the keys lie d apart, on the sub-grid
    of positions congruent to the query mod d (DiNAT).  ``rpb``: NAT's learned relative-position bias, one
    ``(2 kernel - 1)^2`` table per head, added to the logits.  Needs ``kernel * dilation <= `` each grid side and
    no class token (NAT has none).
    """

    kernel: int = Field(7, le=MAX_KERNEL, description="Window side k (odd, >= 3; NAT and DiNAT: 7).")
    dilation: int = Field(1, ge=1, le=MAX_DILATION, description="Dilation d (DiNAT); 1 = NAT. Needs k d <= the grid's "
                          "sides.")
    rpb: bool = Field(True, description="NAT's relative-position bias, a learned (2k-1) x (2k-1) table per head.")

    @field_validator("kernel", mode="before")
    @classmethod
    def _shorthand_text(cls, value: Any) -> Any:
        # 'neighborhood:7' hands the kernel over as text
        return int(value) if isinstance(value, str) and re.fullmatch(_KERNEL_TEXT, value) else value

    @field_validator("kernel")
    @classmethod
    def _odd(cls, value: int) -> int:
        if value < 3 or value % 2 == 0:
            raise ValueError(f"neighbourhood kernel {value} must be odd and >= 3 (the window is centred on the query)"
                             f"{HINT}NAT and DiNAT use 7; use {max(3, value + 1 - value % 2)}")
        return value


def letter(spec: NeighborhoodSpec) -> str:
    """Table letter: ``N``."""
    return "N"


def terms(spec: NeighborhoodSpec) -> frozenset[str]:
    """``block`` (pairs outside the window are ``-inf``), and ``bias`` with NAT's relative-position bias."""
    return frozenset({"block", "bias"}) if spec.rpb else frozenset({"block"})


def _specs(heads: Sequence) -> list[NeighborhoodSpec]:
    return [h.neighborhood for h in heads if getattr(h, FIELD, None) is not None]


def params(heads: Sequence, grid: tuple[int, int]) -> int:
    """``(2k - 1)^2`` bias entries per head with ``rpb`` (NAT's ``rpb``, ``(heads, 2k-1, 2k-1)``)."""
    return sum((2 * s.kernel - 1) ** 2 for s in _specs(heads) if s.rpb)


def _fits(spec: NeighborhoodSpec, grid: tuple[int, int]) -> bool:
    return spec.kernel * spec.dilation <= min(grid)


def _windows(heads: Sequence) -> list[tuple[int, int]]:
    """The distinct ``(kernel, dilation)`` of a layer's neighbourhood heads, in order of first use."""
    return list(dict.fromkeys((s.kernel, s.dilation) for s in _specs(heads)))


def tables(heads: Sequence, n_tokens: int, n_patches: int) -> int:
    """Bytes of the constant tables: per distinct ``(kernel, dilation)`` the windows' starts, int64 ``(N_p, 2)``
    (:func:`~archspec.families.attention.local_kernels.neighborhood_starts`; the generic paths' ``(N, N)`` window
    and bias index are made of them per forward, and their products cached by the layer)."""
    return I64 * 2 * n_patches * len(_windows(heads))


def pairs(spec: NeighborhoodSpec, grid: tuple[int, int], n_prefix: int) -> int:
    """The ``H W k^2`` (query, key) pairs a head attends (:func:`~archspec.families.attention.local_rules.
    neighborhood_pairs`: the window is clamped, never truncated); on a grid the window does not fit
    (a refused spec, still counted while its other problems are collected) ``H W min(k, H) min(k, W)``."""
    if _fits(spec, grid):
        return neighborhood_pairs(grid, spec.kernel, spec.dilation)
    return grid[0] * grid[1] * min(spec.kernel, grid[0]) * min(spec.kernel, grid[1])


def _at(where: tuple, index: int, *field: str) -> tuple:
    """The spec path of head ``index``'s ``field`` (``where`` ends in ``heads`` for a per-head list)."""
    return where + ((index, FIELD) if where and where[-1] == "heads" else (FIELD,)) + field


def problems(heads: Sequence, grid: tuple[int, int], n_prefix: int, where: tuple) -> list[tuple[tuple, str, str]]:
    """A class / distillation token in the layer (NAT has none: :func:`~archspec.families.attention.local_rules.
    check_no_prefix_tokens`), a dilated window beyond a grid side (NATTEN's ``k d <= side``:
    :func:`~archspec.families.attention.local_rules.check_neighborhood`), and biased heads of one layer with
    different kernels (its one ``rpb`` tensor), each the first such head."""
    found = [(i, h.neighborhood) for i, h in enumerate(heads) if getattr(h, FIELD, None) is not None]
    if not found:
        return []
    out = []
    if n_prefix:
        message, _, hint = _error_text(lambda: check_no_prefix_tokens("neighbourhood", n_prefix))
        out.append((where, message, hint))
    for index, spec in found:
        if not _fits(spec, grid):
            message, _, hint = _error_text(lambda s=spec: check_neighborhood(grid, s.kernel, s.dilation))
            out.append((_at(where, index, "dilation" if spec.dilation > 1 else "kernel"), message, hint))
            break
    kernels = sorted({spec.kernel for _, spec in found if spec.rpb})
    if len(kernels) > 1:
        index = next(i for i, spec in found if spec.rpb and spec.kernel != kernels[0])
        out.append((_at(where, index, "kernel"), f"the heads with a relative-position bias have kernels "
                    f"{', '.join(map(str, kernels))} in one layer, whose one rpb table has one kernel (NAT's)",
                    f"give them one kernel, or rpb: false on the heads of kernel {kernels[-1]}"))
    return out


def _error_text(check) -> tuple[str, str, str]:
    """``(message, HINT, hint)`` of the ``ValueError`` a local rule raises (the rules word the messages once)."""
    try:
        check()
    except ValueError as error:
        return str(error).partition(HINT)
    raise AssertionError("the check passed where its caller found a problem")


# ----------------------------------------------------------------------------------- paths
# Crossover measured with bench/local_kernels.py --crossover (2 heads of 32 -- every NAT-Mini layer's head dim --,
# batch 1, one CPU thread, torch 2.14, a shared 2-core machine; docs/benchmarks.md): the tiled kernel against the
# generic path's dense masked attention (explicit logits or SDPA with the (N, N) float mask, the faster) is slower
# up to 256 patches (16x16: 0.4-0.7x), faster from 400 for kernel 3 (20x20: 2-5x) and around 400-576 for kernels 5
# and 7 (kernel 7, 20x20: 0.9-1.1x, 24x24: 0.9-1.4x, 28x28: 1.6x); dilation 2 moves it little.
_CROSSOVER_BASE_PATCHES = 300
_CROSSOVER_PATCHES_PER_WINDOW_CELL = 6


def tiled_path_pays(grid: tuple[int, int], kernel: int, dilation: int) -> bool:
    """Whether the tiled kernel is expected to beat the generic dense masked path on CPU (``attn_impl='auto'``).

    Rule (our measurement): ``rows * cols >= 300 + 6 k^2`` (k 3: 354 patches, a 19x19 grid; k 7: 594, 25x25; NAT's
    224-px grids 56 and 28 take the tiled kernel, 14 and 7 the dense one).  Below it the kernel's tiles, gathers and
    padding cost more than the ``N^2`` products they save.  ``dilation`` is the rule's argument but does not move it
    within the measurement's noise.
    """
    return grid[0] * grid[1] >= _CROSSOVER_BASE_PATCHES + _CROSSOVER_PATCHES_PER_WINDOW_CELL * kernel * kernel


def path(spec: NeighborhoodSpec, context: PathContext) -> tuple | None:
    """``("neighborhood", kernel, dilation, rpb)``: the tiled kernel, for a head whose one kind is a neighbourhood
    (another kind's terms would not reach the kernel) on a grid it fits without prefix tokens, under ``'fast'``,
    while ``torch.compile`` traces, or where :func:`tiled_path_pays`; None otherwise (one SDPA call with the window
    as a ``-inf`` mask)."""
    if context.kinds != {FIELD} or context.n_prefix or not _fits(spec, context.grid):
        return None
    if context.attn_impl == "fast" or context.compiled or tiled_path_pays(context.grid, spec.kernel, spec.dilation):
        return (PATH, spec.kernel, spec.dilation, spec.rpb)
    return None


def path_macs(key: tuple, grid: tuple[int, int], n_prefix: int, qk_dim: int, v_dim: int) -> int:
    """The tiled kernel's products beyond the dense ones: ``(executed - N^2) (qk_dim + v_dim)``, its executed pairs
    :func:`~archspec.families.attention.local_rules.neighborhood_executed_pairs` (every query of a tile against the
    tile's block of keys), plus, with NAT's bias, the products that read the table at every executed pair
    (:func:`~archspec.families.attention.local_rules.neighborhood_bias_macs`; per forward, as GPSA's positional
    projection is counted)."""
    n = grid[0] * grid[1]
    bias = neighborhood_bias_macs(grid, key[1], key[2]) if key[3] else 0
    return (neighborhood_executed_pairs(grid, key[1], key[2]) - n * n) * (qk_dim + v_dim) + bias


def path_memory(key: tuple, grid: tuple[int, int], n_prefix: int, qk_dim: int, v_dim: int) -> tuple[int, int]:
    """Elements ``(alive, saved)`` of one head on the tiled kernel: its ``P`` executed pairs as logits, the windows'
    mask plus bias, and the probabilities (``3 P`` alive, the logits and probabilities saved), and the gathered key
    and value blocks (``P / T^2`` block keys, ``T`` the tile side, ``qk_dim + v_dim`` each)."""
    executed = neighborhood_executed_pairs(grid, key[1], key[2])
    blocks = executed // min(NA_TILE, *grid) ** 2 * (qk_dim + v_dim)
    return 3 * executed + blocks, 2 * executed + blocks


# ----------------------------------------------------------------------------------- torch side
class NeighborhoodTerms(KindTerms):
    """Neighbourhood heads in one layer: ``rpb`` ``(n_rpb, 2k - 1, 2k - 1)`` (NAT's and Hugging Face's name and
    shape; the heads with ``rpb`` in head order) and, per distinct ``(kernel, dilation)``, the non-persistent window
    starts ``neighborhood{k}d{d}_starts`` ``(N_p, 2)`` from which the generic paths make the ``(N, N)`` window by
    tensor operations (traceable, and ``N`` times smaller than the window); the tiled kernel keeps its own tables per
    grid.  Publishes ``layer.neighborhood_heads`` and ``layer.rpb_heads`` (head indices).

    Raises:
        ValueError: a prefix token, a window beyond the grid, biased heads of different kernels (the IR's checks).
    """

    def __init__(self, layer: Any, heads: Sequence[int]) -> None:
        super().__init__(layer, heads)
        specs = layer.head_specs
        layer.neighborhood_heads = self.heads
        layer.rpb_heads = [i for i in self.heads if specs[i].neighborhood.rpb]
        self.windows = {}
        for i in self.heads:
            spec = specs[i].neighborhood
            self.windows.setdefault((spec.kernel, spec.dilation), []).append(i)
        if not self.heads:
            return
        for _, message, hint in problems(specs, layer.grid, layer.num_prefix_tokens, ()):  # the IR's own checks
            raise ValueError(f"{message} ({hint})")
        if layer.rpb_heads:
            side = 2 * specs[layer.rpb_heads[0]].neighborhood.kernel - 1
            layer.rpb = nn.Parameter(torch.zeros(len(layer.rpb_heads), side, side))

    def reset_parameters(self, layer: Any) -> None:
        """``rpb`` ``trunc_normal_(std=0.02)``, as NAT's ``NeighborhoodAttention`` (timm's, cut at +-2)."""
        if layer.rpb_heads:
            timm_layers.trunc_normal_(layer.rpb, std=0.02)

    def build_grid_tables(self, layer: Any, device: Any) -> None:
        """The window starts of each ``(kernel, dilation)`` on the layer's grid
        (:func:`~archspec.families.attention.local_kernels.neighborhood_starts`)."""
        for kernel, dilation in self.windows:
            layer.register_buffer(f"neighborhood{kernel}d{dilation}_starts",
                                  local_kernels.neighborhood_starts(layer.grid, kernel, dilation).to(device),
                                  persistent=False)

    def _window(self, layer: Any, kernel: int, dilation: int) -> tuple[Tensor, Tensor]:
        """``(allowed, index)``, ``(N, N)``, of one ``(kernel, dilation)`` on the layer's grid."""
        starts = getattr(layer, f"neighborhood{kernel}d{dilation}_starts")
        return local_kernels.neighborhood_window_mask(starts, layer.grid, kernel, dilation)

    def bias(self, layer: Any) -> list[tuple[Any, Tensor]]:
        """NAT's bias on the patch-patch block, ``(heads, (n, N_p, N_p))`` per ``(kernel, dilation)``: each biased
        head's table read at each attended pair's offset (:func:`~archspec.families.attention.local_kernels.
        neighborhood_window_mask`; the entry outside a window is never used: those pairs are ``-inf``)."""
        parts = []
        for (kernel, dilation), heads in self.windows.items():
            biased = [h for h in heads if h in layer.rpb_heads]
            if biased:
                _, index = self._window(layer, kernel, dilation)
                rows = layer.select_heads(layer.rpb, [layer.rpb_heads.index(h) for h in biased], dim=0)
                parts.append((biased, rows.flatten(1)[:, index]))
        return parts

    def blocked_pairs(self, layer: Any) -> Tensor | None:
        """Bool ``(H, N, N)``: the pairs outside each neighbourhood head's window (False for the other heads)."""
        if not self.heads:
            return None
        outside = {}
        for (kernel, dilation), heads in self.windows.items():
            allowed, _ = self._window(layer, kernel, dilation)
            outside.update(dict.fromkeys(heads, ~allowed))
        keep = torch.zeros_like(next(iter(outside.values())))
        return torch.stack([outside.get(h, keep) for h in range(layer.num_heads)])

    def path_forward(self, layer: Any, key: tuple, heads: list[int], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The tiled kernel (:func:`~archspec.families.attention.local_kernels.neighborhood_attention`) on the heads
        ``heads`` of ``key = ("neighborhood", kernel, dilation, rpb)``, ``(B, len(heads), N, v_dim)``."""
        _, kernel, dilation, biased = key
        rpb = layer.select_heads(layer.rpb, [layer.rpb_heads.index(h) for h in heads], dim=0) if biased else None
        return local_kernels.neighborhood_attention(q, k, v, layer.grid, kernel, dilation, rpb=rpb, scale=layer.scale)


KIND = register_head_kind(HeadKind(
    field=FIELD, spec=NeighborhoodSpec,
    description="Neighbourhood attention: the k x k nearest keys, clamped inside the grid, optionally dilated, with "
    "NAT's relative-position bias (NAT / DiNAT; shorthand neighborhood, neighborhood:7).",
    shorthands=SHORTHANDS, legend=LEGEND, letter=letter, terms=terms, params=params, tables=tables,
    problems=problems,
    no_weight_decay=NO_WEIGHT_DECAY,
    shorthand_argument=ShorthandArgument("kernel", _KERNEL_TEXT, "a kernel", "neighborhood:7",
                                         "a neighbourhood head with a 7x7 window"),
    paths=frozenset({PATH}), path=path, path_macs=path_macs, standalone_paths=frozenset({PATH}),
    path_memory=path_memory, pairs=pairs, layer_terms=NeighborhoodTerms))
