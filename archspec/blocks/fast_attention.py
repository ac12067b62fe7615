"""Fast attention kernels for the heads of :class:`~archspec.blocks.attention.Attention`.

Each function here is an exact rewrite of the dense reference formula of ``Attention._probs`` (kept in
``attention.py`` and selectable with ``attn_impl='dense'``) for one group of heads:

* :func:`hard_window_attention` -- MaiT hard masks (eq. 2) in ``O(N * window)`` time (MaiT sec. 5.3 notes
  hard masks can make attention linear in the number of tokens).  Non-neighbours keep logit 0, so each
  weighs ``e^0 = 1``: their share of the numerator is ``sum_all(v) - sum_window(v)`` and of the
  denominator their count ``n0``.  We fold them into one *virtual key* per query with logit ``log(n0)``
  and value ``(sum_all(v) - sum_window(v)) / n0``; the softmax over ``[prefix, window, virtual]`` then
  subtracts the running max over every term, the non-neighbours' ``0`` included, as the dense softmax does.
* :func:`gpsa_attention` -- ConViT GPSA (eq. 5-7) as ``(1 - g) SDPA(q, k, v) + g (P @ v)``: both terms are
  convex combinations (rows of ``softmax`` sum to 1), so ConViT's renormalisation divides by 1.
* :func:`flex_masked_attention` -- hard/soft masks and additive biases as a FlexAttention ``score_mod``
  (fused on CUDA after ``torch.compile``; eager elsewhere, used for the equivalence tests).

Which path a layer takes is decided at construction (see :func:`window_path_pays`), never from tensor
values in ``forward``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from archspec.executed_macs import window_attention_macs, window_path_pays

__all__ = ["window_tables", "hard_window_attention", "gpsa_attention", "window_path_pays",
           "window_attention_macs", "flex_masked_attention"]


def window_tables(grid: tuple[int, int], window: tuple[int, int], num_prefix_tokens: int) -> dict[str, Tensor]:
    """Constant tables of :func:`hard_window_attention` for one grid and window.

    Returns (float32; move/cast with the module):
        ``outside``: ``(H, W, rows*cols)`` additive logit: 0 for a window cell on the grid, ``-inf`` for a
        cell past the border (those padded keys are not tokens);
        ``n0``: ``(H, W, 1)`` number of non-neighbours of each patch query (an integer, exact in any float
        dtype; the virtual key's logit ``log(n0)`` is taken in the compute dtype, ``-inf`` when 0).

    Raises:
        ValueError: even or non-positive window sides, grid side < 1.
    """
    rows, cols = int(grid[0]), int(grid[1])
    wr, wc = int(window[0]), int(window[1])
    if wr < 1 or wc < 1 or wr % 2 == 0 or wc % 2 == 0:
        raise ValueError(f"window {wr}x{wc} must have odd positive sides")
    if rows < 1 or cols < 1:
        raise ValueError(f"grid sides must be >= 1, got {grid!r}")
    r = torch.arange(rows).view(rows, 1, 1, 1) + torch.arange(wr).view(1, 1, wr, 1) - wr // 2
    c = torch.arange(cols).view(1, cols, 1, 1) + torch.arange(wc).view(1, 1, 1, wc) - wc // 2
    on_grid = ((r >= 0) & (r < rows) & (c >= 0) & (c < cols)).reshape(rows, cols, wr * wc)
    n0 = rows * cols - on_grid.sum(-1, keepdim=True)  # prefix tokens are neighbours of every patch
    return {
        "outside": torch.zeros(rows, cols, wr * wc).masked_fill(~on_grid, float("-inf")),
        "n0": n0.float(),
    }


def _window_views(t: Tensor, grid: tuple[int, int], window: tuple[int, int]) -> list[Tensor]:
    """Shifted ``(B, h, H, W, d)`` views of the zero-padded patch grid of ``t`` ``(B, h, H*W, d)``, one per
    window cell (row-major)."""
    B, h, _, d = t.shape
    rows, cols = grid
    wr, wc = window
    padded = F.pad(t.reshape(B, h, rows, cols, d), (0, 0, wc // 2, wc // 2, wr // 2, wr // 2))
    return [padded[:, :, i:i + rows, j:j + cols] for i in range(wr) for j in range(wc)]


def hard_window_attention(q: Tensor, k: Tensor, v: Tensor, grid: tuple[int, int], window: tuple[int, int],
                          num_prefix_tokens: int, scale: float, tables: dict[str, Tensor]) -> Tensor:
    """Exact MaiT hard-mask attention (eq. 2: ``softmax(M (.) QK^T * scale) V``) in ``O(N * window)``.

    Patch queries see the prefix tokens, their ``rows x cols`` window (clipped at the border) and one
    virtual key standing for all non-neighbours (logit ``log n0``, value = their mean); prefix queries
    attend to every token (their mask row is all ones) through SDPA.

    Args:
        q, k: ``(B, h, N, qk_dim)``; v: ``(B, h, N, v_dim)``, ``N = num_prefix_tokens + H*W``.
        grid: ``(H, W)``; window: ``(rows, cols)`` odd sides.
        scale: logit scale (``qk_dim ** -0.5``).
        tables: :func:`window_tables` for this grid, window and prefix, on ``q``'s device and dtype.

    Returns:
        ``(B, h, N, v_dim)``, equal to the dense formula up to rounding.
    """
    p = num_prefix_tokens
    B, h, _, _ = q.shape
    rows, cols = grid
    q_grid = q[:, :, p:].reshape(B, h, rows, cols, -1)  # a view of the projection output: no copy to keep
    keys = _window_views(k[:, :, p:], grid, window)
    logits = [torch.stack([(q_grid * key).sum(-1) for key in keys], dim=-1) * scale + tables["outside"]]
    if p:  # one (H*W, d) @ (d, p) matmul per head
        prefix_logits = q[:, :, p:] @ k[:, :, :p].transpose(-2, -1)
        logits.insert(0, (prefix_logits * scale).view(B, h, rows, cols, p))
    n0 = tables["n0"]
    logits.append(n0.log().expand(B, h, rows, cols, 1))  # log(0) = -inf: no non-neighbours, no virtual key
    probs = torch.cat(logits, dim=-1).softmax(dim=-1)
    # Numerator: sum_j P_j v_j over prefix/window + (P_virtual / n0) (sum_all v - sum_prefix v - sum_window v)
    per_non_neighbour = probs[..., -1:] / n0.clamp(min=1)
    coeff = probs[..., :-1] - per_non_neighbour
    out = per_non_neighbour * v.sum(dim=2).view(B, h, 1, 1, -1)
    for cell, value in enumerate(_window_views(v[:, :, p:], grid, window)):
        out = out.addcmul_(coeff[..., p + cell:p + cell + 1], value)  # in place: autograd needs no old `out`
    out = out.reshape(B, h, rows * cols, -1)
    if not p:
        return out
    out = out + coeff[..., :p].reshape(B, h, rows * cols, p) @ v[:, :, :p]
    prefix_out = F.scaled_dot_product_attention(q[:, :, :p], k, v, scale=scale)
    return torch.cat([prefix_out, out], dim=2)


def gpsa_attention(q: Tensor, k: Tensor, v: Tensor, positional: Tensor, gate: Tensor, scale: float,
                   attn_mask: Tensor | None = None) -> Tensor:
    """ConViT GPSA (eq. 5-7) without the ``(B, h, N, N)`` content attention: ``(1 - g) SDPA(q, k, v) + g (P @ v)``.

    ConViT normalises ``(1 - g) A + g P`` by its row sums; both ``A = softmax(QK^T)`` and ``P = softmax(pos)``
    have rows summing to 1, so that sum is ``(1 - g) + g = 1`` and the renormalisation is the identity.

    Args:
        q, k: ``(B, h, N, qk_dim)``; v: ``(B, h, N, v_dim)``.
        positional: ``(h, N, N)`` positional attention ``softmax(pos_proj(r))``.
        gate: ``(h,)`` ``sigmoid(lambda)``.
        scale: logit scale.
        attn_mask: optional additive ``(h, N, N)`` float mask for the content logits (relative bias, -inf).

    Returns:
        ``(B, h, N, v_dim)``.
    """
    gate = gate.to(v.dtype).view(1, -1, 1, 1)
    content = F.scaled_dot_product_attention(
        q, k, v, attn_mask=None if attn_mask is None else attn_mask.to(q.dtype).unsqueeze(0), scale=scale)
    return (1.0 - gate) * content + gate * (positional.to(v.dtype) @ v)


def flex_masked_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, neighbours: Tensor,
                          nonneighbour_scale: Tensor, bias: Tensor | None = None) -> Tensor:
    """Hard / soft MaiT masks as a FlexAttention ``score_mod`` (eq. 2 and 4), no materialised ``N x N`` logits.

    ``score' = score + bias`` on every pair, then non-neighbours ``* nonneighbour_scale[h]`` (0 for a hard head,
    ``alpha`` for a soft head, 1 for a global head).  FlexAttention is fused on CUDA only under
    ``torch.compile``; in eager mode (and on CPU) it runs PyTorch's reference implementation.

    Args:
        q, k: ``(B, h, N, qk_dim)``; v: ``(B, h, N, v_dim)``.
        neighbours: bool ``(h, N, N)``.
        nonneighbour_scale: ``(h,)``.
        bias: optional additive ``(h, N, N)``.

    Returns:
        ``(B, h, N, v_dim)``.
    """
    from torch.nn.attention.flex_attention import flex_attention

    scale_h = nonneighbour_scale.to(q.dtype)

    def score_mod(score, b, h, q_idx, kv_idx):
        if bias is not None:
            score = score + bias[h, q_idx, kv_idx]
        return torch.where(neighbours[h, q_idx, kv_idx], score, score * scale_h[h])

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale)

