"""The samplers of a search and the distinct candidates of its study.

* :func:`make_sampler`: TPE (multi-objective and constraint aware), NSGA-II, GP, random (the default), local search
  around the front, or the strata (random draws after the priors hook's picks), all seeded.  Budgets are Optuna
  constraints set with ``trial.set_constraint`` (value <= 0 feasible).
* :func:`worker_seed`: the sampler seed of one worker (``seed`` for the study's first trial, derived
  from ``seed`` and the worker's first trial number otherwise), so workers sharing a study and
  resumed runs do not replay one another's candidates.
* :func:`same_architecture` / :func:`reused_attrs`: a candidate the study has already trained (or is training) is
  found by its architecture key, and its result copied instead of trained again.

The study's storage, its opening and its zombie trials are :mod:`archspec.search._storage`.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from archspec.errors import SpecError
from archspec.search._engine.config import (  # torch-free: the command line reads them too
    DEFAULT_SAMPLER_STARTUP,
    SAMPLERS,
)
from archspec.search._engine.front_sampler import FrontMutationSampler
from archspec.search._engine.strata import StrataSampler

__all__ = ["make_sampler", "SAMPLERS", "worker_seed", "ARCH_KEY_ATTR", "same_architecture", "reused_attrs"]


def make_sampler(name: str, seed: int | None, n_objectives: int, n_startup_trials: int = DEFAULT_SAMPLER_STARTUP,
                 n_strata: int = 1) -> optuna.samplers.BaseSampler:
    """An Optuna sampler by name, seeded for reproducible sampling.

    ``tpe``: multivariate TPE, multi-objective and constraint aware (Optuna reads the
    constraints set with ``trial.set_constraint``; infeasible trials are ranked last), with
    ``constant_liar`` so that concurrent workers do not propose the same point.  ``nsga2``: NSGA-II
    (constrained domination).  ``gp``: Gaussian-process BO.  ``random``: random search (the command line's
    default: :data:`archspec.search.cli_support.DEFAULT_SAMPLER`).  ``front``: local search, one-parameter mutations
    of the non-dominated trials after ``n_startup_trials`` random draws
    (:class:`archspec.search._engine.front_sampler.FrontMutationSampler`).  ``strata``: random draws after the best
    zero-cost score of each of ``n_strata`` cost strata, queued by its priors hook before the first trial
    (:class:`archspec.search._engine.strata.StrataSampler`).
    ``n_startup_trials``: random trials before TPE's or the GP's model is used (Optuna's own default is 10; 6
    here, for searches of 10-20 trained candidates); NSGA-II's population (at least 4).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning for multivariate/group/constant_liar
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup_trials, multivariate=True,
                                              group=True, constant_liar=True)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, n_startup_trials))
        if name == "gp":
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup_trials)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "strata":
            return StrataSampler(seed=seed, n_strata=n_strata)
        if name == "front":
            return FrontMutationSampler(seed=seed, n_startup_trials=n_startup_trials)
    raise SpecError.single(("sampler",), f"unknown sampler {name!r}", f"choose one of {', '.join(SAMPLERS)}")


def worker_seed(seed: int, first_trial: int) -> int:
    """The sampler seed of a worker whose first trial in the study has number ``first_trial``.

    Rule: ``seed`` itself when ``first_trial`` is 0 (the study's first worker, so a fresh single-worker
    run with ``--seed S`` samples exactly what a plain Optuna sampler seeded with ``S`` samples);
    otherwise the first 4 bytes of ``sha256("archspec-worker:<seed>:<first_trial>")`` as an unsigned
    integer.  Trial numbers are unique within a study (the storage hands them out), so concurrent
    workers and resumed runs get distinct seeds, and a resumed single-worker run stays reproducible.
    Raises nothing.
    """
    if first_trial == 0:
        return seed
    digest = hashlib.sha256(f"archspec-worker:{seed}:{first_trial}".encode("ascii")).digest()
    return int.from_bytes(digest[:4], "big")



# ----------------------------------------------------------------------------------- distinct candidates
ARCH_KEY_ATTR = "arch_key"  # user attr: archspec.search._evaluation.latency.architecture_key of the trial's spec
# Statuses by which a RUNNING trial holds its architecture's claim.  "trained" and "stopped" are set just
# before Optuna records the trial COMPLETE or PRUNED: in that window the trial must still count, or a
# worker that looks then trains the architecture again (seen with four workers on PostgreSQL).
_CLAIMING_STATUSES = frozenset({"training", "trained", "stopped"})
# Attrs that describe the trial run itself, not the architecture's result: never copied on reuse.
_NOT_REUSED = frozenset({"worker", "spec", "train_seconds", "fail_reason", "status", "reused_from", "duplicate_of",
                         ARCH_KEY_ATTR, "macs", "params", "latency_ms", "infeasible_reason"})


def same_architecture(study: optuna.Study, key: str, number: int) -> FrozenTrial | None:
    """Another trial of ``study`` that trained, or is training, the architecture ``key``.

    Looks at trials with user attr ``arch_key == key`` other than trial ``number``: the COMPLETE one
    that trained it (the original of any reused copy) first, else a RUNNING one that has passed this
    check too (user attr ``status`` "training", or "trained"/"stopped" while Optuna has not yet
    recorded it finished: a worker holds it now), or a PRUNED one that multi-fidelity stopped at a
    rung (``status == "stopped"``: evaluated, not worth more).  ``None`` if none: the caller may train
    it.  Two workers that claim one key at the same instant can both see the other and both step back
    (each retries another candidate): never two trainings of one key.

    Raises:
        Whatever the storage raises when it cannot be read.  Source: archspec (Optuna's public
        ``Study.get_trials``).
    """
    complete, running = None, None
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING, TrialState.PRUNED)):
        if t.number == number or t.user_attrs.get(ARCH_KEY_ATTR) != key:
            continue
        if t.state == TrialState.COMPLETE and "reused_from" not in t.user_attrs:
            if complete is None or t.number < complete.number:
                complete = t
        elif t.state == TrialState.PRUNED and t.user_attrs.get("status") == "stopped":  # evaluated, stopped at a rung
            running = t if running is None or t.number < running.number else running
        elif t.state == TrialState.RUNNING and t.user_attrs.get("status") in _CLAIMING_STATUSES:
            running = t if running is None or t.number < running.number else running
    return complete or running


def reused_attrs(source: FrozenTrial) -> dict[str, Any]:
    """The user attrs a trial copies from ``source`` when it reuses its result instead of training:
    the result (accuracy, losses, steps, mode 2's ALS ...), not the run (worker, timing, status).
    Raises nothing.  Source: archspec."""
    return {k: v for k, v in source.user_attrs.items() if k not in _NOT_REUSED}
