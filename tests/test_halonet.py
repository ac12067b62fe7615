"""HaloNet's blocked local attention with a halo (Vaswani et al. 2021) inside bottlenecks, on timm's ``HaloAttn``.

timm's ``halonet26t`` written as a spec (specs/halonet26t.yaml) has timm's parameter count and, with every weight and
BatchNorm statistic randomised, timm's logits in both conversion directions, and its fresh weights follow timm's
init; small HaloNets (timm ``ByobNet`` from a ``ByoModelCfg``: strided query blocks, an odd block's pooled stride,
``qk_ratio`` and ``dim_head``) equal timm's too, and ``analyze`` equals the module's parameters and the independent
MAC counter (torch's FlopCounterMode: every block's queries against its whole window); located errors for a halo
wider than its block, a block that does not tile the map, a halo on a token stage and mixed layers; every verb
(validate, build, inspect, train and resume, int8, ONNX, torch.compile) on a small HaloNet."""

from __future__ import annotations

import json

import pytest
import timm
import torch
from macs_reference import reference_macs
from test_init import init_problems
from test_resnet import logit_parity
from timm.models.byobnet import ByoBlockCfg, ByobNet, ByoModelCfg
from train_fixtures import train_then_resume
from verb_checks import compiles_in_one_graph, int8_is_close_to_float, onnx_equals_pytorch

import archspec
from archspec.cli import main
from archspec.errors import SpecError, format_path
from archspec.families.attention.kinds import halo
from archspec.timm_bridge.convert import to_timm

# A small HaloNet: tiered stem 3 -> 12 -> 16 -> 32, a bottleneck stage, then a strided stage of two halo blocks
# with 4 heads (inner width 32); {halo} is the halo mapping, {res} the input side (the map at the halo stage is a
# quarter of it).
TINY = ("name: tiny_halo\ninput: {{resolution: {res}}}\nstem: {{kind: resnet, deep: true, widths: [12, 16], "
        "channels: 32}}\ntokens: {{cls_token: none, pos_embed: none}}\nstages:\n"
        "  - {{kind: conv, block: bottleneck, depth: 1, channels: 64}}\n"
        "  - {{kind: conv, block: bottleneck, depth: 2, channels: 128, stride: 2, mixer: {mixer}}}\n"
        "head: {{pool: mean, num_classes: 10}}\n")
MIXER = "{{kind: attention, heads: 4, attention: {{halo: {halo}}}}}"

# (halo mapping, input side): strided query blocks (b = 4 on 16x16, 2x2 queries a block); an odd block (b = 3 on
# 12x12: attention at stride 1, then a 2x2 average pool); qk_ratio; dim_head with a halo as wide as the block
CASES = [
    ({"block_size": 4, "halo_size": 1}, 64),
    ({"block_size": 3, "halo_size": 1}, 48),
    ({"block_size": 4, "halo_size": 2, "qk_ratio": 0.5}, 64),
    ({"block_size": 2, "halo_size": 2, "dim_head": 6}, 32),
]


def _yaml(mapping: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in mapping.items()) + "}"


def _tiny(halo_spec: dict, res: int) -> str:
    return TINY.format(res=res, mixer=MIXER.format(halo=_yaml(halo_spec)))


def _timm_tiny(halo_spec: dict, res: int) -> ByobNet:
    """The same network from timm's own config language (byoanet.py's halonet cfgs, scaled down)."""
    cfg = ByoModelCfg(
        blocks=(ByoBlockCfg(type="bottle", d=1, c=64, s=1, gs=0, br=0.25),
                ByoBlockCfg(type="self_attn", d=2, c=128, s=2, gs=0, br=0.25)),
        stem_chs=32, stem_type="tiered", stem_pool="maxpool", self_attn_layer="halo",
        self_attn_kwargs=dict(num_heads=4, **halo_spec))
    return ByobNet(cfg, num_classes=10, img_size=res)


