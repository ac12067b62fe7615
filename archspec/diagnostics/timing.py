"""Forward latency, measured one way for ``archspec build`` and ``archspec search``, and device parsing.

Latency is measured, not estimated, with ``torch.utils.benchmark.Timer`` (explicit thread count; it
synchronises CUDA around each timed run) in ``eval`` mode under ``torch.inference_mode``, following
LeViT's two protocols (sec. 5.1, "Speed"):

* **CPU**: batch 1, one thread by default (``threads``); the figure is the median time of one forward
  pass in ms.
* **GPU**: the largest power-of-two batch that fits in memory (up to :data:`MAX_GPU_BATCH`), mixed
  precision (bf16 autocast); the figure is images/s (and the median time of one batch).

Both report ``ms`` (median per forward of ``batch`` images) and ``images_per_s`` = ``batch / ms * 1000``.

Compiled latency (``archspec build --torch-compile``, ``archspec search --latency-compile``) times the model returned by
:func:`compile_for_inference` the same way; its first call, which compiles, is a warm-up run and never timed.
"""

from __future__ import annotations

import statistics
from contextlib import nullcontext
from dataclasses import asdict, dataclass

import torch
from torch._inductor import config
from torch.utils.benchmark import Timer

from archspec.diagnostics.devices import parse_device, resolve_device

__all__ = ["Latency", "measure_forward", "parse_device", "resolve_device", "MAX_GPU_BATCH", "compile_for_inference",
           "COMPILE_OPTIONS", "CompiledForInference", "inductor_options"]

MAX_GPU_BATCH = 2048  # LeViT's GPU protocol: largest power of two that fits; capped so probing stays short


@dataclass(frozen=True)
class Latency:
    """One latency measurement.

    Attributes:
        ms: median wall time of one forward pass of ``batch`` images, in ms.
        images_per_s: ``batch * 1000 / ms``.
        batch, threads, device, warmup, repeats: the protocol it was measured under; ``amp``: the autocast
            dtype (``"bfloat16"``) or ``None`` for float32.
    """

    ms: float
    images_per_s: float
    batch: int
    threads: int
    device: str
    warmup: int
    repeats: int
    amp: str | None

    def describe(self) -> dict:
        """JSON-ready dict, with the statistic named."""
        return {**asdict(self), "statistic": "median", "timer": "torch.utils.benchmark.Timer"}


def _timed_runs(model: torch.nn.Module, x: torch.Tensor, threads: int, warmup: int, repeats: int, amp) -> list[float]:
    """Seconds of each of ``repeats`` forward passes after ``warmup`` untimed ones.  ``Timer.timeit(1)``
    itself runs the statement twice untimed before its timed run, so a median never includes a cold run."""

    autocast = torch.autocast(x.device.type, dtype=amp) if amp is not None else nullcontext()
    timer = Timer(stmt="model(x)", globals={"model": model, "x": x}, num_threads=threads)
    with torch.inference_mode(), autocast:
        if warmup:
            timer.timeit(warmup)
        return [timer.timeit(1).median for _ in range(repeats)]


def largest_batch(model: torch.nn.Module, shape: tuple[int, int, int], device: torch.device, amp) -> int:
    """LeViT's GPU protocol: the largest power-of-two batch whose forward fits in memory."""
    batch, fits = 1, 0
    autocast = torch.autocast(device.type, dtype=amp) if amp is not None else nullcontext()
    while batch <= MAX_GPU_BATCH:
        try:
            with torch.inference_mode(), autocast:
                model(torch.randn(batch, *shape, device=device))
            torch.cuda.synchronize(device)
        except torch.cuda.OutOfMemoryError:
            break
        fits, batch = batch, batch * 2
    torch.cuda.empty_cache()
    if not fits:
        raise torch.cuda.OutOfMemoryError(f"one image does not fit on {device}")
    return fits


