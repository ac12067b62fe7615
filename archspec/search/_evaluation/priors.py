"""The look at every candidate that :class:`~archspec.search._engine.prior_sampler.StratifiedPriorSampler` stratifies:
each point of a finite space with its cost and one zero-cost score, and the CPU the look took.

Cost: the candidate's latency in ms (what the search's front is judged on: ``--oracle``'s tabulated latency, else
:func:`~archspec.search._evaluation.latency.measure_latency` with the run's latency cache), or its MACs when the
oracle has no latency pass.  Score: ``cfg.zc_score`` (``--zc-score``) of the untrained proxy at the search's seed
(:func:`~archspec.search._evaluation.proxy.score_proxy`, or the table's row that answers the design for that seed:
the same row that then answers its training, so the score never comes from a seed the replay scores on), or the
static ``params`` / ``macs``.  Candidates over a MAC, parameter, memory or latency budget, and under
``--oracle-subset`` the designs the table lacks, are left out: the sampler never proposes what the search would
reject.  Torch-side (imports torch): the engine imports it only when ``--sampler strata`` runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from archspec.search._engine.prior_sampler import ScoredCandidate
from archspec.search._evaluation.budget import static_check
from archspec.search._evaluation.latency import architecture_key, measure_latency
from archspec.search._evaluation.proxy import score_proxy

__all__ = ["prior_candidates", "MAX_PRIOR_POINTS"]

MAX_PRIOR_POINTS = 10_000  # the look lists the space (SearchSpace.points raises beyond this, naming the limit)


def prior_candidates(space, cfg, data, oracle=None, cache=None) -> Callable[[], tuple[list[ScoredCandidate], float]]:
    """A callable returning ``(candidates, seconds)`` for the sampler: every feasible point of ``space`` as a
    :class:`ScoredCandidate`, and the CPU seconds of the look (the table's zero-cost seconds under ``oracle``: its
    latency pass has no seconds, so a replay counts none for latency; else the wall time of the look).

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
            cost = _cost(spec, check, cfg, oracle, cache)
            if budgets.latency_ms is not None and (oracle is None or oracle.latency_ms) and cost > budgets.latency_ms:
                continue
            score, seconds = _score(spec, check, cfg, data, oracle)
            tabulated_seconds += seconds
            out.append(ScoredCandidate(params=dict(params), cost=float(cost), score=score))
        return out, (tabulated_seconds if oracle is not None else time.perf_counter() - start)

    return look


def _cost(spec, check, cfg, oracle, cache) -> float:
    """Latency in ms (tabulated or measured), or MACs under an oracle without latency."""
    if oracle is not None:
        return float(oracle.latency(spec)) if oracle.latency_ms else float(check.macs)
    return float(measure_latency(spec, cfg.latency, cache))


def _score(spec, check, cfg, data, oracle) -> tuple[float, float]:
    """``(score, seconds)``: ``cfg.zc_score`` at the search's seed (``-inf`` when not finite)."""
    name = cfg.zc_score
    if name in ("params", "macs"):
        return float(check.params if name == "params" else check.macs), 0.0
    if oracle is not None:
        result, _ = oracle.zero_cost(spec, seed=cfg.seed)
    else:
        result, _ = score_proxy(spec, data, cfg.protocol, (name,), seed=cfg.seed)
    value = result.scores.get(name)
    value = -math.inf if value is None or not math.isfinite(value) else float(value)
    return value, float(result.seconds.get(name, 0.0) or 0.0)
