"""One round of a rounds mode (:class:`~archspec.search._engine.mode.RoundsMode`): a proposed candidate as one trial.

Optuna's ask/tell: :func:`evaluate_round` asks the study for a trial, records what the candidate is (the
mode's attrs, ``round``, ``spec``, MACs and params at the real input size), measures its latency (ms, cached
per architecture), trains it with the mode's ``train`` (no deadline: a round is the whole search), records
training time, accuracy and losses, lets the mode's ``after_train`` read the trained result, and tells the
study the proxy accuracy.  A failing round is a FAIL trial with its ``fail_reason`` and a note; Ctrl-C fails
the running trial and goes on up to the engine.
"""

from __future__ import annotations

import math
import time

from optuna.trial import TrialState

from archspec.ir.analysis import analyze
from archspec.search._engine.mode import Candidate, RoundResult, RoundsMode, RunContext
from archspec.search._evaluation.latency_cache import LatencyCache
from archspec.search._storage import mark_worker
from archspec.train.failures import stored_name

__all__ = ["evaluate_round"]


def _ask(run: RunContext, candidate: Candidate):
    """A new trial for ``candidate``, with the mode's attrs, its round, spec, MACs and params."""
    trial = run.study.ask()
    mark_worker(trial)
    for key, value in candidate.attrs.items():
        trial.set_user_attr(key, value)
    trial.set_user_attr("round", candidate.round)
    trial.set_user_attr("spec", candidate.spec.model_dump(mode="json"))
    analysis = analyze(candidate.spec)
    trial.set_user_attr("macs", int(analysis.macs))
    trial.set_user_attr("params", int(analysis.params))
    return trial


def _train(run: RunContext, mode: RoundsMode, candidate: Candidate, trial, cache: LatencyCache):
    """Latency, proxy training and the mode's reading of it, on the trial: ``(result, what after_train returned)``.

    Raises:
        RuntimeError: training diverged (a non-finite loss or accuracy); any failure of the training itself.
    """
    from archspec.search._evaluation.latency import measure_latency  # noqa: PLC0415 - torch-side

    cfg = run.cfg
    trial.set_user_attr("latency_ms", float(measure_latency(candidate.spec, cfg.latency, cache)))
    start = time.perf_counter()
    result = mode.train(candidate.spec, run.data, cfg.protocol, seed=cfg.seed, progress=candidate.progress)
    trial.set_user_attr("train_seconds", round(time.perf_counter() - start, 3))
    for key in ("accuracy", "val_loss", "train_loss"):
        trial.set_user_attr(key, float(getattr(result, key)))
    if not all(math.isfinite(float(getattr(result, k))) for k in ("accuracy", "val_loss", "train_loss")):
        raise RuntimeError("non-finite loss (training diverged)")
    return result, mode.after_train(trial, candidate.spec, result)


def evaluate_round(run: RunContext, mode: RoundsMode, candidate: Candidate, cache: LatencyCache) -> RoundResult | None:
    """Train ``candidate`` as one trial of ``run.study``: its :class:`~archspec.search._engine.mode.RoundResult`, or
    ``None``
    when it failed (the reason is on the trial, user attr ``fail_reason``, and in ``run.notes``).

    Raises:
        KeyboardInterrupt: Ctrl-C, after failing the trial (``interrupted (Ctrl-C / SIGINT)``).
    """
    trial = _ask(run, candidate)
    try:
        result, extra = _train(run, mode, candidate, trial, cache)
    except KeyboardInterrupt:
        trial.set_user_attr("fail_reason", "interrupted (Ctrl-C / SIGINT)")
        run.study.tell(trial, state=TrialState.FAIL)
        raise
    except Exception as exc:  # noqa: BLE001 - recorded on the trial, then reported
        reason = str(getattr(exc, "reason", "")) or f"{stored_name(exc)}: {exc}"
        trial.set_user_attr("fail_reason", reason[:1000])
        run.study.tell(trial, state=TrialState.FAIL)
        run.notes.append(f"{candidate.label} (trial {trial.number}) failed: {reason}")
        return None
    run.study.tell(trial, float(result.accuracy))
    return RoundResult(trial.number, result, extra)
