"""What a search costs: static-check rate, per-trial seconds, and the total of the default search.

    python bench/search_costs.py                      # ~3-4 min on 2 CPU cores: 4 real trials
    python bench/search_costs.py --trials 8 --budget-flops 500M
    python bench/search_costs.py --full               # also time the bare `archspec search --budget-flops 1G`

Writes ``bench/search_costs.json`` and ``bench/search_costs.md`` (``--out`` to change the stem) with:

* the static check rate: candidates per second of ``space.sample`` + ``static_check`` (IR analysis,
  no weights) on the default space, and the fraction of random candidates the budget rejects;
* per trained trial: latency measurement, proxy training and whole-trial seconds (median, min, max)
  from a real search of ``--trials`` candidates with the default proxy protocol;
* the estimated total of the default command (fixed start-up + DEFAULT_TRIALS x median trial, capped
  by the default timeout), and with ``--full`` the measured wall time and trial count of
  ``archspec search --budget-flops 1G`` run as a subprocess in a temporary directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {"n": len(values), "median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "mean": round(statistics.fmean(values), 3)}


def infeasible_fraction(space, budgets, n: int, seed: int) -> tuple[float, float, float]:
    """(fraction rejected, ms per sample incl. Optuna ask/tell and spec validation, ms per static_check alone)."""
    import optuna

    from archspec.search import static_check

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    specs = []
    start = time.perf_counter()
    for _ in range(n):
        trial = study.ask()
        specs.append(space.sample(trial))
        study.tell(trial, 0.0)
    sample_ms = (time.perf_counter() - start) / n * 1e3
    start = time.perf_counter()
    rejected = sum(not static_check(spec, budgets).feasible for spec in specs)
    check_ms = (time.perf_counter() - start) / n * 1e3
    return rejected / n, sample_ms, check_ms


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget-flops", default="1G", help="MAC budget (default 1G)")
    parser.add_argument("--trials", type=int, default=4, help="real trials to time (default 4)")
    parser.add_argument("--static-n", type=int, default=500, help="candidates for the static-check rate (default 500)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--full", action="store_true", help="also run and time the bare default command")
    parser.add_argument("--threads", type=int, default=1, help="proxy training threads (default 1, as the CLI)")
    parser.add_argument("--out", default=str(HERE / "search_costs"), help="output stem (.json and .md)")
    args = parser.parse_args(argv)

    import torch

    from archspec.search import Budgets, LatencyProtocol, ProxyProtocol, SearchConfig, load_space, run_design
    from archspec.search._evaluation.check_rate import static_check_rate
    from archspec.search.cli_support import DEFAULT_TIMEOUT_S, DEFAULT_TRIALS, parse_quantity

    budgets = Budgets(macs=parse_quantity(args.budget_flops, "--budget-flops"))
    space = load_space(None)
    rate = static_check_rate(space, budgets, n=args.static_n, seed=args.seed)
    rejected, sample_ms, check_ms = infeasible_fraction(space, budgets, n=min(args.static_n, 1000), seed=args.seed)
    print(f"static check: {rate:,.0f} candidates/s end to end "
          f"(sampling {sample_ms:.2f} ms + IR check {check_ms * 1e3:.0f} us "
          f"per candidate); {rejected:.0%} of random candidates exceed {args.budget_flops} MACs")

    with tempfile.TemporaryDirectory() as tmp:
        protocol = dataclasses.replace(ProxyProtocol(), threads=args.threads)
        cfg = SearchConfig(budgets=budgets, protocol=protocol, latency=LatencyProtocol(), study_name="costs",
                           out=Path(tmp) / "run", trials=args.trials, timeout=None, seed=args.seed, progress=True)
        start = time.perf_counter()
        outcome = run_design(cfg)
        wall = time.perf_counter() - start
        trials = [t for t in outcome.study.get_trials() if t.state.name == "COMPLETE"]
        train = [t.user_attrs["train_seconds"] for t in trials if "train_seconds" in t.user_attrs]
        whole = [t.duration.total_seconds() for t in trials if t.duration is not None]
        latency_s = [max(w - tr, 0.0) for w, tr in zip(whole, train)]  # latency measurement + bookkeeping
        summary = outcome.summary
    overhead = max(wall - sum(whole), 0.0)
    per_trial = statistics.median(whole) if whole else float("nan")
    estimate = overhead + min(DEFAULT_TRIALS * per_trial, DEFAULT_TIMEOUT_S + per_trial)
    report = {
        "machine": {"torch_threads": torch.get_num_threads(), "python": sys.version.split()[0]},
        "budget_macs": budgets.macs,
        "static_check_candidates_per_s": round(rate, 1),
        "sample_ms_per_candidate": round(sample_ms, 3),
        "ir_check_us_per_candidate": round(check_ms * 1e3, 1),
        "random_candidates_rejected_by_budget": round(rejected, 3),
        "trials_timed": len(trials),
        "trial_seconds": _stats(whole),
        "train_seconds": _stats(train),
        "latency_and_bookkeeping_seconds": _stats(latency_s),
        "infeasible_samples_in_run": summary.get("infeasible_this_run"),
        "run_wall_seconds": round(wall, 1),
        "fixed_overhead_seconds": round(overhead, 1),
        "default_command": {"trials": DEFAULT_TRIALS, "timeout_s": DEFAULT_TIMEOUT_S,
                            "estimated_total_seconds": round(estimate, 1)},
        "proxy_protocol": protocol.describe(),
    }
    if args.full:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "archspec", "search", "--budget-flops", args.budget_flops,
                                   "--json", "--no-progress"], cwd=tmp, capture_output=True, text=True)
            full_wall = time.perf_counter() - start
        full = {"returncode": proc.returncode, "wall_seconds": round(full_wall, 1)}
        if proc.returncode == 0:
            s = json.loads(proc.stdout)
            full.update({"trained": s.get("trained_this_run"), "infeasible_samples": s.get("infeasible_this_run"),
                         "pareto_points": len(s.get("pareto") or []), "per_trial_seconds": s.get("per_trial_seconds")})
        else:
            full["stderr_tail"] = proc.stderr[-2000:]
        report["default_command"]["measured"] = full
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    lines = [
        "# Search costs (`bench/search_costs.py`)", "",
        f"- static check (sample + IR analysis, no weights): **{rate:,.0f} candidates/s** end to end; per candidate "
        f"{sample_ms:.2f} ms of Optuna sampling + spec validation and **{check_ms * 1e3:.0f} us** "
        "of IR check (MACs, params); "
        f"{rejected:.0%} of random candidates of the default space exceed {args.budget_flops} MACs",
        f"- per trained trial ({len(trials)} timed, default proxy protocol): "
        f"median **{report['trial_seconds'].get('median')} s** "
        f"(training {report['train_seconds'].get('median')} s, latency measurement + bookkeeping "
        f"{report['latency_and_bookkeeping_seconds'].get('median')} s); range {report['trial_seconds'].get('min')}-"
        f"{report['trial_seconds'].get('max')} s",
        f"- fixed start-up of a run (space checks, data, storage, final files): {overhead:.1f} s",
        f"- default `archspec search --budget-flops 1G` ({DEFAULT_TRIALS} trials or {DEFAULT_TIMEOUT_S:g} s): "
        f"estimated **{estimate:.0f} s**",
    ]
    if args.full:
        f = report["default_command"]["measured"]
        lines.append(f"- measured: exit {f['returncode']}, **{f['wall_seconds']} s** wall, "
                     f"{f.get('trained')} trials trained, "
                     f"{f.get('infeasible_samples')} infeasible samples rejected statically, "
                     f"{f.get('pareto_points')} Pareto points")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines[2:]))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
