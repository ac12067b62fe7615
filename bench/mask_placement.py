"""Does mask placement mean something?  Accuracy of a small deep MaiT under one budget, per placement.

    python bench/mask_placement.py                    # Fashion-MNIST, 12 layers x 3 heads; ~1-2 h on 2 cores
    python bench/mask_placement.py --quick            # a smoke run (minutes, numbers meaningless)

The model: a DeiT-style spec with ``--depth`` (12) layers of ``--dim`` (96) width and 3 heads, class token,
learned position embedding, patch 16 at 224 px -- trained by the mask-placement proxy (``archspec search
masks``' protocol: 64 px with the patch reduced so the token grid is at least 7x7, here 8x8; lr 3e-4,
``--steps`` AdamW steps).  Every placement is trained from the same initialisation seed with the same
protocol and scored on the held-out split:

* ``none``      no masks;
* ``sch1``      MaiT Sch.1: head 0 of every layer hard-masked (3x3);
* ``sch2``      a Sch.2-like placement scaled to the depth: 2 of 3 heads masked in the first third of the
                layers, one head in the next half, none in the last sixth (as ``specs/mait_tiny_sch2.yaml``
                over 24 layers: 0-7, 8-19, 20-23);
* ``als``, ``optuna``, ``soft``: the placement ``archspec search masks --strategy ...`` finds on the same
                data (its ``best.yaml``), retrained here under the same budget.

It also writes ``als_sch1.png``: the ALS of the masked and the unmasked heads per layer of the trained
Sch.1 model (MaiT Fig. 3a).  MaiT's finding: the masked head's ALS is high in early layers and falls
with depth.  Writes ``<out>/mask_placement.json`` and ``.md`` (``--out``, default ``bench/mask_placement``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def base_spec(depth: int, dim: int) -> dict:
    """The small deep MaiT without masks (a DeiT-style spec)."""
    return {"name": f"mait_d{depth}_w{dim}", "input": {"channels": 3, "resolution": 224},
            "stem": {"kind": "patch", "patch_size": 16}, "tokens": {"cls_token": "input", "pos_embed": "learned"},
            "stages": [{"depth": depth, "dim": dim, "heads": 3, "mlp_ratio": 4, "qkv_bias": True, "attention": "mhsa"}],
            "head": {"pool": "cls", "num_classes": 10}}


def with_layers(spec: dict, layers: list[dict]) -> dict:
    out = json.loads(json.dumps(spec))
    out["stages"][0]["layers"] = layers
    return out


def fixed_placements(spec: dict, depth: int) -> dict[str, dict]:
    """``none``, ``sch1`` and the Sch.2-like placement."""
    first, second = round(depth / 3), round(depth * 5 / 6)
    sch2 = [{"range": f"0-{first - 1}", "heads": ["mask:3x3", "mask:3x3", "mhsa"]}]
    if second > first:
        sch2.append({"range": f"{first}-{second - 1}", "heads": ["mask:3x3", "mhsa", "mhsa"]})
    return {"none": spec,
            "sch1": with_layers(spec, [{"range": f"0-{depth - 1}", "heads": ["mask:3x3", "mhsa", "mhsa"]}]),
            "sch2": with_layers(spec, sch2)}


def found_placement(spec: dict, strategy: str, args, work: Path) -> dict | None:
    """The placement ``archspec search masks --strategy`` finds (its best.yaml), or None if it failed."""
    import yaml

    from archspec.cli import main

    spec_file = work / f"{spec['name']}.yaml"
    spec_file.write_text(yaml.safe_dump(spec), encoding="utf-8")
    out = work / f"search_{strategy}"
    argv = ["search", "masks", str(spec_file), "--strategy", strategy, "--data", args.data, "--out", str(out),
            "--proxy-steps", str(args.steps), "--seed", str(args.seed), "--no-progress", "--device", "cpu"]
    if args.max_images:
        argv += ["--max-images", str(args.max_images)]
    if strategy == "optuna":
        argv += ["--trials", str(args.optuna_trials)]
    if main(argv) != 0 or not (out / "best.yaml").is_file():
        return None
    return yaml.safe_load((out / "best.yaml").read_text(encoding="utf-8"))


def train(spec_doc: dict, data, protocol, seed: int):
    from archspec.ir.checked import load_spec
    from archspec.search._evaluation.mask_scores import train_keeping_model

    return train_keeping_model(load_spec(spec_doc), data, protocol, seed)[0]


def als_plot(result, data, path: Path) -> dict:
    """Per layer: ALS of head 0 (masked) and the mean of heads 1-2 (global) of the trained Sch.1 model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from archspec.search._evaluation.mask_scores import layer_scores

    images = data.val.tensors[0][:128]
    scores = layer_scores(result.model, images, (3, 3))
    layers = sorted(scores)
    masked = [scores[k][0] for k in layers]
    others = [sum(scores[k][1:]) / len(scores[k][1:]) for k in layers]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(len(layers)), masked, "o-", label="head 0 (3x3 hard mask)")
    ax.plot(range(len(layers)), others, "s--", label="heads 1-2 (global), mean")
    ax.set_xlabel("layer")
    ax.set_ylabel("ALS (3x3 window)")
    ax.set_ylim(0, 1.02)
    ax.set_title("Sch.1: attention locality score per layer (MaiT Fig. 3a)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {"masked_head": masked, "global_heads_mean": others}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="fashion-mnist", help="as archspec search --data (default fashion-mnist)")
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--dim", type=int, default=96)
    parser.add_argument("--steps", type=int, default=400, help="proxy steps of every training (default 400)")
    parser.add_argument("--max-images", type=int, default=14000,
                        help="images used (default 14000: 2000 held out; 0: all)")
    parser.add_argument("--optuna-trials", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strategies", default="als,optuna,soft")
    parser.add_argument("--placements", default="none,sch1,sch2",
                        help="fixed placements to train (default none,sch1,sch2; "
                             "e.g. --placements sch1 --strategies '' "
                             "--steps 3000 for a longer-trained Fig. 3a plot)")
    parser.add_argument("--quick", action="store_true", help="smoke run: depth 3, 20 steps, 600 images")
    parser.add_argument("--out", default=str(HERE / "mask_placement"), help="output directory")
    args = parser.parse_args(argv)
    if args.quick:
        args.depth, args.steps, args.max_images, args.optuna_trials = 3, 20, 600, 2

    import torch

    from archspec.io.datasets import load_data
    from archspec.search import ProxyProtocol
    from archspec.search.cli_support import MASKS_PROXY_DEFAULTS

    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    protocol = dataclasses.replace(ProxyProtocol(), **{**MASKS_PROXY_DEFAULTS, "steps": args.steps, "threads": 1,
                                                       "eval_every": args.steps})
    data = load_data(args.data, image_size=protocol.image_size, seed=args.seed, max_images=args.max_images or None)
    spec = base_spec(args.depth, args.dim)
    wanted = [name for name in args.placements.split(",") if name]
    placements = {name: doc for name, doc in fixed_placements(spec, args.depth).items() if name in wanted}
    for strategy in [s for s in args.strategies.split(",") if s]:
        found = found_placement(spec, strategy, args, out)
        if found is not None:
            placements[strategy] = found
    rows, als = [], None
    start_all = time.perf_counter()
    for label, doc in placements.items():
        start = time.perf_counter()
        result = train(doc, data, protocol, args.seed)
        layers = doc["stages"][0].get("layers") or []
        rows.append({"placement": label, "accuracy": round(float(result.accuracy), 4),
                     "seconds": round(time.perf_counter() - start, 1), "layers": layers})
        print(f"{label}: accuracy {result.accuracy:.4f} ({rows[-1]['seconds']} s)", flush=True)
        if label == "sch1":
            als = als_plot(result, data, out / "als_sch1.png")
    report = {"data": data.describe(), "protocol": protocol.describe(), "depth": args.depth, "dim": args.dim,
              "seed": args.seed, "rows": rows, "als_sch1": als,
              "total_seconds": round(time.perf_counter() - start_all, 1)}
    (out / "mask_placement.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    lines = [f"Mask placement on {data.name}: {args.depth} layers x 3 heads, width {args.dim}, {args.steps} steps "
             f"(proxy input {protocol.image_size} px, token grid at least {protocol.min_grid}x{protocol.min_grid}), "
             f"seed {args.seed}", "",
             "| placement | accuracy | s |", "|---|---|---|"]
    lines += [f"| {r['placement']} | {r['accuracy']:.4f} | {r['seconds']} |" for r in rows]
    (out / "mask_placement.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
