"""Snapshot of every shipped spec's numbers, to show that a refactor changed no behaviour.

For each shipped spec (at 64 px for the two 156M-parameter CMHSA attention specs, as the CLI tests build
them): the analysis (params, MACs, executed MACs, every memory figure, every table row), the compiled
model's state-dict keys, shapes and the SHA-256 of every tensor's bytes (the seeded initial weights), and
the SHA-256 of its float32 logits on the three shipped photographs.

    python bench/snapshot.py /tmp/before.json        # before the change
    python bench/snapshot.py /tmp/after.json         # after it
    python bench/snapshot.py --compare /tmp/before.json /tmp/after.json

``--compare`` prints every difference and exits 1 when there is one.  Takes about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys

SMALLER = {"cmhsa_k3": 64, "cmhsa_k5": 64}


def _digest(tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def snapshot() -> dict:
    import torch

    import archspec
    from archspec.io.images import sample_batch
    from archspec.spec import shipped_specs

    torch.set_num_threads(1)
    out = {}
    for name in shipped_specs():
        spec = archspec.load_spec(name)
        if name in SMALLER:
            data = spec.model_dump(mode="json")
            data["input"]["resolution"] = [SMALLER[name]] * 2
            spec = archspec.load_spec(data)
        analysis = dataclasses.asdict(archspec.analyze(spec))
        model = archspec.compile(spec).eval()
        state = {k: [list(v.shape), _digest(v)] for k, v in model.state_dict().items()}
        images = sample_batch(tuple(spec.input.resolution))[:, :spec.input.channels]
        with torch.no_grad():
            logits = model(images)
        out[name] = {"analysis": json.loads(json.dumps(analysis, default=list)), "state": state,
                     "logits": _digest(logits)}
        print(f"{name}: {len(state)} tensors", file=sys.stderr)
    return out


def compare(before: dict, after: dict) -> list[str]:
    diffs = []
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            diffs.append(f"{name}: only in {'after' if a is None else 'before'}")
            continue
        for part in ("analysis", "state", "logits"):
            if a[part] != b[part]:
                if part == "state":
                    keys = sorted(set(a[part]) ^ set(b[part])) or [k for k in a[part] if a[part][k] != b[part][k]]
                    diffs.append(f"{name}: state differs at {keys[:5]}")
                else:
                    diffs.append(f"{name}: {part} differs")
    return diffs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", metavar="JSON")
    parser.add_argument("--compare", action="store_true", help="compare two snapshots")
    args = parser.parse_args()
    if args.compare:
        if len(args.paths) != 2:
            parser.error("--compare takes two snapshot files")
        before, after = (json.load(open(p, encoding="utf-8")) for p in args.paths)
        diffs = compare(before, after)
        print("\n".join(diffs) if diffs else f"identical: {len(before)} specs (analysis, state dicts, logits)")
        return 1 if diffs else 0
    with open(args.paths[0], "w", encoding="utf-8") as f:
        json.dump(snapshot(), f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
