"""A pytest plugin: each test's CPU seconds, its own and its finished subprocesses' (issue 53).

pytest's ``--durations`` gives wall seconds, which on 2 cores shared by two pytest-xdist workers say little about
what a test costs the suite; the suite's limit is CPU (docs/contributing.md, "Where the time goes").  This plugin
reads ``resource.getrusage`` (user + system, ``RUSAGE_SELF`` and ``RUSAGE_CHILDREN``) around each test's whole
protocol (setup, call, teardown) and writes ``[[nodeid, own CPU s, children's CPU s, wall s], ...]`` as JSON at
the end.  Children count once they are waited for (a subprocess, a torchrun launcher and its ranks, Inductor's
g++ calls); Inductor's compile-worker pool, started once per process and never waited for, is not counted.
Run serially, so that no other test's CPU lands in the figures::

    PYTHONPATH=bench python -m pytest -n 0 -p cpu_per_test -m slow     # writes cpu_per_test.json here
    CPU_PER_TEST_OUT=quick.json PYTHONPATH=bench python -m pytest -n 0 -p cpu_per_test -m "not slow"
    python bench/cpu_per_test.py cpu_per_test.json [--top 20]          # the table, most CPU first
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time
from collections import Counter

import pytest

_rows: list[list] = []


def _cpu_seconds() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own0, children0 = _cpu_seconds()
    start = time.perf_counter()
    yield
    own1, children1 = _cpu_seconds()
    _rows.append([item.nodeid, round(own1 - own0, 2), round(children1 - children0, 2),
                  round(time.perf_counter() - start, 2)])


def pytest_sessionfinish(session):
    with open(os.environ.get("CPU_PER_TEST_OUT", "cpu_per_test.json"), "w", encoding="utf-8") as f:
        json.dump(_rows, f)


def main() -> int:
    parser = argparse.ArgumentParser(description="The tests that cost the most CPU, from a cpu_per_test JSON file.")
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    with open(args.file, encoding="utf-8") as f:
        rows = sorted(json.load(f), key=lambda r: -(r[1] + r[2]))
    print(f"{len(rows)} tests, {sum(r[1] + r[2] for r in rows):.0f} CPU s, {sum(r[3] for r in rows):.0f} wall s")
    by_file = Counter()
    for nodeid, own, children, _ in rows:
        by_file[nodeid.split("::")[0]] += own + children
    print("| file | CPU s |\n|---|---|")
    for path, seconds in by_file.most_common(args.top):
        print(f"| `{path}` | {seconds:.1f} |")
    print("\n| test | CPU s (own + children) | wall s |\n|---|---|---|")
    for nodeid, own, children, wall in rows[:args.top]:
        print(f"| `{nodeid.split('/')[-1]}` | {own + children:.1f} ({own:.1f} + {children:.1f}) | {wall:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
