"""Does mask placement work?  Issue 55 item 1: the placement strategies replayed on a mask table, against the fixed
schemes and the table's best placement.

    python bench/mask_works.py                                  # the shipped mait_small table, 50 replays
    python bench/mask_works.py --table T/mait_small.jsonl --replays 50 --json mask_works.json
    python bench/mask_works.py --table mait_small --replays 200 --first-seed 0 --steps 400 --trials 12
    python bench/mask_works.py --replays 200 --null             # also each strategy against itself (false positives)

A mask table (``archspec table SPACE`` on a ``kind: masks`` space such as ``mait_small``: per group of layers, how
many heads carry MaiT's hard mask) is read once, copied first so that every replay reads the same rows
(``bench/search_works.py``'s ``snapshot_table``).  Each replay ``r`` (replay seeds ``--first-seed`` .. ``+
--replays - 1``; issue 55 asks for at least 50) runs, at its default budget:

* ``als`` -- MaiT's rule (``archspec search masks --oracle TABLE --strategy als``):
  :func:`archspec.search.cli_support.table_replay_report` at replay seed ``r``, ``--steps`` proxy steps (default the
  masks proxy's 400), 2 rounds, window 3x3, the default thresholds; each round's training one table row, the seed
  that answers each point drawn per replay (``OracleTable.seed_of``).  CPU: the training seconds of the rows it read.
* ``soft`` -- MaiT sec. 4.3 (``archspec search masks --oracle TABLE --strategy soft``): its one training, every
  head soft-masked, is the table's soft-mask row (``<table>.soft.jsonl``, written by ``bench/soft_rows.py``) of the
  seed drawn per replay; heads whose learned alpha is below 0.5 at ``--steps`` get the hard mask.  Scored on every
  reference seed (it never trains the point it returns).  CPU: the soft model's training seconds.  Without the
  sidecar: reported as not replayable, never simulated.
* ``optuna`` -- as ``archspec search masks --oracle TABLE --strategy optuna`` runs it (a design search of the
  table's space, objective accuracy, TPE with the CLI's default start-up draws, its default 12 trials), but ranked
  by TSE as the issue asks (the proxy score ``tse``: minus the mean training loss, ``bench/search_works.py``'s
  ``{"protocol": {"score": "tse"}}``), on the masks proxy (400 steps).
* ``random`` -- the design search's default sampler (random draws, named explicitly so that a change of default
  does not change what this measures), ranked by TSE, the same space, proxy and trial count as ``optuna``.

Both searches run with ``oracle_subset=True`` (the table's points only: all of the space once the table is
complete) and no ``--verify`` re-training (``verify=0``, as ``bench/search_works.py``'s replays: every trial is a
searched candidate, and the CPU counted is exactly the trials').  Their returned placement is the trained candidate
with the best proxy score (ties: the earlier trial); their CPU is the sum of the table's training seconds up to the
proxy's step of every row they read, plus its zero-cost seconds (``Truth.trial_cost``).

Scoring (leak-free, issue 54): a returned placement's **reference accuracy** is the mean final top-1 of the table's
reference seeds that did *not* answer it in that replay (``Truth.held_out``; all of them when the strategy never
trained it); the 3-seed mean is reported beside it.  The **fixed schemes** are the space's points its YAML names,
found from the points' parameters (groups ordered by stage and first layer, ``H`` heads per layer from the space's
static analysis): none (every group 0 masked heads), all (every group ``H``), Sch.1-like (1 everywhere) and
Sch.2-like (``H - 1`` in the first group, 0 in the last, 1 in between: 2/1/0 on mait_small); each scored on the mean
of every reference seed (no strategy's proxy read them).  The **table's best placement** is the point with the
highest such mean.

**Seed error** (choice of this script): the table's median, over its tabulated points, of the sample standard
deviation (``ddof=1``) of a point's final top-1 across the reference seeds, divided by the square root of the
number of reference seeds -- the typical standard error of one point's seed mean.  The median over every point, not
the best fixed scheme's own spread: three seeds give one point's standard deviation a relative error of about 50 %.
A returned placement is **at least as good as the best fixed scheme** when its reference accuracy is at least the
best fixed scheme's minus the seed error.

Output: per strategy, the median and IQR of the reference accuracy (held-out, and all seeds), the share of replays at
least as good as the best fixed scheme, how often it returned the table's best point, the median and IQR of its CPU
seconds, its most frequent placements; the fixed schemes' and the table's best accuracies; and each search against
``als`` paired by replay seed: wins / losses, the one-sided paired Wilcoxon p (``scipy.stats.wilcoxon``,
``alternative="greater"``: the strategy's reference accuracy above ``als``'s; 1.0 when every pair ties) and the
share of 20-replay batches with p < 0.05 (``batch_rate``).  ``--json PATH`` writes everything, each replay included.

Refusals (exit 2, a message on stderr): a table that is not a mask table (parameters that are not per-group mask
counts, rows without ALS), and one that lacks a fixed scheme's point with every reference seed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_TABLE = "mait_small"
OPTUNA_TRIALS = 12  # `archspec search masks --strategy optuna`'s default trials (archspec/cli/search.py)
MIN_REPLAYS = 50    # issue 55 item 1: ">= 50 oracle replays"
NULL_OFFSET = 100_000  # --null: replay seeds r + NULL_OFFSET against r, as search_works' null check pairs them
SOFT_REASON = ("the table has no soft-mask rows for every reference seed (<table>.soft.jsonl, bench/soft_rows.py): "
               "--strategy soft trains every head soft-masked, which no point of the table is")
SEED_ERROR_DEFINITION = ("the table's median over its points of the per-point sample SD (ddof 1) of final top-1 "
                         "across the reference seeds, divided by sqrt(number of reference seeds)")


class Refused(Exception):
    """The table cannot be measured (not a mask table, a fixed scheme missing): exit 2 with this message."""


def _search_works():
    """``bench/search_works.py`` as a module (its ``Truth``, ``snapshot_table``, ``batch_rate``)."""
    spec = importlib.util.spec_from_file_location("search_works", HERE / "search_works.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WORKS = _search_works()


# ----------------------------------------------------------------------------------------- the table's points
def ordered_groups(params: dict, name: str = "the table") -> list[str]:
    """The per-group mask parameters of a point, ordered by stage then first layer (early to late).

    Raises:
        Refused: a parameter that is not a per-group mask count (``name`` is not a mask table).
    """
    from archspec.errors import SpecError
    from archspec.search._tabulation.mask_replay import mask_groups

    try:
        groups = mask_groups(params)
    except SpecError as exc:
        why = exc.problems[0].message if getattr(exc, "problems", None) else str(exc)
        raise Refused(f"{name} is not a mask table: {why}; measure a table of a kind: masks space (archspec table "
                      "mait_small)") from None
    return sorted(groups, key=lambda name: (groups[name][0], groups[name][1][0]))


def fixed_scheme_counts(groups: list[str], heads: int) -> dict[str, dict[str, int]]:
    """The fixed schemes the mask space names, as masked heads per group (``groups`` early to late; ``heads`` per
    layer, ``H``): none (0 everywhere), all (``H`` everywhere), Sch.1-like (1 everywhere) and Sch.2-like (``H - 1``
    in the first group, 0 in the last, 1 in between -- MaiT Tab. 3's Sch.2 at three groups: 2/1/0 with 3 heads)."""
    last = len(groups) - 1
    sch2 = [heads - 1 if i == 0 else 0 if i == last else 1 for i in range(len(groups))]
    return {"none": dict.fromkeys(groups, 0), "all": dict.fromkeys(groups, heads),
            "Sch.1-like": dict.fromkeys(groups, 1), "Sch.2-like": dict(zip(groups, sch2))}


def label(counts: dict[str, int], groups: list[str]) -> str:
    """``"2/1/0"``: masked heads per group, early to late."""
    return "/".join(str(counts[g]) for g in groups)


def _signature(params: dict) -> tuple:
    return tuple(sorted(params.items()))


def space_heads(space_name: str) -> int:
    """Heads per attention layer of a masks space (its first point's static analysis, as
    :func:`archspec.search.cli_support.table_replay_report` reads it)."""
    from archspec.ir.analysis import analyze
    from archspec.search import load_space

    _, spec = next(iter(load_space(space_name).points()))
    layer = next(row for row in analyze(spec).rows if row.heads)  # heads: one letter a head ('A A A')
    return len(layer.heads.split())


def check_mask_table(table) -> tuple[list[str], dict[tuple, str]]:
    """``(groups early to late, {parameter signature: architecture key})`` of a mask table's tabulated points.

    Raises:
        Refused: parameters that are not per-group mask counts, or rows without ALS (not a mask table); no point
            with every reference seed.
    """
    first = next(iter(next(iter(table.rows.values())).values()))
    groups = ordered_groups(first["params"], table.file)
    if not first.get("als"):
        raise Refused(f"{table.file} is not a mask table: its rows hold no ALS (a table of a kind: masks space, "
                      "archspec table mait_small, records MaiT's ALS of every layer and head)")
    if not table.tabulated:
        raise Refused(f"the table {table.file} has no point with every reference seed {table.seeds}")
    by_params = {_signature(table.rows[k][table.seeds[0]]["params"]): k for k in table.tabulated}
    return groups, by_params


def fixed_schemes(table, groups: list[str], by_params: dict[tuple, str], heads: int) -> dict[str, dict]:
    """``{scheme: {"placement", "label", "key"}}`` of the fixed schemes (:func:`fixed_scheme_counts`) in the table.

    Raises:
        Refused: a scheme whose point the table lacks (with every reference seed).
    """
    out, missing = {}, []
    for name, counts in fixed_scheme_counts(groups, heads).items():
        key = by_params.get(_signature(counts))
        if key is None:
            missing.append(f"{name} ({label(counts, groups)})")
        else:
            out[name] = {"placement": counts, "label": label(counts, groups), "key": key}
    if missing:
        raise Refused(f"the table {table.file} lacks the fixed scheme point(s) {', '.join(missing)} with every "
                      f"reference seed {table.seeds} ({len(table.tabulated)} points have them): finish the table "
                      f"(archspec table {table.space}) before measuring")
    return out


def seed_error(finals: dict[str, list[float]]) -> dict:
    """The table's seed error (module docstring): ``{"value", "median_seed_sd", "n_seeds", "definition"}``.
    ``finals``: ``{key: [final top-1 per reference seed]}``, every point the same seeds (at least two)."""
    sds = [float(np.std(v, ddof=1)) for v in finals.values()]
    n = len(next(iter(finals.values())))
    median = float(np.median(sds))
    return {"value": median / math.sqrt(n), "median_seed_sd": median, "n_seeds": n,
            "definition": SEED_ERROR_DEFINITION}


def at_least(value: float, best_fixed: float, error: float) -> bool:
    """Whether a reference accuracy is at least as good as the best fixed scheme's within the seed error."""
    return value >= best_fixed - error


# ---------------------------------------------------------------------------------------------- the replays
def replay_als(table, truth, by_params: dict, groups: list[str], replay: int, steps: int) -> dict:
    """One replay of ``--strategy als`` (:func:`archspec.search.cli_support.table_replay_report`), scored held-out.

    Raises:
        SpecError: the rule reaches a point the table lacks.
        Refused: it returns a point the table lacks.
    """
    from archspec.search.cli_support import table_replay_report

    report = table_replay_report(table, replay, steps)
    key = by_params.get(_signature(report["placement"]))
    if key is None:
        raise Refused(f"als returned the point {label(report['placement'], groups)}, which the table lacks with "
                      f"every reference seed (replay seed {replay}): finish the table")
    answered = {r["key"]: r["seed"] for r in report["rounds"]}.get(key)
    return _scored(truth, key, answered, groups, replay, float(report["simulated_seconds"]),
                   rounds=len(report["rounds"]))


def replay_soft(table, truth, by_params: dict, groups: list[str], replay: int, steps: int) -> dict:
    """One replay of ``--strategy soft`` (:func:`archspec.search.cli_support.table_replay_report` on the table's
    soft-mask rows), scored on every reference seed: the strategy trains the soft-mask model,
    never the point it returns.

    Raises:
        Refused: it returns a point the table lacks.
    """
    from archspec.search.cli_support import table_replay_report

    report = table_replay_report(table, replay, steps, strategy="soft")
    key = by_params.get(_signature(report["placement"]))
    if key is None:
        raise Refused(f"soft returned the point {label(report['placement'], groups)}, which the table lacks with "
                      f"every reference seed (replay seed {replay}): finish the table")
    return _scored(truth, key, None, groups, replay, float(report["simulated_seconds"]),
                   soft_seed=report["rounds"][0]["seed"])


def replay_search(table_path: str, table, truth, groups: list[str], replay: int, steps: int, trials: int,
                  sampler: str) -> dict:
    """One replay of a design search of the table's space (``sampler``, ranked by TSE, ``trials`` trained
    candidates of ``steps``-step masks proxies), scored held-out; its CPU as ``search_works``' ``trace`` counts it."""
    import optuna

    from archspec.search import run_design
    from archspec.search.cli_support import DEFAULT_SAMPLER_STARTUP, MASKS_PROXY_DEFAULTS

    protocol = {**MASKS_PROXY_DEFAULTS, "steps": steps, **WORKS.TSE["protocol"]}
    with tempfile.TemporaryDirectory() as tmp:
        outcome = run_design(space=table.space, oracle=table_path, oracle_subset=True, objective="accuracy",
                             trials=trials, timeout=None, trial_timeout=None, protocol=protocol, seed=replay,
                             storage="memory", out=Path(tmp) / "run", progress=False, verify=0, sampler=sampler,
                             sampler_startup=DEFAULT_SAMPLER_STARTUP, fidelity="none")
    seconds, trained = 0.0, []
    for t in sorted(outcome.study.trials, key=lambda t: t.number):
        seconds += truth.trial_cost(t, replay, steps)
        ua = t.user_attrs
        if (t.state == optuna.trial.TrialState.COMPLETE and ua.get("status") == "trained"
                and "reused_from" not in ua):
            trained.append((-t.values[0], t.number, ua["arch_key"], ua.get("oracle_seed")))
    if not trained:
        raise Refused(f"the {sampler} search of replay seed {replay} trained nothing")
    score, _, key, answered = min(trained)  # the best proxy score; ties: the earlier trial
    return _scored(truth, key, answered, groups, replay, seconds, candidates=len(trained), proxy_score=-score)


def _scored(truth, key: str, answered, groups: list[str], replay: int, seconds: float, **extra) -> dict:
    params = truth.table.rows[key][truth.table.seeds[0]]["params"]
    held = [s for s in truth.table.seeds if s != answered]
    return {"replay": replay, "key": key, "placement": params, "label": label(params, groups),
            "answered_seed": answered, "reference_seeds": held,
            "reference_accuracy": truth.held_out(key, answered),
            "reference_accuracy_all_seeds": truth.accuracy[key], "seconds": seconds, **extra}


# ------------------------------------------------------------------------------------------------- summaries
def _spread(values: list[float]) -> dict:
    return {"median": float(np.median(values)),
            "iqr": [float(np.percentile(values, 25)), float(np.percentile(values, 75))]}


def summarise(runs: list[dict], threshold: float, table_best: str) -> dict:
    """Median / IQR of the held-out and all-seed reference accuracy and of the CPU seconds, the replays at least as
    good as the best fixed scheme (``reference_accuracy >= threshold``: its accuracy less the seed error), those that
    returned the table's best point, and the five most frequent placements."""
    n = len(runs)
    good = sum(r["reference_accuracy"] >= threshold for r in runs)
    best = sum(r["key"] == table_best for r in runs)
    return {"replays": n, "reference_accuracy": _spread([r["reference_accuracy"] for r in runs]),
            "reference_accuracy_all_seeds": _spread([r["reference_accuracy_all_seeds"] for r in runs]),
            "at_least_best_fixed": good, "share_at_least_best_fixed": good / n,
            "table_best": best, "share_table_best": best / n, "seconds": _spread([r["seconds"] for r in runs]),
            "placements": dict(Counter(r["label"] for r in runs).most_common(5))}


def paired_vs(a: dict[int, float], b: dict[int, float]) -> dict:
    """Strategy ``a`` against ``b`` (``{replay seed: reference accuracy}``), paired by replay seed: wins, losses,
    ties, the median difference, the one-sided paired Wilcoxon p that ``a`` is above ``b`` (1.0 when every pair
    ties) and the share of 20-replay batches with p < 0.05 (``search_works.batch_rate``).

    Raises:
        ValueError: the two do not hold the same replay seeds.
    """
    from scipy.stats import wilcoxon

    if set(a) != set(b):
        raise ValueError(f"unpaired replays: {sorted(set(a) ^ set(b))}")
    seeds = sorted(a)
    x, y = [a[s] for s in seeds], [b[s] for s in seeds]
    diffs = [u - v for u, v in zip(x, y)]
    p = float(wilcoxon(x, y, alternative="greater").pvalue) if any(diffs) else 1.0
    return {"n": len(seeds), "wins": sum(d > 0 for d in diffs), "losses": sum(d < 0 for d in diffs),
            "ties": sum(d == 0 for d in diffs), "median_difference": float(np.median(diffs)),
            "wilcoxon_p": p, "batch20_rate_p05": WORKS.batch_rate(x, y)}


def measure(table_source: str, replays: int, steps: int, trials: int, first_seed: int = 0,
            null: bool = False) -> dict:
    """Issue 55 item 1 on a mask table (module docstring): every strategy, ``replays`` replays.  ``null``: also each
    strategy against itself (:data:`NULL_OFFSET`), the paired test's false-positive rate (``"null"`` per strategy).

    Raises:
        Refused: not a mask table, a fixed scheme missing, a point the rule returns missing.
        SpecError: the table cannot be read, or the rule reaches a point it lacks.
    """
    from archspec.search import load_space, load_table

    with tempfile.TemporaryDirectory() as frozen:
        snapshot = WORKS.snapshot_table(table_source, Path(frozen))
        table = load_table(snapshot)
        table.file = str(table_source)  # messages name the user's table, not the snapshot
        groups, by_params = check_mask_table(table)
        heads = space_heads(table.space)
        fixed = fixed_schemes(table, groups, by_params, heads)
        truth = WORKS.Truth(table)
        error = seed_error(truth.finals)
        for entry in fixed.values():
            entry["reference_accuracy"] = truth.accuracy[entry["key"]]
            entry["seeds"] = truth.finals[entry["key"]]
        best_fixed = max(fixed, key=lambda name: fixed[name]["reference_accuracy"])
        threshold = fixed[best_fixed]["reference_accuracy"] - error["value"]
        best_key = max(truth.accuracy, key=lambda k: (truth.accuracy[k], k))
        best_params = table.rows[best_key][table.seeds[0]]["params"]
        seeds = list(range(first_seed, first_seed + replays))
        soft = set(table.seeds) <= set(table.soft_rows)
        replay = {"als": lambda r: replay_als(table, truth, by_params, groups, r, steps),
                  "optuna": lambda r: replay_search(snapshot, table, truth, groups, r, steps, trials, "tpe"),
                  "random": lambda r: replay_search(snapshot, table, truth, groups, r, steps, trials, "random")}
        if soft:
            replay["soft"] = lambda r: replay_soft(table, truth, by_params, groups, r, steps)
        runs = {name: [run(r) for r in seeds] for name, run in replay.items()}
        nulls = {name: [run(r + NULL_OFFSET) for r in seeds] for name, run in replay.items()} if null else {}
        points = sum(1 for _ in load_space(table.space).points())
    strategies = {
        "als": {"replayable": True,
                "description": f"MaiT's rule, 2 rounds, ALS at {steps} steps (table_replay_report)"},
        "soft": ({"replayable": True, "description": f"MaiT's soft masks, alpha < 0.5 at {steps} steps "
                                                      "(the table's soft-mask rows)"} if soft
                 else {"replayable": False, "reason": SOFT_REASON}),
        "optuna": {"replayable": True, "description": f"TPE, {trials} trials, ranked by TSE at {steps} steps"},
        "random": {"replayable": True, "description": f"random draws (the design search's default sampler), "
                                                      f"{trials} trials, ranked by TSE at {steps} steps"},
    }
    als = {r["replay"]: r["reference_accuracy"] for r in runs["als"]}
    for name, again in nulls.items():
        first = {r["replay"]: r["reference_accuracy"] for r in runs[name]}
        strategies[name]["null"] = paired_vs({r["replay"] - NULL_OFFSET: r["reference_accuracy"] for r in again},
                                             first)
    for name, done in runs.items():
        strategies[name]["summary"] = summarise(done, threshold, best_key)
        strategies[name]["runs"] = done
        if name != "als":
            strategies[name]["vs_als"] = paired_vs({r["replay"]: r["reference_accuracy"] for r in done}, als)
    adjusted = WORKS.holm({name: s["vs_als"]["wilcoxon_p"] for name, s in strategies.items() if "vs_als" in s})
    for name, p in adjusted.items():
        strategies[name]["vs_als"]["holm_p"] = p
    from archspec.search.cli_support import DEFAULT_SAMPLER

    return {"table": str(table_source), "space": table.space, "designs": len(truth.accuracy), "space_points": points,
            "seeds": table.seeds, "replays": replays, "replay_seeds": [seeds[0], seeds[-1]], "steps": steps,
            "trials": trials, "verify": 0, "design_default_sampler": DEFAULT_SAMPLER, "heads": heads,
            "groups": groups, "seed_error": error, "fixed": fixed,
            "best_fixed": {"name": best_fixed, "reference_accuracy": fixed[best_fixed]["reference_accuracy"]},
            "threshold": threshold,
            "table_best": {"key": best_key, "placement": best_params, "label": label(best_params, groups),
                           "reference_accuracy": truth.accuracy[best_key], "seeds": truth.finals[best_key]},
            "strategies": strategies}


def choose(result: dict, alpha: float = 0.05, null_rate: float = 0.08, target: float = 0.8) -> dict:
    """research/search-works-notebook.md's pre-registered rule for the default of ``search masks`` ("How the default
    of `search masks` will be chosen"), applied to a :func:`measure` result run with ``null``: broken when any
    strategy's null gives p < 0.05 in more than ``null_rate`` of 20-replay batches; otherwise the candidates whose
    Holm-adjusted p against ``als`` is below ``alpha`` qualify, and the one with the highest median held-out
    reference accuracy (ties: the lower median CPU) becomes the default, else ``als`` stays.  Every strategy's share
    of replays at least as good as the best fixed scheme is set against the issue's ``target``.

    Raises:
        ValueError: the result has no null runs (``measure(..., null=True)``).
    """
    replayed = {name: s for name, s in result["strategies"].items() if s["replayable"]}
    if any("null" not in s for s in replayed.values()):
        raise ValueError("the rule reads the null runs first: measure with null=True (--null)")
    rates = {name: s["null"]["batch20_rate_p05"] for name, s in replayed.items()}
    targets = {name: s["summary"]["share_at_least_best_fixed"] >= target for name, s in replayed.items()}
    if any(rate > null_rate for rate in rates.values()):
        return {"broken": True, "null_rates": rates, "default": None, "qualified": [], "meets_target": targets}
    qualified = [name for name, s in replayed.items() if "vs_als" in s and s["vs_als"]["holm_p"] < alpha]
    default = min(qualified, key=lambda n: (-replayed[n]["summary"]["reference_accuracy"]["median"],
                                            replayed[n]["summary"]["seconds"]["median"]), default="als")
    return {"broken": False, "null_rates": rates, "default": default, "qualified": qualified,
            "meets_target": targets}


def text(result: dict) -> str:
    """The readable report of :func:`measure`'s result."""
    err = result["seed_error"]
    lines = [f"mask placement on the table {result['space']} ({result['table']}): {result['designs']} of "
             f"{result['space_points']} points with reference seeds {result['seeds']}; {result['replays']} replays "
             f"(seeds {result['replay_seeds'][0]}-{result['replay_seeds'][1]}), {result['steps']}-step proxies"]
    if result["designs"] < result["space_points"]:
        lines.append("  warning: the table is not complete (searches see only its points, oracle_subset)")
    if result["design_default_sampler"] != "random":
        lines.append(f"  note: the design search's default sampler is now {result['design_default_sampler']!r}; "
                     "'random' below is random draws, as named")
    if result["replays"] < MIN_REPLAYS:
        lines.append(f"  warning: fewer than {MIN_REPLAYS} replays: not issue 55's measurement")
    lines.append(f"seed error {err['value']:.4f}: {err['definition']} ({err['median_seed_sd']:.4f} / "
                 f"sqrt({err['n_seeds']}))")
    lines.append("fixed schemes (mean of every reference seed): " + ", ".join(
        f"{name} {v['label']} {v['reference_accuracy']:.4f}" for name, v in result["fixed"].items()))
    best = result["best_fixed"]
    lines.append(f"best fixed scheme: {best['name']} {best['reference_accuracy']:.4f}; at least as good within the "
                 f"seed error: reference accuracy >= {result['threshold']:.4f}")
    tb = result["table_best"]
    lines.append(f"the table's best placement: {tb['label']} {tb['reference_accuracy']:.4f}")
    lines.append("per strategy: reference top-1 on the held-out seeds, median [IQR] (all seeds' median); replays "
                 ">= best fixed - seed error; replays returning the table's best; CPU s median [IQR]")
    for name, s in result["strategies"].items():
        if not s["replayable"]:
            lines.append(f"  {name}: not replayable: {s['reason']}")
            continue
        v = s["summary"]
        ref, cpu = v["reference_accuracy"], v["seconds"]
        lines.append(f"  {name} -- {s['description']}: {ref['median']:.4f} [{ref['iqr'][0]:.4f}-{ref['iqr'][1]:.4f}] "
                     f"({v['reference_accuracy_all_seeds']['median']:.4f}); {v['at_least_best_fixed']}/"
                     f"{v['replays']} ({100 * v['share_at_least_best_fixed']:.0f} %); {v['table_best']}/"
                     f"{v['replays']}; {cpu['median']:.0f} s [{cpu['iqr'][0]:.0f}-{cpu['iqr'][1]:.0f}]")
        lines.append("    placements: " + ", ".join(f"{k} x{n}" for k, n in v["placements"].items()))
        if "null" in s:
            t = s["null"]
            lines.append(f"    null (against itself at replay seeds +{NULL_OFFSET:,}): one-sided Wilcoxon p "
                         f"{t['wilcoxon_p']:.3g}; 20-replay batches with p < 0.05: {100 * t['batch20_rate_p05']:.1f} %")
        if "vs_als" in s:
            t = s["vs_als"]
            lines.append(f"    against als, paired by replay: {t['wins']} wins / {t['losses']} losses / {t['ties']} "
                         f"ties, median difference {t['median_difference']:+.4f}, one-sided Wilcoxon p (above als) "
                         f"{t['wilcoxon_p']:.3g} (Holm {t['holm_p']:.3g}); 20-replay batches with p < 0.05: "
                         f"{100 * t['batch20_rate_p05']:.1f} %")
    if all("null" in s for s in result["strategies"].values() if s["replayable"]):
        c = choose(result)
        lines.append("the pre-registered rule: " + ("broken (a null over 8 % of batches): nothing chosen"
                                                    if c["broken"] else
                                                    f"default {c['default']} (qualified: {c['qualified'] or 'none'})")
                     + "; at least as good as the best fixed scheme in >= 80 % of replays: "
                     + ", ".join(f"{n} {'yes' if ok else 'no'}" for n, ok in c["meets_target"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    from archspec.search.cli_support import MASKS_PROXY_DEFAULTS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", default=DEFAULT_TABLE, help="a mask table (path or shipped name; default "
                                                               f"{DEFAULT_TABLE})")
    parser.add_argument("--replays", type=int, default=MIN_REPLAYS,
                        help=f"replays per strategy (default {MIN_REPLAYS}, issue 55's floor)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first replay seed (default 0)")
    parser.add_argument("--steps", type=int, default=MASKS_PROXY_DEFAULTS["steps"],
                        help=f"proxy steps of every strategy (default {MASKS_PROXY_DEFAULTS['steps']}: the masks "
                             "proxy's)")
    parser.add_argument("--trials", type=int, default=OPTUNA_TRIALS,
                        help=f"trained candidates of optuna and random (default {OPTUNA_TRIALS}: --strategy optuna's)")
    parser.add_argument("--json", default=None, help="also write the result here (every replay included)")
    parser.add_argument("--null", action="store_true",
                        help=f"also each strategy against itself at replay seeds +{NULL_OFFSET:,} (the paired test's "
                             "false-positive rate; twice the replays)")
    args = parser.parse_args(argv)
    if args.replays < 1 or args.trials < 1 or args.steps < 1:
        parser.error("--replays, --trials and --steps must be positive")
    from archspec.errors import SpecError

    try:
        result = measure(args.table, args.replays, args.steps, args.trials, args.first_seed, null=args.null)
    except (Refused, SpecError) as exc:
        print(f"mask_works: error: {exc}", file=sys.stderr)
        return 2
    print(text(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
