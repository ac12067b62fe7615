"""Fast attention kernels for the heads of :class:`~archspec.families.attention.module.Attention`.

Each function here is an exact rewrite of the dense reference formula of ``Attention._probs`` (selectable with
``attn_impl='dense'``) for one group of heads; a head kind's torch half lowers its heads to one
(:mod:`archspec.families.attention.kinds`):

* :func:`hard_window_attention` -- MaiT hard masks (eq. 2) in ``O(N * window)`` time (MaiT sec. 5.3 notes
  hard masks can make attention linear in the number of tokens).  Non-neighbours keep logit 0, so each
  weighs ``e^0 = 1``: their share of the numerator is ``sum_all(v) - sum_window(v)`` and of the
  denominator their count ``n0``.  We fold them into one *virtual key* per query with logit ``log(n0)``
  and value ``(sum_all(v) - sum_window(v)) / n0``; the softmax over ``[prefix, window, virtual]`` then
  subtracts the running max over every term, the non-neighbours' ``0`` included, as the dense softmax does.
  With autograd on it runs as an ``autograd.Function`` with a written-out backward that keeps only ``q, k, v``
  and one log-sum-exp per query (what SDPA keeps), so a masked model trains in no more memory than an
  unmasked one.  Under ``torch.compile`` it is traced as plain ops; Inductor fuses them, after which it beats
  SDPA on every grid, so the compiled plan takes it on small grids too (``Attention._compiled_plan``).
* :func:`hard_masked_attention` -- the same masks on explicit ``N x N`` logits, for small grids in eager mode
  (where the window path's ~30 small ops cost more than the ``N^2`` work); its backward recomputes the weights
  rather than keeping them.
* :func:`gpsa_attention` -- ConViT GPSA (eq. 5-7) as ``(1 - g) SDPA(q, k, v) + g (P @ v)``: both terms are
  convex combinations (rows of ``softmax`` sum to 1), so ConViT's renormalisation divides by 1.
* :func:`flex_masked_attention` -- hard/soft masks and additive biases as a FlexAttention ``score_mod``
  (fused on CUDA after ``torch.compile``; eager elsewhere, used for the equivalence tests).

Which path a layer takes is decided at construction (the kinds' path rules, e.g.
:func:`archspec.families.attention.kinds.mask.window_path_pays`), never from tensor values in ``forward``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import flex_attention

__all__ = ["window_tables", "hard_window_attention", "hard_masked_attention", "gpsa_attention", "flex_masked_attention",
           "is_compiling"]


def _dynamo_is_compiling() -> bool:  # torch 2.1 / 2.2, before torch.compiler.is_compiling existed
    from torch._dynamo import is_compiling  # noqa: PLC0415 - torch-version-specific API

    return is_compiling()


#: ``torch.compiler.is_compiling`` (torch >= 2.3): True while Dynamo traces, a constant inside the graph.
is_compiling = getattr(torch.compiler, "is_compiling", None) or _dynamo_is_compiling


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


def _window_logits(q: Tensor, k: Tensor, grid: tuple[int, int], window: tuple[int, int], p: int, scale: float,
                   tables: dict[str, Tensor]) -> Tensor:
    """Logits ``(B, h, H, W, p + rows*cols + 1)`` of each patch query over ``[prefix keys, window cells, virtual
    key]`` (``-inf`` for window cells past the border, ``log n0`` for the virtual key)."""
    B, h, _, _ = q.shape
    rows, cols = grid
    q_grid = q[:, :, p:].reshape(B, h, rows, cols, -1)  # a view of the projection output: no copy to keep
    keys = _window_views(k[:, :, p:], grid, window)
    logits = [torch.stack([(q_grid * key).sum(-1) for key in keys], dim=-1) * scale + tables["outside"]]
    if p:  # one (H*W, d) @ (d, p) matmul per head
        prefix_logits = q[:, :, p:] @ k[:, :, :p].transpose(-2, -1)
        logits.insert(0, (prefix_logits * scale).view(B, h, rows, cols, p))
    logits.append(tables["n0"].log().expand(B, h, rows, cols, 1))  # log(0) = -inf: no non-neighbours, no virtual key
    return torch.cat(logits, dim=-1)


def _patch_window_output(probs: Tensor, v: Tensor, grid: tuple[int, int], window: tuple[int, int], p: int,
                         n0: Tensor) -> Tensor:
    """Patch-query rows ``(B, h, H*W, v_dim)`` from the window weights ``probs`` (softmax of :func:`_window_logits`):
    ``sum_j P_j v_j`` over prefix/window ``+ (P_virtual / n0) (sum_all v - sum_prefix v - sum_window v)``."""
    B, h, rows, cols, _ = probs.shape
    per_non_neighbour = probs[..., -1:] / n0.clamp(min=1)
    coeff = probs[..., :-1] - per_non_neighbour
    out = per_non_neighbour * v.sum(dim=2).view(B, h, 1, 1, -1)
    for cell, value in enumerate(_window_views(v[:, :, p:], grid, window)):
        out = out.addcmul_(coeff[..., p + cell:p + cell + 1], value)
    out = out.reshape(B, h, rows * cols, -1)
    if p:
        out = out + coeff[..., :p].reshape(B, h, rows * cols, p) @ v[:, :, :p]
    return out


def _add_window_views_(target: Tensor, grid: tuple[int, int], window: tuple[int, int], terms) -> Tensor:
    """Adjoint of :func:`_window_views`: scatter-add ``terms`` (one ``(B, h, H, W, d)`` per window cell) into the
    zero-padded grid and crop it back: ``(B, h, H*W, d)``."""
    B, h, _, d = target.shape
    rows, cols = grid
    wr, wc = window
    padded = target.new_zeros(B, h, rows + wr - 1, cols + wc - 1, d)
    cells = [(i, j) for i in range(wr) for j in range(wc)]
    for (i, j), term in zip(cells, terms):
        padded[:, :, i:i + rows, j:j + cols].add_(term)
    return padded[:, :, wr // 2:wr // 2 + rows, wc // 2:wc // 2 + cols].reshape(B, h, rows * cols, d)


class _PatchWindowAttention(torch.autograd.Function):
    """:func:`hard_window_attention` with a hand-written backward that keeps only ``q, k, v`` (views of the qkv
    projection, which the unmasked path keeps too) and one log-sum-exp per patch query, as SDPA keeps: the
    window weights (``O(N * window)``) and the prefix rows' SDPA are recomputed in backward.  Autograd of the
    forward would keep the padded keys and values and per-cell temporaries (~1.5 N d per head more than
    SDPA keeps).  Derivation (per patch query, slots s = prefix keys, window cells, virtual key):
    ``out = sum_s P_s u_s`` with ``u_s = v_s`` and ``u_virtual`` = mean of the non-neighbours' values, so
    ``dP_s = <g, u_s>``, ``dlogit = P (dP - <g, out>)``; ``dq = scale sum_s dlogit_s k_s``,
    ``dk_s += scale dlogit_s q``; ``dv_t`` gets ``(P_t - P_virtual / n0) g`` from each query whose window holds t
    plus ``sum_i (P_virtual,i / n0_i) g_i`` for every token (the global value sum)."""

    @staticmethod
    def forward(ctx, q, k, v, grid, window, p, scale, outside, n0):
        tables = {"outside": outside, "n0": n0}
        logits = _window_logits(q, k, grid, window, p, scale, tables)
        lse = logits.logsumexp(dim=-1, keepdim=True)
        ctx.save_for_backward(q, k, v, lse)
        ctx.meta = (grid, window, p, scale, tables)  # constant tables: not activations
        out = _patch_window_output((logits - lse).exp_(), v, grid, window, p, n0)
        if not p:
            return out
        return torch.cat([F.scaled_dot_product_attention(q[:, :, :p], k, v, scale=scale), out], dim=2)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_all):
        q, k, v, lse = ctx.saved_tensors
        grid, window, p, scale, tables = ctx.meta
        grad = grad_all[:, :, p:]
        if p:  # prefix rows attend to every token: their SDPA is recomputed here rather than kept (p rows, cheap)
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in (q[:, :, :p], k, v)]
                prefix_out = F.scaled_dot_product_attention(*leaves, scale=scale)
                dq_prefix, dk, dv = torch.autograd.grad(prefix_out, leaves, grad_all[:, :, :p])
        else:
            dq_prefix, dk, dv = None, torch.zeros_like(k), torch.zeros_like(v)
        n0 = tables["n0"]
        probs = (_window_logits(q, k, grid, window, p, scale, tables) - lse).exp_()  # recomputed: O(N * window)
        B, h, _, _ = q.shape
        rows, cols = grid
        g = grad.reshape(B, h, rows, cols, -1)
        values = _window_views(v[:, :, p:], grid, window)
        d_slots = [torch.stack([(g * value).sum(-1) for value in values], dim=-1)]  # <g, v_cell>
        if p:
            d_slots.insert(0, (grad @ v[:, :, :p].transpose(-2, -1)).view(B, h, rows, cols, p))
        d_slots = torch.cat(d_slots, dim=-1)
        n0c = n0.clamp(min=1)
        g_all = (g * v.sum(dim=2).view(B, h, 1, 1, -1)).sum(-1, keepdim=True)  # <g, sum of all values>
        d_virtual = (g_all - d_slots.sum(-1, keepdim=True)) / n0c
        d_probs = torch.cat([d_slots, d_virtual], dim=-1)
        d_logits = probs * (d_probs - (probs * d_probs).sum(-1, keepdim=True))  # softmax backward
        d_logits = d_logits[..., :-1] * scale  # the virtual logit log(n0) is a constant
        q_grid = q[:, :, p:].reshape(B, h, rows, cols, -1)
        keys = _window_views(k[:, :, p:], grid, window)
        dq_grid = sum(d_logits[..., p + c:p + c + 1] * key for c, key in enumerate(keys))
        dk_patch = _add_window_views_(k[:, :, p:], grid, window,
                                      (d_logits[..., p + c:p + c + 1] * q_grid for c in range(len(keys))))
        per = probs[..., -1:] / n0c
        coeff = probs[..., :-1] - per
        dv_patch = _add_window_views_(v[:, :, p:], grid, window,
                                      (coeff[..., p + c:p + c + 1] * g for c in range(len(keys))))
        dv += (per * g).sum(dim=(2, 3)).unsqueeze(2)  # every token is in the global value sum
        dv[:, :, p:] += dv_patch
        dq = torch.empty_like(q)
        dq[:, :, p:] = dq_grid.reshape(B, h, rows * cols, -1)
        dk[:, :, p:] += dk_patch
        if p:
            dq[:, :, :p] = dq_prefix
            d_prefix = d_logits[..., :p].reshape(B, h, rows * cols, p)
            dq[:, :, p:] += d_prefix @ k[:, :, :p]
            dk[:, :, :p] += d_prefix.transpose(-2, -1) @ q[:, :, p:]
            dv[:, :, :p] += coeff[..., :p].reshape(B, h, rows * cols, p).transpose(-2, -1) @ grad
        return dq, dk, dv, None, None, None, None, None, None


def hard_window_attention(q: Tensor, k: Tensor, v: Tensor, grid: tuple[int, int], window: tuple[int, int],
                          num_prefix_tokens: int, scale: float, tables: dict[str, Tensor]) -> Tensor:
    """Exact MaiT hard-mask attention (eq. 2: ``softmax(M (.) QK^T * scale) V``) in ``O(N * window)``.

    Patch queries see the prefix tokens, their ``rows x cols`` window (clipped at the border) and one
    virtual key standing for all non-neighbours (logit ``log n0``, value = their mean); prefix queries
    attend to every token (their mask row is all ones) through SDPA.  With autograd on (outside
    ``torch.compile``, which derives and fuses its own backward) the patch rows run as an
    ``autograd.Function`` whose backward is written out, so a training step keeps only ``q, k, v`` and one
    log-sum-exp per patch query (not differentiable twice).

    Args:
        q, k: ``(B, h, N, qk_dim)``; v: ``(B, h, N, v_dim)``, ``N = num_prefix_tokens + H*W``.
        grid: ``(H, W)``; window: ``(rows, cols)`` odd sides.
        scale: logit scale (``qk_dim ** -0.5``).
        tables: :func:`window_tables` for this grid, window and prefix, on ``q``'s device and dtype.

    Returns:
        ``(B, h, N, v_dim)``, equal to the dense formula up to rounding.
    """
    p = num_prefix_tokens
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad and not is_compiling():
        return _PatchWindowAttention.apply(q, k, v, tuple(grid), tuple(window), p, scale, tables["outside"],
                                           tables["n0"])
    out = _patch_window_output(_window_logits(q, k, grid, window, p, scale, tables).softmax(dim=-1), v, grid, window,
                               p, tables["n0"])
    if not p:
        return out
    prefix_out = F.scaled_dot_product_attention(q[:, :, :p], k, v, scale=scale)
    return torch.cat([prefix_out, out], dim=2)


class _HardMaskedAttention(torch.autograd.Function):
    """``softmax(M (.) QK^T * scale) V`` with explicit ``(B, h, N, N)`` logits (MaiT eq. 2) that keeps only
    ``q, k, v`` for backward and recomputes the weights there, as SDPA keeps no ``N x N`` tensor: on small grids,
    where the window path's many small ops cost more than the ``N^2`` work, the dense formula is the faster one,
    but autograd of it would keep the ``N x N`` weights of every masked head."""

    @staticmethod
    def _weights(q, k, zero, scale):
        logits = (q @ k.transpose(-2, -1)) * scale
        return logits.masked_fill_(zero, 0.0).softmax(dim=-1)

    @staticmethod
    def forward(ctx, q, k, v, zero, scale):
        ctx.save_for_backward(q, k, v)
        ctx.meta = (zero, scale)
        return _HardMaskedAttention._weights(q, k, zero, scale) @ v

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        zero, scale = ctx.meta
        with torch.enable_grad():  # recompute the forward and let autograd run its fused softmax backward
            leaves = [t.detach().requires_grad_() for t in ctx.saved_tensors]
            out = _HardMaskedAttention._weights(leaves[0], leaves[1], zero, scale) @ leaves[2]
            return (*torch.autograd.grad(out, leaves, grad), None, None)


def hard_masked_attention(q: Tensor, k: Tensor, v: Tensor, zero: Tensor, scale: float) -> Tensor:
    """MaiT hard masks (eq. 2) on the explicit ``N x N`` logits: ``softmax(M (.) QK^T * scale) V``.

    Args:
        q, k: ``(B, h, N, qk_dim)``; v: ``(B, h, N, v_dim)``.
        zero: bool ``(h, N, N)``, True where the mask is 0 (the logit becomes 0, weight ``e^0``).
        scale: logit scale.

    Returns:
        ``(B, h, N, v_dim)``.  With autograd on (outside ``torch.compile``) only ``q, k, v`` are kept for backward.
    """
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad and not is_compiling():
        return _HardMaskedAttention.apply(q, k, v, zero, scale)
    return _HardMaskedAttention._weights(q, k, zero, scale) @ v


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

    scale_h = nonneighbour_scale.to(q.dtype)

    def score_mod(score, b, h, q_idx, kv_idx):
        if bias is not None:
            score = score + bias[h, q_idx, kv_idx]
        return torch.where(neighbours[h, q_idx, kv_idx], score, score * scale_h[h])

    return flex_attention(q, k, v, score_mod=score_mod, scale=scale)

