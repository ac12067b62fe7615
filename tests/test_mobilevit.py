"""MobileViT-v1 (Mehta & Rastegari 2022) on timm's modules, and the ``grid`` head kind (its pixels of equal offset).

timm's ``mobilevit_xxs`` written as a spec (specs/mobilevit_xxs.yaml) has timm's parameter count and, with every
weight and BatchNorm statistic randomised, timm's logits in both conversion directions, its MACs equal the reference
counter on both models, and its fresh weights follow timm's init; small MobileViTs (timm ``ByobNet`` from its own
``ByoModelCfg``: a map the patch does not divide, a 4x2 patch, a 1x1 patch, GELU without fusion) equal timm's too.  The
grid kind in archspec's ``Attention`` (a token grid, no class token): its partitioned path equals its dense masked
reference and timm's unfold -> ``Attention`` -> fold with the same weights, gradients included, with the MACs stated.
Located errors for a MobileViT block whose heads are not one grid, a width its heads do not divide, an even kernel, a
grid head on a plain ViT (class token) or on a token grid its stride does not tile; every verb (validate, build,
inspect, train and resume, int8, ONNX, torch.compile) on a small MobileViT."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from macs_reference import reference_macs
from test_init import init_problems
from test_resnet import logit_parity
from timm.models.byobnet import ByoBlockCfg, ByobNet, ByoModelCfg
from timm.models.mobilevit import MobileVitBlock
from timm.models.vision_transformer import Attention as TimmAttention
from train_fixtures import train_then_resume
from verb_checks import compiles_in_one_graph, int8_is_close_to_float, onnx_equals_pytorch

import archspec
from archspec.cli import main
from archspec.errors import SpecError, format_path
from archspec.families.attention.heads import coerce_heads
from archspec.families.attention.kinds import grid
from archspec.families.attention.module import Attention
from archspec.families.attention.rules import AttentionShape, AttnDims, executed_macs
from archspec.nn.blocks import attention_impl
from archspec.timm_bridge.convert import to_timm

# A small MobileViT: stem 3 -> 8, an MV2 stage, a strided MV2 stage of two blocks, a MobileViT stage ({block} keys
# added to its mapping, {transformer} its transformer), ByobNet's final 1x1 conv to 32; {res} the input side (the
# MobileViT block's map is an eighth of it); {act} an activation key for the stem and every stage.
TINY = ("name: tiny_mobilevit\ninput: {{resolution: {res}}}\nstem: {{kind: mobilevit, channels: 8{act}}}\nstages:\n"
        "  - {{kind: conv, block: mv2, depth: 1, channels: 8, expansion: 2{act}}}\n"
        "  - {{kind: conv, block: mv2, depth: 2, channels: 16, stride: 2, expansion: 2{act}}}\n"
        "  - {{kind: conv, block: mobilevit, channels: 24, stride: 2, expansion: 2{act}{block},\n"
        "     transformer: {transformer}}}\n"
        "  - {{kind: conv, block: conv_bn_act, channels: 32{act}}}\n"
        "head: {{pool: mean, num_classes: 10}}\n")
TRANSFORMER = "{{dim: 16, depth: 2, heads: 2, attention: {{grid: {{stride: [{ph}, {pw}]}}}}}}"

# (patch, input side, block keys): 2x2 on an 8x8 map; on a 7x7 map (timm resizes it to 8x8 and back); a 4x2 patch;
# a 1x1 patch (attention over every pixel); GELU without the fusion conv, a 5x5 kernel
CASES = [((2, 2), 64, ""), ((2, 2), 56, ""), ((4, 2), 64, ""), ((1, 1), 64, ""),
         ((2, 2), 64, ", act: gelu, fusion: false, kernel: 5")]
GELU = ", act: gelu"


def _tiny(patch: tuple[int, int], res: int, block: str = "") -> str:
    """The small MobileViT; a ``block`` with GELU has it everywhere (timm's ByoModelCfg has one activation)."""
    act = GELU if GELU in block else ""
    return TINY.format(res=res, block=block.replace(GELU, ""), act=act,
                       transformer=TRANSFORMER.format(ph=patch[0], pw=patch[1]))


def _timm_tiny(patch: tuple[int, int], res: int, block: str = "") -> ByobNet:
    """The same network from timm's own config language (mobilevit.py's _inverted_residual_block /
    _mobilevit_block, with the heads and the kernel as block kwargs)."""
    gelu, fused, kernel = GELU in block, "fusion: false" not in block, 5 if "kernel: 5" in block else 3
    def mv2(k: int = 3) -> dict:
        return dict(type="bottle", gs=1, br=2.0, block_kwargs=dict(bottle_in=True, linear_out=True, kernel_size=k))

    cfg = ByoModelCfg(
        blocks=(ByoBlockCfg(d=1, c=8, s=1, **mv2()), ByoBlockCfg(d=2, c=16, s=2, **mv2()),
                (ByoBlockCfg(d=1, c=24, s=2, **mv2(kernel)),
                 ByoBlockCfg(type="mobilevit", d=1, c=24, s=1, block_kwargs=dict(
                     transformer_dim=16, transformer_depth=2, patch_size=patch, num_heads=2, no_fusion=not fused,
                     kernel_size=kernel)))),
        stem_chs=8, stem_type="3x3", stem_pool="", downsample="", act_layer="gelu" if gelu else "silu",
        num_features=32)
    return ByobNet(cfg, num_classes=10)


def _ids(value) -> str:
    return "x".join(map(str, value)) if isinstance(value, tuple) else str(value).strip(", ") or "silu"


@pytest.mark.parametrize("patch, res, block", CASES, ids=_ids)
def test_small_mobilevits_equal_timm_byobnet(patch, res, block, one_thread) -> None:
    ours, reference = archspec.compile(_tiny(patch, res, block)), _timm_tiny(patch, res, block)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters())
    forward, backward = logit_parity(ours, reference, res)
    assert forward <= 1e-5 and backward <= 1e-5, (forward, backward)


