"""Does the proxy rank architectures like longer training does?  Kendall tau of proxy vs long accuracy.

    python bench/proxy_rank.py                        # 12 architectures on Fashion-MNIST, 2 processes
    python bench/proxy_rank.py --data digits --n 8 --long-steps 450   # the earlier digits figure

Samples ``--n`` distinct architectures of the default design space that fit ``--budget-flops``
(Optuna ``RandomSampler``, ``--seed``), trains each with the search's proxy protocol (the default
``ProxyProtocol``: what ``archspec search`` uses to score a trial) and again for ``--long-steps``
steps (default 4x the proxy's), then reports ``scipy.stats.kendalltau`` between the proxy accuracy
and the longer-trained accuracy, with its p-value.  Both runs use the same data split; the long
run uses ``--long-seed`` (default: a different initialisation from the proxy's) so that tau
measures ranking, not shared noise.

Writes ``bench/proxy_rank.json`` and ``bench/proxy_rank.md`` (``--out`` to change the stem).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def sample_architectures(space, budgets, n: int, seed: int, max_draws: int = 5000, spread: str = "random"):
    """``n`` distinct feasible specs (by architecture key) with their Optuna params.

    ``spread="random"`` keeps the first ``n`` distinct feasible draws.  ``spread="macs"`` draws up to
    ``8 * n`` distinct feasible candidates and keeps the ``n`` at evenly spaced MAC quantiles (smallest
    and largest included), so the set spans the budget instead of clustering where random sampling
    lands; ``n`` random designs of one space often differ too little to rank at all.
    """
    import optuna

    from archspec.search import architecture_key, static_check

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    chosen, seen = [], set()
    pool_size = n if spread == "random" else 8 * n
    for _ in range(max_draws):
        trial = study.ask()
        spec = space.sample(trial)
        check = static_check(spec, budgets)
        study.tell(trial, 0.0)
        key = architecture_key(spec)
        if check.feasible and key not in seen:
            seen.add(key)
            chosen.append((spec, dict(trial.params), check))
            if len(chosen) == pool_size:
                break
    if spread == "macs" and len(chosen) > n:
        chosen.sort(key=lambda c: c[2].macs)
        picks = sorted({round(i * (len(chosen) - 1) / (n - 1)) for i in range(n)})
        chosen = [chosen[i] for i in picks]
    return chosen


_DATA = {}


def _train(task: dict) -> dict:
    """One training run in a worker process (``ProcessPoolExecutor``): ``{index, label, accuracy|failure, seconds}``."""
    import torch

    from archspec.io.datasets import load_data
    from archspec.ir.checked import load_spec
    from archspec.search import ProxyProtocol, train_proxy
    from archspec.train.failures import TrainingFailure

    torch.set_num_threads(task["protocol"]["threads"] or 1)
    key = (task["data"], task["image_size"], task["data_seed"], task["max_images"])
    if key not in _DATA:
        _DATA[key] = load_data(task["data"], image_size=task["image_size"], seed=task["data_seed"],
                               max_images=task["max_images"])
    start = time.perf_counter()
    out = {"index": task["index"], "label": task["label"]}
    try:
        protocol = ProxyProtocol.from_dict(task["protocol"])
        result = train_proxy(load_spec(task["spec"]), _DATA[key], protocol, seed=task["seed"])
        out["accuracy"], out["history"] = result.accuracy, result.history
    except TrainingFailure as exc:
        out["accuracy"], out["failure"] = None, exc.reason
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def _logged_results(path: str) -> list[dict]:
    """The trainings an interrupted run printed (``[k/N] arch i label: accuracy (seconds s)``), as ``_train``'s
    results; a failed one (accuracy ``None``) keeps no reason."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        m = re.match(r"\s*\[\d+/\d+\] arch (\d+) (\w+): (\S+) \(([\d.]+) s\)", line)
        if m:
            acc = None if m.group(3) == "None" else float(m.group(3))
            out.append({"index": int(m.group(1)), "label": m.group(2), "accuracy": acc, "seconds": float(m.group(4)),
                        "history": None, **({"failure": "interrupted run's log"} if acc is None else {})})
    return out


