"""archspec: a declarative architecture compiler for vision transformers with convolutional biases.

The path from YAML to ``nn.Module`` is three steps, each a module: :mod:`archspec.spec` (pydantic
models, YAML loading), :mod:`archspec.graph` (networkx IR with shapes, parameter and MAC counts) and
:mod:`archspec.compiler` (IR -> :class:`~archspec.model.ArchModel` from :mod:`archspec.blocks`).

    >>> from archspec import compile
    >>> model = compile("mait_tiny_sch2")          # a shipped spec, a path, YAML text or a dict
    >>> model.spec.name, model.num_classes
    ('mait_tiny_sch2', 1000)

Names are imported on first use (PEP 562), so ``archspec validate`` and static analysis never pay
for importing torch and timm.  The shipped specs become timm models (``timm.create_model(
"archspec_mait_tiny_sch2")``) as soon as timm is imported too (:mod:`archspec.registry`).
"""

from __future__ import annotations

import logging as _logging
from typing import TYPE_CHECKING

from archspec import registry as _registry
from archspec.lazy import lazy_exports

__version__ = "0.1.0"

_EXPORTS = {
    "ArchSpec": "archspec.spec", "load_spec": "archspec.loader",
    "Analysis": "archspec.analysis", "analyze": "archspec.analysis",
    "Problem": "archspec.errors", "SpecError": "archspec.errors",
    "HeadSpec": "archspec.families.attention.heads",
    "ArchModel": "archspec.model",
    "compile": "archspec.compiler",
    "load": "archspec.artifact", "save": "archspec.artifact",
    "quantize": "archspec.deploy.int8", "load_quantized": "archspec.deploy.int8",
    "QuantizedModel": "archspec.deploy.int8",
    "export_onnx": "archspec.deploy.onnx_export",
    "register": "archspec.registry",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from archspec.analysis import Analysis, analyze
    from archspec.artifact import load, save
    from archspec.compiler import compile
    from archspec.deploy.int8 import QuantizedModel, load_quantized, quantize
    from archspec.deploy.onnx_export import export_onnx
    from archspec.errors import Problem, SpecError
    from archspec.families.attention.heads import HeadSpec
    from archspec.loader import load_spec
    from archspec.model import ArchModel
    from archspec.registry import register
    from archspec.spec import ArchSpec


_registry.install()  # registers the shipped specs with timm once timm is imported (no torch import here)


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
