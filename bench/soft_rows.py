"""MaiT's soft masks on a mask table: the soft-mask model's rows, ``<table>.soft.jsonl`` (issue 55 item 1).

    OMP_NUM_THREADS=1 nice -n 19 python bench/soft_rows.py              # mait_small, seeds 0 1 2 (the reference)
    python bench/soft_rows.py --table T/mait_small.jsonl --seeds 0      # another copy of the table, one seed

``archspec search masks --strategy soft`` (MaiT sec. 4.3) trains one model, every head of every layer with MaiT's
soft 3x3 mask (a learned ``alpha`` per head, initialised at 0.5), and hard-masks the heads whose alpha ends below
0.5.  That model is no point of the mask space, so the table cannot answer it -- until its rows exist: this script
trains it (the space's point 0/0/0 with every head soft-masked, ``archspec.search._space.mask_placement.soft_heads``
at the protocol's ALS window) under the table's own protocol (``archspec.search.table_protocol``; refused when the
table's sidecar records another) at each seed the sidecar lacks, and appends each row as it finishes: a table row
(``archspec.search._tabulation.rows.train_row``: curve, TSE, ALS, final top-1) with the learned alphas at every curve
step (``alphas``) and no zero-cost scores (``zc`` empty: nothing reads them of this model).  Then ``archspec search
masks --oracle TABLE --strategy soft`` and ``bench/mask_works.py`` replay the strategy on the table.

mait_small's three took 742-809 s of training each at 1,876 steps, one thread beside two table workers on this
project's 2-core VM.  Exit 2 with a message when the table or its protocol sidecar is missing, unreadable or records
another protocol, or the soft-mask rows already there are not rows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from archspec.errors import SpecError
from archspec.search import architecture_key, load_space, table_protocol
from archspec.search._space.mask_placement import apply_placement, soft_heads
from archspec.search._tabulation.oracle import TABLES_DIR
from archspec.search._tabulation.rows import reference_data, train_row
from archspec.search._tabulation.tabulate import git_commit, machine


def soft_spec(space):
    """The space's unmasked point with MaiT's soft mask on every head (the model ``--strategy soft`` trains)."""
    from archspec.families.attention.kinds.mask import parse_window

    none = next(spec for params, spec in space.points() if not any(params.values()))
    window = parse_window(table_protocol(space)["als"]["window"])
    return apply_placement(none, soft_heads(none, window)).model_copy(update={"name": f"{space.name}_soft"})


def checked_protocol(table: Path) -> tuple[object, dict, str]:
    """``(space, protocol, protocol id)`` of the table's sidecar, which must record the space's table protocol.

    Raises:
        SystemExit: (2) no table or sidecar, or another protocol."""
    meta_path = table.with_suffix(".meta.json")
    if not table.is_file() or not meta_path.is_file():
        raise SystemExit(f"{table}: no such table with a .meta.json sidecar (archspec table SPACE --export FILE)")
    try:
        meta = json.loads(meta_path.read_text())
        space = load_space(meta["protocol"]["space"])
    except (json.JSONDecodeError, KeyError, TypeError, SpecError) as exc:
        raise SystemExit(f"{meta_path}: not a table's protocol sidecar ({type(exc).__name__}: {exc})") from None
    if meta["protocol"] != table_protocol(space) or "als" not in meta["protocol"] or "protocol_id" not in meta:
        raise SystemExit(f"{meta_path}: its protocol is not the mask space {space.name}'s table protocol of this "
                         "checkout: soft-mask rows must be trained under the table's own protocol")
    return space, meta["protocol"], meta["protocol_id"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", default=str(TABLES_DIR / "mait_small.jsonl"), help="the mask table (JSONL)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args(argv)
    table = Path(args.table)
    try:
        space, protocol, protocol_id = checked_protocol(table)
    except SystemExit as exc:
        print(f"soft_rows: {exc}", file=sys.stderr)
        return 2
    import torch

    from archspec.ir.analysis import analyze

    torch.set_num_threads(protocol["threads"])
    out = table.with_suffix(".soft.jsonl")
    try:
        done = {json.loads(line)["seed"] for line in out.read_text().splitlines() if line.strip()} if out.is_file() \
            else set()
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        print(f"soft_rows: {out}: not soft-mask rows ({type(exc).__name__}: {exc}); nothing appended", file=sys.stderr)
        return 2
    spec = soft_spec(space)
    key, counts, host = architecture_key(spec), analyze(spec), machine()
    data = None
    for seed in [s for s in args.seeds if s not in done]:
        data = data or reference_data(protocol)
        fields = train_row(spec, *data, protocol, seed=seed)
        row = {"protocol_id": protocol_id, "key": key, "index": None, "params": {},
               "label": "soft 3x3, every head", "hand": None, "seed": seed, "macs": counts.macs,
               "n_params": counts.params, "zc": {}, **fields, "commit": git_commit(),
               "machine": f"{host['cpu']}, {host['cores']} cores, torch {host['torch']}"}
        with out.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"soft seed {seed}: {row['final_accuracy']:.4f} ({row['train_seconds']:.0f} s train, "
              f"{row['eval_seconds']:.0f} s eval) -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
