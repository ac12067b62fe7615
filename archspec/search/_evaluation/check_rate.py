"""The static check's rate: candidates per second of sampling plus :func:`~archspec.search._evaluation.budget.
static_check` (the search's summary reports it; ``bench/graph_builds.py`` measures it).  Optuna samples the
candidates, so this lives apart from :mod:`~archspec.search._evaluation.budget`, which stays Optuna-free."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import optuna

from archspec.errors import SpecError
from archspec.search._evaluation.budget import Budgets, static_check

if TYPE_CHECKING:  # pragma: no cover
    from archspec.search._space.language import SearchSpace

__all__ = ["static_check_rate"]


def static_check_rate(space: SearchSpace, budgets: Budgets, n: int = 200, seed: int = 0) -> float:
    """Candidates per second of sampling (Optuna ``RandomSampler``, in-memory study) plus :func:`static_check`.

    Each candidate is a full ``space.sample`` (which validates the point with ``load_spec``) and a
    static check; a point that fails validation still counts (it was rejected).

    Raises:
        ValueError: ``n`` < 1.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        start = time.perf_counter()
        for _ in range(n):
            trial = study.ask()
            try:
                check = static_check(space.sample(trial), budgets)
                value = float(check.macs)
            except SpecError:
                value = float("inf")
            study.tell(trial, value)
        elapsed = time.perf_counter() - start
    finally:
        optuna.logging.set_verbosity(verbosity)
    return n / max(elapsed, 1e-9)
