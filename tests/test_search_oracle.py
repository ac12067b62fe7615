"""Finite spaces and the oracle: ``SearchSpace.points``, ``archspec search --list``, ``--oracle TABLE`` (issue 32).

The oracle is checked against hand-made tables: each answer must be the table's own number (a curve point, a
log-linear interpolation computed here by hand, a zero-cost score, a latency), and the real engine must pick the
design the table says is best.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import optuna
import pytest
from search_fixtures import TINY_SPACE

from archspec.errors import SpecError
from archspec.ir.analysis import analyze
from archspec.search import run_design
from archspec.search.latency import architecture_key
from archspec.search.oracle import load_table
from archspec.search.space import load_space

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
    from archspec.search.proxy import stage_grids

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
    from archspec.search.proxy import ProxyProtocol

    reported = []
    result = table.train(spec, None, ProxyProtocol(steps=40, eval_every=20, score="accuracy"), seed=0,
                         report=lambda s, a: reported.append((s, a)))
    row = table.rows[architecture_key(spec)][0]
    assert reported == [(20, row["curve"][1][1]), (40, row["curve"][2][1])]  # exactly the tabulated points
    assert result.accuracy == row["curve"][2][1] and result.seconds == 40.0
    # between tabulated steps: linear in log(step); 28 steps lie between 20 and 40
    result = table.train(spec, None, ProxyProtocol(steps=28, eval_every=28, score="accuracy"), seed=1)
    a20, a40 = (table.rows[architecture_key(spec)][1]["curve"][i][1] for i in (1, 2))
    assert result.accuracy == pytest.approx(a20 + (a40 - a20) * math.log(28 / 20) / math.log(2))
    assert result.seconds == pytest.approx(28.0) and result.train_loss == pytest.approx(2.0)
    assert table.zero_cost(spec)[0].scores["synflow"] == 3.0
    with pytest.raises(SpecError, match="past the table's curve"):
        table.train(spec, None, ProxyProtocol(steps=81), seed=0)


def test_oracle_search_finds_the_tables_best_design(tmp_path, monkeypatch):
    path, points = _table(tmp_path, finals=[0.5, 0.9, 0.6, 0.7])
    monkeypatch.setattr("archspec.search.proxy.train_proxy", None)  # would fail if anything trained
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
                         protocol={"steps": 60, "score": "tse"}, out=tmp_path / "run", progress=False,
                         sampler="random", seed=0)
    assert architecture_key(outcome.best_spec) == keys[2]
    done = [t for t in outcome.study.trials if t.user_attrs.get("status") == "trained"]
    assert len(done) == 4
    for t in done:  # search seed 0 -> table seed 0: the loss sum at 60 = per_step * 60
        assert t.value == pytest.approx(-per_step[t.user_attrs["arch_key"]])
        assert t.user_attrs["loss_sum"] == pytest.approx(per_step[t.user_attrs["arch_key"]] * 60)
    assert outcome.summary["pareto"][0]["score"] == pytest.approx(-0.5)
    # its accuracy is still reported: point 2's curve, 0.6 * (0.5 + 0.5 log(s/10) / log 8), at s = 60
    assert outcome.summary["pareto"][0]["accuracy"] == pytest.approx(0.6 * (0.5 + 0.5 * math.log(6) / math.log(8)),
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
    ("missing", "--oracle", "lacks 1 design"),
    ("other_space", "--oracle", "tabulates space 'levit_small'"),
    ("no_latency", "--oracle", "no latency"),
    ("past_curve", "--proxy-steps", "past the table's curve"),
    ("no_file", "--oracle", "no such table"),
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
    assert err.value.problems[0].path == (option,) and match in str(err.value)
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
    monkeypatch.setattr("archspec.search.proxy.train_proxy", None)  # would fail if anything trained
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
    assert table.row(points[3][1], 2)["seed"] == 0  # search seed 2 -> reference seed 0, never the extra seed 2
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
    assert err.value.problems[0].path == ("--oracle",) and "line 2" in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("value", [[], [0, "1"], "0,1", [True], {"0": 1}])
def test_malformed_reference_seeds_are_a_located_error(tmp_path, capsys, value):
    """The sidecar's reference seeds decide which designs the oracle answers: anything but a non-empty list of
    integers is refused naming the sidecar and the field (exit 2, no run directory), never silently ignored."""
    from archspec.cli import main

    path, _ = _table(tmp_path)
    meta = json.loads((tmp_path / "tiny.meta.json").read_text())
    (tmp_path / "tiny.meta.json").write_text(json.dumps({**meta, "reference_seeds": value}))
    with pytest.raises(SpecError, match="tiny.meta.json: field reference_seeds must be a non-empty list"):
        load_table(path)
    assert main(["search", "--space", str(TINY_SPACE), "--oracle", str(path), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "reference_seeds" in err and str(path) in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option", [["--oracle", "levit_small"], ["--oracle-subset"], ["--list"]])
def test_mask_placement_refuses_design_only_options(tmp_path, capsys, option):
    from archspec.cli import main

    assert main(["search", *option, "masks", "mait_tiny_sch1", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert f"{option[0]} applies to mode 1" in err and not (tmp_path / "m").exists()
