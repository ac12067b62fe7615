"""Swin's window attention and NAT/DiNAT's neighbourhood attention (archspec/families/attention/local_kernels.py,
local_rules.py) against independent references.

* Swin: timm 1.0's own ``SwinTransformerBlock`` (its ``_attn``: roll, pad, ``window_partition``, ``get_attn_mask``,
  ``WindowAttention`` with its ``relative_position_bias_table``, ``window_reverse``) with the same weights, and
  timm's ``_calc_window_shift`` for the clamping rule.
* NAT/DiNAT: a naive loop written here from the papers' definition (each query's ``k x k`` neighbours on the
  sub-grid of positions congruent to it mod the dilation, the window clamped inside the sub-grid; a bias read at
  the neighbour's offset), with a hand softmax.  It reuses nothing of the kernels or their index rules.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from timm.models.swin_transformer import SwinTransformerBlock, window_partition

from archspec.families.attention.local_kernels import (
    dense_local_attention,
    neighborhood_attention,
    neighborhood_indices,
    neighborhood_mask,
    relative_bias,
    swin_padded_kv,
    swin_window_mask,
    window_attention,
)
from archspec.families.attention.local_rules import (
    check_neighborhood,
    check_no_prefix_tokens,
    neighborhood_executed_pairs,
    neighborhood_pairs,
    resolve_window,
    window_attended_pairs,
    window_partition_pairs,
)

ATOL = 1e-5


def _qkv(grid, heads=2, dim=8, batch=2, seed=0, extra=0):
    gen = torch.Generator().manual_seed(seed)
    n = grid[0] * grid[1] + extra
    return [torch.randn(batch, heads, n, dim, generator=gen) for _ in range(3)]


def _grads(fn, tensors):
    """Output and gradients of ``sum(out * fixed weights)`` w.r.t. ``tensors``."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    weights = torch.linspace(-1, 1, out.numel()).view_as(out)
    return out.detach(), torch.autograd.grad((out * weights).sum(), leaves)


def _assert_close(a, b, atol=ATOL):
    assert a.shape == b.shape
    assert (a - b).abs().max().item() < atol, (a - b).abs().max().item()


# ------------------------------------------------------------------------------------------------ Swin vs timm
def _timm_block(dim, heads, grid, window, shift, seed=0):
    torch.manual_seed(seed)
    block = SwinTransformerBlock(dim=dim, input_resolution=grid, num_heads=heads, window_size=window,
                                 shift_size=shift).eval()
    with torch.no_grad():  # non-trivial bias table and qkv bias (the padding keys' k and v)
        block.attn.relative_position_bias_table.normal_(0, 0.5)
        block.attn.qkv.bias.normal_(0, 0.5)
    return block


def _ours_through_timm_weights(block, x, grid, window, shift):
    """timm's qkv projection, our window_attention (the requested window and shift), timm's output projection."""
    attn = block.attn
    B, heads = x.shape[0], attn.num_heads
    qkv = attn.qkv(x.reshape(B, -1, x.shape[-1])).reshape(B, -1, 3, heads, attn.qkv.out_features // 3 // heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    bias_k, bias_v = attn.qkv.bias.view(3, heads, 1, -1)[1:]
    out = window_attention(q, k, v, grid, window, shift,
                           bias_table=attn.relative_position_bias_table, pad_kv=(bias_k, bias_v))
    return attn.proj(out.transpose(1, 2).reshape(B, grid[0], grid[1], -1))


@pytest.mark.parametrize("grid,window,shift", [
    ((7, 7), 7, 0), ((7, 7), 3, 0), ((7, 7), 3, 1),        # one window; odd grid, windows not dividing it
    ((10, 9), 4, 0), ((10, 9), 4, 2),                        # padding on both axes, shifted
    ((8, 8), 4, 2), ((14, 14), 7, 3),                        # Swin's own case: grid a multiple, shift w // 2
    ((5, 11), 7, 3),                                         # rows clamped (timm: window 5, no shift), cols padded
])
def test_window_attention_equals_timm_block(grid, window, shift):
    """Outputs, and gradients of the input and of timm's bias table and qkv weights (bias = padding keys)."""
    block = _timm_block(dim=24, heads=3, grid=grid, window=window, shift=shift)
    x = torch.randn(2, grid[0], grid[1], 24, generator=torch.Generator().manual_seed(1))
    params = [block.attn.relative_position_bias_table, block.attn.qkv.weight, block.attn.qkv.bias]
    results = []
    for fn in (lambda x: _ours_through_timm_weights(block, x, grid, window, shift), block._attn):
        leaf = x.clone().requires_grad_()
        out = fn(leaf)
        results.append((out.detach(), torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(),
                                                          [leaf, *params])))
    (ours, ours_grads), (timm, timm_grads) = results
    _assert_close(ours, timm)
    for a, b in zip(ours_grads, timm_grads):  # parameter gradients sum over every window: relative to their size
        _assert_close(a / b.abs().max(), b / b.abs().max())


