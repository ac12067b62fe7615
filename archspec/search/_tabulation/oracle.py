"""Answer a search's evaluations from a tabulated space instead of training (``archspec search --oracle TABLE``).

A table (written by ``bench/space_table.py``, one JSON line per design and seed) holds, for every point of a
finite space, what a search could ask of it: the learning curve of the reference protocol (val top-1 at a
geometric series of steps), the training seconds up to each point, the zero-cost scores of the untrained model,
MACs, parameters and -- after the separate latency pass -- CPU latency.  This is how NAS benchmarks
(NAS-Bench-201, JAHS-Bench-201) let search methods be compared in seconds with many repeats.

The oracle replaces exactly three measurements of the search's objective
(:class:`archspec.search._engine.objective.CandidateObjective`); the engine, sampler, budgets, rungs and reports stay
the real ones:

* training a proxy for ``k`` steps: the table's curve at step ``k`` (linear in ``log k`` between tabulated
  steps; the curve's last step is the longest proxy there is), reported at every evaluation point the engine
  asks for (rungs, pruners); its cost is the tabulated training seconds up to ``k``;
* the zero-cost rung: the tabulated scores;
* latency: the tabulated milliseconds (or, where the table has none, an error at ``oracle``).

Which seed's row answers is drawn for each design and each replay on its own (:meth:`OracleTable.seed_of`: a
hash of the search's ``--seed`` and the design's architecture key, uniform over the table's reference seeds), so
that repeats with different ``--seed`` draw independent seed-to-seed noise, design by design, as independent real
searches would; the seed that answered is recorded on the trial (user attribute ``oracle_seed``, a column of
trials.csv), so that a comparison scores each design on the reference seeds that did *not* answer it.  (Before
issue 54 the seed was ``--seed`` modulo 3 for every design: twenty repeats replayed three noise draws.)  A design
that is not in the table is an error (exit 2).

A search that reads a table checks it against itself first (:func:`table_for_search`: the space, the steps, every
design, the score it ranks by, latency where it needs it).  A table is user input: every row and sidecar is
checked by shape and by value as it is read
(:mod:`archspec.search._tabulation.checks`: finite numbers, accuracies in [0, 1], cumulative TSE, one row per design and
seed, one protocol), each violation a :class:`~archspec.errors.SpecError` naming the file, line and field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from archspec.errors import SpecError
from archspec.search._evaluation.latency_cache import architecture_key
from archspec.search._evaluation.protocols import ZeroCostResult
from archspec.search._tabulation.checks import (
    alphas_problem,
    check_meta,
    check_row,
    index_rows,
    latency_ms,
    short_curve,
)

__all__ = ["TABLES_DIR", "OracleTable", "load_table", "table_for_search", "table_path", "curve_at",
           "design_seconds", "MAX_ORACLE_POINTS"]

TABLES_DIR = Path(__file__).resolve().parents[1] / "tables"
_OPTION = ("oracle",)  # the SearchConfig field (``--oracle`` on the command line)
_MAX_BYTES = 64 * 2**20


def _fail(message: str, file: str | None, hint: str | None = None) -> SpecError:
    return SpecError.single(_OPTION, message, hint, file)


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    """Linear interpolation in ``log x`` between sorted ``(x, y)`` points; below the first, the first ``y``."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return y0 + t * (y1 - y0)
    return points[-1][1]


@dataclass
class OracleResult:
    """What :meth:`OracleTable.train` answers, shaped like :class:`archspec.search._evaluation.proxy.ProxyResult`:
    val top-1 (0..1), val loss, mean train loss, steps, simulated CPU seconds (the table's), history of reported
    scores, the sum of training losses (TSE) and the score that ranks the candidate."""

    accuracy: float
    val_loss: float
    train_loss: float
    steps: int
    seconds: float
    history: list[tuple[int, float]] = field(default_factory=list)
    geometry: Any = None
    model: Any = None
    loss_sum: float = math.nan
    score: float | None = None
    oracle_seed: int | None = None


