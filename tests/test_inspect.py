"""`archspec inspect SPEC|DIR`: the four diagnostics on the shipped photos, as PNG plots and JSON, under
builddir's output rules (fill missing/empty, replace its own output, refuse anything else)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from archspec.cli import main
from archspec.diagnostics.inspection import INSPECT
from archspec.io.images import default_image_path

PNG = b"\x89PNG\r\n\x1a\n"

# A tiny Masked CaiT (4x4 grid, 2 talking-heads blocks, 1 class-attention block) and a tiny ConViT-like spec.
TINY_CAIT = {
    "name": "tiny_cait", "input": {"channels": 3, "resolution": 32}, "stem": {"kind": "patch", "patch_size": 8},
    "tokens": {"cls_token": 2},
    "stages": [{"depth": 2, "dim": 32, "heads": 4, "layer_scale": 1e-5, "talking_heads": True, "attention": "mhsa",
                "layers": [{"range": "0-1", "heads": ["mask:3x3", "mhsa", "mhsa", "mhsa"]}]}],
    "class_attention": {"depth": 1}, "head": {"num_classes": 10},
}
TINY_GPSA = {
    "name": "tiny_gpsa", "input": {"channels": 3, "resolution": 32}, "stem": {"kind": "patch", "patch_size": 8},
    "tokens": {"cls_token": 1},
    "stages": [{"depth": 2, "dim": 32, "heads": 4, "attention": "mhsa",
                "layers": [{"range": "0", "attention": "gpsa"}]}],
    "head": {"num_classes": 10},
}


def _write(tmp_path, doc) -> str:
    path = tmp_path / f"{doc['name']}.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return str(path)


@pytest.mark.slow
def test_inspect_writes_four_plots_and_the_numbers(tmp_path, capsys, one_thread):
    out = tmp_path / "out"
    assert main(["inspect", _write(tmp_path, TINY_CAIT), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {p.name for p in out.iterdir()} == INSPECT.files
    for name in ("als.png", "nonlocality.png", "gating.png", "similarity.png"):
        assert (out / name).read_bytes().startswith(PNG)
    assert json.loads((out / "inspect.json").read_text()) == report and "archspec_build" in report  # the marker
    assert len(report["images"]) == 3 and "grace_hopper" in report["images"][0]
    layers = report["layers"]
    assert [row["name"] for row in layers] == ["stages.0.blocks.0.attn", "stages.0.blocks.1.attn"]
    for row in layers:  # 4 heads; ALS a fraction, nonlocality within the grid's diameter, no GPSA
        assert row["heads"] == "M A A A" and row["gating"] is None
        assert all(0 <= v <= 1 for v in row["als"]) and all(0 <= v <= math.hypot(3, 3) for v in row["nonlocality"])
    (run,) = report["similarity"]
    assert run["layers"] == [row["name"] for row in layers]
    assert len(run["per_head"]) == 4 and all(abs(h[0][0] - 1) < 1e-5 for h in run["per_head"])


@pytest.mark.slow
def test_inspect_reports_gpsa_gating_and_takes_an_image(tmp_path, capsys, one_thread):
    out = tmp_path / "g"
    assert main(["inspect", _write(tmp_path, TINY_GPSA), "--out", str(out), "--image", str(default_image_path()),
                 "--window", "3x5", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["images"] == [str(default_image_path())] and report["window"] == [3, 5]
    gpsa, mhsa = report["layers"]
    assert gpsa["gating"] == pytest.approx([1 / (1 + math.exp(-1))] * 4, abs=1e-6)  # ConViT init lambda = 1
    assert mhsa["gating"] is None
    # the class token enters at block 1: the two layers are compared on their patch blocks
    assert report["similarity"][0]["layers"] == [gpsa["name"], mhsa["name"]]


@pytest.mark.slow
def test_inspect_a_build_directory_and_replace_its_own_output(tmp_path, capsys, one_thread):
    spec = _write(tmp_path, TINY_CAIT)
    assert main(["build", spec, "--out", str(tmp_path / "b"), "--repeats", "1", "--json"]) == 0
    capsys.readouterr()
    out = tmp_path / "i"
    assert main(["inspect", str(tmp_path / "b"), "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == f"weights of {tmp_path / 'b'}"
    assert main(["inspect", spec, "--out", str(out)]) == 0  # an earlier inspect output is replaced
    assert "random initialisation" in json.loads((out / "inspect.json").read_text())["model"]


@pytest.mark.parametrize("setup, argv_tail, message", [
    ("foreign", [], "not an empty directory"),
    (None, ["--allow-spec-change"], "applies only to a build directory"),
    (None, ["--window", "2x2"], "odd window"),
])
def test_inspect_mistakes_exit_2_and_write_nothing(tmp_path, capsys, setup, argv_tail, message):
    out = tmp_path / "out"
    if setup == "foreign":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    assert main(["inspect", _write(tmp_path, TINY_CAIT), "--out", str(out), *argv_tail]) == 2
    assert message in capsys.readouterr().err
    if setup == "foreign":
        assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "mine"
    else:
        assert not out.exists()


def test_inspect_a_model_without_attention_is_a_located_error(tmp_path, capsys):
    doc = {"name": "conv_only", "input": {"channels": 3, "resolution": 32}, "stem": {"kind": "patch", "patch_size": 8},
           "tokens": {"cls_token": "none"}, "stages": [{"depth": 1, "dim": 32, "heads": 4, "mixer": "token_conv3"}],
           "head": {"pool": "mean", "num_classes": 10}}
    assert main(["inspect", _write(tmp_path, doc), "--out", str(tmp_path / "o")]) == 2
    assert "no self-attention layer" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_inspect_a_shipped_spec_on_the_real_photos(tmp_path, capsys, one_thread):
    """ConViT-Ti at random init: its GPSA layers start local (ConViT sec. 3, locality init), its last two
    plain MHSA layers nearly uniform, and every gating sigmoid(lambda = 1) = 0.731."""
    import math

    out = tmp_path / "o"
    assert main(["inspect", "convit_tiny", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in out.iterdir()) == ["als.png", "gating.png", "inspect.json", "nonlocality.png",
                                                    "similarity.png"]
    layers = report["layers"]
    assert len(layers) == 12 and all(row["heads"] == "P P P P" for row in layers[:10])
    uniform = 9 / 197  # a 3x3 window over 196 patches and the class token
    assert all(min(row["als"]) > 0.5 for row in layers[:10])
    assert all(max(row["als"]) < 2 * uniform for row in layers[10:])
    assert all(g == pytest.approx(1 / (1 + math.exp(-1)), abs=1e-6) for row in layers[:10] for g in row["gating"])


@pytest.mark.slow
def test_plots_use_fixed_scales_and_whole_layer_ticks(tmp_path, capsys, monkeypatch, one_thread):
    """ALS on [0, 1], nonlocality from 0 (with uniform attention drawn), similarity ticks on whole layers."""
    from matplotlib.figure import Figure

    saved = {}
    real_savefig = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: (saved.__setitem__(Path(path).name, fig),
                                                                    real_savefig(fig, path, **kw)))
    assert main(["inspect", _write(tmp_path, TINY_CAIT), "--out", str(tmp_path / "out")]) == 0
    als, = saved["als.png"].axes
    nonlocal_, = saved["nonlocality.png"].axes
    assert als.get_ylim() == (0, 1)
    assert nonlocal_.get_ylim()[0] == 0 and nonlocal_.get_ylim()[1] > 1.0  # a 4x4 grid: uniform attention ~1.9
    for ax in saved["similarity.png"].axes[:-1]:  # the last axes is the colour bar
        ticks = [*ax.get_xticks(), *ax.get_yticks()]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


# A tiny hybrid with attention inside bottlenecks: T-CNN's GPSA (stage 0, 16x16 map), BoTNet's relative-logit
# heads (timm BottleneckAttn, stage 1 at stride 2: attention on 16x16, then pooled) and a mixed MHSA + GPSA layer
# (archspec's Attention on the pixels, stage 2 on 8x8).
TINY_BOT = {
    "name": "tiny_bot", "input": {"channels": 3, "resolution": 64}, "stem": {"kind": "resnet", "channels": 16},
    "tokens": {"cls_token": "none", "pos_embed": "none"},
    "stages": [{"kind": "conv", "block": "bottleneck", "depth": 1, "channels": 32, "mixer": {"kind": "gpsa"}},
               {"kind": "conv", "block": "bottleneck", "depth": 1, "channels": 32, "stride": 2,
                "mixer": {"kind": "attention", "heads": 2}},
               {"kind": "conv", "block": "bottleneck", "depth": 1, "channels": 32,
                "mixer": {"kind": "attention", "heads": 2, "head_kinds": ["mhsa", "gpsa"]}}],
    "head": {"pool": "mean", "num_classes": 10},
}


def test_attention_inside_bottlenecks_is_diagnosed(one_thread):
    """Every kind of bottleneck attention gives a square map on its pixels: BoTNet's probabilities reproduce timm
    BottleneckAttn's output (attn @ v), T-CNN's GPSA and the mixed layer report their gating."""
    import torch

    from archspec import compile
    from archspec.diagnostics.inspection import diagnose
    from archspec.diagnostics.metrics import attention_layers, bottleneck_attention

    model = compile(TINY_BOT).eval()
    x = torch.randn(2, 3, 64, 64)
    layers = attention_layers(model, x)
    assert list(layers) == ["stages.0.blocks.0.conv2", "stages.1.blocks.0.conv2", "stages.2.blocks.0.conv2.attn"]
    assert [v.grid for v in layers.values()] == [(16, 16), (16, 16), (8, 8)]
    assert [v.letters for v in layers.values()] == [" ".join("P" * 9), "B B", "A P"]
    bot = model.stages[1].blocks[0].conv2
    fmap = torch.randn(2, 8, 16, 16)  # the block's inner width 8 at the stage's input grid
    with torch.no_grad():
        attn = bottleneck_attention(bot, fmap)
        v = bot.qkv(fmap)[:, -bot.dim_out_v:].reshape(2 * 2, bot.dim_head_v, -1).transpose(-1, -2)
        out = (attn.reshape(4, 256, 256) @ v).transpose(-1, -2).reshape(2, 8, 16, 16)
        torch.testing.assert_close(bot.pool(out), bot(fmap), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 2, 256))
    report = diagnose(model, x)
    rows = {row["name"]: row for row in report["layers"]}
    assert rows["stages.0.blocks.0.conv2"]["gating"] == pytest.approx([1 / (1 + math.exp(-1))] * 9, abs=1e-6)
    assert rows["stages.1.blocks.0.conv2"]["gating"] is None
    assert len(rows["stages.2.blocks.0.conv2.attn"]["gating"]) == 1  # its one GPSA head
    assert [len(run["layers"]) for run in report["similarity"]] == [1, 1, 1]  # 9, 2, 2 heads: no common run


def test_tcnn_gpsa_at_large_locality_is_its_convolution_in_the_diagnostics(one_thread):
    """Hand-computed: with large alpha and gating (set_exact) T-CNN's head (dr, dc) attends to the pixel at that
    offset, so on a 4x4 map its ALS (3x3 window) and its nonlocality / |offset| are the share of queries whose
    offset pixel is inside the map (the padding's share is left out): 1, 12/16 on an edge, 9/16 at a corner."""
    import torch

    from archspec.diagnostics.metrics import (
        attention_locality_score,
        conv_gpsa_attention,
        nonlocality,
        patch_window_mask,
    )
    from archspec.families.conv_block.module import ConvGPSA

    layer = ConvGPSA(8, 8).set_exact()
    attn = conv_gpsa_attention(layer, torch.randn(1, 8, 4, 4))
    share = torch.tensor([(4 - abs(dr)) * (4 - abs(dc)) / 16 for dr in (-1, 0, 1) for dc in (-1, 0, 1)])
    dist = torch.tensor([math.hypot(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1)])
    als = attention_locality_score(attn, patch_window_mask((4, 4), (3, 3)))
    torch.testing.assert_close(als, share, rtol=0, atol=1e-5)
    torch.testing.assert_close(nonlocality(attn, (4, 4)), share * dist, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_inspect_cli_on_a_botnet_hybrid(tmp_path, capsys, one_thread):
    out = tmp_path / "bot"
    assert main(["inspect", _write(tmp_path, TINY_BOT), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {p.name for p in out.iterdir()} == INSPECT.files
    assert [row["heads"] for row in report["layers"]] == [" ".join("P" * 9), "B B", "A P"]
    assert all(0 <= v <= 1 for row in report["layers"] for v in row["als"])