@pytest.mark.parametrize("halo_spec, res", CASES, ids=lambda v: _yaml(v) if isinstance(v, dict) else str(v))
def test_small_halonets_equal_timm_byobnet(halo_spec: dict, res: int, one_thread) -> None:
    ours, reference = archspec.compile(_tiny(halo_spec, res)), _timm_tiny(halo_spec, res)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters())
    forward, backward = logit_parity(ours, reference, res)
    assert forward <= 1e-5 and backward <= 1e-5, (forward, backward)


@pytest.mark.parametrize("halo_spec, res", CASES, ids=lambda v: _yaml(v) if isinstance(v, dict) else str(v))
def test_analysis_equals_module_and_reference_counter(halo_spec: dict, res: int, one_thread) -> None:
    model = archspec.compile(_tiny(halo_spec, res)).eval()
    graph = model.analysis.graph
    assert graph["params"] == sum(p.numel() for p in model.parameters())
    assert graph["macs"] == graph["macs_executed"] == reference_macs(model, torch.randn(1, 3, res, res))


def test_layer_counts_by_hand() -> None:
    """C = 16, 2 heads, a 4x4 map, b = 2, h = 1: d_qk = d_v = 8, 4 blocks of 4 queries, 4x4 = 16 keys each.
    Params: q 16 x 16 + kv 16 x 32 + two 7-row tables of 8 = 256 + 512 + 112 = 880.  MACs: q 16 px x 256 = 4096,
    kv 16 px x 512 = 8192, pairs 2 heads x 16 queries x 16 keys x (8 + 8) = 8192, relative logits 2 x 16 x 2 x 7 x 8
    = 3584: 24064.  Strided (b = 2 -> 1 query a block): q 4 px x 256 = 1024, pairs 2 x 4 x 16 x 16 = 2048,
    relative 2 x 4 x 2 x 7 x 8 = 896: 12160."""
    spec = halo.HaloSpec(block_size=2, halo_size=1)
    assert halo.layer_counts(spec, 16, 2, (4, 4)) == (880, 24064)
    assert halo.layer_counts(spec, 16, 2, (4, 4), stride=2) == (880, 12160)


def test_halonet26t_params_equal_timm() -> None:
    reference = timm.create_model("halonet26t", pretrained=False)
    assert archspec.analyze("halonet26t").params == sum(p.numel() for p in reference.parameters()) == 12_480_288


@pytest.mark.slow  # two 12 M-parameter models at 256 px, converted both ways: seconds
def test_halonet26t_logits_equal_timm_both_directions(one_thread) -> None:
    ours, reference = archspec.compile("halonet26t"), timm.create_model("halonet26t", pretrained=False)
    forward, backward = logit_parity(ours, reference, 256)
    assert forward <= 1e-5 and backward <= 1e-5, (forward, backward)


@pytest.mark.slow  # FlopCounterMode over a 256 px forward of each
def test_halonet26t_macs_equal_the_flop_counter_on_both_models(one_thread) -> None:
    x = torch.randn(1, 3, 256, 256)
    ours, reference = archspec.compile("halonet26t").eval(), timm.create_model("halonet26t").eval()
    assert archspec.analyze("halonet26t").macs == reference_macs(ours, x) == reference_macs(reference, x)


def test_fuse_folds_all_but_the_batchnorms_after_haloattn(one_thread) -> None:
    """HaloAttn has no output projection: its bn2 stays (one a halo block), every other BatchNorm folds; same logits."""
    from archspec.nn.fuse import count_batchnorms

    model = _randomised_tiny()
    folded = model.fuse()
    x = torch.randn(2, 3, 64, 64)
    assert count_batchnorms(folded) == 2
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), rtol=1e-5, atol=1e-5)


def _without_classifier(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in state.items() if not k.startswith("head.fc.")}