def fidelity_taus(rows: list[dict], kendalltau, replicate: bool = False) -> list[dict]:
    """Kendall tau of each fidelity against the reference: ``[{fidelity, n, tau, p}]``.

    The reference is the ``long`` run's final accuracy, or with ``replicate`` the mean of the two long seeds
    (``long`` and ``replicate``), which halves the seed noise the reference carries.  Fidelities: the trained
    proxy; each zero-cost score of the untrained proxy (``zc`` of a row); the design's MACs and parameter
    count (static: what any proxy has to beat); and with ``replicate`` the reference's own seed-to-seed tau
    (long vs replicate: the ceiling of any proxy) and each eval point of the replicate run against the long
    run (training truncated there, mid-schedule).
    """
    def tau_of(name: str, xs: list, ys: list) -> dict:
        pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
        t, p = kendalltau(*zip(*pairs)) if len(pairs) >= 3 else (None, None)
        return {"fidelity": name, "n": len(pairs), "tau": t, "p": p}

    long = [r.get("long_accuracy") for r in rows]
    reference = long
    if replicate:
        reference = [None if r.get("replicate_accuracy") is None or r.get("long_accuracy") is None
                     else (r["replicate_accuracy"] + r["long_accuracy"]) / 2 for r in rows]
    out = [tau_of("proxy (trained)", [r.get("proxy_accuracy") for r in rows], reference)]
    for name in sorted({k for r in rows for k in (r.get("zc") or {})}):
        out.append(tau_of(f"zero-cost {name} (untrained)", [(r.get("zc") or {}).get(name) for r in rows], reference))
    out += [tau_of("MACs (static, no training)", [r["macs"] for r in rows], reference),
            tau_of("params (static, no training)", [r["params"] for r in rows], reference)]
    if not replicate:
        return out
    out.append(tau_of("the reference's two seeds (long vs replicate)",
                      [r.get("replicate_accuracy") for r in rows], long))
    steps = sorted({h[0] for r in rows for h in (r.get("replicate_history") or [])})
    for step in steps:
        at = [dict((h[0], h[1]) for h in (r.get("replicate_history") or [])).get(step) for r in rows]
        out.append(tau_of(f"replicate at step {step} vs long", at, long))
    return out


