"""What a search reports when it ends: trials.csv, the chosen specs, the plot and the summary.

* progress while it runs: :mod:`archspec.search._report.progress`;
* the trial table: :func:`trial_rows` / :func:`write_trials_csv` (``trials.csv``, every worker's trials);
* results of an Optuna search: :func:`write_results` -- counts and failures into the summary, ``best.yaml``,
  ``pareto/<rank>_trial<N>.yaml`` (Pareto objective) and ``pareto.png``;
* plots: :mod:`archspec.search._report.plots` (PNG, written atomically);
* the summary: :func:`summary_json` (``summary.json``) and :func:`print_summary` (the tables the CLI prints).

The run directory itself -- its marker, atomic writes, emitted specs with provenance -- is
:mod:`archspec.search._report.run_files`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from rich.console import Console
from rich.table import Table

from archspec._util.units import human
from archspec.ir.checked import load_spec
from archspec.search._evaluation.protocols import GEOMETRY_ATTR
from archspec.search._report import run_files
from archspec.search._report.plots import plot_history, plot_pareto

__all__ = ["TRIAL_COLUMNS", "trial_status", "trial_rows", "write_trials_csv", "is_feasible", "spec_of_trial",
           "trial_provenance", "write_results", "summary_json", "print_summary"]


# ----------------------------------------------------------------------------------- trials table
TRIAL_COLUMNS = ["number", "state", "status", "accuracy", "latency_ms", "macs", "params", "plan", "train_seconds",
                 "duration_s", "val_loss", "train_loss", "loss_sum", "score", "feasible", "fail_reason", "worker_pid",
                 "datetime_start", "datetime_complete", "reused_from", "duplicate_of", "arch_key", "proxy_grids",
                 "oracle_seed"]


def trial_status(trial) -> str:
    """What became of a trial: trained, reused, failed, or its pruned status (infeasible, duplicate, stopped)."""
    if trial.state == TrialState.COMPLETE:
        return "reused" if "reused_from" in trial.user_attrs else "trained"
    if trial.state == TrialState.PRUNED:
        return trial.user_attrs.get("status", "pruned")
    if trial.state == TrialState.FAIL:
        return "failed"
    return trial.state.name.lower()


def _trial_row(t) -> dict:
    """The fixed :data:`TRIAL_COLUMNS` of one trial (seconds for durations, ISO times)."""
    ua = t.user_attrs
    duration = ((t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and t.datetime_start
                else None)
    constraints = t.constraints if hasattr(t, "constraints") else {}
    return {
        "number": t.number, "state": t.state.name, "status": trial_status(t),
        "accuracy": ua.get("accuracy"), "latency_ms": ua.get("latency_ms"), "macs": ua.get("macs"),
        "params": ua.get("params"), "plan": ua.get("plan"), "train_seconds": ua.get("train_seconds"),
        "duration_s": round(duration, 3) if duration is not None else None,
        "val_loss": ua.get("val_loss"), "train_loss": ua.get("train_loss"),
        "loss_sum": ua.get("loss_sum"), "score": ua.get("score"),  # TSE, and the value it was ranked by
        "feasible": (all(v <= 0 for v in constraints.values()) if constraints else None),
        "fail_reason": ua.get("fail_reason") or ua.get("infeasible_reason"),
        "worker_pid": (ua.get("worker") or {}).get("pid") if isinstance(ua.get("worker"), dict) else None,
        "datetime_start": t.datetime_start.isoformat(timespec="seconds") if t.datetime_start else None,
        "datetime_complete": t.datetime_complete.isoformat(timespec="seconds") if t.datetime_complete else None,
        "reused_from": ua.get("reused_from"), "duplicate_of": ua.get("duplicate_of"), "arch_key": ua.get("arch_key"),
        "proxy_grids": grids_text(t),
        "oracle_seed": ua.get("oracle_seed"),  # --oracle: the table seed whose row answered
    }


def trial_rows(trials: Iterable) -> tuple[list[str], list[dict]]:
    """(columns, rows) for every trial: fixed columns then ``param_<name>`` for each sampled parameter."""
    rows = []
    param_names: list[str] = []
    for t in trials:
        row = _trial_row(t)
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
    return run_files.atomic_write_text(path, buf.getvalue())


# ----------------------------------------------------------------------------------- results of an Optuna search
def is_feasible(trial) -> bool:
    """Every budget constraint of the trial holds (``value / budget - 1 <= 0``); a trial without budgets is."""
    return all(v <= 0 for v in trial.constraints.values())


def spec_of_trial(trial, space=None):
    """The :class:`~archspec.spec.ArchSpec` a trial evaluated (user attr ``spec``, else re-sampled from its params).

    Raises:
        ValueError: the trial stored no spec and no ``space`` was given to re-sample it.
    """

    data = trial.user_attrs.get("spec")
    if data is not None:
        return load_spec(data)
    if space is None:
        raise ValueError(f"trial {trial.number} has no stored spec")
    return space.sample(optuna.trial.FixedTrial(trial.params, trial.number))


def trial_provenance(study_name: str, trial, cfg, info, summary: dict, spec) -> dict:
    """The provenance block of an emitted spec (``cfg``: the :class:`~archspec.search._engine.config.SearchConfig`,
    ``info``: the storage, :class:`~archspec.search._storage.StorageInfo`)."""
    ua = trial.user_attrs
    objectives = {"accuracy": ua.get("accuracy")}
    if ua.get("latency_ms") is not None:
        objectives["latency_ms"] = round(float(ua["latency_ms"]), 3)
    return {
        "study": study_name, "trial": trial.number, "storage": info.url, "objectives": objectives,
        "macs": ua.get("macs"), "params": ua.get("params"), "input": list(spec.input.resolution),
        "latency": summary.get("latency_protocol"), "data": summary.get("data"), "proxy": summary.get("proxy"),
        "budgets": summary.get("budgets"), "objective": cfg.objective, "sampler": cfg.sampler, "seed": cfg.seed,
        "created": run_files.now_iso(),
    }


def _grids(trial) -> dict:
    """The trial's proxy and real stage grids (``{}`` when it has none recorded)."""
    geometry = trial.user_attrs.get(GEOMETRY_ATTR)
    if not geometry:
        return {}
    return {"proxy_grids": geometry["grids"], "real_grids": geometry["real_grids"],
            "proxy_image_size": geometry["image_size"]}


