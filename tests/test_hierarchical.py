"""Hierarchical token stages (issue 81's structure): Swin's patch stem with a LayerNorm and patch merging against
timm's own modules, NAT's convolutional tokenizer and downsampler against a reference written here as Hugging Face's
``modeling_nat`` writes them, and whole Swin- and NAT-shaped specs (validate, counts per node, compile, forward,
timm's state-dict names, other input sizes).  fp32; the module checks at 1e-6, whole models at 1e-5."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.layers import PatchEmbed
from timm.models.swin_transformer import PatchMerging
from torch import nn

from archspec import compile as compile_spec
from archspec.ir.checked import load_spec
from archspec.ir.plan import build_plan
from archspec.nn.blocks import ConvDownsample, ConvTokenizer, PatchStem, TokenPatchMerging
from archspec.nn.model import symbolic_trace
from archspec.timm_bridge.convert import from_timm, swin_key_from_timm

TOL = 1e-6


@pytest.fixture(autouse=True)
def _seed(one_thread):
    torch.manual_seed(0)


def _randomize_norms(module: nn.Module) -> None:
    """LayerNorm weights and biases away from timm's ones / zeros, so a misplaced norm shows."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.normal_(1.0, 0.5)
                m.bias.normal_(0.0, 0.5)


@pytest.mark.parametrize("grid", [(6, 8), (7, 5), (1, 3)])
def test_patch_merging_is_timms(grid):
    """Even and odd grids (timm zero-pads the bottom / right), timm's channel order, LayerNorm(4C), Linear."""
    rows, cols = grid
    ref = PatchMerging(12, 20).eval()
    _randomize_norms(ref)
    ours = TokenPatchMerging(12, 20, grid, norm_eps=1e-5).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, rows, cols, 12)
    with torch.no_grad():
        want = ref(x)
        got = ours(x.flatten(1, 2))
    assert want.shape[1:3] == ours.out_grid == ((rows + 1) // 2, (cols + 1) // 2)
    assert torch.allclose(got, want.flatten(1, 2), atol=TOL, rtol=0)


@pytest.mark.parametrize("grid, merged", [
    ((2, 2), [[1, 3, 2, 4]]),  # row-major tokens 1 2 / 3 4: offsets (0,0), (1,0), (0,1), (1,1)
    ((1, 3), [[1, 0, 2, 0], [3, 0, 0, 0]]),  # an odd grid: zeros below and to the right
])
def test_patch_merging_order_by_hand(grid, merged):
    """What reaches the LayerNorm, by hand: Swin's ``x0, x1, x2, x3`` = offsets (row, col) (0,0), (1,0), (0,1), (1,1)
    of each 2x2 neighbourhood, the bottom / right zero-padded on an odd side."""
    ours = TokenPatchMerging(1, 2, grid).eval()
    seen = []
    ours.norm.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    tokens = torch.arange(1.0, grid[0] * grid[1] + 1).reshape(1, -1, 1)
    with torch.no_grad():
        ours(tokens)
    assert seen[0].flatten(1, 2)[0].tolist() == merged


def test_patch_stem_with_norm_is_swins_patch_embed():
    """timm ``SwinTransformer``'s ``PatchEmbed(norm_layer=LayerNorm, output_fmt='NHWC')``: conv, then LayerNorm."""
    ref = PatchEmbed(img_size=(32, 24), patch_size=4, in_chans=3, embed_dim=20, norm_layer=nn.LayerNorm,
                     output_fmt="NHWC").eval()
    _randomize_norms(ref)
    ours = PatchStem(3, 20, 4, (32, 24), norm_eps=1e-5).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 24)
    with torch.no_grad():
        assert torch.allclose(ours(x), ref(x).flatten(1, 2), atol=TOL, rtol=0)


def _nat_tokenizer(x, w1, b1, w2, b2, norm_w, norm_b):
    """Hugging Face ``NatEmbeddings``: two 3x3 stride-2 convs (padding 1, bias, nothing between), NHWC, LayerNorm."""
    x = F.conv2d(F.conv2d(x, w1, b1, stride=2, padding=1), w2, b2, stride=2, padding=1).permute(0, 2, 3, 1)
    return F.layer_norm(x, (x.shape[-1],), norm_w, norm_b, eps=1e-5)


