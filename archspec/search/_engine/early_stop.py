"""Where a candidate or a search stops early: fidelity rungs, the zero-cost rung, and the stop rules.

Rungs (:mod:`archspec.search._engine.fidelity` has the schedule and the promotion rule): with ``--fidelity sha`` /
``hyperband`` a candidate's proxy accuracy is read at every rung (a step count) and the candidate stops there
unless it is promotable (:func:`rung_stops`); with ``--fidelity zc`` its untrained proxy is scored first and
only promising candidates train (:func:`zero_cost_stops`).  A stopped candidate is a PRUNED trial (user
attr ``status = stopped``).

Stop rules (:class:`StopRules`, an Optuna callback) end the whole search: ``--trials`` candidates trained,
:data:`MAX_CONSECUTIVE_INFEASIBLE` infeasible samples in a row (the budgets leave nothing),
:data:`MAX_CONSECUTIVE_DUPLICATES` samples in a row of architectures the study already has (the space is
exhausted), or under ``--oracle-subset`` one design the table lacks proposed :data:`MAX_UNTABULATED_REPEATS` times
since the last trained candidate (the sampler does not learn from it); :func:`stop_notes` says which.
"""

from __future__ import annotations

import gc
import math
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import optuna
from optuna.trial import TrialState

from archspec.errors import SpecError
from archspec.search._engine.config import ZERO_COST_ATTR, SearchConfig
from archspec.search._engine.fidelity import (
    RUNGS_ATTR,
    make_pruner,
    promotable,
    rung_correlations,
    rung_schedule,
    zero_cost_summary,
)
from archspec.search._evaluation.protocols import GEOMETRY_ATTR, ZERO_COST_SCORES

if TYPE_CHECKING:  # annotations only
    from archspec.spec import ArchSpec

__all__ = ["MAX_CONSECUTIVE_INFEASIBLE", "MAX_CONSECUTIVE_DUPLICATES", "MAX_UNTABULATED_REPEATS", "fidelity_plan",
           "rung_stops", "zero_cost_stops", "fidelity_summary", "study_zero_cost_summary", "StopRules", "stop_notes",
           "SearchCounts"]

MAX_CONSECUTIVE_INFEASIBLE = 2000
# Samples in a row, since the last trained candidate, of architectures the study already trained or is
# training: the space (within the budgets) has nothing new left for this sampler.
MAX_CONSECUTIVE_DUPLICATES = 20
# --oracle-subset: proposals of one design the table lacks since the last trained candidate.  Such a design is a
# pruned trial; TPE ranks it last and random sampling moves on, but a sampler that fits completed trials only (gp)
# keeps proposing it (issue 57: 152 infeasible trials for 2 trained, until the timeout).  Random sampling repeats a
# given design 10 times before training anything else only when the space is all but exhausted.
MAX_UNTABULATED_REPEATS = 10




class SearchCounts(Protocol):
    """What the stop rules and the summaries read of a running search: the counts its objective keeps
    (:class:`~archspec.search._engine.objective.CandidateObjective` has them; the rules need nothing else of it, so
    this module does not import it, and it imports this one)."""

    oracle: Any                       # the --oracle table, or None (no candidate builds a model then)
    attempted: int                    # candidates that reached training (the --trials count)
    consecutive_infeasible: int       # infeasible samples in a row
    consecutive_duplicates: int       # samples in a row of architectures the study already has
    untabulated_repeats: Counter[str]  # --oracle-subset: proposals of each design the table lacks
    stopped: int                      # candidates stopped at a rung
    zc_scored: int                    # candidates the zero-cost rung scored


# ----------------------------------------------------------------------------------- rungs
def fidelity_plan(cfg: SearchConfig, multi: bool):
    """``(rungs, pruner)`` for ``cfg.fidelity`` (see :mod:`archspec.search._engine.fidelity`); ``multi``: two
    objectives.

    Raises:
        SpecError: ``fidelity="hyperband"`` with ``objective="pareto"`` (Optuna prunes single-objective
            studies only; the Pareto mode has archspec's successive halving, ``sha``), or bad rungs.
    """
    if cfg.fidelity == "zc":  # the zero-cost rung (zero_cost_stops), then full training
        return None, optuna.pruners.NopPruner()
    if cfg.fidelity == "none":
        median = optuna.pruners.MedianPruner(n_startup_trials=3) if (cfg.prune and not multi) else None
        return None, median or optuna.pruners.NopPruner()
    if cfg.fidelity == "hyperband" and multi:
        raise SpecError.single(("fidelity",), "hyperband needs `objective` accuracy",
                               "Optuna prunes single-objective studies only; the Pareto search has `fidelity` sha")
    rungs = rung_schedule(cfg.protocol.steps, cfg.eta, cfg.min_steps)
    pruner = make_pruner(cfg.fidelity, rungs) if not multi else None
    return rungs, pruner or optuna.pruners.NopPruner()


