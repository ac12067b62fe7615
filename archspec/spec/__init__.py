"""The spec language: the pydantic models of a spec (:mod:`archspec.spec.models`), reading one from a path, a
shipped name, YAML text or a dict (:mod:`~archspec.spec.parsing`), YAML loading with line numbers
(:mod:`~archspec.spec.yaml_source`), the JSON Schema (:mod:`~archspec.spec.schema`) and the Markdown field
reference (:mod:`~archspec.spec.reference`).

Torch-free.  The names of :mod:`archspec.spec.models` and :mod:`archspec.spec.parsing` are re-exported here, so
``from archspec.spec import ArchSpec`` is the way users import them.
"""

# the names of models.py's and parsing.py's __all__, so each list lives in one place
from archspec.spec import models as _models
from archspec.spec import parsing as _parsing
from archspec.spec.models import *  # noqa: F403
from archspec.spec.parsing import *  # noqa: F403

__all__ = _models.__all__ + _parsing.__all__