def test_conv_tokenizer_is_nats():
    ours = ConvTokenizer(3, (8, 16), norm_eps=1e-5).eval()
    _randomize_norms(ours)
    x = torch.randn(2, 3, 33, 31)
    state = ours.state_dict()
    with torch.no_grad():
        want = _nat_tokenizer(x, state["proj.0.weight"], state["proj.0.bias"], state["proj.1.weight"],
                              state["proj.1.bias"], state["norm.weight"], state["norm.bias"])
        got = ours(x)
    assert want.shape == (2, 9, 8, 16)  # 33 x 31 -> 17 x 16 -> 9 x 8
    assert torch.allclose(got, want.flatten(1, 2), atol=TOL, rtol=0)


@pytest.mark.parametrize("grid", [(6, 8), (5, 7)])
def test_conv_downsample_is_nats(grid):
    """Hugging Face ``NatDownsampler``: NHWC -> NCHW, Conv2d(C, C', 3, 2, 1, bias=False), NHWC, LayerNorm."""
    ours = ConvDownsample(12, 24, grid, norm_eps=1e-5).eval()
    _randomize_norms(ours)
    x = torch.randn(2, *grid, 12)
    with torch.no_grad():
        want = F.conv2d(x.permute(0, 3, 1, 2), ours.reduction.weight, None, stride=2, padding=1).permute(0, 2, 3, 1)
        want = F.layer_norm(want, (24,), ours.norm.weight, ours.norm.bias, eps=1e-5)
        got = ours(x.flatten(1, 2))
    assert want.shape[1:3] == ours.out_grid
    assert torch.allclose(got, want.flatten(1, 2), atol=TOL, rtol=0)


def _swin_spec(resolution: int, depths=(2, 2, 2, 2), dims=(16, 32, 64, 128), heads=(1, 2, 4, 8),
               num_classes: int = 10) -> dict:
    """A Swin-shaped spec (patch 4 + LayerNorm, patch merging entering stages 1.., mean pool after the final norm),
    MHSA heads until the window kind is in."""
    stages = [{"depth": d, "dim": c, "heads": h, "norm_eps": 1e-5, "attention": "mhsa",
               **({"downsample": "patch_merging"} if i else {})}
              for i, (d, c, h) in enumerate(zip(depths, dims, heads))]
    return {"name": "swin_shaped", "input": {"resolution": resolution},
            "stem": {"kind": "patch", "patch_size": 4, "norm": "layernorm"},
            "tokens": {"cls_token": "none", "pos_embed": "none"}, "stages": stages,
            "head": {"pool": "mean", "norm": "before_pool", "num_classes": num_classes}}


def _timm_swin(resolution: int, **kwargs) -> nn.Module:
    """timm's Swin with one window over the whole first grid (each stage's window is clamped to its grid, shift 0),
    its relative-position tables zeroed: then window attention is plain MHSA and the structure is all that differs."""
    grid = resolution // 4
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=resolution, window_size=grid,
                              **kwargs).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name:
                p.zero_()
    _randomize_norms(model)
    return model


@pytest.mark.parametrize("resolution", [32, 40])  # grids 8, 4, 2, 1 and 10, 5, 3 (padded), 2
def test_swin_structure_loads_timms_weights_and_matches_its_logits(resolution):
    """Stem + norm, patch merging at the start of stages 1..3, the final norm on every token, the mean, ``head.fc``:
    timm's weights load by name (:func:`from_timm`) and the logits agree; the window tables are left out (the window
    kind's)."""
    ref = _timm_swin(resolution, embed_dim=16, depths=(2, 2, 2, 2), num_heads=(1, 2, 4, 8), num_classes=10)
    ours = compile_spec(_swin_spec(resolution)).eval()
    state = {k: v for k, v in ref.state_dict().items() if "relative_position" not in k}
    ours.load_state_dict(from_timm(state, ours), strict=True)
    x = torch.randn(2, 3, resolution, resolution)
    with torch.no_grad():
        assert torch.allclose(ours.forward_features(x), ref.forward_features(x).flatten(1, 2), atol=1e-5, rtol=0)
        assert torch.allclose(ours(x), ref(x), atol=1e-5, rtol=0)


def test_swin_key_names():
    assert swin_key_from_timm("layers.2.downsample.reduction.weight") == "stages.2.downsample.reduction.weight"
    assert swin_key_from_timm("layers.0.blocks.1.norm1.bias") == "stages.0.blocks.1.norm1.bias"
    assert swin_key_from_timm("head.fc.weight") == "head.weight"
    assert swin_key_from_timm("norm.weight") == "norm.weight"