@pytest.mark.parametrize("grid,window,shift", [((5, 11), 7, 3), ((7, 7), 7, 3), ((6, 20), 8, 4), ((9, 9), 4, 2),
                                               ((3, 3), 5, 2)])
def test_resolve_window_is_timms_calc_window_shift(grid, window, shift):
    block = SwinTransformerBlock(dim=8, input_resolution=grid, num_heads=1, window_size=window, shift_size=shift)
    assert resolve_window(grid, window, shift) == (tuple(block.window_size), tuple(block.shift_size))


def test_window_pair_counts_match_timms_mask():
    """Attended pairs = real queries x keys with timm's mask 0, counted on timm's own partition of its mask."""
    grid, window, shift = (10, 9), 4, 2
    block = _timm_block(dim=8, heads=1, grid=grid, window=window, shift=shift)
    real = torch.zeros(1, 12, 12, 1)
    real[:, :grid[0], :grid[1]] = 1  # timm rolls first, then pads: the padding sits at the end
    real = window_partition(real, (window, window)).view(-1, window * window)
    timm_pairs = int(((block.attn_mask == 0) * real[:, :, None]).sum())
    allowed, _ = swin_window_mask(grid, window, shift)
    assert window_attended_pairs(grid, window, shift) == int(allowed.sum()) == timm_pairs
    assert window_partition_pairs(grid, window, shift) == 9 * 16 * 16  # 3 x 3 windows of 16 tokens, squared
    assert window_partition_pairs((56, 56), 7, 3) == 56 * 56 * 49  # Swin eq. 2: M^2 h w


# ------------------------------------------------------------------------------------------------ Swin vs dense
@pytest.mark.parametrize("grid,window,shift", [((7, 7), 3, 0), ((7, 7), 3, 1), ((10, 9), 4, 0), ((10, 9), 4, 2),
                                               ((9, 6), (4, 3), (2, 1))])
def test_window_attention_equals_dense_reference(grid, window, shift):
    heads, dim = 2, 8
    win, _ = resolve_window(grid, window, shift)
    gen = torch.Generator().manual_seed(2)
    table = torch.randn((2 * win[0] - 1) * (2 * win[1] - 1), heads, generator=gen)
    pad_k, pad_v = torch.randn(heads, 1, dim, generator=gen), torch.randn(heads, 1, dim, generator=gen)
    allowed, index = swin_window_mask(grid, window, shift)

    def fast(q, k, v, table, pad_k, pad_v):
        return window_attention(q, k, v, grid, window, shift, bias_table=table, pad_kv=(pad_k, pad_v))

    def dense(q, k, v, table, pad_k, pad_v):
        keys, values = swin_padded_kv(k, v, grid, window, shift, (pad_k, pad_v))
        return dense_local_attention(q, keys, values, allowed, relative_bias(table.t(), index))

    inputs = [*_qkv(grid, heads, dim), table, pad_k, pad_v]
    out_fast, grads_fast = _grads(fast, inputs)
    out_dense, grads_dense = _grads(dense, inputs)
    _assert_close(out_fast, out_dense)
    for a, b in zip(grads_fast, grads_dense):
        _assert_close(a, b)