@pytest.mark.parametrize("patch, res, block", CASES, ids=_ids)
def test_analysis_equals_module_and_reference_counter(patch, res, block, one_thread) -> None:
    """Parameters; MACs as torch's FlopCounterMode counts them on archspec's model and on timm's (the transformer's
    pairs within each offset's sequence, on the map resized to whole patches)."""
    ours, reference = archspec.compile(_tiny(patch, res, block)).eval(), _timm_tiny(patch, res, block).eval()
    graph, x = ours.analysis.graph, torch.randn(1, 3, res, res)
    assert graph["params"] == sum(p.numel() for p in ours.parameters())
    assert graph["macs"] == graph["macs_executed"] == reference_macs(ours, x) == reference_macs(reference, x)


def test_mobilevit_xxs_params_equal_timm() -> None:
    reference = timm.create_model("mobilevit_xxs", pretrained=False)
    assert archspec.analyze("mobilevit_xxs").params == sum(p.numel() for p in reference.parameters()) == 1_272_024


@pytest.mark.slow  # two 1.3 M-parameter models at 256 px, converted both ways
def test_mobilevit_xxs_logits_equal_timm_both_directions(one_thread) -> None:
    ours, reference = archspec.compile("mobilevit_xxs"), timm.create_model("mobilevit_xxs", pretrained=False)
    forward, backward = logit_parity(ours, reference, 256)
    assert forward <= 1e-5 and backward <= 1e-5, (forward, backward)


@pytest.mark.slow  # FlopCounterMode over a 256 px forward of each
def test_mobilevit_xxs_macs_equal_the_flop_counter_on_both_models(one_thread) -> None:
    x = torch.randn(1, 3, 256, 256)
    ours, reference = archspec.compile("mobilevit_xxs").eval(), timm.create_model("mobilevit_xxs").eval()
    assert archspec.analyze("mobilevit_xxs").macs == reference_macs(ours, x) == reference_macs(reference, x)


def _without_classifier(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if not k.startswith("head.fc.")}


