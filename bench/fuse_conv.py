"""model.fuse() on conv stages: folded against unfolded CPU forward time, side by side, each case twice.

    OMP_NUM_THREADS=1 taskset -c 0 python bench/fuse_conv.py [--models resnet26t botnet26t] [--repeats 15]

For each shipped spec (random init from its seed, BatchNorm statistics randomised so the fold is not trivial),
``model.fuse()`` folds every conv -> BatchNorm pair of the ResNet stem and the conv stages
(``archspec.nn.fuse.fold_conv_batchnorms``; BoTNet's / T-CNN's bn2 after attention stay).  Two rounds; in each the
unfolded and the folded model alternate, ``--repeats`` forwards of one real photo each (batch 1, inference mode);
prints the medians, the ratio unfolded / folded (above 1: the folded model is faster), the BatchNorms left and
the largest logit difference.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import archspec
from archspec.io.images import sample_batch


def _ms(model: nn.Module, x: torch.Tensor) -> float:
    start = time.perf_counter()
    model(x)
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["resnet26t", "botnet26t"])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, median of {args.repeats}, two rounds\n")
    print("| model | unfolded / folded ms (round 1 ; round 2) | ratio | BatchNorms left | max abs logit diff |")
    print("|---|---|---|---|---|")
    for name in args.models:
        torch.manual_seed(0)
        model = archspec.compile(name).eval()
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.data.normal_(1.0, 0.2)
                m.bias.data.normal_(0.0, 0.2)
        folded = model.fuse()
        x = sample_batch(model.spec.input.resolution, model.spec.input.channels)[:1]
        cells, ratios = [], []
        with torch.inference_mode():
            diff = (model(x) - folded(x)).abs().max().item()
            for _ in range(3):
                model(x), folded(x)
            for _ in range(2):
                base, fused = [], []
                for _ in range(args.repeats):
                    base.append(_ms(model, x))
                    fused.append(_ms(folded, x))
                b, f = statistics.median(base), statistics.median(fused)
                cells.append(f"{b:.1f} / {f:.1f}")
                ratios.append(f"{b / f:.2f}")
        left = sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in folded.modules())
        print(f"| {name} | {' ; '.join(cells)} | {' / '.join(ratios)} | {left} | {diff:.1e} |")


if __name__ == "__main__":
    main()
