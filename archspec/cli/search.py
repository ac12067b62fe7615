"""``archspec search``: the command line of the architecture search (mode 1) and mask placement (mode 2).

``archspec.cli`` calls :func:`add_search_parser` with its sub-command registry; the handlers return
an exit status (0 ok, 1 the search trained nothing usable, 2 bad input via ``SpecError``, 130
interrupted -- the study and every finished trial are kept and the same command resumes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path

from archspec._util.units import human
from archspec._util.urls import hide_password
from archspec.cli.common import whole_number as _positive_int
from archspec.errors import SpecError
from archspec.search.cli_support import (
    BUDGET_OPTIONS,
    DEFAULT_FIDELITY,
    DEFAULT_SAMPLER,
    DEFAULT_SAMPLER_STARTUP,
    DEFAULT_VERIFY,
    FIDELITIES,
    PROXY_SCORES,  # torch-free
    SAMPLERS,
    ZERO_COST_RANKINGS,
)

__all__ = ["add_search_parser", "cmd_search", "cmd_search_masks", "idle_cores", "usable_cores"]

def usable_cores() -> int:
    """CPU cores this process may run on (``taskset`` / cgroup affinity honoured), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # pragma: no cover - not on Linux
        return max(os.cpu_count() or 1, 1)


def idle_cores() -> int:
    """:func:`usable_cores` less the cores other processes keep busy, at least 1.

    Busy cores: the 1-minute load average, unless the count of runnable processes (``/proc/loadavg``, the
    median of 5 looks 20 ms apart, this one left out) says fewer run now -- the average lags a job that has
    just ended by minutes.  The proxy's default thread count: one training at a time on every idle core.
    On the idle 2-core machine a 60-step proxy took 40 s with 2 threads against 68 s with 1, but beside one
    busy process (even niced) 2 OpenMP threads busy-wait for the core they do not get, and the bare search
    trained 6 candidates instead of 16 (docs/benchmarks.md, "Search")."""
    try:
        busy = round(os.getloadavg()[0])
    except (AttributeError, OSError):  # pragma: no cover - no load average on this system
        return usable_cores()
    return max(usable_cores() - min(busy, _running_others()), 1)


def _read_loadavg() -> str:
    return Path("/proc/loadavg").read_text()


