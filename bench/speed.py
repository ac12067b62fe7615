"""Speed ratios measured side by side in one run: archspec vs timm, masked vs unmasked MaiT, one masked layer.

    OMP_NUM_THREADS=1 python bench/speed.py [--part timm masks kernel] [--quick] [--compile] [--device cpu|cuda]
                                            [--models ...] [--clock wall|thread]

Parts (each prints a Markdown table; every case is measured twice, interleaved A B A B, so the noise shows):

* ``timm``: every timm-parity model (same weights via :mod:`archspec.timm_bridge.convert`), forward images/s ratio
  archspec / timm, at the spec's input size (224 px, 256 for ``botnet26t`` / ``halonet26t`` / ``mobilevit_xxs``, timm
  ByobNets whose weights convert though their fresh classifier init differs: :data:`BYOB_TWINS`); LeViT also folded
  (``model.fuse()``, BatchNorm into the linears, LeViT sec. 5.3).
* ``masks``: ``mait_tiny_sch2`` vs the same model with every mask removed (same weights), at 224/384/512 px:
  forward and training step (forward + backward of the cross-entropy), ratio unmasked time / masked time
  (> 1 = the masked model is faster), and peak memory: on CUDA ``max_memory_allocated``; on CPU the bytes the
  training step saves for backward (``saved_tensors_hooks``), the part of the peak that the masks change.
  Each step also gets a *ceiling* row: the masked model with its hard-masked heads' attention skipped (their
  values passed through, zero cost; :func:`zero_cost_masked_heads`), against the unmasked model.  In eager mode
  no kernel for the masked heads can make the masked model faster than that: it bounds the achievable ratio
  (Amdahl).  Compiled models are not bounded by it (Inductor also speeds up the rest), so compiled steps get none.
* ``kernel``: one attention layer whose 3 heads (64 dims) are all hard 3x3 masks at 1025 tokens (32x32 grid +
  class token), linear-time path vs the dense reference (``attn_impl='dense'``), forward and forward+backward.

CPU protocol: batch 1, one thread (LeViT's).  CUDA: bf16 autocast, batch 256 at 224 px, 64 at 384, 32 at 512.
Times are medians of 7 interleaved ``torch.utils.benchmark.Timer.timeit`` samples per round; only the ratios
mean something on a shared machine.  ``--clock thread`` (CPU, ``timm`` part) times each sample by the calling
thread's CPU time (``time.thread_time``) instead of the wall clock: with one torch thread that is the time the model
ran, whatever share of the cores other jobs on a loaded machine take.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import time
from types import SimpleNamespace

import timm
import torch
import torch.nn.functional as F
from torch.utils.benchmark import Timer

import archspec
from archspec.families.attention.module import Attention
from archspec.ir.checked import load_spec
from archspec.timm_bridge.convert import TIMM_EQUIVALENTS, load_timm_weights

PARITY = ["deit_tiny", "convit_tiny", "levit_128s", "levit_256"]
#: shipped specs with a timm twin outside TIMM_EQUIVALENTS (timm ByobNet's fresh head init is not archspec's)
BYOB_TWINS = {"botnet26t": "botnet26t_256", "halonet26t": "halonet26t", "mobilevit_xxs": "mobilevit_xxs"}
GPU_BATCH = {224: 256, 384: 64, 512: 32}


def _timer(fn, device: torch.device) -> Timer:
    return Timer("fn()", globals={"fn": fn}, num_threads=1 if device.type == "cpu" else torch.get_num_threads())


def _autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def _forward(model, x, device):
    def run():
        with torch.inference_mode(), _autocast(device):
            model(x)
    return run


def _train_step(model, x, device):
    target = torch.zeros(x.shape[0], dtype=torch.long, device=device)

    def run():
        with _autocast(device):
            out = model(x)
            out = out[0] if isinstance(out, tuple) else out
            loss = F.cross_entropy(out.float(), target)
        loss.backward()
        model.zero_grad(set_to_none=True)
    return run


class _ThreadClock:
    """``Timer``'s ``timeit(number).median`` by the calling thread's CPU time (one torch thread on CPU)."""

    def __init__(self, fn) -> None:
        self.fn = fn

    def timeit(self, number: int) -> SimpleNamespace:
        start = time.thread_time()
        for _ in range(number):
            self.fn()
        return SimpleNamespace(median=(time.thread_time() - start) / number)


def _pair(fn_a, fn_b, device, min_time: float, clock: str = "wall") -> list[tuple[float, float]]:
    """Two rounds ``[(a_s, b_s), (a_s, b_s)]``; in each, ``a`` and ``b`` alternate 7 times and the medians are kept,
    so drift on a shared machine hits both alike.  ``min_time`` seconds per case and round; ``clock`` ``thread``
    times by the thread's CPU time."""
    make = _ThreadClock if clock == "thread" else (lambda fn: _timer(fn, device))
    timers = [make(fn_a), make(fn_b)]
    once = [t.timeit(1).median for t in timers]  # warm-up, and the call count per sample
    numbers = [max(1, round(min_time / 7 / max(t, 1e-6))) for t in once]
    rounds = []
    for _ in range(2):
        samples = ([], [])
        for _ in range(7):
            for i in (0, 1):
                samples[i].append(timers[i].timeit(numbers[i]).median)
        rounds.append((statistics.median(samples[0]), statistics.median(samples[1])))
    return rounds


