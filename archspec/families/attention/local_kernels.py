"""Exact kernels of the local head kinds: Swin's (shifted) window attention and NAT/DiNAT's neighbourhood attention,
each with a dense masked reference over the whole grid.

Attention tensors are ``(B, heads, N, d)`` with ``N = H W`` tokens of a row-major ``(H, W)`` grid; neither kind
takes prefix (class) tokens (:func:`archspec.families.attention.local_rules.check_no_prefix_tokens`: Swin and NAT
have none and no paper says what one would see), so ``N`` must be ``H W``.  The index rules live in the torch-free
:mod:`archspec.families.attention.local_rules`; this module turns them into tensors and runs them.

* :func:`dense_local_attention` -- the reference both kinds share: SDPA over the whole grid with an additive float
  mask (the bias where a pair is allowed, ``-inf`` elsewhere), ``O(N^2)``.
* :func:`swin_window_mask`, :func:`window_attention` -- Swin W-MSA / SW-MSA (Liu et al. 2021, sec. 3.2) as timm
  1.0 computes it (``timm/models/swin_transformer.py``: ``SwinTransformerBlock._attn``, ``get_attn_mask``,
  ``window_partition``, ``window_reverse``, ``WindowAttention`` with ``get_relative_position_index``): roll, pad,
  partition, attention per window, reverse, crop, unroll.
* :func:`neighborhood_indices`, :func:`neighborhood_mask`, :func:`neighborhood_attention` -- NAT / DiNAT (Hassani
  et al. 2022; Hassani & Shi 2022) with NATTEN's window and bias rules, ``O(N k^2)`` by tiles (below).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache, wraps

import torch
import torch.nn.functional as F
from timm.layers.pos_embed_rel import gen_relative_log_coords
from torch import Tensor
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .local_rules import (
    NA_TILE,
    SWIN_MASK_VALUE,
    NeighborhoodAxis,
    SwinAxis,
    as_pair,
    check_neighborhood,
    check_no_prefix_tokens,
    na_bias_start,
    na_window_start,
    neighborhood_axis,
    padded_grid,
    residue_lengths,
    resolve_window,
    swin_axis,
)

__all__ = ["dense_local_attention", "relative_bias", "swin_window_mask", "swin_padded_kv", "swin_window_tables",
           "log_offsets",
           "window_attention", "neighborhood_indices", "neighborhood_mask", "neighborhood_starts",
           "neighborhood_window_mask", "neighborhood_attention"]


def _cached_tables(build):
    """``functools.lru_cache`` (64 entries) of a table builder whose tables are always plain tensors: built outside
    ``inference_mode`` (a table first built in an inference forward, ``archspec build``'s photo, is reused by a later
    training forward, and autograd cannot save an inference tensor for backward) and outside any fake-tensor mode (a
    table first built while ``torch.export`` traces would otherwise be a fake tensor, kept in the cache and refused
    as a constant of the exported program), and on the CPU unless the builder names a device (a table first built
    under ``with torch.device("meta")``, the MAC counter's model, would otherwise be a meta tensor, kept in the cache
    and refused by the next real forward: "Cannot copy out of meta tensor")."""

    @wraps(build)
    def plain_tensors(*args):
        if torch.compiler.is_dynamo_compiling():  # Dynamo traces the builder (its tables become graph constants)
            return build(*args)
        with torch.device("cpu"), torch.inference_mode(False), unset_fake_temporarily():
            return build(*args)

    return lru_cache(maxsize=64)(plain_tensors)


def _check_tokens(q: Tensor, grid: tuple[int, int], kind: str) -> None:
    """``q`` holds exactly the grid's tokens; more are prefix tokens, which the local kinds refuse."""
    n, n_grid = q.shape[-2], grid[0] * grid[1]
    if n > n_grid:
        check_no_prefix_tokens(kind, n - n_grid)
    if n != n_grid:
        raise ValueError(f"{kind} attention on a {grid[0]}x{grid[1]} grid needs {n_grid} tokens, got {n}")


def _check_table(table: Tensor | None, shape: tuple[int, ...], name: str) -> None:
    """A bias table of the shape its kind reads (the heads and the window or kernel of the call)."""
    if table is not None and tuple(table.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(table.shape)}")


def relative_bias(table: Tensor, index: Tensor) -> Tensor:
    """Per-head bias ``(heads, *index.shape)`` read from a flattened relative-position table.

    Args:
        table: ``(heads, T)``, ``T`` the table's entries (``(2 w_h - 1)(2 w_w - 1)`` or ``(2 k_h - 1)(2 k_w - 1)``).
        index: long, any shape, entries in ``[0, T)``.
    """
    return table[:, index]


