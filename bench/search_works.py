"""Does the search work?  Fidelities against the table's reference, and search methods against random sampling.

    python bench/search_works.py fidelity                  # Kendall tau of every fidelity, on the shipped table
    python bench/search_works.py fidelity --table T.jsonl --json out.json
    python bench/search_works.py fidelity --table mait_small   # a mask table: also MaiT's rule as a score
    python bench/search_works.py simulate --repeats 20     # archspec search vs random etc. on the oracle
    python bench/search_works.py headroom --score tse --steps 200   # what any sampler could add to random draws
    python bench/search_works.py priors                    # cost bins + zero-cost scores choosing what to train
    python bench/search_works.py cost-bins --bins 4        # TSE and val top-1 ranking designs of similar cost
    python bench/search_works.py seed-power --table mait_small   # predict a seed check's tau from fewer rows
    python bench/search_works.py mask-effects --table mait_small # how far masked heads move top-1 (additive fit)

The reference is each design's final accuracy (all 10,000 test images) after the full protocol, averaged over the
table's seeds.  A fidelity measured on one seed's run is compared with the mean final accuracy of the *other*
seeds (every seed in turn, then averaged), so that no seed noise is shared between the two sides; a static count
(MACs, params) is compared with the mean over all seeds.  The ceiling any fidelity can reach is the reference's
own reproducibility: seed 0 against seed 1, and with 2k seeds the mean of seeds 0..k-1 against that of k..2k-1.

For each fidelity: Kendall tau (``scipy.stats.kendalltau``), its p-value, a 95 % bootstrap interval (designs
resampled with replacement, 1,000 times, seeded; for a mean over seeds, the mean tau of each resample) and its
cost per design in CPU seconds (the table's training seconds up to that step, per span the least of the design's
seeds: ``archspec.search._tabulation.oracle.design_seconds``; the zero-cost score's seconds; 0 for counts).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from archspec.errors import SpecError
from archspec.families.attention.placement import DEFAULT_ALS_HIGH, DEFAULT_ALS_LOW
from archspec.search._tabulation.mask_replay import als_at, group_als, mask_groups
from archspec.search._tabulation.oracle import design_seconds
from archspec.search.cli_support import PROXY_SCORES

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TABLE = ROOT / "archspec" / "search" / "tables" / "levit_small.jsonl"


def paired_designs(rows: list[dict], seeds: tuple[int, ...] = (0, 1)) -> list[dict[int, dict]]:
    """``[{seed: row}]`` of the designs that have every seed of ``seeds``."""
    by: dict[str, dict[int, dict]] = {}
    for r in rows:
        by.setdefault(r["key"], {})[r["seed"]] = r
    return [v for v in by.values() if all(s in v for s in seeds)]


def common_seeds(rows: list[dict]) -> tuple[int, ...]:
    """The largest seed set ``(0, .., k-1)`` (k >= 2) that at least 4 designs have all of; (0, 1) otherwise."""
    for k in (6, 5, 4, 3):
        if len(paired_designs(rows, tuple(range(k)))) >= 4:
            return tuple(range(k))
    return (0, 1)


def _tau(xs, ys) -> float:
    t, _ = kendalltau(xs, ys)
    return float(t)


def bootstrap(xs, ys, n: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of Kendall tau over designs resampled with replacement."""
    return bootstrap_mean([xs], [ys], n, seed)


