"""`archspec two-phase` (CMHSA sec. 4.1): conv phase, exact transfer, attention phase, on real digits."""

from __future__ import annotations

import json

import pytest
import torch

import archspec
from archspec.cli import main
from archspec.ir.checked import load_spec
from archspec.spec import SPEC_DIR

FAST = ["--steps1", "6", "--steps2", "4", "--max-images", "120", "--batch-size", "16", "--warmup1", "2"]


def _spec_file(tmp_path):
    doc = load_spec(SPEC_DIR / "cmhsa_k3_conv_digits.yaml").model_dump(mode="json")
    doc["input"]["resolution"] = 16  # 4x4 grid of 4x4x3 patches
    doc["stages"][0]["depth"] = 1
    path = tmp_path / "phase1.yaml"
    path.write_text(load_spec(doc).to_yaml())
    return path


@pytest.mark.slow
def test_two_phase_cli_writes_both_builds_and_step0_equals_phase1(one_thread, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["two-phase", str(_spec_file(tmp_path)), "--out", str(out), "--json", *FAST]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["transfer"]["accuracy_step0"] == report["phase1"]["accuracy"]
    assert report["transfer"]["max_logit_error"] < 1e-4
    assert report["phase1"]["steps"] == 6 and report["phase2"]["steps"] == 4 and report["baseline"]["steps"] == 10
    phase1, phase2 = archspec.load(out / "phase1"), archspec.load(out / "phase2")
    assert phase2.spec.stages[0].mixer.kind == "attention" and phase1.spec.stages[0].mixer.kind == "conv"
    assert phase2(torch.randn(1, 3, 16, 16)).shape == (1, 10)
    saved = json.loads((out / "phase2" / "report.json").read_text())
    assert saved["phase2"]["accuracy"] == report["phase2"]["accuracy"]
    # a second run replaces the builds archspec wrote, and shows each phase's progress (the one loop's lines)
    capsys.readouterr()
    assert main(["two-phase", str(_spec_file(tmp_path)), "--out", str(out), "--no-baseline", *FAST]) == 0
    err = capsys.readouterr().err
    assert "phase 1: step 6/6" in err and "phase 2: step 4/4" in err and "phase 2: eval" in err


def test_two_phase_refuses_user_files_and_specs_without_conv(tmp_path, capsys):
    out = tmp_path / "run"
    (out / "phase2").mkdir(parents=True)
    (out / "phase2" / "notes.txt").write_text("mine")
    assert main(["two-phase", str(_spec_file(tmp_path)), "--out", str(out), *FAST]) == 2
    assert sorted(p.name for p in out.iterdir()) == ["phase2"]
    assert (out / "phase2" / "notes.txt").read_text() == "mine"
    assert main(["two-phase", "deit_tiny", "--out", str(tmp_path / "x"), *FAST]) == 2
    assert "no conv mixer" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["two-phase", str(_spec_file(tmp_path)), "--steps1", "0"]) == 2


def test_grey_data_is_repeated_to_the_specs_three_channels():
    from torch.utils.data import TensorDataset

    from archspec.io.datasets import Dataset
    from archspec.transfer.two_phase import match_channels

    split = TensorDataset(torch.arange(8.0).reshape(2, 1, 2, 2), torch.tensor([0, 1]))
    grey = Dataset(name="g", train=split, val=split, num_classes=2, channels=1, image_size=2)
    rgb = match_channels(grey, 3)
    assert rgb.channels == 3 and rgb.train.tensors[0].shape == (2, 3, 2, 2)
    assert torch.equal(rgb.val.tensors[0][:, 2], grey.val.tensors[0][:, 0])
    assert match_channels(grey, 1) is grey


def test_two_phase_refuses_an_out_holding_other_files(tmp_path, capsys):
    """build's rule one level up: OUT holds nothing but archspec's phase1/, phase2/, baseline/ builds."""
    out = tmp_path / "mydata"
    out.mkdir()
    (out / "thesis.tex").write_text("\\documentclass{article}\n")
    assert main(["two-phase", str(_spec_file(tmp_path)), "--out", str(out), *FAST]) == 2
    err = capsys.readouterr().err
    assert "thesis.tex" in err and "--out" in err and "Traceback" not in err
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]
    (out / "thesis.tex").unlink()
    (out / "phase1").symlink_to(tmp_path)  # a link where a build would go
    assert main(["two-phase", str(_spec_file(tmp_path)), "--out", str(out), *FAST]) == 2
    assert [p.name for p in out.iterdir()] == ["phase1"]


@pytest.mark.parametrize("option, value", [("--lr1", "inf"), ("--lr2", "nan"), ("--weight-decay", "nan"),
                                           ("--weight-decay", "-1"), ("--peak", "-1"), ("--peak", "nan")])
def test_two_phase_refuses_bad_numbers_before_training(tmp_path, capsys, option, value):
    out = tmp_path / "run"
    assert main(["two-phase", str(_spec_file(tmp_path)), "--out", str(out), *FAST, option, value]) == 2
    err = capsys.readouterr().err
    assert option in err and "Traceback" not in err and not out.exists()
