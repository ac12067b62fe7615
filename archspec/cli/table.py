"""``archspec table SPACE``: the command line of :func:`archspec.search.tabulate` (its help is :data:`DESCRIPTION`)."""

from __future__ import annotations

import argparse
import json

from archspec.cli.common import whole_number
from archspec.errors import Problem, SpecError

__all__ = ["add_table_parser", "cmd_table"]

# The help text, plain (argparse prints it as written: no reST markup).
DESCRIPTION = """Tabulate a finite search space on an Optuna storage: every point trained for every seed under one
protocol, each (point, seed) one trial.

    archspec table mait_small --designs 24 --seeds 0 1 2 3 4 5    # the seed check's 24 points, six seeds each
    archspec table mait_small --report                              # seed-to-seed Kendall tau of what is trained
    archspec table mait_small                                       # every point, seeds 0 1 2 (resumes)
    archspec table mait_small --export mait_small.jsonl             # the table --oracle reads

Any number of `archspec table` processes on one --storage share the work (a journal file on one machine,
PostgreSQL across machines).  Exit status: 0 ok (also when nothing was left to train), 1 this worker trained
nothing and every pair it tried failed (it stops after 4 such tries), 2 bad input, 130 interrupted (the pair in
progress is trained again by the next worker).
"""

# command-line flag -> protocol field (archspec.search.table_protocol's reference protocol); their defaults are the
# reference protocol's, so they are None here and only what the user sets changes it
_PROTOCOL_FLAGS = {"data": "data", "train_images": "train_images", "steps": "steps", "warmup_steps": "warmup_steps",
                   "batch_size": "batch_size", "lr": "lr", "weight_decay": "weight_decay",
                   "augmentation": "augmentation", "curve_steps": "curve_steps", "threads": "threads"}


