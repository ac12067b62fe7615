"""Every fast attention path equals the dense reference formula (``attn_impl='dense'``), forward and gradients.

Independent reference: ``Attention._probs`` materialises ``softmax(M (.) (QK^T s + B))`` (MaiT eq. 2/4, LeViT eq. 1,
CMHSA eq. 4) and ConViT's renormalised GPSA mixture (eq. 5-7) -- the formula as the papers write it.
"""

from __future__ import annotations

import copy

import pytest
import torch

from archspec.families.attention.kernels import hard_window_attention, window_tables
from archspec.families.attention.kinds.mask import window_path_pays
from archspec.families.attention.mask_terms import window_mask
from archspec.nn.blocks import Attention, attention_impl, set_attention_impl

BIASED_MASK = {"mask": {"window": [3, 3]}, "rel_bias": {"table": "absolute"}}
GPSA_MASK = {"gpsa": {"conv_init": False}, "mask": {}}
GAUSS_BIAS = {"gauss_mask": {"sigma_init": 2.0}, "rel_bias": {"table": "signed"}}
GAUSS_SOFT = {"gauss_mask": {}, "mask": {"mode": "soft"}}
GAUSS_GPSA = {"gpsa": {"conv_init": False}, "gauss_mask": {}}

# (heads, grid, prefix counts): odd grids, windows larger than / touching the border, non-contiguous head groups
CASES = [
    (["mask", "mask", "mhsa"], (5, 7), (0, 1, 2)),                     # MaiT Sch.2, layers 0-7
    (["mask:3x5", "mask:3x5"], (4, 6), (0, 1)),                         # all hard, 3x5 windows
    (["mask:5x5", "mhsa", "mask", "levit_bias"], (3, 2), (0, 2)),       # window wider than the grid
    (["mhsa", "mask", "signed_bias", "mask:3x5"], (5, 3), (1,)),        # groups interleaved in head order
    (["soft_mask", "strict_mask", BIASED_MASK, "mhsa"], (4, 5), (0, 1)),
    (["gpsa"] * 4, (5, 5), (0,)),                                       # ConViT layer
    (["gpsa", "mask", GPSA_MASK, "soft_mask"], (3, 5), (0,)),           # GPSA among masked heads
    (["mask"], (1, 1), (0, 1)),                                         # one patch: no non-neighbours
    (["gauss_mask", "mask", GAUSS_BIAS, GAUSS_SOFT], (4, 5), (0, 1)),  # GMM-Mask heads composed with the others
    ([GAUSS_GPSA, "gauss_mask", "mhsa", "gauss_mask"], (3, 3), (0,)),   # GPSA over a Gaussian-biased content
]
PARAMS = [(heads, grid, p) for heads, grid, prefixes in CASES for p in prefixes]


def _layer(heads, grid, prefix, seed=0) -> Attention:
    torch.manual_seed(seed)
    layer = Attention(32, heads, grid, num_prefix_tokens=prefix, qk_dim=8, v_dim=8)
    with torch.no_grad():  # non-trivial biases, gates and soft alphas
        for param in layer.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    return layer


