"""Attention diagnostics of compiled models: attention maps, MaiT's locality score, ConViT's nonlocality.

* :func:`attention_maps` -- the final attention probabilities ``(B, H, N, N)`` of every
  :class:`archspec.blocks.Attention` in a model, from one forward pass (hooks on the layers' inputs).
* :func:`attention_locality_score` -- MaiT eq. 3: ``ALS_n = sum_i (M (.) A)_{n,i}``, the attention
  mass a patch query puts inside its window; per head, the mean over patch queries (and the batch).
* :func:`layer_als` -- ALS of every layer and head with a window mask on that layer's token grid.
* :func:`nonlocality` -- ConViT eq. 8: ``D_loc = sum_j A_ij ||delta_ij||`` in patch units, averaged
  over patch queries (and the batch), per head.

These work on any archspec model (whatever its heads: masked, biased, GPSA or plain), and the
functions on tensors work on any attention map.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from archspec.blocks.attention import Attention
from archspec.blocks.masks import window_mask
from archspec.blocks.position import grid_positions

__all__ = ["attention_maps", "attention_locality_score", "layer_als", "nonlocality", "patch_window_mask"]


@torch.no_grad()
def attention_maps(model: nn.Module, x: Tensor) -> dict[str, Tensor]:
    """``{module path: (B, H, N, N)}`` for every :class:`~archspec.blocks.Attention` of ``model``.

    One forward pass in ``eval`` mode without gradients; a forward pre-hook on each attention layer
    calls its ``get_attention`` on the layer's input (probabilities after masks, biases and GPSA
    gating, without dropout).  The model's train/eval mode is restored afterwards.
    """
    maps: dict[str, Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, Attention):
            def hook(mod: Attention, args: tuple, _name: str = name) -> None:
                maps[_name] = mod.get_attention(args[0]).detach()
            handles.append(module.register_forward_pre_hook(hook))
    was_training = model.training
    model.eval()
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return maps


def attention_locality_score(attn: Tensor, mask: Tensor, num_prefix_tokens: int = 0) -> Tensor:
    """MaiT Attention Locality Score (eq. 3) per head.

    ``ALS_n = sum_i (M (.) A)_{n,i}`` for each patch query ``n`` (rows ``num_prefix_tokens..N-1``); a
    head's ALS is the mean over those rows and over the batch.  The mask is used as given: pass
    :func:`patch_window_mask` to count only the spatial neighbours (what :func:`layer_als` does), or a
    layer's own ``attn_masks`` (which treat the class token as a neighbour) to count that too.

    Args:
        attn: attention probabilities ``(B, H, N, N)`` (rows sum to 1).
        mask: BoolTensor ``(N, N)``, ``True`` = neighbour of the query row.
        num_prefix_tokens: class/distillation tokens first; their rows are not averaged.

    Returns:
        ``(H,)``: 1 when every patch attends only inside its window; ``|window| / N`` for uniform attention.
    """
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attn must be (B, H, N, N), got {tuple(attn.shape)}")
    n = attn.shape[-1]
    if mask.shape != (n, n):
        raise ValueError(f"mask must be ({n}, {n}) for {n} tokens, got {tuple(mask.shape)}")
    if not 0 <= num_prefix_tokens < n:
        raise ValueError(f"num_prefix_tokens must be in [0, {n}), got {num_prefix_tokens}")
    als_n = (attn * mask.to(attn.dtype)).sum(dim=-1)  # (B, H, N)
    return als_n[:, :, num_prefix_tokens:].mean(dim=(0, 2))


def patch_window_mask(grid: tuple[int, int], window: tuple[int, int], num_prefix_tokens: int = 0) -> Tensor:
    """Window mask ``(N, N)`` of spatial neighbours only: prefix rows and columns are ``False``.

    Windows may exceed the grid (they are clipped at the border, as in MaiT's masks).
    """
    mask = window_mask(grid, window, num_prefix_tokens).clone()
    p = num_prefix_tokens
    mask[:p, :] = False
    mask[:, :p] = False
    return mask


def layer_als(model: nn.Module, x: Tensor, window: tuple[int, int] = (3, 3)) -> dict[str, Tensor]:
    """ALS ``(H,)`` of every attention layer of ``model`` on images ``x``, with a ``window`` mask on its grid.

    Whatever each head is (masked or not), the score counts the attention a patch query puts on the
    patches of its ``window`` (class/distillation columns are not neighbours here), averaged over
    patch queries and the batch -- MaiT's per-head, per-layer ALS (Fig. 3).
    """
    out: dict[str, Tensor] = {}
    modules = dict(model.named_modules())
    for name, attn in attention_maps(model, x).items():
        layer = modules[name]
        mask = patch_window_mask(layer.grid, window, layer.num_prefix_tokens).to(attn.device)
        out[name] = attention_locality_score(attn, mask, layer.num_prefix_tokens)
    return out


def nonlocality(attn: Tensor, grid: tuple[int, int], num_prefix_tokens: int = 0) -> Tensor:
    """ConViT nonlocality (eq. 8) per head: ``sum_j A_ij ||delta_ij||``, averaged over patch queries and batch.

    ``delta_ij`` is the offset between patches ``i`` and ``j`` on the ``grid`` in patch units (Euclidean).
    Only patch-to-patch attention counts: the weight a patch puts on class/distillation tokens has no
    distance and is left out (ConViT's GPSA layers have no class token).

    Args:
        attn: ``(B, H, N, N)`` with ``N = num_prefix_tokens + rows * cols``.

    Returns:
        ``(H,)`` mean attention distance in patches (0 for attention on the query itself only).
    """
    rows, cols = grid
    n = num_prefix_tokens + rows * cols
    if attn.dim() != 4 or attn.shape[-2:] != (n, n):
        raise ValueError(f"attn must be (B, H, {n}, {n}) for grid {rows}x{cols} and {num_prefix_tokens} prefix "
                         f"tokens, got {tuple(attn.shape)}")
    pos = grid_positions((rows, cols)).to(attn.device, attn.dtype)  # (2, P)
    dist = (pos[:, :, None] - pos[:, None, :]).pow(2).sum(0).sqrt()  # (P, P)
    p = num_prefix_tokens
    patch = attn[:, :, p:, p:]
    return (patch * dist).sum(dim=-1).mean(dim=(0, 2))
