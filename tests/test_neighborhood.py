"""Head kind ``neighborhood`` (NAT, Hassani et al. 2022; DiNAT, Hassani & Shi 2022) against references that do not
come from archspec's attention code:

* a naive loop written from the papers' definition (each query's ``k x k`` neighbours on the sub-grid of positions
  congruent to it mod the dilation, the window clamped inside; NAT's bias read at the neighbour's offset; a softmax
  by hand): ``naive_axis`` of tests/test_local_kernels.py, which reuses nothing of the kernels or their index rules;
* whole NAT-Mini and DiNAT-Mini forwards written here from the state dict as the authors' ``classification/nat.py``
  computes them (tokenizer, pre-norm blocks, conv downsamplers, norm, mean, head), with that loop as attention;
* the papers' tables (NAT-Mini and DiNAT-Mini: 20M parameters, 2.7 GFLOPs) and torch's FLOP counter;
* the command line's located errors, and every verb on a small NAT-shaped spec.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from layer_reference import float64_qkv
from macs_reference import reference_macs
from test_families import eval_buffer_bytes
from test_local_kernels import naive_axis

import archspec
from archspec.cli import main
from archspec.errors import SpecError, format_path
from archspec.families.attention import local_kernels as lk
from archspec.families.attention.heads import HeadSpec, coerce_heads
from archspec.families.attention.kinds.neighborhood import tiled_path_pays
from archspec.families.attention.rules import AttentionShape, AttnDims, counts, executed_macs, head_path
from archspec.ir.checked import load_spec
from archspec.nn.blocks import Attention, attention_impl

TOL = 1e-5


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    torch.manual_seed(0)


# ------------------------------------------------------------------------------------------------ the naive loop
def _naive_layer(layer: Attention, x: torch.Tensor) -> torch.Tensor:
    """The layer's output recomputed in float64 from its projections: per query its naive window (per head its kind:
    a neighbourhood with or without NAT's bias, or every token), the softmax by hand."""
    B, N, _ = x.shape
    H, d, grid = layer.num_heads, layer.qk_dim, layer.grid
    q, k, v = float64_qkv(layer, x)
    out = torch.zeros(B, N, H, layer.v_dim, dtype=torch.float64)
    for h, spec in enumerate(layer.head_specs):
        nb = spec.neighborhood
        rpb = layer.rpb[layer.rpb_heads.index(h)].double() if nb is not None and nb.rpb else None
        for t in range(N):
            keys, bias = list(range(N)), None
            if nb is not None:
                keys_r, bias_r = naive_axis(t // grid[1], grid[0], nb.kernel, nb.dilation)
                keys_c, bias_c = naive_axis(t % grid[1], grid[1], nb.kernel, nb.dilation)
                keys = [r * grid[1] + c for r in keys_r for c in keys_c]
                bias = None if rpb is None else rpb[bias_r][:, bias_c].flatten()
            logits = k[:, keys, h] @ q[:, t, h].unsqueeze(-1) * d ** -0.5  # (B, keys, 1)
            logits = logits.squeeze(-1) + (0 if bias is None else bias)
            weights = (logits - logits.max(-1, keepdim=True).values).exp()
            out[:, t, h] = ((weights / weights.sum(-1, keepdim=True)).unsqueeze(-1) * v[:, keys, h]).sum(1)
    return out.reshape(B, N, -1) @ layer.proj.weight.double().T + layer.proj.bias.double()


LAYERS = [
    (["neighborhood:3"] * 2, (9, 11)),                                             # NAT, odd grid
    ([{"neighborhood": {"kernel": 3, "dilation": 3}}] * 2, (10, 9)),               # DiNAT, uneven sub-grids
    ([{"neighborhood": {"kernel": 5, "rpb": False}}, "neighborhood:5"], (7, 12)),  # with and without the bias
    ([{"neighborhood": {"kernel": 3, "dilation": 2}}, "mhsa", "neighborhood:3",    # mixed with global heads
      {"neighborhood": {"kernel": 5, "rpb": False}}], (10, 7)),
    (["neighborhood:3", "mhsa"], (20, 19)),                                        # past the tiled crossover
]


def _layer(heads, grid, dim=None):
    torch.manual_seed(0)
    layer = Attention(dim or 8 * len(heads), heads, grid)
    with torch.no_grad():
        if hasattr(layer, "rpb"):
            layer.rpb.normal_(0.0, 0.5)  # a bias that shows when it is misread
    return layer


@pytest.mark.parametrize("heads, grid", LAYERS)
@pytest.mark.parametrize("impl", ["auto", "fast", "dense"])
def test_every_path_equals_the_naive_loop(heads, grid, impl):
    layer = _layer(heads, grid).set_attn_impl(impl)
    x = torch.randn(2, grid[0] * grid[1], layer.dim)
    with torch.no_grad():
        got = layer(x)
    assert (got.double() - _naive_layer(layer, x)).abs().max().item() < TOL


@pytest.mark.parametrize("heads, grid", LAYERS[1:4])
def test_fast_and_dense_gradients_agree(heads, grid):
    """Training through the tiled kernel (the heads grouped by path) and through the dense reference: the same
    gradients for every parameter, the bias tables included."""
    layer = _layer(heads, grid).train()
    x = torch.randn(2, grid[0] * grid[1], layer.dim)
    weights = torch.linspace(-1, 1, x.numel()).view_as(x)
    grads = {}
    for impl in ("fast", "dense"):
        layer.zero_grad()
        (layer.set_attn_impl(impl)(x) * weights).sum().backward()
        grads[impl] = {n: p.grad.clone() for n, p in layer.named_parameters()}
    assert grads["fast"].keys() == grads["dense"].keys() and "rpb" in grads["fast"]
    for name, grad in grads["fast"].items():
        assert (grad - grads["dense"][name]).abs().max().item() < TOL, name


@pytest.mark.slow  # Dynamo traces the layer and its backward: seconds
def test_torch_compile_traces_the_tiled_kernel_whole():
    """Under torch.compile every plain neighbourhood head takes the tiled kernel, even on a grid where eager runs it
    on SDPA, with no graph break (fullgraph; the kernel's cached tables are traced as constants) and the eager
    result, forward and gradients.  The ``eager`` backend checks the trace without a C++ toolchain."""
    layer = _layer([{"neighborhood": {"kernel": 3, "dilation": 2}}, "neighborhood:3", "mhsa"], (9, 8))
    assert [key[0] for key, _ in layer._groups] == ["sdpa"]
    assert [key[0] for key, _ in layer._compiled_plan[0]] == ["neighborhood", "neighborhood", "sdpa"]
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    x = torch.randn(2, 72, layer.dim)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layer(x), atol=TOL, rtol=TOL)
    layer.train()
    xg, reference = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled(xg).sum().backward()
    layer.set_attn_impl("dense")(reference).sum().backward()
    torch.testing.assert_close(xg.grad, reference.grad, atol=TOL, rtol=TOL)