def _fmt(rounds: list[tuple[float, float]], batch: int) -> tuple[str, str]:
    """('a ms / b ms' of both rounds, 'b/a ratio of both rounds')."""
    ms = " ; ".join(f"{a * 1e3:.1f} / {b * 1e3:.1f}" for a, b in rounds)
    return ms, " / ".join(f"{b / a:.2f}" for a, b in rounds)


def op_shares(model, x, runs: int = 30) -> dict[str, float]:
    """Share of ``model``'s self CPU time (``torch.profiler``, ``runs`` inference forwards after 5 warm-up) in
    BatchNorm ops and in GEMMs and convolutions (``mm``, ``addmm``, ``bmm``, ``mkldnn_convolution``): fractions."""
    from torch.profiler import profile

    with torch.inference_mode():
        for _ in range(5):
            model(x)
        with profile() as prof:
            for _ in range(runs):
                model(x)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    gemm = ("aten::mm", "aten::addmm", "aten::bmm", "aten::mkldnn_convolution")
    return {"batch_norm": sum(e.self_cpu_time_total for e in events if "batch_norm" in e.key) / total,
            "gemm_conv": sum(e.self_cpu_time_total for e in events if e.key in gemm) / total}


def bench_timm(device: torch.device, min_time: float, models: list[str], clock: str = "wall") -> None:
    """archspec vs timm, forward throughput ratio (archspec images/s / timm images/s), same weights."""
    batch = 1 if device.type == "cpu" else GPU_BATCH[224]
    print(f"\n### archspec vs timm, forward, batch {batch}, {device.type}, {clock} clock\n")
    print("| model | archspec ms / timm ms (2 rounds) | throughput ratio archspec / timm |")
    print("|---|---|---|")
    shares = []
    for name in models:
        x = torch.randn(batch, 3, *load_spec(name).input.resolution, device=device)
        reference = timm.create_model({**TIMM_EQUIVALENTS, **BYOB_TWINS}[name], pretrained=False).eval()
        ours = load_timm_weights(archspec.compile(name), reference).eval().to(device)
        reference.to(device)
        variants = [(name, ours)]
        if name.startswith("levit"):
            variants.append((f"{name} folded", ours.fuse()))
        for label, model in variants:
            rounds = _pair(_forward(model, x, device), _forward(reference, x, device), device, min_time, clock)
            ms, ratio = _fmt(rounds, batch)
            print(f"| {label} | {ms} | {ratio} |", flush=True)
        if name.startswith("levit") and device.type == "cpu":
            shares.append((name, op_shares(reference, x)))
    for name, share in shares:
        print(f"\ntimm {name}: BatchNorm {share['batch_norm']:.1%}, GEMMs and convolutions {share['gemm_conv']:.1%} "
              f"of self CPU time (torch.profiler, 30 forwards)", flush=True)


