"""The spec language: the pydantic models of a spec (:mod:`archspec.spec.models`), YAML loading with line
numbers (:mod:`~archspec.spec.yaml_source`), the JSON Schema (:mod:`~archspec.spec.schema`) and the Markdown
field reference (:mod:`~archspec.spec.reference`).

Torch-free.  The names of :mod:`archspec.spec.models` are re-exported here, so ``from archspec.spec import
ArchSpec`` is the way users import them.
"""

# the names of models.py's __all__, so the list lives in one place
from archspec.spec.models import *  # noqa: F403
from archspec.spec.models import __all__  # noqa: F401
