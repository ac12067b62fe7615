"""The IR's check of a spec: :func:`load_spec` returns an :class:`~archspec.spec.ArchSpec` (a spec, not IR) that
passed the schema (:mod:`archspec.spec`) and the IR's shape checks (:mod:`archspec.ir.plan`), so it is known to
compile.

This module sits after both, so the import order reads top to bottom -- yaml -> spec -> walk -> plan ->
checked -> compiler -> model -- with no circle (spec.py used to import the graph lazily for these checks).  It
imports neither torch nor networkx.  :func:`with_resolution` gives a spec at another input size, re-checked
(the compiler's ``img_size`` and ``ArchModel.set_input_size``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from archspec.errors import Problem, SpecError
from archspec.families.attention.heads import at_other_resolution
from archspec.ir.plan import check_spec
from archspec.spec import ArchSpec, parse_spec

__all__ = ["load_spec", "with_resolution"]


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


def with_resolution(spec: ArchSpec, img_size: int | Sequence[int]) -> ArchSpec:
    """``spec`` at input resolution ``img_size`` (an int or ``(H, W)`` in pixels), fully re-checked.

    At a size other than the spec's own, each head is what its kind makes of it there
    (:func:`~archspec.families.attention.heads.at_other_resolution`: Swin's windows get ``clamp: true``, timm's rule
    for a window larger than its grid, which the spec's own size refuses).

    Raises:
        SpecError: the spec is invalid at that size; every problem names the size.
    """

    size = tuple(int(v) for v in (img_size if isinstance(img_size, Iterable) else (img_size, img_size)))
    data = spec.model_dump()
    if size != tuple(spec.input.resolution):  # the head kinds' rules at another size (Swin's windows clamp)
        data = at_other_resolution(data)
    data["input"] = {**data["input"], "resolution": size}
    try:
        return load_spec(data)
    except SpecError as exc:
        raise SpecError([Problem(p.path, f"{p.message} (at img_size {size[0]}x{size[1]})", p.hint, p.file, p.line,
                                 p.column) for p in exc.problems]) from None
