"""Swin through the deployment paths: int8, ONNX Runtime and torch.compile against the eager float32 model.

    python bench/swin_deploy.py [--spec swin_tiny_patch4_window7_224] [--size 224] [--no-compile] [--threads 1]

The spec's model (archspec's seeded initialisation; no trained weights are published) on the three real photos
(grace_hopper, china, flower) at ``--size`` px:

* int8: :func:`archspec.quantize` (PT2E; linears int8, the window attention's products and softmax in float32),
  calibrated on the photos and their flipped and shifted copies, the reference graph (not compiled);
* ONNX: ``torch.onnx.export`` (dynamic batch) run in ONNX Runtime (one thread);
* compiled: ``torch.compile`` (Inductor, CPU) of the float32 model.

For each: whether every photo keeps its top-1 class, and the largest absolute logit difference to eager (with the
largest logit, for scale).  Prints Markdown.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

import archspec
from archspec.deploy.int8 import quantize
from archspec.deploy.onnx_export import export_onnx, ort_session, run_onnx
from archspec.io.images import sample_batch


def _row(name: str, got: torch.Tensor, eager: torch.Tensor, seconds: float) -> str:
    same = (got.argmax(1) == eager.argmax(1)).tolist()
    return (f"| {name} | {sum(same)}/{len(same)} | {(got - eager).abs().max().item():.1e} | "
            f"{eager.abs().max().item():.2f} | {seconds:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default="swin_tiny_patch4_window7_224")
    parser.add_argument("--size", type=int, default=None, help="input size (default: the spec's)")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile (minutes on a small CPU)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = archspec.compile(args.spec, img_size=args.size).eval()
    size = tuple(model.spec.input.resolution)
    photos = sample_batch(size)
    calibration = torch.cat([photos, photos.flip(-1), photos.roll(size[1] // 8, -1), photos.roll(size[0] // 8, -2)])
    with torch.no_grad():
        eager = model(photos)
    print(f"{args.spec} at {size[0]}x{size[1]}, torch {torch.__version__}, {args.threads} thread(s), 3 photos\n")
    print("| path | top-1 kept | max abs logit diff | max abs logit | seconds (build + run) |")
    print("|---|---|---|---|---|")
    start = time.perf_counter()
    int8 = quantize(model, [calibration], torch_compile=False)
    with torch.no_grad():
        print(_row("int8 (PT2E, reference graph)", int8(photos), eager, time.perf_counter() - start), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        path = Path(tmp) / "model.onnx"
        export_onnx(model, path, photos[:2], {"spec": args.spec})
        print(_row("ONNX Runtime (float32)", run_onnx(ort_session(path, threads=args.threads), photos), eager,
                   time.perf_counter() - start), flush=True)
    if not args.no_compile:
        start = time.perf_counter()
        with torch.no_grad():
            compiled = torch.compile(model)(photos)
        print(_row("torch.compile (Inductor)", compiled, eager, time.perf_counter() - start), flush=True)


if __name__ == "__main__":
    main()
