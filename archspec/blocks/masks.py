"""MaiT attention masks (Li et al. 2022, "MaiT", eq. 2 and 4) on a patch grid with prefix tokens.

``M`` is boolean ``(N, N)`` with ``N = num_prefix_tokens + H * W``; ``True`` marks a neighbour.
Three ways to apply it to the (scaled) logits ``S = Q K^T / sqrt(d)`` before the softmax:

* hard (eq. 2): ``M (.) S`` -- non-neighbours get logit exactly 0 (weight ``e^0``); they are *not*
  removed, as the paper states ("allows models to enforce locality or bypass it");
* soft (eq. 4): non-neighbour logits are multiplied by ``alpha = sigmoid(a)`` in (0, 1), a learned
  scale per head, neighbours keep theirs;
* strict: non-neighbours get ``-inf`` (not in the paper; a separately named option).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .position import grid_positions

__all__ = [
    "window_mask",
    "apply_hard_mask",
    "apply_soft_mask",
    "apply_strict_mask",
    "soft_mask_scale",
    "alpha_to_logit",
]


def window_mask(grid: tuple[int, int], window: tuple[int, int], num_prefix_tokens: int = 0) -> Tensor:
    """Neighbourhood mask of a ``rows x cols`` window centred on each query (MaiT Fig. 1).

    Patch ``j`` is a neighbour of patch ``i`` when ``|row_j - row_i| <= rows // 2`` and
    ``|col_j - col_i| <= cols // 2`` (windows are clipped at the grid border, no wrap-around).
    Prefix tokens (class / distillation, placed first) are neighbours of every token in both
    directions: their rows and columns are all ``True`` -- the class token attends to all tokens and
    every patch keeps its logit towards the class column.  This is our reading of MaiT ("the class
    token (and distillation token) still attends to all the patches"); the paper does not state what
    patch rows do with the class column.

    Args:
        grid: ``(H, W)`` patch grid, tokens in row-major order after the prefix tokens.
        window: ``(rows, cols)``, both odd (``3x3``, ``3x5``, ``5x5``).
        num_prefix_tokens: number of class / distillation tokens before the patches.

    Returns:
        BoolTensor ``(N, N)``, ``N = num_prefix_tokens + H * W``, ``True`` = neighbour.

    Raises:
        ValueError: for an even or non-positive window side, a grid side < 1, or a negative prefix count.
    """
    rows, cols = int(window[0]), int(window[1])
    if rows < 1 or cols < 1 or rows % 2 == 0 or cols % 2 == 0:
        raise ValueError(f"window {rows}x{cols} must have odd positive sides (it is centred on the query)")
    if num_prefix_tokens < 0:
        raise ValueError(f"num_prefix_tokens must be >= 0, got {num_prefix_tokens}")
    pos = grid_positions(grid)
    d = (pos[:, :, None] - pos[:, None, :]).abs()
    patch = (d[0] <= rows // 2) & (d[1] <= cols // 2)
    p = num_prefix_tokens
    n = p + patch.shape[0]
    mask = torch.ones(n, n, dtype=torch.bool)
    mask[p:, p:] = patch
    return mask


def apply_hard_mask(logits: Tensor, mask: Tensor) -> Tensor:
    """Hard MaiT mask (eq. 2): ``logits * M``; non-neighbours get logit exactly 0 (weight ``e^0``).

    Args:
        logits: ``(..., N, N)`` scaled logits ``Q K^T / sqrt(d)`` (plus any additive bias).
        mask: BoolTensor broadcastable to ``logits``, ``True`` = neighbour.

    Returns:
        Tensor shaped like ``logits``.
    """
    return logits * mask.to(logits.dtype)


def soft_mask_scale(mask: Tensor, alpha: Tensor) -> Tensor:
    """Soft-mask multiplier ``M' = M + (1 - M) alpha`` (MaiT eq. 4): 1 on neighbours, ``alpha`` elsewhere.

    Args:
        mask: BoolTensor ``(h, N, N)`` (or ``(N, N)``), ``True`` = neighbour.
        alpha: ``(h,)`` scale per head in (0, 1) (or a scalar tensor).

    Returns:
        float Tensor ``(h, N, N)`` (dtype of ``alpha``).
    """
    alpha = alpha.reshape(-1, 1, 1) if alpha.dim() > 0 else alpha
    one = torch.ones((), dtype=alpha.dtype, device=alpha.device)
    return torch.where(mask, one, alpha)


def apply_soft_mask(logits: Tensor, mask: Tensor, alpha: Tensor) -> Tensor:
    """Soft MaiT mask (eq. 4): non-neighbour logits scaled by ``alpha``; neighbours unchanged.

    Args:
        logits: ``(B, h, N, N)`` or ``(h, N, N)`` scaled logits.
        mask: BoolTensor ``(h, N, N)`` or ``(N, N)``, ``True`` = neighbour.
        alpha: ``(h,)`` in (0, 1), usually ``sigmoid`` of a learned logit.

    Returns:
        Tensor shaped like ``logits``.
    """
    return logits * soft_mask_scale(mask, alpha.to(logits.dtype))


def apply_strict_mask(logits: Tensor, mask: Tensor) -> Tensor:
    """Strict mask (our named option, not in MaiT): non-neighbours get ``-inf`` so their weight is 0.

    Args:
        logits: ``(..., N, N)``.
        mask: BoolTensor broadcastable to ``logits``, ``True`` = neighbour.  Each row must keep one
            ``True`` (a window always contains its query, so window masks do).

    Returns:
        Tensor shaped like ``logits``.
    """
    return logits.masked_fill(~mask, float("-inf"))


def alpha_to_logit(alpha: float) -> float:
    """``logit(alpha) = log(alpha / (1 - alpha))``: the raw soft-mask parameter for a given initial alpha.

    Raises:
        ValueError: unless ``0 < alpha < 1``.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"soft-mask alpha must lie in (0, 1), got {alpha}")
    return math.log(alpha / (1.0 - alpha))
