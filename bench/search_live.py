"""The search against random sampling live: real ``archspec search`` runs, no oracle, scored on the table.

    python bench/search_live.py --repeats 3 --budget 540            # 3 x (archspec default, random), 9 min each
    python bench/search_live.py --repeats 3 --budget 900 --method "TPE, TSE proxy" --method "random sampling"
    python bench/search_live.py --rescore                           # again, once `missing` designs are tabulated
    python bench/search_live.py --proxies --json runs/search_live.json  # the live proxies' own ranking, resampled

Issue 32's live check: each method is the real command, ``archspec search --space levit_small --data
fashion-mnist --timeout BUDGET --seed R`` with the method's options, on the whole machine (nothing else may run:
the budget is wall time), repeats in ABBA order so that a drift of the machine falls on every method.  Each run's
front -- the designs no other of its trained designs beats on proxy score and latency, as the run itself reports
them -- is looked up in ``levit_small``'s table (a design a partial table does not hold yet is left out, and
``front_in_table`` says how many were scored) and scored on the table's reference: hypervolume in (accuracy,
latency) and (accuracy, MACs) against the same fixed reference point as ``bench/search_works.py simulate``, and
the reference accuracy of the best design under a MAC budget.  Writes ``--json`` with every run's numbers and
prints how many repeats each method's front is the larger.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

# Each method is `archspec search` with these extra options (the CLI's own); the budget and seed are added per run.
# Every method but "archspec default" names each option it depends on (as bench/search_works.py's METHODS).
METHODS = {
    "archspec default": [],
    "random sampling": ["--sampler", "random", "--fidelity", "none", "--proxy-score", "accuracy"],
    "TPE, TSE proxy": ["--sampler", "tpe", "--sampler-startup", "6", "--fidelity", "none", "--proxy-score", "tse"],
    "random sampling, TSE proxy": ["--sampler", "random", "--fidelity", "none", "--proxy-score", "tse"],
    # the candidates of the pre-registered choice (docs/search-works.md, "Today's results"; issue 54 item 6 runs the
    # chosen one live); a live run's --trials is unbounded (the budget ends it), so the strata are named: the
    # replays' 20
    "strata, NASWOT, TSE proxy": ["--sampler", "strata", "--strata", "20", "--zc-score", "naswot", "--fidelity",
                                  "none", "--proxy-score", "tse"],
    "strata, SynFlow, TSE proxy": ["--sampler", "strata", "--strata", "20", "--zc-score", "synflow", "--fidelity",
                                   "none", "--proxy-score", "tse"],
    "TPE, 4 start-up, TSE proxy": ["--sampler", "tpe", "--sampler-startup", "4", "--fidelity", "none",
                                   "--proxy-score", "tse"],
    "front mutation, 10 start-up, TSE proxy": ["--sampler", "front", "--sampler-startup", "10", "--fidelity", "none",
                                               "--proxy-score", "tse"],
}


def _works():
    """``bench/search_works.py`` as a module (the table's truth, the Pareto filter and the hypervolume)."""
    spec = importlib.util.spec_from_file_location("search_works", ROOT / "bench" / "search_works.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command(method: str, out: Path, seed: int, budget: float, extra: list[str]) -> list[str]:
    """The ``archspec search`` command line of one run."""
    # --proxy-threads: every run on every core, whatever the command would read off the machine.  Before 636c991
    # a run that started while the load average still showed the previous job could train on one thread
    # (archspec.cli.search.idle_cores counted a momentary process as a busy core): on 2026-11-27 the first run,
    # started a minute after a simulation ended, trained 25 candidates with 1 thread where its pair trained 36.
    # --verify 0: the whole budget on the search, as the runs before --verify existed (the comparison scores fronts)
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return [sys.executable, "-m", "archspec", "search", "--space", "levit_small", "--data", "fashion-mnist",
            "--timeout", f"{budget:g}", "--trials", "100000", "--seed", str(seed), "--out", str(out),
            "--no-progress", "--proxy-threads", str(threads), "--verify", "0", *METHODS[method], *extra]


def score_run(run_dir: Path, truth, macs_budget: float) -> dict:
    """A finished run's front scored on the table: the trained, feasible, non-reused trials of its study, filtered
    to (proxy score, latency) Pareto, each design looked up by its architecture key."""
    import optuna

    works = _works()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{run_dir / 'study.db'}")
    trained = [(t.values[0], t.user_attrs.get("latency_ms", 0.0), t.user_attrs["arch_key"]) for t in study.trials
               if t.state == optuna.trial.TrialState.COMPLETE and "reused_from" not in t.user_attrs]
    front = works.pareto(trained)
    known = [k for k in front if k in truth.accuracy]
    # front designs a table of part of the space lacks: tabulate them with `bench/space_table.py --keys ...`
    # (three seeds each), then score the run again
    missing = sorted(k for k in front if k not in truth.accuracy)
    out = {"trained": len(trained), "front": len(front), "front_in_table": len(known), "missing": missing}
    for cost in ("latency", "macs"):
        out[f"hv_{cost}"] = works.hypervolume_2d([truth.normalised(k, cost) for k in known], (1.0, 1.0))
    under = [(score, k) for score, _, k in trained if k in truth.accuracy and truth.macs[k] <= macs_budget]
    out["best_under_budget"] = truth.accuracy[max(under)[1]] if under else None
    seeds = truth.finals[max(under)[1]] if under else None
    hand = works.hand_summary(truth, macs_budget).get("best_under_budget_seeds")
    # resolvably below the best hand design under the budget (Welch, one-sided, p < 0.05), or None
    out["best_under_budget_below_hand"] = works.below(seeds, hand) if seeds and hand else None
    return out


def rescore(path: Path, truth) -> int:
    """Score every run a ``--json`` file lists again on ``truth`` (its designs tabulated since), rewrite it, and
    print the repeat-by-repeat wins of its first method over its second."""
    doc = json.loads(path.read_text())
    for rows in doc["results"].values():
        for row in rows:
            row.update(score_run(Path(row["run_dir"]), truth, doc["macs_budget"]))
    path.write_text(json.dumps(doc, indent=1) + "\n")
    report(doc["results"])
    return 0


def live_trainings(doc: dict, truth) -> list[dict]:
    """Every trained, non-reused trial of the runs ``doc`` lists (each distinct training once: a pair of runs with
    the same seed trains the same designs the same way) whose design the table holds: its architecture key, val
    top-1, minus its mean training loss (the TSE score), latency and steps."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seen, out = set(), []
    for rows in doc["results"].values():
        for row in rows:
            study = optuna.load_study(study_name=None, storage=f"sqlite:///{Path(row['run_dir']) / 'study.db'}")
            for t in study.trials:
                a = t.user_attrs
                if (t.state != optuna.trial.TrialState.COMPLETE or "reused_from" in a or "loss_sum" not in a
                        or a["arch_key"] not in truth.accuracy):
                    continue
                ident = (a["arch_key"], round(a["accuracy"], 6), round(a["loss_sum"], 6))
                if ident not in seen:
                    seen.add(ident)
                    out.append({"key": a["arch_key"], "accuracy": a["accuracy"], "tse": -a["loss_sum"] / a["steps"],
                                "steps": a["steps"]})
    return out


def proxy_report(path: Path, truth, trials: tuple[int, ...] = (20, 38), draws: int = 2000, seed: int = 0) -> dict:
    """What the live proxies rank like: Kendall tau against the table's reference of each live training's val top-1,
    its TSE score, #MACs and #params (pooled over every distinct training of the runs ``path`` lists), then a paired
    resampling -- ``k`` designs drawn from those trained live, one live training of each, the front chosen by TSE
    and by val top-1 from the same trainings, each scored like a run's front (hypervolume on the reference) -- and
    the same resampling with the table's own proxies at the live step count (seed 0's curve, as the oracle answers
    it) on the same designs: whether the live proxy behaves like the one the simulations measured."""
    from scipy.stats import kendalltau

    works = _works()
    doc = json.loads(path.read_text())
    runs = live_trainings(doc, truth)
    if not runs:
        raise SystemExit(f"{path}: no trained design of its runs is in the table yet")
    reference = [truth.accuracy[r["key"]] for r in runs]
    table_rows = truth.table.rows
    out = {"trainings": len(runs), "designs": len({r["key"] for r in runs}), "tau": {}}
    for name, values in (("val top-1", [r["accuracy"] for r in runs]), ("TSE", [r["tse"] for r in runs]),
                         ("#MACs", [truth.macs[r["key"]] for r in runs]),
                         ("#params", [table_rows[r["key"]][truth.table.seeds[0]]["n_params"] for r in runs])):
        tau, p = kendalltau(values, reference)
        out["tau"][name] = {"tau": float(tau), "p": float(p)}
    by_key: dict[str, list[dict]] = {}
    for r in runs:
        by_key.setdefault(r["key"], []).append(r)
    keys = sorted(by_key)
    steps = runs[0]["steps"]
    table_proxy = {score: {k: works.proxy_value(table_rows[k][truth.table.seeds[0]], score, steps) for k in keys}
                   for score in ("accuracy", "tse")}
    rng = np.random.default_rng(seed)
    out["resampled"] = {}
    for k in trials:
        k = min(k, len(keys))
        got: dict[str, list[float]] = {}
        for _ in range(draws):
            chosen = list(rng.choice(keys, size=k, replace=False))
            pick = {key: by_key[key][rng.integers(len(by_key[key]))] for key in chosen}
            live = {score: {key: pick[key][score] for key in chosen} for score in ("accuracy", "tse")}
            for cost in ("latency", "macs"):
                for source, proxies in (("live", live), ("table", table_proxy)):
                    for score in ("accuracy", "tse"):
                        got.setdefault(f"{source} {score} {cost}", []).append(
                            works.reported_hv(truth, chosen, proxies[score], cost))
        out["resampled"][k] = {name: float(np.median(v)) for name, v in got.items()}
        for cost in ("latency", "macs"):
            for source in ("live", "table"):
                tse, acc = got[f"{source} tse {cost}"], got[f"{source} accuracy {cost}"]
                out["resampled"][k][f"{source} tse beats accuracy {cost}"] = float(
                    np.mean([a > b for a, b in zip(tse, acc)]))
    return out


def print_proxy_report(out: dict) -> None:
    print(f"{out['trainings']} distinct live trainings of {out['designs']} tabulated designs")
    for name, v in out["tau"].items():
        print(f"  Kendall tau against the reference: {name:10s} {v['tau']:.3f} (p {v['p']:.1g})")
    for k, row in out["resampled"].items():
        print(f"  {k} designs drawn from those trained live (median HV; share of draws where TSE's front is larger):")
        for source in ("live", "table"):
            for cost in ("latency", "macs"):
                print(f"    {source:5s} proxies, {cost:7s}: TSE {row[f'{source} tse {cost}']:.3f}, val top-1 "
                      f"{row[f'{source} accuracy {cost}']:.3f}; TSE larger in "
                      f"{row[f'{source} tse beats accuracy {cost}']:.0%}")


def report(results: dict[str, list[dict]]) -> None:
    """Per cost plane, in how many repeats the first method's front beats the second's."""
    methods = list(results)
    if len(methods) < 2:
        return
    a, b = methods[0], methods[1]
    for field in ("hv_latency", "hv_macs"):
        wins = sum(x[field] > y[field] for x, y in zip(results[a], results[b]))
        missing = sorted({k for rows in results.values() for row in rows for k in row["missing"]})
        print(f"{field}: {a} beats {b} in {wins} of {len(results[a])} repeats"
              + (f" ({len(missing)} front designs not in the table yet)" if missing else ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=900.0, help="wall seconds per search (--timeout)")
    parser.add_argument("--method", action="append", choices=list(METHODS), default=None,
                        help="a method to run (repeatable; default: archspec default and random sampling)")
    parser.add_argument("--macs-budget", type=float, default=20e6)
    parser.add_argument("--out", default="runs/search_live", help="run directories go under here")
    parser.add_argument("--json", default="search_live.json")
    parser.add_argument("--rescore", action="store_true",
                        help="run nothing: score the runs --json lists again on the table as it is now (after "
                             "tabulating their missing designs)")
    parser.add_argument("--proxies", action="store_true",
                        help="run nothing: how the live proxies (val top-1, TSE) of the runs --json lists rank "
                             "designs, against the table's proxies on the same designs")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                        help="further archspec search options for every run (e.g. --max-images 2000)")
    args = parser.parse_args(argv)
    from archspec.search import load_table

    truth = _works().Truth(load_table("levit_small"))
    if args.rescore:
        return rescore(Path(args.json), truth)
    if args.proxies:
        print_proxy_report(proxy_report(Path(args.json), truth))
        return 0
    methods = args.method or ["archspec default", "random sampling"]
    results: dict[str, list[dict]] = {m: [] for m in methods}
    for seed in range(args.repeats):
        order = methods if seed % 2 == 0 else list(reversed(methods))  # ABBA: drift falls on both
        for method in order:
            out = Path(args.out) / f"{method.replace(' ', '_').replace(',', '')}-{seed}"
            if out.exists():
                print(f"{out} exists: remove it or choose another --out", file=sys.stderr)
                return 2
            start = time.perf_counter()
            done = subprocess.run(command(method, out, seed, args.budget, args.extra), capture_output=True,
                                  text=True, env={**os.environ})
            if done.returncode not in (0, 1):
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            row = {"seed": seed, "wall_s": round(time.perf_counter() - start, 1), "run_dir": str(out),
                   **score_run(out, truth, args.macs_budget)}
            results[method].append(row)
            print(f"{method} seed {seed}: {json.dumps(row)}", flush=True)
            Path(args.json).write_text(json.dumps({"budget_s": args.budget, "macs_budget": args.macs_budget,
                                                   "results": results}, indent=1) + "\n")
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
