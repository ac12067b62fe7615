"""The base of every spec model: unknown keys are errors, types are strict.

Every pydantic model of the spec language -- :mod:`archspec.spec` and each block family's
``rules.py`` -- derives from :class:`StrictModel`, so the families can define their spec models
without importing :mod:`archspec.spec` (which imports them).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

__all__ = ["StrictModel", "HINT", "DropPathRate"]

#: A validator's ``ValueError`` text ``"message" + HINT + "hint"`` becomes a located problem's message and
#: hint (:func:`archspec.spec.parse_spec` splits it there).
HINT = "\nhint: "


class StrictModel(BaseModel):
    """Base for every spec model: unknown keys are errors, types are strict, values are validated on assignment.

    Strict types mean ``depth: true`` or ``heads: "4"`` are errors rather than silently 1 and 4; the
    tuple-valued fields (resolution, window, layer range, drop path) opt out so YAML lists work.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, strict=True)


def _drop_path_shape(value: Any) -> Any:
    """One rate, or a pair ``[first, last]`` (a YAML list becomes the tuple strict mode takes)."""
    if isinstance(value, (list, tuple)) and len(value) != 2:
        raise ValueError(f"drop_path must be one rate or a pair [first, last], got {len(value)} values")
    if isinstance(value, bool) or not isinstance(value, (int, float, list, tuple)):
        raise ValueError(f"drop_path must be a number in [0, 1) or a pair [first, last], got {value!r}")
    if isinstance(value, list):  # strict mode takes tuples only; YAML gives lists
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in value):
            raise ValueError(f"drop_path rates must be numbers, got {value!r}")
        return tuple(float(v) for v in value)
    return value


def _drop_path_range(value: Any) -> Any:
    rates = value if isinstance(value, tuple) else (value,)
    if any(not 0.0 <= r < 1.0 for r in rates):
        raise ValueError("drop path rates must be in [0, 1)")
    return value


#: A stage's stochastic-depth rate (timm ``drop_path_rate``): one rate in [0, 1) for every block, or a pair
#: ``[first, last]`` spaced linearly over the stage's blocks.  Raises ``ValueError`` (a located problem) otherwise.
DropPathRate = Annotated[float | tuple[float, float], BeforeValidator(_drop_path_shape),
                         AfterValidator(_drop_path_range)]
