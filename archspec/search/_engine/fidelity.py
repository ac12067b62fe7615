"""Multi-fidelity search: a zero-cost rung, or successive halving over rungs of proxy-training steps.

``zc``: before any training, each candidate's untrained proxy (at its proxy geometry) is scored on one
training batch (:mod:`archspec.search._evaluation.zero_cost`: SynFlow, NASWOT, grad-norm; #params and #MACs); only a
candidate whose chosen score is :func:`promotable` among all scored so far is trained, to the full proxy
length.  The rest of this module is successive halving (``sha``, ``hyperband``):

Every candidate starts the full proxy schedule (same learning-rate curve); its validation accuracy is
read at the **rungs**, ``min_steps * eta**k`` steps (``k = 0, 1, ...`` while below ``steps``) and at
``steps`` itself.  At each rung below the last a candidate goes on only if it is promotable, else it
stops there (an Optuna PRUNED trial with ``status = stopped`` and its rung accuracies in the user attr
``rungs``); only candidates that reach the last rung are COMPLETE and enter the results.

* ``--objective accuracy``: Optuna's own pruners on the reported accuracies --
  ``optuna.pruners.SuccessiveHalvingPruner(min_resource=min_steps, reduction_factor=eta)`` (``sha``) or
  ``optuna.pruners.HyperbandPruner(min_resource=min_steps, max_resource=steps, reduction_factor=eta)``
  (``hyperband``).
* ``--objective pareto``: Optuna does not prune multi-objective studies, so archspec applies the same
  asynchronous successive-halving rule itself (:func:`promotable`, Optuna's ``SuccessiveHalvingPruner``
  rule: in the top ``1/eta`` of the accuracies reached at this rung by all trials so far, or the best while
  fewer than ``eta`` have reached it) -- and, so that a fast but less accurate design is not cut from a
  latency/accuracy front, a candidate that is not dominated in (rung accuracy, latency) by any other
  trial at the rung also goes on.

Schedule for the default 120-step proxy with ``eta = 3``: rungs at 13, 39 and 120 steps
(``min_steps = round(120 / 9)``); for 60 steps, 7, 21 and 60.  :func:`rung_correlations` reports, per
rung, Kendall's tau between the rung accuracy and the last rung's over the candidates that reached the last
rung.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import optuna

from archspec.errors import SpecError
from archspec.search._engine.config import FIDELITIES, ZERO_COST_RANKINGS

__all__ = ["Rungs", "rung_schedule", "promotable", "make_pruner", "rung_correlations", "FIDELITIES", "RUNGS_ATTR",
           "ZERO_COST_RANKINGS", "zero_cost_summary"]


RUNGS_ATTR = "rungs"  # user attr: {"<step>": accuracy} at every rung the trial reached


@dataclass(frozen=True)
class Rungs:
    """Rung steps, ascending; the last is the full proxy length."""

    steps: tuple[int, ...]
    eta: int

    @property
    def min_steps(self) -> int:
        """Steps of the first rung (the evaluation interval of the proxy under this schedule)."""
        return self.steps[0]

    def describe(self) -> dict:
        """JSON-ready dict."""
        return {"rungs": list(self.steps), "eta": self.eta}


def rung_schedule(total_steps: int, eta: int = 3, min_steps: int | None = None) -> Rungs:
    """Rungs ``min_steps * eta**k`` below ``total_steps``, then ``total_steps``.

    ``min_steps`` defaults to ``round(total_steps / eta**2)`` (three rungs), at least 1.

    Raises:
        SpecError: ``eta < 2`` or ``min_steps`` outside ``1..total_steps`` (at ``eta`` / ``min_steps``).
    """
    if eta < 2:
        raise SpecError.single(("eta",), f"the reduction factor must be at least 2, got {eta}")
    if min_steps is None:
        min_steps = max(1, round(total_steps / eta**2))
    if not 1 <= min_steps <= total_steps:
        raise SpecError.single(("min_steps",),
                               f"must be between 1 and `protocol.steps` ({total_steps}), got {min_steps}")
    steps, rung = [], min_steps
    while rung < total_steps:
        steps.append(rung)
        rung *= eta
    return Rungs(tuple(steps) + (total_steps,), eta)


def promotable(value: float, latency: float, competitors: list[tuple[float, float]], eta: int) -> bool:
    """Whether a candidate with rung accuracy ``value`` and ``latency`` goes on to the next rung.

    ``competitors``: ``(accuracy, latency)`` of every trial that reached this rung, this one included.
    Optuna's ``SuccessiveHalvingPruner`` rule on accuracy (top ``len // eta``, at least the best), or
    not dominated in (higher accuracy, lower latency) by any competitor.
    """
    ranked = sorted((acc for acc, _ in competitors), reverse=True)
    cutoff = ranked[max(len(ranked) // eta - 1, 0)]
    if value >= cutoff:
        return True
    return not any(acc >= value and lat <= latency and (acc > value or lat < latency) for acc, lat in competitors)


def make_pruner(fidelity: str, rungs: Rungs | None) -> optuna.pruners.BasePruner | None:
    """Optuna's pruner for a single-objective study (``None`` for ``none``)."""
    if fidelity == "sha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=rungs.min_steps, reduction_factor=rungs.eta,
                                                      min_early_stopping_rate=0)
    if fidelity == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=rungs.min_steps, max_resource=rungs.steps[-1],
                                              reduction_factor=rungs.eta)
    return None