def _competitors(trial, has: Callable[[Any], bool], value_of: Callable[[Any], Any]) -> list[tuple[Any, float]]:
    """``(value, latency ms)`` of every other trial of the study that ``has`` a value (reused copies excluded)."""
    return [(value_of(t), t.user_attrs.get("latency_ms", math.inf)) for t in trial.study.get_trials(deepcopy=False)
            if t.number != trial.number and "reused_from" not in t.user_attrs and has(t)]


def rung_stops(trial, step: int, value: float, latency: float, rungs, n_objectives: int) -> bool:
    """Record val accuracy ``value`` at ``step`` (user attr ``rungs``) when ``step`` is a rung below the last; whether
    the candidate stops there: Optuna's pruner with one objective, else not promotable in (accuracy, latency ms)
    among the study's candidates that reached the rung (:func:`~archspec.search._engine.fidelity.promotable`)."""
    if step not in rungs.steps:
        return False
    reached = {**trial.user_attrs.get(RUNGS_ATTR, {}), str(step): float(value)}
    trial.set_user_attr(RUNGS_ATTR, reached)
    if step == rungs.steps[-1]:
        return False
    if n_objectives == 1:
        trial.report(float(value), int(step))
        return trial.should_prune()
    competitors = _competitors(trial, lambda t: str(step) in t.user_attrs.get(RUNGS_ATTR, {}),
                               lambda t: t.user_attrs[RUNGS_ATTR][str(step)])
    return not promotable(value, latency, [*competitors, (value, latency)], rungs.eta)


def zero_cost_of(spec: ArchSpec, cfg: SearchConfig, data, oracle=None, names: tuple[str, ...] = ZERO_COST_SCORES):
    """``(ZeroCostResult, ProxyGeometry or None)``: the zero-cost scores ``names`` of ``spec``'s untrained proxy at
    the search's seed (:func:`~archspec.search._evaluation.proxy.score_proxy`), or the table's row for that seed
    under ``oracle`` (every tabulated score; the same row that answers the design's training).

    Raises:
        SpecError: under ``oracle``, the design is not in the table.
        TrainingFailure: the proxy failed (live).
    """
    if oracle is not None:
        return oracle.zero_cost(spec, seed=cfg.seed)
    from archspec.search._evaluation.proxy import score_proxy  # noqa: PLC0415 - torch-side

    return score_proxy(spec, data, cfg.protocol, names, seed=cfg.seed)


def zero_cost_stops(trial, spec: ArchSpec, latency: float, macs: int | None, params: int | None,
                    cfg: SearchConfig, data, oracle=None) -> tuple[bool, str]:
    """The zero-cost rung (``fidelity="zc"``): score the untrained proxy; ``(stops, message)``.

    Every score (:mod:`archspec.search._evaluation.zero_cost`, plus ``params`` and ``macs`` at the real size) goes on
    the trial
    (:data:`~archspec.search._engine.config.ZERO_COST_ATTR`, with the seconds each took); the candidate stops unless
    ``cfg.zc_score`` is promotable among every candidate scored so far (the top ``1/eta``, or not dominated in
    (score, latency)).  ``oracle`` answers the scores from a table instead."""
    result, geometry = zero_cost_of(spec, cfg, data, oracle)
    scores = {**result.scores, "params": params, "macs": macs}
    scores = {k: (v if v is None or not math.isnan(v) else -math.inf) for k, v in scores.items()}
    trial.set_user_attr(ZERO_COST_ATTR, {"scores": scores, "seconds": result.seconds,
                                         "total_seconds": round(sum(result.seconds.values()), 4)})
    if geometry is not None:
        trial.set_user_attr(GEOMETRY_ATTR, geometry.describe())
    name = cfg.zc_score
    value = scores[name]
    competitors = _competitors(trial, lambda t: ZERO_COST_ATTR in t.user_attrs,
                               lambda t: t.user_attrs[ZERO_COST_ATTR]["scores"][name])
    stops = not promotable(value, latency, [*competitors, (value, latency)], cfg.eta)
    return stops, f"stopped at the zero-cost rung ({name} {value:.4g}): not promotable"


