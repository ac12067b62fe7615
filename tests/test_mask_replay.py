"""MaiT's placement rule replayed on a mask table (archspec.search._tabulation.mask_replay), against hand-computed
cases."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from search_fixtures import tiny_masks_space

from archspec.diagnostics.metrics import attention_locality_score, patch_window_mask
from archspec.errors import SpecError
from archspec.search._tabulation.mask_replay import (
    als_at,
    mask_geometry,
    mask_groups,
    replay_als,
    replay_soft,
    uniform_als,
)
from archspec.search._tabulation.oracle import TABLES_DIR, OracleTable

GROUPS = ("stages.0.heads_mix.masked.0-1", "stages.0.heads_mix.masked.2-3", "stages.0.heads_mix.masked.4-5")
U = 361 / 49 / 50  # uniform ALS on 7x7 + class token, 3x3 window: (25*9 + 20*6 + 4*4) / 49 patches / 50 tokens


def _raw(normalised: float) -> float:
    """The raw ALS whose value above uniform attention is ``normalised``."""
    return U + normalised * (1 - U)


def _row(counts, als_by_layer, seed, seconds=10.0):
    params = dict(zip(GROUPS, counts))
    return {"key": "k" + "".join(map(str, counts)), "seed": seed, "params": params, "final_accuracy": 0.7,
            "curve": [[50, 0.5, 1.0], [100, 0.6, 0.9]], "tse": [[50, 40.0, seconds / 2], [100, 70.0, seconds]],
            "als": [[50, {f"0.{l}": [0.0, 0.0, 0.0] for l in range(6)}], [100, als_by_layer]]}


def _table(points: dict[tuple, dict]) -> OracleTable:
    """Every point with the same row at seeds 0-2 (so whichever seed the replay draws, the rule reads the same)."""
    rows = {}
    for counts, als in points.items():
        key = "k" + "".join(map(str, counts))
        rows[key] = {s: _row(counts, als, s) for s in (0, 1, 2)}
    return OracleTable(file="t.jsonl", space="mait_small", rows=rows, latency_ms={},
                       meta={"reference_seeds": [0, 1, 2]})


def _layers(per_group: list[list[float]]) -> dict[str, list[float]]:
    """Raw ALS per layer from normalised scores per group (both layers of a group alike)."""
    return {f"0.{l}": [_raw(v) for v in per_group[l // 2]] for l in range(6)}


def test_uniform_als_matches_the_torch_score_of_a_uniform_map():
    for grid, window, prefix in [((7, 7), (3, 3), 1), ((4, 4), (3, 3), 1), ((5, 6), (3, 5), 0)]:
        n = grid[0] * grid[1] + prefix
        torch_u = attention_locality_score(torch.full((1, 1, n, n), 1.0 / n, dtype=torch.float64),
                                           patch_window_mask(grid, window, prefix), prefix)
        assert uniform_als(grid, window, prefix) == pytest.approx(float(torch_u[0]), abs=1e-12)
    assert uniform_als((7, 7), (3, 3), 1) == pytest.approx(U)
    assert uniform_als((4, 4), (3, 3), 1) == pytest.approx(100 / 16 / 17)  # 0.37: the module docstring's figure


def test_two_rounds_by_hand_end_on_sch2():
    """Round 1 (1/1/1), head 0 above uniform: 0.9 -> every head, 0.5 -> head 0, 0.1 -> none: point 3/1/0.  Round 2
    (3/1/0): head 1 of group 0-1 at 0.1 <= 0.2 loses its mask, the others keep theirs: 2/1/0 (MaiT Sch.2-like)."""
    table = _table({(1, 1, 1): _layers([[0.9, 0.5, 0.5], [0.5, 0.5, 0.5], [0.1, 0.5, 0.5]]),
                    (3, 1, 0): _layers([[0.9, 0.1, 0.9], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])})
    got = replay_als(table, replay_seed=4, steps=100, heads=3, grid=(7, 7))
    assert got.counts == dict(zip(GROUPS, (2, 1, 0)))
    assert [r["point"] for r in got.rounds] == [dict(zip(GROUPS, (1, 1, 1))), dict(zip(GROUPS, (3, 1, 0)))]
    assert got.seconds == pytest.approx(20.0)  # two trainings of 10 s at step 100
    assert got.answered == {key: table.seed_of(key, 4) for key in ("k111", "k310")}


def test_a_group_decides_on_its_layers_mean_and_the_steps_pick_the_curve_point():
    """Layers 0 and 1 at 0.96 and 0.66 above uniform: mean 0.81 -> every head (>= 0.8); at steps 60 the rule reads
    step 50's ALS (all 0: every mask removed)."""
    als = _layers([[0.0, 0, 0], [0.5, 0, 0], [0.5, 0, 0]])
    als["0.0"][0], als["0.1"][0] = _raw(0.96), _raw(0.66)
    table = _table({(1, 1, 1): als, (3, 1, 1): _layers([[0.5] * 3, [0.5] * 3, [0.5] * 3]),
                    (0, 0, 0): _layers([[0.0] * 3] * 3)})
    assert replay_als(table, 0, 100, heads=3, grid=(7, 7)).counts == dict(zip(GROUPS, (3, 1, 1)))
    assert replay_als(table, 0, 60, heads=3, grid=(7, 7), rounds=1).counts == dict(zip(GROUPS, (0, 0, 0)))
    assert als_at(table.rows["k111"][0], 60) == {f"0.{l}": [0.0] * 3 for l in range(6)}


