"""archspec: a declarative architecture compiler for vision transformers with convolutional biases.

The path from YAML to ``nn.Module`` is three steps, each a module: :mod:`archspec.spec` (pydantic
models, YAML loading), :mod:`archspec.graph` (networkx IR with shapes, parameter and MAC counts) and
:mod:`archspec.compile` (IR -> :class:`~archspec.model.ArchModel` from :mod:`archspec.blocks`).

    >>> from archspec import compile
    >>> model = compile("mait_tiny_sch2")          # a shipped spec, a path, YAML text or a dict
    >>> model.spec.name, model.num_classes
    ('mait_tiny_sch2', 1000)
"""

from archspec.analysis import Analysis, analyze
from archspec.artifact import load, save
from archspec.compile import compile
from archspec.errors import Problem, SpecError
from archspec.heads import HeadSpec
from archspec.model import ArchModel
from archspec.spec import ArchSpec, load_spec

__version__ = "0.1.0"

__all__ = ["ArchSpec", "ArchModel", "Analysis", "HeadSpec", "Problem", "SpecError", "analyze", "compile", "load",
           "load_spec", "save", "__version__"]
