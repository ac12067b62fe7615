"""Training throughput: ``archspec.train.fit`` (what ``archspec train`` runs) against timm's own training loop on
the same model, the same images and the same optimisation, side by side in one process, each run ``--repeats``
times (default 2, in ABBA order).

timm's ``train.py`` is not in the timm wheel, so "timm's loop" here is its ``train_one_epoch`` written out with
timm's own parts: ``create_dataset`` + ``create_loader`` (timm's transforms and DataLoader),
``create_optimizer_v2``, ``create_scheduler_v2`` stepped per update, ``LabelSmoothingCrossEntropy``,
``zero_grad / backward / step`` -- no prefetcher, as on CPU.  Both loops train the archspec model of SPEC
(same initial weights) on a generated ImageFolder of PNG files (``train/``, ``val/``) at the spec's input size,
``--steps`` AdamW steps of ``--batch`` images with ``--workers`` loader processes, and evaluate the same
validation images once at the end; a run is timed end to end (loader start-up and that evaluation included),
after one untimed 3-step run of each loop.  ``--epochs N`` makes the images cover the run in N epochs (default 1:
one epoch covers it), so that what each loop does at an epoch's end shows.

``--device cuda``: both loops in bf16 autocast, as timm's ``train.py --amp --amp-dtype bfloat16`` runs on a GPU:
timm's loader with its CUDA prefetcher (normalisation on the device; ``train.py``'s default), archspec's with
pinned memory and non-blocking copies.

    python bench/train_throughput.py [--spec levit_128s] [--steps 30] [--batch 16] [--workers 2] [--threads 2]
    python bench/train_throughput.py --device cuda --batch 256 --workers 8

Writes ``bench/train_throughput.json`` and ``.md`` (images/s per run, and the ratio archspec / timm).

``--worker-cost N`` times instead what one loader worker does per image, in this process and on one thread: N
training images through archspec's ``SeededSamples`` (per-sample seeding + timm's transform to ``uint8``) and
``default_collate``, against timm's dataset with the same transform (as ``create_loader(use_prefetcher=True)``
builds it) and ``fast_collate``, in batches of ``--batch``, ABAB for ``--repeats``; ms per image.

    python bench/train_throughput.py --worker-cost 512 --batch 256 --repeats 4

``--optimizer-cost N`` times N AdamW steps on the spec's parameters: timm's default (torch's ``foreach`` kernel)
against the ``fused=True`` kernel ``archspec train`` uses, ABAB for ``--repeats``; ms per step.

    python bench/train_throughput.py --optimizer-cost 20 --repeats 4 --threads 2

``--profile``: each timed run under ``torch.profiler`` (CPU activity; CUDA too on a GPU), and the ops that take
the most self time on the main process written per loop to ``OUT.profile.md`` -- where a gap between the loops
sits (the DataLoader's ``__next__`` is the wait for the workers; ``cudaStreamSynchronize``/``copy_`` are the
device's).  The profiler costs time itself: read the rates of a profiled run only against each other.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent


def make_folder(root: Path, size: int, n_train: int, n_val: int, classes: int = 4) -> Path:
    """A seeded ImageFolder of RGB PNGs (``root/{train,val}/<class>/<i>.png``)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("val", n_val)):
        for i in range(n):
            folder = root / split / f"c{i % classes}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return root


