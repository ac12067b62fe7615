"""What the subcommand modules share: option parsers (``--resolution``, ``--max-memory``), the rich console,
and loading a SPEC or a build DIR argument with the overrides applied and every error located.

Torch-free at import (``validate``, ``list``, ``schema`` and ``--help`` never import torch).
"""

from __future__ import annotations

import argparse
import re
import sys

from archspec._util.memory import parse_memory
from archspec.errors import Problem, SpecError

__all__ = ["whole_number", "MAX_MEMORY_HELP", "load_artifact_arg", "load_spec_arg", "make_console", "parse_max_memory",
           "parse_resolution"]


def parse_resolution(text: str) -> tuple[int, int]:
    """``--resolution`` value: ``N`` or ``HxW`` (also ``H,W``) -> ``(H, W)`` pixels.

    Raises:
        argparse.ArgumentTypeError: anything else.
    """
    match = re.fullmatch(r"\s*(\d+)\s*(?:[xX,]\s*(\d+)\s*)?", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected N or HxW, got {text!r}")
    h = int(match.group(1))
    return h, int(match.group(2) or h)


def whole_number(option: str, minimum: int = 1, maximum: int | None = None):
    """argparse type of ``option``: a whole number in ``minimum..maximum`` (argparse reports a bad one with exit 2,
    before anything runs)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value

    return parse


def parse_max_memory(text: str) -> int:
    """``--max-memory`` value: ``32G`` -> bytes (binary units, :func:`archspec._util.memory.parse_memory`)."""

    try:
        return parse_memory(text)
    except SpecError as exc:
        raise argparse.ArgumentTypeError(exc.problems[0].message + f" ({exc.problems[0].hint})") from None


MAX_MEMORY_HELP = ("refuse specs whose batch-1 float32 forward is estimated to need more memory than this "
                   "(weights + buffers + peak activations; default 8G; binary units: 32G = 32 GiB)")


def make_console(stderr: bool = False):
    """A rich console on stdout (or stderr), 120 columns when not a terminal."""
    from rich.console import Console

    return Console(stderr=stderr, width=None if sys.stdout.isatty() else 120, highlight=False)


def load_spec_arg(spec_arg: str, resolution: tuple[int, int] | None = None, seed: int | None = None,
          max_memory: int | None = None):
    """Load and fully check a spec (after the --resolution/--seed overrides), under the memory limit
    ``max_memory`` bytes (None: the library default, 8 GiB)."""
    from archspec.ir.checked import load_spec  # the spec parser and the IR: once the arguments parsed

    spec = load_spec(spec_arg, check=resolution is None and seed is None, max_memory=max_memory)
    if resolution is not None or seed is not None:
        update = {}
        if resolution is not None:
            update["input"] = spec.input.model_copy(update={"resolution": resolution})
        if seed is not None:
            if not 0 <= seed < 2**31:
                raise SpecError.single(("--seed",), f"seed must be in [0, 2^31), got {seed}")
            update["seed"] = seed
        data = spec.model_copy(update=update).model_dump()
        try:
            spec = load_spec(data, max_memory=max_memory)
        except SpecError as exc:  # the override broke a shape check: say which option did it
            raise SpecError([Problem(p.path, p.message + (" (after --resolution)" if resolution else ""), p.hint,
                                     spec_arg, None, None) for p in exc.problems]) from None
    return spec


def load_artifact_arg(directory: str, allow_spec_change: bool, max_memory: float | None,
                   resolution: tuple[int, int] | None = None):
    """`archspec validate DIR`: load the saved model (at ``resolution`` if given, its tables resampled);
    warnings (an artifact without digest) go to stderr."""
    import warnings

    from archspec.io import artifact


    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = artifact.load(directory, allow_spec_change=allow_spec_change, max_memory=max_memory,
                              img_size=resolution)
    for warning in caught:
        print(f"archspec validate: warning: {warning.message}", file=sys.stderr)
    return model
