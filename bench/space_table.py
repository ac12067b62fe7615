"""Tabulate a finite design space: learning curves, TSE, zero-cost scores and counts for every point (issue 32).

    nice -n 19 python bench/space_table.py --resume                 # every point of levit_small, seeds 0, 1, 2
    nice -n 19 python bench/space_table.py --designs 24 --resume    # the first 24 designs only (the seed check)
    python bench/space_table.py --report                            # seed-to-seed Kendall tau of what is written
    python bench/space_table.py --latency --resume                  # CPU latency pass (nothing else running!)
    cp T.jsonl /tmp/b.jsonl; nice -n 19 python bench/space_table.py --out /tmp/b.jsonl --reverse --resume
    python bench/space_table.py --merge /tmp/b.jsonl                # a second core from the other end, merged

A NAS-benchmark table in the manner of NAS-Bench-201 / JAHS-Bench-201: each point of the space is trained once
per seed with one fixed protocol (the *reference*), and everything a search could ask of it is written down, so
that search methods can be compared on the table in seconds (``archspec search --oracle``).

The reference protocol (``PROTOCOL`` below; why these choices: docs/search-works.md):

* data: Fashion-MNIST from Debian's ``dataset-fashion-mnist`` at its own 28 px; a fixed, class-stratified subset
  of 2,000 of the 60,000 training images (seed 0) -- ConViT's sample-efficiency regime (sec. 4.2), where
  locality matters; the intermediate curve points are scored on a fixed 2,000-image subset of the 10,000 test
  images, the final point on all of them;
* training: archspec's one loop (:class:`archspec.train.loop.Trainer`, :func:`run_steps`): AdamW lr 2e-3, weight
  decay 0.05, batch 64, 30 epochs (938 steps), 47 linear warm-up steps then cosine to 0, random crop (pad 3) and
  flip, one torch thread; the seed sets the initial weights, the batch order and the augmentation;
* curve: val top-1 at steps 25, 50, 100, 200, 400, 800 and 938 (geometric, plus the end), the cumulative sum of
  the training losses at the same steps (TSE, Ru et al. 2021), and the per-step training seconds;
* zero-cost: SynFlow, NASWOT and grad-norm of the untrained model on one batch of 64 training images
  (:func:`archspec.search.proxy.score_proxy`, the search's zero-cost rung, at the design's own geometry).

Why this protocol (measured, docs/search-works.md): the first one tried -- 10,000 images, 4 epochs (625 steps) --
ranked 9 designs at a seed-to-seed Kendall tau of 0.28: every design landed within 0.755-0.770, 0.35 points
apart between seeds.  Probes of three designs (no-position MHSA 1+1, GPSA 2+2, wide LeViT-bias 2+2) spread 0.1
points on all 60,000 images (flip, 938 steps) and 1.2 points on 2,000 images with flip only, but 2.7 points on
2,000 images with crop and flip for 30 epochs: small data and long training are where locality separates
designs, as in ConViT.

Rows are appended one per (design, seed) to ``--out`` (JSON lines, flushed and fsynced per row); ``--resume``
skips the pairs already written, and refuses a file written under another protocol.  The order is fixed: the
designs of a seeded permutation of the space (seed 0), so the first ``--designs N`` are N designs spread at
random over the space, then the hand designs (``HAND_DESIGNS``), then the rest; the seeds of a design run back
to back.  The sidecar ``<out>.meta.json`` holds the protocol, the machine, the versions and the commits that
wrote rows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "archspec" / "search" / "tables" / "levit_small.jsonl"

PROTOCOL = {
    "space": "levit_small",
    "data": "fashion-mnist",
    "image_size": 28,
    "train_images": 2_000,      # class-stratified subset of the 60,000 training images (200 a class), seed 0
    "curve_val_images": 2_000,  # class-stratified subset of the 10,000 test images (intermediate points)
    "final_val_images": 10_000,
    "batch_size": 64,
    "steps": 938,               # 30 epochs of the subset
    "warmup_steps": 47,
    "lr": 2e-3,
    "weight_decay": 0.05,
    "optimizer": "adamw",
    "augmentation": "flip+crop",
    "curve_steps": [25, 50, 100, 200, 400, 800, 938],
    "zero_cost_batch": 64,
    "threads": 1,
}

# The seed papers' designs scaled into the space (same head kinds and stage pattern; issue 32, part 4).  Each is a
# point of levit_small, named by its Optuna parameters.
HAND_DESIGNS = {
    "LeViT-128S-like": {"stages": "narrow", "s0_depth": 2, "s0": "levit_bias", "s1_depth": 2, "s1": "levit_bias"},
    "ConViT-Ti-like": {"stages": "narrow", "s0_depth": 2, "s0": "gpsa", "s1_depth": 2, "s1": "mhsa"},
    "DeiT-Ti-like": {"stages": "narrow", "s0_depth": 2, "s0": "mhsa", "s1_depth": 2, "s1": "mhsa"},
    "MaiT-Sch2-like": {"stages": "narrow", "s0_depth": 2, "s0": "mask3_mhsa", "s1_depth": 2, "s1": "mhsa"},
    "CMHSA-like": {"stages": "narrow", "s0_depth": 2, "s0": "signed_bias", "s1_depth": 2, "s1": "signed_bias"},
}


def hand_params(short: dict) -> dict:
    """Optuna parameters of a hand design given in ``HAND_DESIGNS``' short form."""
    return {"stages": short["stages"], "stages.0.depth": short["s0_depth"], "stages.0.heads_mix": short["s0"],
            "stages.1.depth": short["s1_depth"], "stages.1.heads_mix": short["s1"]}


