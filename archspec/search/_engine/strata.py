"""Free looks choose the first designs to train: the best zero-cost score of each cost stratum of a finite space,
queued as the study's first trials (``--sampler strata``, issue 54 item 3).

The issue's first prior is "many candidates scored for free and the most promising trained" (zero-cost warm starts:
Abdelfattah et al. 2021, "Zero-Cost Proxies for Lightweight NAS", sec. 5, about 4x fewer samples on NAS-Bench-101).
A search judged by the hypervolume of its (accuracy, cost) front also needs its trained designs spread over the cost
axis, which random draws leave to chance.  The strata rule does both: every candidate of the space is looked at
once (its cost and one zero-cost score: no training), the candidates sorted by cost are split into ``n_strata``
bins of equal count, and the best-scoring design of each bin is queued with Optuna's ``enqueue_trial``
(:func:`enqueue_strata`); the study's sampler, random draws, takes over once the queue is empty.  The bins are
visited in bit-reversed order (0, n/2, n/4, 3n/4, ...) so that a search stopped early (``--timeout``) has still
spread its designs over the whole cost range.

Queued trials rather than a sampling rule of its own: the storage hands each pick to exactly one worker, the look
runs once per study (not once per worker), and a resumed run finds the queue where it was.  :class:`StrataSampler`
is Optuna's random sampler with the priors hook (:class:`~archspec.search._evaluation.priors.PriorSampler`): the
search loop hands it the look before the first trial, and it queues the picks.

Which cost and which score (and whether this rule beats random draws at all) is for the replays on the finished
table to say: ``bench/search_works.py priors`` and docs/search-works.md.  A zero-cost score must be computed at the
seed the candidate then trains with: read at another seed it predicts which initialisation trains well, and a
replay scored on held-out seeds counts that as skill (research/search-works-notebook.md, "A zero-cost score leaks
its seed").

Torch-free: the candidates come from a callable the engine provides
(:func:`archspec.search._evaluation.priors.prior_candidates`), called once before the first trial.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import optuna

from archspec.search._evaluation.priors import Look, PriorSampler, ScoredCandidate

__all__ = ["ScoredCandidate", "bit_reversed_order", "stratified_picks", "enqueue_strata", "StrataSampler"]

PRIOR_SECONDS_ATTR = "prior_seconds"  # study user attribute: CPU seconds the look at every candidate took
PRIOR_CANDIDATES_ATTR = "prior_candidates"  # study user attribute: candidates the look measured and scored
STRATA_ATTR = "strata"  # study user attribute: picks queued (its presence: the look is done for this study)
STRATUM_ATTR = "stratum"  # trial user attribute of a queued pick: its cost bin, 0 = the cheapest


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


def enqueue_strata(study: optuna.Study, look: Look, n_strata: int, seed: int | None) -> int:
    """Queue :func:`stratified_picks` of ``look()`` as waiting trials of ``study`` (Optuna's ``enqueue_trial``,
    ``skip_if_exists``): the storage hands each to exactly one worker, in trial-number order (the bit-reversed
    order of the strata), and the study's sampler (random draws) takes over once the queue is empty.  Done once
    per study: a study that holds :data:`STRATA_ATTR` (an earlier run, another worker) is left alone, and a pick
    that a trial of the study already has is not queued again.

    ``look() -> (candidates, seconds)``: every candidate of the space with its cost and score, and the CPU seconds
    the look took (:func:`archspec.search._evaluation.priors.prior_candidates`).  Writes the study user attributes
    :data:`PRIOR_SECONDS_ATTR` (those seconds), :data:`PRIOR_CANDIDATES_ATTR` (how many candidates were looked at)
    and :data:`STRATA_ATTR` (how many picks were queued); each queued trial carries the user attribute
    ``stratum`` (its bin, 0 = cheapest).  Returns the number of picks (0 when the study had them already and
    nothing was looked at).

    Two workers that start at the same instant may both look and queue (Optuna's ``skip_if_exists`` is not atomic
    across processes); a pick queued twice is caught by the search's duplicate check and costs no training.

    Raises:
        ValueError: ``n_strata`` below 1.
    """
    if n_strata < 1:
        raise ValueError(f"n_strata must be >= 1, not {n_strata}")
    if STRATA_ATTR in study.user_attrs:
        return 0
    candidates, seconds = look()
    candidates = list(candidates)
    picks = stratified_picks(candidates, n_strata, np.random.RandomState(seed))
    for pick, stratum in zip(picks, bit_reversed_order(len(picks))):  # the order stratified_picks visits the bins
        study.enqueue_trial(dict(pick.params), user_attrs={STRATUM_ATTR: stratum}, skip_if_exists=True)
    study.set_user_attr(PRIOR_SECONDS_ATTR, round(float(seconds), 3))
    study.set_user_attr(PRIOR_CANDIDATES_ATTR, len(candidates))
    study.set_user_attr(STRATA_ATTR, len(picks))
    return len(picks)


class StrataSampler(PriorSampler, optuna.samplers.RandomSampler):
    """``--sampler strata``: Optuna's :class:`~optuna.samplers.RandomSampler` (seeded with ``seed``: the same draws)
    whose priors hook queues :func:`stratified_picks` of ``n_strata`` cost strata first (:func:`enqueue_strata`,
    its bins shuffled by ``seed``).

    Raises:
        ValueError: ``n_strata`` below 1.
    """

    def __init__(self, seed: int | None, n_strata: int):
        if n_strata < 1:
            raise ValueError(f"n_strata must be >= 1, not {n_strata}")
        super().__init__(seed=seed)
        self.seed, self.n_strata = seed, n_strata

    def look_first(self, study: optuna.Study, look: Look) -> int:
        """:func:`enqueue_strata` of ``look`` into ``study``: the picks queued (0 when the study had them)."""
        return enqueue_strata(study, look, self.n_strata, self.seed)
