"""The search engine: one Optuna study, its run directory, and the trial loop every search mode shares.

Every mode is a thin client stating the contract of :mod:`archspec.search._engine.mode` (what it samples or
proposes, how a trial is evaluated, what it writes at the end); this module runs it:

* :func:`run_sampled` -- a :class:`~archspec.search._engine.mode.SampledMode` (mode 1,
:mod:`archspec.search._modes.design`;
  mode 2's ``--strategy optuna``): preflight, open the run, Optuna's loop over
  :class:`~archspec.search._engine.objective.CandidateObjective` until the stop rules or ``--timeout``, then trials.csv,
  the Pareto / best specs, the mode's own files and summary.json;
* :func:`run_rounds` -- a :class:`~archspec.search._engine.mode.RoundsMode` (mode 2's ``als`` and ``soft``): open the
  run, then ask/tell one trial per proposed candidate (:mod:`archspec.search._engine.round_trial`), then the mode's
  results
  and summary.json.

The parts, one file each: :mod:`~archspec.search._engine.session` (run directory, lock, resume),
:mod:`~archspec.search._engine.preflight` (input checks), :mod:`~archspec.search._engine.objective` (one candidate),
:mod:`~archspec.search._engine.failures` (fail reasons, deadlines), :mod:`~archspec.search._engine.early_stop` (rungs,
stop rules),
:mod:`~archspec.search._engine.round_trial` (one proposed round); progress and result files are
:mod:`archspec.search._report.results`, the run directory's files :mod:`archspec.search._report.run_files`.

Objectives: ``pareto`` maximises proxy accuracy and minimises latency (ms; a Pareto front); ``accuracy``
maximises accuracy alone, the budgets acting as constraints.  ``--trials N`` counts candidates that reach
training (failures included); infeasible samples are extra and cheap.  Each worker reseeds its sampler on its
first trial (:func:`~archspec.search._engine.study.worker_seed`), so workers sharing a storage and resumed runs do not
replay one another's sequence.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from pathlib import Path

import optuna

from archspec.search._engine.config import (
    SearchConfig,
    SearchOutcome,
    complete_config,
)
from archspec.search._engine.early_stop import (
    StopRules,
    fidelity_plan,
    fidelity_summary,
    stop_notes,
    study_zero_cost_summary,
)
from archspec.search._engine.mode import RoundsMode, RunContext, SampledMode
from archspec.search._engine.objective import CandidateObjective
from archspec.search._engine.preflight import (
    preflight,
    preflight_rounds,
)
from archspec.search._engine.round_trial import evaluate_round
from archspec.search._engine.session import (
    open_run,
    quiet_optuna,
    run_lock,
    settings_notes,
    zombie_notes,
)
from archspec.search._engine.study import worker_seed
from archspec.search._engine.verify import (
    TimeReserve,
    mark_ties,
    verify_count,
    verify_front,
    without_second_seed,
)
from archspec.search._evaluation.check_rate import static_check_rate
from archspec.search._evaluation.latency_cache import LatencyCache
from archspec.search._evaluation.priors import PriorSampler
from archspec.search._evaluation.scoring import objective_name
from archspec.search._report import results, run_files
from archspec.search._report.progress import ProgressDisplay

__all__ = ["run_sampled", "run_rounds"]


# ----------------------------------------------------------------------------------- sampled modes
def _study_attrs(mode: SampledMode, cfg: SearchConfig) -> dict:
    """The study's user attributes: what the run searched, how, on what (provenance; compared on resume)."""
    return {
        "mode": mode.label, "space": getattr(mode.space, "name", "space"), "objective": cfg.objective,
        "budgets": cfg.budgets.describe(), "proxy": cfg.protocol.describe(),
        "latency_protocol": cfg.latency.describe(), "data": cfg.data or "embedded",
        "max_images": cfg.max_images, "seed": cfg.seed, "sampler": cfg.sampler, **mode.study_attrs(),
    }


def _with_eval_points(cfg: SearchConfig, attrs: dict, rungs, multi: bool) -> SearchConfig:
    """``cfg`` evaluating where something reads the accuracy: every rung (multiples of the first, and the end), each
    step a pruner may read, or the end only; ``attrs`` records the protocol (and the rungs)."""
    if rungs is not None:
        cfg = dataclasses.replace(cfg, protocol=dataclasses.replace(cfg.protocol, eval_every=rungs.min_steps))
        attrs["proxy"], attrs["fidelity"] = cfg.protocol.describe(), {"kind": cfg.fidelity, **rungs.describe()}
    elif not (cfg.prune and not multi):  # nothing reads an accuracy before the end: evaluate there only
        cfg = dataclasses.replace(cfg, protocol=dataclasses.replace(cfg.protocol, eval_every=cfg.protocol.steps))
        attrs["proxy"] = cfg.protocol.describe()
    return cfg