def test_windows_made_by_tensor_ops_are_the_index_rules():
    """The per-patch starts buffer and the traceable window made of it equal the index rules' (N, N) tables."""
    for grid, kernel, dilation in [((9, 11), 3, 1), ((10, 9), 3, 3), ((13, 17), (3, 5), (4, 2)), ((28, 28), 7, 4)]:
        starts = lk.neighborhood_starts(grid, kernel, dilation)
        for mine, theirs in zip(lk.neighborhood_window_mask(starts, grid, kernel, dilation),
                                lk.neighborhood_mask(grid, kernel, dilation)):
            assert torch.equal(mine, theirs)


def test_a_table_built_in_inference_mode_serves_a_training_step():
    """The kernel's cached tables are plain tensors: built first by an inference forward (``archspec build``'s photo),
    then read by a training forward that differentiates the bias through them."""
    grid = (29, 31)  # a grid no other test uses: its tables are built here first
    q, k, v = (torch.randn(1, 2, grid[0] * grid[1], 4) for _ in range(3))
    rpb = torch.randn(2, 5, 5)
    with torch.inference_mode():
        lk.neighborhood_attention(q, k, v, grid, 3, rpb=rpb)
    rpb.requires_grad_()
    lk.neighborhood_attention(q, k, v, grid, 3, rpb=rpb).sum().backward()
    assert rpb.grad is not None and rpb.grad.abs().sum() > 0


