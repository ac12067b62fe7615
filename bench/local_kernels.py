"""The local kernels against dense masked SDPA giving the same output (issue 81 item 6): CPU, one thread, batch 1.

    OMP_NUM_THREADS=1 taskset -c 0 python bench/local_kernels.py                 # the issue's cases, 2 rounds
    python bench/local_kernels.py --quick                                       # smoke run (numbers meaningless)
    OMP_NUM_THREADS=1 python bench/local_kernels.py --tiles 4 7 8 14 --only na  # the neighbourhood tile size
    OMP_NUM_THREADS=1 python bench/local_kernels.py --crossover                 # where the tiled kernel pays
    OMP_NUM_THREADS=1 taskset -c 0 python bench/local_kernels.py --models nat_mini dinat_mini  # whole models

Cases (``archspec/families/attention/local_kernels.py``):

* ``na``: :func:`neighborhood_attention` at a 56x56 grid, kernel 7, 2 heads of dim 32 (NAT-Mini's first stage:
  dim 64, 2 heads), with NAT's relative position bias; ``na_nobias``: the same without bias, where the dense
  side is SDPA with a boolean mask (its cheapest form); ``dina8``: DiNAT-Mini's dilated first-stage layer
  (dilation 8).
* ``window``: :func:`window_attention` at 56x56, window 7, shift 3 (Swin-T's first stage: 3 heads of dim 32),
  with its bias table.

The dense side is :func:`dense_local_attention` -- SDPA over the 3136 x 3136 pairs with the float mask (bias where
attended, ``-inf`` elsewhere) built from the precomputed index tables, the bias gathered from the learned table
inside the timed region (it is a parameter: a training step differentiates through it).  Forward runs under
``torch.no_grad``; forward+backward sums the output and differentiates q, k, v and the table.  Each round times
every case dense then fast, alternating, median of ``--reps`` calls each; two rounds by default so the noise shows.
Reports ms and the ratio dense / fast per round.

``--crossover`` times the neighbourhood kernel against the dense masked attention the generic path runs (the
explicit formula and SDPA with the ``(N, N)`` float mask, the faster of the two; the mask precomputed, as the layer
caches it in eval) on square grids of sides 7 to 28, kernels 3, 5, 7, dilations 1 and 2, 2 heads of 32, forward:
the measurement behind ``kinds/neighborhood.py``'s ``tiled_path_pays``.

``--models`` times whole shipped models' forward at their own resolution on a real photograph, the default paths
(``attn_impl='auto'``: the tiled kernel where it pays) against the dense reference (``attn_impl='dense'``: every
neighbourhood layer one SDPA call with the ``(N, N)`` float mask, cached in eval as the model caches it), same
weights, alternating, median of ``--reps`` calls per round.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch

from archspec.families.attention import local_kernels as lk
from archspec.families.attention.local_rules import NA_TILE, resolve_window

# name -> (grid, kind, size, dilation or shift, heads, head dim, bias)
CASES = {
    "na": ((56, 56), "neighborhood", 7, 1, 2, 32, True),
    "na_nobias": ((56, 56), "neighborhood", 7, 1, 2, 32, False),
    "dina8": ((56, 56), "neighborhood", 7, 8, 2, 32, True),
    "window": ((56, 56), "window", 7, 3, 3, 32, True),
}
QUICK = {name: ((14, 14), kind, 3, 1, 2, 8, bias) for name, (_, kind, _, _, _, _, bias) in CASES.items()}


def _inputs(grid, kind, size, extra, heads, dim, bias):
    """q, k, v and the bias table (timm's ``(T, heads)`` for a window, Hugging Face's ``(heads, 2k-1, 2k-1)``)."""
    gen = torch.Generator().manual_seed(0)
    n = grid[0] * grid[1]
    tensors = [torch.randn(1, heads, n, dim, generator=gen) for _ in range(3)]
    if not bias:
        return tensors + [None]
    if kind == "window":
        win, _ = resolve_window(grid, size, extra)
        return tensors + [torch.randn((2 * win[0] - 1) * (2 * win[1] - 1), heads, generator=gen) * 0.1]
    return tensors + [torch.randn(heads, 2 * size - 1, 2 * size - 1, generator=gen) * 0.1]


def _paths(grid, kind, size, extra, heads, tile) -> tuple[Callable, Callable]:
    """(dense, fast) functions of (q, k, v, table)."""
    if kind == "window":
        allowed, index = lk.swin_window_mask(grid, size, extra)

        def fast(q, k, v, table):
            return lk.window_attention(q, k, v, grid, size, extra, bias_table=table)

        def dense(q, k, v, table):  # timm's zero padding tokens are keys where the window does not divide the grid
            keys, values = lk.swin_padded_kv(k, v, grid, size, extra)
            return lk.dense_local_attention(q, keys, values, allowed, lk.relative_bias(table.t(), index))

        return dense, fast
    allowed, index = lk.neighborhood_mask(grid, size, extra)

    def fast(q, k, v, table):
        return lk.neighborhood_attention(q, k, v, grid, size, extra, rpb=table, tile=tile)

    def dense(q, k, v, table):
        if table is None:  # SDPA's boolean mask: no float mask to build
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return lk.dense_local_attention(q, k, v, allowed, lk.relative_bias(table.reshape(heads, -1), index))

    return dense, fast


def _time(fn: Callable, inputs: list, backward: bool, reps: int) -> float:
    """Median ms of ``reps`` calls (forward under no_grad, or forward + backward of the output's sum)."""
    times = []
    for _ in range(reps):
        leaves = [None if t is None else t.detach().clone().requires_grad_(backward) for t in inputs]
        start = time.perf_counter()
        if backward:
            fn(*leaves).sum().backward()
        else:
            with torch.no_grad():
                fn(*leaves)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run(cases: dict, rounds: int, reps: int, tile: int = NA_TILE) -> list[dict]:
    """Every case and mode, dense then fast, alternating, ``rounds`` times; one row per (round, case, mode)."""
    prepared = {}
    for name, (grid, kind, size, extra, heads, dim, bias) in cases.items():
        inputs = _inputs(grid, kind, size, extra, heads, dim, bias)
        dense, fast = _paths(grid, kind, size, extra, heads, tile)
        with torch.no_grad():  # the same output (and a warm-up of both)
            diff = (dense(*inputs) - fast(*inputs)).abs().max().item()
        prepared[name] = (inputs, dense, fast, diff)
    rows = []
    for round_ in range(rounds):
        for name, (inputs, dense, fast, diff) in prepared.items():
            for backward in (False, True):
                dense_ms = _time(dense, inputs, backward, reps)
                fast_ms = _time(fast, inputs, backward, reps)
                rows.append({"round": round_ + 1, "case": name, "mode": "fwd+bwd" if backward else "fwd",
                             "dense_ms": round(dense_ms, 2), "fast_ms": round(fast_ms, 2),
                             "ratio": round(dense_ms / fast_ms, 2), "max_abs_diff": diff})
                print(f"round {round_ + 1}  {name:10s} {rows[-1]['mode']:8s} dense {dense_ms:8.1f} ms  "
                      f"fast {fast_ms:7.1f} ms  dense/fast {dense_ms / fast_ms:6.2f}  (max |diff| {diff:.1e})",
                      flush=True)
    return rows


CROSSOVER_SIDES = (7, 8, 10, 12, 14, 16, 20, 24, 28)


def _crossover_forms(grid, kernel, dilation, heads, dim) -> dict[str, Callable]:
    """The tiled kernel and the two dense masked forms of the generic path, as functions of no argument."""
    q, k, v, table = _inputs(grid, "neighborhood", kernel, dilation, heads, dim, True)
    allowed, index = lk.neighborhood_mask(grid, kernel, dilation)
    mask = lk.relative_bias(table.reshape(heads, -1), index).masked_fill(~allowed, float("-inf"))
    return {
        "tiled": lambda: lk.neighborhood_attention(q, k, v, grid, kernel, dilation, rpb=table),
        "explicit": lambda: ((q @ k.transpose(-2, -1)) * dim ** -0.5 + mask).softmax(-1) @ v,
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask),
    }


