"""Every verb on a small model of a family (issue 83, item 4): the checks each family's tests run on their own tiny
spec -- train and resume, int8 close to float, ONNX equal to PyTorch, one Dynamo graph.

Each check's reference is independent of the path it tests: the resumed run's step count and files, the float
model's logits (test_deploy's tolerance on the three real photographs), PyTorch's logits for ONNX Runtime's, and
the eager logits for the traced model's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from deploy_fixtures import augmented
from train_fixtures import image_folder

from archspec.cli import main
from archspec.io.images import sample_batch


def train_and_resume(source: Path, tmp_path: Path) -> None:
    """Two steps with a checkpoint each step, the summary removed (what a kill after the checkpoint leaves), then
    ``--resume`` to four steps: the run ends at step 4 with its weights written."""
    data, run = image_folder(tmp_path / "stripes"), tmp_path / "run"
    quick = ["--data", str(data), "--out", str(run), "--max-images", "40", "--batch-size", "8", "--workers", "0",
             "--quiet"]
    assert main(["train", str(source), *quick, "--steps", "2", "--checkpoint-every", "1"]) == 0
    (run / "summary.json").unlink()
    assert main(["train", str(source), *quick, "--steps", "4", "--resume"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and (run / "model" / "model.safetensors").is_file()


def int8_is_close_to_float(model: torch.nn.Module, size: tuple[int, int]) -> None:
    """test_deploy's tolerance on the three real photographs at ``size``: per image cosine >= 0.98, relative L2
    <= 0.2 between the PT2E int8 model's logits and the float model's."""
    from archspec.deploy.int8 import quantize  # noqa: PLC0415 - torchao's PT2E stack, only for this check

    photos = sample_batch(size)
    quantized = quantize(model, [augmented(photos)], torch_compile=False)
    with torch.no_grad():
        expected, got = model(photos), quantized(photos)
    cosine = torch.nn.functional.cosine_similarity(got, expected, dim=1)
    relative = (got - expected).norm(dim=1) / expected.norm(dim=1)
    assert (cosine >= 0.98).all() and (relative <= 0.2).all(), (cosine, relative)


def onnx_equals_pytorch(model: torch.nn.Module, size: tuple[int, int], path: Path) -> None:
    """The dynamo ONNX export at ``path`` run by ONNX Runtime equals PyTorch's logits within 1e-4 of their scale, at
    batch 3 and batch 1 (the batch axis is dynamic); skipped without onnxruntime (the ``export`` extra)."""
    pytest.importorskip("onnxruntime")
    from archspec.deploy.onnx_export import export_onnx, ort_session, run_onnx  # noqa: PLC0415 - the export extra

    photos = sample_batch(size)
    export_onnx(model, path, photos[:2], {"test": True})
    session = ort_session(path, threads=1)
    with torch.no_grad():
        for x in (photos, photos[:1]):
            expected = model(x)
            assert (run_onnx(session, x) - expected).abs().max().item() <= 1e-4 * max(expected.abs().max().item(), 1)


def compiles_in_one_graph(model: torch.nn.Module, size: tuple[int, int]) -> None:
    """``torch.compile`` with ``fullgraph=True`` (no graph break) gives the eager logits within 1e-5; the ``eager``
    backend checks Dynamo's trace without a C++ toolchain (``archspec build --torch-compile`` runs Inductor on it)."""
    x = torch.randn(2, 3, *size)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