def test_swin_window_mask_by_hand():
    """4x4 grid, window 2, shift 1: rolled row/col of token p is (p - 1) mod 4, so token 0 sits at rolled (3, 3),
    the bottom-right window, alone in its region on both axes (timm's slices: [0, 2), [2, 3), [3, 4))."""
    allowed, index = swin_window_mask((4, 4), 2, 1)
    assert allowed[0].nonzero().flatten().tolist() == [0]
    # token 5 = (1, 1) -> rolled (0, 0): window (0, 0) with rolled (0, 1), (1, 0), (1, 1) = tokens 6, 9, 10
    assert allowed[5].nonzero().flatten().tolist() == [5, 6, 9, 10]
    # token 15 = (3, 3) -> rolled (2, 2): window (1, 1) holds rolled (2..3, 2..3); rolled 3 is another region
    assert allowed[15].nonzero().flatten().tolist() == [15]
    # unshifted: token 5 = (1, 1) is the last place of window (0, 0): offsets (1 - 0, 1 - 0) to token 0
    allowed, index = swin_window_mask((4, 4), 2, 0)
    assert allowed[5].nonzero().flatten().tolist() == [0, 1, 4, 5]
    assert index[5, 0].item() == (1 + 1) * 3 + (1 + 1)  # timm: (dr + w - 1) * (2w - 1) + (dc + w - 1)