def zero_cost_rows(archs, data, protocol, seed: int) -> list[tuple[dict, dict]]:
    """Each design's zero-cost scores and their seconds (``archspec.search._evaluation.proxy.score_proxy``: the
    untrained
    proxy at its proxy geometry, one training batch), as the search's zero-cost rung computes them."""
    import math

    from archspec.search._evaluation.proxy import ZERO_COST_SCORES, score_proxy

    out = []
    for spec, _, _ in archs:
        result, _ = score_proxy(spec, data, protocol, ZERO_COST_SCORES, seed=seed)
        scores = {k: (v if math.isfinite(v) else None) for k, v in result.scores.items()}
        out.append((scores, result.seconds))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=12, help="architectures (default 12)")
    parser.add_argument("--budget-flops", default="1G", help="only candidates within this MAC budget (default 1G)")
    parser.add_argument("--proxy-steps", type=int, default=None, help="proxy steps (default: ProxyProtocol's)")
    parser.add_argument("--proxy-min-grid", default="real",
                        help="the proxy's token grid: real (default: each design's own grids) or a minimum first-grid "
                             "side, as `archspec search --proxy-min-grid`")
    parser.add_argument("--long-steps", type=int, default=None, help="long-training steps (default 4x the proxy's)")
    parser.add_argument("--data", default="fashion-mnist",
                        help="fashion-mnist (default; apt-get install dataset-fashion-mnist), digits, or a directory "
                             "load_data reads (CIFAR-10/100, ImageFolder, IDX files)")
    parser.add_argument("--max-images", type=int, default=None,
                        help="images used, train and held-out together (default and 0: all; Fashion-MNIST: 60,000 "
                             "train / 10,000 test)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed and proxy initialisation seed")
    parser.add_argument("--long-seed", type=int, default=1, help="initialisation seed of the long runs (default 1)")
    parser.add_argument("--jobs", type=int, default=min(os.cpu_count() or 1, 2),
                        help="trainings run in parallel processes (default: min(cores, 2))")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per training "
                             "(default 1, as `archspec search`: avoids OpenMP oversubscription)")
    parser.add_argument("--spread", choices=("random", "macs"), default="random",
                        help="random: the first --n distinct feasible draws (default); macs: --n designs at evenly "
                             "spaced MAC quantiles of 8x as many draws, so the set spans the budget")
    parser.add_argument("--replicate", action="store_true",
                        help="also train the long protocol with --seed: reports the reference's own seed-to-seed tau, "
                             "tau against the two seeds' mean, and tau of each of the replicate's eval points "
                             "(truncated training as a fidelity) against the --long-seed run")
    parser.add_argument("--device", default="cpu",
                        help="where every training runs: cpu (default), cuda, cuda:N or auto (archspec.train's loop: "
                             "bf16 autocast and the data set on the device on CUDA)")
    parser.add_argument("--eval-points", choices=("all", "final"), default="all",
                        help="all: val top-1 at every eval point of each protocol (default; the replicate's points "
                             "give the truncated-training fidelities); final: only at the end of each run -- the "
                             "same final accuracies (evaluation draws no random numbers), without the intermediate "
                             "passes over the val set, which on CPU at 14x14 grids cost about as much as the long "
                             "run's training for Fashion-MNIST's 10,000 test images")
    parser.add_argument("--resume-log", default=None, metavar="LOG",
                        help="the stdout of an interrupted run with the same arguments: its '[k/N] arch i label: "
                             "accuracy (s)' lines are taken as done and only the other trainings run (each training is "
                             "seeded, so a rerun would give the same accuracy)")
    parser.add_argument("--out", default=str(HERE / "proxy_rank"), help="output stem (.json and .md)")
    args = parser.parse_args(argv)
    if args.max_images is not None and args.max_images < 0:
        parser.error(f"--max-images must be 0 (all) or a positive count, got {args.max_images}")
    args.max_images = args.max_images or None  # 0 = all, as bench/mask_placement.py
    if args.n < 3:
        parser.error("--n must be at least 3 for a rank correlation")

    from scipy.stats import kendalltau

    from archspec._util.units import human
    from archspec.io.datasets import load_data
    from archspec.search import Budgets, ProxyProtocol, load_space
    from archspec.search.cli_support import parse_quantity
    from archspec.train import resolve_device

    try:
        device = str(resolve_device(args.device))
    except ValueError as exc:
        parser.error(f"--device: {exc}")
    proxy = dataclasses.replace(ProxyProtocol(), threads=args.threads, device=device,
                                min_grid=None if args.proxy_min_grid == "real" else int(args.proxy_min_grid))
    if args.proxy_steps:
        proxy = dataclasses.replace(proxy, steps=args.proxy_steps)
    long_steps = args.long_steps or 4 * proxy.steps
    long = dataclasses.replace(proxy, steps=long_steps, eval_every=max(long_steps // 4, 1),
                               warmup_steps=max(proxy.warmup_steps, long_steps // 10))
    if args.eval_points == "final":
        proxy, long = (dataclasses.replace(p, eval_every=p.steps) for p in (proxy, long))
    budgets = Budgets(macs=parse_quantity(args.budget_flops, "--budget-flops"))
    space = load_space(None)
    data = load_data(args.data, image_size=proxy.image_size, seed=args.seed, max_images=args.max_images)
    archs = sample_architectures(space, budgets, args.n, args.seed, spread=args.spread)
    print(f"{len(archs)} architectures of {space.name} within {args.budget_flops} MACs; proxy {proxy.steps} steps, "
          f"long {long_steps} steps; data {data.name} ({len(data.train)} train / {len(data.val)} val)")
    zc = zero_cost_rows(archs, data, proxy, args.seed)
    rows = [{"index": i, "macs": check.macs, "params": check.params, "space_params": params, "zc": zc[i][0],
             "zc_seconds": zc[i][1]} for i, (spec, params, check) in enumerate(archs)]
    tasks = []
    for i, (spec, _, _) in enumerate(archs):
        runs = [("long", long, args.long_seed), ("proxy", proxy, args.seed)]
        if args.replicate:
            runs.append(("replicate", long, args.seed))
        for label, protocol, seed in runs:
            tasks.append({"index": i, "label": label, "spec": spec.model_dump(mode="json"),
                          # describe() leaves out score "accuracy" (old studies' default), which from_dict
                          # would read back as the default "tse": the worker gets it spelled out
                          "protocol": {**protocol.describe(), "score": protocol.score},
                          "seed": seed, "data": args.data, "image_size": proxy.image_size, "data_seed": args.seed,
                          "max_images": args.max_images})
    tasks.sort(key=lambda t: t["label"] == "proxy")  # longest first: better packing on the workers
    done = _logged_results(args.resume_log) if args.resume_log else []
    finished = {(r["index"], r["label"]) for r in done}
    tasks = [t for t in tasks if (t["index"], t["label"]) not in finished]
    if done:
        print(f"resuming: {len(done)} trainings from {args.resume_log}, {len(tasks)} to run", flush=True)
    start_all = time.perf_counter()
    if args.jobs > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = [pool.submit(_train, t) for t in tasks]
            results = []
            for future in as_completed(futures):
                results.append(future.result())
                r = results[-1]
                print(f"  [{len(results)}/{len(tasks)}] arch {r['index']} {r['label']}: {r.get('accuracy')} "
                      f"({r['seconds']} s)", flush=True)
    else:
        results = []
        for t in tasks:
            results.append(_train(t))
            r = results[-1]
            print(f"  [{len(results)}/{len(tasks)}] arch {r['index']} {r['label']}: "
                  f"{r.get('accuracy')} ({r['seconds']} s)",
                  flush=True)
    results = done + results
    for r in results:
        row = rows[r["index"]]
        row[f"{r['label']}_accuracy"] = r.get("accuracy")
        row[f"{r['label']}_seconds"] = r["seconds"]
        row[f"{r['label']}_history"] = r.get("history")
        if "failure" in r:
            row[f"{r['label']}_failure"] = r["failure"]
    ok = [r for r in rows if r["proxy_accuracy"] is not None and r["long_accuracy"] is not None]
    total = time.perf_counter() - start_all
    fidelities = fidelity_taus(rows, kendalltau, replicate=args.replicate)
    tau, p = fidelities[0]["tau"], fidelities[0]["p"]  # the trained proxy against the reference
    report = {"space": space.name, "budget_macs": budgets.macs, "n": len(ok), "kendall_tau": tau, "p_value": p,
              "spread": args.spread, "fidelities": fidelities,
              "proxy_protocol": proxy.describe(), "long_protocol": long.describe(), "data": data.describe(),
              "seed": args.seed, "long_seed": args.long_seed, "total_seconds": round(total, 1), "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2, default=float) + "\n", encoding="utf-8")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    mean_note = f" and the mean with seed {args.seed}" if args.replicate else ""
    lines = ["# Proxy ranking fidelity (`bench/proxy_rank.py`)", "",
             f"Kendall tau between proxy accuracy ({proxy.steps} steps, seed {args.seed}) and longer-trained accuracy "
             f"({long_steps} steps, seed {args.long_seed}{mean_note}) "
             f"over {len(ok)} architectures of `{space.name}` within "
             f"{args.budget_flops} MACs, data {data.name}: **tau = {fmt(tau)}** (p = {fmt(p)}); "
             f"{total / 60:.1f} min.", "",
             "| # | MACs | params | proxy acc | long acc | replicate acc | proxy s | long s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['index']} | {human(r['macs'])} | {human(r['params'])} | {fmt(r['proxy_accuracy'])} | "
                     f"{fmt(r['long_accuracy'])} | {fmt(r.get('replicate_accuracy'))} | {r['proxy_seconds']} | "
                     f"{r['long_seconds']} |")
    if fidelities:
        reference = (f"the mean of the {long_steps}-step runs with seeds {args.long_seed} and {args.seed}"
                     if args.replicate else f"the {long_steps}-step run with seed {args.long_seed}")
        zc_seconds = [sum(r["zc_seconds"].values()) for r in rows]
        lines += ["", f"Zero-cost scores: {sum(zc_seconds) / len(zc_seconds):.2f} s per design on average.", "",
                  f"Each fidelity's Kendall tau against {reference}:", "",
                  "| fidelity | n | tau | p |", "|---|---|---|---|"]
        lines += [f"| {f['fidelity']} | {f['n']} | {fmt(f['tau'])} | {fmt(f['p'])} |" for f in fidelities]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(lines[2])
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