def grids_text(trial) -> str | None:
    """``14x14>7x7>4x4`` for the trial's proxy grids (``None`` when not recorded)."""
    geometry = trial.user_attrs.get(GEOMETRY_ATTR)
    return ">".join(f"{r}x{c}" for r, c in geometry["grids"]) if geometry else None


def _geometries(trained: list) -> list[dict]:
    """Each distinct (real grids -> proxy grids, proxy input size) among trained trials, with its count."""
    seen: dict[str, dict] = {}
    for t in trained:
        grids = _grids(t)
        if grids:
            entry = seen.setdefault(json.dumps(grids, sort_keys=True), {**grids, "trials": 0})
            entry["trials"] += 1
    return list(seen.values())


def _count_trials(trials: list, summary: dict) -> list:
    """Counts per status, failures and the median trained-trial time into ``summary``; returns the trained trials.

    A reused trial is a copy of its original's result: counted and listed, never ranked twice."""
    counts: dict[str, int] = {}
    for t in trials:
        key = trial_status(t)
        counts[key] = counts.get(key, 0) + 1
    summary["counts"] = counts
    summary["failures"] = [{"trial": t.number, "reason": t.user_attrs.get("fail_reason", "unknown")}
                           for t in trials if t.state == TrialState.FAIL]
    trained = [t for t in trials if t.state == TrialState.COMPLETE and "reused_from" not in t.user_attrs]
    durations = [t.duration.total_seconds() for t in trained if t.duration is not None]
    summary["per_trial_seconds"] = round(statistics.median(durations), 2) if durations else None
    summary["trained_total"] = len(trained)
    summary["proxy_geometries"] = _geometries(trained)
    return trained


def write_results(study, space, cfg, run_dir: Path, info, summary: dict, multi: bool,
                  finalize_extra: Callable | None = None) -> Path | None:
    """Counts, failures and timings into ``summary``; trials.csv, the Pareto specs (``multi``) or the best spec,
    the plot; then ``finalize_extra(study, run_dir, summary, files, best_file)`` (a mode's own files).

    Returns ``best.yaml``'s path, or ``None`` when no trained feasible trial exists yet (a note says so).
    ``summary["files"]`` lists what was written.  Raises what writing a file raises (``OSError``).
    """
    trials = study.get_trials(deepcopy=False)
    trained = _count_trials(trials, summary)
    files = []
    write_trials_csv(trials, run_dir / "trials.csv")
    files.append("trials.csv")
    feasible = [t for t in trained if is_feasible(t)]
    write = _write_pareto if multi else _write_best_trial
    best_file = write(study, space, cfg, run_dir, info, summary, feasible, files)
    if finalize_extra is not None:
        best_file = finalize_extra(study, run_dir, summary, files, best_file) or best_file
    if best_file is not None:
        files.insert(0, "best.yaml")
        summary["best"] = str(best_file)
    else:
        summary["notes"].append("no trained feasible trial yet: no best.yaml written")
    files.append("summary.json")
    summary["files"] = files
    return best_file


