"""Multi-fidelity search: rung schedule, the successive-halving promotion rule, and whole runs."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import optuna
import pytest
import yaml
from search_fixtures import TINY_SPACE

from archspec import SpecError
from archspec.search._engine.fidelity import RUNGS_ATTR, promotable, rung_correlations, rung_schedule

FAST = ["--proxy-size", "32", "--proxy-batch", "8", "--max-images", "60", "--latency-repeats", "2", "--no-progress"]


def test_rung_schedule():
    assert rung_schedule(150).steps == (17, 51, 150)  # round(150 / 9) = 17; 17 * 27 > 150
    assert rung_schedule(9, eta=3, min_steps=1).steps == (1, 3, 9)
    assert rung_schedule(10, eta=2, min_steps=3).steps == (3, 6, 10)
    assert rung_schedule(5, eta=3, min_steps=5).steps == (5,)
    with pytest.raises(SpecError):
        rung_schedule(10, eta=1)
    with pytest.raises(SpecError):
        rung_schedule(10, min_steps=11)


def test_promotion_rule_by_hand():
    # fewer than eta competitors: only the best goes on (Optuna's SuccessiveHalvingPruner rule) ...
    assert promotable(0.5, 10.0, [(0.5, 10.0)], 3)
    assert not promotable(0.4, 10.0, [(0.5, 5.0), (0.4, 10.0)], 3)
    # ... unless nothing is both at least as accurate and at least as fast (the Pareto front survives)
    assert promotable(0.4, 4.0, [(0.5, 5.0), (0.4, 4.0)], 3)
    # six competitors, eta 3: the top 6 // 3 = 2 go on; the third is dominated by the first
    six = [(0.9, 5.0), (0.8, 5.0), (0.7, 6.0), (0.6, 7.0), (0.5, 8.0), (0.4, 9.0)]
    assert [promotable(a, l, six, 3) for a, l in six] == [True, True, False, False, False, False]


def test_rung_correlations_by_hand():
    values = [{"1": 0.1, "3": 0.2, "9": 0.3}, {"1": 0.2, "3": 0.1, "9": 0.4}, {"1": 0.3, "3": 0.3, "9": 0.5},
              {"1": 0.9}]  # the last stopped at rung 1: not in the correlation
    first, second = rung_correlations(values, rung_schedule(9, 3, 1))
    assert first == {"steps": 1, "n": 3, "kendall_tau": 1.0, "p_value": pytest.approx(0.3333, abs=1e-3)}
    assert second["steps"] == 3 and second["kendall_tau"] == pytest.approx(1 / 3, abs=1e-3)


@pytest.fixture()
def space_file(tmp_path: Path) -> Path:
    space = copy.deepcopy(TINY_SPACE)  # 18 architectures
    space["spec"]["stages"][0].update({"depth": {"int": [1, 3]}, "dim": {"choice": [16, 24, 32]},
                                       "key_dim": {"choice": [8, 16]}})
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space), encoding="utf-8")
    return path


@pytest.mark.parametrize("objective", ["pareto", "accuracy"])
@pytest.mark.slow
def test_successive_halving_run(space_file, tmp_path, objective, one_thread):
    from archspec.cli import main

    out = tmp_path / "run"
    assert main(["search", "--space", str(space_file), "--out", str(out), "--trials", "7", "--verify", "0",
                 "--objective", objective, "--proxy-steps", "9", "--fidelity", "sha", "--min-steps", "1", "--seed", "1",
                 *FAST]) == 0
    summary = json.loads((out / "summary.json").read_text())
    fidelity = summary["fidelity"]
    assert fidelity["rungs"] == [1, 3, 9] and [r["steps"] for r in fidelity["rung_correlations"]] == [1, 3]
    assert summary["candidates_per_hour"] > 0
    study = optuna.load_study(study_name=summary["study"], storage=summary["storage"])
    trials = sorted((t for t in study.get_trials() if RUNGS_ATTR in t.user_attrs and "reused_from" not in t.user_attrs),
                    key=lambda t: t.number)
    assert len(trials) == 7
    stopped = [t for t in trials if t.user_attrs.get("status") == "stopped"]
    assert fidelity["stopped_this_run"] == len(stopped)
    if objective == "accuracy":  # accuracy alone decides (deterministic training): seed 1 stops trial 5 at rung 1
        assert stopped
    for t in trials:  # every trial went as far as its rungs say, and no further
        reached = sorted(int(k) for k in t.user_attrs[RUNGS_ATTR])
        assert reached == [1, 3, 9][:len(reached)]
        assert (t.state == optuna.trial.TrialState.COMPLETE) == (reached[-1] == 9)
    if objective == "pareto":  # replay the rule: each decision against the trials that reached the rung before
        for i, t in enumerate(trials):
            for step in [1, 3]:
                value = t.user_attrs[RUNGS_ATTR].get(str(step))
                if value is None:
                    break
                earlier = [(u.user_attrs[RUNGS_ATTR][str(step)], u.user_attrs["latency_ms"]) for u in trials[:i]
                           if str(step) in u.user_attrs[RUNGS_ATTR]]
                went_on = str(step * 3) in t.user_attrs[RUNGS_ATTR]
                assert went_on == promotable(value, t.user_attrs["latency_ms"],
                                             [*earlier, (value, t.user_attrs["latency_ms"])], 3)


def test_hyperband_needs_a_single_objective(space_file, tmp_path, capsys):
    from archspec.cli import main

    assert main(["search", "--space", str(space_file), "--out", str(tmp_path / "r"), "--fidelity", "hyperband",
                 *FAST]) == 2
    assert "--fidelity" in capsys.readouterr().err and not (tmp_path / "r").exists()


@pytest.mark.slow
def test_zero_cost_rung_run(space_file, tmp_path, one_thread):
    """--fidelity zc: every candidate is scored untrained; one goes on to training iff its score is promotable
    among the candidates scored before it (replayed here); the summary reports the seconds per candidate."""
    from archspec.cli import main
    from archspec.search._engine.config import ZERO_COST_ATTR, ZERO_COST_RANKINGS

    out = tmp_path / "run"
    assert main(["search", "--space", str(space_file), "--out", str(out), "--trials", "4", "--proxy-steps", "3",
                 "--fidelity", "zc", "--zc-score", "naswot", "--seed", "2", *FAST]) == 0
    summary = json.loads((out / "summary.json").read_text())
    study = optuna.load_study(study_name=summary["study"], storage=summary["storage"])
    scored = sorted((t for t in study.get_trials() if ZERO_COST_ATTR in t.user_attrs
                     and "reused_from" not in t.user_attrs), key=lambda t: t.number)
    trained = [t for t in scored if t.state == optuna.trial.TrialState.COMPLETE]
    # how many train depends on measured latencies (the rule keeps a candidate no other beats on both), and the
    # tiny space has 4 architectures: the run ends at 4 trained or when the space is exhausted
    assert 1 <= len(trained) <= 4 and summary["zero_cost"]["scored_this_run"] == len(scored)
    assert summary["zero_cost"]["trained"] == len(trained) and summary["zero_cost"]["scored"] == len(scored)
    for i, t in enumerate(scored):
        zc = t.user_attrs[ZERO_COST_ATTR]
        assert set(zc["scores"]) == set(ZERO_COST_RANKINGS) and set(zc["seconds"]) == {"naswot", "synflow", "grad_norm"}
        assert zc["scores"]["macs"] == t.user_attrs["macs"] and zc["scores"]["params"] == t.user_attrs["params"]
        value, latency = zc["scores"]["naswot"], t.user_attrs["latency_ms"]
        earlier = [(u.user_attrs[ZERO_COST_ATTR]["scores"]["naswot"], u.user_attrs["latency_ms"]) for u in scored[:i]]
        trained_it = t.state == optuna.trial.TrialState.COMPLETE
        assert trained_it == promotable(value, latency, [*earlier, (value, latency)], 3)
        assert trained_it or t.user_attrs["status"] == "stopped"
    assert summary["zero_cost"]["seconds_per_candidate"] > 0 and summary["zero_cost"]["score"] == "naswot"
    assert set(summary["zero_cost"]["kendall_tau"]) == set(ZERO_COST_RANKINGS)
