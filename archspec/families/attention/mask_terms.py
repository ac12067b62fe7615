"""MaiT attention masks (Li et al. 2022, "MaiT", eq. 2 and 4) on a patch grid with prefix tokens: the torch side.

``M`` is boolean ``(N, N)`` with ``N = num_prefix_tokens + H * W``; ``True`` marks a neighbour.
Three ways to apply it to the (scaled) logits ``S = Q K^T / sqrt(d)`` before the softmax:

* hard (eq. 2): ``M (.) S`` -- non-neighbours get logit exactly 0 (weight ``e^0``); they are *not*
  removed, as the paper states ("allows models to enforce locality or bypass it");
* soft (eq. 4): non-neighbour logits are multiplied by ``alpha = sigmoid(a)`` in (0, 1), a learned
  scale per head, neighbours keep theirs;
* strict: non-neighbours get ``-inf`` (not in the paper; a separately named option).

:func:`mask_terms` (with :func:`~archspec.families.attention.position_terms.apply_logit_terms`) is the one mask
rule: both :class:`~archspec.families.attention.module.Attention` (its mask kind's terms, on the dense reference
path) and CaiT's :class:`~archspec.families.talking_heads.module.TalkingHeadAttn` (after ``proj_l``) apply masks
through them.  The kind itself (spec, letters, counts, checks, paths, and its torch half in ``Attention``) is
:mod:`.kinds.mask`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .kinds.mask import alpha_to_logit
from .tables import grid_positions

__all__ = ["window_mask", "soft_mask_scale", "mask_terms", "hard_zero", "soft_multiplier", "strict_block",
           "alpha_to_logit"]


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


def hard_zero(num_heads: int, modes: Sequence[str | None], masks: Tensor) -> Tensor | None:
    """Bool ``(H, N, N)``: True where a hard-masked head's logit becomes 0 (``M (.) S`` as a masked fill, which
    keeps no float copy of ``M``); None without hard heads.

    Args:
        num_heads: ``H``.
        modes: per head, its mask mode (``'hard'``, ``'soft'``, ``'strict'``) or None.
        masks: bool ``(n_mask, N, N)``, one neighbourhood per masked head in head order.
    """
    return _per_head(num_heads, modes, masks, "hard", invert=True)


def _per_head(num_heads: int, modes: Sequence[str | None], masks: Tensor, mode: str, invert: bool) -> Tensor | None:
    masked = [h for h, m in enumerate(modes) if m is not None]
    chosen = [h for h, m in enumerate(modes) if m == mode]
    if not chosen:
        return None
    n = masks.shape[-1]
    out = torch.zeros(num_heads, n, n, dtype=torch.bool, device=masks.device)
    rows = masks[[masked.index(h) for h in chosen]]
    out[chosen] = ~rows if invert else rows
    return out


def mask_terms(num_heads: int, modes: Sequence[str | None], masks: Tensor, alpha: Tensor | None,
               dtype: torch.dtype, zero: Tensor | None = None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The three mask terms of a layer: ``(zero, mult, block)``, each ``(H, N, N)`` or None when no head needs it.

    ``zero`` (bool): hard heads' non-neighbours, whose logit becomes 0 (:func:`hard_zero`; pass a cached one);
    ``mult`` (``dtype``): soft heads' multiplier :func:`soft_mask_scale` (1 for every other head);
    ``block`` (bool): strict heads' non-neighbours, whose logit becomes ``-inf``.

    Args:
        alpha: ``(n_soft,)`` soft heads' ``alpha`` in head order (``sigmoid`` of ``mask_alpha_logit``).
    """
    zero = hard_zero(num_heads, modes, masks) if zero is None else zero
    return zero, soft_multiplier(num_heads, modes, masks, alpha, dtype), strict_block(num_heads, modes, masks)


def soft_multiplier(num_heads: int, modes: Sequence[str | None], masks: Tensor, alpha: Tensor | None,
                    dtype: torch.dtype) -> Tensor | None:
    """``(H, N, N)`` in ``dtype``: the soft heads' :func:`soft_mask_scale` (MaiT eq. 4), 1 for every other head; None
    without soft heads.

    Args:
        num_heads: ``H``; modes: per head, its mask mode or None; masks: bool ``(n_mask, N, N)`` in head order.
        alpha: ``(n_soft,)`` soft heads' ``alpha`` in head order.
    """
    soft = [h for h, m in enumerate(modes) if m == "soft"]
    if not soft:
        return None
    masked = [h for h, m in enumerate(modes) if m is not None]
    n = masks.shape[-1]
    mult = torch.ones(num_heads, n, n, dtype=dtype, device=masks.device)
    mult[soft] = soft_mask_scale(masks[[masked.index(h) for h in soft]], alpha.to(dtype))
    return mult


def strict_block(num_heads: int, modes: Sequence[str | None], masks: Tensor) -> Tensor | None:
    """Bool ``(H, N, N)``: True where a strict-masked head's logit becomes ``-inf``; None without strict heads."""
    return _per_head(num_heads, modes, masks, "strict", invert=True)
