"""`archspec build / validate / list / schema` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import archspec
from archspec._util.units import human
from archspec.cli import main
from archspec.io.images import load_image
from archspec.spec import shipped_specs

# CMHSA's attention specs (9 heads of width >= 768 on a padded 16x16 grid) take ~20 s each to build three
# times at 224 px; they are built here at 64 px (their 224 px counts are checked in test_compile).
BUILD_RESOLUTION = {"cmhsa_k3": 64, "cmhsa_k5": 64}


@pytest.mark.parametrize("name", shipped_specs())
@pytest.mark.slow
def test_every_shipped_spec_builds_end_to_end(name: str, tmp_path, capsys) -> None:
    out = tmp_path / name
    size = BUILD_RESOLUTION.get(name)
    resolution = ["--resolution", str(size)] if size else []
    assert main(["build", f"specs/{name}.yaml", "--out", str(out), "--repeats", "1", "--json", *resolution]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors", "report.json", "spec.yaml"]
    doc = archspec.load_spec(name).model_dump(mode="json")
    if size:
        doc["input"]["resolution"] = [size, size]
    analysis = archspec.analyze(doc)
    assert report["params"] == analysis.params and report["macs"] == analysis.macs
    assert report["output_shape"] == [1, archspec.load_spec(name).head.num_classes]
    assert report["latency_ms"] > 0 and report["image"].endswith("grace_hopper.jpg")
    # the artifact rebuilds the same model: same logits on the same real photo
    spec = archspec.load_spec(out / "spec.yaml")
    x = load_image(None, spec.input.resolution, spec.input.channels)
    rebuilt, fresh = archspec.load(out).eval(), archspec.compile(doc).eval()
    with torch.no_grad():
        assert torch.equal(rebuilt(x), fresh(x))


@pytest.mark.slow
def test_build_table_and_overrides(tmp_path, capsys) -> None:
    code = main(["build", "mait_tiny_sch2", "--out", str(tmp_path / "m"), "--resolution", "112", "--seed", "3",
                 "--repeats", "1"])
    text = capsys.readouterr().out
    assert code == 0
    assert "M M A" in text and "M A A" in text and "A A A" in text and "forward latency" in text
    spec = archspec.load_spec(tmp_path / "m" / "spec.yaml")
    assert spec.input.resolution == (112, 112) and spec.seed == 3
    assert "pos_embed" in archspec.load(tmp_path / "m").state_dict()  # resized with the resolution
    assert archspec.load(tmp_path / "m").pos_embed.shape == (1, 1 + 7 * 7, 192)


def test_validate_list_and_schema(capsys) -> None:
    assert main(["validate", "convit_tiny", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] and data["params"] == 5_710_512
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    assert all(name in listing for name in shipped_specs())
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert "stages" in schema["properties"] and "StageSpec" in schema["$defs"]
    assert schema["$defs"]["StageSpec"]["properties"]["depth"]["description"]


@pytest.mark.parametrize("argv, where", [
    (["build", "no_such_spec"], "no_such_spec"),
    (["build", "deit_tiny", "--image", "/nonexistent.jpg"], "/nonexistent.jpg"),
    (["build", "deit_tiny", "--resolution", "200"], "patch size 16 does not divide"),
    (["build", "deit_tiny", "--device", "cuda:7" if not torch.cuda.is_available() else "nonsense"], "--device"),
    (["build", "deit_tiny", "--seed", "-1"], "--seed"),
    (["build", "deit_tiny", "--image", "/"], "cannot read the image"),
])
def test_user_mistakes_exit_2_with_a_message_and_write_nothing(argv, where, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main(argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert where in err and "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow
def test_console_script_and_help() -> None:
    result = subprocess.run([sys.executable, "-m", "archspec", "build", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "model.safetensors" in result.stdout and "--resolution" in result.stdout
    result = subprocess.run([sys.executable, "-m", "archspec", "validate", "specs/nope.yaml"], capture_output=True,
                            text=True)
    assert result.returncode == 2 and "specs/nope.yaml" in result.stderr and "Traceback" not in result.stderr


TINY_SPEC = """\
input: {resolution: 32}
stem: {kind: patch, patch_size: 8}
stages: [{depth: 1, dim: 16, heads: 2}]
head: {num_classes: 10}
"""


@pytest.mark.parametrize("extra", [[], ["--int8"]], ids=["float", "int8"])
@pytest.mark.slow  # a fresh interpreter imports torch and builds (float: seconds; int8: Inductor compiles, a minute)
def test_a_first_build_shows_archspec_output_only(tmp_path, extra) -> None:
    """torch.utils.benchmark (the latency Timer) imports torch.utils.cpp_extension, which logs "No CUDA runtime is
    found, using CUDA_HOME=..." on a machine without CUDA; the int8 compile warns from Inductor's own code.
    Neither is the user's business: a successful build writes nothing to stderr."""
    (tmp_path / "tiny.yaml").write_text(TINY_SPEC)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "archspec", "build", "tiny.yaml", "--out", "b", "--repeats", "1",
                             *extra], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "No CUDA runtime is found" not in result.stderr
    assert result.stderr == "" and "wrote" in result.stdout


