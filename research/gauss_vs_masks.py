"""Learned locality against MaiT's hard masks on the mask table's protocol (issue 55 item 3).

    python research/gauss_vs_masks.py                # trains what is missing, then prints the comparison
    python research/gauss_vs_masks.py --seeds 0 1 2 --out gauss_vs_masks.jsonl
    python research/gauss_vs_masks.py --steps 938 --table research/pilots/mait_small_s938.rows.jsonl  # 938 steps
    python research/gauss_vs_masks.py --only "gauss_mask, every head"  # its rows now, the table's points from the table
    python research/gauss_vs_masks.py --space research/pilots/mait_nopos.yaml --seeds 0 \
        --only none "hard 3x3, every head"

Three designs of the mait_small space's model (a 6-layer DeiT at 28 px, 3 heads, Fashion-MNIST; see
archspec/search/spaces/mait_small.yaml): no masks (the space's point 0/0/0), every head with MaiT's hard 3x3 mask
(point 3/3/3), and every head ``gauss_mask`` (archspec/families/attention/gauss_mask.py: a learned Gaussian decay
of the logits with distance, GMM-Mask arXiv 2309.05375, initialised local) -- the third is no point of the space.
Each is trained under the table's own protocol (``archspec.search.table_protocol``: 2,000 training images, 1,876
steps since the seed-check pilot, final top-1 on the 10,000 test images; ``--steps 938`` for the protocol it had
before, warm-up 5 % and the curve's last step following) at every seed given; a row the table (``--table``, the
shipped mask table by default) holds for a design and seed under that very protocol is read, not trained again.
Rows go to ``--out`` as they finish (a killed run resumes from it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from archspec.search import architecture_key, load_space, load_table, table_protocol
from archspec.search._tabulation.oracle import TABLES_DIR
from archspec.search._tabulation.rows import reference_data, train_row


def designs(space_name: str = "mait_small") -> dict[str, object]:
    """``{label: spec}`` of a mask space whose points are masked-head counts per group (mait_small's and its
    pilots'): none (0/0/0), hard 3x3 everywhere (3/3/3) and gauss_mask everywhere."""
    space = load_space(space_name)
    points = {tuple(params.values()): spec for params, spec in space.points()}
    none, hard = points[(0, 0, 0)], points[(3, 3, 3)]
    doc = none.model_dump(mode="json", exclude_none=True)
    doc["name"] = f"{space.name}_gauss"
    doc["stages"][0]["attention"] = "gauss_mask"
    gauss = type(none).model_validate(doc)
    return {"none": none, "hard 3x3, every head": hard, "gauss_mask, every head": gauss}


def tabulated_rows(path: Path, protocol: dict) -> dict:
    """A mask table's rows ``{architecture key: {seed: row}}``, empty if there is no such file or its protocol is
    not ``protocol`` (rows of another protocol are other measurements)."""
    if not path.is_file():
        return {}
    table = load_table(path)
    return table.rows if table.meta.get("protocol") == protocol else {}


def protocol_for(steps: int | None, space_name: str = "mait_small") -> dict:
    """The mask table's protocol, or the same at ``steps`` (5 % warm-up, the reference curve cut at ``steps``)."""
    space = load_space(space_name)
    if steps is None:
        return table_protocol(space)
    curve = [s for s in (25, 50, 100, 200, 400, 800, 1600) if s < steps] + [steps]
    return table_protocol(space, steps=steps, warmup_steps=max(1, round(0.05 * steps)), curve_steps=curve)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--space", default="mait_small",
                        help="a mask space whose points count masked heads per group (default mait_small; a pilot's "
                             "YAML such as research/pilots/mait_nopos.yaml)")
    parser.add_argument("--out", default="gauss_vs_masks.jsonl", help="rows, one per (design, seed); resumed")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the mask table's)")
    parser.add_argument("--table", default=str(TABLES_DIR / "mait_small.jsonl"),
                        help="rows read instead of trained where the protocol matches (default: the shipped table)")
    parser.add_argument("--only", nargs="+", default=None, choices=list(designs()), metavar="LABEL",
                        help="train only these designs (e.g. 'gauss_mask, every head' while the table's workers "
                             "train its points); the others are read from the table or --out where there")
    args = parser.parse_args(argv)
    protocol = protocol_for(args.steps, args.space)
    space_name = protocol["space"]
    out = Path(args.out)
    rows = map(json.loads, out.read_text().splitlines()) if out.is_file() else []
    done = {(r["label"], r["seed"]): r for r in rows  # this protocol's (rows before --space are mait_small's)
            if r.get("steps", 938) == protocol["steps"] and r.get("space", "mait_small") == space_name}
    data, table = None, tabulated_rows(Path(args.table), protocol)
    for label, spec in designs(args.space).items():
        key = architecture_key(spec)
        for seed in args.seeds:
            if (label, seed) in done:
                continue
            row = table.get(key, {}).get(seed)
            from_table = row is not None
            if row is None and args.only is not None and label not in args.only:
                continue
            if row is None:
                data = data or reference_data(protocol)
                row = train_row(spec, *data, protocol, seed=seed)
            row = {"label": label, "key": key, "seed": seed, "space": space_name, "steps": protocol["steps"],
                   "final_accuracy": row["final_accuracy"],
                   "train_seconds": row["train_seconds"], "from_table": from_table}
            done[(label, seed)] = row
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{label} seed {seed}: {row['final_accuracy']:.4f} ({row['train_seconds']:.0f} s)", flush=True)
    print(f"final top-1 on 10,000 test images, seeds {args.seeds} (mean, min-max):")
    for label in designs(args.space):
        accs = [done[(label, s)]["final_accuracy"] for s in args.seeds if (label, s) in done]
        if accs:
            print(f"  {label}: {statistics.mean(accs):.4f} ({min(accs):.4f}-{max(accs):.4f}), {len(accs)} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
