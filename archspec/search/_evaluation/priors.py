"""Priors: what a sampler may know of every candidate before the first trial, and the hook of a sampler that uses it.

The look (:func:`prior_candidates`): each point of a finite space as a :class:`ScoredCandidate` -- its cost and one
zero-cost score -- and the CPU the look took.  A sampler that uses priors is a :class:`PriorSampler`: the engine
hands it the look once, before the first trial and inside ``--timeout``, and the sampler queues what it chose
(``--sampler strata``: :class:`~archspec.search._engine.strata.StrataSampler`, the best score of each cost stratum).
The engine knows the hook, not the sampler behind it.

Cost: the candidate's latency in ms (what the search's front is judged on: ``--oracle``'s tabulated latency, else
:func:`~archspec.search._evaluation.latency.measure_latency` with the run's latency cache), or its MACs when the
oracle has no latency pass.  Score: ``score`` (``--zc-score``) of the untrained proxy at the search's seed
(:func:`~archspec.search._evaluation.proxy.score_proxy`, or the table's row that answers the design for that seed:
the same row that then answers its training, so the score never comes from a seed the replay scores on), or the
static ``params`` / ``macs``.  Candidates over a MAC, parameter, memory or latency budget, and under
``--oracle-subset`` the designs the table lacks, are left out: the sampler never proposes what the search would
reject.  Torch-free: the measures come from the search's objective (its latency and zero-cost functions).
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from archspec.search._evaluation.budget import static_check
from archspec.search._evaluation.latency_cache import architecture_key
from archspec.train.failures import TrainingFailure

__all__ = ["ScoredCandidate", "Look", "PriorSampler", "prior_candidates", "MAX_PRIOR_POINTS"]

MAX_PRIOR_POINTS = 10_000  # the look lists the space (SearchSpace.points raises beyond this, naming the limit)


@dataclass(frozen=True)
class ScoredCandidate:
    """One point of the space as the prior sees it: ``params`` (the space's parameter names -> values, as
    ``SearchSpace.points`` yields them), ``cost`` (ms of latency or MACs: lower is cheaper) and ``score`` (a
    zero-cost score: higher ranks better; ``-inf`` when it could not be computed)."""

    params: dict[str, Any]
    cost: float
    score: float


# the look at every candidate: () -> (candidates, CPU seconds the look took)
Look = Callable[[], tuple[Sequence[ScoredCandidate], float]]


class PriorSampler(abc.ABC):
    """The hook of an Optuna sampler that uses priors (mixed into the sampler's class): before the first trial the
    search loop calls :meth:`look_first` once, with the look at every candidate, and shows :attr:`look_status`
    while it runs.  The sampler decides what to do with it (queue trials, fit a model); the loop knows nothing
    more of it.  Any other sampler draws from the first trial on."""

    look_status = "looking at every candidate (latency, zero-cost score)"

    @abc.abstractmethod
    def look_first(self, study: Any, look: Look) -> int:
        """Read ``look()`` into ``study`` before its first trial; returns the trials it queued.

        Called in every worker; a sampler whose study already holds its picks (a resumed run, another worker)
        should return 0 without calling ``look``.  May raise what ``look`` raises (``SpecError``)."""


def prior_candidates(space, data, oracle, latency_of: Callable[[Any], float],
                     zero_cost_of: Callable[[Any], tuple], *, budgets, protocol, score: str) -> Look:
    """A :data:`Look` for a :class:`PriorSampler`: every feasible point of ``space`` as a :class:`ScoredCandidate`,
    and the CPU seconds of the look (the table's zero-cost seconds under ``oracle``: its latency pass has no seconds,
    so a replay counts none for latency -- the study's ``prior_candidates`` says how many a live run would measure;
    else the wall time of the look).
    ``latency_of(spec) -> ms`` and ``zero_cost_of(spec) -> (ZeroCostResult, geometry)`` are the search's own
    measures (:meth:`~archspec.search._engine.objective.CandidateObjective.latency_of`,
    :func:`~archspec.search._engine.early_stop.zero_cost_of`), so the look reads what the trials read.
    ``budgets`` (a :class:`~archspec.search._evaluation.budget.Budgets`) and ``protocol`` (the proxy's, for its
    memory) leave out what the search would reject; ``score`` is the zero-cost score, ``params`` or ``macs``.

    Raises (when called):
        SpecError: the space is not finite or has more than :data:`MAX_PRIOR_POINTS` points.
    """

    def look() -> tuple[list[ScoredCandidate], float]:
        start, tabulated_seconds, out = time.perf_counter(), 0.0, []
        for params, spec in space.points(limit=MAX_PRIOR_POINTS):
            if oracle is not None and architecture_key(spec) not in oracle.tabulated:
                continue
            check = static_check(spec, budgets, data, protocol)
            if not check.feasible:
                continue
            cost = float(check.macs) if oracle is not None and not oracle.latency_ms else latency_of(spec)
            if budgets.latency_ms is not None and (oracle is None or oracle.latency_ms) and cost > budgets.latency_ms:
                continue
            value, seconds = _score(spec, check, score, zero_cost_of)
            tabulated_seconds += seconds
            out.append(ScoredCandidate(params=dict(params), cost=float(cost), score=value))
        return out, (tabulated_seconds if oracle is not None else time.perf_counter() - start)

    return look


def _score(spec, check, name: str, zero_cost_of) -> tuple[float, float]:
    """``(score, seconds)``: the score ``name`` at the search's seed (``-inf`` when not finite, or when scoring fails
    with a :class:`~archspec.train.failures.TrainingFailure` or a RuntimeError such as out of memory)."""
    if name in ("params", "macs"):
        return float(check.params if name == "params" else check.macs), 0.0
    try:
        result, _ = zero_cost_of(spec)
    except (TrainingFailure, RuntimeError):  # one design that cannot be scored (out of memory, NaN) is ranked last;
        return -math.inf, 0.0  # raised, it would end the whole look, and with it the search
    value = result.scores.get(name)
    value = -math.inf if value is None or not math.isfinite(value) else float(value)
    return value, float(result.seconds.get(name, 0.0) or 0.0)