@pytest.mark.slow
def test_shipped_specs_work_by_name_outside_the_checkout(tmp_path) -> None:
    """Run from an empty directory: the specs come from the installed package, not from ./specs."""
    result = subprocess.run([sys.executable, "-m", "archspec", "validate", "mait_tiny_sch2", "--json"],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["params"] == archspec.analyze("mait_tiny_sch2").params


@pytest.mark.slow
def test_unwritable_out_is_a_located_error(capsys) -> None:
    assert main(["build", "deit_tiny", "--out", "/proc/archspec-cannot-write-here", "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "cannot write" in err and "Traceback" not in err


def _build_text(spec, tmp_path, capsys) -> str:
    assert main(["build", spec, "--out", str(tmp_path / "b"), "--repeats", "1"]) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_build_says_executed_macs_only_when_they_differ_and_why(tmp_path, capsys) -> None:
    """The papers' MACs and what the model executes: one figure when equal, both with the reason otherwise."""
    plain = _build_text("deit_tiny", tmp_path, capsys)
    assert "executed:" not in plain and "MACs executed" not in plain
    assert "A plain MHSA" in plain and "hard mask" not in plain  # the legend explains the letters used
    # a 20x20 grid: hard masks pass the linear-time crossover (254 patches for 3x3), GPSA runs as SDPA + P V
    spec = tmp_path / "hybrid.yaml"
    spec.write_text("name: hybrid\ninput: {resolution: 160}\nstem: {kind: patch, patch_size: 8}\n"
                    "stages: [{depth: 2, dim: 32, heads: 2, layers: [{range: 0, heads: [mask, mhsa]},"
                    " {range: 1, heads: [gpsa, mhsa]}]}]\ntokens: {cls_token: none}\n"
                    "head: {pool: mean, num_classes: 10}\n")
    hybrid = _build_text(str(spec), tmp_path, capsys)
    analysis = archspec.analyze(str(spec))
    assert analysis.macs_executed != analysis.macs
    assert f"({human(analysis.macs_executed)} executed: hard-masked heads run on the linear-time" \
           in " ".join(hybrid.split()) and "GPSA heads run as SDPA plus a P V product" in " ".join(hybrid.split())
    assert "MACs executed" in hybrid


def test_head_letter_legend_explains_class_attention(tmp_path, capsys) -> None:
    assert main(["validate", "masked_cait_xxs24"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "C C C C" in text and "C class attention (CaiT)" in text and "M hard mask (MaiT)" in text


def test_list_keeps_whole_words(capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["list"]) == 0
    words = set(capsys.readouterr().out.replace("│", " ").split())
    for name in shipped_specs():
        source = archspec.load_spec(name).source.splitlines()[0]
        assert all(word in words for word in source.split()), (name, source)  # wrapped, never cut mid-word
