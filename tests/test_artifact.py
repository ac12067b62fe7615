"""Artifacts that cannot lie: broken weights files and edited specs are refused with the file named.

Reproducers of the "Trust first" issue, item 5: every broken ``model.safetensors`` used to raise an
uncaught ``SafetensorError``; an edit of spec.yaml that keeps every shape loaded silently and changed
the outputs.  Each is checked through ``archspec.load`` and through ``archspec validate DIR``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file, save_model

import archspec
from archspec.cli import main
from archspec.io.artifact import META_DIGEST, spec_digest
from archspec.spec import shipped_specs

TINY = """\
name: tiny
input: {resolution: 32}
stem: {kind: patch, patch_size: 8}
stages: [{depth: 2, dim: 16, heads: 2, layers: [{range: 0-1, heads: ["mask:3x3", mhsa]}]}]
head: {num_classes: 10}
"""


@pytest.fixture
def saved(tmp_path):
    """A saved tiny model whose weights moved away from their init (so loading is really tested)."""
    model = archspec.compile(TINY)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    archspec.save(model, tmp_path / "m")
    return tmp_path / "m", model


def _weights_variants(good: bytes) -> dict[str, bytes]:
    return {
        "empty": b"",
        "8 bytes": good[:8],
        "truncated": good[: len(good) // 2],
        "a pickle": pickle.dumps({"weight": [1.0, 2.0]}),
        "a torch.save file": None,  # filled in by the test (needs a path)
        "huge header": (2**40).to_bytes(8, "little") + b"{}",
    }


@pytest.mark.parametrize("case", list(_weights_variants(b"")))
def test_broken_weights_are_a_spec_error_naming_the_file(case, saved, capsys) -> None:
    directory, _ = saved
    weights = directory / "model.safetensors"
    if case == "a torch.save file":
        torch.save({"weight": torch.zeros(2)}, weights)
    else:
        weights.write_bytes(_weights_variants(weights.read_bytes())[case])
    with pytest.raises(archspec.SpecError, match="not a readable safetensors file") as info:
        archspec.load(directory)
    assert str(weights) in str(info.value)
    assert main(["validate", str(directory)]) == 2
    err = capsys.readouterr().err
    assert str(weights) in err and "rebuild" in err and "Traceback" not in err


def test_weights_of_another_spec_are_refused(saved, tmp_path) -> None:
    directory, model = saved
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    cases = {
        "unexpected tensor 'extra'": {**state, "extra": torch.zeros(1)},
        "'head.weight' has shape (3, 16) but the spec needs (10, 16)": {**state, "head.weight": torch.zeros(3, 16)},
        "missing tensors head.bias": {k: v for k, v in state.items() if k != "head.bias"},
    }
    for message, tensors in cases.items():
        save_file(tensors, directory / "model.safetensors", metadata={META_DIGEST: spec_digest(model.spec)})
        with pytest.raises(archspec.SpecError, match="weights do not match the spec") as info:
            archspec.load(directory)
        assert message in str(info.value) and str(directory / "model.safetensors") in str(info.value)


def test_a_fifo_as_weights_is_refused_without_blocking(saved) -> None:
    directory, _ = saved
    os.unlink(directory / "model.safetensors")
    os.mkfifo(directory / "model.safetensors")
    with pytest.raises(archspec.SpecError, match="not a regular file"):
        archspec.load(directory)


@pytest.mark.slow
def _without_unused_gauss_mask(value):
    """The spec's JSON with every head's unused newer kinds left out (heads carry all their kinds' keys): a
    ``null`` of any kind but the four older than gauss_mask (``gpsa``, ``rel_bias``, ``mask``, BoTNet's
    ``rel_logits``) -- ``gauss_mask`` and the kinds after it -- the digest's rule since gauss_mask was added, so
    that digests saved before it still match."""
    if isinstance(value, list):
        return [_without_unused_gauss_mask(v) for v in value]
    if isinstance(value, dict):
        is_head = {"gpsa", "rel_bias", "mask", "gauss_mask"} <= set(value)
        return {k: _without_unused_gauss_mask(v) for k, v in value.items()
                if not (is_head and k not in ("gpsa", "rel_bias", "mask", "rel_logits") and v is None)}
    return value


def _without_unused_hierarchy(dump: dict) -> dict:
    """The spec's JSON without the fields issues 81 and 83 added, where unused: the patch stem's ``"norm": "none"``,
    the head's ``"norm": null``, an attention stage's ``"downsample": null`` and ``"init": "trunc_normal"`` (a conv
    stage's ``downsample``, its shortcut, is older)."""
    dump = {**dump, "stem": {k: v for k, v in dump["stem"].items() if (k, v) != ("norm", "none")},
            "head": {k: v for k, v in dump["head"].items() if (k, v) != ("norm", None)}}
    unused = [("downsample", None), ("init", "trunc_normal")]  # a list: a used downsample is a dict
    dump["stages"] = [s if s.get("kind") == "conv" else {k: v for k, v in s.items() if (k, v) not in unused}
                      for s in dump["stages"]]
    return dump


def test_the_digest_is_sha256_of_the_sorted_json_spec_and_survives_the_yaml_round_trip() -> None:
    for name in shipped_specs():
        spec = archspec.load_spec(name)
        dump = _without_unused_hierarchy(_without_unused_gauss_mask(spec.model_dump(mode="json")))
        canonical = json.dumps(dump, sort_keys=True, separators=(",", ":"))
        assert spec_digest(spec) == hashlib.sha256(canonical.encode()).hexdigest()
        assert spec_digest(archspec.load_spec(spec.to_yaml())) == spec_digest(spec)


@pytest.mark.slow
def test_save_stores_digest_and_version_and_loads_back_exactly(saved) -> None:
    directory, model = saved
    with safe_open(str(directory / "model.safetensors"), "pt") as f:
        meta = f.metadata()
    assert meta[META_DIGEST] == spec_digest(model.spec) and meta["archspec_version"] == archspec.__version__
    x = torch.randn(2, 3, 32, 32)
    loaded = archspec.load(directory).eval()
    with torch.no_grad():
        assert torch.equal(loaded(x), model.eval()(x))


@pytest.mark.parametrize("old, new", [("window: [3, 3]", "window: [1, 1]"), ("mode: hard", "mode: strict"),
                                      ("norm_eps: 1.0e-06", "norm_eps: 0.01")])
@pytest.mark.slow
def test_a_shape_keeping_spec_edit_is_refused_unless_allowed(old, new, saved, capsys) -> None:
    directory, model = saved
    spec_yaml = directory / "spec.yaml"
    assert old in spec_yaml.read_text()
    spec_yaml.write_text(spec_yaml.read_text().replace(old, new))
    with pytest.raises(archspec.SpecError, match="was changed after the weights were saved") as info:
        archspec.load(directory)
    assert str(spec_yaml) in str(info.value) and "allow_spec_change=True" in str(info.value)
    assert main(["validate", str(directory)]) == 2
    assert "--allow-spec-change" in capsys.readouterr().err
    # deliberately accepted: it loads, and the outputs differ -- which is why it is refused by default
    edited = archspec.load(directory, allow_spec_change=True).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert not torch.allclose(edited(x), model.eval()(x))
    assert main(["validate", str(directory), "--allow-spec-change"]) == 0


def test_an_artifact_without_digest_loads_with_a_warning(saved, capsys) -> None:
    directory, model = saved
    save_model(model, str(directory / "model.safetensors"))  # as archspec 0.1.0 wrote it: no metadata
    with pytest.warns(UserWarning, match="no spec digest"):
        archspec.load(directory)
    assert main(["validate", str(directory), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["valid"] and "warning: " in captured.err and "no spec digest" in captured.err


def test_validate_dir_prints_the_table_and_refuses_spec_only_options(saved, capsys) -> None:
    directory, _ = saved
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a current artifact loads without any warning
        assert main(["validate", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "tiny: valid artifact" in out and "stages.0.blocks.1" in out
    assert main(["validate", str(directory), "--resolution", "64"]) == 0  # loads at 64 px (tables resampled)
    assert "tiny: valid artifact" in capsys.readouterr().out
    assert main(["validate", "deit_tiny", "--allow-spec-change"]) == 2
    assert main(["validate", str(directory.parent)]) == 2  # a directory that is no artifact
    assert "no spec.yaml" in capsys.readouterr().err


def test_saved_weights_get_the_normal_file_mode(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        archspec.save(archspec.compile(TINY), tmp_path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "model.safetensors").st_mode) == 0o644  # safetensors alone: 0o600


def test_a_model_over_the_default_memory_limit_reloads_with_its_limit(saved, monkeypatch, capsys) -> None:
    """A model built with a raised --max-memory reloads when the same limit is given, and only then."""
    import archspec.ir.plan

    saved, _ = saved
    monkeypatch.setattr(archspec.ir.plan, "DEFAULT_MAX_MEMORY", 1024)  # the tiny model needs far more
    with pytest.raises(archspec.SpecError, match="memory"):
        archspec.load(saved)
    assert archspec.load(saved, max_memory=2**30).spec.name == "tiny"
    assert main(["validate", str(saved)]) == 2
    assert "--max-memory" in capsys.readouterr().err
    assert main(["validate", str(saved), "--max-memory", "1G"]) == 0