def measure_forward(model: torch.nn.Module, shape: tuple[int, int, int], device: str | torch.device = "cpu",
                    threads: int = 1, batch: int | None = None, warmup: int = 5, repeats: int = 20) -> Latency:
    """Time ``model`` on random images of ``shape`` ``(C, H, W)`` under LeViT's protocol for ``device``.

    The model is put in ``eval`` mode and moved to ``device``.  CPU: ``batch`` defaults to 1, float32,
    ``threads`` torch threads (restored afterwards).  CUDA: ``batch`` defaults to the largest power of
    two that fits (:func:`largest_batch`), bf16 autocast.

    Raises:
        ValueError: ``repeats < 1``, ``warmup < 0`` or ``threads < 1``.
        torch.cuda.OutOfMemoryError: not even one image fits on the GPU.
    """
    if repeats < 1 or warmup < 0 or threads < 1:
        raise ValueError(f"need repeats >= 1, warmup >= 0, threads >= 1; got {repeats}, {warmup}, {threads}")
    device = torch.device(resolve_device(str(device)))
    model = model.eval().to(device)
    amp = torch.bfloat16 if device.type == "cuda" else None
    if batch is None:
        batch = largest_batch(model, shape, device, amp) if device.type == "cuda" else 1
    x = torch.randn(batch, *shape, device=device)
    seconds = statistics.median(_timed_runs(model, x, threads, warmup, repeats, amp))
    ms = seconds * 1e3
    return Latency(ms=ms, images_per_s=batch * 1e3 / ms, batch=batch, threads=threads, device=str(device),
                   warmup=warmup, repeats=repeats, amp=str(amp).removeprefix("torch.") if amp else None)


# Inductor's freezing treats the weights as constants (inference only): it folds them into the graph and prepacks
# them for oneDNN, and it is what lowers an int8 PT2E graph to int8 kernels (archspec.deploy.int8).  One setting for
# every compiled model, so float32 and int8 compile alike.  It is set around each call (Inductor's config is
# global) rather than passed as torch.compile(options=...): with the option, torch 2.15's freezing pass fails on
# the int8 graph (onednn.qconv_prepack under fake tensors) while the global setting works.
COMPILE_OPTIONS = {"freezing": True}


def inductor_options():
    """Context manager setting :data:`COMPILE_OPTIONS` in Inductor's config (``torch._inductor.config.patch``);
    every call of a model compiled for inference runs inside it, since a new batch size recompiles."""

    return config.patch(COMPILE_OPTIONS)


class CompiledForInference(torch.nn.Module):
    """``torch.compile`` (Inductor, default mode, static shapes) of an inference model, each call under
    :func:`inductor_options` (freezing).  Images ``(B, C, H, W)`` -> the model's output; the weights are the
    wrapped model's (``model``).

    At the first call with an input shape, the model is captured with ``torch.export`` at that shape and the
    captured graph is compiled (the time :func:`archspec.deploy.build.first_call` measures); each shape has its
    own graph.
    Compiling the exported graph rather than ``model.forward`` keeps every compiled model apart: Dynamo keeps
    compiled code per Python code object, which all models of one class share, so compiling many of them in one
    process (a search, a benchmark) would pass its recompile limit (8) and silently fall back to eager, and make
    each model's calls check the others' guards.  The same export also gives a whole graph (no graph breaks) and
    is the capture the int8 path and the ONNX export use.  Inductor generates its CPU kernels for the thread
    count set at the first call: compile under the thread count you will time with.
    Source: PyTorch ``torch.export``, ``torch.compile``; Inductor ``config.freezing``.
    """

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model.eval()
        object.__setattr__(self, "_runners", {})  # (shape, dtype, device) -> compiled graph; not sub-modules

    def _apply(self, fn, recurse=True):  # .to() / .cuda(): the compiled graphs hold the old tensors
        self._runners.clear()
        return super()._apply(fn, recurse)

    def forward(self, x: torch.Tensor):
        """The compiled model's output for ``x``, without autograd (freezing is for inference only)."""
        key = (tuple(x.shape), x.dtype, x.device)
        with torch.no_grad(), inductor_options():
            runner = self._runners.get(key)
            if runner is None:
                self.model(x)  # eager once: fills eval-mode caches (timm LeViT's attention biases) before export
                with torch.inference_mode(False):
                    program = torch.export.export(self.model, (x.clone(),), strict=False).module()
                runner = self._runners[key] = torch.compile(program, dynamic=False)
            return runner(x)


def compile_for_inference(model: torch.nn.Module) -> CompiledForInference:
    """:class:`CompiledForInference` of ``model`` (put in eval mode): ``torch.export`` at each input shape, then
    ``torch.compile`` (Inductor, freezing, static shapes), compiled at the first call.  Images ``(B, C, H, W)``
    -> the model's output (logits ``(B, classes)``), equal to eager up to float rounding.

    Raises (at the first call of a shape, not here): what ``torch.export`` raises for a model it cannot capture,
    and Inductor's errors (e.g. no C++ compiler on a CPU); ``archspec build --torch-compile`` turns them into a
    located message (:func:`archspec.deploy.build.first_call`).
    Source: PyTorch ``torch.export`` and ``torch.compile`` (Inductor ``config.freezing``)."""
    return CompiledForInference(model)
