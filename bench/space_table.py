"""Grow a shipped table with ``archspec table`` (issue 52), and its latency pass.

    nice -n 19 python bench/space_table.py levit_small           # continue archspec/search/tables/levit_small.jsonl
    nice -n 19 python bench/space_table.py mait_small --designs 24 --seeds 0 1 2 3 4 5   # the seed check
    python bench/space_table.py levit_small --report              # the seed check of the shipped rows
    python bench/space_table.py levit_small --latency --resume    # CPU latency pass (nothing else running!)

A thin caller of :mod:`archspec.search._tabulation.tabulate`: the shipped table's rows go into the space's table study
once
(``import_table``), the pairs it lacks are trained one at a time (``tabulate(max_pairs=1)``, any number of these
processes on the same ``--storage`` share the work), and the shipped file is exported again after every pair, so
that a session's end loses at most the pair in progress.  Commit the table's rows at the end of a session.

The latency pass (LeViT's CPU protocol: one thread, batch 1, median of 20 after 5 warm-up runs, two full passes so
that the noise shows) writes ``<table>.latency.json``; the oracle reads it for Pareto searches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from archspec.search import export_table, import_table, load_space, seed_check, table_protocol, tabulate
from archspec.search._tabulation.oracle import TABLES_DIR
from archspec.search._tabulation.tabulate import git_commit, machine


def grow(space_name: str, seeds: list[int], designs: int | None, storage: str | None) -> int:
    """Import the shipped table, then train and export one pair at a time until the request is done."""
    space = load_space(space_name)
    protocol = table_protocol(space)
    shipped = TABLES_DIR / f"{space.name}.jsonl"
    if shipped.is_file():
        print(f"imported {import_table(space, shipped, storage=storage, protocol=protocol)} rows of {shipped}")
    command = f"nice -n 19 python bench/space_table.py {space.name}"
    while True:
        progress = tabulate(space, seeds=seeds, designs=designs, storage=storage, protocol=protocol, max_pairs=1,
                            log=lambda line: print(line, flush=True))
        if progress.trained:
            path, n = export_table(space, shipped, storage=storage, protocol=protocol, command=command)
            print(f"exported {n} rows to {path}", flush=True)
        if not progress.trained or not progress.left:
            return 0


def latency_pass(space_name: str, resume: bool) -> int:
    """CPU latency of every point, two passes, into the shipped table's ``.latency.json``."""
    from archspec.search import LatencyProtocol, architecture_key, measure_latency

    path = TABLES_DIR / f"{space_name}.latency.json"
    old = json.loads(path.read_text()) if path.exists() and resume else {}
    ms: dict[str, list[float]] = {k: v for k, v in old.get("ms", {}).items() if len(v) >= 2}
    protocol = LatencyProtocol()
    points = [(architecture_key(spec), spec) for _, spec in load_space(space_name).points()]
    start = time.perf_counter()
    for attempt in range(2):
        for key, spec in points:
            if len(ms.get(key, [])) > attempt:
                continue
            ms.setdefault(key, []).append(round(measure_latency(spec, protocol), 4))
        print(f"pass {attempt + 1}: {time.perf_counter() - start:.0f} s", flush=True)
    out = {"protocol": protocol.describe(), "machine": machine(), "commit": git_commit(),
           "command": f"python bench/space_table.py {space_name} --latency", "ms": ms}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=0) + "\n")
    os.replace(tmp, path)
    ratios = [max(v) / min(v) for v in ms.values()]
    print(f"{len(ms)} designs; pass-to-pass ratio median {sorted(ratios)[len(ratios) // 2]:.3f}, max {max(ratios):.3f}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("space", nargs="?", default="levit_small", help="a shipped space (default levit_small)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds per point (default 0 1 2)")
    parser.add_argument("--designs", type=int, default=None, help="only the first N points of the fixed order")
    parser.add_argument("--storage", default=None, help="Optuna storage (default journal:runs/tables/SPACE.journal)")
    parser.add_argument("--report", action="store_true", help="print the seed check of the shipped rows")
    parser.add_argument("--table", default=None, help="with --report: this table file instead of the shipped one")
    parser.add_argument("--latency", action="store_true", help="the latency pass into <table>.latency.json")
    parser.add_argument("--resume", action="store_true", help="with --latency: keep designs measured twice")
    args = parser.parse_args(argv)
    if args.report:
        table = Path(args.table) if args.table else TABLES_DIR / f"{args.space}.jsonl"
        rows = [json.loads(line) for line in table.read_text().splitlines() if line.strip()]
        print(json.dumps(seed_check(rows), indent=1))
        return 0
    if args.latency:
        return latency_pass(args.space, args.resume)
    return grow(args.space, args.seeds, args.designs, args.storage)


if __name__ == "__main__":
    sys.exit(main())