def protocol_id(protocol: dict) -> str:
    """A short hash of the protocol: rows written under another protocol are not comparable."""
    return hashlib.sha256(json.dumps(protocol, sort_keys=True).encode()).hexdigest()[:12]


def design_label(params: dict) -> str:
    """``narrow 2x mask3_bias / 1x gpsa``: width, then depth and head kind per stage."""
    return (f"{params['stages']} {params['stages.0.depth']}x {params['stages.0.heads_mix']} / "
            f"{params['stages.1.depth']}x {params['stages.1.heads_mix']}")


def ordered_points(space) -> list[tuple[int, dict, object]]:
    """``(index, params, spec)`` of every point: a seeded permutation (seed 0), the hand designs moved to just
    after the first 24 (the seed check's designs)."""
    points = [(i, p, s) for i, (p, s) in enumerate(space.points())]
    random.Random(0).shuffle(points)
    hand = [hand_params(h) for h in HAND_DESIGNS.values()]
    head, rest = points[:24], points[24:]
    moved = [pt for pt in rest if pt[1] in hand]
    return head + moved + [pt for pt in rest if pt[1] not in hand]


def git_commit() -> str:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):  # a copy without .git (a lent GPU machine's working tree)
        return os.environ.get("ARCHSPEC_COMMIT", "unknown")


def machine() -> dict:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}


def load_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a kill: the pair is simply run again
                print(f"{path}:{n}: skipping an unreadable line", file=sys.stderr)
    return rows