# ------------------------------------------------------------------------------------------------ spec and rules
def test_shorthands_letters_and_terms():
    nat, dinat, plain = coerce_heads(["neighborhood:7", {"neighborhood": {"dilation": 8}},
                                      {"neighborhood": {"kernel": 3, "rpb": False}}])
    assert (nat.neighborhood.kernel, nat.neighborhood.dilation, nat.neighborhood.rpb) == (7, 1, True)
    assert dinat.neighborhood.dilation == 8 and dinat.neighborhood.kernel == 7
    assert [h.letter for h in (nat, dinat, plain)] == ["N", "N", "N"]
    assert nat.kinds == {"neighborhood"} and plain.kinds == {"neighborhood"}


@pytest.mark.parametrize("grid, kernel, pays", [((16, 16), 3, False), ((19, 19), 3, True), ((24, 24), 7, False),
                                                ((25, 24), 7, True), ((56, 56), 7, True), ((14, 14), 7, False)])
def test_the_tiled_path_is_chosen_where_it_pays(grid, kernel, pays):
    """Measured crossover (kinds/neighborhood.py, docs/benchmarks.md): 300 + 6 k^2 patches."""
    assert tiled_path_pays(grid, kernel, 1) is pays
    key = head_path(HeadSpec(neighborhood={"kernel": kernel}), grid)
    assert key == (("neighborhood", kernel, 1, True) if pays else ("sdpa",))
    assert head_path(HeadSpec(neighborhood={"kernel": kernel}), grid, "fast")[0] == "neighborhood"
    composed = HeadSpec(neighborhood={"kernel": kernel}, rel_bias={})  # another kind's terms: the generic path
    assert head_path(composed, grid, "fast") == ("sdpa",)


@pytest.mark.parametrize("heads, grid", [(["neighborhood:3", "mhsa"], (6, 5)), (["neighborhood:5"] * 2, (20, 20)),
                                         ([{"neighborhood": {"kernel": 3, "dilation": 2}}, "levit_bias"], (7, 7))])
def test_papers_macs_count_the_attended_pairs(heads, grid):
    """The papers' MACs (NAT's 2 H W C k^2 for the attention products): the dense path's counted MACs less the pairs
    outside each neighbourhood head's window (counted from the naive windows) times the head dims; parameters: the
    module's, (2k - 1)^2 per biased head.  Executed MACs: what the counter sees on the default paths (the tiled
    kernel's whole key blocks and its bias products; every pair on the dense path)."""
    layer = _layer(heads, grid).eval()
    shape = AttentionShape(layer.dim, coerce_heads(heads), grid, 0, AttnDims(8, 8), True)
    params, macs = counts(shape)
    assert params == sum(p.numel() for p in layer.parameters())
    x = torch.randn(1, grid[0] * grid[1], layer.dim)
    n = grid[0] * grid[1]
    outside = 0
    for spec in shape.heads:
        if spec.neighborhood is not None:
            window = len(naive_axis(0, grid[0], spec.neighborhood.kernel, spec.neighborhood.dilation)[0]) * len(
                naive_axis(0, grid[1], spec.neighborhood.kernel, spec.neighborhood.dilation)[0])
            outside += n * n - n * window
    with attention_impl(layer, "dense"):
        assert macs == reference_macs(layer, x) - outside * 16
    assert reference_macs(layer, x) == executed_macs(shape)


@pytest.mark.parametrize("heads, grid", [(["neighborhood:3"] * 2, (20, 20)), (["neighborhood:3", "mhsa"], (20, 20)),
                                         (["neighborhood:3", "levit_bias"], (5, 4)),
                                         ([{"neighborhood": {"dilation": 2, "kernel": 3}}, "neighborhood:3"], (8, 8))])
def test_buffer_rule_is_the_modules_bytes(heads, grid):
    """The attention family's buffer bytes (each kind's tables and the layer's eval caches) equal, to the byte, what
    the layer holds after its first eval forward: a layer whose heads all take the tiled kernel caches no bias and
    no mask; one beside an SDPA head caches both."""
    from archspec.families import build, rules

    shape = AttentionShape(16, coerce_heads(heads), grid, 0, AttnDims(8, 8), True)
    module = build("attention", shape).eval()
    with torch.no_grad():
        module(torch.randn(1, grid[0] * grid[1], 16))
    assert rules("attention").buffers(shape) == eval_buffer_bytes(module)