def _run(layer: Attention, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.clone().requires_grad_()
    out = layer(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    grads = [x.grad] + [p.grad for p in layer.parameters() if p.requires_grad]
    layer.zero_grad(set_to_none=True)
    return out.detach(), grads


@pytest.mark.parametrize("impl", ["fast", "auto"])
@pytest.mark.parametrize("heads,grid,prefix", PARAMS)
def test_fast_paths_equal_dense(one_thread, heads, grid, prefix, impl):
    layer = _layer(heads, grid, prefix)
    x = torch.randn(2, prefix + grid[0] * grid[1], 32)
    for mode in (True, False):  # training (no caches) and eval (cached constants)
        layer.train(mode)
        out_ref, grads_ref = _run(layer.set_attn_impl("dense"), x)
        out, grads = _run(layer.set_attn_impl(impl), x)
        torch.testing.assert_close(out, out_ref, atol=1e-5, rtol=1e-5)
        # eval mode caches the constant bias / positional tables detached: compare input gradients only there
        for got, want in zip(grads if mode else grads[:1], grads_ref if mode else grads_ref[:1]):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_fast_mode_takes_the_window_path_for_every_plain_hard_head():
    layer = Attention(32, ["mhsa", "mask", "signed_bias", "mask:3x5", BIASED_MASK, "gpsa"], (5, 3), qk_dim=8, v_dim=8)
    layer.set_attn_impl("fast")
    keys = {key: heads for key, heads in layer._groups}
    assert keys == {("sdpa",): [0, 2], ("window", (3, 3)): [1], ("window", (3, 5)): [3], ("dense",): [4],
                    ("gpsa",): [5]}


@pytest.mark.parametrize("grid,window", [((5, 7), (3, 3)), ((4, 4), (5, 5)), ((2, 9), (3, 5))])
def test_window_kernel_float64_exact_with_large_logits(grid, window):
    """Large logits stress the max subtraction: the non-neighbours' logit 0 must enter the running max."""
    torch.manual_seed(1)
    p = 1
    n = p + grid[0] * grid[1]
    q, k, v = (torch.randn(2, 3, n, 8, dtype=torch.float64) * s for s in (30.0, 30.0, 1.0))
    mask = window_mask(grid, window, p).double()
    dense = torch.softmax((q @ k.transpose(-2, -1)) * 0.3 * mask, dim=-1) @ v
    tables = {name: t.double() for name, t in window_tables(grid, window, p).items()}
    got = hard_window_attention(q, k, v, grid, window, p, 0.3, tables)
    torch.testing.assert_close(got, dense, atol=1e-12, rtol=1e-12)


def test_window_tables_count_non_neighbours_by_hand():
    # 3x3 window on a 2x4 grid, query (0, 0): neighbours (0,0),(0,1),(1,0),(1,1) -> 4 of 8 patches are not.
    tables = window_tables((2, 4), (3, 3), num_prefix_tokens=1)
    assert tables["n0"][0, 0, 0].item() == 4 and tables["n0"][0, 1, 0].item() == 2
    assert torch.isinf(tables["outside"][0, 0, :3]).all() and (tables["outside"][1, 1] == 0).sum() == 6


def test_auto_plan_follows_the_grid_crossover():
    small = Attention(192, ["mask", "mask", "mhsa"], (14, 14), num_prefix_tokens=1)
    large = Attention(192, ["mask", "mask", "mhsa"], (32, 32), num_prefix_tokens=1)
    assert not window_path_pays(196, (3, 3)) and window_path_pays(1024, (3, 3))
    assert [key for key, _ in small._groups] == [("hard",), ("sdpa",)]
    assert [key for key, _ in large._groups] == [("window", (3, 3)), ("sdpa",)]  # global head stays on SDPA


def test_gpsa_mixture_rows_sum_to_one_so_renormalisation_is_identity():
    """ConViT eq. 7 divides (1 - g) A + g P by its row sums; both A and P are softmaxes, so the sums are 1."""
    layer = _layer(["gpsa"] * 4, (4, 5), 0).eval()
    x = torch.randn(2, 20, 32)
    q, k, _ = layer._qkv(x)
    content = torch.softmax(q @ k.transpose(-2, -1) * layer.scale, dim=-1)
    gate = layer.gating().view(1, -1, 1, 1)
    mixed = (1 - gate) * content + gate * layer.positional_attention()
    torch.testing.assert_close(mixed.sum(-1), torch.ones(2, 4, 20), atol=1e-6, rtol=0)
    torch.testing.assert_close(mixed, layer.get_attention(x), atol=1e-6, rtol=0)


def test_positional_cache_dropped_on_train_and_load():
    layer = _layer(["gpsa"] * 4, (3, 3), 0).eval()
    x = torch.randn(1, 9, 32)
    before = layer(x)
    assert layer._term_cache.get("gpsa.positional") is not None
    other = _layer(["gpsa"] * 4, (3, 3), 0, seed=5)
    layer.load_state_dict(other.state_dict())
    torch.testing.assert_close(layer(x), other.eval()(x))
    assert not torch.allclose(before, layer(x))
    layer.train()
    assert layer._term_cache.get("gpsa.positional") is None


@pytest.mark.slow
def test_flex_attention_equals_dense_forward():
    """FlexAttention ``score_mod`` for hard / soft / biased-hard heads (eager reference on CPU, forward only:
    PyTorch has no FlexAttention backward on CPU)."""
    layer = _layer(["mask", "soft_mask", BIASED_MASK, "mhsa"], (4, 5), 1).eval()
    x = torch.randn(2, 21, 32)
    with torch.no_grad(), pytest.warns(UserWarning, match="torch.compile"):
        want = layer.set_attn_impl("dense")(x)
        got = layer.set_attn_impl("flex")(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_attention_impl_context_restores_and_rejects_unknown_names():
    model = torch.nn.Sequential(Attention(16, ["mask"], (3, 3)), Attention(16, ["mhsa"], (3, 3)))
    model[1].set_attn_impl("fast")
    with attention_impl(model, "dense"):
        assert [m.attn_impl for m in model] == ["dense", "dense"]
    assert [m.attn_impl for m in model] == ["auto", "fast"]
    with pytest.raises(ValueError, match="attn_impl"):
        set_attention_impl(model, "fastest")


def test_rebuilding_grid_tables_keeps_the_layer_exact():
    """``_build_grid_tables`` is the hook a resolution change uses: rebuilt buffers give the same output."""
    layer = _layer(["mask", "mhsa"], (5, 7), 1).eval().set_attn_impl("fast")
    x = torch.randn(1, 36, 32)
    want = layer(x)
    clone = copy.deepcopy(layer)
    clone._build_grid_tables((5, 7))
    torch.testing.assert_close(clone(x), want)


def test_analyze_reports_executed_macs_of_linear_time_heads():
    """Papers' totals unchanged; executed MACs drop by N^2 (qk+v) - window cost for each linear-time head (by hand)."""
    from archspec.ir.analysis import analyze
    from archspec.ir.checked import load_spec

    spec = load_spec("mait_tiny_sch2").model_dump(mode="json", exclude_none=True)
    small = analyze(spec)
    assert small.macs_executed == small.macs  # 14x14 grid: under the crossover, masked heads run dense
    spec["input"]["resolution"] = 512
    large = analyze(spec)
    n, d = 1025, 64
    window_head = 1024 * (1 + 9) * 2 * d + 1 * n * 2 * d + n * d  # patch queries, class query, value sum
    masked_heads = 8 * 2 + 12 * 1  # Sch.2: layers 0-7 two masked heads, 8-19 one
    assert large.macs - large.macs_executed == masked_heads * (n * n * 2 * d - window_head)
    first = next(row for row in large.rows if row.layer == "stages.0.blocks.0")
    assert first.macs - first.macs_executed == 2 * (n * n * 2 * d - window_head)


def test_eval_stacked_qkv_equals_separate_projections_and_follows_new_weights():
    """Eval mode runs qk and v as one GEMM on cached stacked weights; training mode runs the two linears."""
    layer = _layer(["mhsa", "mask"], (3, 4), 1)
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        want = layer.train()(x)  # no dropout configured: train and eval compute the same function
        torch.testing.assert_close(layer.eval()(x), want, atol=1e-6, rtol=1e-6)
        other = _layer(["mhsa", "mask"], (3, 4), 1, seed=7)
        layer.load_state_dict(other.state_dict())
        torch.testing.assert_close(layer(x), other.train()(x), atol=1e-6, rtol=1e-6)


def test_set_grid_replans_and_stays_exact():
    """A resolution change (``set_grid``) rebuilds the window tables and moves masked heads onto the linear-time
    path past the crossover; the result still equals the dense reference."""
    layer = _layer(["mask", "mhsa"], (5, 7), 1).eval()
    assert [key for key, _ in layer._groups] == [("hard",), ("sdpa",)]
    layer.set_grid((16, 17))
    assert [key for key, _ in layer._groups] == [("window", (3, 3)), ("sdpa",)]
    x = torch.randn(1, 1 + 16 * 17, 32)
    with torch.no_grad():
        want = copy.deepcopy(layer).set_attn_impl("dense")(x)
        torch.testing.assert_close(layer(x), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("grid,window,p",
                         [((4, 5), (3, 3), 0), ((3, 4), (3, 5), 1), ((2, 2), (5, 5), 2), ((1, 1), (3, 3), 1)])
@pytest.mark.slow
def test_window_backward_passes_gradcheck(grid, window, p):
    """The hand-written backward of the linear-time path against finite differences (float64)."""
    torch.manual_seed(2)
    n = p + grid[0] * grid[1]
    q, k, v = (torch.randn(1, 2, n, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    tables = {name: t.double() for name, t in window_tables(grid, window, p).items()}
    assert torch.autograd.gradcheck(lambda a, b, c: hard_window_attention(a, b, c, grid, window, p, 0.7, tables),
                                    (q, k, v), eps=1e-6, atol=1e-7)


def _bytes_kept_for_backward(layer: Attention, x: torch.Tensor) -> int:
    """Bytes autograd holds when the forward ends (each storage once; views share storage)."""
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    out.sum().backward()
    return sum(storages.values())


@pytest.mark.parametrize("impl,grid", [("fast", (16, 16)), ("auto", (8, 8))])  # window path; small-grid dense path
@pytest.mark.parametrize("heads", [["mask", "mask", "mhsa"], ["mask", "mhsa", "mhsa"], ["mask"] * 3])
def test_masked_layer_keeps_no_more_for_backward_than_unmasked(one_thread, heads, impl, grid):
    """Issue 11: a masked model's training memory <= the unmasked one's.  The reference is the same layer with
    every head global (SDPA keeps q, k, v, its output and one log-sum-exp per query)."""
    masked = Attention(96, heads, grid, num_prefix_tokens=1).set_attn_impl(impl).train()
    assert {key[0] for key, _ in masked._groups} <= {"window" if impl == "fast" else "hard", "sdpa"}
    plain = Attention(96, ["mhsa"] * 3, grid, num_prefix_tokens=1).train()
    plain.load_state_dict(masked.state_dict())
    x = torch.randn(2, 1 + grid[0] * grid[1], 96, requires_grad=True)
    assert _bytes_kept_for_backward(masked, x) <= _bytes_kept_for_backward(plain, x)


@pytest.mark.slow
def test_torch_compile_traces_whole_layer_and_takes_window_path(one_thread):
    """Under torch.compile every plain hard head takes the window path (Inductor fuses it), with no graph break
    (fullgraph) and the eager result.  The ``eager`` backend checks the trace without a C++ toolchain."""
    layer = _layer(["mask", "mask", "mhsa"], (5, 5), 1).eval()
    assert [key for key, _ in layer._groups] == [("hard",), ("sdpa",)]
    assert [key for key, _ in layer._compiled_plan[0]] == [("window", (3, 3)), ("sdpa",)]
    x = torch.randn(2, 26, 32)
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layer(x), atol=1e-5, rtol=1e-5)
    layer.train()
    xg = x.clone().requires_grad_()
    compiled(xg).sum().backward()
    reference = x.clone().requires_grad_()
    layer.set_attn_impl("dense")(reference).sum().backward()
    torch.testing.assert_close(xg.grad, reference.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_dense_hard_mask_backward_passes_gradcheck():
    """The small-grid hard-mask path recomputes its weights in backward: against finite differences (float64)."""
    from archspec.families.attention.kernels import hard_masked_attention

    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 2, 10, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    zero = torch.rand(2, 10, 10) > 0.5
    assert torch.autograd.gradcheck(lambda a, b, c: hard_masked_attention(a, b, c, zero, 0.7), (q, k, v),
                                    eps=1e-6, atol=1e-7)
