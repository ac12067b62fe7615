"""ONNX export (dynamic batch) checked in ONNX Runtime against PyTorch: float32 within 1e-4 on real photographs,
folded and unfolded (LeViT sec. 5.3's BatchNorm folding: no BatchNormalization node left), int8 against PyTorch's
reference int8 graph; ``archspec export``'s file rules.  Needs the extra archspec[export] (the test extra has it).
"""

from __future__ import annotations

import json
import os
import sys

import deploy_fixtures
import pytest
import torch
from deploy_fixtures import LEVIT_1_1, augmented, photo_levit

import archspec
from archspec.cli import main

photos = deploy_fixtures.photos  # the shared fixture


@pytest.fixture(scope="module")
def levit(photos, one_thread_module):
    """LeViT-128S at depth 1 a stage (3 blocks, both shrink attentions, 22 LinearNorms: 3 x 4 + 2 x 5) with the
    photos' BatchNorm statistics: the exporter sees every op kind of the whole model, whose 46 LinearNorms took twice
    the time (issue 53)."""
    return photo_levit(photos, depth=1)

pytest.importorskip("onnxruntime")


@pytest.mark.slow
@pytest.mark.parametrize("fuse", [False, True], ids=["unfolded", "folded"])
def test_onnx_equals_pytorch_in_float32(levit, photos, fuse, tmp_path):
    """ONNX Runtime's logits equal PyTorch's within 1e-4 on real photos, at the traced batch and at others."""
    from archspec.deploy.onnx_export import export_onnx, ort_session, run_onnx

    model = levit.fuse() if fuse else levit
    written = export_onnx(model, tmp_path / "m.onnx", photos[:2], {"test": True})
    batchnorms = written["nodes"].get("BatchNormalization", 0)
    if fuse:
        assert batchnorms == 0
    else:  # the exporter's optimiser folds a BatchNorm2d into the conv before it, never a BatchNorm1d after a linear
        assert batchnorms >= sum(type(m).__name__ == "LinearNorm" for m in levit.modules()) == 22
    session = ort_session(tmp_path / "m.onnx", threads=1)
    with torch.no_grad():
        for x in (photos, photos[:1], augmented(photos)):
            expected = model(x)
            assert expected.abs().max() > 0.1  # logits of a useful scale, so 1e-4 means something
            assert (run_onnx(session, x) - expected).abs().max().item() <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("reduce_range", [False, True], ids=["8-bit", "7-bit"])
def test_int8_onnx_computes_the_reference_graph(levit, photos, reduce_range, tmp_path, one_thread):
    """ONNX Runtime (all graph optimisations: its fused int8 kernels) against PyTorch's reference int8 graph.  With
    7-bit activations the quantize ops read clamped inputs, so ONNX's QuantizeLinear (no q_max) computes the same
    values and no int16 sum saturates: equal within float rounding (measured 0 on an AVX2 VM; 0.09 relative
    without the clamp).  8-bit activations saturate on CPUs without VNNI (relative L2 0.49 there), so they are
    held to the bound only where the CPU has VNNI."""
    from archspec.deploy.int8 import needs_reduce_range, quantize
    from archspec.deploy.onnx_export import export_onnx, ort_session, run_onnx

    if not reduce_range and needs_reduce_range():
        pytest.skip("8-bit activations saturate in ONNX Runtime's int8 kernels on this CPU (no VNNI)")
    int8 = quantize(levit, [augmented(photos)], torch_compile=False, reduce_range=reduce_range)
    export_onnx(int8.program, tmp_path / "q.onnx", photos[:2], {"test": True})
    got, expected = run_onnx(ort_session(tmp_path / "q.onnx", threads=1), photos), int8(photos)
    relative = ((got - expected).norm(dim=1) / expected.norm(dim=1)).max().item()
    assert relative <= (1e-4 if reduce_range else 0.05)  # 8 bits with VNNI: requantisation rounding only


