"""Does locality emerge in the first round of ``archspec search masks``?  The ALS profile per candidate default.

    OMP_NUM_THREADS=1 taskset -c 0 python bench/mask_locality.py                 # every candidate (~1 h, 1 core)
    OMP_NUM_THREADS=1 taskset -c 0 python bench/mask_locality.py fmnist-1e-3     # some candidates
    python bench/mask_locality.py --quick                                        # smoke run (numbers meaningless)

MaiT's placement rule (sec. 4.2) presupposes that after the first round the masked head 0 is local in early
layers and not in late ones (Fig. 3a).  For each candidate default (data, lr, proxy steps, strategy) this trains
exactly the first round of the search -- the spec with head 0 hard-masked everywhere (``als``) or every head
soft-masked (``soft``) -- with the search's own proxy (:func:`archspec.search._evaluation.proxy.train_proxy`,
``MASKS_PROXY_DEFAULTS`` with the candidate's changes), and at every eval point computes, on the first
``ALS_IMAGES`` held-out images as the search does:

* ``early`` / ``late``: the mean *normalised* ALS, ``(ALS - u) / (1 - u)`` as the search decides on and its
  round-1 plot shows, of the masked heads (``als``: head 0; ``soft``: every head) in the first / last third
  of the layers;
* ``decisions``: what MaiT's assignment (0.8 / 0.2 on that score) would do per third (``als``), or how many
  heads' learned alpha is below 0.5 (``soft``: the heads that would keep a hard mask), and the mean alpha.

Points before the last step are mid-schedule (cosine lr not yet annealed): the row of a candidate is its last
step.  Wall and CPU seconds cover the training and the ALS evaluations (not the data loading).
Writes ``--out`` (default ``bench/mask_locality.json``) after every candidate, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# name -> (data, strategy, lr, steps); every other setting is MASKS_PROXY_DEFAULTS'.
CANDIDATES = {
    "digits-3e-4": ("digits", "als", 3e-4, 400),        # the default before this bench (issue 37)
    "fmnist-3e-4": ("fashion-mnist", "als", 3e-4, 400),
    "fmnist-1e-3": ("fashion-mnist", "als", 1e-3, 600),
    "digits-1e-3": ("digits", "als", 1e-3, 400),
    "fmnist-soft-1e-3": ("fashion-mnist", "soft", 1e-3, 400),
}


def thirds(n: int) -> tuple[range, range]:
    """The first and the last third of ``n`` layers (``n // 3`` each, at least 1)."""
    k = max(n // 3, 1)
    return range(k), range(n - k, n)


def profile(model, images, strategy: str, window=(3, 3)) -> dict:
    """Early / late mean normalised ALS of the masked heads, and the decisions per third, of a trained model."""
    from archspec.families.attention.placement import DEFAULT_ALS_HIGH, DEFAULT_ALS_LOW, normalise_als
    from archspec.search._evaluation.mask_scores import layer_scores, learned_alphas, uniform_baselines

    scores = layer_scores(model, images, window)
    norm = normalise_als(scores, uniform_baselines(model, window))
    keys = sorted(norm)
    early, late = thirds(len(keys))
    heads = (lambda v: v[:1]) if strategy == "als" else (lambda v: v)

    def mean(rng, table):
        vals = [x for i in rng for x in heads(table[keys[i]]) if x is not None]
        return round(sum(vals) / len(vals), 4) if vals else None

    out = {"early": mean(early, norm), "late": mean(late, norm),
           "head0_per_layer": [round(norm[k][0], 3) for k in keys]}
    if strategy == "als":
        def decide(rng):
            d = {"mask all": 0, "keep head 0": 0, "remove": 0}
            for i in rng:
                a = norm[keys[i]][0]
                d["mask all" if a >= DEFAULT_ALS_HIGH else "remove" if a <= DEFAULT_ALS_LOW else "keep head 0"] += 1
            return d
        out["decisions"] = {"early": decide(early), "late": decide(late), "all": decide(range(len(keys)))}
    else:
        alphas = learned_alphas(model)
        out["alpha_early"], out["alpha_late"] = mean(early, alphas), mean(late, alphas)
        out["alpha_per_layer"] = [round(sum(alphas[k]) / len(alphas[k]), 3) for k in keys]
        out["masked_heads_alpha_lt_0.5"] = {
            "early": sum(a < 0.5 for i in early for a in alphas[keys[i]]),
            "late": sum(a < 0.5 for i in late for a in alphas[keys[i]]),
            "all": sum(a < 0.5 for k in keys for a in alphas[k])}
    return out


def run_candidate(name: str, spec_name: str, quick: bool, datasets: dict, max_images: int | None) -> dict:
    import torch

    from archspec.io.datasets import load_data
    from archspec.ir.checked import load_spec
    from archspec.search import ProxyProtocol, train_proxy
    from archspec.search._evaluation.mask_scores import ALS_IMAGES
    from archspec.search._space.mask_placement import apply_placement, head0_placement, placement_heads, soft_heads
    from archspec.search.cli_support import MASKS_PROXY_DEFAULTS

    data_name, strategy, lr, steps = CANDIDATES[name]
    if quick:
        steps = 8
    protocol = ProxyProtocol(**{**MASKS_PROXY_DEFAULTS, "lr": lr, "steps": steps,
                                "eval_every": max(steps // 4, 1) if quick else 100})
    if data_name not in datasets:
        datasets[data_name] = load_data(data_name, image_size=protocol.image_size, seed=0,
                                        max_images=200 if quick else max_images)
    data = datasets[data_name]
    spec = load_spec(spec_name)
    window = (3, 3)
    heads = placement_heads(spec, head0_placement(spec), window) if strategy == "als" else soft_heads(spec, window)
    first = apply_placement(spec, heads)
    images = data.val.tensors[0][:ALS_IMAGES]
    holder, points = {}, []

    def report(step: int, accuracy: float) -> None:
        t = time.perf_counter()
        points.append({"step": step, "val_acc": round(accuracy, 4), **profile(holder["model"], images, strategy)})
        holder["als_s"] = holder.get("als_s", 0.0) + time.perf_counter() - t
        p = points[-1]
        print(f"  {name} step {step}: acc {accuracy:.3f}  early {p['early']}  late {p['late']}", flush=True)

    wall, cpu = time.perf_counter(), time.process_time()
    train_proxy(first, data, protocol, seed=0, report=report, on_model=lambda m: holder.__setitem__("model", m))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    last = points[-1]
    return {"candidate": name, "strategy": strategy, "data": data_name, "lr": lr, "steps": steps,
            "batch_size": protocol.batch_size, "min_grid": protocol.min_grid, "image_size": protocol.image_size,
            "early": last["early"], "late": last["late"], "val_acc": last["val_acc"],
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "als_eval_s": round(holder.get("als_s", 0.0), 1),
            "torch_threads": torch.get_num_threads(), "points": points}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("candidates", nargs="*", help=f"default: all of {', '.join(CANDIDATES)}")
    ap.add_argument("--spec", default="mait_tiny_sch1")
    ap.add_argument("--out", type=Path, default=HERE / "mask_locality.json")
    ap.add_argument("--max-images", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    names = args.candidates or list(CANDIDATES)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        ap.error(f"unknown candidates {unknown}; known: {list(CANDIDATES)}")
    try:
        commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip()
    except OSError:
        commit = None
    old = json.loads(args.out.read_text()) if args.out.is_file() and not args.quick else {}
    rows = {r["candidate"]: r for r in old.get("rows", [])}
    datasets: dict = {}
    for name in names:
        rows[name] = run_candidate(name, args.spec, args.quick, datasets, args.max_images)
        blob = {"spec": args.spec, "commit": commit, "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                f"affinity {sorted(os.sched_getaffinity(0))}", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
                "rows": list(rows.values())}
        args.out.write_text(json.dumps(blob, indent=1) + "\n", encoding="utf-8")
    print(f"{'candidate':18} {'strategy':8} {'data':13} {'lr':>7} {'steps':>5} {'early':>6} {'late':>6} "
          f"{'acc':>6} {'wall s':>7}")
    for r in rows.values():
        print(f"{r['candidate']:18} {r['strategy']:8} {r['data']:13} {r['lr']:7.0e} {r['steps']:5d} "
              f"{r['early']!s:>6} {r['late']!s:>6} {r['val_acc']:6.3f} {r['wall_s']:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