@pytest.mark.parametrize("name", ["nat_mini", "dinat_mini"])
def test_shipped_specs_match_the_papers_tables(name):
    """NAT-Mini and DiNAT-Mini: 20M parameters, 2.7 GFLOPs (the papers' FLOPs are MACs) -- within 3 %; the 224-px
    grids 56 and 28 take the tiled kernel, 14 and 7 the dense path (the measured crossover)."""
    analysis = archspec.analyze(name)
    assert analysis.params == pytest.approx(20e6, rel=0.03) and analysis.params == 19_984_174
    assert analysis.macs == pytest.approx(2.7e9, rel=0.03) and analysis.macs == 2_694_812_672
    spec = load_spec(name)
    assert [s.depth for s in spec.stages] == [3, 4, 6, 5] and [s.heads for s in spec.stages] == [2, 4, 8, 16]
    dilations = [[plan.heads[0].neighborhood.dilation for plan in spec.layer_plans(i)] for i in range(4)]
    expected = ([[1, 8, 1], [1, 4, 1, 4], [1, 2, 1, 2, 1, 2], [1] * 5] if name == "dinat_mini"  # HF DinatConfig
                else [[1] * 3, [1] * 4, [1] * 6, [1] * 5])
    assert dilations == expected
    for side, tiled in ((56, True), (28, True), (14, False), (7, False)):
        assert head_path(spec.stages[0].attention, (side, side))[0] == ("neighborhood" if tiled else "sdpa")


@pytest.mark.slow  # a 224-px forward under a dispatch mode that counts every storage: seconds
@pytest.mark.parametrize("name", ["nat_mini", "dinat_mini"])
def test_memory_estimate_holds_the_measured_peak(name):
    """The analysis' peak activation (the tiled kernel's tiles in place of (N, N) logits at 56x56: 22.6 MiB, where
    the same model with global heads on its first level states 81.7 MiB) holds the measured inference peak and is
    within 3x of it, as tests/test_memory.py asks of the other shipped specs."""
    from test_memory import measured_inference_peak

    spec = load_spec(name)
    estimate, measured = archspec.analyze(spec).peak_activation_bytes, measured_inference_peak(spec)
    assert measured <= estimate <= 3 * measured


# ------------------------------------------------------------------------------------------------ errors
TOKENS = "{cls_token: none, pos_embed: none}"
BAD = """\
name: bad
input: {{channels: 3, resolution: 32}}
stem: {{kind: patch, patch_size: 4}}
tokens: {tokens}
stages:
  - {{depth: 1, dim: 16, heads: 2,
     attention: {attention}}}
head: {{pool: mean, num_classes: 10}}
"""
CONV = """\
name: bad
input: {channels: 3, resolution: 64}
stem: {kind: resnet, channels: 16}
stages:
  - {kind: conv, block: basic, depth: 1, channels: 16,
     attention: "neighborhood:3"}
"""


