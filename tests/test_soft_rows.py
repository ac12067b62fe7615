"""bench/soft_rows.py (the soft-mask model's rows of a mask table): the model it trains and its protocol check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def soft_rows(bench_module):
    return bench_module("soft_rows")


def test_the_soft_model_is_the_unmasked_point_with_every_head_soft_masked(soft_rows):
    """mait_small's 0/0/0 point with MaiT's soft 3x3 mask on every head of its 6 layers (alpha_init 0.5), and no
    point of the space (its rows cannot be mistaken for one)."""
    from archspec.search import architecture_key, load_space

    space = load_space("mait_small")
    doc = soft_rows.soft_spec(space).model_dump(mode="json", exclude_none=True)
    layers = doc["stages"][0]["layers"]
    assert [entry["range"] for entry in layers] == [[0, 5]] and doc["stages"][0]["depth"] == 6
    assert layers[0]["heads"] == [{"mask": {"window": [3, 3], "mode": "soft", "alpha_init": 0.5}}] * 3
    assert architecture_key(soft_rows.soft_spec(space)) not in {architecture_key(s) for _, s in space.points()}


def test_a_table_of_another_protocol_or_without_a_sidecar_is_refused(soft_rows, tmp_path, capsys):
    table = tmp_path / "t.jsonl"
    table.write_text("{}\n")
    assert soft_rows.main(["--table", str(table)]) == 2
    assert "no such table with a .meta.json sidecar" in capsys.readouterr().err
    meta = json.loads((ROOT / "archspec" / "search" / "tables" / "mait_small.meta.json").read_text())
    meta["protocol"]["steps"] = 938
    (tmp_path / "t.meta.json").write_text(json.dumps(meta))
    assert soft_rows.main(["--table", str(table)]) == 2
    assert "not the mask space mait_small's table protocol" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl", "t.meta.json"]


def test_unreadable_sidecars_are_refused_without_appending(soft_rows, tmp_path, capsys):
    """A protocol sidecar that is not JSON, and soft-mask rows already there that are not rows: exit 2, a message
    naming the file, nothing written."""
    table = tmp_path / "t.jsonl"
    table.write_text("{}\n")
    (tmp_path / "t.meta.json").write_text("not json")
    assert soft_rows.main(["--table", str(table)]) == 2
    assert "t.meta.json: not a table's protocol sidecar" in capsys.readouterr().err
    shipped_meta = ROOT / "archspec" / "search" / "tables" / "mait_small.meta.json"
    (tmp_path / "t.meta.json").write_text(shipped_meta.read_text())
    (tmp_path / "t.soft.jsonl").write_text("garbage\n")
    assert soft_rows.main(["--table", str(table)]) == 2
    assert "t.soft.jsonl: not soft-mask rows" in capsys.readouterr().err
    assert (tmp_path / "t.soft.jsonl").read_text() == "garbage\n"