def _kendall(xs: list[float], ys: list[float]) -> tuple[float | None, float | None]:
    from scipy.stats import kendalltau  # noqa: PLC0415 - scipy comes with scikit-learn

    if len(xs) < 3:
        return None, None
    result = kendalltau(xs, ys)
    tau, p = float(result.statistic), float(result.pvalue)
    return (None, None) if math.isnan(tau) else (round(tau, 3), round(p, 4))


def rung_correlations(rung_values: list[dict], rungs: Rungs) -> list[dict]:
    """Per rung below the last: Kendall's tau (and p-value) between rung and last-rung accuracy.

    Args:
        rung_values: one ``{"<step>": accuracy}`` per trial (its user attr ``rungs``).

    Returns:
        ``[{"steps", "n", "kendall_tau", "p_value"}]``; tau is ``None`` with fewer than 3 finished trials.
    """
    last = str(rungs.steps[-1])
    finished = [r for r in rung_values if last in r]
    out = []
    for step in rungs.steps[:-1]:
        pairs = [(r[str(step)], r[last]) for r in finished if str(step) in r]
        tau, p = _kendall([a for a, _ in pairs], [b for _, b in pairs])
        out.append({"steps": step, "n": len(pairs), "kendall_tau": tau, "p_value": p})
    return out


def zero_cost_summary(scored: list[dict], score: str, eta: int) -> dict:
    """What the zero-cost rung did and how well each score ranks: the ``summary.json`` entry ``zero_cost``.

    Args:
        scored: one ``{"scores": {...}, "seconds": {...}, "accuracy": float | None}`` per scored candidate
            (``accuracy`` the trained proxy's val top-1, ``None`` when it was not trained).

    Returns:
        ``{"score", "eta", "scored", "trained", "seconds_per_candidate" (median of the scores' total
        seconds), "kendall_tau": {name: {"tau", "p_value", "n"}}}``: Kendall's tau between each score and the
        trained accuracy over the trained candidates (``None`` with fewer than 3).
    """

    trained = [c for c in scored if c.get("accuracy") is not None]
    taus = {}
    for name in ZERO_COST_RANKINGS:
        pairs = [(c["scores"][name], c["accuracy"]) for c in trained
                 if c["scores"].get(name) is not None and math.isfinite(c["scores"][name])]
        tau, p = _kendall([a for a, _ in pairs], [b for _, b in pairs])
        taus[name] = {"tau": tau, "p_value": p, "n": len(pairs)}
    totals = [sum(c["seconds"].values()) for c in scored]
    return {"score": score, "eta": eta, "scored": len(scored), "trained": len(trained),
            "seconds_per_candidate": round(statistics.median(totals), 4) if totals else None, "kendall_tau": taus}
