"""Finite spaces and the oracle: ``SearchSpace.points``, ``archspec search --list``, ``--oracle TABLE`` (issue 32).

The oracle is checked against hand-made tables: each answer must be the table's own number (a curve point, a
log-linear interpolation computed here by hand, a zero-cost score, a latency), and the real engine must pick the
design the table says is best.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from search_fixtures import TINY_SPACE

from archspec.errors import SpecError
from archspec.ir.analysis import analyze
from archspec.search import run_design
from archspec.search._evaluation.latency import architecture_key
from archspec.search._space.language import load_space
from archspec.search._tabulation.oracle import load_table

CURVE_STEPS = [10, 20, 40, 80]


def _row(spec, seed: int, final: float, zc: float) -> dict:
    """A table row whose curve rises to ``final`` (linearly in log step) and costs 1 s per step."""
    curve = [[s, round(final * (0.5 + 0.5 * math.log(s / 10) / math.log(8)), 6), 1.0] for s in CURVE_STEPS]
    tse = [[s, 2.0 * s, float(s)] for s in CURVE_STEPS]
    counts = analyze(spec)
    return {"key": architecture_key(spec), "seed": seed, "params": {}, "macs": counts.macs,
            "n_params": counts.params, "curve": curve, "tse": tse, "final_accuracy": final,
            "zc": {"synflow": zc, "naswot": -zc, "grad_norm": 1.0}, "zc_seconds": {"synflow": 0.01}}


def _table(tmp_path, finals=None, drop: int | None = None, latency: bool = False, space: str = "tiny"):
    """A complete table of TINY_SPACE's 4 points (seeds 0 and 1); point ``i`` reaches ``finals[i]``."""
    points = list(load_space(TINY_SPACE).points())
    finals = finals or [0.5, 0.6, 0.7, 0.8]
    path = tmp_path / "tiny.jsonl"
    rows = [_row(spec, seed, finals[i] - 0.01 * seed, zc=float(i))
            for i, (_, spec) in enumerate(points) for seed in (0, 1) if i != drop]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "tiny.meta.json").write_text(json.dumps({"protocol": {"space": space, "image_size": 32,
                                                                      "channels": 3, "num_classes": 10}}))
    if latency:
        (tmp_path / "tiny.latency.json").write_text(json.dumps(
            {"ms": {architecture_key(spec): [0.5 + i, 1.5 + i] for i, (_, spec) in enumerate(points)}}))
    return path, points


def test_points_enumerates_every_point_once_and_fixedtrial_reproduces_it():
    space = load_space(TINY_SPACE)
    points = list(space.points())
    assert len(points) == 4  # depth {1, 2} x dim {16, 32}
    assert {(p["stages.0.depth"], p["stages.0.dim"]) for p, _ in points} == {(1, 16), (1, 32), (2, 16), (2, 32)}
    for params, spec in points:
        again = space.sample(optuna.trial.FixedTrial(params))
        assert architecture_key(again) == architecture_key(spec)


def test_points_walks_conditional_parameters_only_where_they_exist():
    doc = json.loads(json.dumps(TINY_SPACE))
    doc["spec"]["stages"] = {"choice": {
        "one": [doc["spec"]["stages"][0]],
        "fixed": [{**doc["spec"]["stages"][0], "depth": 1, "dim": 16}],
    }}
    points = list(load_space(doc).points())
    assert len(points) == 4 + 1
    assert [p for p, _ in points if p["stages"] == "fixed"] == [{"stages": "fixed"}]


def test_points_refuses_a_continuous_range_and_a_space_over_the_limit():
    doc = json.loads(json.dumps(TINY_SPACE))
    doc["spec"]["stages"][0]["mlp_ratio"] = {"float": [1.0, 2.0]}
    with pytest.raises(SpecError, match="continuous float range"):
        list(load_space(doc).points())
    with pytest.raises(SpecError, match="more than 3 points"):
        list(load_space(TINY_SPACE).points(limit=3))


