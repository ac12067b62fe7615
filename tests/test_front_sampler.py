"""FrontMutationSampler (archspec.search._engine.front_sampler): local search around the front, checked by hand."""

from __future__ import annotations

import optuna
import pytest
from optuna.study import StudyDirection
from optuna.trial import create_trial

from archspec.search._engine.front_sampler import FrontMutationSampler, front

optuna.logging.set_verbosity(optuna.logging.WARNING)
CHOICES = {"a": ["x", "y", "z"], "b": [1, 2, 3], "c": ["p", "q", "r"]}


def _objective(trial: optuna.Trial) -> tuple[float, float]:
    """Two objectives over a 27-point space: a score to maximise and a cost to minimise (hand-made, no ties)."""
    a = trial.suggest_categorical("a", CHOICES["a"])
    b = trial.suggest_int("b", 1, 3)
    c = trial.suggest_categorical("c", CHOICES["c"])
    score = CHOICES["a"].index(a) + 0.3 * b + 0.01 * CHOICES["c"].index(c)
    cost = b * 10 + CHOICES["c"].index(c)
    return score, cost


def _hamming(p: dict, q: dict) -> int:
    return sum(p[k] != q[k] for k in p)


def test_front_keeps_exactly_the_non_dominated_trials():
    """(maximise, minimise): (0.9, 10) dominates (0.85, 20); (0.8, 5) is cheaper; (0.9, 10) twice both stay."""
    trials = [create_trial(values=v) for v in [(0.9, 10), (0.8, 5), (0.85, 20), (0.9, 10)]]
    kept = front(trials, [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE])
    assert [t.values for t in kept] == [[0.9, 10], [0.8, 5], [0.9, 10]]
    single = front([create_trial(value=v) for v in (1.0, 3.0, 2.0)], [StudyDirection.MAXIMIZE])
    assert [t.value for t in single] == [3.0]


def test_after_start_up_each_trial_is_a_new_neighbour_of_the_front_at_its_time():
    study = optuna.create_study(directions=["maximize", "minimize"],
                                sampler=FrontMutationSampler(seed=3, n_startup_trials=4))
    study.optimize(_objective, n_trials=16)
    trials = study.trials
    signatures = [tuple(sorted(t.params.items())) for t in trials]
    assert len(set(signatures)) == len(signatures)  # 16 of 27 points: never a repeat
    for i, t in enumerate(trials[4:], start=4):
        parents = front(trials[:i], study.directions)
        assert min(_hamming(t.params, p.params) for p in parents) == 1, (i, t.params)


def test_infeasible_trials_are_never_parents():
    """Every completed trial but one violates a constraint: each mutation is a neighbour of that one."""
    study = optuna.create_study(directions=["maximize"], sampler=FrontMutationSampler(seed=0, n_startup_trials=1))
    feasible = {"a": "x", "b": 1, "c": "p"}
    dists = {"a": optuna.distributions.CategoricalDistribution(CHOICES["a"]),
             "b": optuna.distributions.IntDistribution(1, 3),
             "c": optuna.distributions.CategoricalDistribution(CHOICES["c"])}
    study.add_trial(create_trial(value=0.1, params=feasible, distributions=dists,
                                 system_attrs={"constraints": [0.0]}))
    study.add_trial(create_trial(value=5.0, params={"a": "z", "b": 3, "c": "r"}, distributions=dists,
                                 system_attrs={"constraints": [1.0]}))
    for _ in range(5):
        trial = study.ask(dists)
        assert _hamming(trial.params, feasible) == 1
        study.tell(trial, 0.0, )


def test_same_seed_same_proposals_and_explore_one_is_random_draws():
    def run(sampler):
        study = optuna.create_study(directions=["maximize", "minimize"], sampler=sampler)
        study.optimize(_objective, n_trials=10)
        return [t.params for t in study.trials]

    assert run(FrontMutationSampler(seed=7, n_startup_trials=3)) == run(FrontMutationSampler(seed=7,
                                                                                             n_startup_trials=3))
    # explore=1: every trial is Optuna's RandomSampler with the same seed, draw for draw
    assert run(FrontMutationSampler(seed=7, explore=1.0)) == run(optuna.samplers.RandomSampler(seed=7))


@pytest.mark.parametrize("kwargs", [{"n_startup_trials": -1}, {"explore": 1.5}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        FrontMutationSampler(**kwargs)