@dataclass
class OracleTable:
    """A tabulated space: rows by architecture key and seed (see the module docstring).

    Attributes:
        file: where it was read from.
        space: the name of the space it tabulates.
        rows: ``{architecture key: {seed: row}}``.
        latency_ms: ``{architecture key: ms}`` (empty before the latency pass).
        meta: the sidecar's protocol, machine and commits (``{}`` if there is none).
        lines: ``{(architecture key, seed): line of its row in the file}`` (empty for a table built in memory).
        soft_rows: ``{seed: row}`` of a mask table's soft-mask model (``<stem>.soft.jsonl``; empty without one):
            what ``archspec search masks --oracle TABLE --strategy soft`` reads.
    """

    file: str
    space: str
    rows: dict[str, dict[int, dict]]
    latency_ms: dict[str, float]
    meta: dict
    lines: dict[tuple[str, int], int] = field(default_factory=dict)
    soft_rows: dict[int, dict] = field(default_factory=dict)
    _seconds_curves: dict[str, list[tuple[float, float]]] = field(default_factory=dict, init=False, repr=False,
                                                                   compare=False)

    def __post_init__(self) -> None:
        check_meta(self.meta, "", f"{Path(self.file).stem}.meta.json", self.file)

    @cached_property
    def seeds(self) -> list[int]:
        """The seeds of the table's reference (sorted): the sidecar's ``reference_seeds`` where it names them (a
        table being written holds extra seeds for some designs and only some seeds for the one in progress),
        else the seeds every design has."""
        named = self.meta.get("reference_seeds")
        if named is not None:  # __post_init__ checked it: a non-empty list of integers
            return sorted(set(named))
        common = None
        for by_seed in self.rows.values():
            common = set(by_seed) if common is None else common & set(by_seed)
        return sorted(common or ())

    @cached_property
    def tabulated(self) -> set[str]:
        """The architecture keys whose rows hold every seed of :attr:`seeds`: the designs the oracle answers."""
        seeds = set(self.seeds)
        return {key for key, by_seed in self.rows.items() if seeds <= set(by_seed)} if seeds else set()

    @property
    def curve_steps(self) -> list[int]:
        """The tabulated steps of the learning curves."""
        first = next(iter(next(iter(self.rows.values())).values()))
        return [int(s) for s, *_ in first["curve"]]

    def seed_of(self, key: str, seed: int) -> int:
        """The table seed whose row answers design ``key`` in the replay with search seed ``seed``: one of
        :attr:`seeds`, drawn uniformly by the first 8 bytes of ``sha256("oracle:<seed>:<key>")`` -- independent
        across designs and across replays, and the same every time for one (replay, design).  Raises nothing."""
        digest = hashlib.sha256(f"oracle:{seed}:{key}".encode()).digest()
        return self.seeds[int.from_bytes(digest[:8], "big") % len(self.seeds)]

    def row(self, spec, seed: int) -> dict:
        """The row of ``spec`` for the search seed ``seed``: the table seed :meth:`seed_of` draws for it.

        Raises:
            SpecError: at ``oracle``: the design is not in the table.
        """

        key = architecture_key(spec)
        if key not in self.tabulated:
            raise _fail(f"design {key[:12]} is not in the table (space {self.space!r}, {len(self.tabulated)} designs "
                        f"with seeds {self.seeds})", self.file,
                        "search the space the table tabulates (`space`), search only its designs (`oracle_subset`), "
                        "or finish the table (archspec table SPACE)")
        return self.rows[key][self.seed_of(key, seed)]

    def training_seconds(self, key: str, steps: float) -> float:
        """Simulated CPU seconds of training design ``key`` for ``steps`` steps: :func:`design_seconds` of all its
        rows (every seed), linear between tabulated steps.  The same for every seed of the design: the cost of
        a design, not of one run's interruptions.

        Raises:
            KeyError: ``key`` has no row.
        """
        curve = self._seconds_curves.get(key)
        if curve is None:
            curve = self._seconds_curves[key] = design_seconds(self.rows[key].values())
        return linear_at(curve, steps)

    def check_steps(self, steps: int) -> None:
        """Raises :class:`SpecError` at ``protocol.steps`` when ``steps`` lies past the curve of any row (each row is
        checked: a row whose curve ends early would otherwise answer with its last point)."""
        short = short_curve(self.rows, steps)
        if short is not None:
            key, seed = short
            row = self.rows[key][seed]
            line = self.lines.get(short)
            where = f"line {line}: " if line is not None else ""
            raise SpecError.single(("protocol", "steps"), f"{steps} steps is past the table's curve ({where}design "
                                   f"{key[:12]} seed {seed} ends at {row['curve'][-1][0]} steps)",
                                   f"search with `protocol.steps` {row['curve'][-1][0]} or fewer, or tabulate that "
                                   f"row's curve further (its steps: {', '.join(str(s) for s, *_ in row['curve'])})",
                                   self.file)

    def train(self, spec, data, protocol, seed: int = 0, report=None, on_model=None) -> OracleResult:
        """The proxy training :func:`archspec.search._evaluation.proxy.train_proxy` would run, answered from the table:
        ``report(step, score)`` at every ``protocol.eval_every`` steps and the last, as the real loop does (the
        score: the curve's val top-1, or with ``protocol.score == "tse"`` minus the tabulated sum of training
        losses to that step over the step).

        Raises:
            SpecError: the design is not in the table, or ``protocol.steps`` is past its curve.
        """
        self.check_steps(protocol.steps)
        row = self.row(spec, seed)
        steps = list(range(protocol.eval_every, protocol.steps, protocol.eval_every)) + [protocol.steps]
        history = []
        for step in steps:
            value = protocol.score_of(*curve_at(row, step), step)
            history.append((step, value))
            if report is not None:
                report(step, value)
        k = protocol.steps
        accuracy, loss_sum = curve_at(row, k)
        val_loss = _interpolate([(float(s), float(v)) for s, _, v in row["curve"]], k)
        cost = self.training_seconds(architecture_key(spec), k)  # training seconds to step k (evaluation excluded)
        return OracleResult(accuracy=accuracy, val_loss=val_loss, train_loss=loss_sum / k, steps=k, seconds=cost,
                            history=history, loss_sum=loss_sum, score=history[-1][1], oracle_seed=int(row["seed"]))

    def zero_cost(self, spec, seed: int = 0):
        """The tabulated zero-cost scores: ``(ZeroCostResult, None)`` like
        :func:`~archspec.search._evaluation.proxy.score_proxy`.

        Raises:
            SpecError: the design is not in the table.
        """

        row = self.row(spec, seed)
        scores = {k: (v if v is not None else -math.inf) for k, v in row["zc"].items()}
        return ZeroCostResult(scores=scores, seconds=dict(row.get("zc_seconds") or {})), None

    def latency(self, spec) -> float:
        """The tabulated latency in ms.

        Raises:
            SpecError: the design is not in the table, or the table has no latency for it.
        """

        self.row(spec, 0)
        ms = self.latency_ms.get(architecture_key(spec))
        if ms is None:
            raise _fail("the table has no latency for this design (its latency pass has not run)", self.file,
                        "run `python bench/space_table.py --latency --resume` with nothing else running, or search "
                        "with `objective` accuracy")
        return ms

    def dataset(self):
        """A stand-in :class:`archspec.io.datasets.Dataset` of the table's data (one blank image per split): what the
        engine's static checks and reports read of the data (channels, classes, size); nothing is trained on it."""
        import torch  # noqa: PLC0415 - torch-side, once a table is read

        from archspec.io.datasets import Dataset  # noqa: PLC0415 - torch-side, once a table is read

        protocol = self.meta.get("protocol", {})
        size = int(protocol.get("image_size", 28))
        channels, classes = int(protocol.get("channels", 1)), int(protocol.get("num_classes", 10))
        blank = torch.utils.data.TensorDataset(torch.zeros(1, channels, size, size), torch.zeros(1, dtype=torch.long))
        return Dataset(f"oracle:{Path(self.file).stem}", blank, blank, classes, channels, size)

    def describe(self) -> dict:
        """JSON-ready summary (recorded in the search's summary)."""
        return {"file": self.file, "space": self.space, "designs": len(self.tabulated), "seeds": self.seeds,
                "curve_steps": self.curve_steps, "latency": bool(self.latency_ms),
                "protocol_id": self.meta.get("protocol_id")}