def _emit_trial(trial, space, cfg, info, summary: dict, **extra) -> str:
    """The YAML text of ``trial``'s spec, renamed ``<study>_trial<N>``, with its provenance (and ``extra``)."""
    spec = spec_of_trial(trial, space)
    prov = {**trial_provenance(summary["study"], trial, cfg, info, summary, spec), **extra}
    _, text = run_files.emit_spec(spec, None, f"{summary['study']}_trial{trial.number}"[:100], prov)
    return text


def _score_label(cfg) -> str:
    """What the search ranked by (``--proxy-score``), for plot axes and table titles."""
    return "proxy accuracy" if getattr(cfg.protocol, "score", "accuracy") == "accuracy" else "proxy -TSE/step"


def _ranked_by(trial, cfg) -> dict:
    """A front point's proxy accuracy, and with ``--proxy-score tse`` the score it was ranked by."""
    value = trial.values[0]
    if getattr(cfg.protocol, "score", "accuracy") == "accuracy":
        return {"accuracy": value}
    return {"accuracy": trial.user_attrs.get("accuracy"), "score": value}


def _write_pareto(study, space, cfg, run_dir: Path, info, summary: dict, feasible: list,
                  files: list[str]) -> Path | None:
    """Pareto mode: one spec per front point under ``pareto/`` (rank 0 = most accurate, also ``best.yaml``), the
    front into ``summary["pareto"]``, and ``pareto.png``."""
    front = [t for t in study.best_trials if is_feasible(t) and "reused_from" not in t.user_attrs] if feasible else []
    front.sort(key=lambda t: (-t.values[0], t.values[1], t.number))
    pareto_files, points, best_file = {}, [], None
    for rank, t in enumerate(front):
        fname = f"{rank}_trial{t.number}.yaml"
        pareto_files[fname] = _emit_trial(t, space, cfg, info, summary, pareto_rank=rank)
        points.append({"rank": rank, "trial": t.number, **_ranked_by(t, cfg), "latency_ms": t.values[1],
                       "macs": t.user_attrs.get("macs"), "params": t.user_attrs.get("params"),
                       "plan": t.user_attrs.get("plan"), **_grids(t), "file": f"pareto/{fname}"})
    if pareto_files:
        run_files.replace_dir(run_dir / "pareto", pareto_files)
        files.append(f"pareto/ ({len(pareto_files)} specs)")
        best_file = run_files.atomic_write_text(run_dir / "best.yaml", pareto_files[f"0_trial{front[0].number}.yaml"])
    _plot(summary, files, plot_pareto, feasible, run_dir / "pareto.png", ["maximize", "minimize"],
          [_score_label(cfg), "latency (ms)"], f"{summary['study']}: {len(feasible)} trained feasible trials")
    summary["table_title"] = f"Pareto front: {_score_label(cfg)} vs latency (trained, feasible)"
    summary["pareto"] = points
    return best_file


def _write_best_trial(study, space, cfg, run_dir: Path, info, summary: dict, feasible: list,
                      files: list[str]) -> Path | None:
    """Single-objective mode: the most accurate feasible trial as ``best.yaml`` and the optimisation history plot."""
    best_trial = max(feasible, key=lambda t: (t.value, -t.number)) if feasible else None
    points, best_file = [], None
    if best_trial is not None:
        best_file = run_files.atomic_write_text(run_dir / "best.yaml", _emit_trial(best_trial, space, cfg, info,
        summary))
        points.append({"rank": 0, "trial": best_trial.number, **_ranked_by(best_trial, cfg),
                       "latency_ms": best_trial.user_attrs.get("latency_ms"),
                       "macs": best_trial.user_attrs.get("macs"), "params": best_trial.user_attrs.get("params"),
                       "plan": best_trial.user_attrs.get("plan"),
                       "file": "best.yaml"})
    _plot(summary, files, plot_history, feasible, run_dir / "pareto.png", "maximize", _score_label(cfg),
          f"{summary['study']}: optimisation history ({len(feasible)} trained feasible)")
    summary["table_title"] = f"best trial (single objective: {_score_label(cfg)}, budgets as constraints)"
    summary["best_trial"] = best_trial.number if best_trial is not None else None
    summary["pareto"] = points
    return best_file