def test_a_calibration_that_changes_nothing_stops_the_rounds():
    table = _table({(1, 1, 1): _layers([[0.5, 0, 0]] * 3)})  # round 1 keeps head 0 everywhere: the same point
    got = replay_als(table, 0, 100, heads=3, grid=(7, 7), rounds=5)
    assert got.counts == dict(zip(GROUPS, (1, 1, 1))) and len(got.rounds) == 2


def test_a_point_missing_from_the_table_and_a_design_table_are_refused():
    table = _table({(1, 1, 1): _layers([[0.9, 0, 0]] * 3)})  # the rule goes on to 3/3/3, which is not there
    with pytest.raises(SpecError, match="lacks the point"):
        replay_als(table, 0, 100, heads=3, grid=(7, 7))
    with pytest.raises(SpecError, match="not a per-group mask count"):
        mask_groups({"stages": "narrow"})
    with pytest.raises(SpecError, match="no ALS"):
        als_at({"curve": []}, 100)


def test_search_masks_oracle_prints_the_rounds_the_placement_and_the_fixed_schemes(tmp_path, capsys):
    """`archspec search masks --oracle T` on a table file shaped like mait_small's (rows built from its first row,
    ALS set by hand as in test_two_rounds_by_hand_end_on_sch2): 1/1/1 -> 3/1/0 -> 2/1/0, whose reference top-1
    is the mean of its three seeds (no round trained it), 0.7600."""
    from archspec.cli import main
    from archspec.search import architecture_key, load_space

    template = json.loads((TABLES_DIR / "mait_small.jsonl").read_text().splitlines()[0])
    points = {tuple(p[g] for g in GROUPS): (p, spec) for p, spec in load_space("mait_small").points()}
    plan = {(1, 1, 1): ([[0.9, 0.5, 0.5], [0.5, 0.5, 0.5], [0.1, 0.5, 0.5]], "Sch.1-like", 0.70),
            (3, 1, 0): ([[0.9, 0.1, 0.9], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]], None, 0.72),
            (2, 1, 0): ([[0.5] * 3] * 3, "Sch.2-like", 0.75)}
    lines = []
    for counts, (als, hand, acc) in plan.items():
        params, spec = points[counts]
        for seed in (0, 1, 2):
            row = dict(template, key=architecture_key(spec), params=params, seed=seed, hand=hand,
                       final_accuracy=acc + 0.01 * seed, als=[[step, _layers(als)] for step, _ in template["als"]])
            lines.append(json.dumps(row))
    table = tmp_path / "masks.jsonl"
    table.write_text("\n".join(lines) + "\n")
    meta = json.loads((TABLES_DIR / "mait_small.meta.json").read_text())
    (tmp_path / "masks.meta.json").write_text(json.dumps({**meta, "reference_seeds": [0, 1, 2]}))
    assert main(["search", "masks", "--oracle", str(table)]) == 0
    out = capsys.readouterr().out
    assert "round 1: trained 0-1=1 2-3=1 4-5=1" in out and "round 2: trained 0-1=3 2-3=1 4-5=0" in out
    assert "placement: 0-1=2 2-3=1 4-5=0; reference top-1 0.7600 (seeds [0, 1, 2])" in out
    assert "Sch.1-like 0.7100" in out and "Sch.2-like 0.7600" in out
    assert main(["search", "masks", "--oracle", str(table), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["placement"] == dict(zip(GROUPS, (2, 1, 0))) and report["reference_accuracy"] == pytest.approx(0.76)


@pytest.mark.parametrize("argv, field", [
    (["search", "masks", "convit_tiny", "--oracle", "mait_small"], "SPEC"),  # the table's space is the spec
    (["search", "masks"], "SPEC"),
    (["search", "masks", "--oracle", "mait_small", "--window", "2x2"], "--window"),  # windows are centred: odd
    (["search", "masks", "mait_tiny_sch2", "--oracle-subset"], "--oracle-subset")])
def test_search_masks_oracle_refusals_exit_2_naming_the_field(argv, field, tmp_path, monkeypatch, capsys):
    from archspec.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert field in capsys.readouterr().err and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_search_masks_oracle_optuna_searches_the_tables_points(tmp_path, capsys):
    """--strategy optuna on a partial mask table (the 938-step rows of mait_small's first protocol, kept with the
    pilots): a TPE search by accuracy over the points it holds; the best is one of them."""
    from archspec.cli import main
    from archspec.ir.checked import load_spec
    from archspec.search import architecture_key, load_table

    partial = str(Path(__file__).resolve().parents[1] / "research" / "pilots" / "mait_small_s938.rows.jsonl")
    out = tmp_path / "run"
    assert main(["search", "masks", "--oracle", partial, "--oracle-subset", "--strategy", "optuna",
                 "--trials", "3", "--out", str(out), "--json", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["best"].endswith("best.yaml")
    best = architecture_key(load_spec(out / "best.yaml"))
    assert best in load_table(partial).tabulated


def test_the_rules_score_of_a_placement_by_hand(bench_module):
    """Round-1 row with head 0 above uniform at 0.9 / 0.5 / 0.1 per group; thresholds 0.8 / 0.2 centre the score at
    0.5: placement 3/1/0 scores 3/3 * 0.4 + 1/3 * 0 + 0 = 0.4, placement 0/2/3 scores 0 + 0 + 3/3 * -0.4 = -0.4,
    and 1/1/1 (the round-1 point itself) 1/3 * (0.4 + 0 - 0.4) = 0.  With thresholds 0.9 / 0.5 (centre 0.7) 3/1/0
    scores 0.2 - 0.2 / 3.  (The score is research: bench/search_works.py's, reading the table as the replay does.)"""
    rule_score = bench_module("search_works").rule_score
    row = _row((1, 1, 1), _layers([[0.9, 0.0, 0.0], [0.5, 0.0, 0.0], [0.1, 0.0, 0.0]]), 0)
    score = lambda counts, **kw: rule_score(row, 100, dict(zip(GROUPS, counts)), heads=3, u=U, **kw)  # noqa: E731
    assert score((3, 1, 0)) == pytest.approx(0.4)
    assert score((0, 2, 3)) == pytest.approx(-0.4)
    assert score((1, 1, 1)) == pytest.approx(0.0, abs=1e-12)
    assert score((3, 1, 0), high=0.9, low=0.5) == pytest.approx(0.2 - 0.2 / 3)
    # the ALS read is the last curve step <= steps: at step 50 every layer is 0 raw, below uniform -> clipped to 0
    assert rule_score(row, 60, dict(zip(GROUPS, (3, 1, 0))), heads=3, u=U) == pytest.approx(4 / 3 * -0.5)


def test_the_geometry_of_mait_small_is_its_spec():
    """mait_small (archspec/search/spaces/mait_small.yaml): 28 px, patch 4 -> a 7x7 grid, 3 heads, one class token."""
    assert mask_geometry("mait_small") == (3, (7, 7), 1)


# ------------------------------------------------------------------------------ --strategy soft on a mask table
def _soft_row(seed: int, alphas_at_100: dict[str, list], key: str = "soft", seconds: float = 10.0) -> dict:
    return {"key": key, "seed": seed, "params": {}, "macs": 1, "n_params": 1, "final_accuracy": 0.7, "zc": {},
            "curve": [[50, 0.5, 1.0], [100, 0.6, 0.9]], "tse": [[50, 40.0, seconds / 2], [100, 70.0, seconds]],
            "alphas": [[50, {f"0.{l}": [0.5, 0.5, 0.5] for l in range(6)}], [100, alphas_at_100]]}


SOFT_ALPHAS = {"0.0": [0.2, 0.4, 0.9], "0.1": [0.4, 0.2, 0.9],     # group 0-1: means 0.3, 0.3, 0.9
               "0.2": [0.6, 0.7, 0.45], "0.3": [0.5, 0.7, 0.45],   # group 2-3: means 0.55, 0.7, 0.45
               "0.4": [0.8, None, 0.1], "0.5": [0.8, None, 0.1]}   # group 4-5: 0.8, no alpha, 0.1


def test_soft_replay_by_hand():
    """Threshold 0.5: group 0-1 has two heads below (0.3, 0.3), group 2-3 one (0.45), group 4-5 one (0.1; the head
    without an alpha stays global): point 2/1/1.  Threshold 0.6: group 2-3 gains its 0.55 head: 2/2/1.  At step 60
    every alpha is still 0.5, not below 0.5: 0/0/0.  Its cost is the soft model's seconds to the step (10 s at
    100, 5 s at 50, 7.5 s at 75)."""
    table = _table({(1, 1, 1): _layers([[0.5] * 3] * 3)})
    table.soft_rows = {s: _soft_row(s, SOFT_ALPHAS) for s in (0, 1, 2)}
    replay = replay_soft(table, 0, 100)
    assert replay.counts == dict(zip(GROUPS, (2, 1, 1))) and replay.seconds == pytest.approx(10.0)
    assert replay.answered == {} and replay.rounds[0]["alphas"][GROUPS[2]] == [0.8, None, 0.1]
    assert replay_soft(table, 0, 100, threshold=0.6).counts == dict(zip(GROUPS, (2, 2, 1)))
    assert replay_soft(table, 0, 60).counts == dict(zip(GROUPS, (0, 0, 0)))
    assert replay_soft(table, 0, 75).seconds == pytest.approx(7.5)
    other_model = {k: v for k, v in SOFT_ALPHAS.items() if k != "0.5"}  # a sidecar of another model: no layer 5
    table.soft_rows = {s: _soft_row(s, other_model) for s in (0, 1, 2)}
    with pytest.raises(SpecError, match=r"no alphas for layers \['0.5'\]"):
        replay_soft(table, 0, 100)
    table.soft_rows = {0: table.soft_rows[0], 1: table.soft_rows[1]}  # seed 2 missing
    with pytest.raises(SpecError, match="no soft-mask rows for seeds"):
        replay_soft(table, 0, 100)


def _mask_table_files(tmp_path: Path, soft: list[dict] | None) -> Path:
    """A table file shaped like mait_small's: points 1/1/1 and 2/1/1 at seeds 0-2 (2/1/1: 0.74 + 0.01 seed), and
    ``soft`` rows as its soft-mask sidecar."""
    from archspec.search import architecture_key, load_space

    template = json.loads((TABLES_DIR / "mait_small.jsonl").read_text().splitlines()[0])
    points = {tuple(p[g] for g in GROUPS): (p, spec) for p, spec in load_space("mait_small").points()}
    lines = []
    for counts, hand, acc in (((1, 1, 1), "Sch.1-like", 0.70), ((2, 1, 1), None, 0.74)):
        params, spec = points[counts]
        lines += [json.dumps(dict(template, key=architecture_key(spec), params=params, seed=seed, hand=hand,
                                  final_accuracy=acc + 0.01 * seed)) for seed in (0, 1, 2)]
    table = tmp_path / "masks.jsonl"
    table.write_text("\n".join(lines) + "\n")
    meta = json.loads((TABLES_DIR / "mait_small.meta.json").read_text())
    (tmp_path / "masks.meta.json").write_text(json.dumps({**meta, "reference_seeds": [0, 1, 2]}))
    if soft is not None:
        steps = [step for step, _ in template["als"]]
        rows = [dict(template, key="soft-model", params={}, seed=r["seed"], hand=None,
                     alphas=[[step, r["alphas"][-1][1]] for step in steps]) for r in soft]
        (tmp_path / "masks.soft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return table


def test_search_masks_oracle_soft_reads_the_soft_rows(tmp_path, capsys):
    """`archspec search masks --oracle T --strategy soft`: the sidecar's alphas (SOFT_ALPHAS at every step) give
    2/1/1, never trained by the strategy, so scored on every reference seed: 0.7500; without the sidecar, exit 2
    naming --strategy, nothing written."""
    from archspec.cli import main
    from archspec.search import load_table

    table = _mask_table_files(tmp_path, [_soft_row(s, SOFT_ALPHAS) for s in (0, 1, 2)])
    assert sorted(load_table(table).soft_rows) == [0, 1, 2]
    assert main(["search", "masks", "--oracle", str(table), "--strategy", "soft"]) == 0
    out = capsys.readouterr().out
    assert "trained every head soft-masked" in out
    assert "placement: 0-1=2 2-3=1 4-5=1; reference top-1 0.7500 (seeds [0, 1, 2])" in out
    (tmp_path / "masks.soft.jsonl").unlink()
    before = sorted(tmp_path.iterdir())
    assert main(["search", "masks", "--oracle", str(table), "--strategy", "soft"]) == 2
    assert "--strategy" in capsys.readouterr().err and sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("change, message", [
    (lambda r: r.pop("alphas"), "line 2: field alphas: a soft-mask row must hold the learned alphas"),
    (lambda r: r.update(protocol_id="other"), "line 2: field protocol_id"),
    (lambda r: r.update(key="another-model"), "one soft-mask model"),
    (lambda r: r["alphas"][0][1].update({"0.0": [1.5, 0.5, 0.5]}), r"line 2: field alphas\[0\]\.0\.0")])
def test_a_bad_soft_sidecar_is_refused_naming_it_and_the_line(tmp_path, change, message):
    from archspec.search import load_table

    table = _mask_table_files(tmp_path, [_soft_row(s, SOFT_ALPHAS) for s in (0, 1, 2)])
    sidecar = tmp_path / "masks.soft.jsonl"
    rows = [json.loads(line) for line in sidecar.read_text().splitlines()]
    change(rows[1])
    sidecar.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SpecError, match=message) as info:
        load_table(table)
    assert "masks.soft.jsonl" in str(info.value)


def test_a_soft_masked_model_has_its_alphas_read_and_a_hard_one_none():
    """The row writer's alpha reader: mait_small's model with every head soft-masked starts every alpha at
    sigmoid(logit(0.5)) = 0.5 (MaiT sec. 4.3's init, archspec's alpha_init); a hard-masked point has no alpha."""
    from archspec.nn.compiler import compile as compile_spec
    from archspec.search import load_space
    from archspec.search._space.mask_placement import apply_placement, soft_heads
    from archspec.search._tabulation.rows import _alpha_reader

    points = {tuple(p[g] for g in GROUPS): spec for p, spec in load_space("mait_small").points()}
    hard = points[(3, 3, 3)]
    soft = apply_placement(points[(0, 0, 0)], soft_heads(points[(0, 0, 0)], (3, 3)))
    read = _alpha_reader(compile_spec(soft))
    assert read is not None
    alphas = read(compile_spec(soft))
    assert sorted(alphas) == [f"0.{layer}" for layer in range(6)]
    assert all(values == [0.5, 0.5, 0.5] for values in alphas.values())
    assert _alpha_reader(compile_spec(hard)) is None


def test_a_soft_mask_sidecar_is_no_shipped_table():
    """mait_small.soft.jsonl is a sidecar: not listed among the shipped tables, not loadable by the bare name."""
    from archspec.search import load_table
    from archspec.search._tabulation.oracle import shipped_tables

    assert (TABLES_DIR / "mait_small.soft.jsonl").is_file()
    assert shipped_tables() == ["levit_small", "mait_small"]
    with pytest.raises(SpecError, match="no such table"):
        load_table("mait_small.soft")


# ------------------------------------------------------------------------------ issue 80: a mask table's inputs
def _edit_table(path: Path, edit) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    edit(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _set_als(rows, row: int, entry: int, layer: str, value) -> None:
    rows[row]["als"][entry][1][layer] = value


@pytest.mark.parametrize("edit, words", [
    (lambda r: _set_als(r, 1, 0, "0.0", [7.0, 0.5, 0.5]), "line 2: field als[0].0.0: ALS must be a list of fractions "
                                                         "in [0, 1] (one per head), not [7.0, 0.5, 0.5]"),
    (lambda r: _set_als(r, 1, 2, "0.4", [0.5, -3.0, 0.5]), "line 2: field als[2].0.4: ALS must be a list of fractions"),
    (lambda r: _set_als(r, 1, 0, "0.0", "0.5 0.5 0.5"), "line 2: field als[0].0.0: ALS must be a list of fractions"),
    (lambda r: r[1].update(als="high"), "line 2: field als: must be a non-empty list of [step, {layer: [ALS per "
                                        "head]}] at the curve's steps"),
    (lambda r: _set_als(r, 1, 0, "0.3", [0.5, 0.5]), "line 2: field als[0].0.3: 2 heads, where als[0].0.0 has 3"),
    (lambda r: r[1]["als"][1][1].pop("0.5"), "line 2: field als[1]: layers 0.0, 0.1, 0.2, 0.3, 0.4, not those of "
                                             "als[0]"),
])
def test_a_mask_tables_als_is_checked_by_value(tmp_path, capsys, edit, words):
    """Issue 80: ALS of 7.0 or -3.0, ALS as text (a TypeError in the replay), a layer with another head count were
    read without a word; refused by the table's row checks, naming the file, line and field; `search masks
    --oracle` exits 2 before printing anything."""
    from archspec.cli import main
    from archspec.search import load_table

    table = _mask_table_files(tmp_path, None)
    _edit_table(table, edit)
    with pytest.raises(SpecError, match=re.escape(words)):
        load_table(table)
    assert main(["search", "masks", "--oracle", str(table)]) == 2
    captured = capsys.readouterr()
    assert words in captured.err and "Traceback" not in captured.err and captured.out == ""


@pytest.mark.parametrize("edit, words", [
    (lambda r: [x["als"][i][1].pop("0.5") for x in r for i in range(len(x["als"]))],
     "line 1: field als[0]: no ALS of layer 0.5 (the space's layers: 0.0, 0.1, 0.2, 0.3, 0.4, 0.5)"),
    (lambda r: [x["als"][i][1].update({k: v[:2] for k, v in x["als"][i][1].items()}) for x in r
                for i in range(len(x["als"]))],
     "line 1: field als[0].0.0: 2 heads, where the space's layers have 3"),
])
def test_a_mask_table_whose_als_is_not_of_its_space_is_refused(tmp_path, capsys, edit, words):
    """Issue 80: every row without layer 5's ALS (a KeyError in the replay), or with two heads per layer where
    mait_small has three (read without a word): exit 2 naming the table, its first row and the field."""
    from archspec.cli import main

    table = _mask_table_files(tmp_path, None)
    _edit_table(table, edit)
    assert main(["search", "masks", "--oracle", str(table)]) == 2
    err = capsys.readouterr().err
    assert f"{table}: --oracle: {words}" in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv, option, words", [
    (["--window", "5x5"], "--window", "the table's ALS was measured with 3x3 windows (its protocol's als.window), "
                                      "not 5x5"),
    (["--als-low", "0.9", "--als-high", "0.1"], "--als-low", "need 0 <= --als-low < --als-high <= 1, got 0.9 and 0.1"),
    (["--als-high", "5"], "--als-low", "got 0.2 and 5"),
    (["--als-low", "-1"], "--als-low", "got -1 and 0.8"),
    (["--strategy", "soft", "--alpha-threshold", "2"], "--alpha-threshold", "alpha lies in (0, 1); got 2"),
    (["--strategy", "soft", "--window", "5x5"], "--window", "the table's soft masks were trained with 3x3 windows"),
])
def test_search_masks_oracle_refuses_what_the_table_cannot_answer(tmp_path, capsys, argv, option, words):
    """Issue 80: `search masks --oracle` accepted a window the table's ALS was not measured with, thresholds outside
    [0, 1] or in the wrong order, an alpha threshold outside (0, 1) -- each refused by live search -- and answered;
    now the live check (or the table's own protocol) refuses them, exit 2 naming the flag, nothing printed."""
    from archspec.cli import main

    table = _mask_table_files(tmp_path, [_soft_row(s, SOFT_ALPHAS) for s in (0, 1, 2)])
    assert main(["search", "masks", "--oracle", str(table), *argv]) == 2
    captured = capsys.readouterr()
    assert f"{option}:" in captured.err and words in captured.err and captured.out == "", captured.err


@pytest.mark.parametrize("before", [["--budget-flops", "1G"], ["--list"]])
def test_design_only_options_before_masks_oracle_are_refused(capsys, before):
    """Issue 80: ``archspec search --budget-flops 1G masks --oracle T`` and ``--list`` were ignored by the replay,
    where live mask placement refuses them; now refused the same way."""
    from archspec.cli import main

    assert main(["search", *before, "masks", "--oracle", "mait_small"]) == 2
    captured = capsys.readouterr()
    assert f"{before[0]}:" in captured.err and "mode 1" in captured.err and captured.out == ""


def test_mask_groups_of_a_whole_stage_and_of_one_layer():
    """Issue 80: a masks space without ``group`` draws one count for the whole stage (``stages.0.heads_mix.masked``),
    with ``group: 1`` one per layer (``masked.3``); both are mask tables' parameters (sampling.py's names)."""
    assert mask_groups({"stages.0.heads_mix.masked": 1}, depths={0: 2}) == {"stages.0.heads_mix.masked": (0, [0, 1])}
    assert mask_groups({"stages.1.heads_mix.masked.3": 0}) == {"stages.1.heads_mix.masked.3": (1, [3])}
    with pytest.raises(SpecError, match="the depth of stage 0"):
        mask_groups({"stages.0.heads_mix.masked": 1})


WHOLE_STAGE = tiny_masks_space("{steps: 20, warmup_steps: 2, curve_steps: [10, 20]}", name="whole_stage")


def test_a_table_of_a_space_with_one_group_a_stage_replays(tmp_path, capsys):
    """Issue 80: a kind: masks space whose one group is the whole stage (no ``group``) tabulated, then `search masks
    --oracle` refused it as "not a mask table".  By hand, on its 4x4 grid with a class token (u = 100 / 16 / 17):
    round 1 trains masked=1, head 0's raw ALS 0.95 is (0.95 - u) / (1 - u) = 0.92 >= 0.8 above uniform: every
    head, masked=2; round 2 trains masked=2, head 1's raw ALS 0.1 is below uniform (0 <= 0.2): it loses its mask,
    masked=1.  The table's space is a file: SPEC names it (without it, exit 2 saying so)."""
    from archspec.cli import main
    from archspec.search import export_table, load_space, table_protocol, tabulate

    space_file = tmp_path / "whole_stage.yaml"
    space_file.write_text(WHOLE_STAGE)
    space = load_space(str(space_file))
    als_of = {0: [0.3, 0.3], 1: [0.95, 0.3], 2: [0.95, 0.1]}

    def train(spec, seed):
        masked = sum(h.mask is not None for h in spec.layer_plans(0)[0].heads)
        als = {"0.0": als_of[masked], "0.1": als_of[masked]}
        return {"zc": {}, "zc_seconds": {}, "curve": [[10, 0.5, 1.0], [20, 0.6, 0.9]], "tse": [[10, 5.0, 0.1],
                [20, 9.0, 0.2]], "als": [[10, als], [20, als]], "final_accuracy": 0.5 + masked / 10 + seed / 100,
                "final_val_loss": 0.9, "train_seconds": 0.2, "eval_seconds": 0.0}

    url = f"journal:{tmp_path / 't.journal'}"
    tabulate(space, storage=url, protocol=table_protocol(space), train=train, log=lambda s: None)
    table, _ = export_table(space, tmp_path / "whole.jsonl", storage=url)
    assert main(["search", "masks", str(space_file), "--oracle", str(table)]) == 0
    out = capsys.readouterr().out
    assert "round 1: trained masked=1" in out and "round 2: trained masked=2" in out, out
    assert "placement: masked=1;" in out
    assert main(["search", "masks", "--oracle", str(table)]) == 2
    err = capsys.readouterr().err
    assert f"{table}: SPEC: the table tabulates space 'whole_stage', which is no shipped space" in err, err