@pytest.mark.parametrize("text, line, column, field, words", [
    (BAD.format(tokens=TOKENS, attention="{neighborhood: {kernel: 6}}"), 7, 33,
     "stages[0].attention.neighborhood.kernel", ["kernel 6 must be odd", "hint: NAT and DiNAT use 7; use 7"]),
    (BAD.format(tokens=TOKENS, attention="{neighborhood: {kernel: 3, dilation: 4}}"), 7, 44,
     "stages[0].attention.neighborhood.dilation", ["kernel 3 x dilation 4 = 12 is beyond the grid's 8 rows",
                                                   "hint: use kernel * dilation <= 8"]),
    (BAD.format(tokens="{cls_token: input}", attention='"neighborhood:3"'), 7, 6, "stages[0].attention",
     ["1 prefix (class/distillation) token", "hint: drop the class token"]),
    (CONV, 6, 6, "stages[0].attention", ["unknown key 'attention'", "is a key of attention stages", "mixer"]),
])
def test_bad_input_exits_2_located_and_writes_nothing(text, line, column, field, words, tmp_path, capsys):
    """``archspec build`` on a spec that misuses the kind: exit 2, ``file:line:column``, the field, the hint, no
    traceback, nothing written."""
    source = tmp_path / "bad.yaml"
    source.write_text(text)
    out = tmp_path / "out"
    assert main(["build", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{source}:{line}:{column}" in err and field in err and "Traceback" not in err, err
    assert all(word in err for word in words), err
    assert not out.exists()


def _bottleneck(attention) -> dict:
    return {"name": "bot_nat", "input": {"resolution": 64}, "stem": {"kind": "resnet", "channels": 16},
            "stages": [{"kind": "conv", "block": "bottleneck", "depth": 2, "channels": 64,
                        "mixer": {"kind": "attention", "heads": 2, "attention": attention}}],
            "head": {"num_classes": 10}}


def test_neighbourhood_heads_in_a_bottleneck_attend_the_pixel_map():
    """A bottleneck's attention mixer (BoTNet's place; archspec's Attention on the 16x16 map) takes neighbourhood
    heads: the tiled kernel and the dense path agree, the papers' count drops the pairs outside the windows (as the
    token stages' does), and a window beyond the map is refused where it is written."""
    model = archspec.compile(_bottleneck("neighborhood:3")).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        with attention_impl(model, "fast"):
            fast = model(x)
        with attention_impl(model, "dense"):
            dense = model(x)
            dense_macs = reference_macs(model, x)
    assert (fast - dense).abs().max().item() < TOL
    n, layers, dims = 16 * 16, 2, 2 * (8 + 8)  # two blocks, two heads of 8 (inner width 16)
    assert archspec.analyze(_bottleneck("neighborhood:3")).macs == dense_macs - layers * (n * n - n * 9) * dims
    with pytest.raises(SpecError) as info:
        load_spec(_bottleneck({"neighborhood": {"kernel": 5, "dilation": 4}}))
    assert format_path(info.value.problems[0].path) == "stages[0].mixer.attention.neighborhood.dilation"


def test_biased_heads_of_one_layer_share_their_kernel():
    with pytest.raises(SpecError) as info:
        load_spec({"input": {"resolution": 64}, "stem": {"kind": "patch", "patch_size": 4},
                   "tokens": {"cls_token": "none", "pos_embed": "none"}, "head": {"pool": "mean"},
                   "stages": [{"depth": 1, "dim": 16, "heads": 2, "layers": [
                       {"range": 0, "heads": ["neighborhood:3", "neighborhood:5"]}]}]})
    problem = info.value.problems[0]
    assert format_path(problem.path) == "stages[0].layers[0].heads[1].neighborhood.kernel"
    assert "kernels 3, 5 in one layer" in problem.message and "rpb: false" in problem.hint


# ------------------------------------------------------------------------------------------------ the whole models
def _naive_nat(state: dict, stages: list[tuple[int, list[int]]], x: torch.Tensor, kernel: int = 7) -> torch.Tensor:
    """NAT's forward (the authors' classification/nat.py: ConvTokenizer, NATLayer, ConvDownsampler, norm, mean, head)
    in float64 from archspec's state dict, attention by the naive loop; ``stages``: ``(heads, dilation per block)``."""
    s = {name: t.double() for name, t in state.items()}

    def norm(t, name):
        return F.layer_norm(t, t.shape[-1:], s[f"{name}.weight"], s[f"{name}.bias"], 1e-5)

    def attention(t, prefix, heads, dilation):
        B, rows, cols, C = t.shape
        d, n = C // heads, rows * cols
        t = t.reshape(B, n, C)
        qk = t @ s[f"{prefix}.qk.weight"].T + s[f"{prefix}.qk.bias"]
        q, k = qk[..., :C].view(B, n, heads, d), qk[..., C:].view(B, n, heads, d)
        v = (t @ s[f"{prefix}.v.weight"].T + s[f"{prefix}.v.bias"]).view(B, n, heads, d)
        out = torch.empty(B, n, heads, d, dtype=torch.float64)
        for i in range(rows):
            keys_r, bias_r = naive_axis(i, rows, kernel, dilation)
            for j in range(cols):
                keys_c, bias_c = naive_axis(j, cols, kernel, dilation)
                keys = [r * cols + c for r in keys_r for c in keys_c]
                bias = s[f"{prefix}.rpb"][:, bias_r][:, :, bias_c].reshape(heads, -1)
                logits = torch.einsum("bhd,bkhd->bhk", q[:, i * cols + j], k[:, keys]) / math.sqrt(d) + bias
                weights = (logits - logits.max(-1, keepdim=True).values).exp()
                out[:, i * cols + j] = torch.einsum("bhk,bkhd->bhd", weights / weights.sum(-1, keepdim=True),
                                                    v[:, keys])
        out = out.reshape(B, n, C) @ s[f"{prefix}.proj.weight"].T + s[f"{prefix}.proj.bias"]
        return out.view(B, rows, cols, C)

    x = F.conv2d(x.double(), s["stem.proj.0.weight"], s["stem.proj.0.bias"], stride=2, padding=1)
    x = F.conv2d(x, s["stem.proj.1.weight"], s["stem.proj.1.bias"], stride=2, padding=1)
    x = norm(x.permute(0, 2, 3, 1), "stem.norm")
    for i, (heads, dilations) in enumerate(stages):
        if i:
            x = F.conv2d(x.permute(0, 3, 1, 2), s[f"stages.{i}.downsample.reduction.weight"], stride=2, padding=1)
            x = norm(x.permute(0, 2, 3, 1), f"stages.{i}.downsample.norm")
        for j, dilation in enumerate(dilations):
            p = f"stages.{i}.blocks.{j}"
            x = x + attention(norm(x, f"{p}.norm1"), f"{p}.attn", heads, dilation)
            hidden = F.gelu(norm(x, f"{p}.norm2") @ s[f"{p}.mlp.fc1.weight"].T + s[f"{p}.mlp.fc1.bias"])
            x = x + hidden @ s[f"{p}.mlp.fc2.weight"].T + s[f"{p}.mlp.fc2.bias"]
    x = norm(x, "norm").flatten(1, 2).mean(1)
    return x @ s["head.weight"].T + s["head.bias"]


DILATIONS = {"nat_mini": [[1] * 3, [1] * 4, [1] * 6, [1] * 5],
             "dinat_mini": [[1, 8, 1], [1, 4, 1, 4], [1, 2, 1, 2, 1, 2], [1] * 5]}  # DiNAT's, HF's DinatConfig


@pytest.mark.slow  # two 224-px models and a python loop over every query of every layer: ~10 s each
@pytest.mark.parametrize("name", sorted(DILATIONS))
def test_logits_equal_the_naive_model(name, real_images):
    """The shipped spec's logits (fp32, default paths: the tiled kernel at 56 and 28, dense SDPA at 14 and 7) equal
    the naive float64 forward at 1e-5, on a real photo, with every norm, bias table and the head randomised."""
    torch.manual_seed(0)
    model = archspec.compile(name).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("rpb"):
                p.normal_(0.0, 0.5)
            elif "norm" in pname:
                p.normal_(1.0 if pname.endswith("weight") else 0.0, 0.3)
            elif pname.startswith("head"):
                p.normal_(0.0, 0.05)
        got = model(real_images[:1])
    stages = list(zip((2, 4, 8, 16), DILATIONS[name]))
    want = _naive_nat(model.state_dict(), stages, real_images[:1])
    assert want.abs().max() > 0.5  # logits of a useful scale
    assert (got.double() - want).abs().max().item() < TOL


# ------------------------------------------------------------------------------------------------ every verb
TINY_NAT = """\
name: tiny_nat
source: "a NAT-shaped spec for the verbs' tests"
input: {channels: 3, resolution: 80}
stem: {kind: conv_tokenizer}
tokens: {cls_token: none, pos_embed: none}
stages:
  - {depth: 2, dim: 16, heads: 2, mlp_ratio: 2, norm_eps: 1.0e-5, attention: "neighborhood:3",
     layers: [{range: 1, attention: {neighborhood: {kernel: 3, dilation: 2}}}]}
  - {depth: 1, dim: 32, heads: 2, mlp_ratio: 2, norm_eps: 1.0e-5, downsample: conv,
     layers: [{range: 0, heads: ["neighborhood:5", mhsa]}]}
head: {pool: mean, norm: before_pool, num_classes: 10}
"""


#: one block a stage, for the exporters and Inductor (whose time grows with the ops): the dilated layer on the tiled
#: kernel, then the dense layer beside a global head
TINY_NAT_1_1 = TINY_NAT.replace("depth: 2, dim: 16", "depth: 1, dim: 16").replace("range: 1, attention",
                                                                                  "range: 0, attention")


def _tiny_model(text: str = TINY_NAT) -> torch.nn.Module:
    """A tiny NAT (20x20 grid: the tiled kernel; 10x10: dense SDPA beside a global head) with weights of a useful
    scale."""
    torch.manual_seed(0)
    model = archspec.compile(text).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def test_tiny_specs_take_both_paths():
    for text, paths in ((TINY_NAT, [["neighborhood"], ["neighborhood"], ["sdpa"]]),
                        (TINY_NAT_1_1, [["neighborhood"], ["sdpa"]])):
        groups = [m._groups for m in _tiny_model(text).modules() if isinstance(m, Attention)]
        assert [[key[0] for key, _ in g] for g in groups] == paths
    assert [h.neighborhood.dilation for h in load_spec(TINY_NAT_1_1).layer_plans(0)[0].heads] == [2, 2]


def test_attention_maps_per_head_are_the_windows():
    """``archspec inspect``'s maps (diagnostics.metrics.attention_maps): each neighbourhood head's row is a
    distribution over exactly its naive window; the global head's over every token."""
    from archspec.diagnostics.metrics import attention_maps
    from archspec.io.images import sample_batch

    maps = attention_maps(_tiny_model(), sample_batch((80, 80))[:1])
    for name, grid, heads in (("stages.0.blocks.1.attn", (20, 20), [(3, 2), (3, 2)]),
                              ("stages.1.blocks.0.attn", (10, 10), [(5, 1), None])):
        attn = maps[name][0]
        assert torch.allclose(attn.sum(-1), torch.ones(attn.shape[:2]), atol=1e-5)
        for h, window in enumerate(heads):
            for t in (0, 13, grid[0] * grid[1] - 1):
                support = set(attn[h, t].nonzero().flatten().tolist())
                if window is None:
                    assert len(support) == grid[0] * grid[1]
                    continue
                rows, _ = naive_axis(t // grid[1], grid[0], *window)
                cols, _ = naive_axis(t % grid[1], grid[1], *window)
                assert support == {r * grid[1] + c for r in rows for c in cols}


@pytest.mark.slow  # a build and an inspect of a small model: a few seconds
def test_validate_build_and_inspect_on_the_command_line(tmp_path, capsys):
    spec = tmp_path / "tiny_nat.yaml"
    spec.write_text(TINY_NAT)
    assert main(["validate", str(spec), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] and report["macs_executed"] > report["macs"]
    assert main(["build", str(spec), "--out", str(tmp_path / "b"), "--repeats", "1"]) == 0
    assert "N N" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "b"), "--out", str(tmp_path / "i"), "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    assert [row["heads"] for row in layers] == ["N N", "N N", "N A"]
    assert all(0 < als <= 1 for row in layers for als in row["als"])


@pytest.mark.slow  # a few training steps, twice: seconds
def test_train_a_few_steps_and_resume(tmp_path, monkeypatch):
    """``fit`` (what ``archspec train`` runs) trains the neighbourhood model, the rpb tables included; a run stopped
    after its step-2 checkpoint (Ctrl-C during step 3) resumes to the uninterrupted run's weights, bit for bit."""
    from train_fixtures import image_folder, quick_config

    from archspec.train import Trainer, fit

    folder = image_folder(tmp_path / "stripes", per_class=8)
    spec = tmp_path / "tiny_nat.yaml"
    spec.write_text(TINY_NAT.replace("num_classes: 10", "num_classes: 2"))
    config = quick_config(steps=4, eval_every=2, batch_size=4, checkpoint_every=1)
    whole = fit(spec, folder, config, out=tmp_path / "whole", progress=False)
    step = Trainer.step

    def interrupted(self, x, y, at):
        if at == 3:
            raise KeyboardInterrupt
        return step(self, x, y, at)

    monkeypatch.setattr(Trainer, "step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fit(spec, folder, config, out=tmp_path / "part", progress=False)
    monkeypatch.setattr(Trainer, "step", step)
    resumed = fit(spec, folder, config, out=tmp_path / "part", resume=True, progress=False)
    assert resumed.steps == whole.steps == 4
    a, b = whole.model.state_dict(), resumed.model.state_dict()
    assert any(k.endswith("rpb") for k in a) and all(torch.equal(a[k], b[k]) for k in a)
    initial = archspec.compile(spec.read_text()).state_dict()
    assert not torch.equal(a["stages.0.blocks.0.attn.rpb"], initial["stages.0.blocks.0.attn.rpb"])


@pytest.mark.slow  # PT2E quantisation: seconds
def test_int8_agrees_with_float_on_the_photo():
    """int8 (torchao PT2E; attention products, the tiled kernel and softmax in float32): top-1 equal to the float
    model's on the three photographs; the max logit difference is reported by ``archspec build --int8``."""
    from deploy_fixtures import augmented

    from archspec.deploy.int8 import quantize
    from archspec.io.images import sample_batch

    model = _tiny_model()
    photos = sample_batch((80, 80))
    quantized = quantize(model, [augmented(photos)], torch_compile=False)
    with torch.no_grad():
        expected, got = model(photos), quantized(photos)
    assert torch.equal(got.argmax(1), expected.argmax(1))
    assert (got - expected).abs().max() <= 0.1 * expected.abs().max()


@pytest.mark.slow  # the dynamo ONNX exporter: seconds
def test_onnx_equals_eager(tmp_path):
    pytest.importorskip("onnxruntime")
    from archspec.deploy.onnx_export import export_onnx, ort_session, run_onnx
    from archspec.io.images import sample_batch

    model = _tiny_model(TINY_NAT_1_1)
    photos = sample_batch((80, 80))
    export_onnx(model, tmp_path / "n.onnx", photos[:2], {"test": True})
    session = ort_session(tmp_path / "n.onnx", threads=1)
    with torch.no_grad():
        for x in (photos, photos[:1]):
            expected = model(x)
            got = run_onnx(session, x)
            assert torch.equal(got.argmax(1), expected.argmax(1))
            assert (got - expected).abs().max().item() <= 1e-4 * expected.abs().max().item()


@pytest.mark.slow  # Inductor: ~30 s
def test_torch_compile_equals_eager():
    from archspec.diagnostics.timing import compile_for_inference
    from archspec.io.images import sample_batch

    model = _tiny_model(TINY_NAT_1_1)
    photos = sample_batch((80, 80))
    compiled = compile_for_inference(model)
    with torch.no_grad():
        torch.testing.assert_close(compiled(photos), model(photos), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------------ the benchmarks
def test_bench_crossover_quick_runs(bench_module):
    """bench/local_kernels.py --crossover --quick: every (kernel, dilation, side) that fits, the three forms timed."""
    rows = bench_module("local_kernels").main(["--crossover", "--quick"])
    assert {(r["kernel"], r["dilation"], r["side"]) for r in rows} == {
        (k, d, s) for k in (3, 5, 7) for d in (1, 2) for s in (7, 8, 10) if k * d <= s}
    assert all(r["tiled_ms"] > 0 and r["dense_over_tiled"] > 0 for r in rows)


@pytest.mark.slow  # nat_mini at 224 px, dense and default, once each
def test_bench_models_quick_gives_the_same_logits(bench_module):
    rows = bench_module("local_kernels").main(["--models", "nat_mini", "--quick"])
    assert len(rows) == 1 and rows[0]["max_abs_diff"] < TOL and rows[0]["ratio"] > 0


def test_mait_on_tiles_is_exact(bench_module):
    """bench/mait_tiled.py: MaiT's hard masks on the neighbourhood tiles (a virtual key for the non-neighbours) and
    archspec's linear-time path both equal the dense formula (checked inside the script against
    ``softmax(M (.) Q K^T s) V``)."""
    rows = bench_module("mait_tiled").main(["--quick"])
    assert {r["form"] for r in rows} >= {"linear-time window path", "tiled, tile 4", "tiled, tile 8"}
    assert all(r["max_abs_diff"] < TOL for r in rows if r["max_abs_diff"] is not None)
