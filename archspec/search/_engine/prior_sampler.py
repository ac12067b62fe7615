"""Free looks choose the first designs to train: an Optuna sampler that stratifies a finite space by cost and takes
the best zero-cost score of each stratum (issue 54 item 3).

The issue's first prior is "many candidates scored for free and the most promising trained" (zero-cost warm starts:
Abdelfattah et al. 2021, "Zero-Cost Proxies for Lightweight NAS", sec. 5, about 4x fewer samples on NAS-Bench-101).
A search judged by the hypervolume of its (accuracy, cost) front also needs its trained designs spread over the cost
axis, which random draws leave to chance.  :class:`StratifiedPriorSampler` does both: every candidate of the space
is looked at once (its cost and one zero-cost score: no training), the candidates sorted by cost are split into
``n_strata`` bins of equal count, and the first ``n_strata`` trials train the best-scoring design of each bin; then
a second sampler (random draws by default) takes over.  The bins are visited in bit-reversed order (0, n/2, n/4,
3n/4, ...) so that a search stopped early (``--timeout``) has still spread its designs over the whole cost range.

Which cost and which score (and whether this rule beats random draws at all) is for the replays on the finished
table to say: ``bench/search_works.py priors`` and docs/search-works.md.  A zero-cost score must be computed at the
seed the candidate then trains with: read at another seed it predicts which initialisation trains well, and a
replay scored on held-out seeds counts that as skill (docs/search-works.md, "A zero-cost score leaks its seed").

Torch-free: the candidates come from a callable the engine provides
(:func:`archspec.search._evaluation.priors.prior_candidates`), computed on the first trial.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.search_space import IntersectionSearchSpace
from optuna.trial import FrozenTrial

__all__ = ["ScoredCandidate", "StratifiedPriorSampler", "bit_reversed_order"]

PRIOR_SECONDS_ATTR = "prior_seconds"  # study user attribute: CPU seconds the look at every candidate took


@dataclass(frozen=True)
class ScoredCandidate:
    """One point of the space as the prior sees it: ``params`` (the space's parameter names -> values, as
    ``SearchSpace.points`` yields them), ``cost`` (ms of latency or MACs: lower is cheaper) and ``score`` (a
    zero-cost score: higher ranks better; ``-inf`` when it could not be computed)."""

    params: dict[str, Any]
    cost: float
    score: float


def bit_reversed_order(n: int) -> list[int]:
    """``0 .. n-1`` in bit-reversed order of their binary digits (for n = 8: 0 4 2 6 1 5 3 7), non-power-of-two ``n``
    by skipping the indices past ``n``: every prefix is spread over the range.  Raises nothing."""
    if n <= 0:
        return []
    bits = max(1, (n - 1).bit_length())
    order = [int(format(i, f"0{bits}b")[::-1], 2) for i in range(1 << bits)]
    return [i for i in order if i < n]


def stratified_picks(candidates: Sequence[ScoredCandidate], n_strata: int,
                     rng: np.random.RandomState) -> list[ScoredCandidate]:
    """The best-scoring candidate of each of ``n_strata`` cost bins of equal count (ties in cost broken at random; in
    score, the cheaper candidate first),
    in :func:`bit_reversed_order` of the bins.  Fewer candidates than strata: every candidate, one per bin.
    Raises nothing."""
    if not candidates or n_strata <= 0:
        return []
    tie = rng.permutation(len(candidates))
    order = sorted(range(len(candidates)), key=lambda i: (candidates[i].cost, tie[i]))
    bins = [b for b in np.array_split(np.array(order), min(n_strata, len(candidates))) if len(b)]
    # equal scores (designs the score cannot tell apart): the cheaper one
    best = [candidates[max(b, key=lambda i: (candidates[i].score, -candidates[i].cost, -tie[i]))] for b in bins]
    return [best[i] for i in bit_reversed_order(len(best))]


def _signature(params: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


class StratifiedPriorSampler(optuna.samplers.BaseSampler):
    """The best zero-cost score of each cost stratum first, then ``then`` (random draws by default).

    Args:
        candidates: called once, on the first trial that needs it: every candidate of the space
            (:class:`ScoredCandidate`), its cost and score computed at the search's seed; returns ``(candidates,
            seconds)``, the CPU seconds the look took (written to the study as ``prior_seconds``).  ``None``: not
            attached yet -- the sampler answers as ``then`` (a worker's first trial is asked before archspec's
            objective attaches the look, and on a resumed study or a second worker that ask has a relative search
            space; the objective then replaces the sampler with one that has the look).
        n_strata: cost bins, one trained design each (the search's trained candidates, at most the candidates).
        seed: seed of the tie-breaks and of the default ``then`` sampler.
        then: the sampler after the strata (default ``optuna.samplers.RandomSampler(seed)``).

    A stratum's design that another trial of the study already has (any state; a resumed run or another worker) is
    not proposed again; a candidate's params are proposed through relative sampling (the intersection search space)
    and, on the first trials, through ``sample_independent``, parameter by parameter.

    Raises:
        ValueError: ``n_strata`` below 1.
    """

    def __init__(self, candidates: Callable[[], tuple[Sequence[ScoredCandidate], float]] | None, n_strata: int,
                 seed: int | None = None, then: optuna.samplers.BaseSampler | None = None) -> None:
        if n_strata < 1:
            raise ValueError(f"n_strata must be >= 1, not {n_strata}")
        self._candidates = candidates
        self._n_strata = n_strata
        self._rng = np.random.RandomState(seed)
        self._then = then if then is not None else optuna.samplers.RandomSampler(seed=seed)
        self._picks: list[ScoredCandidate] | None = None
        self._assigned: dict[int, dict[str, Any] | None] = {}  # trial number -> its stratum's params (None: then)
        self._space = IntersectionSearchSpace(include_pruned=True)

    def reseed_rng(self) -> None:
        self._rng.seed()
        self._then.reseed_rng()

    def _assignment(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any] | None:
        """The params this trial trains: the next stratum's pick no other trial has, or ``None`` (``then``)."""
        if trial.number in self._assigned:
            return self._assigned[trial.number]
        if self._candidates is None:  # not attached yet (a worker's first ask, before its objective runs)
            return None
        if self._picks is None:
            candidates, seconds = self._candidates()
            self._picks = stratified_picks(list(candidates), self._n_strata, self._rng)
            study.set_user_attr(PRIOR_SECONDS_ATTR, round(float(seconds), 3))
        taken = {_signature(t.params) for t in study.get_trials(deepcopy=False)
                 if t.number != trial.number and t.params}
        taken |= {_signature(p) for n, p in self._assigned.items() if p is not None and n != trial.number}
        chosen = next((c.params for c in self._picks if _signature(c.params) not in taken), None)
        self._assigned[trial.number] = chosen
        return chosen

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {name: dist for name, dist in self._space.calculate(study).items() if not dist.single()}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:  # a study's first trial (nothing to intersect yet): its params come one by one
            return {}
        chosen = self._assignment(study, trial)
        if chosen is None:
            return self._then.sample_relative(study, trial, self._then.infer_relative_search_space(study, trial))
        return {name: chosen[name] for name in search_space if name in chosen}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        chosen = self._assignment(study, trial)
        if chosen is not None and param_name in chosen:
            value = chosen[param_name]
            try:
                if param_distribution._contains(param_distribution.to_internal_repr(value)):
                    return value
            except ValueError:  # not one of this distribution's choices: the space changed under a resumed study
                pass
        return self._then.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._then.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state, values) -> None:
        self._then.after_trial(study, trial, state, values)