def archspec_run(spec, root: Path, steps: int, batch: int, workers: int, device: str = "cpu") -> float:
    """Images/s of ``archspec.train.fit`` (recipe ``short`` for ``steps`` steps, one evaluation at the end)."""
    from archspec.train import fit, recipe

    config = replace(recipe("short", batch), epochs=None, warmup_epochs=None, steps=steps, warmup_steps=2,
                     eval_every=steps, workers=workers, device=device, amp="auto")
    start = time.perf_counter()
    fit(spec, root, config, progress=False)
    _sync(device)
    return steps * batch / (time.perf_counter() - start)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timm_run(spec, root: Path, steps: int, batch: int, workers: int, device: str = "cpu",
             prefetcher: bool | None = None) -> float:
    """Images/s of timm's ``train_one_epoch`` written out with timm's parts, on the archspec model of ``spec``;
    ``prefetcher``: timm's ``PrefetchLoader`` (``uint8`` batches normalised in the main process / on the device;
    ``train.py``'s default on every device unless ``--no-prefetcher``); ``None``: on CUDA only."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_dataset, create_loader
    from timm.loss import LabelSmoothingCrossEntropy
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2

    import archspec

    start = time.perf_counter()
    cuda = device == "cuda"
    model = archspec.compile(spec).to(device)
    size = tuple(spec.input.resolution)
    loaders = {}
    for split, training in (("train", True), ("val", False)):
        dataset = create_dataset("", root=str(root), split=split, is_training=training)
        loaders[split] = create_loader(dataset, input_size=(3, *size), batch_size=batch, is_training=training,
                                       use_prefetcher=cuda if prefetcher is None else prefetcher,
                                       num_workers=workers, interpolation="bicubic",
                                       mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD, crop_pct=0.875,
                                       device=torch.device(device))
    autocast = partial(torch.autocast, device_type=device, dtype=torch.bfloat16, enabled=cuda)
    optimizer = create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05)
    scheduler, _ = create_scheduler_v2(optimizer, sched="cosine", num_epochs=steps - 2, warmup_epochs=2,
                                       warmup_prefix=True, warmup_lr=1e-6, min_lr=1e-5, updates_per_epoch=1,
                                       step_on_epochs=False)
    loss_fn, updates = LabelSmoothingCrossEntropy(0.1), 0
    model.train()
    while updates < steps:
        for x, y in loaders["train"]:
            x, y = x.to(device), y.to(device)  # a no-op under the prefetcher
            with autocast():
                loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            updates += 1
            scheduler.step_update(num_updates=updates)
            if updates == steps:
                break
    model.eval()
    with torch.no_grad(), autocast():
        correct = sum((model(x.to(device)).argmax(1) == y.to(device)).sum().item() for x, y in loaders["val"])
    assert correct >= 0
    _sync(device)
    return steps * batch / (time.perf_counter() - start)


def worker_cost(root: Path, size: tuple[int, int], n: int, batch: int, repeats: int) -> list[dict]:
    """ms per image of a loader worker's work: archspec's seeded samples + default_collate vs timm's dataset +
    fast_collate, same timm transform (``uint8`` output), ABAB order."""
    from timm.data import create_dataset
    from timm.data.loader import fast_collate
    from torch.utils.data import default_collate
    from torchvision.datasets import ImageFolder

    from archspec.train.batches import SeededSamples
    from archspec.train.config import recipe
    from archspec.train.streamed_data import make_transforms

    train_tf, _ = make_transforms(3, size, recipe("short", batch))
    ours = SeededSamples(ImageFolder(str(root / "train")), train_tf, seed=0)
    theirs = create_dataset("", root=str(root), split="train", is_training=True)
    theirs.transform = train_tf.transform  # timm's own transform, without archspec's mode wrapper
    n = min(n, len(ours))

    def run_ours() -> None:
        for start in range(0, n, batch):
            default_collate([ours[(0, i)] for i in range(start, min(start + batch, n))])

    def run_theirs() -> None:
        for start in range(0, n, batch):
            fast_collate([theirs[i] for i in range(start, min(start + batch, n))])

    rows = []
    for repeat in range(repeats):
        for name, fn in (("archspec worker", run_ours), ("timm worker", run_theirs)):
            t = time.perf_counter()
            fn()
            ms = 1e3 * (time.perf_counter() - t) / n
            rows.append({"loop": name, "repeat": repeat + 1, "ms_per_image": round(ms, 4)})
            print(rows[-1], flush=True)
    return rows


def optimizer_cost(model: torch.nn.Module, steps: int, repeats: int) -> list[dict]:
    """ms per AdamW step on ``model``'s parameters (random gradients): timm ``create_optimizer_v2("adamw")`` as
    timm's ``train.py`` builds it (torch's ``foreach`` kernel) against the same with ``fused=True`` (what
    ``archspec train`` builds), ABAB order, after 3 untimed steps of each."""
    from timm.optim import create_optimizer_v2

    for p in model.parameters():
        p.grad = torch.randn_like(p)
    optimizers = {kind: create_optimizer_v2(model, opt="adamw", lr=1e-3, weight_decay=0.05, **kwargs)
                  for kind, kwargs in (("timm (foreach)", {}), ("archspec (fused)", {"fused": True}))}
    for optimizer in optimizers.values():
        for _ in range(3):
            optimizer.step()
    rows = []
    for repeat in range(repeats):
        for kind, optimizer in (optimizers.items() if repeat % 2 == 0 else list(optimizers.items())[::-1]):
            t = time.perf_counter()
            for _ in range(steps):
                optimizer.step()
            rows.append({"optimizer": kind, "repeat": repeat + 1,
                         "ms_per_step": round(1e3 * (time.perf_counter() - t) / steps, 3)})
            print(rows[-1], flush=True)
    return rows


@contextmanager
def _profiled(enabled: bool, device: str):
    """``torch.profiler.profile`` over the block when ``enabled`` (CPU activity, plus CUDA on a GPU), else ``None``."""
    if not enabled:
        yield None
        return
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        yield prof


def _top_ops(prof, device: str, rows: int = 15) -> str:
    """The profile's ops by main-process self CPU time (and self CUDA time on a GPU), as a text table."""
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    if device == "cuda":
        table += "\n" + prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows)
    return table