def crossover(reps: int, sides: tuple[int, ...] = CROSSOVER_SIDES) -> list[dict]:
    """The neighbourhood kernel against the generic path's dense masked attention, forward, per grid side, kernel
    and dilation; one row each (ms, dense / tiled with the faster dense form)."""
    rows = []
    for kernel in (3, 5, 7):
        for dilation in (1, 2):
            for side in (s for s in sides if kernel * dilation <= s):
                forms = _crossover_forms((side, side), kernel, dilation, 2, 32)
                ms = {name: _time(lambda *_, fn=fn: fn(), [], False, reps) for name, fn in forms.items()}
                ratio = min(ms["explicit"], ms["sdpa"]) / ms["tiled"]
                rows.append({"kernel": kernel, "dilation": dilation, "side": side, "patches": side * side,
                             **{f"{name}_ms": round(t, 3) for name, t in ms.items()},
                             "dense_over_tiled": round(ratio, 2)})
                print(f"k {kernel} d {dilation} {side:2d}x{side:<2d} ({side * side:4d} patches)  "
                      f"tiled {ms['tiled']:7.3f} ms  explicit {ms['explicit']:7.3f}  sdpa {ms['sdpa']:7.3f}  "
                      f"dense/tiled {ratio:5.2f}", flush=True)
    return rows