def fidelity_summary(study, cfg: SearchConfig, rungs, objective: SearchCounts) -> dict | None:
    """Rungs, candidates stopped early, and each rung's rank correlation with the last (whole study)."""
    if rungs is None:
        return None
    values = [t.user_attrs[RUNGS_ATTR] for t in study.get_trials(deepcopy=False)
              if RUNGS_ATTR in t.user_attrs and "reused_from" not in t.user_attrs]  # a reused copy is no new run
    return {"kind": cfg.fidelity, **rungs.describe(), "stopped_this_run": objective.stopped,
            "rung_correlations": rung_correlations(values, rungs)}


def study_zero_cost_summary(study, cfg: SearchConfig, objective: SearchCounts) -> dict:
    """The zero-cost rung over the whole study (:func:`~archspec.search._engine.fidelity.zero_cost_summary`), plus this
    run's counts."""
    scored = [{**t.user_attrs[ZERO_COST_ATTR],
               "accuracy": t.values[0] if t.state == TrialState.COMPLETE else None}
              for t in study.get_trials(deepcopy=False)
              if ZERO_COST_ATTR in t.user_attrs and "reused_from" not in t.user_attrs]
    return {**zero_cost_summary(scored, cfg.zc_score, cfg.eta), "scored_this_run": objective.zc_scored,
            "stopped_this_run": objective.stopped}


# ----------------------------------------------------------------------------------- stop rules
class StopRules:
    """Optuna callback: stop when this worker has trained ``n`` candidates, or sampled only infeasible ones
    (:data:`MAX_CONSECUTIVE_INFEASIBLE`) or only architectures the study already has
    (:data:`MAX_CONSECUTIVE_DUPLICATES`) in a row.  ``on_done(trial)`` hears of every finished trial."""

    def __init__(self, objective: SearchCounts, n: int, on_done: Callable[[Any], None]):
        self.objective, self.n, self.on_done = objective, n, on_done

    def __call__(self, study: optuna.Study, trial) -> None:
        # Free the candidate's model and optimiser now (Optuna's gc_after_trial).  A full collection of the
        # whole heap costs ~0.3 s with torch loaded; the search loop freezes what lived before it (loop._optimize),
        # so this walks only the objects made since.  Skipped for samples that never built a model, and under
        # --oracle, where no candidate builds one.
        built = self.objective.oracle is None
        if built and trial.user_attrs.get("status") not in ("infeasible", "reused", "duplicate"):
            gc.collect()
        self.on_done(trial)
        if self.objective.attempted >= self.n:
            study.stop()
        elif self.objective.consecutive_infeasible >= MAX_CONSECUTIVE_INFEASIBLE:
            study.stop()
        elif self.objective.consecutive_duplicates >= MAX_CONSECUTIVE_DUPLICATES:
            study.stop()
        elif _stuck_on_untabulated(self.objective) is not None:
            study.stop()


def _stuck_on_untabulated(objective: SearchCounts) -> str | None:
    """The design the table lacks that the sampler proposed :data:`MAX_UNTABULATED_REPEATS` times since the last
    trained candidate (its architecture key), or ``None``."""
    repeats = getattr(objective, "untabulated_repeats", None)
    if not repeats:
        return None
    key, count = repeats.most_common(1)[0]
    return key if count >= MAX_UNTABULATED_REPEATS else None


def stop_notes(objective: SearchCounts, cfg: SearchConfig, interrupted: bool, search_seconds: float) -> list[str]:
    """Why the search stopped before ``--trials`` candidates, when it did: a space exhausted by the budgets or by
    duplicates, or ``--timeout`` (``search_seconds``: how long the optimisation ran)."""
    notes = []
    if objective.consecutive_infeasible >= MAX_CONSECUTIVE_INFEASIBLE:
        notes.append(f"stopped after {MAX_CONSECUTIVE_INFEASIBLE} infeasible samples in a row: the budgets leave "
                     "almost nothing of the space")
    if objective.consecutive_duplicates >= MAX_CONSECUTIVE_DUPLICATES:
        notes.append(f"stopped: the space has no untried architectures left ({MAX_CONSECUTIVE_DUPLICATES} samples in "
                     "a row were architectures this study already trained or is training)")
    stuck = _stuck_on_untabulated(objective)
    if stuck is not None:
        notes.append(f"stopped: the {cfg.sampler} sampler proposed design {stuck[:12]}, which the table lacks, "
                     f"{MAX_UNTABULATED_REPEATS} times since the last trained candidate -- it does not learn from a "
                     "design --oracle-subset cannot evaluate (gp fits completed trials only); search this table with "
                     "--sampler tpe or random, or finish the table (then --oracle-subset is not needed)")
    if (cfg.timeout is not None and objective.attempted < cfg.trials and not interrupted
            and search_seconds >= cfg.timeout):
        notes.append(f"--timeout {cfg.timeout:g}s reached after {objective.attempted} of {cfg.trials} trials")
    return notes