def stratified(labels, keep: int, seed: int):
    """Indices of a class-stratified subset of ``keep`` samples (equal shares per class, seeded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    per = keep // len(classes)
    out = [rng.permutation(np.flatnonzero(labels == c))[:per] for c in classes]
    return np.sort(np.concatenate(out))


def reference_data(protocol: dict):
    """``(train, curve_val, final_val)`` :class:`archspec.io.datasets.Dataset` views of Fashion-MNIST for the
    protocol."""
    from torch.utils.data import TensorDataset

    from archspec.io.datasets import Dataset, load_data

    full = load_data(protocol["data"], image_size=protocol["image_size"], seed=0)
    x, y = full.train.tensors
    xv, yv = full.val.tensors
    keep = stratified(y.numpy(), protocol["train_images"], seed=0)
    curve = stratified(yv.numpy(), protocol["curve_val_images"], seed=0)

    def view(train_idx, val_idx):
        return Dataset(full.name, TensorDataset(x[train_idx], y[train_idx]), TensorDataset(xv[val_idx], yv[val_idx]),
                       full.num_classes, full.channels, full.image_size)

    import torch

    everything = torch.arange(len(yv))[: protocol["final_val_images"]]
    return view(keep, curve), view(keep, everything)


def train_row(spec, data_curve, data_final, protocol: dict, seed: int) -> dict:
    """Train one design once under the protocol: its curve, TSE, final accuracy and seconds."""
    import torch

    from archspec.nn.compiler import compile as compile_spec
    from archspec.search.proxy import ProxyProtocol, proxy_spec
    from archspec.train.batches import TensorBatches
    from archspec.train.config import TrainConfig
    from archspec.train.loop import Hooks, Trainer, evaluate, run_steps

    config = TrainConfig(steps=protocol["steps"], batch_size=protocol["batch_size"], lr=protocol["lr"],
                         weight_decay=protocol["weight_decay"], optimizer=protocol["optimizer"],
                         warmup_steps=protocol["warmup_steps"], augmentation=protocol["augmentation"],
                         eval_every=protocol["steps"], device="cpu")
    geometry = ProxyProtocol(image_size=protocol["image_size"])
    pspec = proxy_spec(spec, data_curve, geometry).model_copy(update={"seed": seed})
    torch.manual_seed(seed)
    model = compile_spec(pspec)
    batches = TensorBatches(data_curve.train, config.batch_size, config.augmentation, seed, torch.device("cpu"))
    trainer = Trainer(model, config, torch.device("cpu"), num_classes=data_curve.num_classes)
    points = set(protocol["curve_steps"])
    curve, tse, state = [], [], {"loss_sum": 0.0, "eval_s": 0.0, "last": time.perf_counter(), "train_s": 0.0}

    def on_step(step: int, loss) -> None:
        state["loss_sum"] += float(loss)
        state["train_s"] += time.perf_counter() - state["last"]
        if step in points:
            start = time.perf_counter()
            acc, val_loss = evaluate(model, data_curve)
            state["eval_s"] += time.perf_counter() - start
            curve.append([step, acc, round(val_loss, 5)])
            tse.append([step, round(state["loss_sum"], 4), round(state["train_s"], 2)])
        state["last"] = time.perf_counter()

    def final_eval() -> dict:
        start = time.perf_counter()
        acc, val_loss = evaluate(model, data_final)
        state["eval_s"] += time.perf_counter() - start
        return {"accuracy": acc, "val_loss": val_loss}

    result = run_steps(trainer, iter(batches), final_eval, hooks=Hooks(on_step=on_step))
    return {"curve": curve, "tse": tse, "final_accuracy": result.accuracy, "final_val_loss": round(result.val_loss, 5),
            "train_seconds": round(state["train_s"], 2), "eval_seconds": round(state["eval_s"], 2)}


def zero_cost_row(spec, data, protocol: dict, seed: int) -> dict:
    import math

    from archspec.search.proxy import ProxyProtocol, score_proxy
    from archspec.search.zero_cost import ZERO_COST_SCORES

    proto = ProxyProtocol(image_size=protocol["image_size"], batch_size=protocol["zero_cost_batch"])
    result, _ = score_proxy(spec, data, proto, ZERO_COST_SCORES, seed=seed)
    return {"zc": {k: (v if math.isfinite(v) else None) for k, v in result.scores.items()},
            "zc_seconds": {k: round(v, 4) for k, v in result.seconds.items()}}


def write_meta(out: Path, protocol: dict, commit: str) -> None:
    meta_path = out.with_suffix(".meta.json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta.update({"protocol": protocol, "protocol_id": protocol_id(protocol),
                 "command": "nice -n 19 python bench/space_table.py --resume"})
    # the machine of the rows that do not name one: the first tabulation's (later rows carry their own `machine`)
    meta.setdefault("machine", machine())
    # the seeds whose mean is the reference (docs/search-works.md: the 3-seed mean reproduces itself); the oracle
    # answers only designs that hold all of them (archspec.search.oracle.OracleTable.seeds)
    meta.setdefault("reference_seeds", [0, 1, 2])
    commits = meta.setdefault("commits", [])
    if commit not in commits:
        commits.append(commit)
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")


def shard_arg(text: str) -> str:
    """argparse type of ``--shard``: ``I/N`` with ``0 <= I < N`` (else argparse's exit 2, before anything runs)."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected I/N (e.g. 3/16), got {text!r}") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"I must be in 0..N-1, got {text!r}")
    return text


def existing_file(text: str) -> str:
    """argparse type of ``--done``: a file that exists (a typo would silently train its pairs again)."""
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"no such table: {text}")
    return text


def select_todo(todo: list, start: int = 0, shard: str | None = None) -> list:
    """The pairs one process trains: ``todo[start:]``, then every N-th from the I-th where ``shard`` is ``"I/N"``.

    Side by side with a forward and a ``--reverse`` process, ``--start`` puts N more processes (a lent machine's
    cores) in the middle of what is left, each on its own pairs.  Raises ``ValueError`` for a malformed shard.
    """
    rest = todo[start:]
    if shard is None:
        return rest
    i, n = (int(x) for x in shard.split("/"))
    if not 0 <= i < n:
        raise ValueError(f"--shard {shard}: I must be in 0..N-1")
    return rest[i::n]


