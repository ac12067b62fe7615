"""Is the placement worth it?  The found placement vs MaiT's Sch.1 / Sch.2, no masks and all masks (issue 37 item 4).

    OMP_NUM_THREADS=1 taskset -c 0 python bench/mask_compare.py --found runs/masks-mait_tiny_sch1-als/best.yaml
    python bench/mask_compare.py --quick                       # smoke run (numbers meaningless)
    python bench/mask_compare.py --found best.yaml --device cuda --seeds 0 1 2 3   # on a GPU (bf16 autocast)
    python bench/mask_compare.py --merge part_*.json --out all.json   # join runs of one placement x seed each
    OMP_NUM_THREADS=1 python bench/mask_compare.py --latency --out all.json   # + CPU latency, nothing trained

Every placement of the same model (MaiT-T: 24 layers, 192 wide, 3 heads) is trained with the mask-placement
proxy -- ``MASKS_PROXY_DEFAULTS`` and the search's default data, i.e. exactly the training the search's rounds
get -- for each of ``--seeds`` (default 0 1; the seed sets the initialisation, the batch order and the
augmentation), and scored on the held-out split:

* ``found``: ``--found`` (a ``best.yaml`` of ``archspec search masks``), when given;
* ``sch1``, ``sch2``: ``specs/mait_tiny_sch1.yaml`` / ``mait_tiny_sch2.yaml`` (MaiT Tab. 3);
* ``none``: every mask removed; ``all``: every head of every layer hard-masked (3x3).

Reports val top-1 mean and spread (max - min over seeds) and the MACs executed per image at the spec's own
224 px (``archspec.analyze(spec).macs_executed``).  Writes ``--out`` (default ``bench/mask_compare.json``)
after every training.  On a GPU, where one MaiT-T proxy is launch-bound, ``bench/gpu_session.sh`` runs one
process per placement and seed side by side (``--only P --seeds S``) and ``--merge`` joins their files (same
protocol only).  ``--latency`` trains nothing: it measures each placement's latency by LeViT's CPU protocol
(:class:`archspec.search._evaluation.latency.LatencyProtocol`: one thread, batch 1, fp32, median ms of a forward pass at
224 px), twice so that the noise shows, into the rows of ``--out``.  Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def placements(found: Path | None) -> dict:
    from archspec.ir.checked import load_spec
    from archspec.search._space.mask_placement import apply_placement, attention_layers, placement_heads

    sch1 = load_spec("mait_tiny_sch1")
    layers = attention_layers(sch1)
    out = {}
    if found is not None:
        out["found"] = load_spec(str(found))
    out["sch1"] = sch1
    out["sch2"] = load_spec("mait_tiny_sch2")
    out["none"] = apply_placement(sch1, placement_heads(sch1, {(s, l): [False] * len(h) for s, l, h in layers},
                                                        (3, 3)))
    out["all"] = apply_placement(sch1, placement_heads(sch1, {(s, l): [True] * len(h) for s, l, h in layers}, (3, 3)))
    return out


def _summarise(row: dict) -> dict:
    accs = list(row["accuracy"].values())
    row["mean"], row["spread"] = round(sum(accs) / len(accs), 4), round(max(accs) - min(accs), 4)
    return row


def _print_table(rows: list[dict]) -> None:
    print(f"{'placement':10} {'seeds':>5} {'mean':>6} {'spread':>6} {'MACs exec':>10}  accuracies")
    for r in rows:
        accs = " ".join(f"{a:.3f}" for a in r["accuracy"].values())
        print(f"{r['placement']:10} {len(r['accuracy']):5d} {r['mean']:6.3f} {r['spread']:6.3f} "
              f"{r['macs_executed'] / 1e9:9.3f}G  {accs}")


def _read_part(path: Path) -> dict:
    """One result file, checked for what :func:`merge` reads.

    Raises:
        ValueError: unreadable, not JSON, or not shaped like a ``mask_compare`` result.
    """
    try:
        part = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(part, dict) or not all(k in part for k in ("protocol", "data", "steps", "rows")):
        raise ValueError("not a mask_compare result (protocol, data, steps and rows)")
    for row in part["rows"] if isinstance(part["rows"], list) else [None]:
        if not (isinstance(row, dict) and isinstance(row.get("placement"), str)
                and isinstance(row.get("accuracy"), dict) and isinstance(row.get("wall_s"), dict)):
            raise ValueError("a row lacks placement, accuracy or wall_s")
    return part


def merge(files: list[Path], out: Path) -> int:
    """Join result files of the same protocol (one placement x seed each, say) into ``out``; exit 2 on a
    protocol mismatch."""
    merged, rows = None, {}
    for f in files:
        try:
            part = _read_part(f)
        except ValueError as exc:
            print(f"error: --merge: {f}: {exc}; nothing written", file=sys.stderr)
            return 2
        if merged is None:
            merged = {k: v for k, v in part.items() if k not in ("rows", "seeds")}
        elif (part["protocol"], part["data"], part["steps"]) != (merged["protocol"], merged["data"], merged["steps"]):
            print(f"error: {f}: another protocol than {files[0]}'s; not merged", file=sys.stderr)
            return 2
        for r in part["rows"]:
            into = rows.setdefault(r["placement"], {**r, "accuracy": {}, "wall_s": {}})
            into["accuracy"].update(r["accuracy"])
            into["wall_s"].update(r["wall_s"])
    if merged is None:
        print("error: --merge: no files", file=sys.stderr)
        return 2
    for r in rows.values():
        r["accuracy"] = dict(sorted(r["accuracy"].items(), key=lambda kv: int(kv[0])))
        r["wall_s"] = dict(sorted(r["wall_s"].items(), key=lambda kv: int(kv[0])))
        _summarise(r)
    order = ["found", "sch1", "sch2", "none", "all"]
    ranked = sorted(rows.values(), key=lambda r: order.index(r["placement"]) if r["placement"] in order else 9)
    merged["seeds"] = sorted({int(s) for r in ranked for s in r["accuracy"]})
    merged["rows"] = ranked
    out.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
    _print_table(ranked)
    return 0


def add_latency(specs: dict, only: list[str] | None, out: Path) -> int:
    """Measure each placement's forward latency (ms, LeViT's CPU protocol, two medians) into ``out``'s rows."""
    from archspec.search import LatencyProtocol, measure_latency

    data = json.loads(out.read_text()) if out.is_file() else {"rows": []}
    rows = {r["placement"]: r for r in data["rows"]}
    protocol = LatencyProtocol()
    for name, spec in specs.items():
        if only and name not in only:
            continue
        runs = [round(measure_latency(spec, protocol), 2) for _ in range(2)]
        rows.setdefault(name, {"placement": name, "spec": spec.name})["latency_ms"] = runs
        print(f"  {name}: {runs[0]:.2f} / {runs[1]:.2f} ms", flush=True)
    data["rows"] = list(rows.values())
    data["latency_protocol"] = {**protocol.describe(), "machine": platform.processor() or platform.machine(),
                                "affinity": sorted(os.sched_getaffinity(0)), "torch": torch.__version__}
    out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    from archspec import analyze
    from archspec.io.datasets import load_data
    from archspec.search import ProxyProtocol, train_proxy
    from archspec.search.cli_support import MASKS_PROXY_DEFAULTS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--found", type=Path, default=None, help="best.yaml of `archspec search masks`")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--only", nargs="*", default=None, help="placements to train (default: all)")
    ap.add_argument("--steps", type=int, default=None, help="proxy steps (default: MASKS_PROXY_DEFAULTS')")
    ap.add_argument("--data", default="digits", help="the search's default: the embedded digits")
    ap.add_argument("--max-images", type=int, default=None)
    ap.add_argument("--out", type=Path, default=HERE / "mask_compare.json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu", help="where the proxies train (cuda: bf16 autocast, as the search)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, help="join these result files into --out")
    ap.add_argument("--latency", action="store_true", help="measure CPU latency into --out's rows; no training")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)
    if args.latency:
        return add_latency(placements(args.found), args.only, args.out)
    protocol = ProxyProtocol(**MASKS_PROXY_DEFAULTS)
    steps = 4 if args.quick else (args.steps or protocol.steps)
    protocol = ProxyProtocol(**{**MASKS_PROXY_DEFAULTS, "steps": steps, "eval_every": steps, "device": args.device})
    data_name, max_images = args.data, args.max_images
    data = load_data(data_name, image_size=protocol.image_size, seed=0, max_images=200 if args.quick else max_images)
    specs = placements(args.found)
    if args.only:
        specs = {k: v for k, v in specs.items() if k in args.only}
    old = json.loads(args.out.read_text()) if args.out.is_file() and not args.quick else {}
    rows = {r["placement"]: r for r in old.get("rows", [])}
    for name, spec in specs.items():
        a = analyze(spec)
        row = {"placement": name, "spec": spec.name, "macs_executed": a.macs_executed, "params": a.params,
               "accuracy": {}, "wall_s": {}}
        for seed in args.seeds:
            t = time.perf_counter()
            result = train_proxy(spec, data, protocol, seed=seed)
            row["accuracy"][str(seed)] = round(result.accuracy, 4)
            row["wall_s"][str(seed)] = round(time.perf_counter() - t, 1)
            print(f"  {name} seed {seed}: acc {result.accuracy:.3f} ({row['wall_s'][str(seed)]} s)", flush=True)
        rows[name] = _summarise(row)
        args.out.write_text(json.dumps({"data": data_name, "max_images": max_images, "steps": steps,
                                        "protocol": protocol.describe(), "seeds": args.seeds,
                                        "affinity": sorted(os.sched_getaffinity(0)),
                                        "device": _device_name(args.device), "torch": torch.__version__,
                                        "rows": list(rows.values())}, indent=1) + "\n", encoding="utf-8")
    _print_table(list(rows.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
