"""Run directories of ``archspec search``: the marker, emitted specs with provenance (atomic writes:
:mod:`archspec.io.atomic`, re-exported here).

Layout of ``runs/<study-name>/`` (or the config's ``out``; ``--out`` on the command line)::

    .archspec-run             empty marker: this directory is archspec's (a non-empty `out` without one is refused)
    study.db                  Optuna storage (SQLite, unless `storage` points elsewhere)
    latency.json              latency cache: median ms per (architecture, protocol)
    best.yaml                 the chosen spec (most accurate Pareto point / best trial / final mask placement)
    pareto/<rank>_trial<N>.yaml   mode 1, multi-objective: one spec per Pareto point, rank 0 = most accurate
    trials.csv                every trial of the study (all workers): state, objectives, MACs, params,
                              latency, fail reason, sampled parameters
    pareto.png                Pareto front (accuracy vs latency), or the optimisation history (single objective)
    als_round<k>.png, als.json    mode 2: ALS per layer x head (heatmap and values)
    summary.json              what the final summary printed

Every file is written to a temporary sibling and moved into place with :func:`os.replace`, so an
interrupted or failed run never leaves a half-written ``best.yaml``; every emitted spec is checked
with :func:`archspec.load_spec` (shape checks included) before it is written, so ``archspec build``
accepts it.

What goes into the files -- trials.csv, plots, the summary -- is :mod:`archspec.search._report.results`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from pathlib import Path
from typing import Any

import yaml

from archspec.errors import SpecError
from archspec.io.atomic import atomic_savefig, atomic_write_bytes, atomic_write_text, replace_dir
from archspec.ir.checked import load_spec
from archspec.spec import ArchSpec, spec_to_yaml

__all__ = [
    "check_run_dir", "prepare_run_dir", "RUN_MARKER", "atomic_write_text", "atomic_write_bytes", "atomic_savefig",
    "emit_spec",
    "provenance_header", "replace_dir", "jsonable", "now_iso",
]


# ----------------------------------------------------------------------------------- files
RUN_MARKER = ".archspec-run"  # written into every run directory archspec creates
# Files only a run writes: a directory holding one is a run directory (from before the marker existed).
_RUN_FILES = (RUN_MARKER, "study.db", "summary.json", "latency.json", "trials.csv", ".finalize.lock")


def check_run_dir(out: Path) -> None:
    """Check that ``out`` can be a run directory, writing nothing.

    It may be missing (it will be created), empty, or a run directory of an earlier search (resume);
    a non-empty directory without any file a run writes is someone else's, and a run would overwrite
    its ``best.yaml`` or ``summary.json``: refused.

    Raises:
        SpecError: ``out`` exists and is not a directory, or is a non-empty directory archspec did not make.
    """
    out = Path(out).expanduser()
    if os.path.lexists(out) and not out.is_dir():
        raise SpecError.single(("out",), "exists and is not a directory", None, str(out))
    if not out.is_dir():
        return
    try:
        entries = {p.name for p in out.iterdir()}
    except OSError as exc:
        raise SpecError.single(("out",), f"cannot read the directory: {exc.strerror}", None, str(out)) from None
    if entries and not entries.intersection(_RUN_FILES):
        raise SpecError.single(("out",), "is a directory with files that archspec did not write",
                               "give a new or empty directory, or the run directory of an earlier search", str(out))


def prepare_run_dir(out: Path) -> Path:
    """Create the run directory (and parents), marked as archspec's own (:data:`RUN_MARKER`).

    Raises:
        SpecError: what :func:`check_run_dir` refuses, or the directory cannot be created.
    """
    out = Path(out).expanduser()
    check_run_dir(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / RUN_MARKER).touch()
    except OSError as exc:
        raise SpecError.single(("out",), f"cannot create the run directory: {exc.strerror}", None, str(out)) from None
    return out


# ----------------------------------------------------------------------------------- provenance / specs
def jsonable(value: Any) -> Any:
    """Recursively turn tuples, paths, numpy scalars and non-finite floats into JSON-safe values."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and callable(value.item):
        try:
            return jsonable(value.item())
        except (TypeError, ValueError):
            pass
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    return str(value)


def provenance_header(prov: dict) -> str:
    """``prov`` as a YAML comment block (``# key: value`` lines, nested mappings flow-style)."""
    lines = ["# Generated by `archspec search` -- provenance:"]
    for key, value in prov.items():
        text = yaml.safe_dump(jsonable(value), default_flow_style=True, width=10_000, sort_keys=False).strip()
        text = text.removesuffix("\n...").removesuffix("...").strip()
        lines.append(f"#   {key}: {text}")
    lines.append("# Rebuild: archspec build <this file>")
    return "\n".join(lines) + "\n"


def _description(prov: dict) -> str:
    parts = []
    for key in ("study", "trial", "objectives", "macs", "params", "latency", "data", "proxy", "budgets", "strategy"):
        if key in prov and prov[key] is not None:
            value = prov[key]
            text = json.dumps(jsonable(value), separators=(",", ":")) if isinstance(value, (dict, list)) else str(value)
            parts.append(f"{key}={text}")
    text = "archspec search: " + "; ".join(parts)
    return text[:1990]


def emit_spec(spec: ArchSpec | dict, path: Path, name: str, prov: dict) -> tuple[ArchSpec, str]:
    """Write ``spec`` to ``path`` with a provenance comment header and description; return (spec, text).

    The spec is renamed to ``name`` and its ``description`` set to a one-line provenance summary;
    the text is re-loaded with :func:`load_spec` (full shape checks) before the atomic write.

    Raises:
        SpecError: the result does not validate (nothing is written then).
    """
    data = spec.model_dump(mode="json") if isinstance(spec, ArchSpec) else json.loads(json.dumps(spec))
    data["name"] = name
    data["description"] = _description(prov)
    checked = load_spec(data)
    text = provenance_header(prov) + spec_to_yaml(checked)
    again = load_spec(text)  # exactly what `archspec build` will read
    if again.model_dump() != checked.model_dump():  # pragma: no cover - YAML round trip is exact
        raise SpecError.single((), "emitted spec does not round-trip through YAML", None, str(path))
    if path is not None:
        atomic_write_text(path, text)
    return checked, text


def now_iso() -> str:
    """UTC timestamp for provenance."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