@pytest.mark.slow
def test_export_cli_int8_and_the_file_rules(levit, tmp_path, capsys, one_thread):
    """The CLI's file rules, --fuse within 1e-4, and --int8 against PyTorch's int8 reference graph on a build whose
    logits have a useful scale (a fresh LeViT's are ~3e-4: its residual branches start at zero, so an absolute
    rounding of 1e-4 would be a third of them)."""
    from archspec.io.artifact import save

    spec = tmp_path / "levit_1_1.yaml"
    spec.write_text(LEVIT_1_1)
    target = tmp_path / "levit.onnx"
    target.write_text("my own model\n")
    argv = ["export", str(spec), "--onnx", str(target), "--json"]
    assert main(argv) == 2  # not written by archspec
    assert "not written by `archspec export`" in capsys.readouterr().err
    assert target.read_text() == "my own model\n"
    target.unlink()
    assert main([*argv, "--fuse"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["batchnorm_nodes"] == 0 and report["check"]["max_abs_logit_diff"] <= 1e-4
    assert report["check"]["batch1_max_abs_diff"] <= 1e-4
    build = save(levit, tmp_path / "build")  # with the photos' BatchNorm statistics
    assert main(["export", str(build), "--onnx", str(target), "--json", "--int8", "--calibration-batches", "1"]) == 0
    report = json.loads(capsys.readouterr().out)  # replaced its own file
    assert report["check"]["max_abs_logit"] > 0.1
    assert report["kind"] == "int8" and report["nodes"]["QuantizeLinear"] > 0 and report["nodes"]["DequantizeLinear"]
    # ONNX Runtime's int8 kernels against PyTorch's reference int8 graph: rounding of requantisation only
    assert report["check"]["max_abs_logit_diff"] <= 0.1 * max(report["check"]["max_abs_logit"], 1e-3)
    assert main(["export", str(tmp_path), "--onnx", str(tmp_path / "x.onnx")]) == 2  # a directory that is no build
    assert main(["export", "levit_128s", "--onnx", str(tmp_path)]) == 2  # FILE is a directory


@pytest.mark.slow  # torch.onnx.export (dynamo) of even a tiny model: seconds
def test_export_to_a_240_character_file_name_leaves_no_staging_file(tmp_path, one_thread):
    spec = tmp_path / "spec" / "tiny.yaml"
    spec.parent.mkdir()
    spec.write_text("input: {resolution: 32}\nstem: {kind: patch, patch_size: 8}\n"
                    "stages: [{depth: 1, dim: 16, heads: 2}]\nhead: {num_classes: 10}\n")
    out = tmp_path / "onnx"
    name = "m" * 235 + ".onnx"  # legal (NAME_MAX is 255 bytes); `.<name>.archspec-tmp-XXXXXXXX.onnx` would not be
    assert main(["export", str(spec), "--onnx", str(out / name)]) == 0
    assert os.listdir(out) == [name]


def test_export_needs_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    assert main(["export", "levit_128s", "--onnx", str(tmp_path / "m.onnx")]) == 2
    assert "pip install 'archspec[export]'" in capsys.readouterr().err
    assert not (tmp_path / "m.onnx").exists()


def test_export_refuses_options_that_do_not_apply(tmp_path, capsys):
    assert main(["export", "levit_128s", "--onnx", str(tmp_path / "m.onnx"), "--calibrate", "digits"]) == 2
    assert "--calibrate: applies only with --int8" in capsys.readouterr().err
    assert main(["export", "levit_128s", "--onnx", str(tmp_path / "m.onnx"), "--int8", "--calibrate", "/nope"]) == 2
    err = capsys.readouterr().err
    assert "--calibrate: no such file" in err and "--data" not in err and not (tmp_path / "m.onnx").exists()


@pytest.mark.slow
@pytest.mark.parametrize("fuse", [False, True], ids=["unfolded", "folded"])
def test_onnx_of_a_hybrid_with_attention_in_bottlenecks(photos, fuse, tmp_path, one_thread):
    """The small hybrid of tests/test_fuse.py (T-CNN GPSA, an attention stage, a conv tail with BoTNet's and
    archspec's attention) exports and ONNX Runtime's logits equal PyTorch's within 1e-4 relative to their scale.
    Unfolded, the exporter folds each BatchNorm after a conv and keeps the three after a bottleneck's GPSA or
    attention; folded, only the one after timm's BottleneckAttn (no output projection to fold into) is left."""
    from test_fuse import HYBRID, _randomise_batchnorms

    from archspec.deploy.onnx_export import export_onnx, ort_session, run_onnx

    torch.manual_seed(0)
    model = _randomise_batchnorms(archspec.compile(HYBRID))
    model = model.fuse() if fuse else model
    x = torch.nn.functional.interpolate(photos, size=(64, 64), mode="bilinear", antialias=True)
    written = export_onnx(model, tmp_path / "h.onnx", x[:2], {"test": True})
    assert written["nodes"].get("BatchNormalization", 0) == (1 if fuse else 3)
    session = ort_session(tmp_path / "h.onnx", threads=1)
    with torch.no_grad():
        expected = model(x)
        assert (run_onnx(session, x) - expected).abs().max().item() <= 1e-4 * max(expected.abs().max().item(), 1.0)
