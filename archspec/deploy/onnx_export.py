"""ONNX export with a dynamic batch dimension, checked in ONNX Runtime against PyTorch.

The exporter is ``torch.onnx.export(..., dynamo=True)``: it captures the model with ``torch.export`` (the same
capture :mod:`archspec.deploy.int8` quantises) and translates it with onnxscript's ATen library, so a dynamic batch is
a ``torch.export.Dim`` and the int8 graph's quantize / dequantize ops become ONNX ``QuantizeLinear`` /
``DequantizeLinear`` (the QDQ format ONNX Runtime fuses into int8 kernels).  The TorchScript exporter
(``dynamo=False``) is deprecated in PyTorch 2.x and cannot read the PT2E int8 graph.

LeViT's inference folding (sec. 5.3) is the difference between ``--fuse`` and not: unfolded, every BatchNorm is
an ONNX ``BatchNormalization`` node; folded, none is left.  The files carry ``archspec_export`` in their
metadata, so ``archspec export`` replaces only ONNX files it wrote (:func:`check_target`).

onnx, onnxscript and onnxruntime are the optional extra ``archspec[export]``.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from archspec._util.imports import try_import
from archspec.errors import SpecError
from archspec.io.builddir import normal_mode, staging_prefix

with try_import("export") as _onnx:  # the optional extra archspec[export]; require_onnx() says what is missing
    import onnx
with try_import("export") as _onnxruntime:
    import onnxruntime as ort

__all__ = ["export_onnx", "check_target", "require_onnx", "ort_session", "run_onnx", "MARKER", "FLOAT32_TOLERANCE"]

MARKER = "archspec_export"
FLOAT32_TOLERANCE = 1e-4  # max |logit difference| ONNX Runtime vs PyTorch in float32 (the bound)
_OPTION = ("--onnx",)


def require_onnx() -> None:
    """Check that the ``archspec[export]`` extra is installed.

    Raises:
        SpecError: at ``--onnx``: onnx, onnxscript or onnxruntime is missing, with the pip line.
    """
    missing = []
    for name in ("onnx", "onnxscript", "onnxruntime"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise SpecError.single(_OPTION, f"ONNX export needs {', '.join(missing)} (the optional extra "
                                        "archspec[export])", "pip install 'archspec[export]'")


def _is_ours(path: Path) -> bool:
    """True when ``path`` is an ONNX model whose metadata carries :data:`MARKER`."""
    _onnx.check()

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception:  # protobuf's DecodeError and friends: not an ONNX file
        return False
    return any(prop.key == MARKER for prop in model.metadata_props)


def check_target(path: str | os.PathLike) -> str:
    """Classify the output file before any work: ``"new"`` (missing) or ``"ours"`` (an ONNX file ``archspec
    export`` wrote: replaced).

    Raises:
        SpecError: at ``--onnx``: the path is a link, a directory, not a regular file, or a file archspec did not
            write (a user's model, anything else) -- nothing is touched.
    """
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "new"
    except OSError as exc:
        raise SpecError.single(_OPTION, f"cannot inspect it: {exc.strerror or exc}", None, str(path)) from None
    hint = "choose another FILE, or move it away yourself; archspec replaces only ONNX files it exported"
    if stat.S_ISLNK(mode):
        raise SpecError.single(_OPTION, "is a symbolic link; archspec will not write through one", hint, str(path))
    if not stat.S_ISREG(mode):
        raise SpecError.single(_OPTION, "exists and is not a regular file", hint, str(path))
    if not _is_ours(path):
        raise SpecError.single(_OPTION, f"exists and was not written by `archspec export` (no {MARKER!r} in its "
                                        "ONNX metadata)", hint, str(path))
    return "ours"


def export_onnx(module: torch.nn.Module, path: str | os.PathLike, example: torch.Tensor, metadata: dict,
                opset: int | None = None) -> dict:
    """Export ``module`` (images ``(B, C, H, W)`` -> logits ``(B, classes)``) to the ONNX file ``path`` with a
    dynamic batch dimension, atomically (a temporary file in the same directory, renamed over ``path``).

    Args:
        module: a float model (folded or not), or a :class:`~archspec.deploy.int8.QuantizedModel`'s ``program``.
        example: images ``(B, C, H, W)`` to trace with (``B >= 2``: batch 1 would be specialised).
        metadata: JSON-ready provenance, stored under :data:`MARKER` in the ONNX metadata.
        opset: ONNX opset (default: the exporter's).

    Returns:
        ``{"bytes", "opset", "nodes": {op_type: count}}`` of the written file.

    Raises:
        SpecError: at ``--onnx``: the exporter cannot capture or translate the model (its first line), the
            file cannot be written.
    """
    _onnx.check()
    path = Path(path)
    batch = torch.export.Dim("batch", min=1, max=4096)
    if not isinstance(module, torch.fx.GraphModule):
        with torch.no_grad():  # fill eval-mode caches (timm LeViT's attention-bias cache) before export, not during
            module(example[:1])  # it: torch.export warns about tensor attributes assigned while it traces
    try:
        with torch.no_grad(), warnings.catch_warnings():
            if isinstance(module, torch.fx.GraphModule):  # an exported int8 graph has no train/eval mode to set
                warnings.filterwarnings("ignore", message="Exporting a model while it is in training mode")
            program = torch.onnx.export(module, (example,), None, dynamo=True, dynamic_shapes=({0: batch},),
                                        input_names=["images"], output_names=["logits"], opset_version=opset,
                                        verbose=False, external_data=False)
    except Exception as exc:  # torch.export / onnxscript raise many types
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise SpecError.single(_OPTION, f"torch.onnx.export (dynamo) cannot export this model: {reason}") from None
    program.model.metadata_props[MARKER] = json.dumps(metadata, sort_keys=True)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)

        fd, tmp = tempfile.mkstemp(prefix=staging_prefix(path.name, "archspec-tmp-", ".onnx"), suffix=".onnx",
                                   dir=path.parent)
        os.close(fd)
        try:
            program.save(tmp, external_data=False)

            os.chmod(tmp, normal_mode(directory=False))
            os.replace(tmp, path)
        except BaseException:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise
    except OSError as exc:
        raise SpecError.single(_OPTION, f"cannot write it: {exc.strerror or exc}", None, str(path)) from None
    graph = onnx.load(str(path), load_external_data=False)
    nodes: dict[str, int] = {}
    for node in graph.graph.node:
        nodes[node.op_type] = nodes.get(node.op_type, 0) + 1
    opset_used = next((o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")), None)
    return {"bytes": path.stat().st_size, "opset": opset_used, "nodes": dict(sorted(nodes.items()))}


def ort_session(path: str | os.PathLike, threads: int | None = None) -> Any:
    """An ONNX Runtime CPU ``InferenceSession`` of ``path`` (all graph optimisations on); ``threads`` intra-op
    threads (``None``: ONNX Runtime's default) and one inter-op thread."""
    _onnxruntime.check()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run_onnx(session: Any, x: torch.Tensor) -> torch.Tensor:
    """Logits ``(B, classes)`` of images ``(B, C, H, W)`` through an ONNX Runtime session."""
    name = session.get_inputs()[0].name
    return torch.from_numpy(session.run(None, {name: x.detach().cpu().numpy()})[0])
