"""Swin end to end: the ``window`` head kind (archspec/families/attention/kinds/window.py) against timm 1.0's
``SwinTransformer`` (``timm/models/swin_transformer.py``: its blocks' windows and shifts, its logits with the same
weights, its parameter and MAC counts, its init), a layer mixing window heads with global and MaiT-mask heads
against a reference assembled head by head from timm's window attention and the plain formulas, the kind's
checks, and the two shipped Swin specs.  fp32; logits at 1e-5.
"""

from __future__ import annotations

import json

import pytest
import timm
import torch
import torch.nn.functional as F
from test_families import eval_buffer_bytes
from timm.models.swin_transformer import SwinTransformer, SwinTransformerBlock
from torch import nn
from train_fixtures import folder  # noqa: F401 - the striped image folder, a pytest fixture used by name

import archspec
from archspec import compile as compile_spec
from archspec.cli import main
from archspec.deploy.int8 import quantize
from archspec.deploy.onnx_export import ort_session, run_onnx
from archspec.errors import SpecError
from archspec.families import rules
from archspec.families.attention.heads import HeadSpec, coerce_heads
from archspec.families.attention.module import Attention, attention_impl
from archspec.families.attention.rules import AttentionShape, AttnDims, logit_elements
from archspec.io.images import load_image, sample_batch
from archspec.ir.checked import load_spec, with_resolution
from archspec.ir.plan import build_plan
from archspec.search import load_space
from archspec.timm_bridge.convert import from_timm, load_timm_weights, to_timm
from archspec.train import run as train_run
from archspec.train.stop import Terminated
from tests.macs_reference import reference_macs

TOL = 1e-5


@pytest.fixture(autouse=True)
def _seed(one_thread):
    torch.manual_seed(0)


def swin_spec(resolution: int, window: int = 4, depths=(2, 2), dims=(16, 32), heads=(2, 4),
              num_classes: int = 10, clamp: bool = False) -> dict:
    """A small Swin (timm's structure): patch 4 + LayerNorm, patch merging opening stage 1.., window heads with
    Swin's alternating shift (``clamp``: to a smaller grid, as timm), the final norm, the mean, a classifier."""
    attention = {"window": {"size": window, "clamp": True}} if clamp else f"window:{window}"
    stages = [{"depth": d, "dim": c, "heads": h, "norm_eps": 1e-5, "attention": attention,
               **({"downsample": "patch_merging"} if i else {})}
              for i, (d, c, h) in enumerate(zip(depths, dims, heads))]
    return {"name": "small_swin", "input": {"resolution": resolution},
            "stem": {"kind": "patch", "patch_size": 4, "norm": "layernorm"},
            "tokens": {"cls_token": "none", "pos_embed": "none"}, "stages": stages,
            "head": {"pool": "mean", "norm": "before_pool", "num_classes": num_classes}}


def timm_swin(resolution: int, window: int = 4, depths=(2, 2), dims=(16, 32), heads=(2, 4)) -> SwinTransformer:
    """timm's Swin of :func:`swin_spec`'s shape, its tables, qkv biases and norms away from their init values (so
    a misplaced bias, a padding key without the qkv bias or a swapped norm shows)."""
    model = SwinTransformer(img_size=resolution, patch_size=4, embed_dim=dims[0], depths=depths, num_heads=heads,
                            window_size=window, num_classes=10, drop_path_rate=0.0).eval()
    _perturb(model)
    return model