def dense_local_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, bias: Tensor | None = None,
                          scale: float | None = None) -> Tensor:
    """``softmax(q k^T scale + bias, masked to allowed) v`` over explicit pairs: SDPA with an additive float mask.

    The reference path of both local kinds (and the dense masked SDPA the fast kernels are measured against).

    Args:
        q: ``(B, heads, N_q, d)``; k: ``(B, heads, N_k, d)``; v: ``(B, heads, N_k, d_v)``.
        allowed: bool ``(N_q, N_k)`` or ``(heads, N_q, N_k)``; every row needs a True.
        bias: float ``(N_q, N_k)`` or ``(heads, N_q, N_k)`` added to the logits (a relative-position bias), or None.
        scale: logit scale, default ``d ** -0.5``.

    Returns:
        ``(B, heads, N_q, d_v)``.
    """
    mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device) if bias is None else bias.to(q.dtype)
    mask = mask.masked_fill(~allowed, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


# ------------------------------------------------------------------------------------------------ Swin
def _swin_axes(grid: tuple[int, int], window, shift) -> tuple[SwinAxis, SwinAxis]:
    win, sh = resolve_window(grid, window, shift)
    return swin_axis(grid[0], win[0], sh[0]), swin_axis(grid[1], win[1], sh[1])


def _swin_tokens(rows: SwinAxis, cols: SwinAxis) -> tuple[Tensor, Tensor]:
    """Rolled (row, col) ``(2, N)`` of the queries (grid tokens, original order) and ``(2, N_k)`` of the keys (grid
    tokens, then the padding cells in the padded grid's row-major order)."""
    qr = torch.tensor(rows.position).repeat_interleave(cols.length)
    qc = torch.tensor(cols.position).repeat(rows.length)
    pr, pc = torch.meshgrid(torch.arange(rows.padded), torch.arange(cols.padded), indexing="ij")
    is_pad = ((pr >= rows.length) | (pc >= cols.length)).flatten()
    pad_cells = is_pad.nonzero().flatten()
    return torch.stack([qr, qc]), torch.stack([torch.cat([qr, pr.flatten()[pad_cells]]),
                                               torch.cat([qc, pc.flatten()[pad_cells]])])


def swin_window_mask(grid: Sequence[int], window: int | Sequence[int],
                     shift: int | Sequence[int]) -> tuple[Tensor, Tensor]:
    """Swin's (shifted) window attention over the whole grid: which keys each query attends and their bias index.

    The same attention as timm's partition (``SwinTransformerBlock._attn``): query ``i`` attends key ``j`` iff
    both fall in the same window of the rolled-then-padded grid and, when any shift is non-zero, in the same region
    of timm's ``img_mask`` (``get_attn_mask``, whose ``-100`` is treated as ``-inf``: ``exp(-100)`` is below fp32
    resolution unless a masked logit exceeds the largest allowed one by more than ~83).  When the grid is not a
    multiple of the window, timm pads it with zero tokens that stay keys (unmasked, ``k``/``v`` = the qkv bias):
    they are the keys after the ``N`` grid tokens (:func:`swin_padded_kv` appends them).  The window and shift are
    resolved as timm does (:func:`~archspec.families.attention.local_rules.resolve_window`, clamped to the grid).

    Args:
        grid: ``(H, W)``; window: ``w`` or ``(w_h, w_w)``; shift: ``s`` or ``(s_h, s_w)``, ``0 <= s < w``.

    Returns:
        ``allowed``: bool ``(N, N_k)``, ``N = H W``, ``N_k = H_p W_p`` (the padded grid's cells; ``= N`` without
        padding); ``index``: long ``(N, N_k)`` into the ``(2 w_h - 1)(2 w_w - 1)`` bias table, timm's
        ``relative_position_index`` of the pair's places in their window (valid for every pair).

    Raises:
        ValueError: as ``resolve_window``.
    """
    rows, cols = _swin_axes(as_pair(tuple(grid), "grid"), window, shift)
    (qr, qc), (kr, kc) = _swin_tokens(rows, cols)

    def same(axis: SwinAxis, q: Tensor, k: Tensor) -> Tensor:
        win, region = torch.tensor(axis.window), torch.tensor(axis.region)
        return (win[q][:, None] == win[k][None]) & (region[q][:, None] == region[k][None])

    def offset(axis: SwinAxis, q: Tensor, k: Tensor) -> Tensor:
        off = torch.tensor(axis.offset)
        return off[q][:, None] - off[k][None] + axis.size - 1

    allowed = same(rows, qr, kr) & same(cols, qc, kc)
    index = offset(rows, qr, kr) * (2 * cols.size - 1) + offset(cols, qc, kc)
    return allowed, index


def swin_padded_kv(k: Tensor, v: Tensor, grid: Sequence[int], window: int | Sequence[int],
                   shift: int | Sequence[int], pad_kv: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
    """``k``, ``v`` with timm's padding tokens appended, in the key order of :func:`swin_window_mask`.

    Args:
        k, v: ``(B, heads, N, d)``.
        pad_kv: the key and value of a padding token, each broadcastable to ``(B, heads, 1, d)`` (what the qkv
            projection makes of a zero input: its bias); None for zeros (no qkv bias).

    Returns:
        ``(B, heads, N_k, d)`` each.
    """
    rows, cols = _swin_axes(as_pair(tuple(grid), "grid"), window, shift)
    n_pad = rows.padded * cols.padded - rows.length * cols.length
    if not n_pad:
        return k, v
    pads = (None, None) if pad_kv is None else pad_kv
    return tuple(torch.cat([t, (torch.zeros_like(t[:, :, :1]) if p is None else p.to(t.dtype).expand_as(t[:, :, :1])
                                ).expand(-1, -1, n_pad, -1)], dim=2) for t, p in zip((k, v), pads))


#: swin_window_tables' tables by (grid, window, shift, device): a plain dict, not ``lru_cache``, so that
#: ``torch.compile`` reads a table built before it traced (the window kind builds them when a layer is built)
#: instead of tracing the Python that builds it
_SWIN_TABLES: dict[tuple, tuple[Tensor | None, Tensor]] = {}
_SWIN_TABLES_MAX = 256


def swin_window_tables(grid: tuple[int, int], window: tuple[int, int], shift: tuple[int, int],
                       device: torch.device) -> tuple[Tensor | None, Tensor]:
    """timm's per-window tables on ``device`` for an already resolved window and shift (kept per arguments, built
    once): the additive region mask ``(nW, A, A)`` (``-100`` across regions, None without shift: timm passes
    ``mask=None``) and ``relative_position_index`` flattened, ``(A A,)``, ``A = w_h w_w``."""
    key = (tuple(grid), tuple(window), tuple(shift), torch.device(device))
    if key not in _SWIN_TABLES:
        if len(_SWIN_TABLES) >= _SWIN_TABLES_MAX:
            _SWIN_TABLES.clear()
        if torch.compiler.is_dynamo_compiling():  # traced: the tables become graph constants
            return _build_swin_window_tables(*key)
        # built from index lists on the CPU whatever device context is active (meta), and as plain tensors
        # (_cached_tables says why: outside inference_mode and any fake-tensor mode)
        with torch.device("cpu"), torch.inference_mode(False), unset_fake_temporarily():
            _SWIN_TABLES[key] = _build_swin_window_tables(*key)
    return _SWIN_TABLES[key]


#: log_offsets' tables by (window, device), kept as the window tables are
_LOG_OFFSETS: dict[tuple, Tensor] = {}


def log_offsets(window: tuple[int, int], device: torch.device) -> Tensor:
    """The input of a window's MLP relative-position term, ``((2 w_h - 1)(2 w_w - 1), 2)``: each offset ``(dy, dx)``
    (query minus key, row-major from ``(1 - w_h, 1 - w_w)``, the rows of Swin's table) as ``sign(t) log(1 + |t|)``
    (timm ``gen_relative_log_coords(mode='cr')``, what ``RelPosMlp`` feeds its MLP); kept per window and device,
    built as :func:`swin_window_tables` builds its tables."""
    key = (tuple(window), torch.device(device))
    if key not in _LOG_OFFSETS:
        if len(_LOG_OFFSETS) >= _SWIN_TABLES_MAX:
            _LOG_OFFSETS.clear()
        if torch.compiler.is_dynamo_compiling():
            return gen_relative_log_coords(tuple(window), mode="cr").reshape(-1, 2).to(device)
        with torch.device("cpu"), torch.inference_mode(False), unset_fake_temporarily():
            _LOG_OFFSETS[key] = gen_relative_log_coords(tuple(window), mode="cr").reshape(-1, 2).to(device)
    return _LOG_OFFSETS[key]


def _build_swin_window_tables(grid: tuple[int, int], window: tuple[int, int], shift: tuple[int, int],
                              device: torch.device) -> tuple[Tensor | None, Tensor]:
    rows, cols = swin_axis(grid[0], window[0], shift[0]), swin_axis(grid[1], window[1], shift[1])
    region = torch.tensor(rows.region)[:, None] * 3 + torch.tensor(cols.region)[None]  # timm's cnt = 3 h + w
    windows = region.view(rows.padded // window[0], window[0], cols.padded // window[1], window[1])
    windows = windows.permute(0, 2, 1, 3).reshape(-1, window[0] * window[1])  # timm window_partition
    mask = None
    if any(shift):
        diff = windows[:, None, :] - windows[:, :, None]
        mask = torch.zeros(diff.shape).masked_fill(diff != 0, SWIN_MASK_VALUE).to(device)
    wr, wc = torch.meshgrid(torch.arange(window[0]), torch.arange(window[1]), indexing="ij")
    wr, wc = wr.flatten(), wc.flatten()
    index = (wr[:, None] - wr[None] + window[0] - 1) * (2 * window[1] - 1) + (wc[:, None] - wc[None] + window[1] - 1)
    return mask, index.flatten().to(device)


def _partition(t: Tensor, window: tuple[int, int]) -> Tensor:
    """``(B, h, H_p, W_p, d)`` -> ``(B, h, nW, A, d)``, windows row-major (timm ``window_partition``)."""
    B, h, hp, wp, d = t.shape
    t = t.view(B, h, hp // window[0], window[0], wp // window[1], window[1], d)
    return t.permute(0, 1, 2, 4, 3, 5, 6).reshape(B, h, -1, window[0] * window[1], d)


def _reverse(t: Tensor, window: tuple[int, int], padded: tuple[int, int]) -> Tensor:
    """Inverse of :func:`_partition` (timm ``window_reverse``), laid out ``(B, H_p, W_p, h, d)``: one copy, after
    which an output projection over ``(B, N, h d)`` reads the cropped, unrolled grid without another."""
    B, h, _, _, d = t.shape
    t = t.view(B, h, padded[0] // window[0], padded[1] // window[1], window[0], window[1], d)
    return t.permute(0, 2, 4, 3, 5, 1, 6).reshape(B, padded[0], padded[1], h, d)


def _whole_grid_attention(q: Tensor, k: Tensor, v: Tensor, bias_table: Tensor | None, index: Tensor,
                          scale: float | None) -> Tensor:
    """A window that is the whole grid (no partition, no padding, no shift): ``softmax(q k^T scale + B) v`` by SDPA
    with the bias as its float mask, as timm ``maxxvit.Attention2d`` (fused) computes CoAtNet's relative attention;
    ``(B, heads, N, d_v)``.  One big window is where SDPA pays on CPU (timm's choice there too); Swin's many small
    windows keep :func:`window_attention`'s explicit product."""
    bias = None
    if bias_table is not None:
        n = q.shape[2]
        bias = bias_table.to(q.dtype)[index].view(n, n, q.shape[1]).permute(2, 0, 1).unsqueeze(0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)


def window_attention(q: Tensor, k: Tensor, v: Tensor, grid: Sequence[int], window: int | Sequence[int],
                     shift: int | Sequence[int] = 0, bias_table: Tensor | None = None, scale: float | None = None,
                     pad_kv: tuple[Tensor, Tensor] | None = None, rolled: bool = False) -> Tensor:
    """Swin W-MSA (``shift`` 0) / SW-MSA by window partition, as timm 1.0's ``SwinTransformerBlock._attn`` and
    ``WindowAttention.forward`` compute it, on already projected ``q, k, v``.

    Steps (timm's order): roll the ``(H, W)`` grid by ``-shift`` (``torch.roll`` over the unpadded grid); pad it at
    the bottom/right to a multiple of the window (queries with 0, keys/values with ``pad_kv``, as timm pads the
    input of its qkv projection with zeros); partition into windows; per window ``softmax(q k^T scale + B + M) v``
    with ``B`` the ``relative_position_bias_table`` read through ``relative_position_index`` and ``M`` timm's
    ``-100`` region mask when any shift is non-zero, in timm's order (``q * scale``, ``@ k^T``, ``+ B``, ``+ M``,
    softmax, ``@ v``); reverse the partition, crop the padding, roll back by ``+shift``.  The roll reads q, k, v
    where they lie (strided views of the projection's output need no copy first), and the reverse writes the output
    laid out ``(B, N, heads, d_v)`` (returned as its ``(B, heads, N, d_v)`` view), so an output projection over
    ``(B, N, heads d_v)`` reads it without a copy.  Autograd keeps the windows' weights (``N w_h w_w`` per head).
    Window and shift are resolved as timm does (:func:`~archspec.families.attention.local_rules.resolve_window`:
    clamped to a smaller grid, shift 0 on an axis the window covers).

    Args:
        q, k: ``(B, heads, H W, d)``; v: ``(B, heads, H W, d_v)``.
        grid: ``(H, W)``; window: ``w`` or ``(w_h, w_w)``; shift: ``s`` or ``(s_h, s_w)``, ``0 <= s < w``.
        bias_table: timm's ``relative_position_bias_table`` ``((2 w_h - 1)(2 w_w - 1), heads)`` of the resolved
            window, or None.
        scale: logit scale, default ``d ** -0.5`` (timm's ``head_dim ** -0.5``).
        pad_kv: key and value of a padding token, each broadcastable to ``(B, heads, 1, d)`` (the qkv bias's k and
            v parts); None for zeros.
        rolled: q, k, v are already rolled by ``-shift`` (the caller rolled the tokens before projecting them, as
            timm rolls ``x``), and the output is returned in that rolled order, for the caller to roll back.

    Returns:
        ``(B, heads, H W, d_v)``, equal to :func:`dense_local_attention` on :func:`swin_window_mask` and
        :func:`swin_padded_kv` (up to rounding and timm's ``-100``).

    Raises:
        ValueError: prefix tokens (``N > H W``), a token count that is not ``H W``, a bias table of another shape,
        or as ``resolve_window``.
    """
    grid = as_pair(tuple(grid), "grid")
    _check_tokens(q, grid, "window")
    win, sh = resolve_window(grid, window, shift)
    padded = padded_grid(grid, win)
    mask, index = swin_window_tables(grid, win, sh, q.device)
    _check_table(bias_table, ((2 * win[0] - 1) * (2 * win[1] - 1), q.shape[1]), "bias_table")
    if win == grid and mask is None:  # one window, the grid (CoAtNet's full window): timm Attention2d's SDPA
        return _whole_grid_attention(q, k, v, bias_table, index, scale)
    pads = (None, None) if pad_kv is None else pad_kv
    roll = (0, 0) if rolled else sh
    q_w, k_w, v_w = [_partition(_rolled_padded(t, grid, padded, roll, pad), win)
                     for t, pad in zip((q, k, v), (None, *pads))]
    # timm's WindowAttention (its default, non-fused path) in its order.  On CPU it beats SDPA with a float mask
    # ~3x at 49-token windows (2.6-3.1 ms vs 8.9-10.3 ms for Swin-T's first stage: 3 heads, 64 windows, one thread).
    attn = (q_w * (q.shape[-1] ** -0.5 if scale is None else scale)) @ k_w.transpose(-2, -1)  # (B, h, nW, A, A)
    if bias_table is not None:  # (heads, 1, A, A), contiguous as timm's _get_rel_pos_bias makes it
        area, heads = win[0] * win[1], q.shape[1]
        attn = attn + bias_table.to(q.dtype)[index].view(area, area, heads).permute(2, 0, 1).contiguous().unsqueeze(1)
    if mask is not None:
        attn = attn + mask.to(q.dtype)  # (nW, A, A)
    out = _reverse(attn.softmax(dim=-1) @ v_w, win, padded)[:, :grid[0], :grid[1]]  # (B, H, W, h, d_v)
    if any(roll):
        out = torch.roll(out, shifts=roll, dims=(1, 2))
    return out.reshape(q.shape[0], grid[0] * grid[1], q.shape[1], -1).transpose(1, 2)


def _rolled_padded(t: Tensor, grid: tuple[int, int], padded: tuple[int, int], shift: tuple[int, int],
                   pad: Tensor | None) -> Tensor:
    """``(B, h, H W, d)`` -> ``(B, h, H_p, W_p, d)``: rolled by ``-shift``, then padded with ``pad`` (0 if None)."""
    B, h, _, d = t.shape
    t = t.reshape(B, h, grid[0], grid[1], d)
    if any(shift):
        t = torch.roll(t, shifts=(-shift[0], -shift[1]), dims=(2, 3))
    if padded == grid:
        return t
    out = F.pad(t, (0, 0, 0, padded[1] - grid[1], 0, padded[0] - grid[0]))
    if pad is not None:
        is_pad = torch.ones(padded, dtype=t.dtype, device=t.device)
        is_pad[:grid[0], :grid[1]] = 0
        out = out + is_pad[:, :, None] * pad.to(t.dtype).reshape(*pad.shape[:-2], 1, 1, d)
    return out


# ------------------------------------------------------------------------------------------------ NAT / DiNAT
def neighborhood_indices(grid: Sequence[int], kernel: int | Sequence[int],
                         dilation: int | Sequence[int] = 1) -> tuple[Tensor, Tensor]:
    """Every query's ``k_h k_w`` keys and their relative-position-bias entries (NATTEN's rules:
    :func:`~archspec.families.attention.local_rules.na_window_start`,
    :func:`~archspec.families.attention.local_rules.na_bias_start`).

    Args:
        grid: ``(H, W)``; kernel: odd ``k`` or ``(k_h, k_w)``; dilation: ``d`` or ``(d_h, d_w)``.

    Returns:
        ``keys``: long ``(N, k_h k_w)``, flat key index (row-major) of each query's window, kernel-row-major as
        NATTEN orders its attention weights; ``bias``: long ``(N, k_h k_w)`` into the flattened
        ``(2 k_h - 1, 2 k_w - 1)`` table (Hugging Face's ``rpb`` of one head, ``rpb[h].flatten()``).

    Raises:
        ValueError: as :func:`~archspec.families.attention.local_rules.check_neighborhood`.
    """
    grid = as_pair(tuple(grid), "grid")
    (kh, kw), (dh, dw) = check_neighborhood(grid, kernel, dilation)
    rows, cols = neighborhood_axis(grid[0], kh, dh), neighborhood_axis(grid[1], kw, dw)

    def pairs(axis_r: NeighborhoodAxis, axis_c: NeighborhoodAxis, width: int) -> tuple[Tensor, Tensor]:
        key_r, key_c = torch.tensor(axis_r.keys), torch.tensor(axis_c.keys)  # (H, k_h), (W, k_w)
        keys = key_r[:, None, :, None] * grid[1] + key_c[None, :, None, :]
        bias_r, bias_c = torch.tensor(axis_r.bias), torch.tensor(axis_c.bias)
        bias = bias_r[:, None, :, None] * width + bias_c[None, :, None, :]
        return keys.reshape(grid[0] * grid[1], -1), bias.reshape(grid[0] * grid[1], -1)

    return pairs(rows, cols, 2 * kw - 1)


def neighborhood_mask(grid: Sequence[int], kernel: int | Sequence[int],
                      dilation: int | Sequence[int] = 1) -> tuple[Tensor, Tensor]:
    """:func:`neighborhood_indices` over the whole grid, for :func:`dense_local_attention`.

    Returns:
        ``allowed``: bool ``(N, N)``; ``index``: long ``(N, N)`` into the flattened ``(2k_h-1)(2k_w-1)`` table
        (0 where not allowed).
    """
    keys, bias = neighborhood_indices(grid, kernel, dilation)
    n = keys.shape[0]
    allowed = torch.zeros(n, n, dtype=torch.bool).scatter_(1, keys, True)
    index = torch.zeros(n, n, dtype=torch.long).scatter_(1, keys, bias)
    return allowed, index


def neighborhood_starts(grid: Sequence[int], kernel: int | Sequence[int],
                        dilation: int | Sequence[int] = 1) -> Tensor:
    """Each patch's first key row and column (NATTEN's window start,
    :func:`~archspec.families.attention.local_rules.na_window_start`), long ``(H W, 2)``: the per-patch table
    :func:`neighborhood_window_mask` reads (``8 x 2 x H W`` bytes, where the ``(N, N)`` tables are ``N`` times more).

    Raises:
        ValueError: as :func:`~archspec.families.attention.local_rules.check_neighborhood`.
    """
    grid = as_pair(tuple(grid), "grid")
    (kh, kw), (dh, dw) = check_neighborhood(grid, kernel, dilation)
    rows = torch.tensor([na_window_start(r, grid[0], kh, dh) for r in range(grid[0])])
    cols = torch.tensor([na_window_start(c, grid[1], kw, dw) for c in range(grid[1])])
    return torch.stack([rows.repeat_interleave(grid[1]), cols.repeat(grid[0])], dim=1)


def neighborhood_window_mask(starts: Tensor, grid: Sequence[int], kernel: int | Sequence[int],
                             dilation: int | Sequence[int] = 1) -> tuple[Tensor, Tensor]:
    """:func:`neighborhood_mask` from the window starts (:func:`neighborhood_starts`) by tensor operations only, so
    that a model tracing it (``torch.export``, ONNX) makes no constant of it: key ``j`` is in query ``i``'s window on
    an axis when it lies ``0, d, .., (k - 1) d`` after the query's start; its bias position is the offset in
    sub-grid units, ``(j - i) / d + k - 1`` (NATTEN's ``get_pb_start`` plus the key's place in the window).

    Args:
        starts: long ``(H W, 2)``; grid ``(H, W)``; kernel, dilation as :func:`neighborhood_mask`.

    Returns:
        ``allowed`` bool ``(N, N)`` and ``index`` long ``(N, N)`` into the flattened ``(2k_h-1)(2k_w-1)`` table (0
        where not allowed), equal to :func:`neighborhood_mask`'s.
    """
    (rows, cols), (kh, kw), (dh, dw) = (as_pair(tuple(grid), "grid"), as_pair(kernel, "kernel"),
                                        as_pair(dilation, "dilation"))
    token = torch.arange(rows * cols, device=starts.device)

    def axis(position: Tensor, start: Tensor, k: int, d: int) -> tuple[Tensor, Tensor]:
        offset = position[None, :] - start[:, None]
        inside = (offset >= 0) & (offset < k * d) & (offset % d == 0)
        return inside, torch.div(position[None, :] - position[:, None], d, rounding_mode="floor") + k - 1

    row_in, row_bias = axis(token // cols, starts[:, 0], kh, dh)
    col_in, col_bias = axis(token % cols, starts[:, 1], kw, dw)
    allowed = row_in & col_in
    return allowed, (row_bias * (2 * kw - 1) + col_bias).masked_fill(~allowed, 0)


@_cached_tables
def _tile_axis(length: int, kernel: int, tile: int) -> tuple[Tensor, Tensor, Tensor]:
    """One axis of the tiled undilated kernel: query tiles of ``tile`` positions (the last padded; padding
    queries copy the last position's window), each reading a block of ``kb = min(tile + kernel - 1, length)``
    consecutive keys that holds every window of the tile (windows start no earlier than the tile's first one and
    move by at most one position per query).

    Returns:
        ``block``: long ``(n_tiles, kb)``, the key positions of each tile's block; ``outside``: float
        ``(n_tiles, tile, kb)``, 0 where query ``a`` of tile ``t`` attends block key ``c``, ``-inf`` elsewhere;
        ``bias``: float ``(n_tiles * tile * kb, 2 kernel - 1)``, one-hot rows selecting that pair's place on the
        bias axis (all zero where not attended), so a bias table reads as an exact matrix product.
    """
    n_tiles, kb = -(-length // tile), min(tile + kernel - 1, length)
    query = [min(r, length - 1) for r in range(n_tiles * tile)]
    start = torch.tensor([na_window_start(r, length, kernel, 1) for r in query]).view(n_tiles, tile, 1)
    bias0 = torch.tensor([na_bias_start(r, length, kernel, 1) for r in query]).view(n_tiles, tile, 1)
    block = torch.tensor([min(na_window_start(t * tile, length, kernel, 1), length - kb)
                          for t in range(n_tiles)])[:, None] + torch.arange(kb)
    key = block[:, None, :]
    ok = (key >= start) & (key < start + kernel)
    place = torch.where(ok, bias0 + key - start, 2 * kernel - 1)  # 2k - 1: a column dropped below
    bias = F.one_hot(place.flatten(), 2 * kernel)[:, :-1].float()
    return block, torch.zeros(ok.shape).masked_fill(~ok, float("-inf")), bias


@_cached_tables
def _tile_outside(grid: tuple[int, int], kernel: tuple[int, int], tile: tuple[int, int], device: torch.device,
                  dtype: torch.dtype) -> Tensor:
    """The additive window mask of every tile, ``(n_h, n_w, T_h T_w, kb_h kb_w)``: 0 inside a query's window,
    ``-inf`` outside (kept per device and dtype: a few MB at 56x56, not copied on every call)."""
    _, out_r, _ = _tile_axis(grid[0], kernel[0], tile[0])
    _, out_c, _ = _tile_axis(grid[1], kernel[1], tile[1])
    outside = out_r[:, None, :, None, :, None] + out_c[None, :, None, :, None, :]
    return outside.reshape(out_r.shape[0], out_c.shape[0], tile[0] * tile[1], -1).to(device, dtype)


def _tile_bias(rpb: Tensor, grid: tuple[int, int], kernel: tuple[int, int], tile: tuple[int, int]) -> Tensor:
    """The bias of every (query, block key) pair of every tile, ``(heads, 1, n_h, n_w, T_h T_w, kb_h kb_w)``:
    ``onehot_rows @ rpb[h] @ onehot_cols^T`` (each product sums one non-zero term: exact), whose backward is two
    matrix products rather than a scatter-add into the table."""
    block_r, _, onehot_r = _tile_axis(grid[0], kernel[0], tile[0])
    block_c, _, onehot_c = _tile_axis(grid[1], kernel[1], tile[1])
    (nr, kbr), (nc, kbc) = block_r.shape, block_c.shape
    bias = onehot_r.to(rpb) @ rpb @ onehot_c.to(rpb).t()  # (heads, n_h T_h kb_h, n_w T_w kb_w)
    bias = bias.view(-1, nr, tile[0], kbr, nc, tile[1], kbc).permute(0, 1, 4, 2, 5, 3, 6)
    return bias.reshape(-1, 1, nr, nc, tile[0] * tile[1], kbr * kbc)


def _tiled_na(q: Tensor, k: Tensor, v: Tensor, kernel: tuple[int, int], rpb: Tensor | None, scale: float,
              tile: int) -> Tensor:
    """Undilated neighbourhood attention of ``(B, h, S, H, W, d)`` (``S`` independent grids of one shape) by
    tiles: each ``T x T`` tile of queries attends the ``kb_h x kb_w`` block of keys holding all its windows, one
    batched ``(T^2, kb^2)`` logit matrix per tile with the windows as an additive mask (``-inf`` outside) plus the
    bias."""
    B, h, S, rows, cols, d = q.shape
    grid, tile = (rows, cols), (min(tile, rows), min(tile, cols))
    block_r, _, _ = _tile_axis(rows, kernel[0], tile[0])
    block_c, _, _ = _tile_axis(cols, kernel[1], tile[1])
    (nr, kbr), (nc, kbc) = block_r.shape, block_c.shape
    mask = _tile_outside(grid, kernel, tile, q.device, q.dtype)
    if rpb is not None:
        mask = mask + _tile_bias(rpb.to(q.dtype), grid, kernel, tile)
    qt = F.pad(q, (0, 0, 0, nc * tile[1] - cols, 0, nr * tile[0] - rows))
    qt = qt.view(B, h, S, nr, tile[0], nc, tile[1], d).permute(0, 1, 2, 3, 5, 4, 6, 7)
    qt = qt.reshape(B, h, S, nr, nc, tile[0] * tile[1], d)
    rows_idx, cols_idx = block_r.flatten().to(q.device), block_c.flatten().to(q.device)

    def blocks(t: Tensor) -> Tensor:  # (B, h, S, nr, nc, kb_h kb_w, d); index_select's backward is index_add
        t = t.index_select(3, rows_idx).index_select(4, cols_idx).view(B, h, S, nr, kbr, nc, kbc, -1)
        return t.permute(0, 1, 2, 3, 5, 4, 6, 7).reshape(B, h, S, nr, nc, kbr * kbc, -1)

    logits = torch.matmul(qt, blocks(k).transpose(-2, -1)).mul_(scale) + mask
    out = logits.softmax(dim=-1) @ blocks(v)
    out = out.view(B, h, S, nr, nc, tile[0], tile[1], -1).permute(0, 1, 2, 3, 5, 4, 6, 7)
    return out.reshape(B, h, S, nr * tile[0], nc * tile[1], -1)[:, :, :, :rows, :cols]


def _residue_groups(length: int, dilation: int) -> list[tuple[int, int, int]]:
    """Residues mod ``dilation`` grouped by their sub-axis length: ``(first residue, last + 1, length)``."""
    groups, first = [], 0
    for count, sub in residue_lengths(length, dilation):
        groups.append((first, first + count, sub))
        first += count
    return groups


def neighborhood_attention(q: Tensor, k: Tensor, v: Tensor, grid: Sequence[int], kernel: int | Sequence[int],
                           dilation: int | Sequence[int] = 1, rpb: Tensor | None = None,
                           scale: float | None = None, tile: int = NA_TILE) -> Tensor:
    """NAT / DiNAT neighbourhood attention, exact, in ``O(N k^2)`` (times a tile overhead), forward and backward.

    Query ``(i, j)`` attends the ``k_h x k_w`` keys NATTEN assigns it (window start and bias rules of
    ``natten_cpu_commons.h``: a window centred on the query, clamped inside the grid, on the sub-grid of positions
    congruent to the query mod the dilation): ``softmax(q k^T scale + rpb) v`` over those keys, as Hugging Face's
    ``NeighborhoodAttention.forward`` computes it (``natten2dqkrpb`` then ``natten2dav``, ``rpb`` of shape
    ``(heads, 2k-1, 2k-1)``).  Prefix tokens are refused: NAT/DiNAT have none.

    How: with dilation ``d`` the grid splits into the ``d_h d_w`` sub-grids of positions congruent mod ``d``, on each
    of which NATTEN's rule is the undilated one (its ``get_window_start`` works in sub-grid units, and its
    ``get_pb_start`` equals the sub-grid offset), so sub-grids of equal shape run as one batch of undilated
    problems.  An undilated problem runs by tiles of ``tile x tile`` queries: a tile's
    windows all lie in one ``(T + k - 1)^2`` block of keys (fewer at the borders), gathered once per tile, and the
    tile attends it as one small dense matrix product with the windows as a ``-inf`` mask.  That computes
    ``(T + k - 1)^2 / k^2`` times the pairs needed (3.4x at ``T = k = 7``) but as batched matrix products, which
    beat a per-query gather of ``k^2`` keys on CPU.  The blocks are gathered by ``index_select`` on rows then
    columns and the bias read as ``onehot_rows @ rpb @ onehot_cols^T`` (exact: one non-zero term per sum), so
    autograd's backward is ``index_add`` and matrix products, not a scatter-add into the table; it keeps the tiles'
    weights, ``O(N (T + k - 1)^2)`` per head, not ``O(N^2)``.

    Args:
        q, k: ``(B, heads, H W, d)``; v: ``(B, heads, H W, d_v)``.
        grid: ``(H, W)``; kernel: odd ``k >= 3`` or ``(k_h, k_w)``; dilation: ``d`` or ``(d_h, d_w)``,
            ``k d <= side``.
        rpb: relative position bias ``(heads, 2 k_h - 1, 2 k_w - 1)`` (Hugging Face's ``rpb``), or None.
        scale: logit scale, default ``d ** -0.5`` (Hugging Face divides the query by ``sqrt(head_dim)``).
        tile: query tile side (default :data:`~archspec.families.attention.local_rules.NA_TILE`); the pairs it
            multiplies are :func:`~archspec.families.attention.local_rules.neighborhood_executed_pairs`.

    Returns:
        ``(B, heads, H W, d_v)``, equal to :func:`dense_local_attention` on :func:`neighborhood_mask` up to
        rounding.

    Raises:
        ValueError: prefix tokens, a token count that is not ``H W``, an ``rpb`` of another shape, or as
        :func:`~archspec.families.attention.local_rules.check_neighborhood`.
    """
    grid = as_pair(tuple(grid), "grid")
    _check_tokens(q, grid, "neighborhood")
    kern, (dh, dw) = check_neighborhood(grid, kernel, dilation)
    B, h, _, _ = q.shape
    _check_table(rpb, (h, 2 * kern[0] - 1, 2 * kern[1] - 1), "rpb")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if (dh, dw) == (1, 1):
        qkv = [t.reshape(B, h, 1, grid[0], grid[1], t.shape[-1]) for t in (q, k, v)]
        return _tiled_na(*qkv, kern, rpb, scale, tile).reshape(B, h, grid[0] * grid[1], -1)
    sub = (-(-grid[0] // dh), -(-grid[1] // dw))
    subgrids = [_subgrids(t, grid, (dh, dw), sub) for t in (q, k, v)]  # (B, h, d_h, d_w, H/d_h, W/d_w, d)
    out = q.new_zeros(B, h, dh, dw, sub[0], sub[1], v.shape[-1])
    for r0, r1, rows in _residue_groups(grid[0], dh):
        for c0, c1, cols in _residue_groups(grid[1], dw):
            group = [t[:, :, r0:r1, c0:c1, :rows, :cols].reshape(B, h, -1, rows, cols, t.shape[-1])
                     for t in subgrids]
            out[:, :, r0:r1, c0:c1, :rows, :cols] = _tiled_na(*group, kern, rpb, scale, tile).view(
                B, h, r1 - r0, c1 - c0, rows, cols, -1)
    out = out.permute(0, 1, 4, 2, 5, 3, 6).reshape(B, h, sub[0] * dh, sub[1] * dw, -1)
    return out[:, :, :grid[0], :grid[1]].reshape(B, h, grid[0] * grid[1], -1)


def _subgrids(t: Tensor, grid: tuple[int, int], dilation: tuple[int, int], sub: tuple[int, int]) -> Tensor:
    """``(B, h, H W, d)`` -> ``(B, h, d_h, d_w, ceil(H/d_h), ceil(W/d_w), d)``: sub-grid ``(a, b)`` holds the
    positions ``= (a, b)`` mod the dilation (zero-padded at the end where the sub-grid is shorter)."""
    B, h, _, d = t.shape
    t = F.pad(t.reshape(B, h, grid[0], grid[1], d),
              (0, 0, 0, sub[1] * dilation[1] - grid[1], 0, sub[0] * dilation[0] - grid[0]))
    return t.view(B, h, sub[0], dilation[0], sub[1], dilation[1], d).permute(0, 1, 3, 5, 2, 4, 6)
