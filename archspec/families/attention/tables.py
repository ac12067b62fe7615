"""Relative-position tables shared by the attention heads.

All functions work on a patch grid ``(rows, cols) = (H, W)`` whose tokens are numbered in
row-major order: token ``t`` sits at row ``t // W`` and column ``t % W``.  Only patch tokens are
covered; prefix tokens (class / distillation) are handled by the callers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["check_grid", "grid_positions", "squared_distances", "gpsa_rel_indices", "levit_bias_idxs",
           "signed_bias_idxs", "conv_kernel_offsets", "resample_bias_table"]


def check_grid(grid: tuple[int, int]) -> tuple[int, int]:
    """``(rows, cols)`` as ints.

    Raises:
        ValueError: not two sides, or a side < 1.
    """
    if len(grid) != 2:
        raise ValueError(f"grid must be (rows, cols), got {grid!r}")
    rows, cols = int(grid[0]), int(grid[1])
    if rows < 1 or cols < 1:
        raise ValueError(f"grid sides must be >= 1, got {grid!r}")
    return rows, cols


def grid_positions(grid: tuple[int, int], stride: int = 1) -> Tensor:
    """Row and column of every token of a row-major grid.

    Args:
        grid: ``(H, W)`` patch grid.
        stride: keep every ``stride``-th row and column (LeViT's subsampled queries).

    Returns:
        LongTensor ``(2, N)`` with ``N = ceil(H / stride) * ceil(W / stride)``: row 0 the rows, row 1 the columns.

    Raises:
        ValueError: for a grid side < 1 or ``stride < 1``.
    """
    rows, cols = check_grid(grid)
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    r = torch.arange(0, rows, stride, dtype=torch.long)
    c = torch.arange(0, cols, stride, dtype=torch.long)
    rr, cc = torch.meshgrid(r, c, indexing="ij")
    return torch.stack([rr.flatten(), cc.flatten()])


def squared_distances(grid: tuple[int, int]) -> Tensor:
    """Squared distance ``d_ij^2 = (row_i - row_j)^2 + (col_i - col_j)^2`` between patches ``i`` and ``j`` of a
    row-major grid, in patch units (squared).

    The one table behind GMM-Mask's Gaussian bias ``exp(-d_ij^2 / (2 sigma^2))`` (Li & Zhang, arXiv 2309.05375;
    authors' ``models/gmm.py``, ``dx^2 + dy^2``), the third GPSA channel ``dx^2 + dy^2`` (ConViT eq. 5, timm
    ``convit.GPSA.get_rel_indices``) and, square-rooted, ConViT's nonlocality distance ``||delta_ij||`` (eq. 8).

    Args:
        grid: ``(H, W)`` patch grid.

    Returns:
        float32 Tensor ``(H*W, H*W)``, symmetric, 0 on the diagonal; whole numbers, exact in float32 (up to
        ``2^24``).

    Raises:
        ValueError: for a grid side < 1.
    """
    pos = grid_positions(grid).to(torch.float32)
    return (pos[:, :, None] - pos[:, None, :]).pow(2).sum(dim=0)


def gpsa_rel_indices(grid: tuple[int, int]) -> Tensor:
    """GPSA relative encodings ``r_ij`` between query ``i`` and key ``j`` (ConViT eq. 5).

    Channel order follows timm ``convit.GPSA.get_rel_indices``: ``[dx, dy, dx^2 + dy^2]`` with
    ``dx = col_j - col_i`` and ``dy = row_j - row_i`` (key position minus query position); the last channel is
    :func:`squared_distances`.
    For square grids the result equals ``timm``'s ``rel_indices[0]`` exactly; non-square grids use
    the same definition on a row-major ``H x W`` grid.

    Args:
        grid: ``(H, W)`` patch grid.

    Returns:
        float32 Tensor ``(N, N, 3)``, ``N = H * W``.

    Raises:
        ValueError: for a grid side < 1.
    """
    pos = grid_positions(grid).to(torch.float32)
    d = pos[:, None, :] - pos[:, :, None]  # (2, Nq, Nk): key minus query
    dy, dx = d[0], d[1]
    return torch.stack([dx, dy, squared_distances(grid)], dim=-1)


def levit_bias_idxs(grid: tuple[int, int], stride: int = 1) -> Tensor:
    """Indices into LeViT's attention-bias table on *absolute* offsets (LeViT eq. 1).

    Mirrors timm ``levit.Attention._compute_attention_bias_idxs`` (``stride=1``) and
    ``levit.AttentionDownsample._compute_attention_bias_idxs`` (``stride>1``, queries subsampled):
    ``rel = |q_pos - k_pos|``, ``idx = rel_row * W + rel_col`` into a table of ``H * W`` entries.

    Args:
        grid: ``(H, W)`` key grid.
        stride: query subsampling stride.

    Returns:
        LongTensor ``(Nq, Nk)`` with ``Nk = H * W``, ``Nq = ceil(H / stride) * ceil(W / stride)``.

    Raises:
        ValueError: for a grid side < 1 or ``stride < 1``.
    """
    rows, cols = check_grid(grid)
    k_pos = grid_positions(grid)
    q_pos = grid_positions(grid, stride)
    rel = (q_pos[:, :, None] - k_pos[:, None, :]).abs()
    return rel[0] * cols + rel[1]


def signed_bias_idxs(grid: tuple[int, int]) -> Tensor:
    """Indices into a table of *signed* relative offsets (CMHSA eq. 4, ``B_ij = b(x_i - x_j, y_i - y_j)``).

    The offset is query minus key, as in the paper: ``dr = row_i - row_j`` in ``[-(H-1), H-1]``,
    ``dc = col_i - col_j`` in ``[-(W-1), W-1]``; ``idx = (dr + H - 1) * (2W - 1) + (dc + W - 1)``.
    Every distinct signed offset has its own entry; the table has ``(2H - 1)(2W - 1)`` entries.

    Args:
        grid: ``(H, W)`` patch grid.

    Returns:
        LongTensor ``(N, N)``, ``N = H * W``.

    Raises:
        ValueError: for a grid side < 1.
    """
    rows, cols = check_grid(grid)
    pos = grid_positions(grid)
    d = pos[:, :, None] - pos[:, None, :]  # query minus key
    return (d[0] + rows - 1) * (2 * cols - 1) + (d[1] + cols - 1)


def conv_kernel_offsets(n_heads: int) -> list[tuple[float, float]]:
    """Kernel offset ``Delta_h = (d_row, d_col)`` of each conv-initialised GPSA head (ConViT eq. 5).

    Mirrors timm ``convit.GPSA.local_init``: ``k = int(sqrt(n_heads))``,
    ``center = (k - 1) / 2`` for even ``k`` else ``k // 2``; head ``position = h1 + k * h2`` gets
    ``d_row = h1 - center`` and ``d_col = h2 - center``.  (timm writes ``2 * d_col`` into
    ``pos_proj`` channel 0 (dx) and ``2 * d_row`` into channel 1 (dy).)  The head attends, at
    large locality strength, to the key at ``query + (d_row, d_col)``.  Even ``k`` gives half-integer
    offsets, as in timm.

    Args:
        n_heads: number of conv-initialised heads; must be a perfect square.

    Returns:
        list of ``n_heads`` ``(d_row, d_col)`` pairs, indexed by head position.

    Raises:
        ValueError: if ``n_heads`` is not a positive perfect square.
    """
    k = math.isqrt(n_heads) if n_heads > 0 else 0
    if n_heads < 1 or k * k != n_heads:
        raise ValueError(
            f"convolutional init needs a perfect-square number of GPSA heads (1, 4, 9, 16, ...), got {n_heads}"
        )
    center = (k - 1) / 2 if k % 2 == 0 else k // 2
    offsets: list[tuple[float, float]] = [(0.0, 0.0)] * n_heads
    for h1 in range(k):
        for h2 in range(k):
            offsets[h1 + k * h2] = (float(h1 - center), float(h2 - center))
    return offsets


def resample_bias_table(table: Tensor, old_shape: tuple[int, int], new_shape: tuple[int, int]) -> Tensor:
    """Resample per-head relative-bias tables laid out on a 2-D offset grid to another grid.

    LeViT's absolute-offset table ``(heads, H * W)`` lies on the ``(H, W)`` grid of ``(|dy|, |dx|)``;
    CMHSA's signed table ``(heads, (2H-1)(2W-1))`` on the ``(2H-1, 2W-1)`` grid of ``(dy, dx)``.  Both are
    resized with bicubic, antialiased ``F.interpolate`` as timm ``layers.resize_rel_pos_bias_table_levit``
    (equal to it for square grids; this one also takes non-square grids).  Values are computed in float32
    and returned in the table's dtype.

    Args:
        table: ``(heads, old_shape[0] * old_shape[1])``.
        old_shape, new_shape: ``(rows, cols)`` of the offset grid before and after.

    Returns:
        Tensor ``(heads, new_shape[0] * new_shape[1])`` (``table`` itself when the shapes are equal).

    Raises:
        ValueError: when ``table`` does not have ``old_shape[0] * old_shape[1]`` columns.
    """
    heads, length = table.shape
    if length != old_shape[0] * old_shape[1]:
        raise ValueError(f"bias table has {length} entries per head, not {old_shape[0]}x{old_shape[1]}")
    if tuple(old_shape) == tuple(new_shape):
        return table
    grid = table.float().reshape(1, heads, old_shape[0], old_shape[1])
    resized = F.interpolate(grid, size=tuple(new_shape), mode="bicubic", antialias=True)
    return resized.reshape(heads, -1).to(table.dtype)
