"""Inference latency of a candidate, measured the way LeViT reports CPU speed, and cached.

LeViT (sec. 5.1, "Speed"): CPU timings use a single thread at batch 1.  :class:`LatencyProtocol`'s
defaults are exactly that; the model runs at the spec's *real* input size (not the proxy's), in
``eval`` mode under ``torch.inference_mode``; the result is the median of ``repeats`` timed forward
passes after ``warmup`` untimed ones, in milliseconds.

Measurements are cached per architecture (:func:`architecture_key`: name, description, source and
seed do not change speed) and per protocol and machine (CPU model, torch version), in a JSON file
that two processes may share.
"""

from __future__ import annotations

import torch

from archspec.diagnostics.timing import compile_for_inference, largest_batch, measure_forward, resolve_device
from archspec.nn.compiler import compile as compile_spec
from archspec.search._evaluation.latency_cache import LatencyCache, architecture_key
from archspec.search._evaluation.protocols import LatencyProtocol
from archspec.spec import ArchSpec

__all__ = ["LatencyProtocol", "LatencyCache", "architecture_key", "measure_latency"]

def measure_latency(spec: ArchSpec, protocol: LatencyProtocol = LatencyProtocol(),
                    cache: LatencyCache | None = None) -> float:
    """Median forward time in milliseconds of ``spec`` at its real input size (see the module docstring).

    ``protocol.threads`` torch threads during the measurement, restored afterwards.  With a
    ``cache``, a known architecture is not measured again.

    Raises:
        SpecError: the spec is invalid.
        RuntimeError: the device is not available.
    """

    key = architecture_key(spec)
    if cache is not None:
        cached = cache.get(key, protocol)
        if cached is not None:
            return cached
    device = torch.device(resolve_device(protocol.device))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("latency protocol asks for cuda, but no GPU is available")
    with torch.random.fork_rng(devices=[]):
        model = compile_spec(spec)
    c, (h, w) = spec.input.channels, spec.input.resolution
    batch = protocol.batch
    if protocol.torch_compile:  # static shapes: probe the GPU batch eagerly, then compile once at it

        model = model.eval().to(device)
        if batch is None and device.type == "cuda":
            batch = largest_batch(model, (c, h, w), device, torch.bfloat16)
        model = compile_for_inference(model)
    result = measure_forward(model, (c, h, w), device, threads=protocol.threads, batch=batch,
                             warmup=protocol.warmup, repeats=protocol.repeats)
    ms = result.ms if protocol.batch is not None else 1e3 / result.images_per_s
    if cache is not None:
        cache.put(key, protocol, ms)
    return ms