def _optimize(study: optuna.Study, objective: CandidateObjective, progress, cfg: SearchConfig,
              notes: list[str], verify: int = 0) -> tuple[bool, float]:
    """Run Optuna's loop until :class:`StopRules` or ``--timeout`` stop it: ``(interrupted, seconds)``; ``verify``
    re-trainings come after it inside the same budget (``--trials`` less ``verify`` candidates, and the time of
    ``verify`` mean trainings kept back from ``--timeout``: :mod:`archspec.search._engine.verify`).

    Ctrl-C ends the loop, not the run: every finished trial is in the study and the results still get written."""
    stopper = StopRules(objective, cfg.trials - verify, lambda t: progress.done(t, objective.attempted))
    interrupted = False
    start = time.perf_counter()
    reserve = TimeReserve(verify, cfg.timeout, start)
    if cfg.timeout is not None:
        objective.search_deadline = start + cfg.timeout
    # StopRules runs a full collection after each trained candidate (freeing its model and optimiser at once).
    # A full collection walks every object the process holds: about 0.3 s with torch, timm and Optuna loaded (in a
    # pytest worker, more than a test search's 2-step training).  What lives before the loop (modules, data, the
    # study) is frozen out of it (gc.freeze, unfrozen when the loop ends), so each collection walks only the objects
    # created since: the candidates' cycles are freed as before, for milliseconds (issue 53).
    gc.freeze()
    try:
        with progress:
            if isinstance(study.sampler, PriorSampler):  # its look is part of the search: inside --timeout
                progress.status(study.sampler.look_status)
                study.sampler.look_first(study, objective.prior_look())
            left = None if cfg.timeout is None else max(0.0, cfg.timeout - (time.perf_counter() - start))
            study.optimize(objective, n_trials=None, timeout=left, callbacks=[stopper, reserve],
                           catch=(Exception,), gc_after_trial=False)  # StopRules collects after a trained candidate
    except KeyboardInterrupt:
        interrupted = True
        notes.append("interrupted: the study keeps every finished trial; re-run the same command to resume")
    finally:
        gc.unfreeze()
    return interrupted, time.perf_counter() - start


def _run_summary(mode: str, name: str, info, run_dir: Path, cfg: SearchConfig, data, rate: float | None,
                 objective: CandidateObjective, search_seconds: float, notes: list[str], interrupted: bool) -> dict:
    """This run's summary before the results are written (counts of this process; seconds; candidates per hour)."""
    return {
        "mode": mode, "study": name, "storage": info.url, "run_dir": str(run_dir), "objective": cfg.objective,
        "budgets": cfg.budgets.describe(), "static_check_rate": round(rate, 1) if rate is not None else None,
        "trained_this_run": len(objective.trained_numbers), "attempted_this_run": objective.attempted,
        "infeasible_this_run": objective.infeasible, "reused_this_run": objective.reused,
        "duplicates_this_run": objective.duplicates, "sampler_seed": (worker_seed(cfg.seed, objective.first_trial)
                                                             if objective.first_trial is not None else cfg.seed),
        "search_seconds": round(search_seconds, 2),
        "data": {**data.describe(), "source": cfg.data or "embedded"},
        "proxy": cfg.protocol.describe(), "latency_protocol": cfg.latency.describe(),
        "seed": cfg.seed, "sampler": cfg.sampler, "timeout_s": cfg.timeout, "trial_timeout_s": cfg.trial_timeout,
        "notes": notes, "interrupted": interrupted,
        "candidates_per_hour": round(objective.attempted * 3600 / search_seconds, 1) if search_seconds > 0 else None,
    }


