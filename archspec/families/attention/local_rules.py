"""Torch-free index rules of Swin's (shifted) windows and NAT/DiNAT's neighbourhoods: which keys each query
attends, the checks a spec needs, and the exact number of (query, key) pairs for MACs.

Tokens sit on a row-major ``(H, W)`` grid (token ``t`` at row ``t // W``, column ``t % W``).  Both kinds are
separable: whether query ``i`` attends key ``j`` is a rule on their rows times the same rule on their columns,
so every table here is one list per axis, and :mod:`archspec.families.attention.local_kernels` builds its
``(N, N)`` masks and index tensors from these lists alone.  Neither kind takes prefix (class) tokens
(:func:`check_no_prefix_tokens`): Swin and NAT have none, and no paper says what a class token sees in a window.

**Swin** (Liu et al. 2021, sec. 3.2; numerics of timm 1.0's ``timm/models/swin_transformer.py``,
``SwinTransformerBlock._attn`` / ``get_attn_mask`` / ``_calc_window_shift``): the grid is cyclically shifted by
``torch.roll(x, -shift)`` over the *unpadded* grid, *then* zero-padded at the bottom/right to a multiple of the
window, partitioned into windows, and each window attends within itself, with timm's mask (``-100`` between
different regions of ``img_mask``, built on the padded grid) when any shift is non-zero.  Padded tokens are not
masked: they are keys like any other (their ``k``/``v`` are what the projections make of a zero input, i.e. the
qkv bias).  Positions below are in that rolled-then-padded frame ("rolled position").

**NAT / DiNAT** (Hassani et al. 2022; Hassani & Shi 2022): each query attends the ``k x k`` keys of its
neighbourhood, clamped inside the grid (near a border the window shifts inward; it is never truncated); with
dilation ``d`` on the sub-grid of positions congruent to the query mod ``d``.  The rules are NATTEN's
(SHI-Labs/NATTEN v0.17.5, ``csrc/include/natten/cpu/naive/natten_cpu_commons.h``: ``get_window_start``,
``get_pb_start``), non-causal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from archspec._util.pydantic_base import HINT

__all__ = ["SWIN_MASK_VALUE", "as_pair", "check_no_prefix_tokens", "resolve_window", "padded_grid", "SwinAxis",
           "swin_axis", "window_partition_pairs", "window_attended_pairs", "check_neighborhood", "na_window_start",
           "na_bias_start", "NeighborhoodAxis", "neighborhood_axis", "neighborhood_pairs", "NA_TILE",
           "residue_lengths", "neighborhood_executed_pairs", "neighborhood_bias_macs"]

#: timm's additive logit between tokens of different shifted-window regions (``get_attn_mask``: ``-100.0``)
SWIN_MASK_VALUE = -100.0
#: query tile side of the neighbourhood kernel (``local_kernels.neighborhood_attention``: a tile of ``T x T``
#: queries reads a ``(T + k - 1)^2`` block of keys).  ``bench/local_kernels.py --tiles 4 6 7 8 10`` at 56x56, k 7:
#: 4 to 8 within the machine's noise, 10 slower; 7 also makes each 7x7 sub-grid of DiNAT's dilated layers
#: (56 / 8) exactly one tile.
NA_TILE = 7


def as_pair(value: int | Sequence[int], what: str) -> tuple[int, int]:
    """``value`` as ``(rows, cols)``: an int for both, or two ints.

    Raises:
        ValueError: not an int or a pair of ints.
    """
    if isinstance(value, int):
        return value, value
    pair = tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise ValueError(f"{what} must be an int or (rows, cols), got {value!r}")
    return pair[0], pair[1]


def _grid(grid: Sequence[int]) -> tuple[int, int]:
    rows, cols = as_pair(tuple(grid), "grid")
    if rows < 1 or cols < 1:
        raise ValueError(f"grid sides must be >= 1, got {rows}x{cols}")
    return rows, cols


def check_no_prefix_tokens(kind: str, n_prefix: int) -> None:
    """Refuse prefix (class / distillation) tokens for a ``window`` or ``neighborhood`` head.

    Swin and NAT/DiNAT have no class token and their papers define no rule for one (which window would it sit in?);
    a ViT with a class token can use global or MaiT-masked heads instead.

    Raises:
        ValueError: ``n_prefix > 0``.
    """
    if n_prefix > 0:
        raise ValueError(f"a {kind} head attends the token grid only, but this layer has {n_prefix} prefix "
                         f"(class/distillation) token(s){HINT}drop the class token (global average pooling, as Swin "
                         "and NAT) or use mhsa/mask heads in layers that carry one")


# ------------------------------------------------------------------------------------------------ Swin
def resolve_window(grid: Sequence[int], window: int | Sequence[int], shift: int | Sequence[int], *,
                   clamp: bool = True) -> tuple[tuple[int, int], tuple[int, int]]:
    """The window and shift a Swin block runs with on ``grid`` (timm ``SwinTransformerBlock._calc_window_shift``,
    ``always_partition=False``): on an axis where the grid is no larger than the window, the window becomes the
    grid side and the shift 0 (a window covering the axis is not shifted).

    Args:
        grid: ``(H, W)``.
        window: ``w`` or ``(w_h, w_w)``, each >= 1.
        shift: ``s`` or ``(s_h, s_w)``, each ``0 <= s < w`` (checked on the requested window).
        clamp: True follows timm (a window larger than the grid is clamped to it; what a model at another input
            size needs); False refuses a window larger than the grid (what a spec that states the window wants).

    Returns:
        ``((w_h, w_w), (s_h, s_w))`` as the kernels run them.

    Raises:
        ValueError: a side < 1, a negative shift, ``shift >= window``, or (``clamp=False``) a window side larger
        than the grid side.
    """
    rows, cols = _grid(grid)
    win, sh = as_pair(window, "window"), as_pair(shift, "shift")
    if min(win) < 1:
        raise ValueError(f"window sides must be >= 1, got {win[0]}x{win[1]}")
    for w, s in zip(win, sh):
        if s < 0 or s >= w:
            raise ValueError(f"shift {s} must be in [0, window) = [0, {w}){HINT}Swin shifts by window // 2 = "
                             f"{w // 2} in every other block, 0 in the others")
    if not clamp and (win[0] > rows or win[1] > cols):
        raise ValueError(f"window {win[0]}x{win[1]} is larger than the {rows}x{cols} token grid{HINT}use at most "
                         f"a {min(win[0], rows)}x{min(win[1], cols)} window (timm clamps a Swin window to the grid)")
    out_win = tuple(min(w, side) for w, side in zip(win, (rows, cols)))
    out_shift = tuple(0 if side <= w else s for side, w, s in zip((rows, cols), out_win, sh))
    return (out_win[0], out_win[1]), (out_shift[0], out_shift[1])


def padded_grid(grid: Sequence[int], window: Sequence[int]) -> tuple[int, int]:
    """The grid padded at the bottom/right to a multiple of the window (timm ``_attn``'s ``pad_h``/``pad_w``)."""
    return tuple(-(-side // w) * w for side, w in zip(grid, window))


@dataclass(frozen=True)
class SwinAxis:
    """One axis of Swin's (shifted) window partition, in timm's rolled-then-padded frame.

    ``position[p]``: rolled position of original index ``p`` (``(p - shift) mod length``); rolled positions
    ``length .. padded - 1`` are padding.  ``window[r]``, ``region[r]``, ``offset[r]``: the window, timm's mask
    region and the place inside the window of rolled position ``r`` (``0 <= r < padded``).  Two tokens attend each
    other iff their windows and regions are equal on both axes; their bias-table offset is the difference of
    ``offset``.
    """

    length: int
    size: int
    padded: int
    position: tuple[int, ...]
    window: tuple[int, ...]
    region: tuple[int, ...]
    offset: tuple[int, ...]

    def attends(self, r_query: int, r_key: int) -> bool:
        """Whether rolled positions ``r_query`` and ``r_key`` share a window and a region on this axis."""
        return self.window[r_query] == self.window[r_key] and self.region[r_query] == self.region[r_key]


def swin_axis(length: int, window: int, shift: int) -> SwinAxis:
    """The tables of one axis for an already resolved window and shift (:func:`resolve_window`).

    The region of a rolled position is the label timm's ``get_attn_mask`` gives it: ``img_mask`` is filled by
    the slices ``(0, -w), (-w, -s), (-s, None)`` in order, a later slice overwriting an earlier one, so a
    position's label on this axis is the index of the last slice holding it.  Python's slices are the same as
    torch's here, ``-0`` included: with ``s = 0`` the middle slice is empty and the last one is the whole axis,
    so an unshifted axis has one region (timm's quirk, followed).

    Note (timm 1.0, followed for parity): the roll wraps the unpadded axis but the slices are taken on the padded
    one, so when ``length`` is not a multiple of the window the regions do not fall on the wrap-around seam.
    """
    padded = -(-length // window) * window
    labels = [0] * padded
    for index, (start, stop) in enumerate(((0, -window), (-window, -shift), (-shift, None))):
        for r in range(padded)[start:stop]:
            labels[r] = index
    return SwinAxis(length=length, size=window, padded=padded,
                    position=tuple((p - shift) % length for p in range(length)),
                    window=tuple(r // window for r in range(padded)), region=tuple(labels),
                    offset=tuple(r % window for r in range(padded)))


def _axis_attended(axis: SwinAxis) -> int:
    """(query, key) position pairs on one axis that share a window and a region: real queries x every key."""
    return sum(axis.attends(r, key) for r in range(axis.length) for key in range(axis.padded))


def window_partition_pairs(grid: Sequence[int], window: int | Sequence[int], shift: int | Sequence[int]) -> int:
    """(query, key) pairs the window partition computes per head: ``num_windows * (w_h w_w)^2`` on the padded
    grid, masked and padded pairs included (they are multiplied).  Without padding this is Swin's ``M^2 h w``
    (sec. 3.2, eq. 2: W-MSA's ``2 M^2 h w C``).  MACs of ``Q K^T`` and of ``A V`` are each this times the head
    dim.  The window and shift are resolved as timm does (:func:`resolve_window`)."""
    win, _ = resolve_window(grid, window, shift)
    hp, wp = padded_grid(_grid(grid), win)
    return hp * wp * win[0] * win[1]


def window_attended_pairs(grid: Sequence[int], window: int | Sequence[int], shift: int | Sequence[int]) -> int:
    """(query, key) pairs with a finite mask over the grid's ``H W`` queries and the padded grid's keys (padding
    keys included: timm does not mask them); pairs across timm's regions (``-100``) are not counted.  Equals the
    True entries of :func:`archspec.families.attention.local_kernels.swin_window_mask`."""
    rows, cols = _grid(grid)
    win, sh = resolve_window((rows, cols), window, shift)
    return _axis_attended(swin_axis(rows, win[0], sh[0])) * _axis_attended(swin_axis(cols, win[1], sh[1]))


# ------------------------------------------------------------------------------------------------ NAT / DiNAT
def check_neighborhood(grid: Sequence[int], kernel: int | Sequence[int],
                       dilation: int | Sequence[int] = 1) -> tuple[tuple[int, int], tuple[int, int]]:
    """NATTEN's argument checks (v0.17.5 ``csrc/include/natten/pytorch/helpers.h``: ``CheckArgs``,
    ``AssertOddKernelSizeIfHasRPB``, ``CheckArgsAgainstDim``): an odd kernel > 1, a dilation >= 1, and
    ``kernel * dilation <= side`` on each axis.  Hugging Face's ``DinatLayer.maybe_pad`` pads a smaller grid
    with zero tokens instead; a spec is refused here rather than silently attending padding.

    Returns:
        ``((k_h, k_w), (d_h, d_w))``.

    Raises:
        ValueError: an even kernel or one < 3, a dilation < 1, or ``kernel * dilation`` beyond a grid side.
    """
    rows, cols = _grid(grid)
    kern, dil = as_pair(kernel, "kernel"), as_pair(dilation, "dilation")
    for k in kern:
        if k < 3 or k % 2 == 0:
            raise ValueError(f"neighbourhood kernel {k} must be odd and >= 3{HINT}NAT and DiNAT use 7; "
                             f"use {max(3, k + 1 - k % 2)}")
    for d in dil:
        if d < 1:
            raise ValueError(f"dilation {d} must be >= 1")
    for side, k, d, name in zip((rows, cols), kern, dil, ("rows", "cols")):
        if k * d > side:
            fix = (f"dilation <= {side // k} for kernel {k}" if k <= side else
                   f"a kernel of at most {side - 1 + side % 2}" if side >= 3 else "a larger grid")
            raise ValueError(f"kernel {k} x dilation {d} = {k * d} is beyond the grid's {side} {name}{HINT}use "
                             f"kernel * dilation <= {side} ({fix}), or a larger input")
    return kern, dil


def na_window_start(index: int, length: int, kernel: int, dilation: int) -> int:
    """First key position of query ``index``'s neighbourhood on one axis (NATTEN ``get_window_start``,
    ``is_causal=False``): on the sub-axis of positions ``= index mod dilation`` (``length_pdp`` of them), the
    window of ``kernel`` positions centred on the query, shifted inward at the borders; returned in grid units.
    The keys are ``start + j * dilation`` for ``j < kernel``.  Needs ``kernel * dilation <= length``."""
    half = kernel // 2
    dilation_idx = index % dilation
    index_pdp = index // dilation
    length_pdp = (length + dilation - 1) // dilation
    num_padded = length_pdp * dilation - length
    length_pdp -= 1 if dilation_idx >= dilation - num_padded else 0
    start = max(index_pdp - half, 0) + (index_pdp + half >= length_pdp) * (length_pdp - index_pdp - half - 1)
    return start * dilation + dilation_idx


def na_bias_start(index: int, length: int, kernel: int, dilation: int) -> int:
    """Row (or column) of the ``(2k-1)`` relative-position-bias axis for query ``index``'s first key (NATTEN
    ``get_pb_start``); key ``j`` of the window reads ``start + j``.  It is ``(key - query) / dilation + k - 1``:
    the offset in sub-grid units, shifted to start at 0."""
    half = kernel // 2
    if dilation <= 1:
        return half + (index < half) * (half - index) + (index + half >= length) * (length - index - 1 - half)
    if index - half * dilation < 0:
        return kernel - 1 - index // dilation
    if index + half * dilation >= length:
        return (length - index - 1) // dilation
    return half


@dataclass(frozen=True)
class NeighborhoodAxis:
    """One axis of a neighbourhood: for each position its ``kernel`` key positions (``keys[p]``) and bias
    positions on the ``2 kernel - 1`` axis (``bias[p]``), in window order."""

    keys: tuple[tuple[int, ...], ...]
    bias: tuple[tuple[int, ...], ...]


def neighborhood_axis(length: int, kernel: int, dilation: int) -> NeighborhoodAxis:
    """The per-position key and bias positions of one axis (:func:`na_window_start`, :func:`na_bias_start`)."""
    starts = [na_window_start(p, length, kernel, dilation) for p in range(length)]
    bias = [na_bias_start(p, length, kernel, dilation) for p in range(length)]
    return NeighborhoodAxis(keys=tuple(tuple(s + j * dilation for j in range(kernel)) for s in starts),
                            bias=tuple(tuple(b + j for j in range(kernel)) for b in bias))


def neighborhood_pairs(grid: Sequence[int], kernel: int | Sequence[int], dilation: int | Sequence[int] = 1) -> int:
    """(query, key) pairs of a neighbourhood head: ``H W k_h k_w`` (every query attends exactly ``k_h k_w`` keys:
    the window is clamped, never truncated).  MACs of ``Q K^T`` and of ``A V`` are each this times the head dim
    (NAT's complexity analysis: NA's two products cost ``2 H W C k^2``, as Swin's
    window attention at the same receptive field).

    Raises:
        ValueError: as :func:`check_neighborhood`.
    """
    kern, _ = check_neighborhood(grid, kernel, dilation)
    rows, cols = _grid(grid)
    return rows * cols * kern[0] * kern[1]


def residue_lengths(length: int, dilation: int) -> list[tuple[int, int]]:
    """``(count, sub-axis length)`` of the residues mod ``dilation`` (DiNAT's sub-grids along one axis): the first
    ``length mod d`` (or all ``d``) residues have ``ceil(length / d)`` positions, the others one fewer."""
    longest, full = -(-length // dilation), length % dilation or dilation
    return [(full, longest)] + ([(dilation - full, longest - 1)] if full < dilation else [])


def _tiled_axis_pairs(length: int, kernel: int, dilation: int, tile: int) -> int:
    """Per axis, summed over its sub-axes: (padded query positions) x (keys of a tile's block)."""
    return sum(count * _tiled_axis_rows(sub, kernel, tile) for count, sub in residue_lengths(length, dilation))


def _tiled_axis_rows(length: int, kernel: int, tile: int) -> int:
    """One undilated axis of the tiled kernel: padded query positions times the keys of a tile's block."""
    side = min(tile, length)
    return -(-length // side) * side * min(side + kernel - 1, length)


def neighborhood_bias_macs(grid: Sequence[int], kernel: int | Sequence[int], dilation: int | Sequence[int] = 1,
                           tile: int = NA_TILE) -> int:
    """MACs per head of the tiled kernel's relative-position bias (``local_kernels._tile_bias``): once per call, for
    every shape of sub-grid (the sub-grids of one shape share it), ``onehot_rows @ rpb @ onehot_cols^T`` --
    ``R (2k_h - 1)(2k_w - 1) + R (2k_w - 1) C`` with ``R``, ``C`` the padded queries times block keys of the rows
    and the columns (:func:`neighborhood_executed_pairs`' axes).  Exact products (one non-zero term each), counted as
    the FLOP counter counts them; per forward, not per image.

    Raises:
        ValueError: as :func:`check_neighborhood`.
    """
    (kh, kw), (dh, dw) = check_neighborhood(grid, kernel, dilation)
    rows, cols = _grid(grid)
    total = 0
    for _, sub_r in residue_lengths(rows, dh):
        r = _tiled_axis_rows(sub_r, kh, tile)
        for _, sub_c in residue_lengths(cols, dw):
            total += r * (2 * kh - 1) * (2 * kw - 1) + r * (2 * kw - 1) * _tiled_axis_rows(sub_c, kw, tile)
    return total


def neighborhood_executed_pairs(grid: Sequence[int], kernel: int | Sequence[int],
                                dilation: int | Sequence[int] = 1, tile: int = NA_TILE) -> int:
    """(query, key) pairs the tiled kernel multiplies per head (``local_kernels.neighborhood_attention``): on each
    sub-grid, every query of a ``T x T`` tile (the last tiles padded) against the tile's ``min(T + k - 1, side)``
    block on each axis -- ``(T + k - 1)^2 / k^2`` times :func:`neighborhood_pairs` in the interior (3.4x at
    ``T = k = 7``).  Separable: the product of the two axes' sums.  MACs of ``Q K^T`` and ``A V`` are each this
    times the head dim.

    Raises:
        ValueError: as :func:`check_neighborhood`.
    """
    (kh, kw), (dh, dw) = check_neighborhood(grid, kernel, dilation)
    rows, cols = _grid(grid)
    return _tiled_axis_pairs(rows, kh, dh, tile) * _tiled_axis_pairs(cols, kw, dw, tile)
