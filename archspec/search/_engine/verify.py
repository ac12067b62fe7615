"""How far to trust a search's front: its best K designs trained again with a second seed (``--verify K``, issue 54).

A search ranks each candidate by one short proxy training with one seed; on the levit_small table two seeds of
the same design differ by about as much as the designs of a front do (docs/search-works.md), so a front's order is
partly seed noise.  After the search, the front's best ``K`` designs (by the score the search ranked by) are
trained once more with another seed, inside the user's budget: the search itself trains ``--trials`` less K
candidates (K at most a quarter of ``--trials``), and under ``--timeout`` it stops sampling once the time left is
K times its mean training time.  The summary reports, per design, both seeds' scores and accuracies, the two
seeds' rank agreement (Kendall tau over the K designs) and the seed spread (the largest difference between a
design's two scores); each front point is marked ``within_seed_spread`` when its score is within that spread of
the next better point's (the proxy cannot order them).

Under ``--oracle`` the second seed is the first replay seed after the search's whose table seed differs from the
one that answered the design (:meth:`archspec.search._tabulation.oracle.OracleTable.seed_of`), so the re-training is
another
row of the table, never the same one again.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from archspec.search._report.results import spec_of_trial

__all__ = ["verify_count", "without_second_seed", "TimeReserve", "front_to_verify", "verify_front", "mark_ties"]


def verify_count(verify: int, trials: int | None) -> int:
    """The designs actually re-trained: ``verify``, but at most a quarter of ``trials`` (rounded down), so that the
    search itself keeps three quarters of the candidates: 3 of the default 16, none below 4.  Raises nothing."""
    if trials is None:
        return max(0, verify)
    return max(0, min(verify, trials // 4))


class TimeReserve:
    """Optuna callback: stop sampling once ``--timeout`` leaves less than ``k`` mean training times (of the
    candidates trained so far in this run), so that the verification fits in the user's time budget."""

    def __init__(self, k: int, timeout: float | None, start: float):
        self.k, self.timeout, self.start = k, timeout, start
        self.seconds: list[float] = []

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        seconds = trial.user_attrs.get("train_seconds")
        if trial.user_attrs.get("status") == "trained" and isinstance(seconds, int | float):
            self.seconds.append(float(seconds))
        if self.timeout is None or not self.k or not self.seconds:
            return
        mean = sum(self.seconds) / len(self.seconds)
        if time.perf_counter() - self.start + self.k * mean >= self.timeout:
            study.stop()


def _trained_feasible(study: optuna.Study) -> list[FrozenTrial]:
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        constraints = t.system_attrs.get("constraints")
        feasible = constraints is None or all(c <= 0 for c in constraints)
        if feasible and t.user_attrs.get("status") == "trained" and "reused_from" not in t.user_attrs:
            out.append(t)
    return out


def front_to_verify(study: optuna.Study, multi: bool, k: int) -> list[FrozenTrial]:
    """The front's best ``k`` trials by their first value (the score the search ranked by): the trained, feasible
    Pareto trials when ``multi``, else the trained feasible trials.  Raises nothing."""
    trained = _trained_feasible(study)
    if multi:
        on_front = {t.number for t in study.best_trials}
        trained = [t for t in trained if t.number in on_front]
    trained.sort(key=lambda t: (-t.values[0], t.number))
    return trained[:k]


def without_second_seed(cfg: Any, oracle: Any) -> tuple[Any, str | None]:
    """``(cfg, note)``: under an ``oracle`` whose table has one reference seed there is no second seed -- every
    replay seed draws the same row, and a verification would read it again (rank agreement 1, spread 0, of one
    row) -- so ``cfg.verify`` becomes 0 (every trial goes to the search) and ``note`` says why; otherwise ``cfg``
    as it is and ``None``.  Raises nothing."""
    if oracle is None or not cfg.verify or len(oracle.seeds) >= 2:
        return cfg, None
    note = (f"no verification (--verify {cfg.verify}): the table has one reference seed {oracle.seeds}, so there is "
            "no second seed to train the front's best again with; every trial went to the search")
    return dataclasses.replace(cfg, verify=0), note


