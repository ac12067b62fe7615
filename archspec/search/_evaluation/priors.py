"""The look at every candidate that ``--sampler strata`` stratifies
(:func:`~archspec.search._engine.strata.enqueue_strata`): each point of a finite space with its cost and one
zero-cost score, and the CPU the look took.

Cost: the candidate's latency in ms (what the search's front is judged on: ``--oracle``'s tabulated latency, else
:func:`~archspec.search._evaluation.latency.measure_latency` with the run's latency cache), or its MACs when the
oracle has no latency pass.  Score: ``cfg.zc_score`` (``--zc-score``) of the untrained proxy at the search's seed
(:func:`~archspec.search._evaluation.proxy.score_proxy`, or the table's row that answers the design for that seed:
the same row that then answers its training, so the score never comes from a seed the replay scores on), or the
static ``params`` / ``macs``.  Candidates over a MAC, parameter, memory or latency budget, and under
``--oracle-subset`` the designs the table lacks, are left out: the sampler never proposes what the search would
reject.  Torch-free: the measures come from the search's objective (its latency and zero-cost functions).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from archspec.search._engine.strata import ScoredCandidate
from archspec.search._evaluation.budget import static_check
from archspec.search._evaluation.latency_cache import architecture_key
from archspec.train.failures import TrainingFailure

__all__ = ["prior_candidates", "MAX_PRIOR_POINTS"]

MAX_PRIOR_POINTS = 10_000  # the look lists the space (SearchSpace.points raises beyond this, naming the limit)


def prior_candidates(space, cfg, data, oracle, latency_of: Callable[[Any], float],
                     zero_cost_of: Callable[[Any], tuple]) -> Callable[[], tuple[list[ScoredCandidate], float]]:
    """A callable returning ``(candidates, seconds)`` for :func:`~archspec.search._engine.strata.enqueue_strata`:
    every feasible point of ``space`` as a :class:`ScoredCandidate`, and the CPU seconds of the look (the table's
    zero-cost seconds under ``oracle``: its latency pass has no seconds, so a replay counts none for latency -- the
    study's ``prior_candidates`` says how many a live run would measure; else the wall time of the look).
    ``latency_of(spec) -> ms`` and ``zero_cost_of(spec) -> (ZeroCostResult, geometry)`` are the search's own
    measures (:meth:`~archspec.search._engine.objective.CandidateObjective.latency_of`,
    :func:`~archspec.search._engine.early_stop.zero_cost_of`), so the look reads what the trials read.

    Raises (when called):
        SpecError: the space is not finite or has more than :data:`MAX_PRIOR_POINTS` points.
    """

    def look() -> tuple[list[ScoredCandidate], float]:
        start, tabulated_seconds, out = time.perf_counter(), 0.0, []
        budgets = cfg.budgets
        for params, spec in space.points(limit=MAX_PRIOR_POINTS):
            if oracle is not None and architecture_key(spec) not in oracle.tabulated:
                continue
            check = static_check(spec, budgets, data, cfg.protocol)
            if not check.feasible:
                continue
            cost = float(check.macs) if oracle is not None and not oracle.latency_ms else latency_of(spec)
            if budgets.latency_ms is not None and (oracle is None or oracle.latency_ms) and cost > budgets.latency_ms:
                continue
            score, seconds = _score(spec, check, cfg, zero_cost_of)
            tabulated_seconds += seconds
            out.append(ScoredCandidate(params=dict(params), cost=float(cost), score=score))
        return out, (tabulated_seconds if oracle is not None else time.perf_counter() - start)

    return look


def _score(spec, check, cfg, zero_cost_of) -> tuple[float, float]:
    """``(score, seconds)``: ``cfg.zc_score`` at the search's seed (``-inf`` when not finite, or when scoring fails
    with a :class:`~archspec.train.failures.TrainingFailure` or a RuntimeError such as out of memory)."""
    name = cfg.zc_score
    if name in ("params", "macs"):
        return float(check.params if name == "params" else check.macs), 0.0
    try:
        result, _ = zero_cost_of(spec)
    except (TrainingFailure, RuntimeError):  # one design that cannot be scored (out of memory, NaN) is ranked last;
        return -math.inf, 0.0  # raised, it would end the whole look, and with it the search
    value = result.scores.get(name)
    value = -math.inf if value is None or not math.isfinite(value) else float(value)
    return value, float(result.seconds.get(name, 0.0) or 0.0)