def curve_at(row: dict, step: float) -> tuple[float, float]:
    """``(val top-1, sum of training losses)`` of one table row at ``step``: the curve linear in ``log step``
    between tabulated steps, the loss sum linear in ``step`` (from 0 at step 0) -- what a proxy of ``step`` steps
    answers under ``oracle`` (the search's score:
    :meth:`archspec.search._evaluation.proxy.ProxyProtocol.score_of`)."""
    accuracy = _interpolate([(float(s), float(a)) for s, a, _ in row["curve"]], step)
    loss_sum = linear_at([(0.0, 0.0)] + [(float(s), float(total)) for s, total, _ in row["tse"]], step)
    return accuracy, loss_sum


def design_seconds(rows: Iterable[dict]) -> list[tuple[float, float]]:
    """One design's training seconds as a cumulative curve ``[(step, seconds)]`` from ``(0, 0)``, at the steps of
    its rows' ``tse`` column: each span between two tabulated steps costs the least that any of the rows spent on
    it.

    Why the least: a row's clock is wall-clock (``time.perf_counter`` in the worker), so a worker that was paused
    or crowded during a span (stopped for a timing run, another job beside it) recorded that span longer, never
    shorter (``python bench/search_works.py costs`` counts the rows with a span over 5x their own median rate:
    32 of levit_small's 668 at 3308ed8).  The minimum over repeats is
    the usual estimate of compute time under such one-sided noise (Python's ``timeit`` reports it for the same
    reason).  Spans at steps that not every row holds are left out (the rows of one table share them).

    Raises:
        ValueError: no rows.
    """
    rows = list(rows)
    if not rows:
        raise ValueError("design_seconds needs at least one row")
    clocks = [{0.0: 0.0, **{float(s): float(t) for s, _, t in row["tse"]}} for row in rows]
    steps = sorted(set.intersection(*(set(c) for c in clocks)))  # starts with 0.0
    curve = [(0.0, 0.0)]
    for before, step in zip(steps, steps[1:]):
        span = min(c[step] - c[before] for c in clocks)
        curve.append((step, curve[-1][1] + span))
    return curve


