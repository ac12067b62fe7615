"""Does the search work?  Fidelities ranked against the table's reference (issue 32, part 3).

    python bench/search_works.py fidelity                  # Kendall tau of every fidelity, on the shipped table
    python bench/search_works.py fidelity --table T.jsonl --json out.json

The reference is each design's final accuracy (all 10,000 test images) after the full protocol.  A fidelity
measured on one seed's run is compared with the *other* seed's final accuracy (both assignments, then averaged),
so that no seed noise is shared between the two sides; a static count (MACs, params) is compared with the
seed-averaged final accuracy.  The ceiling any fidelity can reach is the reference's own seed-to-seed tau.

For each fidelity: Kendall tau (``scipy.stats.kendalltau``), its p-value, a 95 % bootstrap interval (designs
resampled with replacement, 1,000 times, seeded) and its cost per design in CPU seconds (the table's training
seconds up to that step, the zero-cost score's seconds, 0 for counts).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TABLE = ROOT / "archspec" / "search" / "tables" / "levit_small.jsonl"


def paired_designs(rows: list[dict]) -> list[dict[int, dict]]:
    """``[{seed: row}]`` of the designs that have both seed 0 and seed 1."""
    by: dict[str, dict[int, dict]] = {}
    for r in rows:
        by.setdefault(r["key"], {})[r["seed"]] = r
    return [v for v in by.values() if 0 in v and 1 in v]


def _tau(xs, ys) -> float:
    t, _ = kendalltau(xs, ys)
    return float(t)


def bootstrap(xs, ys, n: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of Kendall tau over designs resampled with replacement."""
    rng = np.random.default_rng(seed)
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    taus = []
    for _ in range(n):
        idx = rng.integers(0, len(xs), len(xs))
        t = _tau(xs[idx], ys[idx])
        if np.isfinite(t):
            taus.append(t)
    return float(np.percentile(taus, 2.5)), float(np.percentile(taus, 97.5))


def cross_seed(designs, value) -> dict:
    """Tau of ``value(row)`` from seed a against seed b's final accuracy, for (a, b) = (0, 1) and (1, 0): the mean
    tau, the mean of the two p-values' logs back-transformed (a geometric mean), and the bootstrap interval of the
    pooled pairs."""
    xs, ys = [], []
    taus, ps = [], []
    for a, b in ((0, 1), (1, 0)):
        x = [value(d[a]) for d in designs]
        y = [d[b]["final_accuracy"] for d in designs]
        t, p = kendalltau(x, y)
        taus.append(t)
        ps.append(p)
        xs.append(x)
        ys.append(y)
    low, high = bootstrap(np.concatenate(xs), np.concatenate(ys))
    return {"tau": float(np.mean(taus)), "p": float(np.exp(np.mean(np.log(ps)))), "ci": [low, high]}


def fidelity_table(rows: list[dict]) -> dict:
    """Every fidelity's tau against the reference, with its cost (see the module docstring)."""
    designs = paired_designs(rows)
    if len(designs) < 4:
        raise SystemExit(f"only {len(designs)} designs have both seeds: nothing to rank yet")
    mean_final = [(d[0]["final_accuracy"] + d[1]["final_accuracy"]) / 2 for d in designs]
    seed0 = [d[0]["final_accuracy"] for d in designs]
    seed1 = [d[1]["final_accuracy"] for d in designs]
    t, p = kendalltau(seed0, seed1)
    out = {"designs": len(designs), "reference_seed_to_seed": {"tau": float(t), "p": float(p),
                                                               "ci": list(bootstrap(seed0, seed1))}, "fidelities": []}
    steps = [s for s, *_ in designs[0][0]["curve"]]
    for i, step in enumerate(steps):
        cost = float(np.mean([d[s]["tse"][i][2] for d in designs for s in (0, 1)]))
        out["fidelities"].append({"fidelity": f"val top-1 at step {step}", "cost_s": cost,
                                  **cross_seed(designs, lambda r, i=i: r["curve"][i][1])})
        out["fidelities"].append({"fidelity": f"TSE (sum of train losses) to step {step}", "cost_s": cost,
                                  **cross_seed(designs, lambda r, i=i: -r["tse"][i][1])})
    for name in sorted(designs[0][0]["zc"]):
        cost = float(np.mean([d[s].get("zc_seconds", {}).get(name, 0.0) for d in designs for s in (0, 1)]))
        out["fidelities"].append({"fidelity": f"zero-cost {name}", "cost_s": cost,
                                  **cross_seed(designs, lambda r, n=name: r["zc"][n] if r["zc"][n] is not None
                                               else -np.inf)})
    for name, field in (("#MACs", "macs"), ("#params", "n_params")):
        x = [d[0][field] for d in designs]
        t, p = kendalltau(x, mean_final)
        out["fidelities"].append({"fidelity": name, "cost_s": 0.0, "tau": float(t), "p": float(p),
                                  "ci": list(bootstrap(x, mean_final))})
    return out


def markdown(result: dict) -> str:
    ref = result["reference_seed_to_seed"]
    lines = [f"{result['designs']} designs; the reference's own seed-to-seed tau {ref['tau']:.3f} "
             f"(p {ref['p']:.1e}, 95 % CI {ref['ci'][0]:.2f}..{ref['ci'][1]:.2f})", "",
             "| fidelity | CPU s per design | Kendall tau | p | 95 % CI |", "|---|---:|---:|---:|---|"]
    for f in result["fidelities"]:
        lines.append(f"| {f['fidelity']} | {f['cost_s']:.2f} | {f['tau']:.3f} | {f['p']:.1e} | "
                     f"{f['ci'][0]:.2f}..{f['ci'][1]:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    fid = sub.add_parser("fidelity", help="Kendall tau of every fidelity against the reference")
    fid.add_argument("--table", default=str(DEFAULT_TABLE))
    fid.add_argument("--json", default=None, help="also write the result here")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()]
    result = fidelity_table(rows)
    print(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