def _running_others(looks: int = 5, read: Callable[[], str] = _read_loadavg) -> int:
    """Other processes runnable now (Linux ``/proc/loadavg``, this one left out): the median of ``looks`` looks
    20 ms apart; a large number where it cannot be read.

    The median, not the most: a CPU-bound job is runnable in every look, while a process that runs for a moment
    (a kernel worker, a shell, ``git``) shows in one.  Counted as a busy core, such a blip right after a job ended
    -- when the load average still reports that job -- made a live search train on one of two idle cores
    (bench/search_live.py, 2026-11-27)."""
    import time

    seen = []
    for i in range(looks):
        try:
            running = int(read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return 1 << 30
        seen.append(max(running - 1, 0))
        if i + 1 < looks:
            time.sleep(0.02)
    return sorted(seen)[len(seen) // 2]


SEARCH_DESCRIPTION = """\
Architecture search with Optuna, in two modes.

MODE 1 -- design under budgets (default):
  archspec search --budget-flops 1G
  archspec search --budget-flops 500M --budget-latency 15 --trials 30 --timeout 1800
  archspec search --budget-params 5M --objective accuracy --data ~/data/cifar-10-batches-py
  archspec search --space levit_grafting --budget-flops 4.5G   (LeViT sec. 3.2: ResNet-50 stages + DeiT-S)
Samples LeViT-family candidates (conv stem, shrinking attention, per stage LeViT bias / ConViT GPSA /
MaiT masked heads; --space NAME for a shipped space, --space FILE for your own), rejects over-budget
ones from the static analysis before any weight exists (microseconds, never trained), measures
latency at the spec's real input size, proxy-trains the rest on real data, and keeps the Pareto
front of proxy accuracy vs latency (or, with --objective accuracy, the most accurate candidate within the budgets).

MODE 2 -- MaiT mask placement for a given spec:
  archspec search masks specs/mait_tiny_sch2.yaml --strategy als        (MaiT sec. 4.2, --rounds 2)
  archspec search masks SPEC --strategy optuna --trials 20            (Optuna over masked heads + windows)
  archspec search masks SPEC --strategy soft --alpha-threshold 0.5    (MaiT sec. 4.3, learned alphas)
See `archspec search masks --help`.

Budgets: MACs per image (the papers' "FLOPs"), written 1G, 500M, 1.5e9; params 5M; latency in ms
under the latency protocol (default LeViT's CPU protocol: batch 1, one thread).

Every run writes a directory (default runs/<study-name>/, --out): study.db (Optuna storage),
best.yaml and pareto/<rank>_trial<N>.yaml (specs with provenance, accepted by `archspec build`),
trials.csv, pareto.png, summary.json.  Re-running with the same --study-name (the default name is
derived from the space, objective and budgets) resumes the study; several processes may work on one
study through a shared --storage (sqlite:///..., postgresql://..., journal:PATH).
Exit status: 0 ok, 1 nothing trained successfully, 2 bad input, 130 interrupted (resumable)."""

MASKS_DESCRIPTION = """\
MaiT mask placement (Li et al. 2022) for the attention layers of SPEC (a YAML file or a shipped name).

  --strategy als     MaiT sec. 4.2: round 1 masks head 0 of every layer, proxy-trains, and computes the
                     Attention Locality Score (ALS, eq. 3) per layer and head on held-out images; per
                     layer, head-0 ALS >= --als-high masks every head, <= --als-low removes the mask,
                     in between keeps head 0 only (scores above uniform attention, (ALS-u)/(1-u),
                     unless --als-raw: a small proxy grid makes even uniform heads look local).
                     Later rounds (--rounds, default 2 as in the paper's "2-3 training iterations")
                     retrain the placement and calibrate: a masked head whose own ALS <= --als-low
                     loses its mask.
  --strategy optuna  Optuna (TPE) over the number of masked heads (heads 0..m-1) per group of layers and
                     their window (--windows), objective proxy accuracy.
  --strategy soft    MaiT sec. 4.3: every head of every attention layer gets a soft mask (learned alpha
                     scales the non-neighbour logits), proxy-train, then alpha < --alpha-threshold -> hard
                     mask (the head learned to be local), otherwise no mask.

Training: the proxy protocol of mode 1 with lr 1e-3, 400 steps of batch 32, 40 warm-up steps: at
lr 3e-4 no layer of MaiT-T became local in round 1 and every mask was removed; at 1e-3 the early layers'
masked heads did, the late ones' not (docs/search.md); --proxy-lr / --proxy-steps change it.  A 24-layer
MaiT-T takes about 11 minutes per round on one CPU core.

Writes to runs/<study-name>/ (--out): best.yaml (the placement at SPEC's real input size, with
provenance), rounds/ (per-round specs, als), als_round<k>.png / als.png (ALS heatmap, layer x head),
als.json, trials.csv, study.db, summary.json."""


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """``600``, ``600s``, ``10m``, ``1.5h``."""
    t = text.strip().lower()
    scale = 1.0
    for suffix, factor in (("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if t.endswith(suffix):
            t, scale = t[:-1], factor
            break
    try:
        value = float(t) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (600, 10m, 1.5h), got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive finite number of seconds, got {text!r}")
    return value


def _add_common(p: argparse.ArgumentParser, defaults: bool) -> None:
    """Options shared by both modes.  On the ``masks`` sub-parser their defaults are suppressed so that
    ``archspec search --trials 3 masks X`` and ``archspec search masks X --trials 3`` both work."""
    def d(value):
        return value if defaults else argparse.SUPPRESS

    _add_run_options(p, d)
    _add_data_options(p, d)
    _add_latency_options(p, d)


def _add_run_options(p: argparse.ArgumentParser, d) -> None:
    """Run, storage and resume options; ``d(value)`` is the default (or ``argparse.SUPPRESS``)."""
    from archspec.search.cli_support import DEFAULT_TIMEOUT_S, DEFAULT_TRIAL_TIMEOUT_S, DEFAULT_TRIALS  # stdlib only

    run = p.add_argument_group("run, storage and resume")
    run.add_argument("--study-name", default=d(None), metavar="NAME",
                     help="Optuna study name; same name = resume "
                          "(default: derived from space/spec, objective, budgets)")
    run.add_argument("--out", default=d(None), metavar="DIR", help="run directory (default: runs/<study-name>/)")
    run.add_argument("--storage", default=d(None), metavar="URL",
                     help="Optuna storage shared by workers: sqlite:///PATH, postgresql://..., mysql+pymysql://..., "
                          "journal:PATH (file journal), memory (default: sqlite:///<run dir>/study.db)")
    run.add_argument("--trials", type=_positive_int("--trials"), default=d(None), metavar="N",
                     help=f"candidates to train in this process (default {DEFAULT_TRIALS}; "
                          "masks --strategy optuna: 12)")
    run.add_argument("--timeout", type=_seconds, default=d(None), metavar="SECONDS",
                     help=f"stop starting trials after this long (600, 10m; default {DEFAULT_TIMEOUT_S:g}s for mode 1, "
                          "none for masks)")
    run.add_argument("--trial-timeout", type=_seconds, default=d(None), metavar="SECONDS",
                     help=f"a candidate whose proxy training runs longer fails with this reason (default "
                          f"{DEFAULT_TRIAL_TIMEOUT_S:g}s in mode 1; the search --timeout also cuts a running trial)")
    run.add_argument("--seed", type=int, default=d(0), metavar="N",
                     help="seed of the sampler, the initialisation and the data split (default 0): "
                          "same seed, same trials")
    run.add_argument("--sampler", choices=SAMPLERS, default=d(DEFAULT_SAMPLER),
                     help=f"Optuna sampler (default {DEFAULT_SAMPLER}; tpe: multivariate, constraint aware; front: "
                          "mutations of the front; strata: the best --zc-score of each latency stratum first; "
                          "why the default: docs, Does the search work?)")
    run.add_argument("--sampler-startup", type=_positive_int("--sampler-startup", 0),
                     default=d(DEFAULT_SAMPLER_STARTUP), metavar="N",
                     help="random trials before the sampler's model takes over (Optuna's n_startup_trials; NSGA-II: "
                          f"its population, at least 4; default {DEFAULT_SAMPLER_STARTUP})")
    run.add_argument("--json", action="store_true", default=d(False), help="print a JSON summary instead of tables")
    run.add_argument("--no-progress", action="store_true", default=d(False),
                     help="no progress bar (when stdout is not a terminal: no per-trial progress lines)")

    run.add_argument("--device", default=d("auto"), metavar="DEV",
                     help="auto (default: cuda when a GPU is present, else cpu), cpu, cuda or cuda:N -- for proxy "
                          "training and latency")


def _add_data_options(p: argparse.ArgumentParser, d) -> None:
    """Data and proxy-training options; ``d(value)`` is the default (or ``argparse.SUPPRESS``)."""
    data = p.add_argument_group("data and proxy training protocol")
    data.add_argument("--data", default=d(None), metavar="PATH",
                      help="'fashion-mnist' (apt-get install dataset-fashion-mnist), a CIFAR-10/100 python directory, "
                           "a directory of IDX files or an ImageFolder directory (default: 'digits', embedded)")
    data.add_argument("--max-images", type=_positive_int("--max-images", 2), default=d(None), metavar="N",
                      help="use at most N images of the dataset (at least 2: a train and a validation image)")
    data.add_argument("--proxy-steps", type=_positive_int("--proxy-steps"), default=d(None), metavar="N",
                      help="optimizer steps of the proxy training")
    data.add_argument("--proxy-size", type=_positive_int("--proxy-size"), default=d(None), metavar="PX",
                      help="largest image side of the proxy training (default 64): the stem keeps as many stride-2 "
                           "convs, or as large a patch, as fit it (MACs and latency are reported at the spec's size)")
    data.add_argument("--proxy-min-grid", type=_min_grid, nargs="?", const=7, default=d(None), metavar="N|real",
                      help="token grid of the proxy: 'real' trains every stage at the grid it has at the spec's own "
                           "size (mode 1's default; LeViT at 224 px: 14x14 -> 7x7 -> 4x4); N (alone: 7) a first grid "
                           "of at least N, never below a stage's largest mask window (mode 2's default: 8)")
    data.add_argument("--proxy-batch", type=_positive_int("--proxy-batch"), default=d(None), metavar="N",
                      help="proxy training batch size")
    data.add_argument("--proxy-lr", type=_float, default=d(None), metavar="LR",
                      help="proxy training peak learning rate")
    data.add_argument("--proxy-threads", type=_positive_int("--proxy-threads"), default=d(None), metavar="N",
                      help="torch threads of the proxy training (default: the cores this process may use less those "
                           "busy by the 1-minute load average; on a busy 2-core machine 2 threads ran 18x slower "
                           "than 1 from OpenMP oversubscription); to use more cores beside other jobs, run more "
                           "workers on one --storage")


def _min_grid(text: str) -> int | str:
    """``--proxy-min-grid``: ``real`` or a positive side."""
    if text.strip().lower() == "real":
        return "real"
    return _positive_int("--proxy-min-grid")(text)


def _add_latency_options(p: argparse.ArgumentParser, d) -> None:
    """Latency-protocol options; ``d(value)`` is the default (or ``argparse.SUPPRESS``)."""
    lat = p.add_argument_group("latency protocol (measured at the spec's real input size, median after warm-up)")
    lat.add_argument("--latency-device", default=d(None), metavar="DEV",
                     help="torch device of the timing (default: --device); cpu times LeViT's CPU protocol, cuda its "
                          "GPU protocol (largest power-of-two batch, bf16, ms per image)")
    lat.add_argument("--latency-threads", type=_positive_int("--latency-threads"), default=d(1), metavar="N",
                     help="torch threads while timing (default 1: LeViT's CPU protocol)")
    lat.add_argument("--latency-batch", type=_positive_int("--latency-batch"), default=d(None), metavar="N",
                     help="batch size while timing (default: 1 on CPU, the largest power of two that fits on a GPU)")
    lat.add_argument("--latency-repeats", type=_positive_int("--latency-repeats"), default=d(None), metavar="N",
                     help="timed runs per candidate (default: the latency module's, 20 after 5 warm-up runs)")
    lat.add_argument("--latency-compile", action="store_true", default=d(False),
                     help="time each candidate under torch.compile (Inductor, freezing) instead of eagerly; its "
                          "compilation (seconds to a minute per candidate) is never timed; cached apart from eager")


def add_search_parser(sub) -> argparse.ArgumentParser:
    """Register ``archspec search`` (mode 1) and ``archspec search masks`` (mode 2) on ``sub``."""
    search = sub.add_parser("search", help="architecture search under MAC/param/latency budgets; "
                                           "`search masks SPEC`: MaiT mask placement",
                            description=SEARCH_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    budget = search.add_argument_group("budgets (mode 1)")
    budget.add_argument("--budget-flops", "--budget-macs", dest="budget_flops", metavar="MACS",
                        help="MACs per image at the spec's input size (the papers' FLOPs): 1G, 500M, 1.5e9")
    budget.add_argument("--budget-params", metavar="N", help="parameters: 5M, 2.5e6")
    budget.add_argument("--budget-latency", metavar="MS", help="latency in ms under the latency protocol")
    budget.add_argument("--max-memory", metavar="SIZE",
                        help="reject candidates whose batch-1 forward or proxy training step is estimated to need "
                             "more memory (default 8G; binary units)")
    obj = search.add_argument_group("objective and space (mode 1)")
    obj.add_argument("--objective", choices=("pareto", "accuracy"), default="pareto",
                     help="pareto (default): maximise proxy accuracy and minimise latency; accuracy: maximise proxy "
                          "accuracy with the budgets as constraints")
    obj.add_argument("--space", metavar="FILE", help="search space YAML, or a shipped space's name: levit_family "
                     "(the default), levit_grafting")
    obj.add_argument("--list", action="store_true",
                     help="print every point of a finite --space (its Optuna parameters, MACs, params) and exit: "
                          "nothing is trained or written")
    obj.add_argument("--oracle", metavar="TABLE",
                     help="answer every evaluation from a tabulated space instead of training (a table file from "
                          "bench/space_table.py, or a shipped table's name: levit_small): the proxy at step k is the "
                          "table's learning curve at step k, zero-cost scores and latency are the table's; the "
                          "engine, sampler, budgets and rungs are the real ones (docs: Does the search work?)")
    obj.add_argument("--oracle-subset", action="store_true",
                     help="with --oracle: search only the designs the table holds (every reference seed); the "
                          "space's other points are infeasible, as if over a budget (for a table still being "
                          "written, or one of a sample of the space)")
    obj.add_argument("--proxy-score", choices=PROXY_SCORES, default=None,
                     help="what ranks a trained proxy: accuracy (default: its val top-1 at the last step, whose "
                          "fronts were larger on levit_small's table; docs: Does the search work?) or tse (minus its "
                          "mean training loss over the run, the sum of training losses; the default until issue 82: "
                          "resume a study written then with this)")
    obj.add_argument("--prune", action="store_true",
                     help="with --objective accuracy: stop unpromising trials early (Optuna MedianPruner)")
    obj.add_argument("--fidelity", choices=FIDELITIES, default=DEFAULT_FIDELITY,
                     help="none (default: no zero-cost score ranked better than chance on the default space): "
                          "train every candidate; zc: score each untrained candidate with zero-cost proxies and "
                          "train only the top 1/eta by --zc-score (or those no other beats on both score and "
                          "latency); sha: read accuracy at rungs of min-steps * eta^k proxy steps and train on only "
                          "the promising candidates (also for pareto); hyperband: --objective accuracy only")
    obj.add_argument("--zc-score", choices=ZERO_COST_RANKINGS, default="synflow",
                     help="what the zero-cost rung ranks by (default synflow: Abdelfattah et al. 2021's best on "
                          "NAS-Bench-201); every score is recorded on each trial")
    obj.add_argument("--strata", type=_positive_int("--strata"), default=None, metavar="N",
                     help="with --sampler strata: how many cost strata, one design trained from each first "
                          "(default: --trials less --verify; name it when --timeout ends the run before --trials)")
    obj.add_argument("--eta", type=_positive_int("--eta", 2), default=3, metavar="N",
                     help="multi-fidelity reduction factor (default 3)")
    obj.add_argument("--min-steps", type=_positive_int("--min-steps"), metavar="N",
                     help="multi-fidelity first rung in proxy steps (default: --proxy-steps / eta^2)")
    obj.add_argument("--verify", type=_positive_int("--verify", 0), default=DEFAULT_VERIFY, metavar="K",
                     help=f"train the front's best K designs again with a second seed, inside --trials / --timeout, "
                          f"and report both seeds' scores, their rank agreement and which front points lie within "
                          f"the seed spread (default {DEFAULT_VERIFY}; 0: no re-training)")
    _add_common(search, defaults=True)
    search.set_defaults(handler=cmd_search, search_mode=None)
    _add_masks_parser(search.add_subparsers(dest="search_mode", title="mode 2 (sub-command)", metavar="masks"))
    return search


def _add_masks_parser(modes) -> None:
    """Register ``archspec search masks`` (mode 2) on the search parser's sub-commands."""
    masks = modes.add_parser("masks", help="MaiT mask placement for SPEC (--strategy als|optuna|soft)",
                             description=MASKS_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    masks.add_argument("spec", metavar="SPEC", nargs="?", default=None,
                       help="YAML file or shipped spec name (see `archspec list`); with --oracle: none, or the "
                            "space file of a table whose space is not shipped")
    masks.add_argument("--oracle", metavar="TABLE", default=argparse.SUPPRESS,
                       help="replay the strategy on a mask table (`archspec table` of a kind: masks space, e.g. "
                            "mait_small) instead of training: als reads each round's ALS from a row of the table, "
                            "optuna searches the table's points (the table's space is the spec)")
    masks.add_argument("--oracle-subset", action="store_true", default=argparse.SUPPRESS,
                       help="with --oracle --strategy optuna: search only the points the table holds (every "
                            "reference seed), for a table still being written")
    m = masks.add_argument_group("strategy")
    m.add_argument("--strategy", choices=("als", "optuna", "soft"), default="als",
                   help="placement strategy (default als)")
    m.add_argument("--rounds", type=_positive_int("--rounds"), default=2,
                   help="als: training rounds (default 2: assign, then calibrate)")
    m.add_argument("--als-high", type=_float, default=None, metavar="X",
                   help="als: head-0 ALS at or above this masks every head of the layer (default 0.8)")
    m.add_argument("--als-low", type=_float, default=None, metavar="X",
                   help="als: ALS at or below this removes the mask (default 0.2; the paper says 'close to 0')")
    m.add_argument("--als-raw", action="store_true",
                   help="als: decide on the raw ALS (paper eq. 3) instead of the ALS above uniform attention "
                        "(ALS-u)/(1-u), u = a uniform head's score on the layer's grid (large on small proxy grids)")
    m.add_argument("--window", default="3x3", metavar="RxC", help="als/soft: mask window (default 3x3, MaiT's)")
    m.add_argument("--windows", default="3x3,3x5,5x5", metavar="LIST",
                   help="optuna: windows to choose from (default 3x3,3x5,5x5)")
    m.add_argument("--max-masked", type=_positive_int("--max-masked"), default=None, metavar="N",
                   help="optuna: at most N masked heads per layer")
    m.add_argument("--alpha-threshold", type=_float, default=0.5, metavar="A",
                   help="soft: learned alpha below A -> hard mask, else global (default 0.5 = the initial alpha)")
    _add_common(masks, defaults=False)
    masks.set_defaults(handler=cmd_search_masks)


def _masks_on_table(args: argparse.Namespace) -> int:
    """``archspec search masks --oracle TABLE``: the strategy replayed on a mask table (issue 52).  ``als``: MaiT's
    rule, each round's training a row of the table (:func:`archspec.search.cli_support.table_replay_report`);
    ``soft``: the table's soft-mask rows (``<table>.soft.jsonl``) as its one training; ``optuna``: a search of the
    table's points by accuracy (mode 1 on the table's space, TPE)."""
    from archspec.search import load_table, run_design
    from archspec.search.cli_support import MASKS_PROXY_DEFAULTS, mask_table_space, table_replay_report

    table = load_table(args.oracle)
    try:  # a mask table of SPEC (a space file) or of a shipped space, or exit 2 here
        space = mask_table_space(table, args.spec)
    except SpecError as exc:
        raise exc.renamed("space", "SPEC") from None
    steps = getattr(args, "steps", None) or MASKS_PROXY_DEFAULTS["steps"]
    if args.strategy == "soft" and not table.soft_rows:
        raise SpecError.single(("--strategy",), "this mask table has no soft-mask rows: --strategy soft trains every "
                                                "head soft-masked, which no point of the table is",
                               f"a {Path(table.file).stem}.soft.jsonl beside the table, or --strategy als or optuna")
    if args.strategy == "optuna":
        trials = args.trials if getattr(args, "trials", None) is not None else 12
        cfg = _config(args, objective="accuracy", trials=trials, timeout=None, space=space.file,
                      sampler="tpe", protocol=_protocol(args, {**MASKS_PROXY_DEFAULTS, "steps": steps}),
                      oracle=args.oracle)
        return _report(_run(run_design, cfg), args)
    report = table_replay_report(table, args.seed, steps, strategy=args.strategy, window=args.window,
                                 high=args.als_high, low=args.als_low, rounds=args.rounds, normalise=not args.als_raw,
                                 alpha_threshold=args.alpha_threshold, space=space)
    print(json.dumps(report, indent=2) if args.json else report["text"])
    return 0


def _run(run, cfg):
    """``run(cfg)`` (``run_design`` / ``run_masks``), its errors naming this command's options: the library names
    a budget by its field (``budgets.macs``), the command line by its flag (``--budget-flops``;
    :data:`archspec.search.cli_support.BUDGET_OPTIONS`).

    Raises:
        SpecError: what ``run`` raises, with the budget fields renamed to their options.
    """
    try:
        return run(cfg)
    except SpecError as exc:
        raise exc.with_options({("budgets", field): option for field, option in BUDGET_OPTIONS.items()}) from None


# ----------------------------------------------------------------------------------- building configs
def _budgets(args):
    from archspec._util.memory import parse_memory
    from archspec.search import Budgets
    from archspec.search.cli_support import parse_quantity

    return Budgets(
        macs=parse_quantity(args.budget_flops, "--budget-flops") if getattr(args, "budget_flops", None) else None,
        params=parse_quantity(args.budget_params, "--budget-params") if getattr(args, "budget_params", None) else None,
        latency_ms=(parse_quantity(args.budget_latency, "--budget-latency")
                    if getattr(args, "budget_latency", None) else None),
        memory=parse_memory(args.max_memory, "--max-memory") if getattr(args, "max_memory", None) else None,
    )




def _protocol(args, defaults: dict | None = None):
    from archspec.search import ProxyProtocol

    protocol = replace(ProxyProtocol(), **(defaults or {}))
    update = {}
    if getattr(args, "proxy_threads", None) is None and protocol.threads is None:
        update["threads"] = idle_cores()
    for option, fieldname in (("proxy_steps", "steps"), ("proxy_size", "image_size"), ("proxy_batch", "batch_size"),
                              ("proxy_lr", "lr"), ("proxy_threads", "threads"), ("proxy_score", "score")):
        value = getattr(args, option, None)
        if value is not None:
            update[fieldname] = value
    if getattr(args, "proxy_min_grid", None) is not None:
        update["min_grid"] = None if args.proxy_min_grid == "real" else args.proxy_min_grid
    if "lr" in update and not update["lr"] > 0:
        raise SpecError.single(("--proxy-lr",), f"must be positive, got {update['lr']}")
    names = {f.name for f in fields(protocol)}
    return replace(protocol, **{k: v for k, v in update.items() if k in names})


def _latency(args):
    from archspec.diagnostics.devices import parse_device
    from archspec.search import LatencyProtocol

    option = "--latency-device" if args.latency_device else "--device"
    device = parse_device(args.latency_device or args.device, option)
    batch = args.latency_batch if args.latency_batch is not None or device.type == "cuda" else 1
    protocol = LatencyProtocol(device=str(device), threads=args.latency_threads, batch=batch,
                               torch_compile=bool(getattr(args, "latency_compile", False)))
    if getattr(args, "latency_repeats", None):
        protocol = replace(protocol, repeats=args.latency_repeats, warmup=min(protocol.warmup, args.latency_repeats))
    return protocol


def _with_devices(args, cfg):
    """``cfg`` with ``--device`` (the proxy's; the latency's too unless ``--latency-device``) and ``--latency-device``
    parsed and checked: imports torch.

    Raises:
        SpecError: an unknown or unavailable device, naming the option.
    """
    protocol = cfg.protocol
    if getattr(args, "device", None) is not None:
        from archspec.diagnostics.devices import parse_device

        protocol = replace(protocol, device=str(parse_device(args.device, "--device")))
    return replace(cfg, protocol=protocol, latency=_latency(args))


def _config(args, devices: bool = True, **overrides):
    """The :class:`SearchConfig` of the command line, ``overrides`` replacing fields; ``devices=False`` leaves the
    devices unparsed and the latency protocol unset (torch-free, for :func:`_announce`; :func:`_with_devices` next)."""
    from archspec.search import SearchConfig
    from archspec.search.cli_support import DEFAULT_TIMEOUT_S, DEFAULT_TRIAL_TIMEOUT_S, DEFAULT_TRIALS

    cfg = SearchConfig(
        budgets=_budgets(args), protocol=_protocol(args), latency=None,
        study_name=args.study_name, out=Path(args.out) if args.out else None, storage=args.storage,
        objective=getattr(args, "objective", "pareto"),
        trials=args.trials or DEFAULT_TRIALS,
        timeout=args.timeout if args.timeout is not None else DEFAULT_TIMEOUT_S,
        seed=args.seed, sampler=args.sampler, sampler_startup=args.sampler_startup,
        space=getattr(args, "space", None), data=args.data,
        max_images=args.max_images, progress=not (args.no_progress or args.json), prune=getattr(args, "prune", False),
        trial_timeout=args.trial_timeout if args.trial_timeout is not None else DEFAULT_TRIAL_TIMEOUT_S,
        fidelity=getattr(args, "fidelity", "none"), eta=getattr(args, "eta", 3),
        zc_score=getattr(args, "zc_score", "synflow"),
        min_steps=getattr(args, "min_steps", None), oracle=getattr(args, "oracle", None),
        oracle_subset=getattr(args, "oracle_subset", False), verify=getattr(args, "verify", 0),
        strata=getattr(args, "strata", None),
    )
    if args.study_name is not None:
        from archspec.search.cli_support import validate_study_name

        validate_study_name(args.study_name)
    cfg = replace(cfg, **overrides)
    return _with_devices(args, cfg) if devices else cfg


def _report(outcome, args) -> int:
    """Print the outcome's summary (JSON with ``--json``, else tables); the exit status: 130 interrupted,
    1 no best.yaml (nothing usable trained), else 0."""
    from archspec.search.cli_support import jsonable, print_summary

    summary = outcome.summary
    if args.json:
        print(json.dumps(jsonable(summary), indent=2))
    else:
        from rich.console import Console

        print_summary(summary, Console(highlight=False, width=None if sys.stdout.isatty() else 120))
    if outcome.interrupted:
        return 130
    return 0 if outcome.best_file is not None else 1


def cmd_search(args: argparse.Namespace) -> int:
    """Mode 1 handler (``--list``: the space's points)."""
    if getattr(args, "list", False):
        return list_points(args.space, args.json)
    cfg = _config(args, devices=False)  # torch-free, so the announcement comes at once
    _announce(cfg, f"over space {Path(cfg.space).stem if cfg.space else 'levit_family (default)'}")
    from archspec.search import run_design  # imports torch

    return _report(_run(run_design, _with_devices(args, cfg)), args)


def _announce(cfg, what: str, budgets: bool = True) -> None:
    """One line on stderr, before anything slow (importing torch, decoding every image, the first training): what
    the search will do -- the space or spec, budgets, data, trials, proxy and storage (its password masked).  The
    first trial's result comes minutes later; progress lines follow while it trains."""
    b = cfg.budgets
    limits = [f"{label} <= {human(value)}{unit}" for label, value, unit in
              (("MACs", b.macs, ""), ("params", b.params, ""), ("latency", b.latency_ms, " ms")) if value is not None]
    limits = (", ".join(limits) or "no budget") + "; " if budgets else ""
    p = cfg.protocol
    storage = hide_password(cfg.storage) if cfg.storage else f"SQLite in {cfg.out or 'runs/<study>'}/study.db"
    timeout = f", timeout {cfg.timeout:g} s" if cfg.timeout else ""
    print(f"archspec search {what}: {limits}data {cfg.data or 'digits (embedded)'}; "
          f"{cfg.trials} trials{timeout}; proxy {p.steps} steps at up to {p.image_size} px; storage {storage} "
          "(loading torch and the data...)", file=sys.stderr, flush=True)


def list_points(space_source: str | None, as_json: bool) -> int:
    """``archspec search --space SPACE --list``: every point of a finite space, one line each (parameters, MACs,
    params), then the count; with ``--json`` one JSON object per line.  Imports neither torch nor Optuna.

    Raises:
        SpecError: the space cannot be read, has a continuous float range, or more than 10,000 points.
    """
    from archspec._util.units import human
    from archspec.ir.analysis import analyze
    from archspec.search import load_space

    space = load_space(space_source)
    count = 0
    for count, (params, spec) in enumerate(space.points(limit=10_000), 1):
        counts = analyze(spec)
        if as_json:
            print(json.dumps({"index": count - 1, "params": params, "macs": counts.macs, "n_params": counts.params}))
        else:
            shown = " ".join(f"{k}={v}" for k, v in params.items())
            print(f"{count - 1:5d}  {human(counts.macs):>7} MACs  {human(counts.params):>7} params  {shown}")
    if not as_json:
        print(f"{count} points in space {space.name!r}")
    return 0


def cmd_search_masks(args: argparse.Namespace) -> int:
    """Mode 2 handler."""
    from archspec.search.cli_support import DEFAULT_TRIALS, MASKS_PROXY_DEFAULTS, MASKS_TRIAL_TIMEOUT_S

    if getattr(args, "list", None):  # design-search only: masks train the given spec (or replay a table)
        raise SpecError.single(("--list",), "--list applies to mode 1 (design search), not to masks",
                               "drop it, or run `archspec search --space ... --list`")
    if (getattr(args, "budget_flops", None) or getattr(args, "budget_params", None)
            or getattr(args, "budget_latency", None)):
        raise SpecError.single(("--budget-flops",), "budgets apply to mode 1 (design); mask placement keeps the "
                                                    "architecture, so its MACs barely change",
                               "drop the budget options, or run `archspec search --budget-flops ...`")
    if getattr(args, "oracle", None):
        return _masks_on_table(args)
    if args.spec is None:
        raise SpecError.single(("SPEC",), "missing: the spec whose masks to place", "archspec search masks SPEC")
    if getattr(args, "oracle_subset", False):
        raise SpecError.single(("--oracle-subset",), "applies to a replay on a table", "add --oracle TABLE")
    timeout = args.timeout if args.timeout is not None else None
    trials = args.trials if args.trials is not None else (12 if args.strategy == "optuna" else DEFAULT_TRIALS)
    cfg = _config(args, objective="accuracy", trials=trials, timeout=timeout, space=None,
                  protocol=_protocol(args, MASKS_PROXY_DEFAULTS), devices=False,
                  trial_timeout=args.trial_timeout if args.trial_timeout is not None else MASKS_TRIAL_TIMEOUT_S)
    _announce(cfg, f"masks {args.spec} --strategy {args.strategy}", budgets=False)
    cfg = _with_devices(args, cfg)  # imports torch
    from archspec.search import MaskConfig, run_masks
    windows = tuple(w.strip() for w in args.windows.split(",") if w.strip())
    mcfg = MaskConfig(search=cfg, spec=args.spec, strategy=args.strategy, rounds=args.rounds,
                      als_high=args.als_high, als_low=args.als_low, window=args.window, windows=windows,
                      max_masked=args.max_masked, alpha_threshold=args.alpha_threshold, normalise=not args.als_raw)
    return _report(_run(run_masks, mcfg), args)
