"""Run directories of ``archspec search``: atomic writes, provenance, trials.csv, plots, summaries.

Layout of ``runs/<study-name>/`` (or ``--out``)::

    .archspec-run             empty marker: this directory is archspec's (a non-empty --out without one is refused)
    study.db                  Optuna storage (SQLite, unless --storage points elsewhere)
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
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from archspec.errors import SpecError
from archspec.loader import load_spec
from archspec.spec import ArchSpec, spec_to_yaml

__all__ = [
    "check_run_dir", "prepare_run_dir", "RUN_MARKER", "atomic_write_text", "atomic_write_bytes", "atomic_savefig", "emit_spec",
    "provenance_header", "write_trials_csv", "trial_rows", "plot_pareto", "plot_history", "plot_als_heatmap",
    "replace_dir", "print_summary", "jsonable",
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
        raise SpecError.single(("--out",), "exists and is not a directory", None, str(out))
    if not out.is_dir():
        return
    try:
        entries = {p.name for p in out.iterdir()}
    except OSError as exc:
        raise SpecError.single(("--out",), f"cannot read the directory: {exc.strerror}", None, str(out)) from None
    if entries and not entries.intersection(_RUN_FILES):
        raise SpecError.single(("--out",), "is a directory with files that archspec did not write",
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
        raise SpecError.single(("--out",), f"cannot create the run directory: {exc.strerror}", None, str(out)) from None
    return out


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file in the same directory + ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_savefig(fig, path: Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())


def replace_dir(final: Path, files: dict[str, str]) -> Path:
    """Replace directory ``final`` by one holding exactly ``files`` (name -> text), as atomically as
    a directory swap allows: build a temporary sibling, move the old one aside, move the new one in."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    old = None
    try:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if final.exists():
            old = final.with_name(f".{final.name}.old.{os.getpid()}")
            if old.exists():
                shutil.rmtree(old)
            os.replace(final, old)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists():
            shutil.rmtree(old, ignore_errors=True)
    return final


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


# ----------------------------------------------------------------------------------- trials table
TRIAL_COLUMNS = ["number", "state", "status", "accuracy", "latency_ms", "macs", "params", "train_seconds",
                 "duration_s", "val_loss", "train_loss", "feasible", "fail_reason", "worker_pid",
                 "datetime_start", "datetime_complete", "reused_from", "duplicate_of", "arch_key"]


def _state_status(trial) -> str:
    from optuna.trial import TrialState

    if trial.state == TrialState.COMPLETE:
        return "reused" if "reused_from" in trial.user_attrs else "trained"
    if trial.state == TrialState.PRUNED:
        return trial.user_attrs.get("status", "pruned")
    if trial.state == TrialState.FAIL:
        return "failed"
    return trial.state.name.lower()


def trial_rows(trials: Iterable) -> tuple[list[str], list[dict]]:
    """(columns, rows) for every trial: fixed columns then ``param_<name>`` for each sampled parameter."""
    rows = []
    param_names: list[str] = []
    for t in trials:
        ua = t.user_attrs
        duration = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start else None
        constraints = t.constraints if hasattr(t, "constraints") else {}
        row = {
            "number": t.number,
            "state": t.state.name,
            "status": _state_status(t),
            "accuracy": ua.get("accuracy"),
            "latency_ms": ua.get("latency_ms"),
            "macs": ua.get("macs"),
            "params": ua.get("params"),
            "train_seconds": ua.get("train_seconds"),
            "duration_s": round(duration, 3) if duration is not None else None,
            "val_loss": ua.get("val_loss"),
            "train_loss": ua.get("train_loss"),
            "feasible": (all(v <= 0 for v in constraints.values()) if constraints else None),
            "fail_reason": ua.get("fail_reason") or ua.get("infeasible_reason"),
            "worker_pid": (ua.get("worker") or {}).get("pid") if isinstance(ua.get("worker"), dict) else None,
            "datetime_start": t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else None,
            "datetime_complete": t.datetime_complete.isoformat(timespec="seconds") if t.datetime_complete else None,
            "reused_from": ua.get("reused_from"), "duplicate_of": ua.get("duplicate_of"), "arch_key": ua.get("arch_key"),
        }
        for name, value in t.params.items():
            key = f"param_{name}"
            if key not in param_names:
                param_names.append(key)
            row[key] = value
        rows.append(row)
    return TRIAL_COLUMNS + param_names, rows


