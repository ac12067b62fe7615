"""The old home of the ``mask`` head kind, kept as an import path: the kind is :mod:`.kinds.mask`.

``archspec.search`` still imports ``parse_window`` from here; import from
:mod:`archspec.families.attention.kinds.mask` in new code (this module goes when the search does).
"""

from __future__ import annotations

from .kinds.mask import (
    FIELD,
    LEGEND,
    NO_WEIGHT_DECAY,
    SHORTHANDS,
    WINDOW_PATTERN,
    MaskSpec,
    alpha_to_logit,
    parse_window,
)

__all__ = ["MaskSpec", "FIELD", "SHORTHANDS", "LEGEND", "WINDOW_PATTERN", "parse_window", "alpha_to_logit",
           "NO_WEIGHT_DECAY"]