def _unmasked_spec(spec: dict) -> dict:
    """The same architecture with every head global (hard masks have no parameters: weights carry over)."""
    plain = copy.deepcopy(spec)
    for stage in plain["stages"]:
        stage.pop("layers", None)
        stage["attention"] = "mhsa"
    return plain


@contextlib.contextmanager
def zero_cost_masked_heads():
    """While active, every hard-masked head group (the ``window`` and ``hard`` paths of
    :meth:`Attention._group_forward`) returns its values ``v`` ``(B, h, N, v_dim)`` instead of attending: no logits,
    no softmax, no weighted sum.  The rest of the model (projections, global heads' SDPA, MLPs) is unchanged, so
    its time is the masked model's time with masked heads for free -- the eager ceiling of ``unmasked / masked``.
    The outputs are meaningless; only timings are taken under it.  Bench-only: patches the class for the block."""
    original = Attention._group_forward

    def group_forward(self, key, heads, q, k, v):
        return v if key[0] in ("window", "hard") else original(self, key, heads, q, k, v)

    Attention._group_forward = group_forward
    try:
        yield
    finally:
        Attention._group_forward = original


def _at_zero_cost(fn):
    def run():
        with zero_cost_masked_heads():
            fn()
    return run


def _saved_bytes(model, x, device) -> int:
    """Bytes autograd holds for backward when a training step's forward ends (its activation memory): every
    storage saved during the forward, each counted once (views share storage).  Tensors a backward pass
    recomputes and drops again are not held across the step, so the backward runs outside the hooks."""
    storages: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    target = torch.zeros(x.shape[0], dtype=torch.long, device=device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), _autocast(device):
        out = model(x)
        loss = F.cross_entropy((out[0] if isinstance(out, tuple) else out).float(), target)
    loss.backward()
    model.zero_grad(set_to_none=True)
    return sum(storages.values())


def _peak(model, x, fn, device) -> int:
    """CUDA: ``max_memory_allocated`` of ``fn()``; CPU: :func:`_saved_bytes` of a training step."""
    if device.type != "cuda":
        return _saved_bytes(model, x, device)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def bench_masks(device: torch.device, min_time: float, sizes: list[int], train: bool, compiled: bool = False) -> None:
    """mait_tiny_sch2 vs the same model without masks (same weights): ratio unmasked time / masked time.

    ``compiled``: also a forward row (and with ``train`` a training-step row) with both models under
    ``torch.compile(fullgraph=True)`` (Inductor fuses the linear-time hard-mask path; compiling costs one to a few
    minutes per model, size and step on 2 cores)."""
    base = load_spec("mait_tiny_sch2").model_dump(mode="json", exclude_none=True)
    memory = "peak CUDA memory MiB" if device.type == "cuda" else "saved-for-backward MiB"
    print(f"\n### mait_tiny_sch2 masked vs unmasked (same weights), {device.type}\n")
    print(f"| px | tokens | batch | step | masked ms / unmasked ms (2 rounds) | speed ratio masked / unmasked "
          f"| {memory} masked / unmasked |")
    print("|---|---|---|---|---|---|---|")
    for px in sizes:
        spec = copy.deepcopy(base)
        spec["input"]["resolution"] = px
        batch = 1 if device.type == "cpu" else GPU_BATCH[px]
        masked = archspec.compile(spec).to(device)
        plain = archspec.compile(_unmasked_spec(spec)).to(device)
        plain.load_state_dict(masked.state_dict())
        x = torch.randn(batch, 3, px, px, device=device)
        steps = [("forward", _forward)] + ([("train", _train_step)] if train else [])
        steps += [("forward, torch.compile", _forward)] if compiled else []
        steps += [("train, torch.compile", _train_step)] if compiled and train else []
        for step, make in steps:
            for m in (masked, plain):
                m.train(step.startswith("train"))
            if step.endswith("torch.compile"):
                fn_m, fn_p = (make(torch.compile(m, fullgraph=True), x, device) for m in (masked, plain))
            else:
                fn_m, fn_p = make(masked, x, device), make(plain, x, device)
            rounds = _pair(fn_m, fn_p, device, min_time)
            ms, ratio = _fmt(rounds, batch)
            mem = (f"{_peak(masked, x, fn_m, device) / 2**20:.1f} / {_peak(plain, x, fn_p, device) / 2**20:.1f}"
                   if step == "train" or device.type == "cuda" else "-")
            print(f"| {px} | {(px // 16) ** 2 + 1} | {batch} | {step} | {ms} | {ratio} | {mem} |", flush=True)
            if not step.endswith("torch.compile"):  # the ceiling: masked heads at zero cost, same run
                ms, ratio = _fmt(_pair(_at_zero_cost(fn_m), fn_p, device, min_time), batch)
                print(f"| {px} | {(px // 16) ** 2 + 1} | {batch} | {step}, ceiling (masked heads at zero cost) "
                      f"| {ms} | {ratio} | - |", flush=True)