def _plot(summary: dict, files: list[str], plot, *args) -> None:
    """``plot(*args)`` into ``pareto.png``; a failing plot becomes a note, never a lost search."""
    try:
        if plot(*args):
            files.append("pareto.png")
    except Exception as exc:  # noqa: BLE001 - a plot must never lose the search results
        summary["notes"].append(f"pareto.png not written: {type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------------- summary
def summary_json(obj) -> str:
    """``obj`` as indented JSON text (:func:`archspec.search._report.run_files.jsonable` first: non-finite floats
    become null)."""
    return json.dumps(run_files.jsonable(obj), indent=2) + "\n"


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "-"
        return f"{value:.{digits}f}"
    if isinstance(value, int) and abs(value) >= 10_000:
        return human(value)
    return str(value)


def _budget_line(b: dict) -> str:
    shown = [f"MACs <= {human(b['macs'])}" if b.get("macs") else None,
             f"params <= {human(b['params'])}" if b.get("params") else None,
             f"latency <= {b['latency_ms']:g} ms" if b.get("latency_ms") else None]
    return "budgets: " + (", ".join(s for s in shown if s) or "none")


def _fidelity_line(fid: dict) -> str:
    taus = ", ".join(f"{r['steps']} steps tau={r['kendall_tau']} (n={r['n']})" for r in fid["rung_correlations"])
    return (f"multi-fidelity {fid['kind']}: rungs {fid['rungs']} (eta {fid['eta']}), "
            f"{fid['stopped_this_run']} stopped early this run; rank correlation with the last rung: {taus}")


def _protocol_lines(summary: dict) -> list[str]:
    """The data, proxy-training and latency protocols, one line each (those the summary has)."""
    lines = []
    if summary.get("data"):
        d = summary["data"]
        lines.append(f"data: {d.get('name')} ({d.get('train')} train / {d.get('val')} val images, "
                     f"{d.get('num_classes')} classes)")
    if summary.get("proxy"):
        p = summary["proxy"]
        lines.append("proxy: " + ", ".join(f"{k} {v}" for k, v in p.items()
                                           if k in ("steps", "image_size", "batch_size", "lr")))
    if summary.get("latency_protocol"):
        lp = summary["latency_protocol"]
        lines.append(f"latency: median of {lp.get('repeats')} after {lp.get('warmup')} warm-up, {lp.get('device')}, "
                     f"{lp.get('threads')} thread(s), batch {lp.get('batch')}, at the spec's input size")
    return lines


def _summary_lines(summary: dict) -> list[str]:
    """The indented facts under the summary's title: budgets, speeds, counts, protocols."""
    counts = summary.get("counts", {})
    lines = [_budget_line(summary["budgets"])] if summary.get("budgets") else []
    if summary.get("static_check_rate"):
        lines.append(f"static check: {summary['static_check_rate']:,.0f} candidates/s "
                     "(sample + IR analysis, no weights)")
    if counts:
        lines.append("trials in study: " + ", ".join(f"{v} {k}" for k, v in counts.items()) +
                     f"  (this run: {summary.get('trained_this_run', 0)} trained)")
    if summary.get("per_trial_seconds") is not None:
        lines.append(f"per trained trial: {summary['per_trial_seconds']:.1f} s median; "
                     f"wall {summary.get('wall_seconds', 0):.0f} s")
    if summary.get("candidates_per_hour"):
        lines.append(f"candidates evaluated: {summary['candidates_per_hour']:,.0f} per hour")
    if summary.get("fidelity"):
        lines.append(_fidelity_line(summary["fidelity"]))
    if summary.get("zero_cost"):
        lines.append(_zero_cost_line(summary["zero_cost"]))
    for geometry in summary.get("proxy_geometries") or []:
        lines.append(_geometry_line(geometry))
    return lines + _protocol_lines(summary)


def _zero_cost_line(zc: dict) -> str:
    """The zero-cost rung: what it kept, its cost per candidate, each score's tau with the trained accuracy."""
    taus = ", ".join(f"{name} {v['tau']}" for name, v in zc["kendall_tau"].items() if v["tau"] is not None)
    seconds = zc["seconds_per_candidate"]
    return (f"zero-cost rung: {zc['scored']} scored, {zc['trained']} trained (top 1/{zc['eta']} by {zc['score']})"
            + (f", {seconds:.2f} s per candidate" if seconds is not None else "")
            + (f"; Kendall tau with trained accuracy: {taus}" if taus else ""))


def _geometry_line(g: dict) -> str:
    """``proxy grids 14x14>7x7 at 56x56 px (real 14x14>7x7): 5 trained``."""
    def grids(gs: list) -> str:
        return ">".join(f"{r}x{c}" for r, c in gs)

    size = "x".join(str(v) for v in g["proxy_image_size"])
    return f"proxy grids {grids(g['proxy_grids'])} at {size} px (real {grids(g['real_grids'])}): {g['trials']} trained"


def _points_table(summary: dict):
    """The Pareto front / best trial as a ``rich`` table."""
    table = Table(title=summary.get("table_title", "Pareto front (trained, feasible)"), title_justify="left")
    scored = any("score" in p for p in summary["pareto"])  # --proxy-score tse: the value it was ranked by
    # the stage plan (C-C-T-T) where a design has conv stages: a hybrid space's answer is its plan
    planned = any("C" in (p.get("plan") or "") for p in summary["pareto"])
    columns = ("rank", "trial", *(("score",) if scored else ()), "accuracy", "latency ms", "MACs", "params",
               *(("plan",) if planned else ()), "spec")
    for col in columns:
        table.add_column(col, justify="left" if col == "spec" else "right")
    for p in summary["pareto"]:
        score = (_fmt(p.get("score")),) if scored else ()
        rank = str(p.get("rank", "")) + (" ~" if p.get("within_seed_spread") else "")  # --verify: a tie in noise
        table.add_row(rank, str(p["trial"]), *score, _fmt(p.get("accuracy")),
                      _fmt(p.get("latency_ms"), 2), human(p["macs"]) if p.get("macs") is not None else "-",
                      human(p["params"]) if p.get("params") is not None else "-",
                      *((p.get("plan") or "-",) if planned else ()), str(p.get("file", "")))
    return table


def verify_lines(verification: dict | None) -> list[str]:
    """What ``--verify`` found, for the printed summary: each re-trained design's two scores, the rank agreement of
    the two seeds and the seed spread (:mod:`archspec.search._engine.verify`).  Nothing without a verification."""
    if not verification:
        return []

    designs = "; ".join(f"#{d['trial']} {_fmt(d['score'][0])} -> {_fmt(d['score'][1])}"
                        for d in verification["designs"])
    lines = [f"verified: the front's best {verification['k']} trained again with seed "
             f"{verification['designs'][0]['seeds'][1]}: {designs}"]
    tau, spread = verification.get("rank_agreement"), verification.get("seed_spread")
    if spread is not None:
        lines.append(f"seed spread {spread:.4f}" + (f", rank agreement of the two seeds tau {tau:.2f}"
                                                    if tau is not None else "")
                     + ": front points within the spread of the next better one are marked ~ (the proxy cannot "
                       "order them)")
    return lines


def print_summary(summary: dict, console=None) -> None:
    """Print the human summary of a search (``rich``; ``console`` defaults to stdout's)."""
    console = console or Console(highlight=False)
    console.print(f"[bold]archspec search[/bold] {summary.get('mode', '')}: study [bold]{summary['study']}[/bold] "
                  f"in {summary.get('storage')}")
    for line in _summary_lines(summary):
        console.print("  " + line)
    if summary.get("pareto"):
        console.print(_points_table(summary))
    for line in verify_lines(summary.get("verify")):
        console.print("  " + line)
    failures = summary.get("failures") or []
    if failures:
        console.print(f"  failed trials ({len(failures)}): "
                      + "; ".join(f"#{f['trial']}: {f['reason']}" for f in failures[:5]))
    for note in summary.get("notes", []):
        console.print(f"  note: {note}")
    if summary.get("best"):
        console.print(f"  best: [bold]{summary['best']}[/bold]   (archspec build {summary['best']})")
    files = summary.get("files") or []
    if files:
        console.print("  wrote: " + ", ".join(files))