@pytest.mark.slow
def test_swin_t_shaped_spec_counts_timms_parameters_per_node():
    """Swin-T's shape (patch 4 + norm, depths 2 2 6 2, dims 96..768, heads 3..24): every node's parameters are those
    of its timm module (``swin_tiny_patch4_window7_224``) less the window tables (169 per head, the window kind's);
    the compiled model has the plan's parameters and runs forward (at 64 px, global MHSA being costly at 224)."""
    spec = load_spec(_swin_spec(224, (2, 2, 6, 2), (96, 192, 384, 768), (3, 6, 12, 24), 1000))
    ref = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False)

    def n_params(module: nn.Module) -> int:
        return sum(p.numel() for n, p in module.named_parameters() if "relative_position" not in n)

    nodes = {n["name"]: n["params"] for n in build_plan(spec).nodes}
    assert nodes["stem"] == n_params(ref.patch_embed)
    assert nodes["head"] == n_params(ref.norm) + n_params(ref.head)
    for i, layer in enumerate(ref.layers):
        assert nodes.get(f"stages.{i}.downsample", 0) == n_params(layer.downsample)
        for j, block in enumerate(layer.blocks):
            assert nodes[f"stages.{i}.blocks.{j}"] == n_params(block)
    assert sum(nodes.values()) == n_params(ref) == 28_288_354 - 169 * 2 * (3 + 6 + 12 * 3 + 24)
    model = compile_spec(spec, img_size=64).eval()
    assert sum(p.numel() for p in model.parameters()) == sum(nodes.values())
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


def _nat_spec(resolution: int) -> dict:
    """A NAT-shaped spec (conv tokenizer, conv downsamplers, final norm before the mean), MHSA heads."""
    stages = [{"depth": 1, "dim": c, "heads": 2, "mlp_ratio": 3, "norm_eps": 1e-5, "attention": "mhsa",
               **({"downsample": "conv"} if i else {})} for i, c in enumerate((16, 32, 64, 128))]
    return {"name": "nat_shaped", "input": {"resolution": resolution}, "stem": {"kind": "conv_tokenizer"},
            "tokens": {"cls_token": "none", "pos_embed": "none"}, "stages": stages,
            "head": {"pool": "mean", "norm": "before_pool", "num_classes": 10}}


def test_nat_shaped_spec_compiles_traces_and_reports_its_grids():
    """40 px: the tokenizer's 10 x 10, then 5 x 5, 3 x 3, 2 x 2 (ceil, the conv's padding); the parameters are the
    plan's; torch.fx traces it (the downsamplers are leaves) to the same logits."""
    spec = load_spec(_nat_spec(40))
    plan = build_plan(spec)
    assert [n["grid"] for n in plan.nodes if n["kind"] in ("stem", "downsample")] == [(10, 10), (5, 5), (3, 3), (2, 2)]
    model = compile_spec(spec).eval()
    assert sum(p.numel() for p in model.parameters()) == plan.totals["params"]
    assert model.pretrained_cfg["first_conv"] == "stem.proj.0"
    x = torch.randn(2, 3, 40, 40)
    with torch.no_grad():
        logits = model(x)
        assert [f.shape[-2:] for f in model.forward_intermediates(x, intermediates_only=True)] == [
            (10, 10), (5, 5), (3, 3), (2, 2)]
        assert torch.equal(symbolic_trace(model)(x), logits)
    assert [info["reduction"] for info in model.feature_info] == [4, 8, 16, 32]


@pytest.mark.parametrize("make", [_swin_spec, _nat_spec])
def test_other_input_sizes_move_the_downsamplers(make):
    """``set_input_size`` (and a dynamic size) gives the logits of the spec compiled at that size with the same
    weights: the downsamplers follow the new grids (32 -> 48 px: 8 -> 12 tokens a side, odd grids after)."""
    model = compile_spec(make(32)).eval()
    fresh = compile_spec(make(48)).eval()
    fresh.load_state_dict(model.state_dict(), strict=True)
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        want = fresh(x)
        model.set_dynamic_img_size(True)
        assert torch.allclose(model(x), want, atol=1e-5, rtol=0)
        model.set_dynamic_img_size(False)
        model.set_input_size(48)
        assert torch.allclose(model(x), want, atol=1e-5, rtol=0)
