"""Device names from the command line (``--device``, ``--latency-device``): ``auto``, ``cpu``, ``cuda``, ``cuda:N``,
``mps``.

A module of its own, importing torch only: every ``archspec train`` and ``archspec search`` parses its device before
it can refuse a bad option, and :mod:`archspec.diagnostics.timing` (which re-exports both functions) also loads
Inductor's config and torch.utils.benchmark, about 2 s more of imports.
"""

from __future__ import annotations

import torch

from archspec.errors import SpecError

__all__ = ["parse_device", "resolve_device"]


def resolve_device(name: str) -> str:
    """``'auto'`` -> ``'cuda'`` when a GPU is present, else ``'cpu'``; any other name unchanged."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def parse_device(name: str, option: str = "--device") -> torch.device:
    """A torch device from a command-line value: ``auto``, ``cpu``, ``cuda``, ``cuda:N`` (``mps`` too).

    Raises:
        SpecError: unknown or unsupported device, or CUDA (or the CUDA device N) asked for where none is
            available (located at ``option``).
    """
    try:
        device = torch.device(resolve_device(name))
    except RuntimeError:
        raise SpecError.single((option,), f"unknown device {name!r}", "use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise SpecError.single((option,), f"unsupported device {name!r}", "use auto, cpu, cuda or cuda:N")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise SpecError.single((option,), f"device {name!r}: MPS (Apple GPU) is not available on this machine",
                               f"use {option} cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecError.single((option,), "CUDA is not available on this machine", f"use {option} cpu (or auto)")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise SpecError.single((option,), f"there is no {device} (this machine has {torch.cuda.device_count()} GPU(s))",
                               f"use {option} cuda:0")
    return device
