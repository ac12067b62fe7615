"""The strata rule (archspec.search._engine.strata, ``--sampler strata``) against hand-computed cases: the bit-reversed
order of the strata, the best score of each cost bin, its picks queued in a plain Optuna study (once per study, one
worker per pick), and on the shipped table the designs it trains first computed from the table's rows by hand."""

from __future__ import annotations

import json
import math

import numpy as np
import optuna
import pytest

import archspec
from archspec.search._engine.strata import (
    PRIOR_CANDIDATES_ATTR,
    PRIOR_SECONDS_ATTR,
    STRATA_ATTR,
    STRATUM_ATTR,
    ScoredCandidate,
    bit_reversed_order,
    enqueue_strata,
    stratified_picks,
)
from archspec.search._evaluation.latency import architecture_key
from archspec.search._space.language import load_space


def test_bit_reversed_order_by_hand():
    assert bit_reversed_order(8) == [0, 4, 2, 6, 1, 5, 3, 7]
    assert bit_reversed_order(5) == [0, 4, 2, 1, 3]  # 0..7 reversed, 5 6 7 skipped
    assert bit_reversed_order(3) == [0, 2, 1]
    assert bit_reversed_order(1) == [0] and bit_reversed_order(0) == []


def test_the_best_score_of_each_cost_bin_in_bit_reversed_order():
    """Costs 1..6 in three bins {1,2}, {3,4}, {5,6}; scores favour 2, 3 and 6; bins visited 0, 2, 1."""
    scores = {1: 0.1, 2: 0.5, 3: 0.9, 4: 0.2, 5: 0.3, 6: 0.4}
    cands = [ScoredCandidate({"x": c}, float(c), s) for c, s in reversed(scores.items())]
    picks = stratified_picks(cands, 3, np.random.RandomState(0))
    assert [c.params["x"] for c in picks] == [2, 6, 3]
    assert [c.params["x"] for c in stratified_picks(cands[:2], 5, np.random.RandomState(0))] == [5, 6]
    assert stratified_picks([], 3, np.random.RandomState(0)) == []


def _study(storage=None, name=None):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0), directions=["maximize"],
                               storage=storage, study_name=name, load_if_exists=True)


def _six_designs(looks: list):
    """Six designs x in 0..5: cost x, score -|x - 4|; bins {0,1}, {2,3}, {4,5} give 1, 3, 4, visited 0, 2, 1."""

    def look():
        looks.append(1)
        return [ScoredCandidate({"x": x}, float(x), -abs(x - 4.0)) for x in range(6)], 1.5

    return look


def _objective(trial):
    return float(trial.suggest_int("x", 0, 5))


def test_the_picks_are_queued_once_and_trained_first_then_random_draws():
    """The picks 1, 4, 3 are queued in that order; a design a trial already has (4, queued by someone else) is not
    queued again; a second call finds the study done and does not look again; random draws after the queue."""
    looks = []
    study = _study()
    study.enqueue_trial({"x": 4})  # another worker's trial already holds the second pick
    assert enqueue_strata(study, _six_designs(looks), n_strata=3, seed=0) == 3
    assert enqueue_strata(study, _six_designs(looks), n_strata=3, seed=0) == 0  # a resumed run, a second worker
    study.optimize(_objective, n_trials=4)
    xs = [t.params["x"] for t in study.trials]
    assert xs[:3] == [4, 1, 3] and 0 <= xs[3] <= 5  # the earlier trial, then picks 1 and 3, then a random draw
    assert [t.user_attrs.get(STRATUM_ATTR) for t in study.trials[:3]] == [None, 0, 1]
    assert looks == [1]
    assert study.user_attrs[PRIOR_SECONDS_ATTR] == 1.5 and study.user_attrs[PRIOR_CANDIDATES_ATTR] == 6
    assert study.user_attrs[STRATA_ATTR] == 3


def test_two_workers_on_one_storage_each_train_a_different_pick(tmp_path):
    """Two processes' studies on one SQLite storage (two handles, taking turns): the look runs once, and the three
    picks go one each to whichever worker asks next -- none trained twice (the sampler this replaced kept its
    assignments per process, so two workers could both train the first stratum's pick)."""
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    looks = []
    first, second = _study(storage, "s"), _study(storage, "s")
    assert enqueue_strata(first, _six_designs(looks), n_strata=3, seed=0) == 3
    assert enqueue_strata(second, _six_designs(looks), n_strata=3, seed=0) == 0
    for worker in (first, second, first):
        worker.optimize(_objective, n_trials=1)
    xs = [t.params["x"] for t in first.trials]
    assert xs == [1, 4, 3] and looks == [1]


def test_bad_strata_refused():
    with pytest.raises(ValueError, match="n_strata"):
        enqueue_strata(_study(), lambda: ([], 0.0), n_strata=0, seed=0)


