"""Swin-T, archspec against timm: forward latency side by side, batch 1, one CPU thread, alternating rounds.

    python bench/swin_vs_timm.py [--sizes 224 256] [--rounds 4] [--repeats 15] [--threads 1]

Both models are ``swin_tiny_patch4_window7_224`` (archspec's spec ``specs/swin_tiny_patch4_window7_224.yaml``, timm's
model at the same ``img_size``) with the same weights (timm's random init, converted by
``archspec.timm_bridge.convert``) and the same photo.  Each round times ``--repeats`` forwards of each model, one
after the other, interleaved call by call (so drift hits both), and reports the two medians and their ratio; the
rounds run each case several times so the machine's noise shows in the table.  The last row is the median of the
per-round ratios.  ``ratio`` is timm's time / archspec's (> 1: archspec faster), of wall-clock time and of the
thread's CPU time (``time.thread_time``: what the forward itself cost, less the time other processes held the
core).  Prints Markdown.
"""

from __future__ import annotations

import argparse
import statistics
import time

import timm
import torch

import archspec  # noqa: F401 - registers the archspec_* timm models
from archspec.io.images import sample_batch
from archspec.timm_bridge.convert import load_timm_weights

NAME = "swin_tiny_patch4_window7_224"


def _ms(model: torch.nn.Module, x: torch.Tensor) -> tuple[float, float]:
    """Wall-clock and this thread's CPU time of one forward, in ms (the CPU time leaves out the time another
    process held the core: the shared machine's main noise)."""
    start, cpu = time.perf_counter(), time.thread_time()
    model(x)
    return (time.perf_counter() - start) * 1e3, (time.thread_time() - cpu) * 1e3


def _models(size: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    reference = timm.create_model(NAME, pretrained=False, img_size=size).eval()
    ours = timm.create_model("archspec_" + NAME, pretrained=False, img_size=size).eval()
    return load_timm_weights(ours, reference).eval(), reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[224])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per size (each case at least twice)")
    parser.add_argument("--repeats", type=int, default=15, help="timed forwards of each model per round")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, timm {timm.__version__}, threads {torch.get_num_threads()}, batch 1, "
          f"{args.repeats} forwards of each per round\n")
    print("| size | round | timm ms | archspec ms | timm / archspec | CPU: timm ms | archspec ms | timm / archspec "
          "| max abs logit diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    models = {size: _models(size) for size in args.sizes}
    ratios: dict[int, list[tuple[float, float]]] = {size: [] for size in args.sizes}
    with torch.inference_mode():
        for round_index in range(args.rounds):
            for size in args.sizes:  # sizes interleaved too: each round visits every case
                ours, theirs = models[size]
                x = torch.nn.functional.interpolate(sample_batch()[:1], size=(size, size), mode="bilinear")
                diff = (ours(x) - theirs(x)).abs().max().item()  # also the warm-up
                mine, timms = [], []
                for _ in range(args.repeats):
                    mine.append(_ms(ours, x))
                    timms.append(_ms(theirs, x))
                (a, a_cpu), (b, b_cpu) = ([statistics.median(t) for t in zip(*runs)] for runs in (mine, timms))
                ratios[size].append((b / a, b_cpu / a_cpu))
                print(f"| {size} | {round_index + 1} | {b:.1f} | {a:.1f} | {b / a:.3f} | {b_cpu:.1f} | {a_cpu:.1f} | "
                      f"{b_cpu / a_cpu:.3f} | {diff:.1e} |", flush=True)
    for size in args.sizes:
        wall, cpu = (statistics.median(r) for r in zip(*ratios[size]))
        print(f"| {size} | median of {args.rounds} rounds | | | {wall:.3f} | | | {cpu:.3f} | |")


if __name__ == "__main__":
    main()
