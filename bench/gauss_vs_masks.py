"""Learned locality against MaiT's hard masks on the mask table's protocol (issue 55 item 3).

    python bench/gauss_vs_masks.py                       # trains what is missing, then prints the comparison
    python bench/gauss_vs_masks.py --seeds 0 1 2 --out gauss_vs_masks.jsonl

Three designs of the mait_small space's model (a 6-layer DeiT at 28 px, 3 heads, Fashion-MNIST; see
archspec/search/spaces/mait_small.yaml): no masks (the space's point 0/0/0), every head with MaiT's hard 3x3 mask
(point 3/3/3), and every head ``gauss_mask`` (archspec/families/attention/gauss_mask.py: a learned Gaussian decay
of the logits with distance, GMM-Mask arXiv 2309.05375, initialised local) -- the third is no point of the space.
Each is trained under the table's own protocol (``archspec.search.table_protocol``: 2,000 training images, 938
steps, final top-1 on the 10,000 test images) at every seed given; a row the shipped mask table already holds for a
design and seed is read, not trained again.  Rows go to ``--out`` as they finish (a killed run resumes from it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from archspec.search import (
    TABLES_DIR,
    architecture_key,
    load_space,
    load_table,
    reference_data,
    table_protocol,
    train_row,
)


def designs() -> dict[str, object]:
    """``{label: spec}``: none (0/0/0), hard 3x3 everywhere (3/3/3) and gauss_mask everywhere."""
    space = load_space("mait_small")
    points = {tuple(params.values()): spec for params, spec in space.points()}
    none, hard = points[(0, 0, 0)], points[(3, 3, 3)]
    doc = none.model_dump(mode="json", exclude_none=True)
    doc["name"] = "mait_small_gauss"
    doc["stages"][0]["attention"] = "gauss_mask"
    gauss = type(none).model_validate(doc)
    return {"none": none, "hard 3x3, every head": hard, "gauss_mask, every head": gauss}


def tabulated_rows() -> dict:
    """The shipped mait_small table's rows ``{architecture key: {seed: row}}`` (empty if it is not shipped)."""
    path = TABLES_DIR / "mait_small.jsonl"
    return load_table(path).rows if path.is_file() else {}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="gauss_vs_masks.jsonl", help="rows, one per (design, seed); resumed")
    args = parser.parse_args(argv)
    protocol = table_protocol(load_space("mait_small"))
    out = Path(args.out)
    done = {(r["label"], r["seed"]): r for r in map(json.loads, out.read_text().splitlines())} if out.is_file() else {}
    data, table = None, tabulated_rows()
    for label, spec in designs().items():
        key = architecture_key(spec)
        for seed in args.seeds:
            if (label, seed) in done:
                continue
            row = table.get(key, {}).get(seed)
            from_table = row is not None
            if row is None:
                data = data or reference_data(protocol)
                row = train_row(spec, *data, protocol, seed=seed)
            row = {"label": label, "key": key, "seed": seed, "final_accuracy": row["final_accuracy"],
                   "train_seconds": row["train_seconds"], "from_table": from_table}
            done[(label, seed)] = row
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{label} seed {seed}: {row['final_accuracy']:.4f} ({row['train_seconds']:.0f} s)", flush=True)
    print(f"final top-1 on 10,000 test images, seeds {args.seeds} (mean, min-max):")
    for label in designs():
        accs = [done[(label, s)]["final_accuracy"] for s in args.seeds if (label, s) in done]
        if accs:
            print(f"  {label}: {statistics.mean(accs):.4f} ({min(accs):.4f}-{max(accs):.4f}), {len(accs)} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