def _unpinned_loader() -> None:
    """archspec's streamed batches from a ``DataLoader`` that never pins (``pin_memory=False`` whatever the device):
    the loop's copy to the GPU then reads pageable memory, with no pin-memory thread beside the training loop."""
    import archspec.train.batches as batches

    pinned = batches.DataLoader
    batches.DataLoader = partial(_without_pin, pinned)


def _without_pin(loader_class, *args, **kwargs):
    return loader_class(*args, **{**kwargs, "pin_memory": False})


def _cpu_seconds(after: tuple[float, float] | None = None) -> tuple[float, float]:
    """User + system CPU seconds of this process and of its reaped children (the loader workers, joined when a
    run's DataLoader iterator is collected), or their increase since ``after``.  Unlike images/s, CPU time does not
    count the time a VM's other tenants take (steal), so it compares the two loops' work where wall time is noisy;
    the main process's count includes its threads' spinning, which both loops share."""
    import gc
    import resource

    gc.collect()  # collect a finished run's loader iterator so that its workers are joined (and counted)
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    now = (own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime)
    return now if after is None else (now[0] - after[0], now[1] - after[1])


def _pair_ratios(rows: list[dict], field: str) -> list[float]:
    """archspec / timm of ``field`` within each repeat (ABBA pairs: the two runs next to each other in time)."""
    by_repeat: dict[int, dict[str, float]] = {}
    for r in rows:
        by_repeat.setdefault(r["repeat"], {})[r["loop"]] = r[field]
    return [v["archspec train"] / v["timm train_one_epoch"] for _, v in sorted(by_repeat.items())]


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else platform.processor() or platform.machine()


