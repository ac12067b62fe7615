"""archspec: a declarative architecture compiler for vision transformers with convolutional biases.

The path from YAML to ``nn.Module`` reads top to bottom in the package names: :mod:`archspec.spec` (the spec
language: pydantic models, YAML loading), :mod:`archspec.ir` (the IR: a plan of shapes, parameter and MAC
counts, and its networkx graph), :mod:`archspec.nn` (the compiler: IR -> :class:`~archspec.nn.model.ArchModel`,
each node's module built by its block family in :mod:`archspec.families`); docs/architecture.md draws the layers.

    >>> from archspec import compile
    >>> model = compile("mait_tiny_sch2")          # a shipped spec, a path, YAML text or a dict
    >>> model.spec.name, model.num_classes
    ('mait_tiny_sch2', 1000)

Names are imported on first use (PEP 562), so ``archspec validate`` and static analysis never pay
for importing torch and timm.  The shipped specs become timm models (``timm.create_model(
"archspec_mait_tiny_sch2")``) as soon as timm is imported too (:mod:`archspec.timm_bridge.registry`).
"""

from __future__ import annotations

import logging as _logging
from typing import TYPE_CHECKING

from archspec._util.lazy import lazy_exports
from archspec._version import __version__
from archspec.timm_bridge import hook as _timm_hook

_EXPORTS = {
    "ArchSpec": "archspec.spec", "load_spec": "archspec.ir.checked",
    "Analysis": "archspec.ir.analysis", "analyze": "archspec.ir.analysis",
    "Problem": "archspec.errors", "SpecError": "archspec.errors",
    "HeadSpec": "archspec.families.attention.heads",
    "ArchModel": "archspec.nn.model",
    "compile": "archspec.nn.compiler",
    "load": "archspec.io.artifact", "save": "archspec.io.artifact",
    "quantize": "archspec.deploy.int8", "load_quantized": "archspec.deploy.int8",
    "QuantizedModel": "archspec.deploy.int8",
    "export_onnx": "archspec.deploy.onnx_export",
    "register": "archspec.timm_bridge.registry",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from archspec.deploy.int8 import QuantizedModel, load_quantized, quantize
    from archspec.deploy.onnx_export import export_onnx
    from archspec.errors import Problem, SpecError
    from archspec.families.attention.heads import HeadSpec
    from archspec.io.artifact import load, save
    from archspec.ir.analysis import Analysis, analyze
    from archspec.ir.checked import load_spec
    from archspec.nn.compiler import compile
    from archspec.nn.model import ArchModel
    from archspec.spec import ArchSpec
    from archspec.timm_bridge.registry import register


_timm_hook.install()  # registers the shipped specs with timm once timm is imported (stdlib only here)


class _NoCudaHomeNotice(_logging.Filter):
    """Drops the one record torch logs when ``torch.utils.cpp_extension`` is imported on a machine without CUDA
    ("No CUDA runtime is found, using CUDA_HOME=..."): ``torch.utils.benchmark.Timer``, which every ``archspec
    build`` and ``search`` needs for its latency, imports that module, and the notice is about compiling C++/CUDA
    extensions, which archspec never does.  Every other record of that logger passes."""

    def filter(self, record: _logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No CUDA runtime is found")


_cpp_extension_log = _logging.getLogger("torch.utils.cpp_extension")
if not any(isinstance(f, _NoCudaHomeNotice) for f in _cpp_extension_log.filters):
    _cpp_extension_log.addFilter(_NoCudaHomeNotice())


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
