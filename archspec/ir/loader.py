"""Loading a spec that is known to compile: the schema (:mod:`archspec.spec`) then the shape checks
(:mod:`archspec.ir.plan`).

This module sits after both, so the import order reads top to bottom -- yaml -> spec -> walk -> plan ->
loader -> compiler -> model -- with no circle (spec.py used to import the graph lazily for these checks).  It
imports neither torch nor networkx.
"""

from __future__ import annotations

import os

from archspec.errors import SpecError
from archspec.ir.plan import check_spec
from archspec.spec import ArchSpec, parse_spec

__all__ = ["load_spec"]


def load_spec(source: str | os.PathLike | dict | ArchSpec, check: bool = True,
              max_memory: float | None = None) -> ArchSpec:
    """Load and validate a spec.

    Args:
        source: a path to a YAML file, the name of a shipped spec (``"mait_tiny_sch2"``), YAML text,
            a dict, or an :class:`ArchSpec` (returned re-checked).  An ``os.PathLike`` is always a
            path.  A ``str`` is YAML text when it contains a newline, is blank, or -- unless it names
            an existing file or ends in ``.yaml`` / ``.yml`` -- starts with ``{``, ``[`` or ``---`` or
            holds ``key: value`` (``"{name: t, stages: ...}"``); otherwise it is a path or a shipped name
            (:func:`archspec.spec.yaml_source.is_yaml_text`).
        check: also run the shape checks of :func:`archspec.ir.plan.build_plan` (token grids,
            windows, head arithmetic) and the memory limit.  ``False`` gives schema validation only.  The
            plan it was checked with is kept by the spec's content: a later ``build_plan`` or ``build_graph``
            (analysis, compile, the search's static check and proxy) reuses it while the spec is unchanged.
        max_memory: with ``check``, the limit in bytes on the estimated memory of a batch-1 float32
            forward (:func:`archspec.ir.plan.check_memory`); ``None``: ``archspec.ir.plan.DEFAULT_MAX_MEMORY``
            (8 GiB); ``math.inf``: no limit.

    Raises:
        SpecError: every problem found, each with file, line, column and field path; for a file also
            a missing file, a directory, FIFO or device, a file over 1 MB, bytes that are not UTF-8.
        TypeError: ``source`` is none of the types above.
    """
    spec, locator = parse_spec(source)
    if check:
        problems = check_spec(spec, max_memory)
        if problems:
            raise SpecError(problems).located(locator)
    return spec
