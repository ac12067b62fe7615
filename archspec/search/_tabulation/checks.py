"""The rules an oracle table and its sidecars obey, by shape and by value (torch-free).

A table is user input (``archspec search --oracle TABLE``; anyone can write one), so the loader
(:func:`archspec.search._tabulation.oracle.load_table`) refuses every row and sidecar that breaks these rules before a
search
writes anything, and a writer calls the same functions before it writes a row.  Each refusal is a
:class:`~archspec.errors.SpecError` at ``oracle`` naming the table file, the line and the field (a writer that
names the value otherwise renames it with :meth:`SpecError.renamed`).

A row (one JSON line: one design, one seed):

* ``key`` (text), ``seed`` (integer), ``params``, ``macs`` and ``n_params`` (integers >= 0);
* ``curve``: ``[[step, val top-1, val loss], ...]``: steps positive and increasing; top-1 a fraction in [0, 1];
  loss >= 0;
* ``tse``: ``[[step, sum of training losses up to step, training seconds up to step], ...]`` at the curve's
  steps: both >= 0 and non-decreasing (a sum of non-negative losses, a clock);
* ``final_accuracy`` in [0, 1]; ``zc``: score name -> number or ``null`` (a score that failed);
* ``als`` (a mask table's rows, optional): ``[[step, {"stage.layer": [ALS per head]}], ...]`` at the curve's steps,
  each ALS a fraction in [0, 1], the same layers and heads at every step (:func:`als_problem`);
* ``protocol_id`` (optional text): the protocol the row was trained under.

Every number is finite (JSON's ``NaN`` / ``Infinity`` and overflowing literals such as ``1e309`` are refused).
Across rows (:func:`index_rows`): one row per (design, seed), or identical repeats; one protocol, the sidecar's.

Sidecars: ``<stem>.meta.json`` (:func:`check_meta`: ``protocol`` an object with text ``space`` and positive
integer ``image_size`` / ``channels`` / ``num_classes``, text ``protocol_id``, ``reference_seeds`` a non-empty list
of integers), ``<stem>.latency.json`` (:func:`latency_ms`: ``ms`` maps a design key to a positive finite ms
or a non-empty list of them, one per pass) and, for a mask table, ``<stem>.soft.jsonl``: rows of one model with
MaiT's soft mask on every head (not a point of the space), each a row as above plus ``alphas``
(:func:`alphas_problem`), one design, the table's protocol.
"""

from __future__ import annotations

import json
import math
import re

from archspec.errors import SpecError

__all__ = ["REQUIRED_FIELDS", "row_problem", "check_row", "als_problem", "alphas_problem", "index_rows",
           "short_curve", "check_meta", "latency_ms", "json_line_of"]

REQUIRED_FIELDS = ("key", "seed", "params", "macs", "n_params", "curve", "tse", "final_accuracy", "zc")
_OPTION = ("oracle",)  # the SearchConfig field (``--oracle`` on the command line)
_WRITER = "a table is what bench/space_table.py or archspec table writes"


def _fail(message: str, file: str | None, hint: str | None = None) -> SpecError:
    return SpecError.single(_OPTION, message, hint, file)


