"""Top-1 of a trained LeViT in float32 and after int8 post-training quantisation (LeViT sec. 5.3, Tab. 3).

    nice -n 19 python bench/deploy_accuracy.py [--steps 800] [--size 64] [--out bench/deploy_accuracy]

Trains LeViT-128S (``specs/levit_128s.yaml``: stem, stages, shrinks and heads as shipped; the data's channels
and classes, at ``--size`` px) on Fashion-MNIST's 60,000 training images with archspec's in-memory training loop
(``archspec.train.train``: AdamW, warm-up + cosine, flip + crop), then evaluates on the 10,000 published test
images:

* float32, eager;
* int8: :func:`archspec.quantize` (BatchNorms folded, int8 linears / convs, attention products and softmax in
  float32) calibrated on ``--calibration-batches`` batches of 32 *training* images, compiled (Inductor, oneDNN);
* agreement: the share of test images on which both give the same class.

LeViT reports a 1.5-3 point top-1 drop on ImageNet; the target here is at most 3 points.  One torch thread
(beside other jobs a second OpenMP thread busy-waits).  Writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

import archspec
from archspec.deploy.int8 import calibration_batches
from archspec.io.datasets import load_data
from archspec.ir.checked import load_spec
from archspec.train import TrainConfig, evaluate, train


def _commit() -> str:
    """HEAD, with ``+dirty`` when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _predictions(model, images: torch.Tensor, batch: int) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([model(chunk).argmax(-1) for chunk in images.split(batch)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default="levit_128s")
    parser.add_argument("--size", type=int, default=64, help="input side in px (Fashion-MNIST's 28 px upsampled)")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--calibration-batches", type=int, default=4)
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(__file__).with_name("deploy_accuracy")))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    commit = _commit()  # the code that runs, before anyone edits the tree meanwhile

    doc = load_spec(args.spec).model_dump(mode="json", exclude_none=True)
    start = time.time()
    data = load_data(args.data, args.size, seed=args.seed)
    print(f"data: {data.describe()} ({time.time() - start:.0f} s)", flush=True)
    doc["input"] = {**doc["input"], "channels": data.channels, "resolution": args.size}
    doc["head"] = {**doc["head"], "num_classes": data.num_classes}
    doc["name"] = f"{args.spec}_{data.name.replace('-', '')}{args.size}"
    torch.manual_seed(args.seed)
    model = archspec.compile(doc)
    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                         warmup_steps=max(args.steps // 16, 1), eval_every=args.steps, log_every=100,
                         augmentation="flip+crop")
    start = time.time()
    result = train(model, data, config, seed=args.seed)
    train_s = time.time() - start
    print(f"trained {args.steps} steps in {train_s:.0f} s; val top-1 {result.accuracy:.4f}", flush=True)

    x_test, y_test = data.val.tensors
    eval_batch = 250  # 10,000 / 250: one compiled batch shape
    float_top1, _ = evaluate(model, data, batch=eval_batch)
    batches = calibration_batches(data, data.channels, (args.size, args.size), args.calibration_batches, 32, args.seed)
    start = time.time()
    quantized = archspec.quantize(model, batches, description={"data": data.name, "split": "train"})
    quantize_s = time.time() - start
    start = time.time()
    int8_pred = _predictions(quantized, x_test, eval_batch)
    int8_s = time.time() - start
    float_pred = _predictions(model, x_test, eval_batch)
    int8_top1 = (int8_pred == y_test).float().mean().item()
    agree = (int8_pred == float_pred).float().mean().item()
    result = {
        "spec": doc["name"], "base_spec": args.spec, "size": args.size, "data": data.describe(),
        "train": config.describe(), "train_s": round(train_s, 1),
        "float32_top1": float_top1, "int8_top1": int8_top1, "drop_points": round(100 * (float_top1 - int8_top1), 2),
        "agreement": agree, "calibration": quantized.calibration, "int8_ops": quantized.summary,
        "quantize_s": round(quantize_s, 1), "int8_eval_s": round(int8_s, 1),
        "commit": commit, "torch": torch.__version__, "threads": args.threads,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    table = ("| model | test images | float32 top-1 | int8 top-1 | drop (points) | same class |\n"
             "|---|---|---|---|---|---|\n"
             f"| {doc['name']} ({args.steps} steps) | {len(y_test)} | {100 * float_top1:.2f} | {100 * int8_top1:.2f} "
             f"| {100 * (float_top1 - int8_top1):.2f} | {100 * agree:.2f} % |\n")
    out.with_suffix(".md").write_text(table, encoding="utf-8")
    print(table)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