def test_shipped_small_space_is_finite_local_and_spans_four_times_the_macs():
    """Issue 32's space: 150-600 points, a first grid of at least 7x7, MACs spanning at least 4x, every head kind."""
    from archspec.search._evaluation.proxy import stage_grids

    points = list(load_space("levit_small").points())
    assert 150 <= len(points) <= 600
    assert len({architecture_key(s) for _, s in points}) == len(points)
    macs = [analyze(s).macs for _, s in points]
    assert max(macs) / min(macs) >= 4
    assert all(stage_grids(s)[0] == (7, 7) for _, s in points[:: len(points) // 8])
    kinds = {p[k] for p, _ in points for k in p if k.endswith("0.heads_mix")}
    assert kinds == {"mhsa", "levit_bias", "gpsa", "signed_bias", "mask3_mhsa", "mask3_bias", "mask5_bias"}


def test_list_prints_every_point_without_torch(tmp_path):
    space = tmp_path / "tiny.yaml"
    space.write_text(json.dumps(TINY_SPACE))
    code = ("import sys; from archspec.cli import main; rc = main(['search', '--space', sys.argv[1], '--list']); "
            "assert 'torch' not in sys.modules and 'optuna' not in sys.modules, 'imported torch/optuna'; "
            "sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, str(space)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "4 points in space 'tiny'"


def test_table_answers_are_the_tables_numbers(tmp_path):
    path, points = _table(tmp_path)
    table = load_table(path)
    assert table.seeds == [0, 1] and table.curve_steps == CURVE_STEPS
    spec = points[3][1]
    from archspec.search._evaluation.proxy import ProxyProtocol

    reported = []
    result = table.train(spec, None, ProxyProtocol(steps=40, eval_every=20, score="accuracy"), seed=0,
                         report=lambda s, a: reported.append((s, a)))
    key = architecture_key(spec)
    row = table.rows[key][table.seed_of(key, 0)]  # the row drawn for this design in replay 0
    assert reported == [(20, row["curve"][1][1]), (40, row["curve"][2][1])]  # exactly the tabulated points
    assert result.accuracy == row["curve"][2][1] and result.seconds == 40.0
    # between tabulated steps: linear in log(step); 28 steps lie between 20 and 40
    result = table.train(spec, None, ProxyProtocol(steps=28, eval_every=28, score="accuracy"), seed=1)
    a20, a40 = (table.rows[key][table.seed_of(key, 1)]["curve"][i][1] for i in (1, 2))
    assert result.accuracy == pytest.approx(a20 + (a40 - a20) * math.log(28 / 20) / math.log(2))
    assert result.seconds == pytest.approx(28.0) and result.train_loss == pytest.approx(2.0)
    assert table.zero_cost(spec)[0].scores["synflow"] == 3.0
    with pytest.raises(SpecError, match="past the table's curve"):
        table.train(spec, None, ProxyProtocol(steps=81), seed=0)


def test_a_designs_training_seconds_take_each_span_from_its_fastest_row_by_hand(tmp_path):
    """Seed 0 of design 3 was paused between steps 40 and 80 (60 s for 40 steps), seed 1 between 10 and 20 (25 s
    for 10); every other span costs 1 s a step.  Per span the least of the two: 10, 10, 20, 40 s -> 10, 20, 40, 80
    s cumulative, for either seed's replay; 60 steps lie halfway between 40 and 80: 60 s."""
    path, points = _table(tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    key = architecture_key(points[3][1])
    slow = {0: [[10, 20.0, 10.0], [20, 40.0, 20.0], [40, 80.0, 40.0], [80, 160.0, 100.0]],
            1: [[10, 20.0, 10.0], [20, 40.0, 35.0], [40, 80.0, 55.0], [80, 160.0, 95.0]]}
    for row in rows:
        if row["key"] == key:
            row["tse"] = slow[row["seed"]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = load_table(path)
    from archspec.search._evaluation.proxy import ProxyProtocol
    from archspec.search._tabulation.oracle import design_seconds

    assert design_seconds(table.rows[key].values()) == [(0.0, 0.0), (10.0, 10.0), (20.0, 20.0), (40.0, 40.0),
                                                       (80.0, 80.0)]
    for seed in (0, 1, 2, 3):
        result = table.train(points[3][1], None, ProxyProtocol(steps=60, eval_every=60), seed=seed)
        assert result.seconds == pytest.approx(60.0)
    assert table.training_seconds(architecture_key(points[0][1]), 60) == pytest.approx(60.0)  # unpaused: as is


def test_oracle_search_finds_the_tables_best_design(tmp_path, monkeypatch):
    path, points = _table(tmp_path, finals=[0.5, 0.9, 0.6, 0.7])
    monkeypatch.setattr("archspec.search._evaluation.proxy.train_proxy", None)  # would fail if anything trained
    outcome = run_design(space=TINY_SPACE, oracle=str(path), objective="accuracy", fidelity="none", trials=4,
                         protocol={"steps": 80, "score": "accuracy"}, out=tmp_path / "run", progress=False,
                         sampler="random", seed=0)
    assert architecture_key(outcome.best_spec) == architecture_key(points[1][1])
    trained = [t for t in outcome.study.trials if t.user_attrs.get("status") == "trained"]
    assert trained and all(t.user_attrs["proxy_seconds"] == 80.0 for t in trained)
    assert outcome.summary["oracle"]["designs"] == 4


def test_oracle_tse_score_ranks_by_the_tabulated_loss_sums(tmp_path):
    """--proxy-score tse on the oracle: each trial's value is -TSE(k)/k from the table (interpolated linearly
    between tabulated steps: 60 lies between 40 and 80), and the search picks the design with the lowest training
    loss, not the most accurate one."""
    path, points = _table(tmp_path, finals=[0.5, 0.9, 0.6, 0.7])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    keys = [architecture_key(spec) for _, spec in points]
    per_step = {keys[0]: 1.0, keys[1]: 2.0, keys[2]: 0.5, keys[3]: 1.5}  # point 2: lowest loss, not most accurate
    for r in rows:
        r["tse"] = [[s, per_step[r["key"]] * s * (1 + 0.1 * r["seed"]), float(s)] for s in CURVE_STEPS]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    outcome = run_design(space=TINY_SPACE, oracle=str(path), objective="accuracy", fidelity="none", trials=4,
                         verify=0, protocol={"steps": 60, "score": "tse"}, out=tmp_path / "run", progress=False,
                         sampler="random", seed=0)
    assert architecture_key(outcome.best_spec) == keys[2]
    done = [t for t in outcome.study.trials if t.user_attrs.get("status") == "trained"]
    assert len(done) == 4
    table = load_table(path)
    for t in done:  # the loss sum at 60 = per_step * 60 * (1 + 0.1 * the table seed drawn for the design)
        key, seed = t.user_attrs["arch_key"], t.user_attrs["oracle_seed"]
        assert seed == table.seed_of(key, 0)
        assert t.value == pytest.approx(-per_step[key] * (1 + 0.1 * seed))
        assert t.user_attrs["loss_sum"] == pytest.approx(per_step[key] * 60 * (1 + 0.1 * seed))
    best_seed = next(t.user_attrs["oracle_seed"] for t in done if t.user_attrs["arch_key"] == keys[2])
    assert outcome.summary["pareto"][0]["score"] == pytest.approx(-0.5 * (1 + 0.1 * best_seed))
    # its accuracy is still reported: point 2's curve, final * (0.5 + 0.5 log(s/10) / log 8) at s = 60, its final
    # 0.6 less 0.01 per table seed
    final = 0.6 - 0.01 * best_seed
    assert outcome.summary["pareto"][0]["accuracy"] == pytest.approx(final * (0.5 + 0.5 * math.log(6) / math.log(8)),
                                                                     abs=1e-5)


def test_oracle_zero_cost_rung_reads_the_tables_scores(tmp_path):
    path, points = _table(tmp_path)
    outcome = run_design(space=TINY_SPACE, oracle=str(path), objective="accuracy", fidelity="zc", trials=4,
                         protocol={"steps": 80}, out=tmp_path / "run", progress=False, sampler="random")
    scored = {t.user_attrs["arch_key"]: t.user_attrs["zero_cost"]["scores"]["synflow"]
              for t in outcome.study.trials if "zero_cost" in t.user_attrs}
    expected = {architecture_key(spec): float(i) for i, (_, spec) in enumerate(points)}
    assert scored and all(expected[k] == v for k, v in scored.items())


def test_oracle_pareto_uses_the_tables_latency(tmp_path):
    path, points = _table(tmp_path, latency=True)
    outcome = run_design(space=TINY_SPACE, oracle=str(path), fidelity="none", trials=4, protocol={"steps": 80},
                         out=tmp_path / "run", progress=False, sampler="random")
    expected = {architecture_key(spec): 1.0 + i for i, (_, spec) in enumerate(points)}
    done = [t for t in outcome.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and all(t.values[1] == expected[t.user_attrs["arch_key"]] for t in done)


@pytest.mark.parametrize("case, option, match", [
    ("missing", ("oracle",), "lacks 1 design"),
    ("other_space", ("oracle",), "tabulates space 'levit_small'"),
    ("no_latency", ("oracle",), "no latency"),
    ("past_curve", ("protocol", "steps"), "past the table's curve"),
    ("no_file", ("oracle",), "no such table"),
])
def test_oracle_refusals_are_located_and_write_nothing(tmp_path, case, option, match):
    path, _ = _table(tmp_path, drop=2 if case == "missing" else None,
                     space="levit_small" if case == "other_space" else "tiny")
    if case == "no_file":
        path = tmp_path / "nope.jsonl"
    objective = "pareto" if case == "no_latency" else "accuracy"
    steps = 81 if case == "past_curve" else 80
    with pytest.raises(SpecError) as err:
        run_design(space=TINY_SPACE, oracle=str(path), objective=objective, fidelity="none", trials=2,
                   protocol={"steps": steps}, out=tmp_path / "run", progress=False)
    assert err.value.problems[0].path == option and match in str(err.value)
    assert not (tmp_path / "run").exists()


def test_oracle_cli_exit_2_on_a_broken_table(tmp_path, capsys):
    from archspec.cli import main  # in this process, as the other exit-2 tests here (a fresh one took seconds)

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"key": "x"}\n')
    assert main(["search", "--oracle", str(bad), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "not a table row" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_oracle_subset_searches_only_the_tabulated_designs(tmp_path, monkeypatch):
    """--oracle-subset: a design the table lacks is infeasible (never answered, costs nothing); the best of the
    rest wins.  Point 1 (the best) is missing, so point 3 must win."""
    path, points = _table(tmp_path, finals=[0.5, 0.9, 0.6, 0.7], drop=1)
    monkeypatch.setattr("archspec.search._evaluation.proxy.train_proxy", None)  # would fail if anything trained
    outcome = run_design(space=TINY_SPACE, oracle=str(path), oracle_subset=True, objective="accuracy",
                         fidelity="none", trials=3, protocol={"steps": 80, "score": "accuracy"},
                         out=tmp_path / "run", progress=False, sampler="random", seed=0)
    assert architecture_key(outcome.best_spec) == architecture_key(points[3][1])
    missing = architecture_key(points[1][1])
    by_status = {}
    for t in outcome.study.trials:
        by_status.setdefault(t.user_attrs.get("status"), set()).add(t.user_attrs["arch_key"])
    assert missing not in by_status.get("trained", set())
    skipped = [t for t in outcome.study.trials if t.user_attrs["arch_key"] == missing]
    assert all(t.user_attrs["infeasible_reason"] == "not in the oracle's table (--oracle-subset)" for t in skipped)
    assert outcome.summary["oracle"]["subset"] is True and outcome.summary["oracle"]["designs"] == 3


def test_reference_seeds_decide_which_designs_a_partial_table_holds(tmp_path):
    """A design being written (seed 0 of the sidecar's reference seeds 0 and 1) is not yet in the table; extra
    seeds of another design do not change the reference."""
    path, points = _table(tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    partial = architecture_key(points[0][1])
    rows = [r for r in rows if not (r["key"] == partial and r["seed"] == 1)]
    rows.append({**rows[-1], "seed": 2, "final_accuracy": 0.1})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = json.loads((tmp_path / "tiny.meta.json").read_text())
    (tmp_path / "tiny.meta.json").write_text(json.dumps({**meta, "reference_seeds": [0, 1]}))
    table = load_table(path)
    assert table.seeds == [0, 1] and table.tabulated == {architecture_key(s) for _, s in points[1:]}
    with pytest.raises(SpecError, match="not in the table"):
        table.row(points[0][1], 0)
    key = architecture_key(points[3][1])
    drawn = {table.row(points[3][1], s)["seed"] for s in range(40)}
    assert drawn == {0, 1}  # replays draw among the reference seeds only, never the extra seed 2
    assert table.row(points[3][1], 2)["seed"] == table.seed_of(key, 2)
    with pytest.raises(SpecError, match="lacks 1 design"):
        run_design(space=TINY_SPACE, oracle=str(path), objective="accuracy", fidelity="none", trials=2,
                   protocol={"steps": 80}, out=tmp_path / "run", progress=False)


def test_oracle_subset_without_oracle_is_exit_2(tmp_path, capsys):
    from archspec.cli import main

    assert main(["search", "--oracle-subset", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--oracle-subset needs --oracle" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field, value, words", [
    ("curve", [[10, "high", 1.0]], "curve and tse"),
    ("curve", [[20, 0.5, 1.0], [10, 0.6, 1.0]], "increasing steps"),
    ("tse", [[10, 1.0, 1.0]], "same steps"),
    ("zc", {"synflow": "big"}, "zc must map"),
    ("seed", "0", "seed an integer"),
])
def test_a_malformed_row_is_a_located_error(tmp_path, field, value, words):
    path, _ = _table(tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1][field] = value
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(SpecError) as err:
        load_table(path)
    assert err.value.problems[0].path == ("oracle",) and "line 2" in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("value", [[], [0, "1"], "0,1", [True], {"0": 1}])
def test_malformed_reference_seeds_are_a_located_error(tmp_path, capsys, value):
    """The sidecar's reference seeds decide which designs the oracle answers: anything but a non-empty list of
    integers is refused naming the sidecar and the field (exit 2, no run directory), never silently ignored."""
    from archspec.cli import main

    path, _ = _table(tmp_path)
    meta = json.loads((tmp_path / "tiny.meta.json").read_text())
    (tmp_path / "tiny.meta.json").write_text(json.dumps({**meta, "reference_seeds": value}))
    with pytest.raises(SpecError, match="tiny.meta.json, line 1: field reference_seeds must be a non-empty list"):
        load_table(path)
    assert main(["search", "--space", str(TINY_SPACE), "--oracle", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "reference_seeds" in err and str(path) in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option, says", [
    (["--oracle", "levit_small"], "not a per-group mask count"),  # a design table: masks replay only mask tables
    (["--oracle-subset"], "applies to a replay on a table"), (["--list"], "applies to mode 1")])
def test_mask_placement_refuses_design_only_options(tmp_path, capsys, option, says):
    from archspec.cli import main

    assert main(["search", *option, "masks", "mait_tiny_sch1", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert option[0] in err and says in err and not (tmp_path / "m").exists()


def test_each_replay_draws_each_designs_table_seed_on_its_own(tmp_path):
    """Issue 54: the seed that answers is a hash of (replay seed, design), by hand; over replays it is uniform on
    the reference seeds and independent between designs (not ``--seed mod 3`` for every design); the trial and
    trials.csv record it."""
    import csv
    import hashlib

    path, points = _table(tmp_path)
    table = load_table(path)
    keys = [architecture_key(spec) for _, spec in points]
    by_hand = table.seeds[int.from_bytes(hashlib.sha256(f"oracle:7:{keys[0]}".encode()).digest()[:8], "big") % 2]
    assert table.seed_of(keys[0], 7) == by_hand
    draws = [[table.seed_of(k, r) for k in keys] for r in range(400)]
    for j in range(len(keys)):  # uniform: each seed about half the time (400 draws: 200 +- 3 sd = 170..230)
        assert 170 <= sum(d[j] == 0 for d in draws) <= 230
    same = sum(d[0] == d[1] for d in draws)  # independent designs agree half the time, not always
    assert 170 <= same <= 230
    outcome = run_design(space=TINY_SPACE, oracle=str(path), objective="accuracy", fidelity="none", trials=4,
                         protocol={"steps": 80, "score": "accuracy"}, out=tmp_path / "run", progress=False,
                         sampler="random", seed=5)
    trained = [t for t in outcome.study.trials if t.user_attrs.get("status") == "trained"]
    assert trained and all(t.user_attrs["oracle_seed"] == table.seed_of(t.user_attrs["arch_key"], 5) for t in trained)
    with (tmp_path / "run" / "trials.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["status"] == "trained"]
    assert rows and all(r["oracle_seed"] == str(table.seed_of(r["arch_key"], 5)) for r in rows)


@pytest.mark.slow  # retrains the front's best: seconds
def test_verify_retrains_the_fronts_best_with_another_table_seed_inside_the_trials(tmp_path):
    """--verify 2 with --trials 8: six candidates are searched (the table has four designs: the search trains each
    once), then the best two trained designs are answered
    again by the other table seed (seed 0 rows hold finals - 0, seed 1 rows finals - 0.01: the two seeds agree on
    the order, tau 1, and differ by the table's curve at 80 steps); both scores and the spread are reported."""
    from archspec.search._engine.verify import verify_count

    path, points = _table(tmp_path, finals=[0.5, 0.9, 0.6, 0.7])
    table = load_table(path)
    outcome = run_design(space=TINY_SPACE, oracle=str(path), objective="accuracy", fidelity="none", trials=8,
                         verify=2, protocol={"steps": 80, "score": "accuracy"}, out=tmp_path / "run",
                         progress=False, sampler="random", seed=0)
    trained = [t for t in outcome.study.trials if t.user_attrs.get("status") == "trained"]
    assert verify_count(2, 8) == 2 and len(trained) == 4  # all four designs (duplicates are not trained twice)
    v = outcome.summary["verify"]
    best_two = sorted(trained, key=lambda t: -t.values[0])[:2]
    assert v["k"] == 2 and [d["trial"] for d in v["designs"]] == [t.number for t in best_two]
    for d in v["designs"]:
        first = next(t for t in trained if t.number == d["trial"]).user_attrs["oracle_seed"]
        second = table.seed_of(d["arch_key"], d["seeds"][1])
        assert second != first  # another row of the table, never the same one again
        rows = table.rows[d["arch_key"]]
        assert d["score"] == [pytest.approx(rows[first]["curve"][-1][1]), pytest.approx(rows[second]["curve"][-1][1])]
    scores = [d["score"] for d in v["designs"]]
    assert v["seed_spread"] == pytest.approx(max(abs(a - b) for a, b in scores))
    assert v["rank_agreement"] in (-1.0, 1.0)
    again = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert again["verify"]["designs"] == v["designs"]


def test_verify_zero_trains_every_candidate_and_reports_nothing(tmp_path):
    path, _ = _table(tmp_path)
    outcome = run_design(space=TINY_SPACE, oracle=str(path), objective="accuracy", fidelity="none", trials=3,
                         verify=0, protocol={"steps": 80, "score": "accuracy"}, out=tmp_path / "run",
                         progress=False, sampler="random", seed=0)
    assert sum(t.user_attrs.get("status") == "trained" for t in outcome.study.trials) == 3
    assert "verify" not in outcome.summary


def test_ties_within_the_seed_spread_and_the_time_reserve_by_hand():
    """Scores 0.80, 0.79, 0.70 with a seed spread of 0.02: the second point is within it of the first, the third
    is not.  The time reserve stops sampling once elapsed + k x mean training time reaches the timeout."""
    from types import SimpleNamespace

    from archspec.search._engine.verify import TimeReserve, mark_ties, verify_count

    points = [{"trial": 1, "accuracy": 0.80}, {"trial": 2, "accuracy": 0.79}, {"trial": 3, "accuracy": 0.70}]
    mark_ties(points, {"seed_spread": 0.02, "designs": [{"trial": 1, "score": [0.80, 0.78]}]})
    assert [p["within_seed_spread"] for p in points] == [False, True, False] and points[0]["second_seed_score"] == 0.78
    assert verify_count(3, 16) == 3 and verify_count(3, 8) == 2 and verify_count(3, 3) == 0
    assert verify_count(3, None) == 3

    stopped = []
    study = SimpleNamespace(stop=lambda: stopped.append(True))
    reserve = TimeReserve(k=2, timeout=100.0, start=0.0)
    import time as _time

    reserve.start = _time.perf_counter() - 50.0  # 50 s elapsed
    reserve(study, SimpleNamespace(user_attrs={"status": "trained", "train_seconds": 20.0}))
    assert stopped == []  # 50 + 2 x 20 = 90 < 100
    reserve(study, SimpleNamespace(user_attrs={"status": "trained", "train_seconds": 40.0}))
    assert stopped == [True]  # 50 + 2 x 30 = 110 >= 100


# ----------------------------------------------------------------------------------- issue 57: values, not shapes
SHIPPED = Path(__file__).resolve().parent.parent / "archspec" / "search" / "tables"


def _shipped_copy(tmp_path) -> Path:
    """A copy of the shipped levit_small table and its sidecars in ``tmp_path`` (the shipped files stay untouched)."""
    for p in SHIPPED.glob("levit_small.*"):
        shutil.copy(p, tmp_path / p.name)
    return tmp_path / "levit_small.jsonl"


def _edit_rows(path: Path, edit) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    edit(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=1))


def _set_point(row: dict, field: str, i: int, j: int, value) -> None:
    row[field][i][j] = value


def _cut_curve(row: dict, n: int) -> None:
    row["curve"], row["tse"] = row["curve"][:n], row["tse"][:n]


def _shipped_rows() -> list[dict]:
    """The shipped table's rows, read as plain JSON (it grows while the whole space is tabulated)."""
    return [json.loads(line) for line in (SHIPPED / "levit_small.jsonl").read_text().splitlines() if line.strip()]


def _complete(rows: list[dict], seeds=(0, 1, 2)) -> set[str]:
    """The designs holding every reference seed, counted by hand."""
    by: dict[str, set] = {}
    for r in rows:
        by.setdefault(r["key"], set()).add(r["seed"])
    return {k for k, v in by.items() if set(seeds) <= v}


_SHIPPED_LINES = len(_shipped_rows())
_BAD_ROWS = [  # (what the issue saw, edit of the rows, where, the words of the refusal)
    ("accuracy -5", lambda r: _set_point(r[3], "curve", 2, 1, -5.0), "line 4: field curve[2][1]",
     "in [0, 1], not -5.0"),
    ("accuracy 1e300", lambda r: _set_point(r[3], "curve", 2, 1, 1e300), "line 4: field curve[2][1]", "not 1e+300"),
    ("accuracy NaN", lambda r: _set_point(r[3], "curve", 2, 1, math.nan), "line 4: field curve[2][1]", "not NaN"),
    ("negated TSE", lambda r: [x.update(tse=[[s, -t, c] for s, t, c in x["tse"]]) for x in r],
     "line 1: field tse[0][1]", "sum of training losses must be a finite number >= 0"),
    ("TSE inf", lambda r: _set_point(r[3], "tse", 2, 1, math.inf), "line 4: field tse[2][1]", "not Infinity"),
    ("TSE falls", lambda r: _set_point(r[3], "tse", 2, 1, 1.0), "line 4: field tse[2][1]", "falls from"),
    ("final accuracy 2", lambda r: r[0].update(final_accuracy=2.0), "line 1: field final_accuracy", "in [0, 1]"),
    ("zc NaN", lambda r: r[0]["zc"].update(synflow=math.nan), "line 1: field zc.synflow", "finite numbers or null"),
    ("conflicting duplicate", lambda r: r.append({**r[0], "final_accuracy": 0.1}),
     f"line {_SHIPPED_LINES + 1}: design 0300dba68545 seed 0", "second, different row (first: line 1)"),
    ("foreign protocol_id", lambda r: r[5].update(protocol_id="other"), "line 6: field protocol_id",
     "is not the sidecar's \"355be66f46fc\""),
]


@pytest.mark.parametrize("case, edit, where, words", _BAD_ROWS, ids=[c[0] for c in _BAD_ROWS])
def test_a_table_is_checked_by_value(tmp_path, capsys, case, edit, where, words):
    """Issue 57: each damaged number of a copy of the shipped table, once silently used, is exit 2 naming the file,
    the line and the field, before the run directory exists."""
    from archspec.cli import main

    path = _shipped_copy(tmp_path)
    _edit_rows(path, edit)
    with pytest.raises(SpecError) as err:
        load_table(path)
    assert where in str(err.value) and words in str(err.value) and err.value.problems[0].file == str(path)
    assert main(["search", "--space", "levit_small", "--oracle", str(path), "--oracle-subset", "--objective",
                 "accuracy", "--trials", "3", "--out", str(tmp_path / "run")]) == 2
    stderr = capsys.readouterr().err
    assert where in stderr and "Traceback" not in stderr and not (tmp_path / "run").exists()


def test_an_identical_duplicate_row_is_accepted(tmp_path):
    path = _shipped_copy(tmp_path)
    _edit_rows(path, lambda r: r.append(dict(r[0])))
    first = json.loads(path.read_text().splitlines()[0])
    table = load_table(path)
    assert table.lines[(first["key"], first["seed"])] == 1 and table.rows[first["key"]][first["seed"]] == first
    assert table.tabulated == _complete(_shipped_rows())


def test_every_rows_curve_must_reach_the_proxy_steps(tmp_path):
    """Only the first row's steps were checked: a later row that ends early answered with its last point."""
    path = _shipped_copy(tmp_path)
    _edit_rows(path, lambda r: _cut_curve(r[7], 3))  # line 8 ends at 100 steps
    table = load_table(path)
    table.check_steps(100)
    with pytest.raises(SpecError) as err:
        table.check_steps(120)
    assert err.value.problems[0].path == ("protocol", "steps") and "line 8" in str(err.value)
    assert "ends at 100 steps" in str(err.value)


_BAD_SIDECARS = [
    ("levit_small.meta.json", lambda m: m.update(protocol=[1, 2]), "levit_small.meta.json, line 2: field protocol",
     "must be a JSON object"),
    ("levit_small.meta.json", lambda m: m["protocol"].update(image_size="big"),
     "levit_small.meta.json, line 5: field protocol.image_size", "positive integer, not \"big\""),
    ("levit_small.latency.json", lambda m: m.update(ms=[1.0, 2.0]), "levit_small.latency.json, line 18: field ms",
     "must map design keys to ms"),
    ("levit_small.latency.json", lambda m: m["ms"].update({next(iter(m["ms"])): [math.inf]}),
     "levit_small.latency.json, line 19: field ms.8783e6b76a68", "positive finite ms"),
    ("levit_small.latency.json", lambda m: m["ms"].update({next(iter(m["ms"])): -1.0}),
     "levit_small.latency.json, line 19: field ms.8783e6b76a68", "positive finite ms"),
]


@pytest.mark.parametrize("sidecar, edit, where, words", _BAD_SIDECARS)
def test_a_sidecars_types_are_checked(tmp_path, capsys, sidecar, edit, where, words):
    """Issue 57: wrong types in a sidecar were tracebacks (AttributeError, ValueError); now exit 2 naming the table,
    the sidecar, its line and the field, before anything is written."""
    from archspec.cli import main

    path = _shipped_copy(tmp_path)
    _edit_json(tmp_path / sidecar, edit)
    with pytest.raises(SpecError) as err:
        load_table(path)
    assert where in str(err.value) and words in str(err.value)
    assert main(["search", "--space", "levit_small", "--oracle", str(path), "--out", str(tmp_path / "run")]) == 2
    stderr = capsys.readouterr().err
    assert where in stderr and "Traceback" not in stderr and not (tmp_path / "run").exists()


def test_a_latency_sidecar_of_some_designs_is_refused_up_front(tmp_path, capsys):
    """A latency sidecar holding only some designs made each missing one a failed trial while the search sampled on
    (296 failed trials); a Pareto search (or a latency budget) now refuses it before writing anything."""
    from archspec.cli import main

    path = _shipped_copy(tmp_path)
    kept = list(json.loads((tmp_path / "levit_small.latency.json").read_text())["ms"])[:100]
    _edit_json(tmp_path / "levit_small.latency.json", lambda m: m.update(ms=dict(list(m["ms"].items())[:100])))
    tabulated = _complete([json.loads(line) for line in path.read_text().splitlines()])
    assert main(["search", "--space", "levit_small", "--oracle", str(path), "--oracle-subset", "--trials", "3",
                 "--out", str(tmp_path / "run")]) == 2
    stderr = capsys.readouterr().err
    lacks = f"its latency sidecar lacks {len(tabulated - set(kept))} of the {len(tabulated)} tabulated designs"
    assert lacks in stderr and str(path) in stderr
    assert not (tmp_path / "run").exists()


def test_the_shipped_table_loads_as_before():
    table = load_table("levit_small")
    assert table.tabulated == _complete(_shipped_rows()) and len(table.tabulated) >= 169
    assert table.seeds == [0, 1, 2] and len(table.latency_ms) == 224
    assert table.curve_steps == [25, 50, 100, 200, 400, 800, 938]
    table.check_steps(938)


@pytest.mark.slow  # three searches that train proxies (80 steps): seconds
def test_the_studys_objective_names_say_what_is_optimised(tmp_path):
    """Issue 57: a TSE-ranked search named its first objective "accuracy" while its values were -mean train loss;
    now it is named for the score, the val top-1 stays a trial attribute, and a study created under the old name
    still resumes (its names are left as they were)."""
    path, _ = _table(tmp_path, latency=True)
    common = {"space": TINY_SPACE, "oracle": str(path), "fidelity": "none", "progress": False, "sampler": "random"}
    tse = {"steps": 80, "score": "tse"}
    outcome = run_design(**common, trials=2, protocol=tse, out=tmp_path / "run")
    assert outcome.study.metric_names == ["score (-mean train loss)", "latency_ms"]
    trained = [t for t in outcome.study.trials if t.user_attrs.get("status") == "trained"]
    assert trained and all(t.values[0] == pytest.approx(-2.0) and 0 < t.user_attrs["accuracy"] <= 1 for t in trained)
    outcome.study.set_metric_names(["accuracy", "latency_ms"])  # as a study written before issue 57 names them
    resumed = run_design(**common, trials=4, protocol=tse, out=tmp_path / "run")
    assert resumed.study.metric_names == ["accuracy", "latency_ms"] and len(resumed.study.trials) > len(trained)
    by_accuracy = run_design(**common, trials=1, objective="accuracy", protocol={"steps": 80, "score": "accuracy"},
                             out=tmp_path / "acc")
    assert by_accuracy.study.metric_names == ["accuracy"]


@pytest.mark.slow  # oracle searches of a few trials: about a second
def test_a_study_written_under_the_old_default_score_resumes_only_by_it(tmp_path, capsys):
    """Issue 82 made val top-1 the default proxy score (it was TSE).  A study written under the old default records
    ``"score": "tse"``; `archspec search` run on it again with the new default is refused -- exit 2, the message
    naming the study's score and the option that resumes it, not one trial added -- and `--proxy-score tse`
    resumes it.  A fresh study under the new default ranks by val top-1 and records no score (as the studies from
    before TSE, which resume unchanged)."""
    from archspec.cli import main

    path, _ = _table(tmp_path, latency=True)
    space = tmp_path / "tiny_space.yaml"
    space.write_text(json.dumps(TINY_SPACE), encoding="utf-8")  # YAML reads JSON
    old = run_design(space=TINY_SPACE, oracle=str(path), fidelity="none", progress=False, sampler="random", trials=2,
                     verify=0, protocol={"steps": 80, "score": "tse"}, out=tmp_path / "run", study_name="s")
    assert old.study.user_attrs["proxy"]["score"] == "tse"
    before = len(old.study.trials)
    again = ["search", "--space", str(space), "--oracle", str(path), "--out", str(tmp_path / "run"), "--study-name",
             "s", "--fidelity", "none", "--sampler", "random", "--verify", "0", "--proxy-steps", "80", "--trials", "4",
             "--no-progress"]
    capsys.readouterr()
    assert main(again) == 2
    err = capsys.readouterr().err
    assert "ranks its candidates by tse, this run by accuracy" in err and "resume it with --proxy-score tse" in err, err
    assert "Traceback" not in err
    storage = f"sqlite:///{tmp_path / 'run' / 'study.db'}"
    assert len(optuna.load_study(study_name="s", storage=storage).trials) == before
    assert main([*again, "--proxy-score", "tse"]) == 0
    assert len(optuna.load_study(study_name="s", storage=storage).trials) > before
    new = run_design(space=TINY_SPACE, oracle=str(path), fidelity="none", progress=False, sampler="random", trials=2,
                     verify=0, protocol={"steps": 80}, out=tmp_path / "new")
    assert "score" not in new.study.user_attrs["proxy"] and new.study.metric_names == ["accuracy", "latency_ms"]


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")  # PartialFixedSampler
def test_a_sampler_stuck_on_an_untabulated_design_stops_the_search(tmp_path, monkeypatch):
    """Issue 57: --sampler gp under --oracle-subset proposed the same design the table lacks over and over (it fits
    completed trials only; 152 infeasible trials for 2 trained, until the timeout).  A sampler that keeps proposing
    one missing design (here, fixed on it) is stopped after MAX_UNTABULATED_REPEATS proposals, with a note that says
    why and what to do."""
    from archspec.search._engine.early_stop import MAX_UNTABULATED_REPEATS

    path, points = _table(tmp_path, drop=1)
    stuck = optuna.samplers.PartialFixedSampler(points[1][0], optuna.samplers.RandomSampler(seed=0))
    monkeypatch.setattr("archspec.search._engine.preflight.make_sampler", lambda *args, **kwargs: stuck)
    outcome = run_design(space=TINY_SPACE, oracle=str(path), oracle_subset=True, objective="accuracy",
                         fidelity="none", trials=3, protocol={"steps": 80}, out=tmp_path / "run", progress=False,
                         sampler="gp", seed=0)
    statuses = [t.user_attrs.get("status") for t in outcome.study.trials]
    assert statuses == ["infeasible"] * MAX_UNTABULATED_REPEATS
    note = next(n for n in outcome.summary["notes"] if n.startswith("stopped: the gp sampler"))
    assert architecture_key(points[1][1])[:12] in note and "--sampler tpe or random" in note


def test_the_table_rules_are_torch_free():
    """A table writer (and `archspec validate`-like commands) can apply the rules without importing torch."""
    code = ("import sys, archspec.search._tabulation.checks as t; "
            "assert t.row_problem({'key': 'k'}).startswith('not a table row'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_verify_on_a_table_with_one_reference_seed_says_no_second_seed_exists(tmp_path):
    """Issue 80: ``--verify`` on a table whose sidecar names one reference seed re-read the same row as its "second
    seed" and reported rank agreement 1.0 and seed spread 0.0.  Now nothing is re-trained, every trial goes to the
    search, and a note says there is no second seed."""
    path, _ = _table(tmp_path, finals=[0.5, 0.9, 0.6, 0.7])
    meta = json.loads((tmp_path / "tiny.meta.json").read_text())
    (tmp_path / "tiny.meta.json").write_text(json.dumps({**meta, "reference_seeds": [0]}))
    outcome = run_design(space=TINY_SPACE, oracle=str(path), objective="accuracy", fidelity="none", trials=4,
                         verify=2, protocol={"steps": 80, "score": "accuracy"}, out=tmp_path / "run",
                         progress=False, sampler="random", seed=0)
    assert "verify" not in outcome.summary
    assert any("no second seed" in note and "reference seed [0]" in note for note in outcome.summary["notes"]), \
        outcome.summary["notes"]
    assert sum(t.user_attrs.get("status") == "trained" for t in outcome.study.trials) == 4  # none kept back


def test_strata_on_a_table_without_zero_cost_scores_is_refused(tmp_path, capsys):
    """Issue 80: ``--sampler strata`` on a table whose rows hold no score of ``--zc-score`` ranked every stratum's
    candidates at -inf (the first of each stratum) without a word; refused at ``oracle`` (``--oracle``) before
    the run directory exists.  ``--zc-score params`` needs no table score and runs."""
    from archspec.cli import main

    path, _ = _table(tmp_path)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "zc": {}}) + "\n" for r in rows))
    with pytest.raises(SpecError, match="holds no synflow zero-cost score"):
        run_design(space=TINY_SPACE, oracle=str(path), objective="accuracy", sampler="strata", trials=2,
                   verify=0, protocol={"steps": 80}, out=tmp_path / "run", progress=False)
    space = tmp_path / "tiny.yaml"
    space.write_text(json.dumps(TINY_SPACE))
    assert main(["search", "--space", str(space), "--oracle", str(path), "--sampler", "strata", "--objective",
                 "accuracy", "--trials", "2", "--proxy-steps", "80", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--oracle" in err and "holds no synflow zero-cost score" in err and "--zc-score" in err, err
    assert not (tmp_path / "run").exists()
    outcome = run_design(space=TINY_SPACE, oracle=str(path), objective="accuracy", sampler="strata", trials=2,
                         zc_score="params", verify=0, protocol={"steps": 80}, out=tmp_path / "run", progress=False)
    assert sum(t.user_attrs.get("status") == "trained" for t in outcome.study.trials) == 2
