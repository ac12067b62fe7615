"""Where the room above random draws is: fronts of trained designs chosen by better proxies, by more seeds, by a
sampler that knows the answer, and from more candidates -- every front scored on the table seeds it did not read.

    python bench/search_room.py                        # levit_small, 2,000 draws of 20, 40 and 80 designs
    python bench/search_room.py --table T.jsonl --trials 20 --draws 500 --json room.json

No Optuna and no training: the numbers come from the table (docs/search-works.md, "What it means for you").  Each
draw picks ``k`` designs at random and puts each design's table seeds in a random order; every rule sees the same
draw (paired).  A rule reads the first seed's row (or the first two) of a design, and every rule's front designs
are scored by the final top-1 of the seeds no rule read (of three seeds, the third), so that a seed's luck is not
counted as skill and every rule is scored alike.  A rule's front is what ``archspec search`` reports: the designs
that no other beats on (proxy value, latency); its hypervolume is read in the (accuracy, latency) and (accuracy,
MACs) planes (``bench/search_works.py``'s ``hypervolume_2d``: the table normalised to [0, 1] on each axis,
reference point (1, 1)).  The rules (:data:`RULES`):

* random designs ranked by TSE or by val top-1 of a 120-step proxy (the search's proxies; one seed per design);
* random designs ranked by one seed's final top-1: a proxy as long as the protocol (938 steps, 7.8x the CPU);
* random designs ranked by the mean final top-1 of two seeds (twice that again);
* a sampler that knows every design's final top-1 at one seed (or the mean of two) before it trains anything: it
  trains the designs on the front that value gives over the whole table, then random ones up to ``k``, and
  reports their front by the same value -- the most a sampler could add with a proxy that good.

The CPU column is the chosen designs' training seconds to the step their proxy reads, times the seeds it reads
(``OracleTable.training_seconds``: per span the least any of the design's rows spent), median over the draws.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np

from archspec.errors import SpecError

# bench/ is no package: its search_works.py (``Truth``, ``pareto``, ``hypervolume_2d``) is found beside this file,
# whether it runs as a script or a test loads it from its path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import search_works as WORKS  # noqa: E402

PROXY_STEPS = 120  # the search's default proxy (archspec.search.ProxyProtocol.steps)

# rule -> (what ranks a design: "tse" / "accuracy" at PROXY_STEPS, or "final" at the protocol's end; how many
# seeds per design it reads; whether the sampler knows that value for every design before choosing what to train)
RULES = {
    "random designs, TSE at 120 steps": ("tse", 1, False),
    "random designs, val top-1 at 120 steps": ("accuracy", 1, False),
    "random designs, one seed's final top-1": ("final", 1, False),
    "random designs, mean final top-1 of two seeds": ("final", 2, False),
    "knows every design's final top-1 at one seed": ("final", 1, True),
    "knows every design's mean final top-1 of two seeds": ("final", 2, True),
}


def proxy_of(table, key: str, seeds: tuple[int, ...], kind: str, steps: int) -> float:
    """What ranks ``key`` when its proxy reads the rows of ``seeds``: the mean over them of minus the mean
    training loss to ``steps`` (``tse``), the val top-1 at ``steps`` (``accuracy``), or the final top-1
    (``final``, the whole protocol)."""
    from archspec.search._tabulation.oracle import curve_at

    values = []
    for seed in seeds:
        row = table.rows[key][seed]
        if kind == "final":
            values.append(float(row["final_accuracy"]))
        else:
            accuracy, loss_sum = curve_at(row, steps)
            values.append(accuracy if kind == "accuracy" else -loss_sum / steps)
    return float(np.mean(values))


def held_out_score(truth, key: str, scored: tuple[int, ...]) -> float:
    """``key``'s mean final top-1 on the reference seeds ``scored``."""
    return float(np.mean([truth.finals[key][truth.table.seeds.index(s)] for s in scored]))


def front(points: list[tuple[float, float, str]]) -> list[str]:
    """The items of ``(value, cost, item)`` that no other beats on both (higher value, lower cost): the set
    ``bench/search_works.py``'s ``pareto`` keeps, in O(n log n) (the sampler that knows the answer asks it of the
    whole table every draw).  A point is kept if its value is the largest of its cost and above every value at a
    strictly lower cost."""
    kept, best_below, i = [], -np.inf, 0
    points = sorted(points, key=lambda p: p[1])
    while i < len(points):
        same = [p for p in points[i:] if p[1] == points[i][1]]
        top = max(p[0] for p in same)
        if top > best_below:
            kept += [p[2] for p in same if p[0] == top]
        best_below, i = max(best_below, top), i + len(same)
    return kept