# ------------------------------------------------------------------------------------------------ NAT naive reference
def naive_axis(i: int, length: int, kernel: int, dilation: int) -> tuple[list[int], list[int]]:
    """Keys of position ``i`` on one axis and their places on the ``2k - 1`` bias axis, from the definition."""
    sub = list(range(i % dilation, length, dilation))  # the positions congruent to i mod dilation
    at = sub.index(i)
    start = min(max(at - kernel // 2, 0), len(sub) - kernel)  # centred, then moved inside the sub-grid
    return sub[start:start + kernel], [j - at + kernel - 1 for j in range(start, start + kernel)]


def _naive_na(q, k, v, grid, kernel, dilation, rpb, scale):
    """A loop over every (batch, head, query): logits over its neighbours, softmax by hand, weighted sum."""
    rows, cols = grid
    out = []
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(rows):
                keys_r, bias_r = naive_axis(i, rows, kernel, dilation)
                for j in range(cols):
                    keys_c, bias_c = naive_axis(j, cols, kernel, dilation)
                    keys = [r * cols + c for r in keys_r for c in keys_c]
                    logits = k[b, h, keys] @ q[b, h, i * cols + j] * scale
                    if rpb is not None:
                        logits = logits + rpb[h][torch.tensor(bias_r)[:, None], torch.tensor(bias_c)].flatten()
                    weights = (logits - logits.max()).exp()
                    out.append((weights / weights.sum()) @ v[b, h, keys])
    return torch.stack(out).view(q.shape[0], q.shape[1], rows * cols, -1)


NA_CASES = [((7, 7), 3, 1), ((7, 7), 3, 2), ((7, 7), 5, 1), ((7, 7), 7, 1), ((10, 9), 3, 3), ((10, 9), 5, 1),
            ((9, 10), 3, 2), ((11, 13), 5, 2), ((15, 14), 7, 2), ((22, 23), 7, 3)]


def test_naive_axis_by_hand():
    """Length 7, kernel 3, dilation 2: sub-grids [0, 2, 4, 6] and [1, 3, 5]; windows clamped inside them."""
    assert naive_axis(0, 7, 3, 2) == ([0, 2, 4], [2, 3, 4])
    assert naive_axis(6, 7, 3, 2) == ([2, 4, 6], [0, 1, 2])
    assert naive_axis(5, 7, 3, 2) == ([1, 3, 5], [0, 1, 2])
    assert naive_axis(3, 7, 3, 2) == ([1, 3, 5], [1, 2, 3])


@pytest.mark.parametrize("grid,kernel,dilation", NA_CASES)
def test_neighborhood_indices_are_the_definition(grid, kernel, dilation):
    keys, bias = neighborhood_indices(grid, kernel, dilation)
    width = 2 * kernel - 1
    for i in range(grid[0]):
        keys_r, bias_r = naive_axis(i, grid[0], kernel, dilation)
        for j in range(grid[1]):
            keys_c, bias_c = naive_axis(j, grid[1], kernel, dilation)
            t = i * grid[1] + j
            assert keys[t].tolist() == [r * grid[1] + c for r in keys_r for c in keys_c]
            assert bias[t].tolist() == [r * width + c for r in bias_r for c in bias_c]
    assert neighborhood_pairs(grid, kernel, dilation) == int(neighborhood_mask(grid, kernel, dilation)[0].sum())


def _na_inputs(grid, kernel, heads=2, dim=8, seed=3):
    """q, k, v and a bias table; a batch of 2 on small grids, 1 on large ones (the naive loop's time)."""
    gen = torch.Generator().manual_seed(seed)
    batch = 2 if grid[0] * grid[1] < 100 else 1
    return [*_qkv(grid, heads, dim, batch, seed), torch.randn(heads, 2 * kernel - 1, 2 * kernel - 1, generator=gen)]


@pytest.mark.parametrize("grid,kernel,dilation", NA_CASES)
def test_neighborhood_fast_and_dense_equal_naive(grid, kernel, dilation):
    inputs = _na_inputs(grid, kernel)
    scale = inputs[0].shape[-1] ** -0.5
    allowed, index = neighborhood_mask(grid, kernel, dilation)

    def fast(q, k, v, rpb):
        return neighborhood_attention(q, k, v, grid, kernel, dilation, rpb=rpb)

    def dense(q, k, v, rpb):
        return dense_local_attention(q, k, v, allowed, relative_bias(rpb.reshape(rpb.shape[0], -1), index))

    with torch.no_grad():
        naive = _naive_na(*[t.double() for t in inputs[:3]], grid, kernel, dilation, inputs[3].double(), scale)
        _assert_close(fast(*inputs), naive.float())
        _assert_close(dense(*inputs), naive.float())


@pytest.mark.parametrize("grid,kernel,dilation", [((7, 7), 3, 2), ((10, 9), 5, 1), ((9, 10), 3, 3),
                                                  ((11, 13), 5, 2), ((15, 14), 7, 2)])
def test_neighborhood_gradients_equal_naive_and_dense(grid, kernel, dilation):
    inputs = _na_inputs(grid, kernel, seed=4)
    scale = inputs[0].shape[-1] ** -0.5
    allowed, index = neighborhood_mask(grid, kernel, dilation)
    out_fast, grads_fast = _grads(lambda q, k, v, rpb: neighborhood_attention(q, k, v, grid, kernel, dilation,
                                                                              rpb=rpb), inputs)
    out_dense, grads_dense = _grads(lambda q, k, v, rpb: dense_local_attention(
        q, k, v, allowed, relative_bias(rpb.reshape(rpb.shape[0], -1), index)), inputs)
    out_naive, grads_naive = _grads(lambda q, k, v, rpb: _naive_na(q, k, v, grid, kernel, dilation, rpb, scale),
                                    [t.double() for t in inputs])
    for fast, dense, naive in zip((out_fast, *grads_fast), (out_dense, *grads_dense), (out_naive, *grads_naive)):
        _assert_close(fast, naive.float())
        _assert_close(dense, naive.float())


def test_neighborhood_without_bias_and_rectangular_kernel():
    grid, kernel, dilation = (9, 11), (3, 5), (2, 1)
    q, k, v = _qkv(grid)
    allowed, _ = neighborhood_mask(grid, kernel, dilation)
    _assert_close(neighborhood_attention(q, k, v, grid, kernel, dilation), dense_local_attention(q, k, v, allowed))
    # rows: kernel 3 on the 2 sub-grids of 5 and 4 rows; columns: kernel 5 undilated
    assert allowed.sum(1).unique().tolist() == [15]


# ------------------------------------------------------------------------------------------------ refusals
def test_prefix_tokens_are_refused():
    q, k, v = _qkv((4, 4), extra=1)
    with pytest.raises(ValueError, match="1 prefix"):
        neighborhood_attention(q, k, v, (4, 4), 3)
    with pytest.raises(ValueError, match="1 prefix"):
        window_attention(q, k, v, (4, 4), 2)
    with pytest.raises(ValueError, match="needs 16 tokens, got 15"):
        window_attention(*[t[:, :, :15] for t in (q, k, v)], (4, 4), 2)
    check_no_prefix_tokens("window", 0)
    with pytest.raises(ValueError, match="a neighborhood head attends the token grid only"):
        check_no_prefix_tokens("neighborhood", 2)


def test_bias_tables_of_another_shape_are_refused():
    q, k, v = _qkv((7, 7))  # 2 heads
    with pytest.raises(ValueError, match=r"rpb must have shape \(2, 5, 5\), got \(2, 7, 7\)"):
        neighborhood_attention(q, k, v, (7, 7), 3, 2, rpb=torch.zeros(2, 7, 7))
    with pytest.raises(ValueError, match=r"bias_table must have shape \(25, 2\), got \(2, 25\)"):
        window_attention(q, k, v, (7, 7), 3, 1, bias_table=torch.zeros(2, 25))  # timm's layout: (entries, heads)


@pytest.mark.parametrize("kernel,dilation,grid,message", [
    (4, 1, (8, 8), "kernel 4 must be odd"),
    (1, 1, (8, 8), "kernel 1 must be odd and >= 3"),
    (3, 0, (8, 8), "dilation 0 must be >= 1"),
    (3, 3, (8, 9), "kernel 3 x dilation 3 = 9 is beyond the grid's 8 rows"),
    (7, 1, (7, 6), "kernel 7 x dilation 1 = 7 is beyond the grid's 6 cols"),
])
def test_bad_neighborhoods_are_refused(kernel, dilation, grid, message):
    with pytest.raises(ValueError, match=message):
        check_neighborhood(grid, kernel, dilation)


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match=r"shift 7 must be in \[0, window\) = \[0, 7\)"):
        resolve_window((14, 14), 7, 7)
    with pytest.raises(ValueError, match="shift -1"):
        resolve_window((14, 14), 7, -1)
    with pytest.raises(ValueError, match="window 7x7 is larger than the 6x14 token grid"):
        resolve_window((6, 14), 7, 3, clamp=False)
    assert resolve_window((6, 14), 7, 3) == ((6, 7), (0, 3))  # timm clamps


def test_local_rules_import_no_torch():
    code = ("import sys; import archspec.families.attention.local_rules as r; "
            "assert r.neighborhood_pairs((56, 56), 7) == 56 * 56 * 49; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bench_quick_runs_and_paths_agree(bench_module, capsys):
    """bench/local_kernels.py --quick: every case runs, its dense and fast sides give the same output."""
    rows = bench_module("local_kernels").main(["--quick"])
    assert {row["case"] for row in rows} == {"na", "na_nobias", "dina8", "window"}
    assert all(row["max_abs_diff"] < ATOL for row in rows)


def _product_macs(fn) -> int:
    """MACs of the matrix products ``fn`` runs (torch's FlopCounterMode counts 2 FLOPs a MAC)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        fn()
    return counter.get_total_flops() // 2


@pytest.mark.parametrize("grid,kernel,dilation,tile", [((56, 56), 7, 1, 7), ((10, 9), 3, 2, 7), ((13, 11), 5, 2, 4),
                                                       ((22, 23), 7, 3, 7), ((9, 7), 3, 1, 2)])
def test_neighborhood_executed_pairs_are_what_the_kernel_multiplies(grid, kernel, dilation, tile):
    q, k, v = _qkv(grid, heads=2, dim=8, batch=1)
    macs = _product_macs(lambda: neighborhood_attention(q, k, v, grid, kernel, dilation, tile=tile))
    assert macs == neighborhood_executed_pairs(grid, kernel, dilation, tile) * 2 * 8 * 2  # QK^T + AV, 2 heads
    if (grid, tile) == ((56, 56), 7):  # 8 x 8 tiles of 49 queries, each against a 13 x 13 block (moved inside)
        assert neighborhood_executed_pairs(grid, kernel, dilation, tile) == (8 * 7 * 13) ** 2


@pytest.mark.parametrize("grid,window,shift", [((10, 9), 4, 2), ((56, 56), 7, 3), ((5, 11), 7, 3)])
def test_window_partition_pairs_are_what_the_kernel_multiplies(grid, window, shift):
    q, k, v = _qkv(grid, heads=2, dim=8, batch=1)
    macs = _product_macs(lambda: window_attention(q, k, v, grid, window, shift))
    assert macs == window_partition_pairs(grid, window, shift) * 2 * 8 * 2


def test_tables_first_built_on_the_meta_device_serve_a_real_forward():
    """The MAC counter runs whole models under ``torch.device("meta")`` (tests/macs_reference.py); the tiled
    kernel's cached tables first built there stay CPU tensors, so a later real forward on the same grid equals the
    dense reference (it raised "Cannot copy out of meta tensor" when a meta table was cached)."""
    grid, kernel = (30, 29), 7  # a grid no other test uses: its tables are first built under the meta device
    q, k, v = _qkv(grid)
    with torch.device("meta"):
        neighborhood_attention(q.to("meta"), k.to("meta"), v.to("meta"), grid, kernel, tile=7)
    allowed, _ = neighborhood_mask(grid, kernel)
    _assert_close(neighborhood_attention(q, k, v, grid, kernel, tile=7), dense_local_attention(q, k, v, allowed))
