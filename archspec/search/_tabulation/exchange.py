"""A table study's rows out and in, and the seed check: :func:`study_rows`, :func:`export_table` (the JSON lines +
``.meta.json`` sidecar :func:`archspec.search.load_table` reads), :func:`import_table` (an existing table's rows
into a study, so that export gives the same rows, byte for byte, in the same order) and :func:`seed_check`.

The study itself -- protocol, order, workers -- is :mod:`archspec.search._tabulation.tabulate`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from archspec._util.urls import hide_password
from archspec.errors import SpecError
from archspec.io.builddir import uncreatable, writable_dir
from archspec.search._evaluation.latency_cache import architecture_key
from archspec.search._space.language import SearchSpace, load_space
from archspec.search._tabulation.oracle import load_table, table_path
from archspec.search._tabulation.tabulate import (
    STATUS_ATTR,
    machine,
    open_table_study,
    ordered_points,
    protocol_id,
    table_protocol,
    trial_pair,
)

__all__ = ["study_rows", "export_table", "import_table", "seed_check"]


# ----------------------------------------------------------------------------------------------- rows out / in
def study_rows(space: str | SearchSpace, storage: str | None = None, protocol: dict | None = None) -> list[dict]:
    """The rows of the table study, one per (point, seed): the first COMPLETE trial of each pair, in the order
    they were completed (imported rows first, in their file's order).

    Raises:
        SpecError: no such table in the storage, another protocol.
    """
    space = space if isinstance(space, SearchSpace) else load_space(space)
    study, _ = open_table_study(space, protocol or table_protocol(space), storage, create=False)
    complete = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                      key=lambda t: (t.user_attrs.get("import_line", math.inf), t.datetime_complete, t.number))
    rows, seen = [], set()
    for t in complete:
        pair = trial_pair(t)
        if pair is None or pair in seen or "row" not in t.user_attrs:
            continue
        seen.add(pair)
        rows.append(t.user_attrs["row"])
    return rows


def export_table(space: str | SearchSpace, out: str | os.PathLike, *, storage: str | None = None,
                 protocol: dict | None = None, reference_seeds: Sequence[int] | None = None,
                 command: str | None = None) -> tuple[Path, int]:
    """Write the table study's rows as ``out`` (JSON lines, one row per pair) and ``<out stem>.meta.json`` (protocol,
    protocol_id, reference seeds, machine, commits): the format :func:`archspec.search._tabulation.oracle.load_table`
    reads.  The sidecar's ``reference_seeds`` (the seeds a design needs for the oracle to answer it) are
    ``reference_seeds`` where given, else those of the sidecar being replaced, else the seeds every exported design
    has (a table tabulated with ``--seeds 0`` names ``[0]``, not the default three it never trained).
    Returns ``(path, rows)``.  Both files are replaced atomically.

    Raises:
        SpecError: no such table, another protocol, ``out`` not ending in ``.jsonl``, ``out`` an existing file
            archspec did not write (not a table of the same protocol): never overwritten; no seed common to every
            design when no reference seeds are named.
    """
    space = space if isinstance(space, SearchSpace) else load_space(space)
    protocol = protocol or table_protocol(space)
    path = Path(out).expanduser()
    if path.suffix != ".jsonl":
        raise SpecError.single(("out",), "a table file ends in .jsonl", f"e.g. {space.name}.jsonl", str(out))
    meta_path = path.with_suffix(".meta.json")
    _check_writable(path, str(out))
    _check_overwrite(path, meta_path, protocol, str(out))
    rows = study_rows(space, storage, protocol)
    if not rows:
        raise SpecError.single(("out",), f"the table of {space.name} has no trained pair yet", None, str(out))
    old_meta = _read_json(meta_path) if meta_path.is_file() else {}
    commits = list(dict.fromkeys([*old_meta.get("commits", []), *(r.get("commit") for r in rows if r.get("commit"))]))
    row_machines = sorted({r["machine"] for r in rows if r.get("machine")} | set(old_meta.get("row_machines", [])))
    meta = {"protocol": protocol, "protocol_id": protocol_id(protocol),
            "reference_seeds": _reference_seeds(rows, reference_seeds, old_meta),
            "command": hide_password(command or old_meta.get("command") or f"archspec table {space.name}"),
            "machine": old_meta.get("machine") or machine(), "commits": commits, "row_machines": row_machines}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))
        _atomic_write(meta_path, json.dumps({**old_meta, **meta}, indent=1) + "\n")
    except OSError as exc:  # a disk that filled, a directory made read-only since the check
        raise SpecError.single(("out",), f"cannot write it: {exc.strerror or exc}", None, str(out)) from None
    return path, len(rows)


def _reference_seeds(rows: list[dict], given: Sequence[int] | None, old_meta: dict) -> list[int]:
    """The sidecar's reference seeds: ``given``, else the replaced sidecar's, else the seeds every design in ``rows``
    has (sorted)."""
    if given:
        return sorted(set(given))
    if old_meta.get("reference_seeds"):
        return list(old_meta["reference_seeds"])
    by_design: dict[str, set[int]] = {}
    for row in rows:
        by_design.setdefault(row["key"], set()).add(int(row["seed"]))
    common = sorted(set.intersection(*by_design.values()))
    if not common:
        raise SpecError.single(("seeds",), "no seed is trained for every design in the table, so it would answer "
                               "for none", "name the reference seeds with `seeds` (e.g. 0 1 2)")
    return common


def _check_writable(path: Path, name: str) -> None:
    """Refuse an ``out`` archspec cannot write before the study is read: a missing folder under a file (``afile/
    x.jsonl``), or a folder it may not write (the table and its sidecar are replaced by a rename there)."""
    blocked = uncreatable(path)
    if blocked is None and path.exists() and not writable_dir(path.parent):
        blocked = f"{path.parent} is not writable (permissions, a read-only or immutable directory)"
    if blocked is not None:
        raise SpecError.single(("out",), f"cannot be created: {blocked}", "give another `out`", name)


def _check_overwrite(path: Path, meta_path: Path, protocol: dict, name: str) -> None:
    if not path.exists() and not meta_path.exists():
        return
    if path.exists() and not path.is_file():
        raise SpecError.single(("out",), "not a regular file", None, name)
    meta = _read_json(meta_path) if meta_path.is_file() else None
    if not isinstance(meta, dict) or meta.get("protocol_id") != protocol_id(protocol):
        raise SpecError.single(("out",), "the file exists and is not a table of this protocol (archspec "
                               "overwrites only a table it wrote: same protocol_id in its .meta.json sidecar)",
                               "export to a new file", name)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.archspec-tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def import_table(space: str | SearchSpace, table: str | os.PathLike, *, storage: str | None = None,
                 protocol: dict | None = None) -> int:
    """Put the rows of an existing table file (``bench/space_table.py``'s or an export) into the table study as
    COMPLETE trials, skipping pairs the study has; returns how many were added.  Export then writes them back in
    the same order, byte for byte.

    Raises:
        SpecError: the file is not a table (:func:`archspec.search.load_table`'s checks), or it was written
            under another protocol than the study's.
    """
    space = space if isinstance(space, SearchSpace) else load_space(space)
    protocol = protocol or table_protocol(space)
    try:
        source = load_table(table)
    except SpecError as exc:  # the loader speaks of the search's `oracle`, its other reader
        raise exc.renamed("oracle", "table") from None
    pid = protocol_id(protocol)
    lines = _row_lines(table_path(table))  # a shipped table's name, as load_table read it
    foreign = sorted({r.get("protocol_id") for r in lines} - {pid}, key=str)
    if foreign:
        raise SpecError.single(("table",), f"rows of another protocol ({', '.join(map(str, foreign))}; this "
                               f"table's is {pid})", None, str(table))
    _check_points(space, lines, source.lines, str(table))
    del source
    study, _ = open_table_study(space, protocol, storage, create=True)
    have = {p for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if (p := trial_pair(t))}
    new = []
    for n, row in enumerate(lines):
        pair = (row["key"], row["seed"])
        if pair in have:
            continue
        have.add(pair)
        new.append(optuna.trial.create_trial(
            value=row["final_accuracy"],
            user_attrs={"key": row["key"], "seed": row["seed"], "index": row.get("index"), "row": row,
                        "import_line": n, STATUS_ATTR: "trained"}))
    study.add_trials(new)
    return len(new)


def _check_points(space: SearchSpace, rows: list[dict], lines: dict[tuple[str, int], int], name: str) -> None:
    """Every row is of a point of ``space``: its key is a point's architecture key and its params that point's
    Optuna parameters (``lines``: ``(key, seed)`` -> the row's line, :attr:`OracleTable.lines`).

    Raises:
        SpecError: at ``table``, naming the file and the first row's line that is of no point.
    """
    points = {architecture_key(spec): params for _, params, spec in ordered_points(space)}
    for row in rows:
        key, line = row["key"], lines.get((row["key"], row["seed"]))
        if key not in points:
            raise SpecError.single(("table",), f"line {line}: design {key[:12]} is no point of space {space.name}",
                                   f"import a table of {space.name}'s points (what archspec table {space.name} "
                                   "exports)", name)
        if row["params"] != points[key]:
            raise SpecError.single(("table",), f"line {line}: design {key[:12]}: its params are not those of the "
                                   f"point its key names ({points[key]})", "a row's params and key are one point",
                                   name)


def _row_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ----------------------------------------------------------------------------------------------- seed check
def seed_check(rows: Sequence[dict]) -> dict[str, Any]:
    """Does the reference reproduce itself?  Kendall tau between seed 0's and seed 1's final accuracies, and
    between two disjoint k-seed means of the same points: ``two_seed_means`` (seeds 0-1 against 2-3) and
    ``three_seed_means`` (seeds 0-2 against 3-5, the seed check's criterion: >= 0.7), each with a 95 % bootstrap
    interval (points resampled, 1,000 times, seeded) and the mean / min / max tau over every split of the 2k seeds
    in two.  Source: ``bench/space_table.py --report`` (issue 32), unchanged.  Raises nothing."""
    from scipy.stats import kendalltau  # noqa: PLC0415 - scipy loads only for the report

    by: dict[str, dict[int, float]] = {}
    for r in rows:
        by.setdefault(r["key"], {})[r["seed"]] = r["final_accuracy"]
    pairs = [(v[0], v[1]) for v in by.values() if 0 in v and 1 in v]
    if len(pairs) < 3:
        return {"designs": len(pairs)}
    tau, p = kendalltau(*zip(*pairs))
    diffs = [abs(a - b) for a, b in pairs]
    means = [(a + b) / 2 for a, b in pairs]
    out: dict[str, Any] = {"designs": len(pairs), "tau": round(float(tau), 4), "p": float(p),
                           "mean_abs_seed_diff": round(sum(diffs) / len(diffs), 4),
                           "accuracy_range": [round(min(means), 4), round(max(means), 4)]}
    for k, name in ((2, "two_seed_means"), (3, "three_seed_means")):
        report = _split_means(by, k, kendalltau)
        if report is not None:
            out[name] = report
    return out


def _split_means(by: dict, k: int, kendalltau: Callable) -> dict | None:
    """:func:`seed_check`'s k-seed means split in two halves, with ``kendalltau`` (scipy's, imported there)."""
    seeds = tuple(range(2 * k))
    designs = [v for v in by.values() if all(s in v for s in seeds)]
    if len(designs) < 3:
        return None
    acc = np.array([[d[s] for s in seeds] for d in designs])  # (designs, 2k)
    a, b = acc[:, :k].mean(1), acc[:, k:].mean(1)
    tau, p = kendalltau(a, b)
    rng = np.random.default_rng(0)
    boot = [kendalltau(a[i], b[i])[0] for i in (rng.integers(0, len(a), len(a)) for _ in range(1000))]
    boot = [t for t in boot if np.isfinite(t)]
    splits = [kendalltau(acc[:, list(h)].mean(1), acc[:, [s for s in seeds if s not in h]].mean(1))[0]
              for h in combinations(seeds, k) if 0 in h]
    return {"designs": len(designs), "tau": round(float(tau), 4), "p": float(p),
            "ci": [round(float(np.percentile(boot, 2.5)), 4), round(float(np.percentile(boot, 97.5)), 4)],
            "mean_abs_diff": round(float(np.abs(a - b).mean()), 4),
            "all_splits": {"n": len(splits), "mean": round(float(np.mean(splits)), 4),
                           "min": round(float(min(splits)), 4), "max": round(float(max(splits)), 4)}}
