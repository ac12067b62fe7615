"""Head kind ``gauss_mask`` (GMM-Mask, Li & Zhang, arXiv 2309.05375, one Gaussian per head, added to the logits)
against things that do not come from archspec's attention code: a re-implementation written here from the equation

    A_h = softmax(Q_h K_h^T / sqrt(d) + b_h),   b_h[i, j] = alpha_h exp(-d_ij^2 / (2 (sigma_h^2 + 1e-5)))

(patch-patch block only, prefix tokens unbiased), with ``d_ij`` counted in python loops over patch rows and columns;
a hand-computed 3x3 case; the stated init's share of attention in the 3x3 window; the compiler's counts; the ALS
diagnostics; int8 and ONNX export against the float model.
"""

from __future__ import annotations

import math

import pytest
import torch
from layer_reference import float64_qkv
from torch import nn

import archspec
from archspec.families.attention.heads import coerce_heads
from archspec.families.attention.kinds.gauss_mask import GaussMaskSpec
from archspec.families.attention.rules import AttentionShape, AttnDims, counts, head_path
from archspec.nn.blocks import Attention, attention_impl

EPS = 1e-5  # the authors' sigma^2 + 1e-5 (models/gmm.py)


def _bias_by_hand(grid, prefix, alpha, sigma):
    """``(N, N)`` bias of one head, python floats: alpha exp(-d^2 / (2 (sigma^2 + eps))) on patch pairs, else 0."""
    rows, cols = grid
    n = prefix + rows * cols
    bias = [[0.0] * n for _ in range(n)]
    for i in range(rows * cols):
        for j in range(rows * cols):
            d2 = (i // cols - j // cols) ** 2 + (i % cols - j % cols) ** 2
            bias[prefix + i][prefix + j] = alpha * math.exp(-d2 / (2.0 * (sigma * sigma + EPS)))
    return torch.tensor(bias, dtype=torch.float64)


def _d2_by_hand(grid):
    rows, cols = grid
    return torch.tensor([[float((i // cols - j // cols) ** 2 + (i % cols - j % cols) ** 2)
                          for j in range(rows * cols)] for i in range(rows * cols)], dtype=torch.float64)


def _neighbours(grid, prefix, window):
    """MaiT's window by hand, ``(N, N)`` bool: patches within ``window // 2`` rows and columns; prefix tokens are
    neighbours of every token, both ways (mask_terms.window_mask's stated reading)."""
    rows, cols = grid
    n = prefix + rows * cols

    def near(i, j):
        if i < prefix or j < prefix:
            return True
        (ri, ci), (rj, cj) = divmod(i - prefix, cols), divmod(j - prefix, cols)
        return abs(ri - rj) <= window[0] // 2 and abs(ci - cj) <= window[1] // 2

    return torch.tensor([[near(i, j) for j in range(n)] for i in range(n)])


def _reference(layer: Attention, x: torch.Tensor, alpha: dict, sigma: dict, masks: dict | None = None) -> torch.Tensor:
    """The layer's output recomputed from its projection weights in float64: ``softmax(q k^T / sqrt(d) + b) v``
    per head, ``b`` from ``alpha[h]``, ``sigma[h]`` (tensors, so gradients reach them) for the Gaussian heads.
    ``masks[h] = (mode, window, a)``: MaiT's mask on the (biased) logits of head ``h``, non-neighbours set to 0
    (``'hard'``, eq. 2) or scaled by ``a`` (``'soft'``, eq. 4)."""
    H, d, p = layer.num_heads, layer.qk_dim, layer.num_prefix_tokens
    q, k, v = float64_qkv(layer, x)
    d2 = _d2_by_hand(layer.grid)
    heads = []
    for h in range(H):
        logits = torch.einsum("bid,bjd->bij", q[:, :, h], k[:, :, h]) / math.sqrt(d)
        if h in alpha:
            gauss = alpha[h] * torch.exp(-d2 / (2.0 * (sigma[h] ** 2 + EPS)))
            logits = logits + nn.functional.pad(gauss, (p, 0, p, 0))
        if masks and h in masks:
            mode, window, a = masks[h]
            far = logits * a if mode == "soft" else torch.zeros_like(logits)
            logits = torch.where(_neighbours(layer.grid, p, window), logits, far)
        heads.append(logits.softmax(dim=-1) @ v[:, :, h])
    out = torch.cat(heads, dim=-1)
    return out @ layer.proj.weight.double().T + layer.proj.bias.double()


HEADS = ["gauss_mask", "mhsa", {"gauss_mask": {"alpha_init": 2.0, "sigma_init": 0.7}}, "gauss_mask"]


@pytest.mark.parametrize("impl", ["auto", "dense", "sdpa"])
@pytest.mark.parametrize("grid, prefix", [((4, 5), 0), ((3, 3), 1), ((1, 4), 2)])
def test_gauss_heads_equal_the_equation_forward_and_gradients(impl, grid, prefix, one_thread):
    """Output and the gradients of alpha and sigma equal the float64 re-implementation, on every path: the default
    plan, the dense path, and SDPA with the bias as its float attn_mask (the CUDA path, forced on CPU).  With no
    mask or GPSA head the dense path also calls SDPA (no explicit logits), so "dense" repeats "sdpa" here: the
    explicit-logits path is the next test's."""
    torch.manual_seed(0)
    layer = Attention(32, HEADS, grid, num_prefix_tokens=prefix)
    with torch.no_grad():  # learned values away from the init, one amplitude negative
        layer.gauss_alpha.copy_(torch.tensor([3.0, -1.5, 0.8]))
        layer.gauss_sigma.copy_(torch.tensor([1.3, 0.6, 2.5]))
        for lin in (layer.qk, layer.v):
            lin.weight.mul_(20.0)  # content logits of order 1, so neither term dominates
    layer._masked_sdpa_fused = impl == "sdpa"
    x = torch.randn(2, prefix + grid[0] * grid[1], 32)
    alpha = {h: torch.tensor(a, dtype=torch.float64, requires_grad=True) for h, a in zip((0, 2, 3), (3.0, -1.5, 0.8))}
    sigma = {h: torch.tensor(s, dtype=torch.float64, requires_grad=True) for h, s in zip((0, 2, 3), (1.3, 0.6, 2.5))}
    expected = _reference(layer, x, alpha, sigma)
    weight = torch.linspace(-1, 1, expected.numel()).view_as(expected)
    (expected * weight).sum().backward()
    with attention_impl(layer, "dense" if impl == "dense" else "auto"):
        out = layer(x)
        (out * weight.float()).sum().backward()
    assert (out.double() - expected).abs().max().item() < 1e-5
    for row, h in enumerate((0, 2, 3)):
        assert layer.gauss_alpha.grad[row].item() == pytest.approx(alpha[h].grad.item(), rel=1e-4, abs=1e-6)
        assert layer.gauss_sigma.grad[row].item() == pytest.approx(sigma[h].grad.item(), rel=1e-4, abs=1e-6)


EXPLICIT = ["gauss_mask", "soft_mask",
            {"gauss_mask": {"alpha_init": 2.0, "sigma_init": 0.7}, "mask": {"window": "3x5"}}, "mhsa"]


@pytest.mark.parametrize("impl", ["auto", "dense"])
@pytest.mark.parametrize("prefix", [0, 1])
def test_gauss_heads_on_the_explicit_logits_path_equal_the_equation(impl, prefix, one_thread):
    """Gaussian heads where the layer forms explicit ``(B, H, N, N)`` logits (the dense reference, not SDPA), against
    the float64 re-implementation (bias on the patch-patch block only, prefix rows and columns unbiased, then MaiT's
    mask).  "dense": the soft-mask head puts every head, both Gaussian ones included, on explicit logits.  "auto":
    the head with a Gaussian bias and a hard 3x5 mask is itself on the explicit path (its mask acts on the biased
    logits), beside the SDPA heads.  Output and the gradients of alpha and sigma agree."""
    torch.manual_seed(0)
    grid = (3, 4)
    layer = Attention(32, EXPLICIT, grid, num_prefix_tokens=prefix).set_attn_impl(impl)
    assert layer.explicit_logits
    if impl == "auto":
        assert (("dense",), [1, 2]) in layer._groups
    with torch.no_grad():
        layer.gauss_alpha.copy_(torch.tensor([3.0, -1.5]))
        layer.gauss_sigma.copy_(torch.tensor([1.3, 0.6]))
        layer.mask_alpha_logit.fill_(math.log(0.3 / 0.7))  # soft alpha 0.3
        for lin in (layer.qk, layer.v):
            lin.weight.mul_(20.0)
    x = torch.randn(2, prefix + grid[0] * grid[1], 32)
    alpha = {h: torch.tensor(a, dtype=torch.float64, requires_grad=True) for h, a in zip((0, 2), (3.0, -1.5))}
    sigma = {h: torch.tensor(s, dtype=torch.float64, requires_grad=True) for h, s in zip((0, 2), (1.3, 0.6))}
    masks = {1: ("soft", (3, 3), 0.3), 2: ("hard", (3, 5), None)}
    expected = _reference(layer, x, alpha, sigma, masks)
    weight = torch.linspace(-1, 1, expected.numel()).view_as(expected)
    (expected * weight).sum().backward()
    out = layer(x)
    (out * weight.float()).sum().backward()
    assert (out.double() - expected).abs().max().item() < 1e-5
    for row, h in enumerate((0, 2)):
        assert layer.gauss_alpha.grad[row].item() == pytest.approx(alpha[h].grad.item(), rel=1e-4, abs=1e-6)
        assert layer.gauss_sigma.grad[row].item() == pytest.approx(sigma[h].grad.item(), rel=1e-4, abs=1e-6)


def test_training_forward_builds_the_bias_once_for_all_head_groups(monkeypatch):
    """Training, heads on three paths (SDPA, GPSA, dense: the soft mask): one forward builds the position bias once,
    not once per group; the next forward builds it again (a training bias is not cached)."""
    gpsa = {"gpsa": {"conv_init": False}}
    layer = Attention(40, ["gauss_mask", gpsa, "soft_mask", "gauss_mask", "mhsa"], (4, 4)).train()
    assert [key[0] for key, _ in layer._groups] == ["sdpa", "gpsa", "dense"]
    builds = []
    build = layer._build_position_bias
    monkeypatch.setattr(layer, "_build_position_bias", lambda: builds.append(1) or build())
    x = torch.randn(2, 16, 40)
    layer(x).sum().backward()
    assert len(builds) == 1 and layer._forward_memo is None
    layer(x)
    assert len(builds) == 2


@pytest.mark.parametrize("heads, prefix, scattered", [(["gauss_mask"] * 4, 1, False), (["gauss_mask"] * 4, 0, False),
                                                       (HEADS, 1, True), (HEADS, 0, True)])
def test_bias_with_prefix_pads_or_scatters_without_a_new_index_per_forward(heads, prefix, scattered, monkeypatch):
    """Every head Gaussian: the layer's bias is the Gaussian heads' own, zero rows and columns for the prefix, no
    index buffer.  Mixed heads: added at the registered non-persistent ``gauss_head_idx`` (not in the state dict).
    Either way the bias equals the hand-computed one and building it makes no index tensor (``torch.tensor``)."""
    layer = Attention(32, heads, (3, 3), num_prefix_tokens=prefix).train()
    buffers = dict(layer.named_buffers())
    assert ("gauss_head_idx" in buffers) == scattered and "gauss_head_idx" not in layer.state_dict()
    if scattered:
        assert buffers["gauss_head_idx"].tolist() == layer.gauss_heads
    monkeypatch.setattr(torch, "tensor", None)  # any torch.tensor(...) call in the build raises
    bias = layer.position_bias()
    monkeypatch.undo()
    specs = coerce_heads(heads)
    for h, spec in enumerate(specs):
        g = spec.gauss_mask
        expected = (_bias_by_hand((3, 3), prefix, g.alpha_init, g.sigma_init) if g is not None
                    else torch.zeros(prefix + 9, prefix + 9, dtype=torch.float64))
        assert (bias[h].double() - expected).abs().max().item() < 1e-6


def test_hand_computed_3x3_probabilities():
    """Zero content logits on a 3x3 grid: the centre patch's attention is exp(b) normalised, with b = 5 on itself,
    5 e^{-1/2} on its 4 edge neighbours and 5 e^{-1} on its 4 corners (alpha 5, sigma 1: sigma^2 + 1e-5 in the
    exponent's denominator)."""
    layer = Attention(16, ["gauss_mask"], (3, 3))
    with torch.no_grad():
        layer.qk.weight.zero_()
    probs = layer.get_attention(torch.randn(1, 9, 16))[0, 0]
    s = 2 * (1 + 1e-5)
    self_w, edge_w, corner_w = math.exp(5), math.exp(5 * math.exp(-1 / s)), math.exp(5 * math.exp(-2 / s))
    total = self_w + 4 * edge_w + 4 * corner_w
    assert probs[4, 4].item() == pytest.approx(self_w / total, rel=1e-5)
    assert probs[4, 1].item() == pytest.approx(edge_w / total, rel=1e-5)
    assert probs[4, 0].item() == pytest.approx(corner_w / total, rel=1e-5)
    assert probs[4, 4].item() == pytest.approx(0.5784, abs=1e-4)  # written out: e^5 / (e^5 + 4 e^3.033 + 4 e^1.839)


@pytest.mark.parametrize("grid, share, self_share", [((8, 8), 0.79, 0.49), ((14, 14), 0.56, 0.34)])
def test_default_init_is_local_as_documented(grid, share, self_share):
    """The default (alpha 5, sigma 1 patch) with zero content logits: the 3x3-window and self shares the spec
    reference states, from the hand-computed bias."""
    spec = GaussMaskSpec()
    bias = _bias_by_hand(grid, 0, spec.alpha_init, spec.sigma_init)
    probs = bias.softmax(dim=-1)
    rows, cols = grid
    window = torch.tensor([[abs(i // cols - j // cols) <= 1 and abs(i % cols - j % cols) <= 1
                            for j in range(rows * cols)] for i in range(rows * cols)])
    assert (probs * window).sum(dim=-1).mean().item() == pytest.approx(share, abs=0.005)
    assert probs.diagonal().mean().item() == pytest.approx(self_share, abs=0.005)
    layer = Attention(16, ["gauss_mask"], grid)
    with torch.no_grad():
        layer.qk.weight.zero_()
        layer.qk.bias.zero_()
    got = layer.get_attention(torch.randn(1, rows * cols, 16))[0, 0].double()
    assert (got - probs).abs().max().item() < 1e-6


def test_counts_two_parameters_per_head_and_no_macs():
    """Static counts: 2 parameters per Gaussian head on top of the same layer without them, the same MACs (a bias)."""
    kinds = ["gauss_mask", "mhsa", {"gauss_mask": {}, "rel_bias": {"table": "signed"}}, "mask"]
    plain = ["mhsa", "mhsa", {"rel_bias": {"table": "signed"}}, "mask"]
    with_g = AttentionShape(32, coerce_heads(kinds), (3, 5), 1, AttnDims(8, 8), True)
    without = AttentionShape(32, coerce_heads(plain), (3, 5), 1, AttnDims(8, 8), True)
    assert counts(with_g)[0] - counts(without)[0] == 4
    assert counts(with_g)[1] == counts(without)[1]
    layer = Attention(32, kinds, (3, 5), num_prefix_tokens=1, qk_dim=8, v_dim=8)
    assert sum(p.numel() for p in layer.parameters()) == counts(with_g)[0]
    assert layer.gauss_alpha.numel() == layer.gauss_sigma.numel() == 2


def test_paths_letters_and_composition():
    """A Gaussian head is a biased head: SDPA alone, never the linear-time hard-mask kernel; letters compose."""
    gauss, hard_gauss = coerce_heads(["gauss_mask", {"mask": {}, "gauss_mask": {}}])
    assert head_path(gauss, (20, 20)) == ("sdpa",)
    assert head_path(hard_gauss, (20, 20), "fast") == ("dense",)  # explicit logits: the mask acts on the biased logits
    assert gauss.letter == "D" and hard_gauss.letter == "MD" and not gauss.is_plain


def test_spec_builds_with_the_papers_parameter_count():
    """specs/gauss_mask_tiny.yaml: the authors' 32 px ViT (2.7M parameters in their table), 2 per head more than
    the same model without the bias; no weight decay on alpha and sigma."""
    model = archspec.compile("gauss_mask_tiny")
    n = sum(p.numel() for p in model.parameters())
    assert round(n / 1e6, 1) == 2.7
    assert n == model.analysis.graph["params"]
    plain = archspec.load_spec("gauss_mask_tiny").model_dump()
    plain["stages"][0]["attention"] = "mhsa"
    heads = plain["stages"][0]["heads"]
    depth = plain["stages"][0]["depth"]
    assert n - sum(p.numel() for p in archspec.compile(plain).parameters()) == 2 * heads * depth
    names = model.no_weight_decay()
    assert {f"stages.0.blocks.{b}.attn.gauss_{w}" for b in range(9) for w in ("alpha", "sigma")} <= names


# spec_digest and architecture_key of shipped specs computed at 5e04be3, before gauss_mask existed
STORED_BEFORE = {
    "mait_tiny_sch2": ("c644f9c21bbb9683132a856f5238163bc4aebc0d856b65d05145afda07aa0895",
                       "dd46f085be21d1e3dfc0ff087a21a3117eb915fa2919e3994b6048165f4d83ee"),
    "botnet26t": ("15bea2268fe582b83dc4868bb393fc1f4c3efb5baad71366d8c81d2ba2c4e364",
                  "0fa8e32f97f1f587802a814309c8d9af053702024e92d4146b9c49b630d911bf"),
}


@pytest.mark.parametrize("name", sorted(STORED_BEFORE))
def test_the_new_kind_keeps_stored_digests_and_keys(name):
    """Builds saved and table rows keyed before the kind existed still match: a head without gauss_mask hashes as
    before (the values computed on the commit before it); a head with it changes both."""
    from archspec.io.artifact import spec_digest
    from archspec.search._evaluation.latency import architecture_key

    spec = archspec.load_spec(name)
    assert (spec_digest(spec), architecture_key(spec)) == STORED_BEFORE[name]
    if name == "mait_tiny_sch2":
        doc = spec.model_dump(mode="json", exclude_none=True)
        doc["stages"][0]["attention"] = "gauss_mask"
        other = archspec.load_spec(doc)
        assert spec_digest(other) != spec_digest(spec) and architecture_key(other) != architecture_key(spec)


def test_set_grid_keeps_alpha_and_sigma_and_rebuilds_distances(one_thread):
    """A resolution change moves the layer to the new grid: same parameters, the equation on the new distances."""
    torch.manual_seed(0)
    layer = Attention(32, HEADS, (3, 3), num_prefix_tokens=1)
    layer.set_grid((4, 5))
    alpha = {h: torch.tensor(a, dtype=torch.float64) for h, a in zip((0, 2, 3), (5.0, 2.0, 5.0))}
    sigma = {h: torch.tensor(s, dtype=torch.float64) for h, s in zip((0, 2, 3), (1.0, 0.7, 1.0))}
    x = torch.randn(2, 21, 32)
    with torch.no_grad():
        assert (layer(x).double() - _reference(layer, x, alpha, sigma)).abs().max().item() < 1e-5


def test_als_diagnostics_read_the_gaussian_heads():
    """MaiT's ALS (layer_als) on a model whose heads are all gauss_mask, content logits zeroed: every head's score is
    the hand-computed 3x3 share of the init (0.79 on the 8x8 grid of gauss_mask_tiny)."""
    from archspec.diagnostics.metrics import layer_als

    torch.manual_seed(0)
    model = archspec.compile("gauss_mask_tiny").eval()
    for module in model.modules():
        if isinstance(module, Attention):
            with torch.no_grad():
                module.qk.weight.zero_()
    als = layer_als(model, torch.randn(2, 3, 32, 32))
    bias = _bias_by_hand((8, 8), 0, 5.0, 1.0)
    window = torch.tensor([[abs(i // 8 - j // 8) <= 1 and abs(i % 8 - j % 8) <= 1 for j in range(64)]
                           for i in range(64)])
    share = (bias.softmax(dim=-1) * window).sum(dim=-1).mean().item()
    assert len(als) == 9
    for scores in als.values():
        assert scores.shape == (12,)
        assert torch.allclose(scores.double(), torch.full((12,), share, dtype=torch.float64), atol=1e-5)


def test_inspect_reports_the_learned_alpha_and_sigma():
    """diagnose() (archspec inspect): per layer the Gaussian heads' alpha and sigma, as set; None elsewhere."""
    from archspec.diagnostics.inspection import diagnose

    model = _small_gauss_model()
    with torch.no_grad():
        model.stages[0].blocks[1].attn.gauss_sigma.copy_(torch.tensor([-1.5, 0.5, 3.0]))  # sigma acts as |sigma|
    rows = {row["name"]: row for row in diagnose(model, torch.randn(1, 3, 32, 32))["layers"]}
    assert rows["stages.0.blocks.1.attn"]["gauss"] == {"alpha": [5.0, 5.0, 5.0], "sigma": [1.5, 0.5, 3.0]}
    assert rows["stages.0.blocks.1.attn"]["heads"] == "D A M D D A"
    assert rows["stages.0.blocks.0.attn"]["gauss"]["sigma"] == [1.0] * 6


def _small_gauss_model() -> nn.Module:
    """gauss_mask_tiny shrunk to 3 blocks of 96 wide, with a class token (prefix unbiased), random init."""
    doc = archspec.load_spec("gauss_mask_tiny").model_dump(mode="json", exclude_none=True)
    doc["stages"][0].update(depth=3, dim=96, heads=6)
    doc["stages"][0]["layers"] = [{"range": "1", "heads": ["gauss_mask", "mhsa", "mask", "gauss_mask",
                                                            {"gauss_mask": {"sigma_init": 2.0}}, "mhsa"]}]
    doc["tokens"]["cls_token"] = "input"
    doc["head"]["pool"] = "cls"
    torch.manual_seed(0)
    return archspec.compile(doc).eval()


@pytest.mark.slow  # PT2E quantisation: seconds
def test_int8_of_gauss_heads_close_to_float(one_thread):
    """int8 (torchao PT2E, the bias in float32 with the attention products) within test_deploy's tolerance of the
    float model on the three real photographs at 32 px: per image cosine >= 0.98, relative L2 <= 0.2."""
    from deploy_fixtures import augmented

    from archspec.deploy.int8 import quantize
    from archspec.io.images import sample_batch

    model = _small_gauss_model()
    photos = sample_batch((32, 32))
    quantized = quantize(model, [augmented(photos)], torch_compile=False)
    with torch.no_grad():
        expected, got = model(photos), quantized(photos)
    cosine = nn.functional.cosine_similarity(got, expected, dim=1)
    relative = (got - expected).norm(dim=1) / expected.norm(dim=1)
    assert (cosine >= 0.98).all() and (relative <= 0.2).all(), (cosine, relative)


@pytest.mark.slow  # the dynamo ONNX exporter: seconds
def test_onnx_of_gauss_heads_equals_pytorch(tmp_path, one_thread):
    """ONNX export (dynamic batch) of a model with Gaussian heads: ONNX Runtime's logits equal PyTorch's within 1e-4
    relative to their scale, at the traced batch and at another."""
    pytest.importorskip("onnxruntime")
    from archspec.deploy.onnx_export import export_onnx, ort_session, run_onnx
    from archspec.io.images import sample_batch

    model = _small_gauss_model()
    photos = sample_batch((32, 32))
    export_onnx(model, tmp_path / "g.onnx", photos[:2], {"test": True})
    session = ort_session(tmp_path / "g.onnx", threads=1)
    with torch.no_grad():
        for x in (photos, photos[:1]):
            expected = model(x)
            scale = max(expected.abs().max().item(), 1e-3)
            assert (run_onnx(session, x) - expected).abs().max().item() <= 1e-4 * scale