def tabulate(args) -> int:
    import torch

    from archspec.ir.analysis import analyze
    from archspec.search.latency import architecture_key
    from archspec.search.space import load_space

    torch.set_num_threads(PROTOCOL["threads"])
    out = Path(args.out)
    rows = load_rows(out)
    pid = protocol_id(PROTOCOL)
    foreign = {r.get("protocol_id") for r in rows} - {pid}
    if foreign:
        print(f"{out}: holds rows of another protocol ({', '.join(sorted(map(str, foreign)))}); "
              "use another --out", file=sys.stderr)
        return 2
    if rows and not args.resume:
        print(f"{out}: already holds {len(rows)} rows; --resume continues it", file=sys.stderr)
        return 2
    done = {(r["key"], r["seed"]) for r in rows + [r for f in args.done for r in load_rows(Path(f))]}
    space = load_space(PROTOCOL["space"])
    order = ordered_points(space)[: args.designs] if args.designs else ordered_points(space)
    if args.keys:  # designs outside the first N that a live search chose (bench/search_live.py's "missing")
        by_key = {architecture_key(pt[2]): pt for pt in ordered_points(space)}
        unknown = [k for k in args.keys if k not in by_key]
        if unknown:
            print(f"--keys: not points of {PROTOCOL['space']}: {', '.join(unknown)}", file=sys.stderr)
            return 2
        order = [by_key[k] for k in dict.fromkeys(args.keys)]
    data_curve, data_final = reference_data(PROTOCOL)
    commit = git_commit()
    out.parent.mkdir(parents=True, exist_ok=True)
    write_meta(out, PROTOCOL, commit)
    hand = {json.dumps(hand_params(h), sort_keys=True): name for name, h in HAND_DESIGNS.items()}
    todo = [(pt, s) for pt in order for s in args.seeds if (architecture_key(pt[2]), s) not in done]
    if args.reverse:  # a second process on the other core, from the other end (its own --out; then --merge)
        todo.reverse()
    todo = select_todo(todo, args.start, args.shard)
    host = machine()
    print(f"{len(order)} designs x {len(args.seeds)} seeds: {len(todo)} trainings to run", flush=True)
    for n, ((index, params, spec), seed) in enumerate(todo, 1):
        counts = analyze(spec)
        row = {"protocol_id": pid, "key": architecture_key(spec), "index": index, "params": params,
               "label": design_label(params), "hand": hand.get(json.dumps(params, sort_keys=True)),
               "seed": seed, "macs": counts.macs, "n_params": counts.params}
        row.update(zero_cost_row(spec, data_curve, PROTOCOL, seed))
        row.update(train_row(spec, data_curve, data_final, PROTOCOL, seed))
        row["commit"] = commit
        # rows can come from several machines (--shard on a lent machine's cores)
        row["machine"] = f"{host['cpu']}, {host['cores']} cores, torch {host['torch']}"
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        print(f"[{n}/{len(todo)}] {index:3d} seed {seed} {row['label']}: {row['final_accuracy']:.4f} "
              f"({row['train_seconds']:.0f} s train, {row['eval_seconds']:.0f} s eval)", flush=True)
    return 0


def latency_pass(args) -> int:
    """CPU latency of every point by LeViT's protocol (one thread, batch 1, median of 20 after 5 warm-up runs), in
    two full passes over the space so that the noise shows; written to ``<out>.latency.json`` as
    ``{"protocol", "machine", "commit", "ms": {key: [pass 1, pass 2]}}``.  ``--resume`` keeps keys measured
    twice already.  Run it with nothing else running."""
    from archspec.search.latency import LatencyProtocol, architecture_key, measure_latency
    from archspec.search.space import load_space

    path = Path(args.out).with_suffix(".latency.json")
    old = json.loads(path.read_text()) if path.exists() and args.resume else {}
    ms: dict[str, list[float]] = {k: v for k, v in old.get("ms", {}).items() if len(v) >= 2}
    protocol = LatencyProtocol()
    points = [(architecture_key(spec), spec) for _, spec in load_space(PROTOCOL["space"]).points()]
    start = time.perf_counter()
    for attempt in range(2):
        for key, spec in points:
            if len(ms.get(key, [])) > attempt:
                continue
            ms.setdefault(key, []).append(round(measure_latency(spec, protocol), 4))
        print(f"pass {attempt + 1}: {time.perf_counter() - start:.0f} s", flush=True)
    out = {"protocol": protocol.describe(), "machine": machine(), "commit": git_commit(),
           "command": "python bench/space_table.py --latency", "ms": ms}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=0) + "\n")
    os.replace(tmp, path)
    ratios = [max(v) / min(v) for v in ms.values()]
    print(f"{len(ms)} designs; pass-to-pass ratio median {sorted(ratios)[len(ratios) // 2]:.3f}, max {max(ratios):.3f}")
    return 0