def run_sampled(mode: SampledMode, cfg: SearchConfig, name: str) -> SearchOutcome:
    """Run (or resume) the Optuna search of ``mode.space`` as study ``name`` and write the run directory.

    Every input (options, budgets, space, data -- every image decoded --, ``--out``, ``--storage``) is checked
    (:func:`~archspec.search._engine.preflight.preflight`) before the run directory, the study or any file is created.

    Raises:
        SpecError: bad input (budgets, space, data, run directory, storage); nothing is written then.
    """

    quiet_optuna()
    cfg = complete_config(cfg)  # a SearchConfig left with budgets / protocols None or dicts: the defaults
    wall_start = time.perf_counter()
    multi = cfg.objective == "pareto"
    directions = ["maximize", "minimize"] if multi else ["maximize"]
    # Named for what the value is (a TSE-ranked search's values are -mean train loss, not accuracy); a resumed study
    # keeps the names it was created with (open_study sets them on a new study only).
    metric_names = [objective_name(getattr(cfg.protocol, "score", "accuracy"))] + (["latency_ms"] if multi else [])
    data, sampler, oracle = preflight(mode.space, cfg, name, len(directions))
    cfg, verify_note = without_second_seed(cfg, oracle)
    # how fast the space samples and checks (the summary's figure); an oracle replay measures nothing real, and this
    # was a third of its CPU (issue 54: 200-replay comparisons in minutes)
    rate = static_check_rate(mode.space, cfg.budgets, n=200, seed=cfg.seed) if oracle is None else None
    attrs = _study_attrs(mode, cfg)
    rungs, pruner = fidelity_plan(cfg, multi)
    cfg = _with_eval_points(cfg, attrs, rungs, multi)
    run_dir, info, study = open_run(cfg, name, directions, metric_names, attrs, sampler, pruner)
    notes = settings_notes(study, attrs) + zombie_notes(study) + ([verify_note] if verify_note else [])

    progress = ProgressDisplay(cfg.trials, cfg.progress, len(directions), cfg.timeout)
    objective = CandidateObjective(mode, data, cfg, LatencyCache(run_dir / "latency.json"), len(directions),
                                   on_status=progress.status, oracle=oracle)
    objective.rungs = rungs
    objective.training_progress = progress.lines
    k = verify_count(cfg.verify, cfg.trials)
    interrupted, search_seconds = _optimize(study, objective, progress, cfg, notes, k)
    notes += stop_notes(objective, cfg, interrupted, search_seconds)
    verification = None if interrupted else verify_front(study, objective, cfg, multi, k)
    summary = _run_summary(mode.label, name, info, run_dir, cfg, data, rate, objective, search_seconds, notes,
                           interrupted)
    summary["fidelity"] = fidelity_summary(study, cfg, rungs, objective)
    if oracle is not None:
        summary["oracle"] = {**oracle.describe(), "subset": cfg.oracle_subset}
    if cfg.fidelity == "zc":
        summary["zero_cost"] = study_zero_cost_summary(study, cfg, objective)
    with run_lock(run_dir):
        best_file = results.write_results(study, mode.space, cfg, run_dir, info, summary, multi, mode.finish)
    if verification is not None:
        summary["verify"] = verification
        mark_ties(summary.get("pareto") or [], verification)
    summary["wall_seconds"] = round(time.perf_counter() - wall_start, 2)
    run_files.atomic_write_text(run_dir / "summary.json", results.summary_json(summary))
    return SearchOutcome(study, summary, run_dir, interrupted, best_file)


# ----------------------------------------------------------------------------------- rounds modes
def run_rounds(mode: RoundsMode, cfg: SearchConfig, name: str) -> SearchOutcome:
    """Run a :class:`~archspec.search._engine.mode.RoundsMode` as study ``name``: one trial per proposed candidate.

    Checks ``--data`` and ``--out`` / ``--storage`` and decodes the data
    (:func:`~archspec.search._engine.preflight.preflight_rounds`) before anything is written; then opens the run (a
    random sampler the rounds never consult, no heartbeat: a dead worker's RUNNING trial is found by its pid),
    evaluates each :meth:`~archspec.search._engine.mode.RoundsMode.propose`'d candidate
    (:func:`~archspec.search._engine.round_trial.evaluate_round`) until the mode returns ``None`` or Ctrl-C, and
    writes the
    mode's results and summary.json under the run lock.

    Raises:
        SpecError: bad input (data, run directory, storage); nothing is written then.
    """

    data = preflight_rounds(cfg, name)
    wall_start = time.perf_counter()
    run_dir, info, study = open_run(cfg, name, ["maximize"], ["accuracy"], mode.study_attrs(),
                                    optuna.samplers.RandomSampler(seed=cfg.seed), None, heartbeat=None)
    run = RunContext(name, cfg, data, run_dir, info, study, zombie_notes(study), wall_start)
    mode.start(run)
    cache = LatencyCache(run_dir / "latency.json")
    interrupted = False
    try:
        while (candidate := mode.propose()) is not None:
            mode.observe(candidate, evaluate_round(run, mode, candidate, cache))
    except KeyboardInterrupt:
        interrupted = True
        run.notes.append("interrupted: re-run the same command to start again (finished rounds stay in the study)")
    summary = mode.summary(interrupted)
    with run_lock(run_dir):
        best_file = mode.write_results(summary, interrupted)
    summary["wall_seconds"] = round(time.perf_counter() - wall_start, 2)
    run_files.atomic_write_text(run_dir / "summary.json", results.summary_json(summary))
    return SearchOutcome(study, summary, run_dir, interrupted, best_file)