def _timm_version() -> str:
    import timm

    return timm.__version__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default="levit_128s")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1, help="the images cover the run in this many epochs")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", default=str(HERE / "train_throughput"))
    parser.add_argument("--profile", action="store_true", help="profile each timed run (torch.profiler)")
    parser.add_argument("--archspec-no-pin", action="store_true",
                        help="a hypothesis test for issue 38 (bench only): archspec's training DataLoader without "
                             "pinned memory on CUDA -- no pin-memory thread in the main process, as timm's loader "
                             "runs by default (train.py's --pin-mem is off)")
    parser.add_argument("--timm-prefetcher", action="store_true",
                        help="timm's loop with its PrefetchLoader on CPU too (train.py's default on every device; "
                             "without this flag: on CUDA only, as the earlier CPU figures were measured)")
    parser.add_argument("--worker-cost", type=int, default=None, metavar="N",
                        help="time a loader worker's per-image work on N images instead (one thread)")
    parser.add_argument("--optimizer-cost", type=int, default=None, metavar="N",
                        help="time N AdamW steps on the spec's parameters instead, foreach against fused "
                             "(--threads threads)")
    args = parser.parse_args()
    import archspec

    if args.optimizer_cost:
        torch.set_num_threads(args.threads)
        rows = optimizer_cost(archspec.compile(args.spec), args.optimizer_cost, args.repeats)
        mean = {k: np.mean([r["ms_per_step"] for r in rows if r["optimizer"] == k]) for k in
                ("archspec (fused)", "timm (foreach)")}
        print(f"ratio fused / foreach ms per step: {mean['archspec (fused)'] / mean['timm (foreach)']:.3f}")
        return
    if args.worker_cost:
        torch.set_num_threads(1)
        spec = archspec.load_spec(args.spec)
        with tempfile.TemporaryDirectory(prefix="archspec-bench-") as tmp:
            root = make_folder(Path(tmp), spec.input.resolution[0], args.worker_cost, n_val=4)
            rows = worker_cost(root, tuple(spec.input.resolution), args.worker_cost, args.batch, args.repeats)
        mean = {k: np.mean([r["ms_per_image"] for r in rows if r["loop"] == k]) for k in ("archspec worker",
                                                                                          "timm worker")}
        print(f"ratio archspec / timm ms per image: {mean['archspec worker'] / mean['timm worker']:.3f}")
        return
    torch.set_num_threads(args.threads)
    if args.archspec_no_pin:
        _unpinned_loader()
    spec = archspec.load_spec(args.spec)
    # --epochs 1: one epoch covers the run; N: N epochs of steps // N batches each (the last partial one dropped)
    n_train = args.batch * (args.steps // args.epochs) + (args.batch if args.epochs == 1 else args.batch // 2)
    rows = []
    with tempfile.TemporaryDirectory(prefix="archspec-bench-") as tmp:
        root = make_folder(Path(tmp), spec.input.resolution[0], n_train, n_val=2 * args.batch)
        spec = archspec.load_spec({**spec.model_dump(mode="json"), "head": {**spec.model_dump(mode="json")["head"],
                                                                             "num_classes": 4}})
        # untimed warm-up: the first run in a process pays one-off costs (library loading, allocator growth): 8 vs
        # 38 img/s
        timm_loop = partial(timm_run, prefetcher=True if args.timm_prefetcher else None)
        for run in (archspec_run, timm_loop):
            run(spec, root, 3, args.batch, args.workers, args.device)
        loops = [("archspec train", archspec_run), ("timm train_one_epoch", timm_loop)]
        profiles: dict[str, list[str]] = {}
        for repeat in range(args.repeats):  # ABBA order: a drift of the machine's speed falls on both loops
            for name, run in (loops if repeat % 2 == 0 else loops[::-1]):
                before = _cpu_seconds()
                with _profiled(args.profile, args.device) as prof:
                    rate = run(spec, root, args.steps, args.batch, args.workers, args.device)
                cpu = _cpu_seconds(after=before)
                if prof is not None:
                    profiles.setdefault(name, []).append(_top_ops(prof, args.device))
                rows.append({"loop": name, "repeat": repeat + 1, "images_per_s": round(rate, 2),
                             "cpu_s_main": round(cpu[0], 2), "cpu_s_workers": round(cpu[1], 2)})
                print(rows[-1], flush=True)
    mean = {name: np.mean([r["images_per_s"] for r in rows if r["loop"] == name]) for name in
            ("archspec train", "timm train_one_epoch")}
    ratio = mean["archspec train"] / mean["timm train_one_epoch"]
    pairs = _pair_ratios(rows, "images_per_s")
    cpu_ratio = float(np.mean([r["cpu_s_main"] + r["cpu_s_workers"] for r in rows if r["loop"] != "archspec train"])
                      / np.mean([r["cpu_s_main"] + r["cpu_s_workers"] for r in rows if r["loop"] == "archspec train"]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=HERE).stdout.strip()
    result = {"spec": args.spec, "steps": args.steps, "batch": args.batch, "workers": args.workers,
              "threads": args.threads, "epochs": args.epochs, "device": _device_name(args.device),
              "timm_prefetcher": bool(args.timm_prefetcher or args.device == "cuda"),
              "archspec_pinned": args.device == "cuda" and not args.archspec_no_pin,
              "timm": _timm_version(), "rows": rows, "ratio_archspec_over_timm": round(float(ratio), 3),
              "pair_ratios": [round(r, 3) for r in pairs], "cpu_ratio_timm_over_archspec": round(cpu_ratio, 3),
              "torch": torch.__version__, "commit": commit, "machine": platform.processor() or platform.machine()}
    Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = ["| loop | run | images/s | CPU s (main) | CPU s (workers) |", "|---|---|---|---|---|"]
    lines += [f"| {r['loop']} | {r['repeat']} | {r['images_per_s']} | {r['cpu_s_main']} | {r['cpu_s_workers']} |"
              for r in rows]
    lines.append(f"\nratio archspec / timm (mean of runs): {ratio:.3f}; pair ratios "
                 f"{', '.join(f'{r:.3f}' for r in pairs)} (median {np.median(pairs):.3f}); "
                 f"CPU seconds timm / archspec: {cpu_ratio:.3f}")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    if profiles:
        text = [f"## {name}, run {i + 1}\n\n```\n{t}\n```\n" for name, ts in profiles.items() for i, t in enumerate(ts)]
        Path(args.out + ".profile.md").write_text("\n".join(text))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