def space_params() -> dict[str, dict]:
    """``{architecture key: Optuna parameters}`` of every point of the protocol's space, under the space's current
    parameter names."""
    from archspec.search.latency import architecture_key
    from archspec.search.space import load_space

    return {architecture_key(spec): params for params, spec in load_space(PROTOCOL["space"]).points()}


def with_current_params(row: dict, current: dict[str, dict]) -> dict:
    """``row`` with its ``params`` (and ``label``) under the space's current names, found by its architecture key:
    a row keeps its design when a space renames its parameters (``levit_small``'s ``share: true``).  A key that is
    no point of the space is left as it is (the table's own test refuses such a row)."""
    params = current.get(row["key"])
    return row if params is None else {**row, "params": params, "label": design_label(params)}


def rename_params(table: Path) -> int:
    """Rewrite ``table`` with every row's parameters under the space's current names (nothing else changes; the
    file is replaced atomically); returns how many rows changed."""
    current = space_params()
    rows = load_rows(table)
    renamed = [with_current_params(r, current) for r in rows]
    tmp = table.with_suffix(".renaming")
    tmp.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in renamed), encoding="utf-8")
    os.replace(tmp, table)
    return sum(a != b for a, b in zip(rows, renamed))


def merge(table: Path, other: Path) -> int:
    """Append to ``table`` the rows of ``other`` (same protocol) whose (design, seed) it lacks; returns how many.
    For a second tabulation process that ran ``--reverse`` into a copy of the table: the two meet in the middle,
    and a pair both trained is kept once (the same seed gives the same row).  Rows are appended with the space's
    current parameter names (a process started before a rename writes the old ones).

    Raises:
        SystemExit: ``other`` holds rows of another protocol."""
    pid = protocol_id(PROTOCOL)
    have = {(r["key"], r["seed"]) for r in load_rows(table)}
    current = space_params()
    new = []
    for r in load_rows(other):
        if r.get("protocol_id") != pid:
            raise SystemExit(f"{other}: a row of another protocol ({r.get('protocol_id')}); nothing merged")
        if (r["key"], r["seed"]) not in have:
            have.add((r["key"], r["seed"]))
            new.append(with_current_params(r, current))
    with table.open("a", encoding="utf-8") as f:
        for r in new:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")
        f.flush()
        os.fsync(f.fileno())
    note_row_machines(table, {r["machine"] for r in new if r.get("machine")})
    return len(new)


def note_row_machines(table: Path, machines: set) -> None:
    """List in the sidecar the machines that rows name (rows without a ``machine`` field ran on its ``machine``).
    Their ``train_seconds`` are that machine's: the oracle's simulated CPU cost mixes them (docs/search-works.md)."""
    meta_path = table.with_suffix(".meta.json")
    if not machines or not meta_path.exists():
        return
    meta = json.loads(meta_path.read_text())
    listed = meta.setdefault("row_machines", [])
    listed.extend(sorted(m for m in machines if m not in listed))
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")


def seed_report(rows: list[dict]) -> dict:
    """Does the reference reproduce itself?  Kendall tau between seed 0's and seed 1's final accuracies over the
    designs that have both, and -- the reference as a mean of seeds (issue 32: "average seeds until it holds") --
    between two disjoint k-seed means of the same designs: ``two_seed_means`` (seeds 0-1 against 2-3, designs with
    seeds 0-3) and ``three_seed_means`` (seeds 0-2 against 3-5, designs with seeds 0-5), each with a 95 %
    bootstrap interval (designs resampled) and the mean tau over every way of splitting the 2k seeds in two."""
    from scipy.stats import kendalltau

    by = {}
    for r in rows:
        by.setdefault(r["key"], {})[r["seed"]] = r["final_accuracy"]
    pairs = [(v[0], v[1]) for v in by.values() if 0 in v and 1 in v]
    if len(pairs) < 3:
        return {"designs": len(pairs)}
    tau, p = kendalltau(*zip(*pairs))
    diffs = [abs(a - b) for a, b in pairs]
    means = [(a + b) / 2 for a, b in pairs]
    out = {"designs": len(pairs), "tau": round(tau, 4), "p": p,
           "mean_abs_seed_diff": round(sum(diffs) / len(diffs), 4),
           "accuracy_range": [round(min(means), 4), round(max(means), 4)]}
    for k, name in ((2, "two_seed_means"), (3, "three_seed_means")):
        report = split_means(by, k)
        if report is not None:
            out[name] = report
    return out


