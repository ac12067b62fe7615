"""Is the placement worth it?  The found placement vs MaiT's Sch.1 / Sch.2, no masks and all masks (issue 37 item 4).

    OMP_NUM_THREADS=1 taskset -c 0 python bench/mask_compare.py --found runs/masks-mait_tiny_sch1-als/best.yaml
    python bench/mask_compare.py --quick                       # smoke run (numbers meaningless)
    python bench/mask_compare.py --found best.yaml --device cuda --seeds 0 1 2 3   # on a GPU (bf16 autocast)

Every placement of the same model (MaiT-T: 24 layers, 192 wide, 3 heads) is trained with the mask-placement
proxy -- ``MASKS_PROXY_DEFAULTS`` and the search's default data, i.e. exactly the training the search's rounds
get -- for each of ``--seeds`` (default 0 1; the seed sets the initialisation, the batch order and the
augmentation), and scored on the held-out split:

* ``found``: ``--found`` (a ``best.yaml`` of ``archspec search masks``), when given;
* ``sch1``, ``sch2``: ``specs/mait_tiny_sch1.yaml`` / ``mait_tiny_sch2.yaml`` (MaiT Tab. 3);
* ``none``: every mask removed; ``all``: every head of every layer hard-masked (3x3).

Reports val top-1 mean and spread (max - min over seeds) and the MACs executed per image at the spec's own
224 px (``archspec.analyze(spec).macs_executed``).  Writes ``--out`` (default ``bench/mask_compare.json``)
after every training.
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
    from archspec.ir.loader import load_spec
    from archspec.search.mask_specs import apply_placement, attention_layers, placement_heads

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


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
    from archspec import analyze
    from archspec.io.datasets import load_data
    from archspec.search.config import MASKS_PROXY_DEFAULTS
    from archspec.search.proxy import ProxyProtocol, train_proxy

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
    args = ap.parse_args(argv)
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
        accs = list(row["accuracy"].values())
        row["mean"], row["spread"] = round(sum(accs) / len(accs), 4), round(max(accs) - min(accs), 4)
        rows[name] = row
        args.out.write_text(json.dumps({"data": data_name, "max_images": max_images, "steps": steps,
                                        "protocol": protocol.describe(), "seeds": args.seeds,
                                        "affinity": sorted(os.sched_getaffinity(0)),
                                        "device": _device_name(args.device), "torch": torch.__version__,
                                        "rows": list(rows.values())}, indent=1) + "\n", encoding="utf-8")
    print(f"{'placement':10} {'mean':>6} {'spread':>6} {'MACs exec':>10}")
    for r in rows.values():
        print(f"{r['placement']:10} {r['mean']:6.3f} {r['spread']:6.3f} {r['macs_executed'] / 1e9:9.3f}G")
    return 0


if __name__ == "__main__":
    sys.exit(main())
