"""Graph builds per proxy-trained candidate, and the static check's candidates per second, before and after.

Issue 34, item 5 ("one pass per candidate"): a candidate's spec used to be turned into a dict and back and its IR
rebuilt at every step (validation, static check, proxy spec, latency, proxy training).  This script measures, for
two trees side by side -- ``--before REV`` (default: where this branch left ``main``), extracted with
``git archive`` into a temporary directory, and the working tree -- each in its own subprocess:

(a) graph builds per trial of a small design search (``archspec.search.run_design`` on a one-stage, 32 px
    LeViT-like space -- 4 points --, 3-step proxy, latency of 2 runs): IR builds asked for, counted by
    wrapping :func:`archspec.ir.graph.build_graph` (and, after issue 58, :func:`archspec.ir.plan.build_plan`) in
    every loaded module that binds it, and walks (the work), counted by wrapping the walk's ``_Builder`` (one per
    walk; before issue 34 every call walked, after it an equal spec reuses the IR kept by its content); per
    trial by wrapping the engine's objective (``CandidateObjective.__call__``), reported for the trials that
    trained a proxy.  Walks outside trials (the preflight's sample points, the budget check, the summary's
    best/Pareto specs) are listed apart.
(b) the static check's rate, candidates per second: ``space.sample`` (validation + graph) then
    ``static_check`` (MACs, params, memory) on the default space (``levit_family.yaml``), Optuna's
    ``RandomSampler``, 200 candidates -- once as :func:`archspec.search._evaluation.check_rate.static_check_rate`
    does it (no data), once as the search's objective does it (with the proxy-training memory check, which adapts
    the candidate to the data); each measured twice (``--repeats``), in fresh processes, before and after
    alternating, so the noise shows.

Run: ``OMP_NUM_THREADS=1 taskset -c 0 python bench/graph_builds.py`` (2-3 minutes on 2 busy cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TINY_SPACE = {
    "name": "tiny", "kind": "design",
    "spec": {
        "input": {"channels": 3, "resolution": 32}, "stem": {"kind": "conv"},
        "tokens": {"cls_token": "none", "pos_embed": "none"},
        "stages": [{"depth": {"int": [1, 2]}, "dim": {"choice": [16, 32]}, "heads": 2, "key_dim": 8, "attn_ratio": 1,
                    "mlp_ratio": 2, "norm": "batchnorm", "act": "hardswish", "qkv_bias": False,
                    "attention": "levit_bias"}],
        "head": {"pool": "mean", "num_classes": 10},
    },
}
PROTOCOL = {"steps": 3, "eval_every": 3, "batch_size": 8, "warmup_steps": 1, "image_size": 32, "threads": 1}
LATENCY = {"repeats": 2, "warmup": 1}


def _count_builds() -> dict:
    """Count IR builds asked for -- ``build_graph`` calls, and after issue 58 ``build_plan`` calls from outside
    :mod:`archspec.ir.graph` (whose ``build_graph`` asks for the plan) -- wrapped wherever a module binds them, and
    graph walks (``_Builder`` constructions: one per walk over a spec, in both trees; the builder lives in
    :mod:`archspec.ir.walk` after issue 58, in :mod:`archspec.ir.graph` before); returns the counter."""
    import archspec.ir.analysis  # noqa: F401 - bind every module that imports build_graph by name
    import archspec.ir.graph as graph
    import archspec.nn.compiler  # noqa: F401
    import archspec.search._evaluation.budget  # noqa: F401
    import archspec.search._evaluation.proxy  # noqa: F401
    import archspec.search._space.language  # noqa: F401

    try:
        import archspec.ir.plan as plan
        import archspec.ir.walk as walker
    except ImportError:  # the tree before issue 58: one module
        plan, walker = None, graph
    originals = {graph.build_graph} | ({plan.build_plan} if plan is not None else set())
    builder = walker._Builder
    counter = {"calls": 0, "walks": 0}

    def counting(original):
        def counted(spec):
            counter["calls"] += 1
            return original(spec)
        return counted

    wrapped = {original: counting(original) for original in originals}
    for module in list(sys.modules.values()):
        if module is None:
            continue
        # archspec.ir.graph's own build_graph asks for the plan: count the build_graph call, not that request too
        for name in ("build_graph",) if module is graph else ("build_graph", "build_plan"):
            if getattr(module, name, None) in wrapped:
                setattr(module, name, wrapped[getattr(module, name)])

    class CountedBuilder(builder):
        def __init__(self, spec):
            counter["walks"] += 1
            super().__init__(spec)

    walker._Builder = CountedBuilder
    return counter


def _builds_per_trial(trials: int) -> dict:
    import archspec.search as search

    # the one bench import of the search's inside, with its reason: counting graph builds per trial wraps the
    # engine's per-trial objective, which no public name exposes (tests/test_layers.py lists this exception)
    from archspec.search._engine.objective import CandidateObjective

    counter = _count_builds()
    per_trial: list[tuple[int, int, str]] = []
    call = CandidateObjective.__call__

    def counted_call(self, trial):
        calls, walks = counter["calls"], counter["walks"]
        try:
            return call(self, trial)
        finally:
            per_trial.append((counter["calls"] - calls, counter["walks"] - walks,
                              str(trial.user_attrs.get("status", "failed"))))

    CandidateObjective.__call__ = counted_call
    with tempfile.TemporaryDirectory() as out:
        search.run_design(space=TINY_SPACE, budgets={"macs": "10M"}, trials=trials, out=Path(out) / "run",
                          protocol=PROTOCOL, latency=LATENCY, max_images=60, progress=False, seed=0)
    trained = [(c, w) for c, w, status in per_trial if status == "trained"]
    return {"total_calls": counter["calls"], "total_walks": counter["walks"],
            "walks_outside_trials": counter["walks"] - sum(w for _, w, _ in per_trial),
            "per_trial": per_trial, "calls_per_trained": [c for c, _ in trained],
            "walks_per_trained": [w for _, w in trained],
            "statuses": {s: sum(1 for *_, t in per_trial if t == s) for s in {t for *_, t in per_trial}}}


def _rates(n: int, repeats: int) -> dict:
    import optuna

    from archspec.errors import SpecError
    from archspec.io.datasets import load_data
    from archspec.search import Budgets, ProxyProtocol, load_space, static_check
    from archspec.search._evaluation.check_rate import static_check_rate

    space, budgets = load_space(None), Budgets(macs=1e9)
    protocol = ProxyProtocol()
    data = load_data(None, image_size=protocol.image_size, max_images=60)

    def with_proxy_memory() -> float:  # as the search's objective calls it (budget.static_check_rate's loop)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        start = time.perf_counter()
        for _ in range(n):
            trial = study.ask()
            try:
                value = float(static_check(space.sample(trial), budgets, data, protocol).macs)
            except SpecError:
                value = float("inf")
            study.tell(trial, value)
        return n / (time.perf_counter() - start)

    static_check_rate(space, budgets, n=5)  # warm imports
    return {"static_check_rate": [static_check_rate(space, budgets, n=n) for _ in range(repeats)],
            "with_proxy_memory": [with_proxy_memory() for _ in range(repeats)]}


def _run_tree(tree: Path, part: str, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", part, "--trials", str(args.trials),
           "--n", str(args.n)]
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=None, help="git revision of the 'before' tree (default: merge-base "
                        "of HEAD and main)")
    parser.add_argument("--trials", type=int, default=4)
    parser.add_argument("--n", type=int, default=200, help="candidates per rate measurement")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="also write the numbers as JSON here")
    parser.add_argument("--child", choices=("builds", "rates"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_builds_per_trial(args.trials) if args.child == "builds" else _rates(args.n, 1)))
        return
    rev = args.before or subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT, check=True,
                                        capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        trees = {"before": Path(tmp), "after": ROOT}
        results = {side: {"builds": _run_tree(tree, "builds", args), "rates": {}} for side, tree in trees.items()}
        for _ in range(args.repeats):  # before and after alternate, so a busy machine slows both alike
            for side, tree in trees.items():
                for key, value in _run_tree(tree, "rates", args).items():
                    results[side]["rates"].setdefault(key, []).extend(value)
    before, after = results["before"], results["after"]
    rows = [("", f"before ({rev[:10]})", "after (working tree)")]
    for label, get in (
            ("build_graph calls per proxy-trained trial", lambda r: r["builds"]["calls_per_trained"]),
            ("graph walks per proxy-trained trial", lambda r: r["builds"]["walks_per_trained"]),
            ("trials by status", lambda r: dict(sorted(r["builds"]["statuses"].items()))),
            ("graph walks in all trials / outside trials",
             lambda r: f"{r['builds']['total_walks'] - r['builds']['walks_outside_trials']} / "
                       f"{r['builds']['walks_outside_trials']}"),
            (f"static check, candidates/s (static_check_rate, no data; n={args.n}, each run)",
             lambda r: [round(x, 1) for x in r["rates"]["static_check_rate"]]),
            (f"static check, candidates/s (with proxy-training memory; n={args.n}, each run)",
             lambda r: [round(x, 1) for x in r["rates"]["with_proxy_memory"]])):
        rows.append((label, str(get(before)), str(get(after))))
    for row in rows:
        print(f"| {' | '.join(row)} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"before": before, "after": after, "rev": rev}, indent=1) + "\n")


if __name__ == "__main__":
    main()
