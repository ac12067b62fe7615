"""The latency cache, torch-free: :func:`architecture_key` (what identifies an architecture's speed) and
:class:`LatencyCache` (a JSON file two processes may share).  :mod:`~archspec.search._evaluation.latency` measures
and re-exports both."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from archspec.families.attention.heads import without_unused_new_kinds
from archspec.io.builddir import staging_prefix
from archspec.search._evaluation.protocols import LatencyProtocol
from archspec.spec import ArchSpec, ConvStageBase
from archspec.spec.stable import stable_dump

__all__ = ["LatencyCache", "architecture_key"]

_IGNORED = ("name", "description", "source", "seed")


def architecture_key(spec: ArchSpec) -> str:
    """sha256 (hex) of the canonical resolved spec without ``name``, ``description``, ``source`` and ``seed``.

    Canonical: every default explicit, and each stage's ``attention`` / ``layers`` / ``mixer`` /
    ``drop_path`` replaced by its resolved per-layer plans, so two spellings of the same layers (one
    override 0-23, or 0-7 plus a default) share a key, whatever their names or init seeds.
    """
    data = stable_dump(spec, exclude=set(_IGNORED))
    for i, stage in enumerate(data["stages"]):  # per-layer resolved heads, mixer and drop path: one spelling
        if isinstance(spec.stages[i], ConvStageBase):  # conv stages have one spelling already
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