@pytest.mark.slow  # four fresh models
def test_mobilevit_xxs_fresh_weights_follow_timms_init() -> None:
    """tests/test_init.py's rule on every tensor but the classifier: timm ByobNet draws its ``head.fc`` from
    N(0, 0.01) with a zero bias, archspec's conv nets keep timm ResNet's (torch's default), as for halonet26t."""
    states = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        reference = timm.create_model("mobilevit_xxs", pretrained=False)
        ours = archspec.compile(archspec.load_spec("mobilevit_xxs").model_copy(update={"seed": seed}))
        states.append((_without_classifier(reference.state_dict()),
                       _without_classifier(to_timm(ours, reference))))
    (theirs, ours), (theirs_again, ours_again) = states
    problems = init_problems(theirs, theirs_again, ours, ours_again)
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------ the grid kind
def test_residue_classes_and_counts_by_hand() -> None:
    """A 2x4 grid in 2x2 cells: classes (i mod 2) 2 + (j mod 2) row-major.  A 4x4 grid in 2x2 cells: 16 tokens
    against the 4 of their offset, 64 pairs; with d_qk = d_v = 8 the path saves (256 - 64) x 16 = 3072 MACs."""
    assert grid.residue_classes((2, 4), (2, 2)).tolist() == [0, 1, 0, 1, 2, 3, 2, 3]
    assert grid.partitioned_pairs((4, 4), (2, 2)) == 64
    assert grid.path_macs(("grid", (2, 2)), (4, 4), 0, 8, 8) == -3072


