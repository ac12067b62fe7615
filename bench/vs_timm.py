"""archspec vs timm on the same architecture and input: forward latency ratio, measured side by side.

    python bench/vs_timm.py [--device cpu] [--batch 1] [--repeats 30] [--threads N]

Both models get the same weights (converted with archspec.timm_bridge.convert) and the same real photo batch;
runs alternate between the two models so drift hits both.  Prints a Markdown table: median ms of each
and the ratio archspec / timm (1.00 = same speed).  Absolute times mean something only on a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

import timm
import torch

import archspec
from archspec.io.images import sample_batch
from archspec.timm_bridge.convert import TIMM_EQUIVALENTS, load_timm_weights


def _time(model, x, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    model(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--models", nargs="*", default=["deit_tiny", "convit_tiny", "levit_128s"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    x = sample_batch()[:1].repeat(args.batch, 1, 1, 1).to(device)
    print(f"device {device}, batch {args.batch}, threads {torch.get_num_threads()}, median of {args.repeats}\n")
    print("| model | timm ms | archspec ms | archspec / timm | max abs logit diff |")
    print("|---|---|---|---|---|")
    for name in args.models:
        reference = timm.create_model(TIMM_EQUIVALENTS[name]).eval().to(device)
        model = load_timm_weights(archspec.compile(name), reference.cpu()).eval().to(device)
        reference.to(device)
        ours, theirs = [], []
        with torch.inference_mode():
            diff = (model(x) - reference(x)).abs().max().item()
            for _ in range(3):
                model(x), reference(x)
            for _ in range(args.repeats):
                ours.append(_time(model, x, device))
                theirs.append(_time(reference, x, device))
        a, b = statistics.median(ours), statistics.median(theirs)
        print(f"| {name} | {b:.2f} | {a:.2f} | {a / b:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
