"""Forward latency measurement and device parsing, shared by ``archspec build`` and the search.

Latency is measured, not estimated: the median of repeated forward passes after warm-up, in
inference mode, synchronised on CUDA so that a reading covers the whole kernel queue.
"""

from __future__ import annotations

import statistics
import time

import torch

from archspec.errors import SpecError


def parse_device(name: str, option: str = "--device") -> torch.device:
    """A torch device from a command-line value.

    Raises:
        SpecError: unknown or unsupported device, or CUDA asked for where none is available
            (located at ``option``).
    """
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SpecError.single((option,), f"unknown device {name!r}", "use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise SpecError.single((option,), f"unsupported device {name!r}", "use cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SpecError.single((option,), "CUDA is not available on this machine", f"use {option} cpu")
    return device


def median_forward_ms(model: torch.nn.Module, x: torch.Tensor, repeats: int = 10, warmup: int = 2) -> float:
    """Median wall time in ms of ``model(x)`` over ``repeats`` runs after ``warmup`` untimed runs.

    Runs in ``torch.inference_mode``; on CUDA the device is synchronised before and after each run.
    ``x`` is the batch as given, e.g. ``(B, C, H, W)``.

    Raises:
        ValueError: ``repeats < 1``.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    cuda = x.device.type == "cuda"
    times = []
    with torch.inference_mode():
        for i in range(warmup + repeats):
            if cuda:
                torch.cuda.synchronize(x.device)
            start = time.perf_counter()
            model(x)
            if cuda:
                torch.cuda.synchronize(x.device)
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