@pytest.mark.slow
def test_on_the_table_the_first_trials_are_the_strata_computed_from_the_rows(tmp_path):
    """A real replay on the shipped levit_small table: its first 6 trained designs are, in order, the best NASWOT
    (each design's row for this replay's seed, `OracleTable.seed_of`) of 6 latency bins of equal count over the
    tabulated designs, computed here from the rows without the sampler."""
    from archspec.search import load_table, run_design

    table = load_table("levit_small")
    seed, n = 5, 6
    out = run_design(space="levit_small", oracle="levit_small", oracle_subset=True, objective="pareto", trials=n,
                     timeout=None, trial_timeout=None, protocol={"steps": 120, "score": "tse"}, seed=seed,
                     storage="memory", out=tmp_path / "run", progress=False, sampler="strata", zc_score="naswot",
                     fidelity="none", verify=0)
    keys = {architecture_key(spec) for _, spec in load_space("levit_small").points()} & set(table.tabulated)
    naswot = {k: table.rows[k][table.seed_of(k, seed)]["zc"]["naswot"] for k in keys}

    def picks(tie_order: int) -> list[str]:  # designs of equal latency (the table has a pair) in either order
        by_cost = sorted(keys, key=lambda k: (table.latency_ms[k], tie_order * int(k[:12], 16)))
        bins = [list(b) for b in np.array_split(np.array(by_cost, dtype=object), n)]
        best = [max(b, key=lambda k: (naswot[k] if naswot[k] is not None else -math.inf, -table.latency_ms[k]))
                for b in bins]  # equal scores: the cheaper
        return [best[i] for i in bit_reversed_order(n)]

    got = [t.user_attrs["arch_key"] for t in sorted(out.study.trials, key=lambda t: t.number)]
    assert got in (picks(1), picks(-1))
    zc_seconds = sum(table.rows[k][table.seed_of(k, seed)]["zc_seconds"]["naswot"] for k in keys)
    assert out.study.user_attrs[PRIOR_SECONDS_ATTR] == pytest.approx(zc_seconds, abs=0.01)
    assert out.study.user_attrs[PRIOR_CANDIDATES_ATTR] == len(keys)


@pytest.mark.slow
def test_a_live_strata_search_trains_the_best_of_each_latency_stratum(tmp_path):
    """`archspec search --sampler strata` on real data (digits) and measured latencies, tiny space of 4 designs
    (depth 1-2 x width 16/32), 2 trained, `--zc-score params` (a static score, so the picks are known by hand): the
    two latency strata are the two fastest and the two slowest designs by the latencies the run measured (its
    latency.json), each stratum's pick is its larger design, the faster stratum trained first (bit-reversed order:
    0, 1).  The strata are computed here from the measured latencies, not assumed: these designs' CPU latencies
    differ by microseconds, and on a clean-clone run (2026-11-28) depth 2 x 32, the most MACs, measured among
    the two fastest and was trained first.  Depth 2 x 32, the largest, is the pick of whichever stratum holds it;
    depth 1 x 16, the smallest, never is."""
    import yaml
    from search_fixtures import TINY_SPACE

    from archspec.cli import main

    space = tmp_path / "tiny.yaml"
    space.write_text(yaml.safe_dump(TINY_SPACE), encoding="utf-8")
    out = tmp_path / "run"
    assert main(["search", "--space", str(space), "--out", str(out), "--study-name", "t", "--fidelity", "none",
                 "--proxy-steps", "3", "--proxy-size", "32", "--proxy-batch", "8", "--max-images", "60",
                 "--latency-repeats", "2", "--no-progress", "--trials", "2", "--verify", "0", "--sampler", "strata",
                 "--zc-score", "params"]) == 0
    study = optuna.load_study(study_name="t", storage=f"sqlite:///{out / 'study.db'}")
    trials = sorted(study.trials, key=lambda t: t.number)
    trained = [(t.params["stages.0.depth"], t.params["stages.0.dim"]) for t in trials
               if t.user_attrs.get("status") == "trained"]
    measured = json.loads((out / "latency.json").read_text(encoding="utf-8"))
    designs = {}  # (depth, dim) -> (measured ms, params)
    for params, spec in load_space(TINY_SPACE).points():
        (ms,) = measured[architecture_key(spec)].values()  # one latency protocol in this run
        designs[(params["stages.0.depth"], params["stages.0.dim"])] = (ms, archspec.analyze(spec).params)
    by_latency = sorted(designs, key=lambda d: designs[d][0])
    expected = [max(stratum, key=lambda d: designs[d][1]) for stratum in (by_latency[:2], by_latency[2:])]
    assert trained == expected, (trained, designs)
    assert (2, 32) in trained and (1, 16) not in trained
    assert study.user_attrs[PRIOR_SECONDS_ATTR] > 0  # four latencies measured


