"""The base of every spec model: unknown keys are errors, types are strict.

Every pydantic model of the spec language -- :mod:`archspec.spec` and each block family's
``rules.py`` -- derives from :class:`StrictModel`, so the families can define their spec models
without importing :mod:`archspec.spec` (which imports them).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel", "HINT"]

#: A validator's ``ValueError`` text ``"message" + HINT + "hint"`` becomes a located problem's message and
#: hint (:func:`archspec.spec.parse_spec` splits it there).
HINT = "\nhint: "


class StrictModel(BaseModel):
    """Base for every spec model: unknown keys are errors, types are strict, values are validated on assignment.

    Strict types mean ``depth: true`` or ``heads: "4"`` are errors rather than silently 1 and 4; the
    tuple-valued fields (resolution, window, layer range, drop path) opt out so YAML lists work.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)