def _number(value) -> bool:
    """A JSON number (not a boolean) that is finite as a float: NaN, +-inf and ints past float range are not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _shown(value) -> str:
    """``value`` as the file spells it, cut short (NaN and inf as Python's json writes them)."""
    try:
        return json.dumps(value)[:60]
    except (TypeError, ValueError):
        return repr(value)[:60]


def _triples_problem(name: str, value) -> str | None:
    """Shape of ``curve`` / ``tse``: a non-empty list of ``[step, number, number]`` with positive increasing steps."""
    if not isinstance(value, list) or not value:
        return f"field {name}: must be a non-empty list of [step, value, value]"
    for i, point in enumerate(value):
        if not (isinstance(point, list) and len(point) == 3 and all(isinstance(v, int | float)
                                                                    and not isinstance(v, bool) for v in point)):
            return (f"field {name}[{i}]: curve and tse must be lists of [step, value, value] numbers, "
                    f"not {_shown(point)}")
    steps = [p[0] for p in value]
    if not all(_number(s) and s > 0 for s in steps) or steps != sorted(set(steps)):
        return f"field {name}: curve and tse must have positive, increasing steps, not {_shown(steps)}"
    return None


def _range_problem(name: str, value, low: float, high: float, what: str) -> str | None:
    if not _number(value) or not low <= value <= high:
        span = f"in [{low:g}, {high:g}]" if high < math.inf else f">= {low:g}"
        return f"field {name}: {what} must be a finite number {span}, not {_shown(value)}"
    return None


def _curve_problem(curve: list) -> str | None:
    for i, (_, top1, loss) in enumerate(curve):
        problem = (_range_problem(f"curve[{i}][1]", top1, 0.0, 1.0, "val top-1 (a fraction)")
                   or _range_problem(f"curve[{i}][2]", loss, 0.0, math.inf, "val loss"))
        if problem:
            return problem
    return None


def _tse_problem(tse: list) -> str | None:
    """The loss sums and the seconds: finite, >= 0, never decreasing (a sum of non-negative losses, a clock)."""
    previous = (0.0, 0.0)
    for i, (_, loss_sum, seconds) in enumerate(tse):
        problem = (_range_problem(f"tse[{i}][1]", loss_sum, 0.0, math.inf, "the sum of training losses")
                   or _range_problem(f"tse[{i}][2]", seconds, 0.0, math.inf, "training seconds"))
        if problem:
            return problem
        for j, (now, before, what) in enumerate(((loss_sum, previous[0], "sum of training losses"),
                                                 (seconds, previous[1], "training seconds")), 1):
            if now < before:
                return f"field tse[{i}][{j}]: the {what} falls from {before:g} to {now:g} (it is cumulative)"
        previous = (loss_sum, seconds)
    return None


def _scalar_problem(row: dict) -> str | None:
    if not isinstance(row["key"], str) or isinstance(row["seed"], bool) or not isinstance(row["seed"], int):
        return "field key/seed: key must be text and seed an integer"
    for name in ("macs", "n_params"):
        value = row[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"field {name}: must be an integer >= 0, not {_shown(value)}"
    if "protocol_id" in row and not isinstance(row["protocol_id"], str):
        return f"field protocol_id: must be text, not {_shown(row['protocol_id'])}"
    return _range_problem("final_accuracy", row["final_accuracy"], 0.0, 1.0, "top-1 (a fraction)")


def _zc_problem(zc) -> str | None:
    if not isinstance(zc, dict):
        return "field zc: zc must map score names to numbers"
    for name, value in zc.items():
        if value is not None and not _number(value):
            return f"field zc.{name}: zc must map score names to finite numbers or null, not {_shown(value)}"
    return None


def row_problem(row) -> str | None:
    """What is wrong with one parsed row, by shape or by value (``None`` when nothing), e.g.
    ``"field curve[2][1]: val top-1 (a fraction) must be a finite number in [0, 1], not -5.0"``."""
    missing = [k for k in REQUIRED_FIELDS if not isinstance(row, dict) or k not in row]
    if missing:
        return f"not a table row (missing {', '.join(missing)})"
    problem = (_scalar_problem(row) or _triples_problem("curve", row["curve"])
               or _triples_problem("tse", row["tse"]))
    if problem:
        return problem
    if [t[0] for t in row["curve"]] != [t[0] for t in row["tse"]]:
        return "field tse: curve and tse must have the same steps"
    return (_curve_problem(row["curve"]) or _tse_problem(row["tse"]) or _zc_problem(row["zc"])
            or (als_problem(row) if "als" in row else None))


def als_problem(row: dict) -> str | None:
    """What is wrong with a mask table row's ``als`` (``None`` when nothing): ``[[step, {"stage.layer": [ALS per
    head]}], ...]`` at the row's curve steps, each ALS a fraction in [0, 1] (MaiT eq. 3: a share of attention),
    every layer of an entry with as many heads as its first, every entry with the first entry's layers."""
    problem = _series_problem(row, "als", "ALS", lambda v: _number(v) and 0.0 <= v <= 1.0,
                              "ALS must be a list of fractions in [0, 1] (one per head)")
    if problem:
        return problem
    als = row["als"]
    for i, (_, layers) in enumerate(als):
        first, heads = next(iter(layers.items()))
        for layer, values in layers.items():
            if len(values) != len(heads):
                return f"field als[{i}].{layer}: {len(values)} heads, where als[{i}].{first} has {len(heads)}"
        if i and set(layers) != set(als[0][1]):
            return f"field als[{i}]: layers {', '.join(sorted(layers))}, not those of als[0]"
    return None


def _series_problem(row: dict, name: str, what: str, valid, rule: str) -> str | None:
    """The shape ``als`` and ``alphas`` share: ``[[step, {layer: [value per head]}], ...]`` at the row's curve
    steps, each value ``valid`` (``rule`` says what is not)."""
    series = row[name]
    if (not isinstance(series, list) or not series
            or [a[0] if isinstance(a, list) and a else None for a in series] != [t[0] for t in row["curve"]]):
        return f"field {name}: must be a non-empty list of [step, {{layer: [{what} per head]}}] at the curve's steps"
    for i, entry in enumerate(series):
        layers = entry[1] if len(entry) == 2 else None
        if not isinstance(layers, dict) or not layers:
            return f"field {name}[{i}]: must be [step, {{layer: [{what} per head]}}], not {_shown(entry)}"
        for layer, values in layers.items():
            if not isinstance(values, list) or not values or not all(valid(v) for v in values):
                return f"field {name}[{i}].{layer}: {rule}, not {_shown(values)}"
    return None


def check_row(row, line: int, name: str) -> None:
    """Raise :class:`SpecError` at ``oracle`` (file ``name``, ``line``: the row's 1-based line) when
    :func:`row_problem` finds anything."""
    problem = row_problem(row)
    if problem:
        raise _fail(f"line {line}: {problem}", name, _WRITER)


def alphas_problem(row: dict) -> str | None:
    """What is wrong with a soft-mask row's ``alphas`` (``None`` when nothing): it must be ``[[step, {"stage.layer":
    [alpha per head, a fraction, or null for a head without a soft mask]}], ...]`` at the row's curve steps."""
    if not row.get("alphas"):
        return ("field alphas: a soft-mask row must hold the learned alphas, a non-empty list of "
                "[step, {layer: [alpha]}]")
    return _series_problem(row, "alphas", "alpha", lambda v: v is None or (_number(v) and 0.0 <= v <= 1.0),
                           "must be a list of alphas in [0, 1] or null")


def index_rows(rows: list[tuple[int, dict]], protocol_id: str | None,
               name: str) -> tuple[dict[str, dict[int, dict]], dict[tuple[str, int], int]]:
    """``({key: {seed: row}}, {(key, seed): line})`` of checked ``(line, row)`` pairs.

    Raises:
        SpecError: at ``oracle``: a second row for a (design, seed) that differs from the first (which would win
            is arbitrary: refused, not guessed); a row whose ``protocol_id`` is not the sidecar's ``protocol_id`` (or,
            without one, not the first row's): rows of two protocols are two tables.
    """
    by_key: dict[str, dict[int, dict]] = {}
    lines: dict[tuple[str, int], int] = {}
    expected, source = (protocol_id, "the sidecar's") if protocol_id is not None else (None, "")
    for line, row in rows:
        if expected is None:
            expected, source = row.get("protocol_id"), f"line {line}'s"
        if row.get("protocol_id") != expected:
            raise _fail(f"line {line}: field protocol_id: {_shown(row.get('protocol_id'))} is not {source} "
                        f"{_shown(expected)}: rows of another protocol do not belong in this table", name,
                        "tabulate each protocol into its own table")
        key, seed = row["key"], int(row["seed"])
        first = lines.get((key, seed))
        if first is not None and by_key[key][seed] != row:
            raise _fail(f"line {line}: design {key[:12]} seed {seed} has a second, different row (first: line "
                        f"{first})", name, "keep one row per design and seed")
        if first is None:
            by_key.setdefault(key, {})[seed] = row
            lines[(key, seed)] = line
    return by_key, lines


def short_curve(by_key: dict[str, dict[int, dict]], steps: int, keys=None) -> tuple[str, int] | None:
    """The first ``(key, seed)`` (of ``keys``; all by default) whose curve ends before ``steps``, or ``None``."""
    for key in (by_key if keys is None else keys):
        for seed, row in by_key.get(key, {}).items():
            if row["curve"][-1][0] < steps:
                return key, seed
    return None


def json_line_of(text: str, *fields: str) -> int | None:
    """The 1-based line of ``"fields[-1]":`` in JSON ``text``, looked for after each earlier field in turn
    (``json_line_of(text, "protocol", "image_size")``); ``None`` when a field is not found."""
    start = 0
    for name in fields:
        found = re.compile(r'"' + re.escape(name) + r'"\s*:').search(text, start)
        if found is None:
            return None
        start = found.start()
    return text.count("\n", 0, start) + 1


def _sidecar_fail(sidecar: str, text: str, fields: tuple[str, ...], message: str, name: str,
                  hint: str | None = None) -> SpecError:
    line = json_line_of(text, *fields)
    where = f"its sidecar {sidecar}" + (f", line {line}" if line else "")
    return _fail(f"{where}: field {'.'.join(fields)} {message}", name, hint)


_POSITIVE_INTS = ("image_size", "channels", "num_classes")


def check_meta(meta: dict, text: str, sidecar: str, name: str) -> None:
    """The protocol sidecar's types (``text``: the file as read, to locate a field's line).

    Raises:
        SpecError: at ``oracle``, naming the table ``name``, the sidecar, the line and the field.
    """
    protocol = meta.get("protocol", {})
    if not isinstance(protocol, dict):
        raise _sidecar_fail(sidecar, text, ("protocol",), f"must be a JSON object, not {_shown(protocol)}", name)
    if "space" in protocol and not isinstance(protocol["space"], str):
        raise _sidecar_fail(sidecar, text, ("protocol", "space"),
                            f"must be a space's name, not {_shown(protocol['space'])}", name)
    for field in _POSITIVE_INTS:
        value = protocol.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise _sidecar_fail(sidecar, text, ("protocol", field), f"must be a positive integer, not {_shown(value)}",
                                name)
    if "protocol_id" in meta and not isinstance(meta["protocol_id"], str):
        raise _sidecar_fail(sidecar, text, ("protocol_id",), f"must be text, not {_shown(meta['protocol_id'])}", name)
    named = meta.get("reference_seeds")
    if named is not None and not (isinstance(named, list) and named
                                  and all(isinstance(s, int) and not isinstance(s, bool) for s in named)):
        raise _sidecar_fail(sidecar, text, ("reference_seeds",),
                            f"must be a non-empty list of integer seeds, not {_shown(named)}", name,
                            "e.g. \"reference_seeds\": [0, 1, 2]")


def latency_ms(data: dict, text: str, sidecar: str, name: str) -> dict[str, float]:
    """``{design key: ms}`` of a latency sidecar ``{"ms": {key: ms or [ms of each pass]}}``: the mean of the passes.

    Raises:
        SpecError: at ``oracle``: ``ms`` is not an object, or a design's ms are not positive finite numbers
            (naming the sidecar, the line and the design).
    """
    ms = data.get("ms") or {}
    if not isinstance(ms, dict):
        raise _sidecar_fail(sidecar, text, ("ms",), f"must map design keys to ms, not {_shown(ms)[:30]}", name)
    out = {}
    for key, value in ms.items():
        values = value if isinstance(value, list) else [value]
        if not values or not all(_number(v) and v > 0 for v in values):
            raise _sidecar_fail(sidecar, text, ("ms", key), f"must be positive finite ms (one per pass), not "
                                f"{_shown(value)}", name)
        out[key] = sum(values) / len(values)
    return out