def _second_seed(seed: int, key: str, oracle: Any, answered: int | None) -> int:
    """The seed of the verification: ``seed + 1``; under ``--oracle`` the first replay seed after ``seed`` whose
    table row for ``key`` is not the one that answered (tables have at least two reference seeds)."""
    if oracle is None or answered is None or len(oracle.seeds) < 2:
        return seed + 1
    second = seed + 1
    while oracle.seed_of(key, second) == answered:
        second += 1
    return second


def verify_front(study: optuna.Study, objective: Any, cfg: Any, multi: bool, k: int) -> dict | None:
    """Train the front's best ``k`` designs again with a second seed (:func:`front_to_verify`) through the
    search's own training (``objective.train_fn``: the proxy, or the oracle's table); ``None`` when ``k`` is 0 or
    nothing was trained.

    Returns:
        ``{"k", "designs": [{"trial", "arch_key", "seeds", "score": [first, second], "accuracy": [first,
        second]}], "rank_agreement" (Kendall tau of the two seeds' scores, None below 2 designs), "seed_spread"
        (the largest |first - second| score), "seconds"}``.  Scores are what the search ranked by (val top-1, or
        minus the mean training loss with ``--proxy-score tse``); accuracies val top-1 in 0..1.

    Raises:
        Whatever the training raises (a diverged proxy is recorded as ``None`` scores instead).
    """
    trials = front_to_verify(study, multi, k) if k else []
    if not trials:
        return None
    start = time.perf_counter()
    designs = []
    for t in trials:
        key = t.user_attrs.get("arch_key")
        seed = _second_seed(cfg.seed, key, objective.oracle, t.user_attrs.get("oracle_seed"))
        result = objective.train_fn(spec_of_trial(t), objective.data, cfg.protocol, seed=seed)
        score = getattr(result, "score", None)
        score = float(result.accuracy if score is None else score)
        designs.append({"trial": t.number, "arch_key": key, "seeds": [cfg.seed, seed],
                        "score": [t.values[0], score if math.isfinite(score) else None],
                        "accuracy": [t.user_attrs.get("accuracy"), float(result.accuracy)]})
    pairs = [d["score"] for d in designs if d["score"][1] is not None]
    return {"k": len(designs), "designs": designs, "rank_agreement": _tau(pairs),
            "seed_spread": max((abs(a - b) for a, b in pairs), default=None),
            "seconds": round(time.perf_counter() - start, 2)}


def _tau(pairs: list[list[float]]) -> float | None:
    """Kendall's tau-a of the two seeds' scores (ties count zero); ``None`` below two designs."""
    n = len(pairs)
    if n < 2:
        return None
    concordant = 0
    for i in range(n):
        for j in range(i + 1, n):
            a = (pairs[i][0] - pairs[j][0]) * (pairs[i][1] - pairs[j][1])
            concordant += (a > 0) - (a < 0)
    return concordant / (n * (n - 1) / 2)


def mark_ties(points: list[dict], verification: dict | None) -> None:
    """In place: each front point (``summary["pareto"]``, best score first) gets ``within_seed_spread``: whether its
    score is within the verification's seed spread of the next better point's, and the verified points their
    ``second_seed_score``.  Nothing changes without a verification.  Raises nothing."""
    if not verification or verification.get("seed_spread") is None:
        return
    spread = verification["seed_spread"]
    second = {d["trial"]: d["score"][1] for d in verification["designs"]}
    previous = None
    for point in points:
        value = point.get("score", point.get("accuracy"))
        point["within_seed_spread"] = bool(previous is not None and value is not None and
                                           abs(previous - value) <= spread)
        if point["trial"] in second:
            point["second_seed_score"] = second[point["trial"]]
        previous = value if value is not None else previous