def write_trials_csv(trials: Sequence, path: Path) -> Path:
    """Write the trial table (see :func:`trial_rows`) as CSV, atomically."""
    columns, rows = trial_rows(trials)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    return atomic_write_text(path, buf.getvalue())


# ----------------------------------------------------------------------------------- plots
def _pyplot():
    import matplotlib

    if matplotlib.get_backend().lower() != "agg":
        try:
            matplotlib.use("Agg", force=True)
        except Exception:  # noqa: BLE001 - an interactive backend already in use: plotting still works
            pass
    import matplotlib.pyplot as plt

    return plt


def _subset_study(trials: Sequence, directions: Sequence[str], metric_names: Sequence[str] | None):
    """An in-memory study holding only ``trials`` (the plots show the trained, feasible ones)."""
    import optuna

    study = optuna.create_study(directions=list(directions))
    if metric_names:
        study.set_metric_names(list(metric_names))
    study.add_trials(trials)
    return study


def plot_pareto(trials: Sequence, path: Path, directions: Sequence[str], names: Sequence[str], title: str) -> Path | None:
    """Pareto front of the trained trials (``optuna.visualization.matplotlib.plot_pareto_front``), as PNG."""
    if not trials:
        return None
    import optuna

    plt = _pyplot()
    study = _subset_study(trials, directions, names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ax = optuna.visualization.matplotlib.plot_pareto_front(study, target_names=list(names))
    return _save_axes(ax, title, path, plt)


def _save_axes(ax, title: str, path: Path, plt) -> Path:
    """Title the Optuna plot's axes, write its figure atomically as PNG, and close it."""
    ax.set_title(title)
    try:
        atomic_savefig(ax.figure, path)
    finally:
        plt.close(ax.figure)
    return path


def plot_history(trials: Sequence, path: Path, direction: str, name: str, title: str) -> Path | None:
    """Optimisation history of a single-objective study (``plot_optimization_history``), as PNG."""
    if not trials:
        return None
    import optuna

    plt = _pyplot()
    study = _subset_study(trials, [direction], [name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ax = optuna.visualization.matplotlib.plot_optimization_history(study, target_name=name)
    return _save_axes(ax, title, path, plt)


def plot_als_heatmap(als: dict[str, Sequence[float]], path: Path, title: str,
                     masked: dict[str, Sequence[bool]] | None = None, thresholds: tuple[float, float] | None = None) -> Path:
    """Heatmap of ALS per layer (rows) x head (columns); masked heads are marked with 'M'.

    ``als`` maps a layer label to one score per head (layers may differ in head count: blanks).
    """
    import numpy as np

    plt = _pyplot()
    labels = list(als)
    width = max((len(v) for v in als.values()), default=1)
    grid = np.full((len(labels), width), np.nan)
    for i, label in enumerate(labels):
        grid[i, : len(als[label])] = list(als[label])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * width, 1.0 + 0.32 * len(labels)))
    image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for i, label in enumerate(labels):
        for j, value in enumerate(als[label]):
            flag = "M " if masked and label in masked and j < len(masked[label]) and masked[label][j] else ""
            ax.text(j, i, f"{flag}{value:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if value < 0.6 else "black")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xticks(range(width), [f"head {j}" for j in range(width)], fontsize=8)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    text = title
    if thresholds:
        text += f"\n(ALS >= {thresholds[0]:g}: mask all heads; <= {thresholds[1]:g}: remove; M = masked)"
    ax.set_title(text, fontsize=9)
    fig.colorbar(image, ax=ax, label="attention locality score")
    try:
        atomic_savefig(fig, path)
    finally:
        plt.close(fig)
    return path


# ----------------------------------------------------------------------------------- summary
def _fmt(value: Any, digits: int = 3) -> str:
    from archspec.analysis import human

    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return f"{value:.{digits}f}"
    if isinstance(value, int) and abs(value) >= 10_000:
        return human(value)
    return str(value)


def print_summary(summary: dict, console=None) -> None:
    """Print the human summary of a search (``rich``)."""
    from rich.console import Console
    from rich.table import Table

    from archspec.analysis import human

    console = console or Console(highlight=False)
    counts = summary.get("counts", {})
    console.print(f"[bold]archspec search[/bold] {summary.get('mode', '')}: study [bold]{summary['study']}[/bold] "
                  f"in {summary.get('storage')}")
    lines = []
    if summary.get("budgets"):
        b = summary["budgets"]
        shown = [f"MACs <= {human(b['macs'])}" if b.get("macs") else None,
                 f"params <= {human(b['params'])}" if b.get("params") else None,
                 f"latency <= {b['latency_ms']:g} ms" if b.get("latency_ms") else None]
        lines.append("budgets: " + (", ".join(s for s in shown if s) or "none"))
    if summary.get("static_check_rate"):
        lines.append(f"static check: {summary['static_check_rate']:,.0f} candidates/s (sample + IR analysis, no weights)")
    if counts:
        lines.append("trials in study: " + ", ".join(f"{v} {k}" for k, v in counts.items()) +
                     f"  (this run: {summary.get('trained_this_run', 0)} trained)")
    if summary.get("per_trial_seconds") is not None:
        lines.append(f"per trained trial: {summary['per_trial_seconds']:.1f} s median; wall {summary.get('wall_seconds', 0):.0f} s")
    if summary.get("candidates_per_hour"):
        lines.append(f"candidates evaluated: {summary['candidates_per_hour']:,.0f} per hour")
    fid = summary.get("fidelity")
    if fid:
        taus = ", ".join(f"{r['steps']} steps tau={r['kendall_tau']} (n={r['n']})" for r in fid["rung_correlations"])
        lines.append(f"multi-fidelity {fid['kind']}: rungs {fid['rungs']} (eta {fid['eta']}), "
                     f"{fid['stopped_this_run']} stopped early this run; rank correlation with the last rung: {taus}")
    if summary.get("data"):
        d = summary["data"]
        lines.append(f"data: {d.get('name')} ({d.get('train')} train / {d.get('val')} val images, "
                     f"{d.get('num_classes')} classes)")
    if summary.get("proxy"):
        p = summary["proxy"]
        lines.append("proxy: " + ", ".join(f"{k} {v}" for k, v in p.items() if k in ("steps", "image_size", "batch_size", "lr")))
    if summary.get("latency_protocol"):
        lp = summary["latency_protocol"]
        lines.append(f"latency: median of {lp.get('repeats')} after {lp.get('warmup')} warm-up, {lp.get('device')}, "
                     f"{lp.get('threads')} thread(s), batch {lp.get('batch')}, at the spec's input size")
    for line in lines:
        console.print("  " + line)
    points = summary.get("pareto") or []
    if points:
        table = Table(title=summary.get("table_title", "Pareto front (trained, feasible)"), title_justify="left")
        for col in ("rank", "trial", "accuracy", "latency ms", "MACs", "params", "spec"):
            table.add_column(col, justify="left" if col == "spec" else "right")
        for p in points:
            table.add_row(str(p.get("rank", "")), str(p["trial"]), _fmt(p.get("accuracy")), _fmt(p.get("latency_ms"), 2),
                          human(p["macs"]) if p.get("macs") is not None else "-",
                          human(p["params"]) if p.get("params") is not None else "-", str(p.get("file", "")))
        console.print(table)
    failures = summary.get("failures") or []
    if failures:
        console.print(f"  failed trials ({len(failures)}): " + "; ".join(f"#{f['trial']}: {f['reason']}" for f in failures[:5]))
    for note in summary.get("notes", []):
        console.print(f"  note: {note}")
    if summary.get("best"):
        console.print(f"  best: [bold]{summary['best']}[/bold]   (archspec build {summary['best']})")
    files = summary.get("files") or []
    if files:
        console.print("  wrote: " + ", ".join(files))


def now_iso() -> str:
    """UTC timestamp for provenance."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
