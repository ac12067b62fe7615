"""bench/mask_compare.py's --merge (issue 37 item 4: the GPU session trains one placement x seed per process and
joins the parts): hand-computed means and spreads, and a protocol mismatch refused with exit 2."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = {"steps": 1200, "lr": 0.001, "batch_size": 32}


def _bench():
    spec = importlib.util.spec_from_file_location("mask_compare", ROOT / "bench" / "mask_compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _part(tmp_path: Path, placement: str, seed: int, acc: float, protocol: dict = PROTOCOL) -> Path:
    path = tmp_path / f"part_{placement}_{seed}.json"
    row = {"placement": placement, "spec": "mait_tiny_sch1", "macs_executed": 2_478_000_000, "params": 11,
           "accuracy": {str(seed): acc}, "wall_s": {str(seed): 230.0}, "mean": acc, "spread": 0.0}
    path.write_text(json.dumps({"data": "digits", "max_images": None, "steps": protocol["steps"],
                                "protocol": protocol, "seeds": [seed], "rows": [row]}))
    return path


def test_merge_joins_seeds_per_placement(tmp_path):
    parts = [_part(tmp_path, "sch1", 2, 0.70), _part(tmp_path, "sch1", 0, 0.75), _part(tmp_path, "all", 1, 0.80),
             _part(tmp_path, "found", 0, 0.50), _part(tmp_path, "found", 1, 0.60), _part(tmp_path, "all", 0, 0.78)]
    out = tmp_path / "all.json"
    assert _bench().merge(parts, out) == 0
    merged = json.loads(out.read_text())
    rows = {r["placement"]: r for r in merged["rows"]}
    assert [r["placement"] for r in merged["rows"]] == ["found", "sch1", "all"]  # the docs' order
    assert rows["sch1"]["accuracy"] == {"0": 0.75, "2": 0.70}  # seeds sorted
    assert rows["sch1"]["mean"] == 0.725 and rows["sch1"]["spread"] == 0.05
    assert rows["found"]["mean"] == 0.55 and rows["found"]["spread"] == 0.1
    assert rows["all"]["mean"] == 0.79 and rows["all"]["spread"] == 0.02
    assert merged["seeds"] == [0, 1, 2] and merged["steps"] == 1200


def test_merge_refuses_another_protocol(tmp_path, capsys):
    parts = [_part(tmp_path, "sch1", 0, 0.75), _part(tmp_path, "sch1", 1, 0.70, {**PROTOCOL, "steps": 400})]
    out = tmp_path / "all.json"
    assert _bench().merge(parts, out) == 2
    assert "another protocol" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("text, words", [
    ('{"protocol": ', "not JSON"),
    ('[1, 2]', "not a mask_compare result"),
    ('{"protocol": {}, "data": "d", "steps": 1, "rows": [{"placement": "sch1"}]}', "lacks placement"),
])
def test_merge_refuses_a_damaged_file_without_a_traceback(tmp_path, capsys, text, words):
    good = _part(tmp_path, "sch1", 0, 0.75)
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    out = tmp_path / "all.json"
    assert _bench().merge([good, bad], out) == 2
    err = capsys.readouterr().err
    assert words in err and "bad.json" in err and not out.exists()