def test_strata_on_a_space_that_cannot_be_listed_is_refused_at_sampler(tmp_path, capsys):
    """A float range has no finite list of candidates: exit 2 naming --sampler, before anything is written."""
    import copy

    import yaml
    from search_fixtures import TINY_SPACE

    from archspec.cli import main

    doc = copy.deepcopy(TINY_SPACE)
    doc["spec"]["stages"][0]["mlp_ratio"] = {"float": [1.0, 4.0]}
    space = tmp_path / "floats.yaml"
    space.write_text(yaml.safe_dump(doc), encoding="utf-8")
    out = tmp_path / "run"
    rc = main(["search", "--space", str(space), "--out", str(out), "--sampler", "strata", "--trials", "2",
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "--sampler" in err and "cannot be listed" in err, err
    assert not out.exists()


def test_a_design_whose_zero_cost_score_fails_is_ranked_last_and_the_look_goes_on():
    """A live look scores every design; one that runs out of memory or diverges while scored used to fail the look,
    and every later trial asked for it again.  It is ranked last (-inf), with no seconds."""
    from types import SimpleNamespace

    from archspec.search._evaluation.priors import _score
    from archspec.train.failures import TrainingFailure

    def failing(spec):
        raise TrainingFailure("out of memory scoring the largest design")

    assert _score(None, None, "naswot", failing) == (-math.inf, 0.0)
    scored = SimpleNamespace(scores={"naswot": 3.5}, seconds={"naswot": 0.25})
    assert _score(None, None, "naswot", lambda spec: (scored, None)) == (3.5, 0.25)


@pytest.mark.slow  # 1.5-3.4 s in the quick subset (docs/contributing.md: over a second is slow)
def test_strata_sets_how_many_designs_are_picked_first(tmp_path):
    """A replay on the shipped table with --strata 3 and 5 trials: the first three trials are the queued picks
    (strata 0, 2, 1 in bit-reversed order), the last two random draws; the study says 3 strata."""
    from archspec.search import run_design

    out = run_design(space="levit_small", oracle="levit_small", oracle_subset=True, objective="pareto", trials=5,
                     timeout=None, trial_timeout=None, protocol={"steps": 120, "score": "tse"}, seed=1,
                     storage="memory", out=tmp_path / "run", progress=False, sampler="strata", zc_score="naswot",
                     fidelity="none", verify=0, strata=3)
    trials = sorted(out.study.trials, key=lambda t: t.number)
    assert [t.user_attrs.get(STRATUM_ATTR) for t in trials] == [0, 2, 1, None, None]
    assert out.study.user_attrs[STRATA_ATTR] == 3


@pytest.mark.parametrize("args, says", [
    (["--sampler", "strata", "--strata", "0"], "--strata"),
    (["--strata", "3"], "--strata"),
])
def test_bad_strata_option_is_refused_before_anything_is_written(tmp_path, capsys, args, says):
    from archspec.cli import main

    out = tmp_path / "run"
    rc = main(["search", "--space", "levit_small", "--oracle", "levit_small", "--oracle-subset", "--out", str(out),
               "--trials", "2", "--no-progress", *args])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and "Traceback" not in err, err
    assert not out.exists()


# ----------------------------------------------------------------------------------- the priors hook
def test_the_strata_sampler_draws_what_optunas_random_sampler_draws():
    """StrataSampler is RandomSampler plus a hook: with an empty queue, the same seed gives the same parameters."""
    from archspec.search._engine.strata import StrataSampler

    def draws(sampler) -> list[dict]:
        study = optuna.create_study(sampler=sampler)
        study.optimize(lambda t: t.suggest_int("x", 0, 99) + t.suggest_float("y", 0.0, 1.0), n_trials=8)
        return [t.params for t in study.trials]

    assert draws(StrataSampler(seed=4, n_strata=3)) == draws(optuna.samplers.RandomSampler(seed=4))


@pytest.mark.slow  # a 3-trial replay on the shipped table: seconds
def test_the_loop_hands_any_prior_sampler_its_look_once_before_the_first_trial(tmp_path, monkeypatch):
    """The engine knows the hook, not the strata: a sampler of its own (here one that queues the two cheapest
    candidates it was shown) gets the objective's look once, before any trial -- every tabulated design of the space,
    counted here from the table -- and its picks are the first trials."""
    import archspec.search._engine.preflight as preflight
    from archspec.search import load_table, run_design
    from archspec.search._evaluation.priors import PriorSampler

    calls, shown, picked = [], [], []

    class Cheapest(PriorSampler, optuna.samplers.RandomSampler):
        def look_first(self, study, look):
            calls.append(len(study.trials))
            candidates = list(look()[0])
            shown.append(len(candidates))
            for pick in sorted(candidates, key=lambda c: c.cost)[:2]:
                picked.append(dict(pick.params))
                study.enqueue_trial(dict(pick.params))
            return 2

    monkeypatch.setattr(preflight, "make_sampler", lambda *args, **kwargs: Cheapest(seed=0))
    out = run_design(space="levit_small", oracle="levit_small", oracle_subset=True, objective="pareto", trials=3,
                     timeout=None, trial_timeout=None, protocol={"steps": 120}, seed=0, storage="memory",
                     out=tmp_path / "run", progress=False, sampler="random", zc_score="macs", fidelity="none",
                     verify=0)
    table = load_table("levit_small")
    keys = {architecture_key(spec) for _, spec in load_space("levit_small").points()} & set(table.tabulated)
    first = [t.params for t in sorted(out.study.trials, key=lambda t: t.number)[:2]]
    assert calls == [0] and shown == [len(keys)] and first == picked
