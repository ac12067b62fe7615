"""CoAtNet's plan question (Dai et al. 2021, sec. 3.2) as a search (issue 83, item 5): the shipped coatnet_plans
space draws each stage of a four-stage plan as conv (MBConv) or attention (global with a signed relative bias,
7x7 windows, or MaxViT's 7x7 grid), with depths and a width; every point is valid, its plan is its label and its
counts are the header's; a search on it names each design's plan in its report and its trials."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import optuna
import pytest

from archspec import analyze, load_spec
from archspec.cli import main
from archspec.search._space.language import load_space

PLANS = {"C-C-C-C": 12, "C-C-C-T": 12, "C-C-T-T": 36, "C-T-T-T": 108}  # depth x width x attention choices


@pytest.mark.slow  # 168 points through the IR: seconds
def test_every_point_is_valid_its_plan_is_its_label_and_the_header_counts_hold():
    space = load_space("coatnet_plans")
    points = list(space.points())
    assert {label: sum(p["stages"] == label for p, _ in points) for label in PLANS} == PLANS
    macs, params = [], []
    for point, spec in points:
        assert spec.plan == point["stages"]
        grids = [stage.attention.letter for stage in spec.stages if not hasattr(stage, "block")]
        assert set(grids) <= {"R", "W", "O"}  # signed relative bias, window, grid
        a = analyze(spec)
        macs.append(a.macs)
        params.append(a.params)
    # archspec/search/spaces/coatnet_plans.yaml's header
    assert min(macs) == pytest.approx(1.57e9, rel=0.005) and max(macs) == pytest.approx(5.85e9, rel=0.005)
    assert statistics.median(macs) == pytest.approx(3.66e9, rel=0.005) and sum(m <= 3.5e9 for m in macs) == 78
    assert min(params) == pytest.approx(15.9e6, rel=0.005) and max(params) == pytest.approx(32.0e6, rel=0.005)
    assert analyze(space.smallest()).macs == min(macs)


def test_the_grid_of_a_t_stage_is_maxvits_seven_by_seven():
    """MaxViT's grid attention on G x G = 7 x 7 groups is the grid kind's stride H / G: 4 on 28x28, 2 on 14x14 --
    written ``grid:4`` and ``grid:2`` (a single side, as ``window:7``)."""
    space = load_space("coatnet_plans")
    spec = space.sample(optuna.trial.FixedTrial({
        "stages": "C-T-T-T", "stages.C-T-T-T.1.depth": 2, "stages.C-T-T-T.1.attention": "grid:4",
        "stages.C-T-T-T.2.depth": 3, "stages.C-T-T-T.2.dim": 256, "stages.C-T-T-T.2.attention": "grid:2"}))
    assert spec.plan == "C-T-T-T"
    assert spec.stages[1].attention.grid.stride == (4, 4) and spec.stages[2].attention.grid.stride == (2, 2)
    rows = {row.layer: row for row in analyze(spec).rows}
    for stage, stride in ((1, 4), (2, 2)):  # each grid / stride = 7: the 7 x 7 groups of MaxViT's grid attention
        grid = rows[f"stages.{stage}.blocks.0"].grid
        assert (grid[0] // stride, grid[1] // stride) == (7, 7) and grid[0] % stride == 0


def test_a_space_file_takes_top_level_anchor_keys_and_still_refuses_unknown_ones(tmp_path: Path):
    """``x-...`` keys hold YAML anchors at a space file's top level, as in spec files; any other unknown key is
    refused, located."""
    base = ("x-stage: &stage {depth: 1, dim: 16, heads: 2}\nname: s\nspec:\n  input: {channels: 3, resolution: 32}\n"
            "  stem: {kind: patch, patch_size: 8}\n  stages: [{<<: *stage, depth: {int: [1, 2]}}]\n"
            "  head: {num_classes: 10}\n")
    good = tmp_path / "good.yaml"
    good.write_text(base, encoding="utf-8")
    assert len(list(load_space(str(good)).points())) == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text(base + "y-stage: 1\n", encoding="utf-8")
    assert main(["search", "--space", str(bad), "--trials", "1", "--out", str(tmp_path / "run")]) == 2
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # two proxy trainings
def test_a_search_on_the_plans_names_each_designs_plan(tmp_path: Path, capsys, one_thread):
    out = tmp_path / "run"
    rc = main(["search", "--space", "coatnet_plans", "--out", str(out), "--trials", "2", "--fidelity", "none",
               "--proxy-steps", "2", "--proxy-size", "32", "--proxy-batch", "8", "--max-images", "40",
               "--latency-repeats", "1", "--budget-flops", "3.5G", "--no-progress", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pareto"] and all(p["plan"] in PLANS for p in summary["pareto"])
    best = load_spec(out / "best.yaml")
    assert best.plan == summary["pareto"][0]["plan"] and best.input.resolution == (224, 224)
    with open(out / "trials.csv", newline="") as f:
        trials = list(csv.DictReader(f))
    assert all(row["plan"] in PLANS for row in trials if row["status"] == "trained")