def split_means(by: dict, k: int) -> dict | None:
    """Tau between the mean of seeds ``0..k-1`` and that of ``k..2k-1`` over the designs that have all 2k seeds
    (``None`` below 3 such designs), with its p-value, a 95 % bootstrap interval (designs resampled with
    replacement, 1,000 times, seeded), the mean absolute difference of the two means, and ``all_splits``: the
    mean, min and max tau over every split of the 2k seeds into two halves of k."""
    from itertools import combinations

    import numpy as np
    from scipy.stats import kendalltau

    seeds = tuple(range(2 * k))
    designs = [v for v in by.values() if all(s in v for s in seeds)]
    if len(designs) < 3:
        return None
    acc = np.array([[d[s] for s in seeds] for d in designs])  # (designs, 2k)
    a, b = acc[:, :k].mean(1), acc[:, k:].mean(1)
    tau, p = kendalltau(a, b)
    rng = np.random.default_rng(0)
    boot = [kendalltau(a[i], b[i])[0] for i in (rng.integers(0, len(a), len(a)) for _ in range(1000))]
    boot = [t for t in boot if np.isfinite(t)]
    splits = [kendalltau(acc[:, list(h)].mean(1), acc[:, [s for s in seeds if s not in h]].mean(1))[0]
              for h in combinations(seeds, k) if 0 in h]  # each split once (the half holding seed 0)
    return {"designs": len(designs), "tau": round(float(tau), 4), "p": float(p),
            "ci": [round(float(np.percentile(boot, 2.5)), 4), round(float(np.percentile(boot, 97.5)), 4)],
            "mean_abs_diff": round(float(np.abs(a - b).mean()), 4),
            "all_splits": {"n": len(splits), "mean": round(float(np.mean(splits)), 4),
                           "min": round(float(min(splits)), 4), "max": round(float(max(splits)), 4)}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="the table (JSON lines; default: the shipped table)")
    parser.add_argument("--resume", action="store_true", help="continue a table: skip the (design, seed) pairs written")
    parser.add_argument("--designs", type=int, default=None, help="only the first N designs of the fixed order")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2],
                        help="seeds per design (default 0 1 2: the 3-seed mean is the reference that reproduces "
                             "itself, docs/search-works.md)")
    parser.add_argument("--report", action="store_true", help="print the seed-to-seed Kendall tau of the table")
    parser.add_argument("--reverse", action="store_true",
                        help="train the pairs in reverse order (a second process, into a copy of the table)")
    parser.add_argument("--done", nargs="+", type=existing_file, default=[], metavar="FILE",
                        help="tables whose (design, seed) pairs count as written (other processes' tables)")
    parser.add_argument("--keys", nargs="+", default=[], metavar="KEY",
                        help="train these designs (architecture keys) instead of the first N")
    parser.add_argument("--start", type=int, default=0, help="skip the first K pairs left to train")
    parser.add_argument("--shard", type=shard_arg, default=None, metavar="I/N",
                        help="train every N-th pair left, from the I-th")
    parser.add_argument("--merge", default=None, metavar="FILE",
                        help="append FILE's rows whose (design, seed) the table lacks, then stop")
    parser.add_argument("--rename-params", action="store_true",
                        help="rewrite the table's rows with the space's current parameter names, then stop")
    parser.add_argument("--latency", action="store_true",
                        help="the latency pass (two passes, LeViT's CPU protocol) into <out>.latency.json")
    args = parser.parse_args(argv)
    if args.merge:
        print(f"merged {merge(Path(args.out), Path(args.merge))} rows of {args.merge}")
        return 0
    if args.rename_params:
        print(f"renamed the parameters of {rename_params(Path(args.out))} rows")
        return 0
    if args.report:
        print(json.dumps(seed_report(load_rows(Path(args.out))), indent=1))
        return 0
    if args.latency:
        return latency_pass(args)
    return tabulate(args)


if __name__ == "__main__":
    sys.exit(main())