def bench_kernel(device: torch.device, min_time: float, train: bool) -> None:
    """One attention layer, all 3 heads hard 3x3, 32x32 grid + class token: linear-time vs dense reference."""
    fast = Attention(192, ["mask:3x3"] * 3, (32, 32), num_prefix_tokens=1).to(device)
    dense = copy.deepcopy(fast).set_attn_impl("dense")
    fast.set_attn_impl("fast")
    x = torch.randn(1 if device.type == "cpu" else 32, 1025, 192, device=device)
    print(f"\n### one all-hard-masked attention layer, 1025 tokens, batch {x.shape[0]}, {device.type}\n")
    print("| step | linear-time ms / dense ms (2 rounds) | speed ratio linear / dense |")
    print("|---|---|---|")
    steps = [("forward", lambda m: _forward(m, x, device))]
    if train:
        xg = x.clone().requires_grad_()
        fast.train(), dense.train()
        steps.append(("forward+backward", lambda m: (lambda: m(xg).sum().backward())))
    for step, make in steps:
        ms, ratio = _fmt(_pair(make(fast), make(dense), device, min_time), x.shape[0])
        print(f"| {step} | {ms} | {ratio} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", nargs="*", default=["kernel", "timm", "masks"], choices=["kernel", "timm", "masks"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true",
                        help="shorter timings (0.5 s per case and round instead of 2 s)")
    parser.add_argument("--sizes", nargs="*", type=int, default=[224, 384, 512])
    parser.add_argument("--models", nargs="*", default=PARITY)
    parser.add_argument("--no-train", action="store_true", help="skip the training-step rows")
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall",
                        help="timm part on CPU: time by the wall clock, or by this thread's CPU time (loaded machines)")
    parser.add_argument("--compile", action="store_true",
                        help="masks part: add forward (and training-step) rows with both models under torch.compile "
                             "(minutes per size)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    min_time = 0.5 if args.quick else 2.0
    print(f"torch {torch.__version__}, timm {timm.__version__}, device {device}, "
          f"{'one thread' if device.type == 'cpu' else 'bf16 autocast'}")
    torch.manual_seed(0)
    if "kernel" in args.part:
        bench_kernel(device, min_time, not args.no_train)
    if "timm" in args.part:
        bench_timm(device, min_time, args.models, args.clock if device.type == "cpu" else "wall")
    if "masks" in args.part:
        bench_masks(device, min_time, args.sizes, not args.no_train, args.compile)


if __name__ == "__main__":
    main()