@pytest.mark.slow  # four fresh 12 M-parameter models
def test_halonet26t_fresh_weights_follow_timms_init() -> None:
    """tests/test_init.py's rule on every tensor but the classifier: timm ByobNet draws its ``head.fc`` from
    N(0, 0.01) with a zero bias, archspec's conv nets keep timm ResNet's (torch's default), as for botnet26t."""
    states = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        reference = timm.create_model("halonet26t", pretrained=False)
        ours = archspec.compile(archspec.load_spec("halonet26t").model_copy(update={"seed": seed}))
        states.append((_without_classifier(reference.state_dict()),
                       _without_classifier(to_timm(ours, reference))))
    (theirs, ours), (theirs_again, ours_again) = states
    problems = init_problems(theirs, theirs_again, ours, ours_again)
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("mixer, path, text", [
    ("{kind: attention, heads: 4, attention: {halo: {block_size: 4, halo_size: 5}}}", "stages[1].mixer.attention.halo",
     "halo_size 5 is larger than block_size 4"),
    ("{kind: attention, heads: 4, attention: {halo: {block_size: 3}}}", "stages[1].mixer.attention",
     "block_size 3 does not divide the 16x16 map"),
    ("{kind: attention, heads: 2, head_kinds: [halo, botnet_rel]}", "stages[1].mixer.head_kinds",
     "every head is halo"),
    ("{kind: attention, heads: 2, head_kinds: [{halo: {}, rel_bias: {}}, halo]}", "stages[1].mixer.head_kinds",
     "every head is halo"),
    ("{kind: attention, heads: 2, head_kinds: [halo, {halo: {halo_size: 2}}]}", "stages[1].mixer.head_kinds",
     "the same halo"),
    ("{kind: attention, heads: 2, attention: 'halo:8'}", "stages[1].mixer.attention", "as a mapping"),
])
def test_located_errors(mixer: str, path: str, text: str, tmp_path) -> None:
    source = tmp_path / "t.yaml"
    source.write_text(TINY.format(res=64, mixer=mixer), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        archspec.load_spec(source)
    problems = [p for p in info.value.problems if text in p.message or text in (p.hint or "")]
    assert problems, [str(p) for p in info.value.problems]
    assert format_path(problems[0].path).startswith(path) and problems[0].file == str(source)
    assert problems[0].line == 7 and problems[0].column is not None and problems[0].hint


def test_halo_on_a_token_stage_is_refused() -> None:
    with pytest.raises(SpecError, match="inside a bottleneck's attention mixer only") as info:
        archspec.load_spec({"input": {"resolution": 32}, "stem": {"kind": "patch", "patch_size": 8},
                            "stages": [{"depth": 1, "dim": 16, "heads": 2, "attention": "halo"}]})
    assert format_path(info.value.problems[0].path) == "stages[0].attention"


@pytest.mark.parametrize("mixer, text", [
    ("{kind: attention, heads: 4, attention: {halo: {block_size: 2, halo_size: 3}}}", "larger than block_size"),
    ("{kind: attention, heads: 4, attention: {halo: {block_size: 5, halo_size: 1}}}", "does not divide"),
])
def test_cli_exits_2_with_file_line_column_field_and_hint_and_writes_nothing(mixer, text, tmp_path, capsys) -> None:
    source = tmp_path / "bad.yaml"
    source.write_text(TINY.format(res=64, mixer=mixer), encoding="utf-8")
    out = tmp_path / "build"
    for argv in (["validate", str(source)], ["build", str(source), "--out", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{source}:7:" in err and "stages[1].mixer.attention" in err and text in err and "hint:" in err
        assert "Traceback" not in err
    assert not out.exists()


def test_shipped_halonet26t_at_224_px_is_refused_with_a_hint(capsys) -> None:
    """halonet26t's 8x8 blocks need maps that are multiples of 8: 224 px leaves 14x14 and 7x7."""
    assert main(["validate", "halonet26t", "--resolution", "224"]) == 2
    err = capsys.readouterr().err
    assert "does not divide the 14x14 map" in err and "does not divide the 7x7 map" in err and "hint:" in err


# ------------------------------------------------------------------------------------------------ every verb
def _randomised_tiny() -> torch.nn.Module:
    from test_fuse import _randomise_batchnorms

    torch.manual_seed(0)
    return _randomise_batchnorms(archspec.compile(_tiny({"block_size": 4, "halo_size": 1}, 64))).eval()


@pytest.mark.slow  # a build and an inspect: seconds
def test_build_and_inspect_a_small_halonet(tmp_path, capsys, one_thread) -> None:
    source = tmp_path / "tiny_halo.yaml"
    source.write_text(_tiny({"block_size": 4, "halo_size": 1}, 64), encoding="utf-8")
    assert main(["build", str(source), "--out", str(tmp_path / "b")]) == 0
    model = archspec.load(tmp_path / "b")
    assert sum(p.numel() for p in model.parameters()) == archspec.analyze(source).params
    capsys.readouterr()
    assert main(["inspect", str(source), "--out", str(tmp_path / "i"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    # the strided first block's queries are every other pixel of a block: only the second is read
    assert [row["name"] for row in report["layers"]] == ["stages.1.blocks.1.conv2"]
    assert report["layers"][0]["heads"] == "H H H H" and all(0 <= v <= 1 for v in report["layers"][0]["als"])


def test_halo_probabilities_reproduce_the_layer(one_thread) -> None:
    """The inspected map (dense, padding left out) times the values is HaloAttn's own output, for unstrided and
    pooled (odd block, stride 2) layers; a strided one has no square map."""
    from timm.layers.halo_attn import HaloAttn

    from archspec.diagnostics.metrics import halo_attention

    torch.manual_seed(0)
    for block, size, h, w, stride in [(4, 1, 8, 12, 1), (3, 1, 6, 6, 2), (2, 2, 4, 6, 1)]:
        layer = HaloAttn(16, 16, num_heads=2, block_size=block, halo_size=size, stride=stride).eval()
        x = torch.randn(2, 16, h, w)
        with torch.no_grad():
            attn = halo_attention(layer, x).reshape(4, h * w, h * w)
            v = layer.kv(x).reshape(4, -1, h * w)[:, layer.dim_head_qk:].transpose(-1, -2)
            out = (attn @ v).transpose(-1, -2).reshape(2, 16, h, w)
            torch.testing.assert_close(layer.pool(out), layer(x), rtol=1e-5, atol=1e-6)
        assert (attn.sum(-1) <= 1 + 1e-6).all() and (attn > 0).sum(-1).max() <= (block + 2 * size) ** 2
    with pytest.raises(ValueError, match="strided"):
        halo_attention(HaloAttn(16, 16, num_heads=2, block_size=4, halo_size=1, stride=2), torch.randn(1, 16, 8, 8))


@pytest.mark.slow  # two short training runs
def test_train_and_resume_a_small_halonet(tmp_path, one_thread) -> None:
    source = tmp_path / "tiny_halonet.yaml"
    source.write_text(_tiny({"block_size": 4, "halo_size": 1}, 64), encoding="utf-8")
    assert train_then_resume(source, tmp_path)["steps"] == 4


@pytest.mark.slow  # PT2E quantisation: seconds
def test_int8_of_a_small_halonet_is_close_to_float(one_thread) -> None:
    int8_is_close_to_float(_randomised_tiny(), (64, 64))


@pytest.mark.slow  # the dynamo ONNX exporter: seconds
def test_onnx_of_a_small_halonet_equals_pytorch(tmp_path, one_thread) -> None:
    onnx_equals_pytorch(_randomised_tiny(), (64, 64), tmp_path / "h.onnx")


@pytest.mark.slow  # Dynamo's trace of the whole model (no graph break in timm's HaloAttn)
def test_torch_compile_traces_a_small_halonet_in_one_graph(one_thread) -> None:
    compiles_in_one_graph(_randomised_tiny(), (64, 64))