def add_table_parser(sub) -> None:
    """Register ``archspec table`` (torch-free: the parser is built for every command)."""
    p = sub.add_parser("table", help="tabulate a finite search space (every point, every seed) on an Optuna storage",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("space", metavar="SPACE", help="a shipped space (levit_small, mait_small) or a space YAML file")
    p.add_argument("--seeds", type=whole_number("--seeds", 0, 2**32 - 1), nargs="+", default=None,
                   help="seeds of every point (default 0 1 2: the 3-seed mean is the reference); with --export, the "
                   "reference seeds its sidecar names (default: the seeds every exported design has)")
    p.add_argument("--designs", type=whole_number("--designs"), default=None, metavar="N",
                   help="only the first N points of the fixed order (a seeded random draw; the seed check: 24)")
    p.add_argument("--storage", default=None, metavar="URL",
                   help="Optuna storage: journal:PATH (default journal:runs/tables/SPACE.journal), sqlite:///PATH, "
                        "postgresql://... (workers on several machines)")
    p.add_argument("--max-pairs", type=whole_number("--max-pairs"), default=None, metavar="N",
                   help="stop after training N pairs")
    p.add_argument("--export", default=None, metavar="FILE",
                   help="write the trained rows as FILE (.jsonl) and its .meta.json sidecar (what --oracle reads), "
                        "then stop")
    p.add_argument("--import", dest="import_table", default=None, metavar="FILE",
                   help="put an existing table file's rows into the study (once), then stop")
    p.add_argument("--report", action="store_true",
                   help="print the seed check (Kendall tau between seeds and between 3-seed means), then stop")
    proto = p.add_argument_group("protocol (default: the reference protocol, docs/search-works.md)")
    proto.add_argument("--data", default=None, help="data set (default fashion-mnist)")
    for flag, what in (("--train-images", "class-stratified training subset (default 2000)"),
                       ("--steps", "training steps (default 938)"),
                       ("--warmup-steps", "linear warm-up steps (default 47)"),
                       ("--batch-size", "batch size (default 64)")):
        proto.add_argument(flag, type=whole_number(flag), default=None, help=what)
    proto.add_argument("--lr", type=float, default=None, help="AdamW learning rate (default 2e-3)")
    proto.add_argument("--weight-decay", type=float, default=None, help="weight decay (default 0.05)")
    proto.add_argument("--augmentation", default=None, help="augmentation (default flip+crop)")
    proto.add_argument("--curve-steps", type=whole_number("--curve-steps"), nargs="+", default=None,
                       help="steps of the learning curve, the last = --steps (default 25 50 100 200 400 800 938)")
    proto.add_argument("--threads", type=whole_number("--threads"), default=None,
                       help="torch threads per worker (default 1)")
    p.set_defaults(handler=cmd_table)


def cmd_table(args: argparse.Namespace) -> int:
    """Run ``archspec table``; returns the exit status.  Raises SpecError for bad input (the CLI prints it, 2),
    naming the flag where the library names a protocol field."""
    try:
        return _run(args)
    except SpecError as exc:
        raise SpecError([_as_flag(p) for p in exc.problems]) from None


def _as_flag(problem: Problem) -> Problem:
    """A problem at ``protocol.<field>`` named by its flag (``--curve-steps``); one located in the space file
    (its own ``protocol:``) stays there."""
    path = tuple(problem.path)
    if len(path) == 2 and path[0] == "protocol" and path[1] in _PROTOCOL_FLAGS.values() and problem.file is None:
        return Problem((f"--{str(path[1]).replace('_', '-')}",), problem.message, problem.hint, problem.file,
                       problem.line, problem.column)
    return problem


def _run(args: argparse.Namespace) -> int:
    import archspec.search as tab

    space = tab.load_space(args.space)
    overrides = {field: getattr(args, flag) for flag, field in _PROTOCOL_FLAGS.items()}
    protocol = tab.table_protocol(space, **overrides)
    if sum(bool(x) for x in (args.export, args.import_table, args.report)) > 1:
        raise SpecError.single(("--export",), "--export, --import and --report are separate steps: give one")
    if args.export:
        path, n = tab.export_table(space, args.export, storage=args.storage, protocol=protocol,
                                   reference_seeds=args.seeds, command=_command(args))
        print(f"wrote {n} rows to {path} (and {path.with_suffix('.meta.json').name})")
        return 0
    if args.import_table:
        n = tab.import_table(space, args.import_table, storage=args.storage, protocol=protocol)
        print(f"imported {n} rows of {args.import_table}")
        return 0
    if args.report:
        from archspec.search.cli_support import study_rows

        print(json.dumps(tab.seed_check(study_rows(space, args.storage, protocol)), indent=1))
        return 0
    progress = tab.tabulate(space, seeds=args.seeds or [0, 1, 2], designs=args.designs, storage=args.storage,
                            protocol=protocol,
                            max_pairs=args.max_pairs, log=lambda line: print(line, flush=True))
    if progress.failed and not progress.trained:
        print(f"trained nothing here: {progress.failed} tries, every one failed (the first: {progress.reasons[0]})"
              + ("; stopped" if progress.stopped else "") + ". The input (data, protocol, space) is likely wrong; "
              "each pair's reason is its trial's fail_reason", flush=True)
        return 1
    print(f"trained {progress.trained} pairs here ({progress.failed} failed); {progress.left} of "
          f"{progress.wanted} left" + (f"; gave up on {len(progress.given_up)} pairs that failed twice"
                                       if progress.given_up else ""))
    return 0


def _command(args: argparse.Namespace) -> str:
    """The tabulating command, for the sidecar (the options that change what is trained)."""
    parts = ["archspec table", args.space]
    if args.storage:
        parts += ["--storage", args.storage]
    for flag in _PROTOCOL_FLAGS:
        value = getattr(args, flag)
        if value is not None:
            parts += [f"--{flag.replace('_', '-')}"] + [str(v) for v in (value if isinstance(value, list) else [value])]
    return " ".join(parts)