def linear_at(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear interpolation in ``x`` (cumulative sums such as TSE)."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x <= x1:
            return y0 + (x - x0) / (x1 - x0) * (y1 - y0)
    return points[-1][1]


def _read_rows(path: Path, name: str) -> list[tuple[int, dict]]:
    """``(line, row)`` of every non-blank line, each checked by shape and value (:func:`check_row`)."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _fail(f"line {n}: not JSON ({exc.msg})", name) from None
            check_row(row, n, name)
            rows.append((n, row))
    return rows


def table_path(source: str | os.PathLike) -> Path:
    """The file :func:`load_table` reads for ``source``: the path, or a shipped table's JSONL for a bare name that is
    no file here (``levit_small``).  Checks nothing, raises nothing."""
    path = Path(source).expanduser()
    if not path.exists() and path.parent == Path(".") and path.name in shipped_tables():
        return TABLES_DIR / f"{path.name}.jsonl"
    return path


def shipped_tables() -> list[str]:
    """The names of the shipped tables (``levit_small``, ...): the JSONL files of :data:`TABLES_DIR`, without the
    sidecars that are JSONL too (``mait_small.soft.jsonl``).  Raises nothing."""
    if not TABLES_DIR.is_dir():
        return []
    return sorted(p.stem for p in TABLES_DIR.glob("*.jsonl") if "." not in p.stem)


def load_table(source: str | os.PathLike) -> OracleTable:
    """Read a table: a JSONL path, or the name of a shipped table (``levit_small``).  Its sidecars
    ``<stem>.meta.json`` (protocol), ``<stem>.latency.json`` (``{"ms": {key: [ms per pass]}}``) and a mask table's
    ``<stem>.soft.jsonl`` (the soft-mask model's rows, :attr:`OracleTable.soft_rows`) are read when present.

    Raises:
        SpecError: at ``oracle``: no such file or shipped table, a directory, over 64 MB, unreadable, a line
            that is not JSON or breaks a rule of :mod:`archspec.search._tabulation.checks` (shape, value, a conflicting
            duplicate, another protocol), no rows, a sidecar of the wrong types, a soft-mask sidecar that breaks
            the row rules or holds no alphas.
    """
    path = table_path(source)
    name = str(source)
    if not path.exists():
        shipped = shipped_tables()
        raise _fail("no such table", name, f"shipped tables: {', '.join(shipped) or 'none'}")
    if not path.is_file():
        raise _fail("not a regular file", name)
    if path.stat().st_size > _MAX_BYTES:
        raise _fail(f"over {_MAX_BYTES // 2**20} MB: not a table", name)
    try:
        rows = _read_rows(path, name)
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"cannot read: {getattr(exc, 'strerror', None) or exc}", name) from None
    if not rows:
        raise _fail("the table has no rows", name)
    meta, meta_text = _sidecar(path.with_suffix(".meta.json"), name)
    check_meta(meta, meta_text, path.with_suffix(".meta.json").name, name)
    by_key, lines = index_rows(rows, meta.get("protocol_id"), name)
    latency_path = path.with_suffix(".latency.json")
    latency = latency_ms(*_sidecar(latency_path, name), latency_path.name, name)
    space = meta.get("protocol", {}).get("space", path.stem)
    return OracleTable(file=name, space=space, rows=by_key, latency_ms=latency, meta=meta, lines=lines,
                       soft_rows=_soft_rows(path.with_suffix(".soft.jsonl"), meta.get("protocol_id"), by_key, name))


MAX_ORACLE_POINTS = 10_000  # a search on a table checks every point of its space against it


_POINTS_MEMO: dict[str, list[tuple[dict, str]]] = {}  # space document (sorted JSON) -> its keyed points


def _keyed_points(space) -> list[tuple[dict, str]]:
    """``(params, architecture key)`` of every point of ``space``, memoised per space document in this process: a
    200-replay comparison lists the same space 200 times (a third of an oracle replay's CPU before the memo)."""

    memo_key = json.dumps(space.document, sort_keys=True, default=str)
    if memo_key not in _POINTS_MEMO:
        _POINTS_MEMO[memo_key] = [(params, architecture_key(spec))
                                  for params, spec in space.points(limit=MAX_ORACLE_POINTS)]
    return _POINTS_MEMO[memo_key]


def table_for_search(source, space, *, steps: int, subset: bool = False, score: str | None = None,
                     latency: bool = False) -> OracleTable:
    """The table ``source`` (a path or a shipped name, :func:`load_table`) checked against a search of ``space`` that
    reads it (``archspec search --oracle``): it tabulates ``space``, covers ``steps`` proxy steps, holds every
    design of the space (with ``subset``: at least one; the others are left to the search as infeasible), every row
    the zero-cost ``score`` the search ranks by (``None``: none needed), and, with ``latency``, a latency for every
    tabulated design of the space.

    Raises:
        SpecError: at ``oracle``, naming the table and what it lacks (or at ``protocol.steps``: the curves end
            before ``steps``).
    """
    table = load_table(source)
    file = str(source)
    if table.space != space.name:
        raise SpecError.single(("oracle",), f"the table tabulates space {table.space!r}, not {space.name!r}",
                               f"add `space` {table.space}", file)
    table.check_steps(steps)
    tabulated = table.tabulated
    points = _keyed_points(space)
    missing = [params for params, key in points if key not in tabulated]
    if subset and len(missing) == len(points):
        raise SpecError.single(("oracle",), f"the table holds no design of space {space.name!r} with every "
                                              f"reference seed {table.seeds}",
                               f"tabulate some first: archspec table {space.name}", file)
    if missing and not subset:
        raise SpecError.single(("oracle",), f"the table lacks {len(missing)} design(s) of space {space.name!r}, "
                               f"e.g. {missing[0]}", f"finish it (archspec table {space.name}), or "
                               "search only the designs it holds (`oracle_subset`)", file)
    if score is not None:
        _check_scores(table, score, file)
    if latency:
        _check_latency(table, [(params, key) for params, key in points if key in tabulated], space.name, file)
    return table


def _check_scores(table, score: str, file: str) -> None:
    """Every tabulated row holds the zero-cost ``score`` that the strata sampler or the zero-cost rung ranks by
    (``null`` is a score that failed and ranks last; a missing one would rank a design last without a word, or
    fail the rung).

    Raises:
        SpecError: at ``oracle``: rows without ``score``, naming how many and the first one's line.
    """
    rows = [(key, seed, row) for key in sorted(table.tabulated) for seed, row in table.rows[key].items()]
    lacking = [(key, seed) for key, seed, row in rows if score not in row["zc"]]
    if not lacking:
        return
    line = table.lines.get(lacking[0])
    where = "" if len(lacking) == len(rows) else f" ({len(lacking)} of its {len(rows)} rows, e.g. line {line})"
    raise SpecError.single(("oracle",), f"the table holds no {score} zero-cost score{where}: the strata sampler "
                           "and the zero-cost rung rank by it", "rank by `zc_score` params or macs (no table score "
                           "needed), or tabulate the scores (archspec table records synflow, naswot, grad_norm)", file)


def _check_latency(table, searched: list[tuple[dict, str]], space: str, file: str) -> None:
    """Every design the search can meet (``searched``: ``(params, key)``) has a tabulated latency: one without
    would fail as a trial each time it is sampled while the search samples on.

    Raises:
        SpecError: at ``oracle``: no latency at all, or none for some of the searched designs.
    """
    if not table.latency_ms:
        raise SpecError.single(("oracle",), "the table has no latency yet (its latency pass has not run)",
                               "search with `objective` accuracy, or run bench/space_table.py --latency", file)
    lacking = [params for params, key in searched if key not in table.latency_ms]
    if lacking:
        raise SpecError.single(("oracle",), f"its latency sidecar lacks {len(lacking)} of the {len(searched)} "
                                              f"tabulated designs of space {space!r}, e.g. {lacking[0]}",
                               "finish its latency pass (bench/space_table.py --latency --resume), or search with "
                               "`objective` accuracy and no `budgets.latency_ms`", file)


def _soft_rows(path: Path, protocol_id: str | None, points: dict, name: str) -> dict[int, dict]:
    """``{seed: row}`` of a mask table's soft-mask sidecar (``{}`` when there is none).

    Raises:
        SpecError: at ``oracle``, naming the sidecar and line: a row that breaks the row rules or has no valid
            ``alphas`` (:func:`~archspec.search._tabulation.checks.alphas_problem`), another protocol, rows of more
            than one design or of a point of the space.
    """
    if not path.is_file():
        return {}
    where = f"{name}'s sidecar {path.name}"
    try:
        rows = _read_rows(path, where)
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"cannot read: {getattr(exc, 'strerror', None) or exc}", where) from None
    for line, row in rows:
        problem = alphas_problem(row)
        if problem:
            raise _fail(f"line {line}: {problem}", where, "soft-mask rows are what bench/soft_rows.py writes")
    by_key, _ = index_rows(rows, protocol_id, where)
    if len(by_key) > 1 or set(by_key) & set(points):
        raise _fail("must hold the rows of one soft-mask model, which is no point of the space", where)
    return next(iter(by_key.values()), {})


def _sidecar(path: Path, name: str) -> tuple[dict, str]:
    """``(object, text)`` of a JSON sidecar (``({}, "")`` when there is none).

    Raises:
        SpecError: at ``oracle``: unreadable, not JSON, not a JSON object.
    """
    if not path.is_file():
        return {}, ""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _fail(f"its sidecar {path.name} is unreadable: {exc}", name) from None
    if not isinstance(data, dict):
        raise _fail(f"its sidecar {path.name} is not a JSON object", name)
    return data, text
