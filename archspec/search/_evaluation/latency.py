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

import hashlib
import json
import os
import platform
import tempfile
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch

from archspec.diagnostics.timing import compile_for_inference, largest_batch, measure_forward, resolve_device
from archspec.families.attention.heads import without_unused_new_kinds
from archspec.io.builddir import staging_prefix
from archspec.nn.compiler import compile as compile_spec
from archspec.spec import ArchSpec, ConvStageSpec

__all__ = ["LatencyProtocol", "LatencyCache", "architecture_key", "measure_latency"]

_IGNORED = ("name", "description", "source", "seed")


@dataclass(frozen=True)
class LatencyProtocol:
    """How latency is measured (:func:`archspec.diagnostics.timing.measure_forward`).

    Default = LeViT's CPU protocol: one thread, batch 1, float32; the figure is the median ms of one
    forward pass.  ``device='cuda'`` (or ``'auto'`` on a GPU machine) with ``batch=None`` is LeViT's GPU
    protocol: the largest power-of-two batch that fits, bf16 autocast; the figure is then ms per image
    (``1000 / images_per_s``) so candidates measured at different batches compare.  ``compile=True`` times the
    model under ``torch.compile`` (:func:`archspec.diagnostics.timing.compile_for_inference`: Inductor, freezing); its
    compilation runs before the warm-up and is never timed (``archspec search --latency-compile``).
    """

    device: str = "cpu"
    threads: int = 1
    batch: int | None = 1
    warmup: int = 5
    repeats: int = 20
    compile: bool = False

    def key(self) -> str:
        """Cache key of the protocol on this machine (CPU model and torch version included); ``|compile`` is
        appended for compiled latency only, so caches written before the option keep their eager entries."""
        return (f"{self.device}|threads={self.threads}|batch={self.batch}|warmup={self.warmup}|repeats={self.repeats}"
                f"|{_machine()}|torch={torch.__version__}" + ("|compile" if self.compile else ""))

    def describe(self) -> dict:
        """JSON-ready dict."""
        return asdict(self)


@lru_cache(maxsize=1)
def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return model


def architecture_key(spec: ArchSpec) -> str:
    """sha256 (hex) of the canonical resolved spec without ``name``, ``description``, ``source`` and ``seed``.

    Canonical: every default explicit, and each stage's ``attention`` / ``layers`` / ``mixer`` /
    ``drop_path`` replaced by its resolved per-layer plans, so two spellings of the same layers (one
    override 0-23, or 0-7 plus a default) share a key, whatever their names or init seeds.
    """
    data = without_unused_new_kinds(spec.model_dump(mode="json", exclude=set(_IGNORED)))
    for i, stage in enumerate(data["stages"]):  # per-layer resolved heads, mixer and drop path: one spelling
        if isinstance(spec.stages[i], ConvStageSpec):  # conv stages have one spelling already
            continue
        for key in ("attention", "layers", "mixer", "drop_path"):
            stage.pop(key, None)
        stage["plans"] = without_unused_new_kinds(
            [plan.model_dump(mode="json", exclude={"origin"}) for plan in spec.layer_plans(i)])
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class LatencyCache:
    """A JSON file ``{architecture key: {protocol key: ms}}``; ``path=None`` keeps it in memory only.

    Safe for two processes: every ``put`` re-reads the file, merges, writes a temporary file in the same
    directory and ``os.replace`` s it (atomic), so a reader never sees half a file; a corrupt or
    unreadable file is treated as empty (and overwritten by the next ``put``).
    """

    def __init__(self, path: Path | None):
        self.path = Path(path) if path is not None else None
        self._memory: dict[str, dict[str, float]] = {}

    def _read(self) -> dict[str, dict[str, float]]:
        if self.path is None:
            return self._memory
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if isinstance(v, dict)}

    def get(self, key: str, protocol: LatencyProtocol) -> float | None:
        """Cached milliseconds, or ``None``."""
        value = self._read().get(key, {}).get(protocol.key())
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def put(self, key: str, protocol: LatencyProtocol, ms: float) -> None:
        """Store ``ms`` (merged with what other processes wrote meanwhile)."""
        data = self._read()
        data.setdefault(key, {})[protocol.key()] = float(ms)
        if self.path is None:
            self._memory = data
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)

        fd, tmp = tempfile.mkstemp(prefix=staging_prefix(self.path.name, "", ".tmp")[1:], suffix=".tmp",
                                   dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def __len__(self) -> int:
        return len(self._read())


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
    if protocol.compile:  # static shapes: probe the GPU batch eagerly, then compile once at it

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
