"""How long ``archspec validate SPEC`` takes from a cold interpreter, and how much memory it peaks at.

    python bench/front_door.py [--runs 7] [SPEC ...]

For each spec (default: a MaiT, a ConViT, a CMHSA attention spec, a LeViT and a CaiT, all shipped) the
command ``python -m archspec validate SPEC`` runs ``--runs`` times as a subprocess, one after another,
with its output discarded.  The table gives the median, min and max wall time (seconds, from spawn to
exit, ``time.perf_counter``), the child's peak resident memory (``ru_maxrss`` of that child alone, from
``os.wait4``, in MiB, the largest over the runs), and whether the command imported torch (one more run
through :func:`archspec.cli.main` that reports ``sys.modules``).  The goal is < 0.5 s for specs that need
no torch; a spec whose block family lives in a torch file (LeViT's shrinking attention, CaiT's talking
heads, CMHSA's conv mixer: :mod:`archspec.families`) pays for importing torch and timm.

POSIX only (``os.wait4``).  Writes nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

DEFAULT_SPECS = ["mait_tiny_sch2", "convit_tiny", "cmhsa_k3", "levit_128s", "cait_xxs24"]

PROBE = ("import sys; from archspec.cli import main; import contextlib, io\n"
         "with contextlib.redirect_stdout(io.StringIO()): rc = main(['validate', sys.argv[1]])\n"
         "print(rc, 'torch' in sys.modules)")


def time_once(spec: str) -> tuple[float, float, int]:
    """One cold ``python -m archspec validate SPEC``: (wall seconds, peak RSS in MiB, exit status)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "archspec", "validate", spec],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: keep Popen from waiting again
    return wall, usage.ru_maxrss / 1024, proc.returncode  # ru_maxrss: KiB on Linux


def imports_torch(spec: str) -> bool:
    """Whether ``archspec validate SPEC`` imports torch (run through the CLI entry in a fresh interpreter)."""
    out = subprocess.run([sys.executable, "-c", PROBE, spec], capture_output=True, text=True, check=True).stdout
    return out.split()[-1] == "True"


def measure(spec: str, runs: int) -> dict:
    """``runs`` timed runs of one spec: median / min / max wall seconds, peak RSS MiB, torch imported."""
    samples = [time_once(spec) for _ in range(runs)]
    walls = [wall for wall, _, _ in samples]
    statuses = {status for _, _, status in samples}
    return {"spec": spec, "median_s": statistics.median(walls), "min_s": min(walls), "max_s": max(walls),
            "maxrss_mib": max(rss for _, rss, _ in samples), "status": ",".join(map(str, sorted(statuses))),
            "torch": imports_torch(spec)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="*", default=DEFAULT_SPECS, metavar="SPEC",
                        help=f"shipped names or YAML files (default: {' '.join(DEFAULT_SPECS)})")
    parser.add_argument("--runs", type=int, default=7, help="timed runs per spec (default 7)")
    args = parser.parse_args(argv)
    print(f"`{os.path.basename(sys.executable)} -m archspec validate SPEC`, {args.runs} cold runs each")
    print("| spec | median wall (s) | min (s) | max (s) | peak RSS (MiB) | exit | imports torch |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for spec in args.specs:
        r = measure(spec, args.runs)
        print(f"| {r['spec']} | {r['median_s']:.3f} | {r['min_s']:.3f} | {r['max_s']:.3f} | {r['maxrss_mib']:.0f} "
              f"| {r['status']} | {'yes' if r['torch'] else 'no'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
