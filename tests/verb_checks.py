"""Every verb on a small model of a family (issue 83, item 4): the checks each family's tests run on their own tiny
model -- int8 close to float, ONNX equal to PyTorch, one Dynamo graph (train and resume:
``train_fixtures.train_then_resume``).

Each check's reference is independent of the path it tests: the float
model's logits (test_deploy's tolerance on the three real photographs), PyTorch's logits for ONNX Runtime's, and
the eager logits for the traced model's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from deploy_fixtures import augmented

from archspec.io.images import sample_batch


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