def _timm_unfolded(layer: TimmAttention, x: torch.Tensor, rows: int, cols: int, patch: tuple[int, int]):
    """``x`` ``(B, N, C)`` row-major through timm's MobileVitBlock unfold, its ``Attention``, and the fold."""
    (ph, pw), (b, _, c) = patch, x.shape
    seq = x.reshape(b, rows // ph, ph, cols // pw, pw, c).permute(0, 2, 4, 1, 3, 5).reshape(b * ph * pw, -1, c)
    out = layer(seq).reshape(b, ph, pw, rows // ph, cols // pw, c).permute(0, 3, 1, 4, 2, 5)
    return out.reshape(b, rows * cols, c)


@pytest.mark.parametrize("patch, rows, cols", [((2, 2), 4, 6), ((3, 1), 6, 4), ((1, 1), 3, 3)])
def test_grid_path_equals_dense_reference_and_timms_unfold(patch, rows, cols, one_thread) -> None:
    torch.manual_seed(0)
    layer = Attention(24, [{"grid": {"stride": list(patch)}}] * 3, (rows, cols)).double()
    theirs = TimmAttention(24, num_heads=3, qkv_bias=True).double()
    with torch.no_grad():
        theirs.qkv.weight.copy_(torch.cat([layer.qk.weight, layer.v.weight]))
        theirs.qkv.bias.copy_(torch.cat([layer.qk.bias, layer.v.bias]))
        theirs.proj.load_state_dict(layer.proj.state_dict())
    assert layer._groups == [(("grid", patch), [0, 1, 2])]
    x = torch.randn(2, rows * cols, 24, dtype=torch.float64, requires_grad=True)
    fast = layer(x)
    (grad_fast,) = torch.autograd.grad(fast.square().sum(), x)
    with attention_impl(layer, "dense"):
        dense = layer(x)
    (grad_dense,) = torch.autograd.grad(dense.square().sum(), x)
    torch.testing.assert_close(fast, dense, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad_fast, grad_dense, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fast, _timm_unfolded(theirs, x, rows, cols, patch), rtol=1e-10, atol=1e-10)


def test_grid_heads_beside_others_and_composed_with_a_bias(one_thread) -> None:
    """A grid head on its path beside a global head and a grid composed with LeViT's bias (SDPA with -inf in its
    mask) equal the dense reference; the layer's executed MACs are what the reference counter counts on the
    default paths (the grid head's N^2 / 4 pairs)."""
    heads = coerce_heads(["grid:2x2", "mhsa", {"grid": {"stride": 2}, "rel_bias": {}}])
    shape = AttentionShape(24, heads, (4, 4), 0, AttnDims(8, 8), True)
    torch.manual_seed(0)
    layer = Attention(24, heads, (4, 4)).eval()
    with torch.no_grad():
        layer.attention_biases.normal_()
    x = torch.randn(2, 16, 24)
    assert [key[0] for key, _ in layer._groups] == ["grid", "sdpa"]
    with torch.no_grad():
        fast = layer(x)
        with attention_impl(layer, "dense"):
            dense = layer(x)
    torch.testing.assert_close(fast, dense, rtol=1e-5, atol=1e-6)
    assert executed_macs(shape) == reference_macs(layer, x[:1])


def test_mobilevit_probabilities_reproduce_the_layer(one_thread) -> None:
    """The inspected map of each transformer layer of a MobileViT block (scattered on the block's pixels, 0 across
    offsets, rows summing to 1) times the values, projected, is the layer's own output; on a map timm resizes."""
    from archspec.diagnostics.metrics import attention_layers

    torch.manual_seed(0)
    block = MobileVitBlock(8, 8, transformer_dim=16, transformer_depth=2, patch_size=(2, 2), num_heads=2).eval()
    seen = {}
    block.transformer[1].attn.register_forward_hook(lambda mod, args, out: seen.update(x=args[0], out=out))
    found = attention_layers(block, torch.randn(2, 8, 7, 6))
    assert list(found) == ["transformer.0.attn", "transformer.1.attn"]
    layer = found["transformer.1.attn"]
    assert layer.grid == (8, 6) and layer.letters == "O O" and layer.attn.shape == (2, 2, 48, 48)
    torch.testing.assert_close(layer.attn.sum(-1), torch.ones(2, 2, 48))
    classes = grid.residue_classes((8, 6), (2, 2))
    assert (layer.attn[..., classes[:, None] != classes[None, :]] == 0).all()
    attn, x = block.transformer[1].attn, seen["x"]  # (B P, N, D): 4 offsets of 12 patches
    v = attn.qkv(x)[..., 32:].reshape(2, 2, 2, 4, 3, 16).permute(0, 3, 1, 4, 2, 5).reshape(2, 48, 16)
    out = layer.attn @ v.reshape(2, 48, 2, 8).transpose(1, 2)
    expected = seen["out"].reshape(2, 2, 2, 4, 3, 16).permute(0, 3, 1, 4, 2, 5).reshape(2, 48, 16)
    torch.testing.assert_close(attn.proj(out.transpose(1, 2).reshape(2, 48, 16)), expected, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("transformer, path, text", [
    ("{dim: 16, depth: 1, heads: 2, attention: mhsa}", "stages[2].transformer.attention", "heads are one grid"),
    ("{dim: 16, depth: 1, heads: 2, attention: {grid: {}, rel_bias: {}}}", "stages[2].transformer.attention",
     "heads are one grid"),
    ("{dim: 18, depth: 1, heads: 4}", "stages[2].transformer.heads", "not divisible by 4 heads"),
    ("{dim: 16, depth: 1, heads: 2, attention: 'grid:2x'}", "stages[2].transformer.attention", "2x2"),
    ("{dim: 16, depth: 1, mlp_ratio: 0.01}", "stages[2].transformer.mlp_ratio", "is 0"),
])
def test_located_errors(transformer: str, path: str, text: str, tmp_path) -> None:
    source = tmp_path / "t.yaml"
    source.write_text(TINY.format(res=64, block="", act="", transformer=transformer), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        archspec.load_spec(source)
    problems = [p for p in info.value.problems if text in p.message or text in (p.hint or "")]
    assert problems, [str(p) for p in info.value.problems]
    assert format_path(problems[0].path).startswith(path) and problems[0].file == str(source)
    assert problems[0].line == 8 and problems[0].column is not None and problems[0].hint


@pytest.mark.parametrize("stage, path, text", [
    ({"depth": 1, "dim": 16, "heads": 2, "attention": "grid"}, "stages[0].attention", "sits on no grid"),
    ({"depth": 1, "dim": 16, "heads": 2, "attention": "grid:2x2", "layers": [{"range": 0, "heads": [
        "mhsa", "grid:3x2"]}]}, "stages[0].layers[0].heads[1].grid.stride", "does not tile the 5x5 token grid"),
])
def test_grid_heads_on_token_stages_are_checked(stage: dict, path: str, text: str) -> None:
    """A plain ViT (class token) has no grid to partition; a stride must tile the grid (only MobileViT's block
    resizes its map)."""
    tokens = {} if "sits" in text else {"tokens": {"cls_token": "none"}, "head": {"pool": "mean"}}
    with pytest.raises(SpecError, match=text) as info:
        archspec.load_spec({"input": {"resolution": 40}, "stem": {"kind": "patch", "patch_size": 8},
                            "stages": [stage], **tokens})
    assert any(format_path(p.path) == path and text in p.message and p.hint for p in info.value.problems)


def test_a_grid_stage_without_a_class_token_builds() -> None:
    """A token stage from the stem with grid heads (no class token, mean pool) is a valid model: the partition
    tiles the 4x4 grid."""
    model = archspec.compile({"input": {"resolution": 32}, "stem": {"kind": "patch", "patch_size": 8},
                              "tokens": {"cls_token": "none"}, "head": {"pool": "mean", "num_classes": 3},
                              "stages": [{"depth": 1, "dim": 16, "heads": 2, "attention": "grid:2x2"}]})
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)


@pytest.mark.parametrize("line, text", [
    ("  - {kind: conv, block: mobilevit, channels: 24, stride: 2, kernel: 4, transformer: {dim: 16, depth: 1}}",
     "kernel 4 is even"),
    ("  - {kind: conv, block: mobilevitt, channels: 24}", "mobilevit or conv_bn_act"),
])
def test_stage_field_errors_exit_2_with_file_line_column_and_hint(line: str, text: str, tmp_path, capsys) -> None:
    lines = _tiny((2, 2), 64).splitlines()
    lines[6:8] = [line]
    source = tmp_path / "bad.yaml"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "build"
    for argv in (["validate", str(source)], ["build", str(source), "--out", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{source}:7:" in err and "stages[2]" in err and text in err and "hint:" in err
        assert "Traceback" not in err
    assert not out.exists()


def test_cli_refuses_a_non_grid_mobilevit_block_and_writes_nothing(tmp_path, capsys) -> None:
    source = tmp_path / "bad.yaml"
    source.write_text(TINY.format(res=64, block="", act="", transformer="{dim: 16, depth: 1, attention: halo}"),
                      encoding="utf-8")
    out = tmp_path / "build"
    assert main(["build", str(source), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{source}:8:" in err and "stages[2].transformer.attention" in err and "hint:" in err
    assert not out.exists()


def test_shipped_mobilevit_xxs_at_224_px_resizes_as_timm(one_thread) -> None:
    """224 px leaves a 7x7 map in the last stage: timm's block resizes it to 8x8 for its 2x2 patches, which the
    counts follow (the transformer on 64 pixels)."""
    plan = archspec.analyze(archspec.load_spec("mobilevit_xxs").model_copy(
        update={"input": archspec.load_spec("mobilevit_xxs").input.model_copy(update={"resolution": (224, 224)})}))
    reference = timm.create_model("mobilevit_xxs").eval()
    assert plan.macs == reference_macs(reference, torch.randn(1, 3, 224, 224))


# ------------------------------------------------------------------------------------------------ every verb
def _randomised_tiny() -> torch.nn.Module:
    from test_fuse import _randomise_batchnorms

    torch.manual_seed(0)
    return _randomise_batchnorms(archspec.compile(_tiny((2, 2), 64))).eval()


@pytest.mark.slow  # a build and an inspect: seconds
def test_build_and_inspect_a_small_mobilevit(tmp_path, capsys, one_thread) -> None:
    source = tmp_path / "tiny_mobilevit.yaml"
    source.write_text(_tiny((2, 2), 64), encoding="utf-8")
    assert main(["build", str(source), "--out", str(tmp_path / "b")]) == 0
    model = archspec.load(tmp_path / "b")
    assert sum(p.numel() for p in model.parameters()) == archspec.analyze(source).params
    capsys.readouterr()
    assert main(["inspect", str(source), "--out", str(tmp_path / "i"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [row["name"] for row in report["layers"]] == [f"stages.2.blocks.1.transformer.{i}.attn" for i in (0, 1)]
    assert report["layers"][0]["heads"] == "O O" and all(0 <= v <= 1 for v in report["layers"][0]["als"])


@pytest.mark.slow  # two short training runs
def test_train_and_resume_a_small_mobilevit(tmp_path, one_thread) -> None:
    source = tmp_path / "tiny_mobilevit.yaml"
    source.write_text(_tiny((2, 2), 64), encoding="utf-8")
    assert train_then_resume(source, tmp_path)["steps"] == 4


@pytest.mark.slow  # PT2E quantisation: seconds
def test_int8_of_a_small_mobilevit_is_close_to_float(one_thread) -> None:
    int8_is_close_to_float(_randomised_tiny(), (64, 64))


@pytest.mark.slow  # the dynamo ONNX exporter: seconds
def test_onnx_of_a_small_mobilevit_equals_pytorch(tmp_path, one_thread) -> None:
    onnx_equals_pytorch(_randomised_tiny(), (64, 64), tmp_path / "m.onnx")


@pytest.mark.slow  # Dynamo's trace of the whole model (no graph break in timm's MobileVitBlock)
def test_torch_compile_traces_a_small_mobilevit_in_one_graph(one_thread) -> None:
    compiles_in_one_graph(_randomised_tiny(), (64, 64))