def front_hv(truth, chosen: list[str], proxy: dict[str, float], scored: dict[str, tuple[int, ...]]) -> dict:
    """The front of ``chosen`` by (proxy, latency), each design scored on its seeds ``scored``: its hypervolume in
    both planes and its size."""
    reported = front([(proxy[k], truth.latency[k], k) for k in chosen])
    out = {"size": len(reported)}
    for cost in ("latency", "macs"):
        points = [truth.normalised(k, cost, held_out_score(truth, k, scored[k])) for k in reported]
        out[f"hv_{cost}"] = WORKS.hypervolume_2d(points, (1.0, 1.0))
    return out


def one_draw(truth, keys: list[str], k: int, rng, seconds, steps: int = PROXY_STEPS) -> dict:
    """Every rule of :data:`RULES` on one draw of ``k`` random designs: ``{rule: {"size", "hv_latency", "hv_macs",
    "cpu_s"}}``.  Each design's seeds are put in a random order once per draw: a rule reads the first one or two,
    and every rule is scored on the rest (the seeds no rule read: one of three), so the rules are paired and
    scored alike.  ``seconds(key, step)``: a design's training seconds to ``step``."""
    table, seeds = truth.table, truth.table.seeds
    order = {key: tuple(int(s) for s in rng.permutation(seeds)) for key in keys}
    scored = {key: order[key][2:] for key in keys}
    drawn = [str(key) for key in rng.choice(keys, size=k, replace=False)]
    out = {}
    for rule, (kind, n_seeds, knows) in RULES.items():
        read = {key: order[key][:n_seeds] for key in keys}
        proxy = {key: proxy_of(table, key, read[key], kind, steps) for key in (keys if knows else drawn)}
        chosen = drawn
        if knows:  # the front by this value over the whole table first, then the random draws up to k
            best = front([(proxy[key], truth.latency[key], key) for key in keys])
            best = [str(key) for key in rng.permutation(best)][:k]
            chosen = best + [key for key in drawn if key not in best][:k - len(best)]
        step = steps if kind != "final" else max(table.curve_steps)
        cpu = sum(seconds(key, step) * n_seeds for key in chosen)
        out[rule] = {**front_hv(truth, chosen, proxy, scored), "cpu_s": cpu}
    return out


def room(table_path: str, trials: tuple[int, ...], draws: int, seed: int = 0) -> dict:
    """:func:`one_draw` ``draws`` times for each ``k`` in ``trials``: per ``k`` and rule, the median and
    interquartile range of each measure.

    Raises:
        SpecError: a bad table (``load_table``: its file, line and field).
        ValueError: the table has no latency pass.
    """
    from archspec.search import load_table

    table = load_table(table_path)
    truth = WORKS.Truth(table)
    keys = sorted(truth.accuracy)
    if not truth.latency:
        raise ValueError(f"{table_path}: the table has no latency pass (<table>.latency.json): the search's fronts "
                         "are chosen by latency")
    rng = np.random.default_rng(seed)
    seconds = functools.cache(table.training_seconds)
    out = {"table": str(table_path), "designs": len(keys), "seeds": table.seeds, "draws": draws, "by_trials": {}}
    for k in trials:
        got: dict[str, dict[str, list[float]]] = {}
        for _ in range(draws):
            for rule, values in one_draw(truth, keys, min(k, len(keys)), rng, seconds).items():
                for name, value in values.items():
                    got.setdefault(rule, {}).setdefault(name, []).append(value)
        out["by_trials"][k] = {rule: {name: {"median": float(np.median(v)), "iqr": [float(np.percentile(v, 25)),
                                                                                     float(np.percentile(v, 75))]}
                                      for name, v in values.items()} for rule, values in got.items()}
    return out


def text(result: dict) -> str:
    """The result as the lines ``main`` prints."""
    lines = [f"{result['designs']} designs, seeds {result['seeds']}, {result['draws']} draws; fronts by (proxy, "
             "latency), scored on the seed no rule read; medians"]
    for k, rules in result["by_trials"].items():
        lines.append(f"{k} trained designs:")
        for rule, v in rules.items():
            lines.append(f"  {rule}: HV latency {v['hv_latency']['median']:.3f}, HV MACs {v['hv_macs']['median']:.3f}"
                         f", {v['size']['median']:.0f} front designs, CPU {v['cpu_s']['median']:,.0f} s")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", default=str(WORKS.DEFAULT_TABLE))
    parser.add_argument("--trials", type=int, nargs="+", default=[20, 40, 80], help="designs trained per search")
    parser.add_argument("--draws", type=int, default=2000, help="random draws per number of designs (default 2000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    try:
        result = room(args.table, tuple(args.trials), args.draws, args.seed)
    except (SpecError, ValueError) as exc:
        print(f"search_room: error: {exc}", file=sys.stderr)
        return 2
    print(text(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
