"""CPU time of ``archspec.deploy.int8.quantize`` on a BoTNet hybrid, with and without freezing the BatchNorm that
folding leaves, side by side, each case twice.

    OMP_NUM_THREADS=1 taskset -c 0 python bench/int8_quantize_time.py [--model botnet26t] [--resolution 64]

BoTNet's ``bn2`` after timm's ``BottleneckAttn`` has no layer to fold into.  Left as a BatchNorm op, it makes
torchao's ``convert_pt2e`` trace its QAT conv -> BatchNorm pattern graphs; ``quantize`` freezes it to its per-channel
affine map first (``_freeze_batchnorms``, timm's ``freeze_batch_norm_2d``).  "kept" runs ``quantize`` with that step
disabled.  Both cases quantise the same model (random init from the spec's seed, BatchNorm statistics randomised)
on the same three real photos (``sample_batch``), reference graph only (``torch_compile=False``: Inductor's time is
not what differs).  Prints each run's CPU seconds (``time.process_time``, the whole process's threads) and the
largest difference between the two int8 models' logits.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from unittest import mock

import torch
from torch import nn

import archspec
from archspec.deploy import int8
from archspec.io.images import sample_batch


def _model(name: str, resolution: int) -> nn.Module:
    torch.manual_seed(0)
    model = archspec.compile(name, img_size=resolution).eval()
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.normal_(0, 0.2)
            m.running_var.uniform_(0.5, 2.0)
    return model


def _timed_quantize(model: nn.Module, x: torch.Tensor, freeze: bool) -> tuple[float, torch.Tensor]:
    skip = mock.patch.object(int8, "_freeze_batchnorms", return_value=0)  # "kept": the BatchNorm op stays
    start = time.process_time()
    with contextlib.nullcontext() if freeze else skip:
        quantized = int8.quantize(model, [x], torch_compile=False)
    seconds = time.process_time() - start
    with torch.no_grad():
        return seconds, quantized(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="botnet26t")
    parser.add_argument("--resolution", type=int, default=64)
    args = parser.parse_args()
    model = _model(args.model, args.resolution)
    x = sample_batch((args.resolution, args.resolution), model.spec.input.channels)
    left = [n for n, m in model.fuse().named_modules() if isinstance(m, nn.BatchNorm2d)]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {args.model} at {args.resolution} px; "
          f"BatchNorms left after folding: {len(left)}\n")
    seconds: dict[str, list[float]] = {"frozen": [], "kept": []}
    logits: dict[str, torch.Tensor] = {}
    for _ in range(2):
        for case in ("kept", "frozen"):
            s, logits[case] = _timed_quantize(model, x, freeze=case == "frozen")
            seconds[case].append(s)
    print("| BatchNorm left by folding | quantize CPU s (run 1 ; run 2) |")
    print("|---|---|")
    for case, runs in seconds.items():
        print(f"| {case} | {runs[0]:.1f} ; {runs[1]:.1f} |")
    print(f"\nmax abs int8 logit difference, frozen vs kept: {(logits['frozen'] - logits['kept']).abs().max():.2e}")


if __name__ == "__main__":
    main()