def _perturb(model: nn.Module) -> None:
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "relative_position_bias_table" in name or name.endswith("qkv.bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "norm" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


# ------------------------------------------------------------------------------------------------ the kind's rules
def test_spec_forms_and_what_they_mean():
    """``window:7`` is a 7x7 window with Swin's alternating shift; sizes and shifts as ints, pairs or 'RxC'."""
    head = HeadSpec.model_validate("window:7")
    assert head.window.size == (7, 7) and head.window.shift == "alternate" and head.letter == "W"
    assert [head.at_layer(i).window.shift for i in range(4)] == [(0, 0), (3, 3), (0, 0), (3, 3)]
    custom = HeadSpec.model_validate({"window": {"size": "6x4", "shift": [3, 1]}}).window
    assert custom.size == (6, 4) and custom.shift == (3, 1) and HeadSpec.model_validate("window").window.size == (7, 7)
    assert HeadSpec.model_validate({"window": {"size": 5, "shift": 2}}).at_layer(0).window.shift == (2, 2)


@pytest.mark.parametrize("resolution", [32, 40, 24, 56])  # grids 8/4, 10/5 (padded), 6/3 (clamped), 14/7
def test_every_blocks_window_and_shift_are_timms(resolution):
    """Per block: the window and shift each archspec layer plans (its head group's key) are those of timm's
    ``SwinTransformerBlock`` at the same place (``shift_size=0 if i % 2 == 0 else w // 2``, then its clamp)."""
    ours = compile_spec(swin_spec(resolution, depths=(3, 3), clamp=True))
    theirs = timm_swin(resolution, depths=(3, 3))
    for stage, layer in zip(ours.stages, theirs.layers):
        for block, ref in zip(stage.blocks, layer.blocks):
            (key, heads), = block.attn._groups
            assert key == ("swin", tuple(ref.window_size), tuple(ref.shift_size))


@pytest.mark.parametrize("resolution", [32, 40, 28])  # no padding; padding in both stages; an odd second grid
def test_small_swin_loads_timms_weights_and_gives_its_logits(resolution):
    """timm's weights load by name (strictly), the parameter counts agree, and the logits match on the default
    (window partition) and the dense reference paths, at grids with padding and shifted blocks."""
    theirs = timm_swin(resolution)
    ours = compile_spec(swin_spec(resolution)).eval()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    ours.load_state_dict(from_timm(theirs.state_dict(), ours), strict=True)
    x = torch.randn(2, 3, resolution, resolution)
    with torch.no_grad():
        want = theirs(x)
        assert want.std() > 0.05
        assert _max_diff(ours(x), want) <= TOL
        with attention_impl(ours, "dense"):
            assert _max_diff(ours(x), want) <= TOL


def test_training_gradients_are_timms():
    """A training step's gradients (stochastic depth off) equal timm's, tables and qkv biases included (the
    padding keys' k and v are the qkv bias: its gradient sees them)."""
    theirs = timm_swin(40).train()
    ours = compile_spec(swin_spec(40)).train()
    ours.load_state_dict(from_timm(theirs.state_dict(), ours), strict=True)
    x, target = torch.randn(2, 3, 40, 40), torch.tensor([1, 7])
    F.cross_entropy(theirs(x), target).backward()
    F.cross_entropy(ours(x), target).backward()
    grads = {k: p.grad for k, p in theirs.named_parameters()}
    for key, grad in from_timm(grads, ours).items():
        mine = dict(ours.named_parameters())[key].grad
        assert _max_diff(mine, grad) <= 1e-5 * max(1.0, grad.abs().max().item()), key


@pytest.mark.parametrize("resolution", [32, 40])  # grids 8 and 4; 10 and 5, padded to 12 and 8
def test_counts_are_timms_flop_counter(resolution):
    """Parameters per node are timm's modules'.  MACs (torch's FlopCounterMode): where the window divides the grids
    the papers' count (Swin's ``M^2 H W`` pairs per head) is what timm and archspec execute; where timm pads,
    archspec executes its count (the padded windows' pairs) and timm that plus its q/k/v and output projections
    over the padding tokens (``4 C^2`` each), which archspec does not project."""
    theirs = timm_swin(resolution)
    ours = compile_spec(swin_spec(resolution)).eval()
    plan = build_plan(load_spec(swin_spec(resolution)))
    nodes = {n["name"]: n for n in plan.nodes}
    padding = 0
    for i, layer in enumerate(theirs.layers):
        for j, block in enumerate(layer.blocks):
            assert nodes[f"stages.{i}.blocks.{j}"]["params"] == sum(p.numel() for p in block.parameters())
            rows, cols = block.input_resolution
            padded = (-(-rows // block.window_size[0]) * block.window_size[0]) * (
                -(-cols // block.window_size[1]) * block.window_size[1])
            padding += (padded - rows * cols) * 4 * block.attn.dim ** 2
    x = torch.randn(1, 3, resolution, resolution)
    assert plan.totals["macs_executed"] == reference_macs(ours, x)
    assert reference_macs(theirs, x) == plan.totals["macs_executed"] + padding
    assert (padding > 0) == (plan.totals["macs"] < plan.totals["macs_executed"]) == (resolution == 40)


def test_swin_t_counts_are_the_papers():
    """Swin-T: timm's 28,288,354 parameters; 4.49 GMACs (Swin Tab. 1: 4.5G FLOPs)."""
    totals = build_plan(load_spec("swin_tiny_patch4_window7_224")).totals
    assert totals["params"] == 28_288_354
    assert totals["macs"] == totals["macs_executed"] and round(totals["macs"] / 1e9, 2) == 4.49


def test_window_logits_are_windows_in_the_memory_rule():
    """The memory rule keeps ``n_windows (w_h w_w)^2`` logits per window head (padding included), ``N^2`` per
    global one."""
    heads = coerce_heads(["window:4", "window:4", "mhsa"])
    assert logit_elements(heads[0], (10, 10), 0) == 9 * 16 * 16
    assert logit_elements(heads[2], (10, 10), 0) == 100 * 100
    window_layer = AttentionShape(32, coerce_heads(["window:4"] * 2), (16, 16), 0, AttnDims(16, 16), True)
    global_layer = AttentionShape(32, coerce_heads(["mhsa"] * 2), (16, 16), 0, AttnDims(16, 16), True)
    assert rules("attention").memory(window_layer).act < rules("attention").memory(global_layer).act


@pytest.mark.parametrize("heads, grid", [
    (["window:4"] * 2, (8, 8)),
    (["window:4", "mhsa", "mask:3x3", "window:4"], (6, 10)),  # mixed: the SDPA group is unmasked
    (["window:4", "levit_bias", "mhsa", "window:4"], (5, 5)),  # mixed with a bias: the additive mask is built
])
def test_attention_buffer_rule_holds_for_window_layers(heads, grid, one_thread):
    """The rule's buffer bytes equal, to the byte, the layer's buffers plus the caches its first eval forward
    builds (as tests/test_families.py checks the other kinds): a window layer builds no ``(H, N, N)`` term."""
    shape = AttentionShape(32, coerce_heads(heads), grid, 0, AttnDims(8, 8), True)
    module = Attention(32, shape.heads, grid, qk_dim=8, v_dim=8).eval()
    with torch.no_grad():
        module(torch.randn(1, grid[0] * grid[1], 32))
    assert rules("attention").buffers(shape) == eval_buffer_bytes(module)


# ------------------------------------------------------------------------------------------------ mixed layers
def _by_hand(layer: Attention, x: torch.Tensor, window: int, shift: int) -> torch.Tensor:
    """The mixed layer computed head by head without archspec's paths: the window heads through timm's own
    ``SwinTransformerBlock._attn`` (a block holding just those heads' q/k/v rows and table, its projection
    passing their outputs through), the global heads by the plain softmax formula, the MaiT heads by eq. 2 (logits
    outside the 3x3 window set to 0); then archspec's output projection on the heads in order."""
    B, N, C = x.shape
    grid, d, H = layer.grid, layer.qk_dim, layer.num_heads
    q, k = layer.qk(x).view(B, N, 2, H, d).permute(2, 0, 3, 1, 4)
    v = layer.v(x).view(B, N, H, d).transpose(1, 2)
    outs = [None] * H
    window_heads = layer.window_heads
    block = SwinTransformerBlock(dim=C, input_resolution=grid, num_heads=len(window_heads),
                                 head_dim=d, window_size=window, shift_size=shift).eval()
    rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in window_heads])
    with torch.no_grad():
        block.attn.qkv.weight.copy_(torch.cat([layer.qk.weight.view(2, H * d, C)[0][rows],
                                               layer.qk.weight.view(2, H * d, C)[1][rows], layer.v.weight[rows]]))
        block.attn.qkv.bias.copy_(torch.cat([layer.qk.bias.view(2, H * d)[0][rows],
                                             layer.qk.bias.view(2, H * d)[1][rows], layer.v.bias[rows]]))
        block.attn.relative_position_bias_table.copy_(layer.relative_position_bias_table)
        block.attn.proj.weight.copy_(torch.eye(C, len(window_heads) * d))  # the heads' outputs in the first columns
        block.attn.proj.bias.zero_()
    windowed = block._attn(x.view(B, *grid, C))[..., :len(window_heads) * d].reshape(B, N, len(window_heads), d)
    for j, h in enumerate(window_heads):
        outs[h] = windowed[:, :, j]
    rr, cc = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    near = ((rr.flatten()[:, None] - rr.flatten()[None]).abs() <= 1) & ((cc.flatten()[:, None] - cc.flatten()[None])
                                                                        .abs() <= 1)
    for h, spec in enumerate(layer.head_specs):
        if spec.window is None:
            logits = q[:, h] @ k[:, h].transpose(-2, -1) * d ** -0.5
            if spec.mask is not None:  # MaiT eq. 2: M in {0, 1} multiplies the logits
                logits = logits * near
            outs[h] = logits.softmax(-1) @ v[:, h]
    return layer.proj(torch.cat(outs, dim=-1))


@pytest.mark.parametrize("grid, window", [((7, 9), 4), ((8, 8), 4)])
@pytest.mark.parametrize("layer_index", [0, 1])  # W-MSA and SW-MSA
def test_a_layer_mixing_window_global_and_mask_heads(grid, window, layer_index):
    """Window heads beside global and MaiT-mask heads in one layer: the output on the default paths, on the dense
    reference and in training (the per-group projection) equals the head-by-head reference, and gradients flow."""
    heads = [HeadSpec.model_validate(h).at_layer(layer_index) for h in
             [f"window:{window}", "mhsa", f"window:{window}", "mask:3x3", "mhsa"]]
    layer = Attention(40, heads, grid, qk_dim=8, v_dim=8)
    with torch.no_grad():
        layer.relative_position_bias_table.normal_(0, 0.5)
        layer.qk.bias.normal_(0, 0.5)
        layer.v.bias.normal_(0, 0.5)
    x = torch.randn(2, grid[0] * grid[1], 40)
    shift = window // 2 if layer_index % 2 else 0
    keys = [key[0] for key, _ in layer._groups]
    assert "swin" in keys and "sdpa" in keys
    with torch.no_grad():
        want = _by_hand(layer.eval(), x, window, shift)
        assert _max_diff(layer(x), want) <= TOL
        with attention_impl(layer, "dense"):
            assert _max_diff(layer(x), want) <= TOL
    layer.train()
    out = layer(x)
    assert _max_diff(out.detach(), want) <= TOL
    out.square().sum().backward()
    assert layer.relative_position_bias_table.grad.abs().sum() > 0 and layer.qk.weight.grad.abs().sum() > 0


def test_attention_maps_of_window_heads_stay_in_their_windows():
    """``get_attention`` (what ``archspec inspect`` reads): a window head's map is zero outside its window and sums
    to one over the grid's tokens; where no padding is needed it equals the output's weights."""
    layer = Attention(16, ["window:4", "mhsa"], (8, 8)).eval()
    x = torch.randn(1, 64, 16)
    with torch.no_grad():
        probs = layer.get_attention(x)
    rr = torch.arange(64) // 8
    cc = torch.arange(64) % 8
    same_window = (rr[:, None] // 4 == rr[None] // 4) & (cc[:, None] // 4 == cc[None] // 4)
    assert probs[0, 0][~same_window].abs().max() == 0 and probs[0, 1][~same_window].abs().min() > 0
    assert torch.allclose(probs.sum(-1), torch.ones(1, 2, 64), atol=1e-6)
    q, k, v = layer._qkv(x)
    with torch.no_grad():
        assert _max_diff(probs[:, :1] @ v[:, :1], layer._attend(q, k, v)[:, :1]) <= TOL


# ------------------------------------------------------------------------------------------------ checks
def _problem(spec: dict) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(spec)
    return str(info.value)


def test_window_larger_than_the_grid_is_refused_at_the_specs_own_size_and_clamped_at_another():
    """A 4x4 window on a 2x2 grid (16 px): refused as written; the 32 px spec moved to 16 px (compile's
    ``img_size``, timm's ``img_size=``, ``set_input_size``) clamps it, as timm does, and is timm's model there."""
    message = _problem(swin_spec(16))  # grids 4 (the window: fine) and 2
    assert "stages[1].attention.window.size" in message and "stages[0]" not in message
    assert "window 4x4 is larger than the 2x2 token grid" in message and "clamp: true" in message
    moved = with_resolution(load_spec(swin_spec(32)), 16)
    assert moved.stages[0].attention.window.clamp and moved.input.resolution == (16, 16)
    theirs = timm_swin(16)
    ours = compile_spec(swin_spec(32), img_size=16).eval()
    ours.load_state_dict(from_timm(theirs.state_dict(), ours), strict=True)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert _max_diff(ours(x), theirs(x)) <= TOL
    resized = compile_spec(swin_spec(32)).eval()
    resized.set_input_size(16)  # the tables resampled to the clamped window, as timm's set_window_size
    assert {k: v.shape for k, v in resized.state_dict().items()} == {k: v.shape for k, v in ours.state_dict().items()}
    theirs.load_state_dict(to_timm(resized, theirs), strict=True)
    with torch.no_grad():
        assert _max_diff(resized(x), theirs(x)) <= TOL


@pytest.mark.parametrize("change, where, text", [
    ({"attention": {"window": {"size": 4, "shift": 4}}}, "stages[0].attention.window.shift", "shift 4 must be in"),
    ({"attention": "window:4", "layers": [{"range": 1, "heads": ["window:4", "window:2"]}]},
     "stages[0].layers[0].heads[1]", "share one window partition"),
    ({"attention": {"window": {}, "mask": {}}}, "stages[0].attention.window", "composes with no other kind"),
])
def test_window_mistakes_are_located(change, where, text):
    spec = swin_spec(64, window=4)
    spec["stages"][0].update(change)
    message = _problem(spec)
    assert where in message and text in message, message


def test_window_heads_need_a_grid_without_class_token():
    spec = swin_spec(32)
    spec["tokens"] = {"cls_token": "input", "pos_embed": "none"}
    spec["head"] = {"pool": "cls", "num_classes": 10}
    spec["stages"] = spec["stages"][:1]
    message = _problem(spec)
    assert "stages[0].attention.window" in message and "prefix (class/distillation) token" in message


def test_a_window_head_in_a_bottleneck_is_refused():
    spec = {"name": "bot", "input": {"resolution": 64}, "stem": {"kind": "resnet"},
            "stages": [{"kind": "conv", "block": "bottleneck", "depth": 1, "channels": 256,
                        "mixer": {"kind": "attention", "heads": 4, "attention": "window:4"}}]}
    message = _problem(spec)
    assert "stages[0].mixer.attention" in message and "does not run in a bottleneck's attention" in message


# ------------------------------------------------------------------------------------------------ shipped specs
@pytest.mark.slow
@pytest.mark.parametrize("name, size", [("swin_tiny_patch4_window7_224", 224), ("swin_tiny_patch4_window7_224", 256),
                                        ("swin_tiny_patch4_window7_224", 128),
                                        ("swin_base_patch4_window12_384", 384)])
def test_shipped_swin_gives_timms_logits(name, size, real_images):
    """``timm.create_model('archspec_<name>', img_size=...)`` with timm's (random) weights: timm's parameter
    count and logits within 1e-5, at the spec's size, at 256 px (Swin-T: grids 64/32/16/8, padded, the last stage
    shifted), at 128 px (the last stage's window clamped to its 4x4 grid)."""
    torch.manual_seed(0)
    theirs = timm.create_model(name, pretrained=False, img_size=size).eval()
    ours = timm.create_model(f"archspec_{name}", pretrained=False, img_size=size).eval()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    load_timm_weights(ours, theirs)
    x = F.interpolate(real_images, size=(size, size), mode="bilinear")
    with torch.no_grad():
        want = theirs(x)
        assert want.std() > 0.05
        assert _max_diff(ours(x), want) <= TOL


@pytest.mark.slow
def test_archspec_weights_give_the_same_logits_in_timm(real_images):
    ours = archspec.compile("swin_tiny_patch4_window7_224").eval()
    theirs = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False).eval()
    theirs.load_state_dict(to_timm(ours, theirs), strict=True)
    with torch.no_grad():
        assert _max_diff(ours(real_images), theirs(real_images)) <= TOL


# ------------------------------------------------------------------------------------------------ every verb
# A small Swin at 40 px: grids 10 (padded to 12) and 5 (padded to 8), a W-MSA and an SW-MSA block, patch merging.
TINY_SWIN = """\
name: tiny_swin
source: "a small Swin (tests/test_swin.py): the verbs on window heads"
input: {channels: 3, resolution: 40}
stem: {kind: patch, patch_size: 4, norm: layernorm}
tokens: {cls_token: none, pos_embed: none}
stages:
  - {depth: 2, dim: 32, heads: 2, norm_eps: 1.0e-5, attention: "window:4"}
  - {depth: 1, dim: 64, heads: 4, norm_eps: 1.0e-5, attention: "window:4", downsample: patch_merging}
head: {pool: mean, norm: before_pool, num_classes: 10}
"""


@pytest.fixture
def tiny_swin(tmp_path):
    path = tmp_path / "tiny_swin.yaml"
    path.write_text(TINY_SWIN)
    return path


def test_build_of_a_bad_window_exits_2_and_writes_nothing(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text(TINY_SWIN.replace('attention: "window:4"}', 'attention: {window: {size: 16}}}', 1))
    out = tmp_path / "build"
    assert main(["build", str(spec), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{spec}:7:" in err and "stages[0].attention.window.size" in err and "larger than the 10x10" in err
    assert not out.exists()


@pytest.mark.slow
def test_validate_build_and_inspect_a_swin(tiny_swin, tmp_path, capsys):
    """``validate`` shows the window heads, ``build`` writes a model that loads, ``inspect`` reads every window
    layer's attention maps (their locality is finite and each head's map stays inside its window)."""
    assert main(["validate", str(tiny_swin)]) == 0
    assert "W window (Swin W-MSA / SW-MSA)" in capsys.readouterr().out
    build = tmp_path / "b"
    assert main(["build", str(tiny_swin), "--out", str(build), "--repeats", "1", "--json"]) == 0
    capsys.readouterr()
    assert archspec.load(build).spec.stages[0].attention.window.size == (4, 4)
    out = tmp_path / "inspect"
    assert main(["inspect", str(build), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    layers = report["layers"]
    assert [layer["heads"] for layer in layers] == ["W W", "W W", "W W W W"]
    assert all(0 < als <= 1 for layer in layers for als in layer["als"])


@pytest.mark.slow
def test_train_a_few_steps_and_resume(tiny_swin, folder, tmp_path, monkeypatch, capsys):
    """A run stopped before its third step (as SIGTERM stops it) and resumed ends bit for bit where the run that
    was not stopped ends."""

    def train(out, *extra):
        return main(["train", str(tiny_swin), "--data", str(folder), "--out", str(out), "--steps", "4",
                     "--batch-size", "4", "--workers", "0", "--threads", "1", "--checkpoint-every", "1",
                     "--eval-every", "2", "--quiet", *extra])

    assert train(tmp_path / "whole") == 0
    steps = {"n": 0}

    def stop_before_the_third_step():
        steps["n"] += 1
        if steps["n"] == 3:
            raise Terminated()

    monkeypatch.setattr(train_run, "check_together", stop_before_the_third_step)
    assert train(tmp_path / "cut") == 143
    monkeypatch.undo()
    assert not (tmp_path / "cut" / "model").exists()
    assert train(tmp_path / "cut", "--resume") == 0
    whole, cut = (archspec.load(tmp_path / run / "model").state_dict() for run in ("whole", "cut"))
    assert whole.keys() == cut.keys() and all(torch.equal(whole[k], cut[k]) for k in whole)


@pytest.mark.slow
def test_int8_and_onnx_agree_with_eager_on_the_photo(tiny_swin, tmp_path, capsys):
    """int8 (PT2E, calibrated on the three photos) and ONNX Runtime against the float32 model on the photo: the same
    top-1 class; ONNX within 1e-4, int8 within its stated tolerance (the max logit differences are reported in
    docs/benchmarks.md, "Swin")."""
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = archspec.compile(str(tiny_swin)).eval()
    photo, photos = load_image(None, (40, 40), 3), sample_batch((40, 40))
    with torch.no_grad():
        eager = model(photo)
    int8 = quantize(model, [photos], torch_compile=False)
    with torch.no_grad():
        quantized = int8(photo)
    assert quantized.argmax() == eager.argmax()
    assert (quantized - eager).norm() <= 0.2 * eager.norm()
    target = tmp_path / "swin.onnx"
    assert main(["export", str(tiny_swin), "--onnx", str(target), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"]["max_abs_logit_diff"] <= 1e-4 and report["check"]["batch1_max_abs_diff"] <= 1e-4
    onnx = run_onnx(ort_session(target, threads=1), photo)
    assert onnx.argmax() == archspec.compile(str(tiny_swin)).eval()(photo).argmax()


@pytest.mark.slow
def test_torch_compile_equals_eager(tiny_swin):
    """``torch.compile`` (Inductor, CPU) of a Swin with padded and shifted windows gives the eager logits."""
    model = archspec.compile(str(tiny_swin)).eval()
    photo = load_image(None, (40, 40), 3)
    with torch.no_grad():
        eager = model(photo)
        compiled = torch.compile(model)(photo)
    assert _max_diff(compiled, eager) <= 1e-5


# ------------------------------------------------------------------------------------------------ the search
def test_the_swin_space_chooses_kinds_and_window_sizes():
    """``swin_family``: 16 points, per stage a window (size 4 or 8: a parameter only when the window is drawn),
    MaiT's mask or global heads; every point valid, the window points cheapest."""
    space = load_space("swin_family")
    points = list(space.points())
    assert len(points) == 16
    kinds = {tuple(stage.attention.letter for stage in spec.stages) for _, spec in points}
    assert kinds == {(a, b) for a in "WMA" for b in "WMA"}
    sizes = {spec.stages[0].attention.window.size for _, spec in points if spec.stages[0].attention.window}
    assert sizes == {(4, 4), (8, 8)}
    assert space.smallest().stages[0].attention.window.size == (4, 4)


@pytest.mark.slow
def test_archspec_search_runs_on_the_swin_space(tmp_path, capsys):
    """``archspec search --space swin_family`` with the search tests' tiny settings: two candidates proxy-trained
    (on grids the proxy keeps), a best spec that builds."""
    out = tmp_path / "run"
    argv = ["search", "--space", "swin_family", "--out", str(out), "--study-name", "t", "--fidelity", "none",
            "--trials", "2", "--proxy-steps", "3", "--proxy-size", "32", "--proxy-batch", "8", "--max-images", "60",
            "--latency-repeats", "2", "--no-progress", "--json"]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["trained_this_run"] >= 1
    best = load_spec(out / "best.yaml")
    assert best.input.resolution == (64, 64) and len(best.stages) == 2
    assert main(["build", str(out / "best.yaml"), "--out", str(tmp_path / "built"), "--repeats", "1"]) == 0