def bootstrap_mean(xs_by_seed, ys_by_seed, n: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of the mean over seeds of Kendall tau(xs[a], ys[a]): the designs are resampled with
    replacement, the same resample for every seed a (so the interval is about designs, as the mean tau is; pooling
    the seeds' pairs into one sample would count each design once per seed).  ``(nan, nan)`` where no resample
    gives a tau (a value every design shares)."""
    rng = np.random.default_rng(seed)
    xs = np.asarray(xs_by_seed, float)  # (seeds, designs)
    ys = np.asarray(ys_by_seed, float)
    taus = []
    for _ in range(n):
        idx = rng.integers(0, xs.shape[1], xs.shape[1])
        t = np.mean([_tau(x[idx], y[idx]) for x, y in zip(xs, ys)])
        if np.isfinite(t):
            taus.append(t)
    if not taus:  # a fidelity every design shares (a mask table's MACs): no tau to resample
        return math.nan, math.nan
    return float(np.percentile(taus, 2.5)), float(np.percentile(taus, 97.5))


def cross_seed(designs, value, seeds: tuple[int, ...] = (0, 1)) -> dict:
    """Tau of ``value(row)`` from seed a against the mean final accuracy of the other seeds, for every a in
    ``seeds``: the mean tau, the mean of the p-values' logs back-transformed (a geometric mean), and the bootstrap
    interval of the mean tau (:func:`bootstrap_mean`)."""
    xs, ys = [], []
    taus, ps = [], []
    for a in seeds:
        x = [value(d[a]) for d in designs]
        y = [float(np.mean([d[b]["final_accuracy"] for b in seeds if b != a])) for d in designs]
        t, p = kendalltau(x, y)
        taus.append(t)
        ps.append(p)
        xs.append(x)
        ys.append(y)
    low, high = bootstrap_mean(xs, ys)
    return {"tau": float(np.mean(taus)), "p": float(np.exp(np.mean(np.log(ps)))), "ci": [low, high]}


def fidelity_table(rows: list[dict], seeds: tuple[int, ...] | None = None, als: dict | None = None) -> dict:
    """Every fidelity's tau against the reference, with its cost (see the module docstring), on the designs that
    hold every seed of ``seeds`` (default: :func:`common_seeds`).  ``als`` (a mask table's ``{"heads": H, "u":
    uniform ALS}``, :func:`als_geometry`): also MaiT's rule as a score at every curve step (:func:`rule_fidelities`)."""
    seeds = tuple(seeds) if seeds else common_seeds(rows)
    designs = paired_designs(rows, seeds)
    if len(designs) < 4:
        raise SystemExit(f"only {len(designs)} designs have both seeds: nothing to rank yet")
    mean_final = [float(np.mean([d[s]["final_accuracy"] for s in seeds])) for d in designs]
    seed0 = [d[seeds[0]]["final_accuracy"] for d in designs]
    seed1 = [d[seeds[1]]["final_accuracy"] for d in designs]
    t, p = kendalltau(seed0, seed1)
    out = {"designs": len(designs), "seeds": list(seeds),
           "reference_seed_to_seed": {"tau": float(t), "p": float(p), "ci": list(bootstrap(seed0, seed1))},
           "fidelities": []}
    k = len(seeds) // 2
    if k >= 2:  # two disjoint k-seed references of the same designs: how well the reference reproduces itself
        half_a = [float(np.mean([d[s]["final_accuracy"] for s in seeds[:k]])) for d in designs]
        half_b = [float(np.mean([d[s]["final_accuracy"] for s in seeds[k:2 * k]])) for d in designs]
        t, p = kendalltau(half_a, half_b)
        out["reference_split_means"] = {"seeds_per_half": k, "tau": float(t), "p": float(p),
                                        "ci": list(bootstrap(half_a, half_b))}
    steps = [s for s, *_ in designs[0][seeds[0]]["curve"]]
    clocks = [dict(design_seconds(d[s] for s in seeds)) for d in designs]  # per span the least of its seeds
    for i, step in enumerate(steps):
        cost = float(np.mean([c[float(designs[0][seeds[0]]["tse"][i][0])] for c in clocks]))
        out["fidelities"].append({"fidelity": f"val top-1 at step {step}", "cost_s": cost,
                                  **cross_seed(designs, lambda r, i=i: r["curve"][i][1], seeds)})
        out["fidelities"].append({"fidelity": f"TSE (sum of train losses) to step {step}", "cost_s": cost,
                                  **cross_seed(designs, lambda r, i=i: -r["tse"][i][1], seeds)})
    if als is not None:
        out["fidelities"].extend(rule_fidelities(designs, seeds, steps, clocks, **als))
    for name in sorted(designs[0][seeds[0]]["zc"]):
        cost = float(np.mean([d[s].get("zc_seconds", {}).get(name, 0.0) for d in designs for s in seeds]))
        out["fidelities"].append({"fidelity": f"zero-cost {name}", "cost_s": cost,
                                  **cross_seed(designs, lambda r, n=name: r["zc"][n] if r["zc"][n] is not None
                                               else -np.inf, seeds)})
    for name, field in (("#MACs", "macs"), ("#params", "n_params")):
        x = [d[seeds[0]][field] for d in designs]
        t, p = kendalltau(x, mean_final)
        out["fidelities"].append({"fidelity": name, "cost_s": 0.0, "tau": float(t), "p": float(p),
                                  "ci": list(bootstrap(x, mean_final))})
    return out


def rule_score(round1_row: dict, steps: int, params: dict[str, int], *, heads: int, u: float,
               high: float = DEFAULT_ALS_HIGH, low: float = DEFAULT_ALS_LOW,
               depths: dict[int, int] | None = None) -> float:
    """MaiT's assignment rule (sec. 4.2 step 2) read as a score of any placement, for ranking a mask table's points.

    ``round1_row`` is the table row the rule's first round reads (head 0 masked in every layer: every group
    ``m = 1``); ``a_g`` is head 0's ALS above uniform attention in group ``g`` at the last curve step ``<= steps``
    (as the replay, :func:`archspec.search._tabulation.mask_replay.replay_als`, reads it; ``u`` the layer's uniform
    ALS).  The rule masks every head of a group where ``a_g >= high`` and none where ``a_g <= low``; its continuous
    form, a choice of archspec's (MaiT ranks nothing), rewards masked heads where head 0 was local and charges them
    where it was not, centred half-way between the thresholds::

        score = sum_g  m_g / heads * (a_g - (high + low) / 2)

    with ``m_g`` the placement's masked heads in group ``g`` (``params``).  Unitless; larger = more as MaiT's rule
    would place masks.

    ``depths`` (``{stage: depth}``, ``mask_depths``) places a whole-stage count's layers.

    Raises:
        SpecError: ``params`` is not a per-group mask point, or the row holds no ALS.
        KeyError: a group's layer has no ALS in the row.
    """
    groups = mask_groups(params, depths)
    a = group_als(als_at(round1_row, steps), groups, u)
    centre = (high + low) / 2.0
    return float(sum(m / heads * (a[name][0] - centre) for name, m in params.items()))


def rule_fidelities(designs: list[dict[int, dict]], seeds: tuple[int, ...], steps: list[int], clocks: list[dict],
                    heads: int, u: float) -> list[dict]:
    """MaiT's rule as a fidelity of a mask table (issue 52's "fidelity of ALS"): at each curve step, every design
    scored by :func:`rule_score` from the round-1 row (every group one masked head: the row the
    rule's first round reads) *of the same seed*, against the mean final top-1 of the other seeds
    (:func:`cross_seed`).  One training ranks every design, so its cost is the round-1 design's seconds to that
    step (per span the least of its seeds, as every cost here).  No round-1 design among ``designs``: nothing."""
    index = next((i for i, d in enumerate(designs) if set(d[seeds[0]]["params"].values()) == {1}), None)
    if index is None:
        return []
    round1 = designs[index]
    out = []
    for step in steps:
        cost = float(clocks[index][float(round1[seeds[0]]["tse"][steps.index(step)][0])])
        out.append({"fidelity": f"MaiT's rule score, ALS of the round-1 row at step {step}", "cost_s": cost,
                    **cross_seed(designs, lambda r, t=step: rule_score(round1[r["seed"]], t, r["params"],
                                                                       heads=heads, u=u), seeds)})
    return out


def als_geometry(table_file: Path) -> dict | None:
    """``{"heads": H, "u": uniform ALS}`` of a mask table from its ``.meta.json`` sidecar (the space and the ALS
    window of its protocol), or None for a table whose rows hold no ALS or that has no sidecar."""
    from archspec.families.attention.kinds.mask import parse_window
    from archspec.search._tabulation.mask_replay import mask_geometry, uniform_als

    meta = table_file.with_suffix(".meta.json")
    if not meta.is_file():
        return None
    protocol = json.loads(meta.read_text()).get("protocol", {})
    if "als" not in protocol:
        return None
    heads, grid, prefix = mask_geometry(protocol["space"])
    return {"heads": heads, "u": uniform_als(grid, parse_window(protocol["als"]["window"]), prefix)}


def table_file(table: str) -> Path:
    """A table's JSONL from a path or a shipped table's name (``mait_small``)."""
    from archspec.search._tabulation.oracle import TABLES_DIR

    path = Path(table).expanduser()
    if not path.exists() and path.parent == Path(".") and (TABLES_DIR / f"{path.name}.jsonl").is_file():
        return TABLES_DIR / f"{path.name}.jsonl"
    return path


# ------------------------------------------------------------------------------------------- search methods
# Each method is `archspec search --oracle` with these options (run_design's names); the budget is the same for all.
# "archspec default" is whatever the bare search does now; every other method names each option it depends on, so
# that a change of default does not change what it measures.
ACCURACY = {"protocol": {"score": "accuracy"}}  # ranked by the proxy's val top-1 (the default before TSE)
TSE = {"protocol": {"score": "tse"}}            # ranked by its sum of training losses (--proxy-score tse)
METHODS = {
    "archspec default": {},
    "random sampling": {"sampler": "random", "fidelity": "none", **ACCURACY},
    "TPE, SynFlow rung": {"sampler": "tpe", "sampler_startup": 6, "fidelity": "zc", "zc_score": "synflow",
                          **ACCURACY},
    "TPE, no rung": {"sampler": "tpe", "sampler_startup": 6, "fidelity": "none", **ACCURACY},
    "NSGA-II": {"sampler": "nsga2", "sampler_startup": 6, "fidelity": "none", **ACCURACY},
    "TPE + successive halving": {"sampler": "tpe", "sampler_startup": 6, "fidelity": "sha", **ACCURACY},
    "TPE, TSE proxy": {"sampler": "tpe", "sampler_startup": 6, "fidelity": "none", **TSE},
    "random sampling, TSE proxy": {"sampler": "random", "fidelity": "none", **TSE},
    "GP, TSE proxy": {"sampler": "gp", "sampler_startup": 6, "fidelity": "none", **TSE},
    "NSGA-II, TSE proxy": {"sampler": "nsga2", "sampler_startup": 6, "fidelity": "none", **TSE},
    "TPE, 10 start-up, TSE proxy": {"sampler": "tpe", "sampler_startup": 10, "fidelity": "none", **TSE},
    "TPE, 4 start-up, TSE proxy": {"sampler": "tpe", "sampler_startup": 4, "fidelity": "none", **TSE},
    "GP, 4 start-up, TSE proxy": {"sampler": "gp", "sampler_startup": 4, "fidelity": "none", **TSE},
    # successive halving on TSE (rungs at --min-steps, then x eta): 40 candidates start, most stop at a rung; read
    # at equal CPU against 20 fully trained random draws
    "random sampling + successive halving, 40 started, TSE proxy": {"sampler": "random", "fidelity": "sha",
                                                                    "trials": 40, **TSE},
    # local search around the front (archspec.search._engine.front_sampler): random draws, then one-parameter mutations
    "front mutation, 4 start-up, TSE proxy": {"sampler": "front", "sampler_startup": 4, "fidelity": "none", **TSE},
    "front mutation, 6 start-up, TSE proxy": {"sampler": "front", "sampler_startup": 6, "fidelity": "none", **TSE},
    "front mutation, 10 start-up, TSE proxy": {"sampler": "front", "sampler_startup": 10, "fidelity": "none",
                                               **TSE},
    # free looks first (archspec.search._engine.strata): the best zero-cost score of each of 20 latency strata queued,
    # then random draws; the look's zero-cost seconds count (study attribute prior_seconds), and at equal CPU also
    # --latency-seconds per candidate looked at (study attribute prior_candidates)
    "strata, NASWOT, TSE proxy": {"sampler": "strata", "zc_score": "naswot", "fidelity": "none", **TSE},
    "strata, SynFlow, TSE proxy": {"sampler": "strata", "zc_score": "synflow", "fidelity": "none", **TSE},
    # with a MAC budget (`--budget-flops 20M`): every trained candidate is under it (over-budget samples are
    # rejected statically, untrained): the search a user who wants the best design under 20 M MACs runs
    "archspec default, 20 M MAC budget": {"budgets": {"macs": 20e6}},
    "random sampling, 20 M MAC budget": {"sampler": "random", "fidelity": "none", "budgets": {"macs": 20e6},
                                         **ACCURACY},
}


def hypervolume_2d(points: list[tuple[float, float]], ref: tuple[float, float]) -> float:
    """Area dominated by ``points`` (both coordinates minimised) up to the reference point ``ref``: the union of
    the rectangles ``[x, ref_x] x [y, ref_y]``; points beyond ``ref`` in either coordinate add nothing.  A sweep
    in ``x``: each strip up to the next point's ``x`` is as tall as ``ref_y`` less the lowest ``y`` so far."""
    inside = sorted((x, y) for x, y in points if x < ref[0] and y < ref[1])
    area, best_y = 0.0, ref[1]
    for (x, y), next_x in zip(inside, [p[0] for p in inside[1:]] + [ref[0]]):
        best_y = min(best_y, y)
        area += (next_x - x) * (ref[1] - best_y)
    return area


def pareto(points: list[tuple[float, float, object]]) -> list:
    """The items of ``(accuracy, cost, item)`` that no other beats on both (higher accuracy, lower cost)."""
    return [c for a, k, c in points
            if not any(a2 >= a and k2 <= k and (a2 > a or k2 < k) for a2, k2, _ in points)]


class Truth:
    """What the table says of each design: reference accuracy (mean final over seeds), MACs, latency, costs."""

    def __init__(self, table):
        self.table = table
        seeds, keys = table.seeds, table.tabulated  # the designs the oracle answers, each the mean of these seeds
        self.finals = {k: [float(table.rows[k][s]["final_accuracy"]) for s in seeds] for k in keys}
        self.accuracy = {k: float(np.mean(v)) for k, v in self.finals.items()}
        self.macs = {k: table.rows[k][seeds[0]]["macs"] for k in keys}
        self.latency = {k: ms for k, ms in table.latency_ms.items() if k in keys}
        accs, macs = list(self.accuracy.values()), list(self.macs.values())
        lats = list(self.latency.values()) or [1.0]
        self.bounds = {"accuracy": (min(accs), max(accs)), "macs": (min(macs), max(macs)),
                       "latency": (min(lats), max(lats))}
        self.flat_costs = sorted(c for c in ("macs", "latency") if self.bounds[c][0] == self.bounds[c][1]
                                 and (c == "macs" or self.latency))

    def hand_designs(self) -> dict[str, str]:
        """``{hand design name: architecture key}`` of the seed papers' designs the table holds (rows' ``hand``)."""
        return {by[s]["hand"]: key for key, by in self.table.rows.items() if key in self.accuracy
                for s in self.table.seeds[:1] if by[s].get("hand")}

    def held_out_finals(self, key: str, answered: int | None) -> list[float]:
        """The design's final accuracies on the reference seeds other than ``answered`` (the table seed whose row
        answered the search's proxy, trial attribute ``oracle_seed``): the only seeds a leak-free score may read
        (issue 54: scored on the seed that answered, the proxy's own noise counts as skill).  ``None``: all."""
        seeds = self.table.seeds
        return [v for s, v in zip(seeds, self.finals[key]) if s != answered] or self.finals[key]

    def held_out(self, key: str, answered: int | None) -> float:
        """Mean of :meth:`held_out_finals`: the design's reference accuracy as a leak-free score reads it."""
        return float(np.mean(self.held_out_finals(key, answered)))

    def normalised(self, key: str, cost: str, accuracy: float | None = None) -> tuple[float, float]:
        """``(1 - accuracy, cost)`` scaled so the table spans [0, 1] on both: both minimised.  ``accuracy``: the
        design's score (default: its reference accuracy over every seed)."""
        lo, hi = self.bounds["accuracy"]
        clo, chi = self.bounds[cost]
        value = self.macs[key] if cost == "macs" else self.latency[key]
        acc = self.accuracy[key] if accuracy is None else accuracy
        # a flat cost (every design the same: mask placements have equal MACs) puts every design at 0 on that axis:
        # the plane's hypervolume is then the best front design's accuracy alone (``flat_costs`` says so)
        return (1 - (acc - lo) / (hi - lo), (value - clo) / (chi - clo) if chi > clo else 0.0)

    def trial_cost(self, trial, seed: int, steps: int) -> float:
        """Simulated CPU seconds a trial spent: the table's training seconds up to the step it reached (the
        proxy's last step, or the last rung it reached when stopped there), plus its zero-cost seconds."""
        ua = trial.user_attrs
        cost = float(ua.get("zero_cost", {}).get("total_seconds", 0.0))
        key = ua.get("arch_key")
        if key not in self.table.rows or "reused_from" in ua:
            return cost
        reached = steps if ua.get("status") == "trained" else max(map(int, ua.get("rungs", {}) or {"0": 0}))
        if reached:  # the design's training seconds (the least of its rows per span), whichever row answered
            cost += self.table.training_seconds(key, reached)
        return cost


def trace(study, truth: Truth, seed: int, steps: int, macs_budget: float,
          latency_seconds: float = 0.0) -> list[dict]:
    """The search as it went, one entry per finished trial: cumulative simulated seconds, trained count, and
    the front it would report then (Pareto by proxy accuracy and latency), scored leak-free on the table's
    reference -- each design on the reference seeds that did not answer its proxy (:meth:`Truth.held_out`):
    hypervolume in (accuracy, latency) and (accuracy, MACs), and the held-out accuracy of the best design
    (by proxy) under ``macs_budget``."""
    import optuna

    # a sampler that looks at every candidate first (--sampler strata) pays for the look before its first trial: the
    # tabulated zero-cost seconds, and what a live run spends measuring each candidate's latency (a replay reads it
    # from the table for free; ``latency_seconds`` per candidate, measured by ``latency-cost``)
    attrs = getattr(study, "user_attrs", {})
    look = float(attrs.get("prior_seconds", 0.0)) + latency_seconds * int(attrs.get("prior_candidates", 0))
    out, seconds, trained, answered = [], look, [], {}
    for t in sorted(study.trials, key=lambda t: t.number):
        seconds += truth.trial_cost(t, seed, steps)
        if t.state == optuna.trial.TrialState.COMPLETE and t.user_attrs.get("status") in ("trained", "reused"):
            if "reused_from" not in t.user_attrs:
                key = t.user_attrs["arch_key"]
                trained.append((t.values[0], t.user_attrs.get("latency_ms", 0.0), key))
                answered[key] = t.user_attrs.get("oracle_seed")
        front = pareto(trained)
        row = {"trial": t.number, "seconds": seconds, "trained": len(trained)}
        for cost in ("latency", "macs"):
            pts = ([truth.normalised(k, cost, truth.held_out(k, answered[k])) for k in front]
                   if (cost == "macs" or truth.latency) else [])
            row[f"hv_{cost}"] = hypervolume_2d(pts, (1.0, 1.0)) if pts else 0.0
        under = [(acc, k) for acc, _, k in trained if truth.macs[k] <= macs_budget]
        best = max(under)[1] if under else None
        row["best_under_budget"] = truth.held_out(best, answered[best]) if under else None
        row["best_under_budget_seeds"] = truth.held_out_finals(best, answered[best]) if under else None
        out.append(row)
    return out


def simulate(table_path: str, repeats: int, trials: int, steps: int, macs_budget: float,
             methods: dict | None = None, objective: str = "pareto", first_seed: int = 0,
             latency_seconds: float = 0.0) -> dict:
    """Every method, ``repeats`` times (seeds ``first_seed`` .. ``first_seed + repeats - 1``: each replay draws
    its own table seed per design, :meth:`archspec.search._tabulation.oracle.OracleTable.seed_of`), each a real
    ``archspec
    search --oracle --oracle-subset`` of ``trials`` trained candidates with ``steps``-step proxies, on an in-memory
    storage: their traces.  ``--oracle-subset`` keeps every method to the designs the table holds (all of the space
    once the table is complete; a point it lacks is infeasible for every method alike).  ``latency_seconds``: CPU
    seconds a live run spends measuring one candidate's latency, charged per candidate a strata look measured
    (:func:`trace`)."""
    import tempfile

    with tempfile.TemporaryDirectory() as frozen:
        snapshot = snapshot_table(table_path, Path(frozen))
        out = _simulate(snapshot, repeats, trials, steps, macs_budget, methods, objective, first_seed,
                        latency_seconds)
    return {**out, "table": table_path, "latency_seconds": latency_seconds}


def snapshot_table(table_path: str, into: Path) -> str:
    """Copy a table (a path or a shipped name) and its sidecars into ``into``; returns the copy's path.  Every
    search of a simulation then reads the same rows as its :class:`Truth`, even while a tabulation merges into the
    original (reading it twice mid-merge gave a design the truth lacked: a KeyError)."""
    import shutil

    path = table_file(table_path)
    for suffix in (".jsonl", ".meta.json", ".latency.json", ".soft.jsonl"):
        if path.with_suffix(suffix).is_file():
            shutil.copyfile(path.with_suffix(suffix), into / f"{path.stem}{suffix}")
    return str(into / f"{path.stem}.jsonl")


def _simulate(table_path: str, repeats: int, trials: int, steps: int, macs_budget: float, methods: dict | None,
              objective: str, first_seed: int = 0, latency_seconds: float = 0.0) -> dict:
    import tempfile

    from archspec.search import load_table, run_design

    table = load_table(table_path)
    truth = Truth(table)
    results = {}
    for name, options in (methods or METHODS).items():
        # the search's own `trials` candidates, no --verify re-training (it scores nothing a front is judged by)
        options = {"verify": 0, **options}
        protocol = {"steps": steps, **options.pop("protocol", {})}
        n_trials = options.pop("trials", trials)  # a method that screens (rungs) may train more at equal CPU
        runs = []
        for seed in range(first_seed, first_seed + repeats):
            with tempfile.TemporaryDirectory() as tmp:
                outcome = run_design(space=table.space, oracle=table_path, oracle_subset=True, objective=objective,
                                     trials=n_trials, timeout=None,
                                     trial_timeout=None, protocol=protocol, seed=seed, storage="memory",
                                     out=Path(tmp) / "run", progress=False, **options)
            runs.append(trace(outcome.study, truth, seed, steps, macs_budget, latency_seconds))
        results[name] = runs
    return {"table": table_path, "designs": len(truth.accuracy), "seeds": table.seeds, "objective": objective,
            "repeats": repeats, "first_seed": first_seed, "trials": trials, "steps": steps,
            "macs_budget": macs_budget, "flat_costs": truth.flat_costs,
            "bounds": truth.bounds, "hand": hand_summary(truth, macs_budget), "methods": results}


def hand_summary(truth: Truth, macs_budget: float) -> dict:
    """The hand designs as a method that made no search: each one's reference accuracy, MACs and latency, the
    hypervolume of their own front in both planes, and the best of them under ``macs_budget``."""
    hand = truth.hand_designs()
    out = {"designs": {name: {"accuracy": truth.accuracy[k], "macs": truth.macs[k],
                              "latency_ms": truth.latency.get(k)} for name, k in sorted(hand.items())}}
    for cost in ("latency", "macs"):
        pts = [truth.normalised(k, cost) for k in hand.values()] if (cost == "macs" or truth.latency) else []
        out[f"hv_{cost}"] = hypervolume_2d(pts, (1.0, 1.0)) if pts else 0.0
    under = [(truth.accuracy[k], k) for k in hand.values() if truth.macs[k] <= macs_budget]
    out["best_under_budget"] = max(under)[0] if under else None
    out["best_under_budget_seeds"] = truth.finals[max(under)[1]] if under else None
    return out


def below(design: list[float], hand: list[float], alpha: float = 0.05) -> bool:
    """Whether a design's reference seeds are below a hand design's: Welch's t-test, one-sided, at ``alpha``
    (per-seed final top-1 of each; with three seeds a design's mean carries a standard error of about 0.003)."""
    from scipy.stats import ttest_ind

    if list(design) == list(hand):
        return False
    return bool(ttest_ind(design, hand, equal_var=False, alternative="less").pvalue < alpha)


def value_at(run: list[dict], field: str, seconds: float):
    """A run's ``field`` at simulated time ``seconds`` (its last trace entry by then; 0 / None before any)."""
    last = None
    for row in run:
        if row["seconds"] > seconds:
            break
        last = row[field]
    return last if last is not None else (0.0 if field.startswith("hv") else None)


def compare(result: dict, baseline: str = "random sampling") -> dict:
    """Median and IQR of each method's hypervolumes and best-under-budget accuracy at the common budget (the
    baseline's median total simulated seconds) and after its last trial, and the paired Wilcoxon signed-rank test
    (one-sided: the method beats the baseline; repeats paired by seed)."""
    from scipy.stats import wilcoxon

    methods = result["methods"]
    budget = float(np.median([run[-1]["seconds"] for run in methods[baseline]]))
    out = {"budget_seconds": budget, "methods": {}}
    for name, runs in methods.items():
        entry = {}
        for field in ("hv_latency", "hv_macs", "best_under_budget"):
            at_budget = [value_at(run, field, budget) for run in runs]
            final = [run[-1][field] for run in runs]
            for label, values in (("at_budget", at_budget), ("final", final)):
                vals = [v for v in values if v is not None]
                entry[f"{field}_{label}"] = {"median": float(np.median(vals)) if vals else None,
                                             "iqr": [float(np.percentile(vals, 25)), float(np.percentile(vals, 75))]
                                             if vals else None, "values": values}
        hand = result.get("hand") or {}
        for field in ("hv_latency", "hv_macs", "best_under_budget"):  # repeats that match or beat the hand designs
            if hand.get(field) is not None:
                finals = [run[-1][field] for run in runs]
                entry[f"{field}_final"]["at_least_hand"] = sum(v is not None and v >= hand[field] for v in finals)
        if hand.get("best_under_budget_seeds"):  # the best under the budget not resolvably below the hand designs'
            seeds = [run[-1].get("best_under_budget_seeds") for run in runs]
            entry["best_under_budget_final"]["not_below_hand"] = sum(
                x is not None and not below(x, hand["best_under_budget_seeds"]) for x in seeds)
        if name != baseline:
            for field in ("hv_latency", "hv_macs"):
                for label in ("at_budget", "final"):
                    a = entry[f"{field}_{label}"]["values"]
                    b = [value_at(run, field, budget) if label == "at_budget" else run[-1][field]
                         for run in methods[baseline]]
                    diffs = [x - y for x, y in zip(a, b)]
                    p = float(wilcoxon(a, b, alternative="greater").pvalue) if any(diffs) else 1.0
                    entry[f"{field}_{label}"]["wilcoxon_p_vs_baseline"] = p
                    entry[f"{field}_{label}"]["wins"] = sum(d > 0 for d in diffs)
        out["methods"][name] = entry
    return out


def paired_values(a_runs: list, b_runs: list, field: str, label: str, seconds: float) -> tuple[list, list]:
    """The two methods' ``field`` per repeat, after the full budget (``label == "final"``) or at ``seconds`` of
    simulated CPU (``"at_budget"``), paired by repeat."""
    def value(run):
        return run[-1][field] if label == "final" else value_at(run, field, seconds)

    return [value(r) for r in a_runs], [value(r) for r in b_runs]


def batch_rate(a: list[float], b: list[float], batches: int = 200, size: int = 20, seed: int = 0) -> float:
    """How often a batch of ``size`` repeats (pairs drawn without replacement from the ``len(a)`` pairs, ``batches``
    times, seeded) gives a paired one-sided Wilcoxon p < 0.05 for ``a > b``: a 20-repeat comparison's power, or --
    a method against itself -- its false-positive rate.  Batches drawn from one pool of replays share replays
    (8,000 replays per method would make them disjoint): each batch is still a valid draw, so the rate estimates
    the per-batch probability, with more spread than disjoint batches would give."""
    from scipy.stats import wilcoxon

    rng = np.random.default_rng(seed)
    a, b = np.asarray(a, float), np.asarray(b, float)
    hits = 0
    for _ in range(batches):
        idx = rng.choice(len(a), size=min(size, len(a)), replace=False)
        diffs = a[idx] - b[idx]
        if np.any(diffs):
            hits += float(wilcoxon(a[idx], b[idx], alternative="greater").pvalue) < 0.05
    return hits / batches


def paired_test(a_runs: list, b_runs: list, seconds: float) -> dict:
    """Method ``a`` against ``b`` (paired by repeat): per plane and budget (``final``: after every candidate;
    ``at_budget``: at ``seconds`` of simulated CPU), both medians, the wins, the one-sided paired Wilcoxon p over
    all repeats, and :func:`batch_rate` of 20-repeat batches."""
    from scipy.stats import wilcoxon

    out = {}
    for field in ("hv_latency", "hv_macs"):
        for label in ("final", "at_budget"):
            a, b = paired_values(a_runs, b_runs, field, label, seconds)
            diffs = [x - y for x, y in zip(a, b)]
            p = float(wilcoxon(a, b, alternative="greater").pvalue) if any(diffs) else 1.0
            out[f"{field}_{label}"] = {"median": float(np.median(a)), "baseline_median": float(np.median(b)),
                                       "wins": sum(d > 0 for d in diffs), "losses": sum(d < 0 for d in diffs),
                                       "n": len(a), "wilcoxon_p": p, "batch20_rate_p05": batch_rate(a, b)}
    return out


def null_check(table_path: str, method: str, repeats: int, trials: int, steps: int, macs_budget: float,
               objective: str = "pareto", second_seed: int = 100_000, latency_seconds: float = 0.0) -> dict:
    """The replay protocol's calibration: ``method`` against itself, ``repeats`` replays with seeds ``0..`` against
    ``repeats`` with seeds ``second_seed..`` (each replay draws its own table seed per design), compared as any two
    methods are (:func:`paired_test`).  A calibrated protocol gives p < 0.05 in about 5 % of 20-repeat batches."""
    options = {method: METHODS[method]}
    first = simulate(table_path, repeats, trials, steps, macs_budget, methods=options, objective=objective,
                     latency_seconds=latency_seconds)
    second = simulate(table_path, repeats, trials, steps, macs_budget, methods=options, objective=objective,
                      first_seed=second_seed, latency_seconds=latency_seconds)
    a, b = first["methods"][method], second["methods"][method]
    seconds = float(np.median([run[-1]["seconds"] for run in b]))
    return {"table": table_path, "method": method, "repeats": repeats, "trials": trials, "steps": steps,
            "seeds": [[0, repeats - 1], [second_seed, second_seed + repeats - 1]], "budget_seconds": seconds,
            "test": paired_test(a, b, seconds)}


PLANES = ("hv_latency", "hv_macs")


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjustment (Holm 1979) of ``{name: p}``: sorted ascending, the i-th of m is multiplied by
    ``m - i`` (i from 0), capped at 1, and made monotone (never below the one before it).  Controls the
    family-wise error rate over the whole family at the nominal level."""
    order = sorted(pvalues, key=lambda k: pvalues[k])
    out, running = {}, 0.0
    for i, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * pvalues[name]))
        out[name] = running
    return out


def choose(result: dict, null: dict, alpha: float = 0.01, null_rate: float = 0.08,
           best_margin: float = 0.002) -> dict:
    """research/search-works-notebook.md's pre-registered rule ("How the default will be chosen"), applied to a
    ``simulate`` result (its ``paired_tests`` against the baseline) and a ``null`` result of the baseline against
    itself:

    1. the protocol is broken -- nothing chosen -- when the null gives p < 0.05 in more than ``null_rate`` of
       20-replay batches in any plane and reading;
    2. each candidate's one-sided paired p at equal CPU in both planes, Holm-adjusted over every candidate and
       plane together;
    3. a candidate qualifies when both adjusted p < ``alpha`` and its median best design under the MAC budget at
       equal CPU is at most ``best_margin`` below the baseline's;
    4. of those, the one with the largest mean over the two planes of (its median HV - the baseline's) at equal
       CPU; none: the baseline stays.
    Raises KeyError when ``result`` has no paired tests (a ``simulate`` JSON written before them)."""
    rates = {name: v["batch20_rate_p05"] for name, v in null["test"].items()}
    broken = {name: r for name, r in rates.items() if r > null_rate}
    tests = result["paired_tests"]
    raw = {(m, plane): tests[m][f"{plane}_at_budget"]["wilcoxon_p"] for m in tests for plane in PLANES}
    adjusted = holm({f"{m} | {plane}": p for (m, plane), p in raw.items()})
    methods = result["comparison"]["methods"]
    base_best = methods[result["baseline"]]["best_under_budget_at_budget"]["median"]
    rows = {}
    for m in tests:
        best = methods[m]["best_under_budget_at_budget"]["median"]
        gains = [tests[m][f"{p}_at_budget"]["median"] - tests[m][f"{p}_at_budget"]["baseline_median"] for p in PLANES]
        adj = {p: adjusted[f"{m} | {p}"] for p in PLANES}
        best_ok = best is not None and base_best is not None and best >= base_best - best_margin
        rows[m] = {"p": {p: raw[(m, p)] for p in PLANES}, "p_holm": adj, "hv_gain": dict(zip(PLANES, gains)),
                   "best_under_budget": best, "baseline_best_under_budget": base_best,
                   "qualifies": (not broken) and all(v < alpha for v in adj.values()) and best_ok}
    qualified = [m for m, r in rows.items() if r["qualifies"]]
    chosen = max(qualified, key=lambda m: float(np.mean(list(rows[m]["hv_gain"].values())))) if qualified else None
    return {"baseline": result["baseline"], "null_rates": rates, "protocol_broken": bool(broken),
            "candidates": rows, "chosen": chosen or result["baseline"], "replaced": chosen is not None,
            "alpha": alpha, "null_rate": null_rate, "best_margin": best_margin}


def plot(result: dict, path: str, field: str = "hv_latency") -> None:
    """Anytime ``field`` against simulated CPU seconds: median and interquartile band per method (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max(run[-1]["seconds"] for runs in result["methods"].values() for run in runs)
    grid = np.linspace(0, end, 200)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = plt.get_cmap("tab10").colors  # 10 distinct colours; solid, then dashed past ten methods
    for i, (name, runs) in enumerate(result["methods"].items()):
        values = np.array([[value_at(run, field, t) for t in grid] for run in runs], dtype=float)
        median, q1, q3 = (np.percentile(values, q, axis=0) for q in (50, 25, 75))
        colour, style = colours[i % 10], ("-", "--", ":")[i // 10 % 3]
        ax.plot(grid / 60, median, label=name, color=colour, linestyle=style)
        ax.fill_between(grid / 60, q1, q3, alpha=0.15, color=colour)
    hand = (result.get("hand") or {}).get(field)
    if hand:
        ax.axhline(hand, color="black", linestyle="--", linewidth=1, label="the hand designs' own front")
    ax.set_xlabel("simulated CPU minutes (the table's training seconds)")
    ax.set_ylabel("hypervolume, (accuracy, latency)" if field == "hv_latency" else "hypervolume, (accuracy, MACs)")
    ax.set_title(f"{len(next(iter(result['methods'].values())))} repeats per method: median and IQR")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def markdown(result: dict) -> str:
    ref = result["reference_seed_to_seed"]
    head = (f"{result['designs']} designs x seeds {result.get('seeds', [0, 1])}; the reference's own seed-to-seed "
            f"tau {ref['tau']:.3f} (p {ref['p']:.1e}, 95 % CI {ref['ci'][0]:.2f}..{ref['ci'][1]:.2f})")
    two = result.get("reference_split_means")
    if two:
        k = two["seeds_per_half"]
        head += (f"; mean of seeds 0-{k - 1} against mean of seeds {k}-{2 * k - 1}: tau {two['tau']:.3f} "
                 f"(p {two['p']:.1e}, "
                 f"95 % CI {two['ci'][0]:.2f}..{two['ci'][1]:.2f}); fidelities below are measured against the mean "
                 "of the seeds other than their own")
    lines = [head, "",
             "| fidelity | CPU s per design | Kendall tau | p | 95 % CI |", "|---|---:|---:|---:|---|"]
    for f in result["fidelities"]:
        lines.append(f"| {f['fidelity']} | {f['cost_s']:.2f} | {f['tau']:.3f} | {f['p']:.1e} | "
                     f"{f['ci'][0]:.2f}..{f['ci'][1]:.2f} |")
    return "\n".join(lines)


def proxy_value(row: dict, score: str, steps: int) -> float:
    """What a search's proxy of ``steps`` steps answers for one tabulated row (as the oracle does): the curve's
    val top-1, or with ``score == "tse"`` minus the mean training loss up to that step."""
    from archspec.search._evaluation.scoring import proxy_score
    from archspec.search._tabulation.oracle import curve_at

    return proxy_score(score, *curve_at(row, steps), steps)


def reported_hv(truth: Truth, keys, proxy: dict[str, float], cost: str) -> float:
    """Hypervolume (on the table's reference) of the front a search reports after evaluating ``keys``: Pareto by
    the proxy's value and ``cost`` (latency or MACs), each design then scored by its reference accuracy."""
    values = truth.latency if cost == "latency" else truth.macs
    front = pareto([(proxy[k], values[k], k) for k in keys])
    return hypervolume_2d([truth.normalised(k, cost) for k in front], (1.0, 1.0))


def headroom(table_path: str, trials: tuple[int, ...], steps: int, score: str, draws: int = 2000,
             macs_budget: float = 20e6, seed: int = 0) -> dict:
    """How much any sampler could gain over random sampling on the table: :func:`headroom_of` with each reference
    seed's proxy (``score`` at ``steps`` steps, as the oracle answers it).  No Optuna: numbers from the table."""
    from archspec.search import load_table

    table = load_table(table_path)
    truth = Truth(table)
    proxies = [{k: proxy_value(table.rows[k][s], score, steps) for k in truth.accuracy} for s in table.seeds]
    out = headroom_of(truth, proxies, trials, draws, macs_budget, np.random.default_rng(seed))
    return {"table": table_path, "designs": len(truth.accuracy), "seeds": table.seeds, "steps": steps,
            "score": score, "draws": draws, "macs_budget": macs_budget, **out}


def _summary(values: list[float]) -> dict:
    return {"median": float(np.median(values)),
            "iqr": [float(np.percentile(values, 25)), float(np.percentile(values, 75))]}


def headroom_of(truth: Truth, proxies: list[dict[str, float]], trials: tuple[int, ...], draws: int,
                macs_budget: float, rng) -> dict:
    """Per plane (accuracy against latency or MACs) and per number of evaluated designs ``k``, four fronts scored
    by hypervolume on the reference, and the same four for the best design under ``macs_budget``:

    * ``best``: the table's own front by reference accuracy -- what a perfect proxy evaluating every design finds;
    * ``all_designs_proxy``: every design evaluated, the front (or the best) chosen by one seed's proxy (median
      over ``proxies``) -- the ceiling the proxy's noise leaves any search;
    * ``random``: ``k`` distinct designs drawn at random, a random seed's proxy (``draws`` draws: median, IQR);
    * ``perfect_sampler``: a sampler that knows the reference and evaluates the best designs first (the table's
      front, or the most accurate under the budget), then random ones up to ``k``, its choice still made by the
      proxy -- the most any sampler can add to random sampling's ``k`` evaluations with this proxy."""
    keys = sorted(truth.accuracy)
    under = [k for k in keys if truth.macs[k] <= macs_budget]
    out = {"planes": {}}
    for cost in ("latency", "macs") if truth.latency else ("macs",):
        values = truth.latency if cost == "latency" else truth.macs
        best_front = pareto([(truth.accuracy[k], values[k], k) for k in keys])
        out["planes"][cost] = _headroom_plane(
            lambda chosen, proxy, cost=cost: reported_hv(truth, chosen, proxy, cost), keys, best_front, proxies,
            trials, draws, rng, best=reported_hv(truth, keys, truth.accuracy, cost))
    if under:
        ranked = sorted(under, key=lambda k: -truth.accuracy[k])

        def best_under(chosen, proxy):
            inside = [k for k in chosen if k in under]
            return truth.accuracy[max(inside, key=lambda k: proxy[k])] if inside else None

        out["best_under_budget"] = _headroom_plane(best_under, keys, ranked[:1], proxies, trials, draws, rng,
                                                   best=truth.accuracy[ranked[0]])
    return out


def _headroom_plane(value, keys, first, proxies, trials, draws, rng, best) -> dict:
    """:func:`headroom_of` for one measure ``value(chosen designs, proxy)`` (None: nothing to report)."""
    rest = [k for k in keys if k not in first]
    plane = {"best": best, "first": len(first),
             "all_designs_proxy": float(np.median([value(keys, p) for p in proxies])), "by_trials": {}}
    for k in trials:
        k = min(k, len(keys))
        rand, perfect = [], []
        for _ in range(draws):
            proxy = proxies[rng.integers(len(proxies))]
            rand.append(value(list(rng.choice(keys, size=k, replace=False)), proxy))
            fill = list(rng.choice(rest, size=max(0, k - len(first)), replace=False))
            perfect.append(value(list(first[:k]) + fill, proxy))
        plane["by_trials"][k] = {name: _summary([v for v in got if v is not None])
                                 for name, got in (("random", rand), ("perfect_sampler", perfect))}
    return plane



# --- priors: which free look would choose the designs to train (issue 54 item 3), from the table alone ---------------

def stratified_choice(keys: list[str], cost: dict[str, float], score: dict[str, float] | None, n: int, rng) -> list:
    """``n`` designs by the shipped strata rule (:func:`archspec.search._engine.strata.stratified_picks`, what
    ``--sampler strata`` queues): ``keys`` sorted by ``cost`` split into ``n`` bins of equal count, from each the
    design with the largest ``score`` (``None``: a random one -- random scores); ties broken as the search breaks
    them, with a generator seeded from ``rng`` (a ``random.Random``).  A rule that spreads the trained designs over
    the cost axis a front is judged on, and uses a free look to choose within each bin."""
    from archspec.search._engine.strata import ScoredCandidate, stratified_picks

    values = {k: rng.random() for k in keys} if score is None else score
    candidates = [ScoredCandidate({"key": k}, float(cost[k]), float(values[k])) for k in keys]
    return [c.params["key"] for c in stratified_picks(candidates, n, np.random.RandomState(rng.randrange(2 ** 32)))]


NULL_RULE = "random draws again (null)"  # priors' null: random draws on replays seeded NULL_SEED_OFFSET + r
NULL_SEED_OFFSET = 100_000


def _finite(value) -> float:
    """A tabulated zero-cost score as the search ranks it: ``-inf`` when missing or not finite (0.0 stays 0.0)."""
    return -math.inf if value is None or not math.isfinite(value) else float(value)


def priors(table_path: str, rules: dict[str, tuple[str, str | None]], repeats: int, trials: int, steps: int,
           seed: int = 0, zc_seed: str = "answer") -> dict:
    """Each rule ``name -> (cost, zero-cost score or None)`` against ``trials`` random draws, ``repeats`` paired
    replays, no Optuna: per replay each design's answering table seed is drawn (as the oracle draws it); a rule reads
    each design's zero-cost score *at that seed* (the search scores and trains at its own seed: a zero-cost score read
    at another seed than the proxy's can share its initialisation with a held-out seed, and that is a leak -- it made
    SynFlow look far ahead on the partial table: ``zc_seed="one"`` reads every design's score at one seed drawn per
    replay, the leaky way, to show it); the front is Pareto by the proxy (TSE at ``steps``) and latency,
    scored leak-free (:meth:`Truth.held_out`) in both planes.  Paired one-sided Wilcoxon against random draws, and
    the share of 20-replay batches at p < 0.05 (:func:`batch_rate`); the null :data:`NULL_RULE`, random draws on
    replays of their own, shows the false-positive rate of both."""
    import random

    from scipy.stats import wilcoxon

    from archspec.search import load_table

    table = load_table(table_path)
    truth = Truth(table)
    keys, seeds = sorted(truth.accuracy), table.seeds
    proxy = {s: {k: proxy_value(table.rows[k][s], "tse", steps) for k in keys} for s in seeds}

    def hv(chosen, answered) -> list[float]:
        front = pareto([(proxy[answered[k]][k], truth.latency[k], k) for k in chosen])
        return [hypervolume_2d([truth.normalised(k, c, truth.held_out(k, answered[k])) for k in front], (1.0, 1.0))
                for c in ("latency", "macs")]

    values: dict[str, list] = {name: [] for name in ["random draws", NULL_RULE, *rules]}
    for rep in range(seed, seed + repeats):
        rng = random.Random(rep)
        answered = {k: rng.choice(seeds) for k in keys}
        one = rng.choice(seeds)
        zc_at = answered if zc_seed == "answer" else dict.fromkeys(keys, one)
        values["random draws"].append(hv(rng.sample(keys, trials), answered))
        again = random.Random(NULL_SEED_OFFSET + rep)  # the null: random draws on replays of their own
        answered_again = {k: again.choice(seeds) for k in keys}
        values[NULL_RULE].append(hv(again.sample(keys, trials), answered_again))
        for name, (cost, zc) in rules.items():
            costs = truth.latency if cost == "latency" else truth.macs
            score = None if zc is None else {k: _finite(table.rows[k][zc_at[k]]["zc"].get(zc)) for k in keys}
            values[name].append(hv(stratified_choice(keys, costs, score, trials, rng), answered))
    base = np.array(values["random draws"])
    out = {}
    for name, v in values.items():
        v = np.array(v)
        out[name] = {plane: {"median": float(np.median(v[:, i])),
                             "p": (None if name == "random draws" else
                                   float(wilcoxon(v[:, i], base[:, i], alternative="greater").pvalue)),
                             "batch20_rate_p05": (None if name == "random draws" else
                                                  batch_rate(list(v[:, i]), list(base[:, i])))}
                     for i, plane in enumerate(("hv_latency", "hv_macs"))}
    return {"table": table_path, "designs": len(keys), "seeds": seeds, "repeats": repeats, "trials": trials,
            "steps": steps, "zc_seed": zc_seed, "rules": out}


def latency_cost(space_name: str, designs: int, seed: int = 0) -> dict:
    """CPU seconds a live ``--sampler strata`` look pays per candidate for its latency: ``designs`` points of the
    space drawn at random (seeded), each measured twice from scratch with the search's default
    :class:`~archspec.search.LatencyProtocol` (no cache: what the look does for a design it has not seen), timed
    with ``time.process_time`` (this process's CPU, so other work on the machine counts less than in wall time).
    Returns both rounds' per-design seconds and their means; the equal-CPU reading of a strata replay charges the
    mean times the candidates it looked at (``simulate --latency-seconds``)."""
    import random
    import time

    from archspec.search import LatencyProtocol, load_space, measure_latency

    points = [spec for _, spec in load_space(space_name).points()]
    chosen = random.Random(seed).sample(points, min(designs, len(points)))
    rounds = []
    for _ in range(2):
        seconds = []
        for spec in chosen:
            start = time.process_time()
            measure_latency(spec, LatencyProtocol())
            seconds.append(time.process_time() - start)
        rounds.append(seconds)
    return {"space": space_name, "designs": len(chosen), "points": len(points), "seed": seed,
            "protocol": LatencyProtocol().describe(), "seconds": rounds,
            "mean_seconds": [float(np.mean(r)) for r in rounds]}


def paused_row(row: dict, factor: float = 5.0) -> bool:
    """Whether one of the row's spans (between two tabulated steps, from step 0) took over ``factor`` times the row's
    median seconds per step: its worker was stopped or crowded there."""
    points = [(0.0, 0.0)] + [(float(s), float(t)) for s, _, t in row["tse"]]
    rates = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(points, points[1:])]
    return max(rates) > factor * statistics.median(rates)


def design_costs(table_path, steps: tuple[int, ...] = (120, 200, 938)) -> dict:
    """What the oracle's cost rule (``OracleTable.training_seconds``: per span the least of a design's rows) charges
    against the mean of the design's reference seeds' own clocks (the rule before 2026-11-28), at each of ``steps``:
    the ratio's median, 5th percentile and minimum over the designs, and both sums in seconds."""
    from archspec.search import load_table
    from archspec.search._tabulation.oracle import linear_at

    table = load_table(table_path) if isinstance(table_path, str | Path) else table_path
    keys = sorted(table.tabulated)
    rows = [row for by_seed in table.rows.values() for row in by_seed.values()]
    out = {"designs": len(keys), "seeds": table.seeds, "rows": len(rows),
           "paused_rows": sum(paused_row(row) for row in rows), "steps": {}}
    for k in steps:
        new = np.array([table.training_seconds(key, k) for key in keys])
        old = np.array([np.mean([linear_at([(0.0, 0.0)] + [(float(s), float(t)) for s, _, t in
                                                           table.rows[key][seed]["tse"]], k) for seed in table.seeds])
                        for key in keys])
        ratio = new / old
        out["steps"][k] = {"median_ratio": float(np.median(ratio)), "p5_ratio": float(np.percentile(ratio, 5)),
                           "min_ratio": float(ratio.min()), "sum_old_s": float(old.sum()),
                           "sum_new_s": float(new.sum())}
    return out


def cost_binned(proxy: np.ndarray, reference: np.ndarray, cost: np.ndarray, bins: int) -> dict:
    """How a proxy ranks designs of similar cost.  ``proxy``, ``reference``, ``cost``: ``(D,)`` per design.  The
    designs fall into ``bins`` quantile bins of ``cost`` (``np.quantile`` edges; equal costs share a bin):
    ``{"tau": Kendall tau of proxy against reference within each bin of more than 3 designs, averaged weighted by
    the bin's size, "regret": mean over non-empty bins of (reference of the proxy's best) - (the bin's best
    reference), <= 0, in the reference's units}``.  Raises nothing."""
    edges = np.quantile(cost, np.linspace(0, 1, bins + 1))
    index = np.clip(np.searchsorted(edges, cost, side="right") - 1, 0, bins - 1)
    taus, sizes, regrets = [], [], []
    for b in np.unique(index):
        inside = index == b
        regrets.append(float(reference[inside][np.argmax(proxy[inside])] - reference[inside].max()))
        if inside.sum() > 3:
            taus.append(float(kendalltau(proxy[inside], reference[inside])[0]))
            sizes.append(int(inside.sum()))
    return {"tau": float(np.average(taus, weights=sizes)) if taus else None, "regret": float(np.mean(regrets))}


def cost_bins(table_path: str, step: int, bins: int) -> dict:
    """TSE and val top-1 at ``step`` (each seed's curve, linear in log step) against the mean final top-1 of the
    table's other reference seeds, over all designs and within ``bins`` cost bins of MACs and of latency (the
    table's latency pass, mean of its passes): :func:`cost_binned` per seed, averaged over seeds; also each
    proxy's and the reference's Kendall tau with MACs.  Why val top-1's fronts can beat TSE's though TSE ranks the
    table better (docs/search-works.md, "The proxy score").  Raises nothing of its own."""
    from archspec.search import load_table
    from archspec.search._tabulation.oracle import curve_at

    table = load_table(table_path)
    keys, seeds = sorted(table.tabulated), table.seeds
    costs = {"macs": np.array([table.rows[k][seeds[0]]["macs"] for k in keys], float)}
    if table.latency_ms:
        costs["latency"] = np.array([table.latency_ms[k] for k in keys], float)

    def proxy(score: str, seed: int) -> np.ndarray:
        at = [curve_at(table.rows[k][seed], step) for k in keys]
        return np.array([acc if score == "accuracy" else -tse for acc, tse in at])

    def reference(seed: int) -> np.ndarray:
        return np.array([np.mean([table.rows[k][s]["final_accuracy"] for s in seeds if s != seed]) for k in keys])

    full = np.array([np.mean([table.rows[k][s]["final_accuracy"] for s in seeds]) for k in keys])
    out = {"table": table_path, "designs": len(keys), "seeds": seeds, "step": step, "bins": bins,
           "tau_with_macs": {"reference": float(kendalltau(full, costs["macs"])[0])}, "scores": {}}
    for score in ("tse", "accuracy"):
        out["tau_with_macs"][score] = float(np.mean([kendalltau(proxy(score, s), costs["macs"])[0] for s in seeds]))
        per = {"all": [cost_binned(proxy(score, s), reference(s), costs["macs"], 1) for s in seeds]}
        per.update({cost: [cost_binned(proxy(score, s), reference(s), values, bins) for s in seeds]
                    for cost, values in costs.items()})
        out["scores"][score] = {where: {f: float(np.mean([r[f] for r in rs])) for f in ("tau", "regret")}
                                for where, rs in per.items()}
    return out


def front_planes(table_path: str, step: int, trials: int = 20, draws: int = 2000, seed: int = 0) -> dict:
    """Random draws of ``trials`` designs, each answered by a seed drawn per design (TSE or val top-1 at ``step``),
    the reported front chosen by (proxy, latency) -- what ``archspec search`` reports -- or by (proxy, MACs), each
    scored leak-free (:meth:`Truth.held_out`) in both planes: ``{score: {front: {"hv_latency", "hv_macs", "size",
    "median_macs"}}}``, medians over ``draws``.  Shows how much of a proxy's MACs-plane hypervolume depends on the
    front being chosen in the latency plane.  No Optuna; needs the table's latency pass.  Raises nothing of its
    own."""
    from archspec.search import load_table
    from archspec.search._tabulation.oracle import curve_at

    table = load_table(table_path)
    truth, rng = Truth(table), np.random.default_rng(seed)
    keys = sorted(truth.accuracy)
    got: dict = {score: {plane: {f: [] for f in ("hv_latency", "hv_macs", "size", "median_macs")}
                         for plane in ("latency", "macs")} for score in ("tse", "accuracy")}
    for _ in range(draws):
        chosen = list(rng.choice(keys, size=trials, replace=False))
        answered = {k: int(rng.choice(table.seeds)) for k in chosen}
        at = {k: curve_at(table.rows[k][answered[k]], step) for k in chosen}
        for score, planes in got.items():
            proxy = {k: at[k][0] if score == "accuracy" else -at[k][1] for k in chosen}
            for plane, out in planes.items():
                values = truth.latency if plane == "latency" else truth.macs
                front = pareto([(proxy[k], values[k], k) for k in chosen])
                for cost in ("latency", "macs"):
                    points = [truth.normalised(k, cost, truth.held_out(k, answered[k])) for k in front]
                    out[f"hv_{cost}"].append(hypervolume_2d(points, (1.0, 1.0)))
                out["size"].append(len(front))
                out["median_macs"].append(float(np.median([truth.macs[k] for k in front])))
    return {score: {plane: {f: float(np.median(v)) for f, v in out.items()} for plane, out in planes.items()}
            for score, planes in got.items()}


def top1_at(row: dict, step: int | None) -> float:
    """A row's final top-1 (10,000 test images) or, with ``step``, its curve's top-1 at that step (the protocol's
    ``curve_val_images``).  Raises ValueError when the row's curve has no such step."""
    if step is None:
        return float(row["final_accuracy"])
    for at, acc, *_ in row["curve"]:
        if at == step:
            return float(acc)
    raise ValueError(f"no curve point at step {step} (curve steps: {[c[0] for c in row['curve']]})")


def seed_power(table_path: str, designs: int = 24, k: int = 3, bar: float = 0.7, draws: int = 2000,
               seed: int = 0, min_seeds: int = 2, between_scale: float = 1.0, step: int | None = None,
               distinct: bool = False) -> dict:
    """Will a seed check pass?  From a table's rows: the pooled within-design SD of final top-1 across seeds
    (``ddof=1``, over designs with at least ``min_seeds`` seeds; ``between_scale`` multiplies the between SD: "what
    if the designs differed that much more") and the between-design SD of the true means (variance
    components: the variance of the designs' seed means less the within variance over their seed count); then, under
    a normal model with those two SDs, the Kendall tau between two disjoint ``k``-seed means of ``designs`` designs,
    ``draws`` times (seeded): its median and how often it reaches ``bar``.  The seed check's own tau measures the
    same thing on the real rows; this predicts it from fewer of them (and checks itself on a finished table).
    Models "normal" / "empirical" treat every seed's deviation as the design's own; "shared seeds, ..." take the
    seed effects that move every design alike out (:func:`_additive_components`), as the seed check's halves do.
    ``step`` reads the curve's top-1 at that step instead of final top-1 (:func:`top1_at`: where in training the
    noise is made); raises ValueError when a row has no such curve point.  The empirical models draw the
    ``designs`` true means from the designs read, with replacement: where fewer designs were read than are drawn,
    some pairs share a true mean and rank at random, which pulls the median down (0.03-0.07 on the 12-point pilots);
    ``distinct`` draws them without replacement (every pair distinct, as a real seed check's designs are) and
    raises ValueError when ``designs`` exceeds the designs read."""
    from archspec.search import load_table

    table = load_table(table_path) if isinstance(table_path, str | Path) else table_path  # or a loaded table
    finals = {key: [top1_at(row, step) for row in by.values()] for key, by in table.rows.items()}
    finals = {key: v for key, v in finals.items() if len(v) >= max(2, min_seeds)}
    within = float(np.mean([np.var(v, ddof=1) for v in finals.values()]))
    counts = np.array([len(v) for v in finals.values()], float)
    means = np.array([np.mean(v) for v in finals.values()])
    between = float(max(0.0, np.var(means, ddof=1) - within * float(np.mean(1.0 / counts)))) * between_scale ** 2
    # the designs' true means: their seed means shrunk towards the grand mean so that their spread is the
    # between-design SD (keeps the shape -- a few far worse designs, as levit_small has -- that a normal draw loses)
    shrink = math.sqrt(between / float(np.var(means, ddof=1))) if np.var(means) > 0 else 0.0
    shrunk = means.mean() + shrink * (means - means.mean())
    additive = _additive_components(table, min_seeds, step)
    models = {"normal": (between, within, None), "empirical": (between, within, shrunk)}
    if additive is not None:
        a_between = additive["between_var"] * between_scale ** 2
        a_shrink = math.sqrt(a_between / additive["means_var"]) if additive["means_var"] > 0 else 0.0
        a_means = additive["means"]
        models["shared seeds, normal"] = (a_between, additive["interaction_var"], None)
        models["shared seeds, empirical"] = (a_between, additive["interaction_var"],
                                             a_means.mean() + a_shrink * (a_means - a_means.mean()))
    smallest = min(len(pool) for _, _, pool in models.values() if pool is not None)  # shared seeds: maybe fewer
    if distinct and designs > smallest:
        raise ValueError(f"--distinct draws {designs} designs without replacement from the {smallest} read: "
                         f"use --designs {smallest} or fewer")
    rng = np.random.default_rng(seed)
    taus = {m: [] for m in models}
    for _ in range(draws):
        for model, (b_var, noise_var, pool) in models.items():
            mu = (rng.normal(0.0, math.sqrt(b_var), designs) if pool is None
                  else rng.choice(pool, size=designs, replace=not distinct))
            a, b = (mu + rng.normal(0.0, math.sqrt(noise_var / k), designs) for _ in range(2))
            taus[model].append(float(kendalltau(a, b)[0]))
    out = {"table": str(getattr(table, "file", table_path)), "designs_read": len(finals),
           "mean_top1": float(np.mean([a for v in finals.values() for a in v])),
           "rows_read": int(counts.sum()),
           "within_sd": math.sqrt(within), "between_sd": math.sqrt(between), "designs": designs, "k": k,
           "bar": bar, "models": {m: {"predicted_tau_median": float(np.median(t)),
                                      "p_tau_at_least_bar": float(np.mean(np.array(t) >= bar))}
                                  for m, t in taus.items()}}
    if additive is not None:
        out["shared_seeds"] = {"seeds": additive["seeds"], "designs": len(additive["means"]),
                               "seed_effect_sd": additive["seed_effect_sd"],
                               "interaction_sd": math.sqrt(additive["interaction_var"]),
                               "between_sd": math.sqrt(additive["between_var"] * between_scale ** 2)}
    return out


def _additive_components(table, min_seeds: int, step: int | None = None) -> dict | None:
    """Variance components of final top-1 under an additive design + seed model, on the designs that hold one
    common seed set (the most frequent set among designs with at least ``min_seeds`` seeds; at least 3 designs and
    2 seeds).  A table seed fixes the batches, the augmentation draws and (for equal shapes) the initial weights of
    every design alike, so part of a seed's effect is shared: it moves every design of a seed-check half together and
    cancels in the half-means' ranking.  What does not cancel is the design x seed interaction: its mean square
    ``SS_res / ((n-1)(k-1))`` (two-way ANOVA without replication).  Returns the seeds, the designs' means over them,
    the SD of the seed main effects, the interaction variance and the between-design variance (the variance of the
    design means less the interaction variance over the seed count); ``None`` if no such block exists.  ``step``:
    the curve's top-1 at that step instead of final top-1 (:func:`top1_at`)."""
    from collections import Counter

    held = {key: frozenset(by) for key, by in table.rows.items() if len(by) >= max(2, min_seeds)}
    if not held:
        return None
    seeds = sorted(Counter(held.values()).most_common(1)[0][0])
    keys = [key for key, s in held.items() if set(seeds) <= s]
    if len(keys) < 3 or len(seeds) < 2:
        return None
    x = np.array([[top1_at(table.rows[key][s], step) for s in seeds] for key in keys])
    n, k = x.shape
    grand = x.mean()
    design_means, seed_means = x.mean(axis=1), x.mean(axis=0)
    residual = x - design_means[:, None] - seed_means[None, :] + grand
    interaction = float((residual ** 2).sum() / ((n - 1) * (k - 1)))
    means_var = float(np.var(design_means, ddof=1))
    return {"seeds": seeds, "means": design_means, "means_var": means_var,
            "seed_effect_sd": float(np.std(seed_means, ddof=1)), "interaction_var": interaction,
            "between_var": max(0.0, means_var - interaction / k)}


def mask_effects(table_path) -> dict:
    """How much does a mask-placement space's choice move final top-1?  Ordinary least squares on every row of a
    table: final top-1 (points) = a seed's own effect + sum over the space's integer parameters (masked heads per
    layer group) of a slope times the parameter.  Returns each parameter's slope (points per masked head), the
    residual SD (points, ``n - p`` degrees of freedom: the seed noise plus what the additive model misses), and what
    the fit implies for the space: the range of its fitted values over every combination of the values the table
    holds (``range``: the most any placement can gain on another, if the effects add) and their SD (``grid_sd``:
    the between-design SD the seed check would see on the whole space).  A seed check needs a between-design SD of
    about 1.3 points at an interaction of 0.79 (research/search-works-notebook.md); a space whose whole range is
    smaller cannot reach it however its points are chosen.

    Raises:
        ValueError: the table holds no more rows than effects to fit, or a parameter that is not a number (a design
            space's, such as levit_small's)."""
    import itertools

    from archspec.search import load_table

    table = load_table(table_path) if isinstance(table_path, str | Path) else table_path
    rows = [row for by in table.rows.values() for row in by.values()]
    names = sorted(rows[0]["params"]) if rows else []
    seeds = sorted({int(row["seed"]) for row in rows})
    if len(rows) <= len(seeds) + len(names):
        raise ValueError(f"{len(rows)} rows cannot fit {len(seeds) + len(names)} effects")
    try:
        x = np.array([[float(int(row["seed"]) == s) for s in seeds] + [float(row["params"][n]) for n in names]
                      for row in rows])
    except (TypeError, ValueError):
        raise ValueError(f"parameters {names} are not all numbers: not a mask-placement table") from None
    y = np.array([100.0 * float(row["final_accuracy"]) for row in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ coef
    slopes = dict(zip(names, (float(c) for c in coef[len(seeds):])))
    values = [sorted({float(row["params"][n]) for row in rows}) for n in names]
    grid = np.array([sum(slopes[n] * v for n, v in zip(names, combo)) for combo in itertools.product(*values)])
    return {"table": str(getattr(table, "file", table_path)), "rows": len(rows), "seeds": seeds,
            "slopes": slopes, "residual_sd": float(math.sqrt((residual ** 2).sum() / (len(rows) - x.shape[1]))),
            "range": float(grid.max() - grid.min()), "grid_sd": float(np.std(grid, ddof=1)) if grid.size > 1 else 0.0}


PRIOR_RULES = {
    "latency bins, random in each": ("latency", None),
    "latency bins, best SynFlow": ("latency", "synflow"),
    "latency bins, best NASWOT": ("latency", "naswot"),
    "MACs bins, best SynFlow": ("macs", "synflow"),
    "MACs bins, best NASWOT": ("macs", "naswot"),
}


def _print_test(test: dict, indent: str = "  ") -> None:
    for name, v in test.items():
        print(f"{indent}{name}: median {v['median']:.4f} vs {v['baseline_median']:.4f}, {v['wins']} wins / "
              f"{v['losses']} losses of {v['n']}, Wilcoxon one-sided p {v['wilcoxon_p']:.3g}; 20-repeat batches "
              f"with p < 0.05: {100 * v['batch20_rate_p05']:.1f} %")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    fid = sub.add_parser("fidelity", help="Kendall tau of every fidelity against the reference")
    fid.add_argument("--table", default=str(DEFAULT_TABLE))
    fid.add_argument("--json", default=None, help="also write the result here")
    fid.add_argument("--seeds", type=int, nargs="+", default=None,
                     help="rank the designs that hold these seeds (default: the most seeds that 4 designs share)")
    sim = sub.add_parser("simulate", help="search methods against random sampling on the oracle")
    sim.add_argument("--table", default=str(DEFAULT_TABLE))
    sim.add_argument("--repeats", type=int, default=20)
    sim.add_argument("--trials", type=int, default=20, help="trained candidates per search (default 20)")
    sim.add_argument("--steps", type=int, default=None, help="proxy steps (default: the search's default)")
    sim.add_argument("--macs-budget", type=float, default=20e6, help="for best accuracy under a MAC budget")
    sim.add_argument("--methods", nargs="+", default=None, choices=list(METHODS), metavar="NAME",
                     help=f"only these methods (default: all; random sampling is the baseline): {', '.join(METHODS)}")
    sim.add_argument("--objective", choices=("pareto", "accuracy"), default="pareto",
                     help="pareto (default; needs the table's latency pass) or accuracy")
    sim.add_argument("--baseline", default="random sampling", choices=list(METHODS), metavar="NAME",
                     help="the method every other is tested against (default: random sampling)")
    sim.add_argument("--latency-seconds", type=float, default=0.0,
                     help="CPU seconds a live run spends measuring one candidate's latency (`latency-cost`), charged "
                          "per candidate a strata look measured (default 0: the look's zero-cost seconds only)")
    sim.add_argument("--json", default="search_works_simulate.json")
    sim.add_argument("--plot", default=None, help="PNG of the anytime hypervolume (accuracy, latency)")
    head = sub.add_parser("headroom", help="what any sampler could gain over random sampling, from the table alone")
    head.add_argument("--table", default=str(DEFAULT_TABLE))
    head.add_argument("--trials", type=int, nargs="+", default=[10, 20, 40],
                      help="designs evaluated (default 10 20 40)")
    head.add_argument("--steps", type=int, default=None, help="proxy steps (default: the search's default)")
    head.add_argument("--score", choices=PROXY_SCORES, default="accuracy", help="the proxy's score")
    head.add_argument("--draws", type=int, default=2000)
    head.add_argument("--macs-budget", type=float, default=20e6, help="for best accuracy under a MAC budget")
    head.add_argument("--json", default=None, help="also write the result here")
    null = sub.add_parser("null", help="the replay protocol's false-positive rate: a method against itself")
    null.add_argument("--table", default=str(DEFAULT_TABLE))
    null.add_argument("--method", default="random sampling", choices=list(METHODS), metavar="NAME")
    null.add_argument("--repeats", type=int, default=200)
    null.add_argument("--trials", type=int, default=20)
    null.add_argument("--steps", type=int, default=None, help="proxy steps (default: the search's default)")
    null.add_argument("--macs-budget", type=float, default=20e6)
    null.add_argument("--objective", choices=("pareto", "accuracy"), default="pareto",
                      help="pareto (default; needs the table's latency pass) or accuracy")
    null.add_argument("--json", default="search_works_null.json")
    pri = sub.add_parser("priors", help="free looks (cost bins, zero-cost scores) choosing the trained designs")
    pri.add_argument("--table", default=str(DEFAULT_TABLE))
    pri.add_argument("--repeats", type=int, default=400)
    pri.add_argument("--trials", type=int, default=20)
    pri.add_argument("--steps", type=int, default=None, help="proxy steps (default: the search's default)")
    pri.add_argument("--zc-seed", choices=("answer", "one"), default="answer",
                     help="read each design's zero-cost score at the seed that answers its proxy (default, "
                          "leak-free) or every design's at one seed per replay (leaks: to show the difference)")
    pri.add_argument("--json", default=None, help="also write the result here")
    pw = sub.add_parser("seed-power", help="predict a seed check's Kendall tau from the rows (variance components)")
    pw.add_argument("--table", default=str(DEFAULT_TABLE))
    pw.add_argument("--designs", type=int, default=24)
    pw.add_argument("--k", type=int, default=3, help="seeds per mean (default 3)")
    pw.add_argument("--min-seeds", type=int, default=2, help="read only designs with this many seeds (default 2)")
    pw.add_argument("--between-scale", type=float, default=1.0, help="multiply the between-design SD (what if)")
    pw.add_argument("--step", type=int, default=None,
                    help="read the curve's top-1 at this step (curve val images) instead of final top-1")
    pw.add_argument("--distinct", action="store_true",
                    help="empirical models: draw the designs without replacement (--designs at most those read)")
    eff = sub.add_parser("mask-effects", help="how far a mask space's choices move top-1 (additive fit, points)")
    eff.add_argument("--table", required=True)
    cho = sub.add_parser("choose", help="the pre-registered rule (docs/search-works.md) on simulate + null JSON")
    cho.add_argument("--simulate", required=True, help="JSON of `simulate` (every candidate against the baseline)")
    cho.add_argument("--null", required=True, help="JSON of `null` (the baseline against itself)")
    cho.add_argument("--json", default=None, help="also write the decision here")
    cst = sub.add_parser("costs", help="the oracle's per-design cost rule against the seeds' own clocks")
    cst.add_argument("--table", default=str(DEFAULT_TABLE))
    cst.add_argument("--steps", type=int, nargs="+", default=[120, 200, 938])
    lat = sub.add_parser("latency-cost", help="CPU seconds per candidate a live strata look spends on latency")
    lat.add_argument("--space", default="levit_small")
    lat.add_argument("--designs", type=int, default=20)
    lat.add_argument("--json", default=None, help="also write the result here")
    cb = sub.add_parser("cost-bins", help="TSE and val top-1 ranking designs of similar cost (quantile bins)")
    cb.add_argument("--table", default=str(DEFAULT_TABLE))
    cb.add_argument("--step", type=int, default=120, help="proxy steps (default 120, the search's)")
    cb.add_argument("--bins", type=int, default=4, help="quantile bins of each cost (default 4)")
    cb.add_argument("--draws", type=int, default=2000, help="random draws of 20 designs for the fronts (default 2000)")
    cb.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    if args.cmd == "cost-bins":
        r = cost_bins(args.table, args.step, args.bins)
        print(f"{r['designs']} designs, seeds {r['seeds']}; proxies at step {r['step']}, each seed against the mean "
              f"final top-1 of the other seeds; Kendall tau with MACs: " +
              ", ".join(f"{name} {v:.3f}" for name, v in r["tau_with_macs"].items()))
        for score, where in r["scores"].items():
            parts = [f"{'all designs' if w == 'all' else f'{args.bins} {w} bins'}: tau {v['tau']:.3f}, regret "
                     f"{100 * v['regret']:.2f} points" for w, v in where.items()]
            print(f"  {score}: " + "; ".join(parts))
        if "latency" in r["scores"]["tse"]:  # the table has a latency pass
            r["fronts"] = front_planes(args.table, args.step, draws=args.draws)
            print(f"  fronts of 20 random draws ({args.draws} draws), chosen in one plane, scored in both (medians):")
            for score, planes in r["fronts"].items():
                for plane, v in planes.items():
                    print(f"    {score}, front by {plane}: HV latency {v['hv_latency']:.4f}, HV MACs "
                          f"{v['hv_macs']:.4f}, {v['size']:.0f} designs, median {v['median_macs'] / 1e6:.1f} M MACs")
        if args.json:
            Path(args.json).write_text(json.dumps(r, indent=1) + "\n")
        return 0
    if args.cmd == "mask-effects":
        try:
            got = mask_effects(table_file(args.table))
        except SpecError as exc:  # a table that is missing or unreadable (the message names the file)
            print(f"search_works.py mask-effects: {exc}", file=sys.stderr)
            return 2
        except ValueError as exc:  # too few rows, or no mask table
            print(f"search_works.py mask-effects: {args.table}: {exc}", file=sys.stderr)
            return 2
        print(f"{got['table']}: {got['rows']} rows, seeds {got['seeds']}; final top-1 (points) = seed effect + slopes:")
        for name, slope in got["slopes"].items():
            print(f"  {name}: {slope:+.3f} points per unit")
        print(f"residual SD {got['residual_sd']:.2f} points; fitted range over the space {got['range']:.2f} points, "
              f"fitted SD over the space {got['grid_sd']:.2f} points")
        return 0
    if args.cmd == "seed-power":
        try:
            r = seed_power(args.table, args.designs, args.k, min_seeds=args.min_seeds,
                           between_scale=args.between_scale, step=args.step, distinct=args.distinct)
        except ValueError as exc:  # --step that a row's curve does not hold, --distinct beyond the designs read
            print(f"search_works.py seed-power: {args.table}: {exc}", file=sys.stderr)
            return 2
        print(f"{r['table']}: {r['designs_read']} designs, {r['rows_read']} rows, mean top-1 {r['mean_top1']:.3f}"
              + (f" at step {args.step}" if args.step is not None else "") + "; within-design seed SD "
              f"{100 * r['within_sd']:.2f} points, between-design SD {100 * r['between_sd']:.2f} points; predicted "
              f"tau of two {args.k}-seed means over {args.designs} designs: " + "; ".join(
                  f"{m} means: median {v['predicted_tau_median']:.2f}, P(tau >= {r['bar']}) "
                  f"{v['p_tau_at_least_bar']:.3f}" for m, v in r["models"].items()))
        if "shared_seeds" in r:
            sh = r["shared_seeds"]
            print(f"  shared seed effects ({sh['designs']} designs holding seeds {sh['seeds']}): seed-effect SD "
                  f"{100 * sh['seed_effect_sd']:.2f}, design x seed interaction SD {100 * sh['interaction_sd']:.2f}, "
                  f"between-design SD {100 * sh['between_sd']:.2f} points")
        return 0
    if args.cmd == "costs":
        r = design_costs(args.table, tuple(args.steps))
        print(f"{r['paused_rows']} of {r['rows']} rows have a span over 5x their median seconds per step")
        for k, v in r["steps"].items():
            print(f"step {k}, {r['designs']} designs (seeds {r['seeds']}): charged / mean of the seeds' clocks median "
                  f"{v['median_ratio']:.3f}, 5th percentile {v['p5_ratio']:.3f}, min {v['min_ratio']:.3f}; sum "
                  f"{v['sum_old_s']:,.0f} -> {v['sum_new_s']:,.0f} s")
        return 0
    if args.cmd == "choose":
        decision = choose(json.loads(Path(args.simulate).read_text()), json.loads(Path(args.null).read_text()))
        broken = " -- PROTOCOL BROKEN, nothing chosen" if decision["protocol_broken"] else ""
        print("null: p < 0.05 in " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in decision["null_rates"].items())
              + " of 20-replay batches" + broken)
        for name, row in decision["candidates"].items():
            print(f"  {name}: " + "; ".join(
                f"{p} gain {row['hv_gain'][p]:+.4f}, p {row['p'][p]:.3g}, Holm {row['p_holm'][p]:.3g}" for p in PLANES)
                + f"; best under the MAC budget {row['best_under_budget']} vs {row['baseline_best_under_budget']}"
                + (" -- qualifies" if row["qualifies"] else ""))
        print(f"default: {decision['chosen']}" + ("" if decision["replaced"] else " (the baseline stays)"))
        if args.json:
            Path(args.json).write_text(json.dumps(decision, indent=1) + "\n")
        return 0
    if args.cmd == "latency-cost":
        result = latency_cost(args.space, args.designs)
        print(f"{result['designs']} of {result['points']} designs of {args.space}, {result['protocol']}: "
              + ", ".join(f"round {i + 1}: {m:.3f} s per design" for i, m in enumerate(result["mean_seconds"])))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        return 0
    if args.cmd == "priors":
        from archspec.search import ProxyProtocol

        result = priors(args.table, PRIOR_RULES, args.repeats, args.trials, args.steps or ProxyProtocol().steps,
                        zc_seed=args.zc_seed)
        print(f"zero-cost scores read at: {args.zc_seed}; {result['designs']} designs, seeds {result['seeds']}; "
              f"{args.repeats} paired replays x {args.trials} trained, TSE "
              f"proxy at {result['steps']} steps; median HV (one-sided paired Wilcoxon p vs random):")
        for name, planes in result["rules"].items():
            print(f"  {name}: " + "; ".join(
                f"{plane} {v['median']:.4f}" + ("" if v["p"] is None else
                                                 f" (p {v['p']:.2g}; 20-replay batches p < 0.05: "
                                                 f"{100 * v['batch20_rate_p05']:.1f} %)")
                for plane, v in planes.items()))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        return 0
    if args.cmd == "null":
        from archspec.search import ProxyProtocol

        result = null_check(args.table, args.method, args.repeats, args.trials, args.steps or ProxyProtocol().steps,
                            args.macs_budget, objective=args.objective)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"{args.method} against itself, {args.repeats} paired replays x {args.trials} trained:")
        _print_test(result["test"])
        return 0
    if args.cmd == "headroom":
        from archspec.search import ProxyProtocol

        result = headroom(args.table, tuple(args.trials), args.steps or ProxyProtocol().steps, args.score, args.draws,
                          args.macs_budget)
        print(f"{result['designs']} designs, seeds {result['seeds']}; proxy: {args.score} at {result['steps']} steps")
        planes = {f"HV (accuracy, {cost})": plane for cost, plane in result["planes"].items()}
        if "best_under_budget" in result:
            planes[f"best under {args.macs_budget:g} MACs"] = result["best_under_budget"]
        for name, plane in planes.items():
            print(f"  {name}: the table's best {plane['best']:.4f}; every design evaluated, chosen by the proxy "
                  f"{plane['all_designs_proxy']:.4f}")
            for k, entry in plane["by_trials"].items():
                print(f"    {k} designs: " + "; ".join(
                    f"{name} {v['median']:.4f} ({v['iqr'][0]:.4f}-{v['iqr'][1]:.4f})" for name, v in entry.items()))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        return 0
    if args.cmd == "simulate":
        from archspec.search import ProxyProtocol

        steps = args.steps or ProxyProtocol().steps
        chosen = {name: METHODS[name] for name in (args.methods or METHODS)}
        baseline = args.baseline
        chosen.setdefault(baseline, METHODS[baseline])  # the baseline of every comparison
        result = simulate(args.table, args.repeats, args.trials, steps, args.macs_budget, methods=chosen,
                          objective=args.objective, latency_seconds=args.latency_seconds)
        result["baseline"] = baseline
        result["comparison"] = compare(result, baseline)
        base = result["methods"][baseline]
        result["paired_tests"] = {name: paired_test(runs, base, result["comparison"]["budget_seconds"])
                                  for name, runs in result["methods"].items() if name != baseline}
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        if args.plot:
            plot(result, args.plot)
        print(f"{result['designs']} designs, reference seeds {result['seeds']}; each method {args.repeats} x "
              f"{args.trials} trained; at the common budget {result['comparison']['budget_seconds']:.0f} simulated s:")
        if result["flat_costs"]:
            print(f"  every design has the same {' and '.join(result['flat_costs'])}: that plane's hypervolume is the "
                  "best front design's accuracy alone, not a trade-off")
        hand = result["hand"]
        print(f"  hand designs ({', '.join(hand['designs'])}): hv_latency {hand['hv_latency']:.4f}, hv_macs "
              f"{hand['hv_macs']:.4f}, best under {args.macs_budget:g} MACs {hand['best_under_budget']}")
        for name, entry in result["comparison"]["methods"].items():
            print(f"  {name}: final, repeats at least the hand designs' value: "
                  + ", ".join(f"{f} {entry[f + '_final'].get('at_least_hand', '-')}/{args.repeats}"
                              for f in ("hv_latency", "hv_macs", "best_under_budget"))
                  + f"; best under the budget not below the hand designs' (Welch, one-sided, p < 0.05): "
                    f"{entry['best_under_budget_final'].get('not_below_hand', '-')}/{args.repeats}")
            for field in ("hv_latency", "hv_macs", "best_under_budget"):
                v = entry[f"{field}_at_budget"]
                if v["median"] is None:
                    continue
                print(f"    {field}: median {v['median']:.4f} IQR {v['iqr'][0]:.4f}..{v['iqr'][1]:.4f}"
                      + (f", Wilcoxon p {v['wilcoxon_p_vs_baseline']:.3g} ({v['wins']} wins)"
                         if "wilcoxon_p_vs_baseline" in v else ""))
            if name in result["paired_tests"]:
                print(f"    against {baseline}, paired:")
                _print_test(result["paired_tests"][name], indent="      ")
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        return 0
    path = table_file(args.table)
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    result = fidelity_table(rows, args.seeds, als_geometry(path) if any("als" in r for r in rows) else None)
    print(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