def models(names: list[str], rounds: int, reps: int) -> list[dict]:
    """Whole models' forward, default paths against the dense reference, alternating; one row per (round, model)."""
    import archspec  # noqa: PLC0415 - the kernel cases need only the kernels
    from archspec.io.images import load_image  # noqa: PLC0415
    from archspec.nn.blocks import attention_impl  # noqa: PLC0415

    prepared = {}
    for name in names:
        torch.manual_seed(0)
        model = archspec.compile(name).eval()
        x = load_image(None, model.spec.input.resolution)
        with torch.no_grad(), attention_impl(model, "dense"):
            dense_logits = model(x)  # warm-up, and the caches the dense path keeps in eval
        with torch.no_grad():
            diff = (model(x) - dense_logits).abs().max().item()
        prepared[name] = (model, x, diff)
    rows = []
    for round_ in range(rounds):
        for name, (model, x, diff) in prepared.items():
            with attention_impl(model, "dense"):
                dense_ms = _time(model, [x], False, reps)
            fast_ms = _time(model, [x], False, reps)
            rows.append({"round": round_ + 1, "model": name, "dense_ms": round(dense_ms, 1),
                         "fast_ms": round(fast_ms, 1), "ratio": round(dense_ms / fast_ms, 2), "max_abs_diff": diff})
            print(f"round {round_ + 1}  {name:10s} forward  dense {dense_ms:8.1f} ms  default {fast_ms:7.1f} ms  "
                  f"dense/default {dense_ms / fast_ms:5.2f}  (max |logit diff| {diff:.1e})", flush=True)
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), help="cases to run (default: all)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tiles", type=int, nargs="+", help="run the cases once per neighbourhood tile size")
    parser.add_argument("--quick", action="store_true", help="14x14 grids, kernel/window 3, 1 round, 1 rep")
    parser.add_argument("--crossover", action="store_true", help="the neighbourhood kernel's crossover grid")
    parser.add_argument("--models", nargs="+", help="whole shipped models: default paths against the dense one")
    parser.add_argument("--out", help="write the rows as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.crossover:
        return crossover(1 if args.quick else 7, CROSSOVER_SIDES[:3] if args.quick else CROSSOVER_SIDES)
    if args.models:
        return models(args.models, 1 if args.quick else args.rounds, 1 if args.quick else args.reps)
    cases = QUICK if args.quick else CASES
    cases = {name: cases[name] for name in (args.only or cases)}
    rounds, reps = (1, 1) if args.quick else (args.rounds, args.reps)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} thread, batch 1, fp32")
    rows = []
    for tile in args.tiles or [NA_TILE]:
        if args.tiles:
            print(f"neighbourhood tile {tile}")
        rows += [dict(row, tile=tile) for row in run(cases, rounds, reps, tile)]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
