"""The objective of a sampled search: one Optuna trial = one candidate of the mode's space.

:class:`CandidateObjective` evaluates a candidate in steps, each cheaper than the next:

1. ``mode.space.sample(trial)`` -> an :class:`~archspec.spec.ArchSpec` at its real input size;
2. :func:`~archspec.search._evaluation.budget.static_check` on the IR (no weights): MACs and params; each budget
   becomes an Optuna constraint (``trial.set_constraint``, ``value / budget - 1 <= 0`` feasible).  An
   over-budget candidate is recorded as a PRUNED trial (user attr ``status = infeasible``) with its
   constraint values -- Optuna's TPE ranks it below every feasible trial -- and costs only the
   static check: it is never built, measured or trained;
3. latency: median forward time in ms at the spec's real input size under the latency protocol
   (:func:`~archspec.search._evaluation.latency.measure_latency`, cached per architecture); with a latency
   budget an over-budget candidate is infeasible (never trained);
4. distinct candidates: a candidate the study has already trained is not retrained (its values and result
   attrs are copied, ``reused_from``); one another worker is training is pruned (``status = duplicate``);
5. the zero-cost rung (``--fidelity zc``), then proxy training on real data (``mode.train``, by default
   :func:`~archspec.search._evaluation.proxy.train_proxy`) -> validation accuracy, read at every rung
   (:mod:`archspec.search._engine.early_stop`) and cut at ``--trial-timeout`` or the search's ``--timeout``;
   ``mode.after_train`` then reads the trained result.

A candidate that raises, runs out of memory, produces a NaN loss or runs past its deadline becomes a FAIL
trial with user attr ``fail_reason`` (:func:`~archspec.search._engine.failures.fail_reason`); the study goes on.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from archspec.errors import SpecError
from archspec.search._engine.config import SearchConfig
from archspec.search._engine.early_stop import rung_stops, zero_cost_of, zero_cost_stops
from archspec.search._engine.failures import CandidateFailure, deadline_hook, fail_reason
from archspec.search._engine.preflight import first_problem, study_sampler
from archspec.search._engine.study import ARCH_KEY_ATTR, reused_attrs, same_architecture, worker_seed
from archspec.search._evaluation.budget import static_check
from archspec.search._evaluation.latency_cache import LatencyCache, architecture_key
from archspec.search._evaluation.priors import Look, prior_candidates
from archspec.search._evaluation.protocols import GEOMETRY_ATTR
from archspec.search._storage import mark_worker
from archspec.spec import ArchSpec

if TYPE_CHECKING:  # annotations only: the data is torch-side
    from archspec.io.datasets import Dataset
    from archspec.search._engine.mode import SampledMode

__all__ = ["CandidateObjective"]


class CandidateObjective:
    """The Optuna objective of a search (design or mask placement): one call evaluates one candidate.

    Args:
        mode: the :class:`~archspec.search._engine.mode.SampledMode` searched: its ``space`` is sampled, its ``train``
            trains a candidate (unless ``oracle``) and its ``after_train`` reads the trained result.
        data: the :class:`~archspec.io.datasets.Dataset` of the proxy training.
        cfg: the :class:`~archspec.search._engine.config.SearchConfig` (budgets, protocols, limits).
        cache: the :class:`~archspec.search._evaluation.latency.LatencyCache` of the run directory.
        n_objectives: 1 (accuracy) or 2 (accuracy, latency in ms).
        on_status: ``f(text)`` told what the running trial does (the progress display).
        oracle: an :class:`~archspec.search._tabulation.oracle.OracleTable` that answers training, the zero-cost
            rung and latency from a tabulated space instead of measuring them (``--oracle``).

    Counts what it did (``attempted``, ``infeasible``, ``reused``, ``duplicates``, ``stopped``, the
    ``consecutive_*`` runs and ``untabulated_repeats`` :class:`~archspec.search._engine.early_stop.StopRules` reads);
    ``search_deadline`` (``perf_counter`` seconds) is when ``--timeout`` runs out and ``rungs`` the multi-fidelity
    schedule, both set by the engine.
    """

    def __init__(self, mode: SampledMode, data: Dataset, cfg: SearchConfig, cache: LatencyCache, n_objectives: int,
                 on_status: Callable[[str], None] | None = None, oracle: Any = None):
        self.mode, self.space, self.data, self.cfg, self.cache = mode, mode.space, data, cfg, cache
        self.oracle = oracle
        self.train_fn = oracle.train if oracle is not None else mode.train
        self.n_objectives = n_objectives
        self.on_status = on_status or (lambda text: None)
        # the training loop's own progress lines on stderr (step, loss, images/s, ETA) under "trial N": set by the
        # engine where no live bar shows the trial's state (a log or pipe), so a first training of minutes is seen
        self.training_progress = False
        self.attempted = 0             # candidates that reached training (the --trials count)
        self.infeasible = 0
        self.consecutive_infeasible = 0
        self.trained_numbers: list[int] = []
        self.reused = 0                # candidates whose finished result was copied (not retrained)
        self.duplicates = 0            # candidates another worker was training: stepped back
        self.consecutive_duplicates = 0
        # --oracle-subset: how often each design the table lacks was proposed since the last candidate reached
        # training; a sampler that learns only from completed trials (gp) proposes the same one again and again
        self.untabulated_repeats: Counter[str] = Counter()
        self.first_trial: int | None = None  # this worker's first trial number (its sampler seed)
        self.search_deadline: float | None = None  # perf_counter() time at which --timeout runs out
        self.rungs = None              # archspec.search._engine.fidelity.Rungs when multi-fidelity is on
        self.stopped = 0               # candidates stopped at a rung below the last (or the zero-cost rung)
        self.zc_scored = 0             # candidates the zero-cost rung scored
        # how a report names the value that ranks a candidate (ProxyProtocol.score)
        self.score_name = "val acc" if getattr(cfg.protocol, "score", "accuracy") == "accuracy" else "-TSE/step"

    def __call__(self, trial: optuna.trial.Trial):
        """The Optuna objective: sample a candidate, check it statically, measure its latency, train its proxy.

        Returns the proxy's val top-1 (0..1), or ``(top-1, latency ms)`` with two objectives.

        Raises:
            optuna.TrialPruned: over budget, a duplicate of a trial training elsewhere, or stopped at a rung.
            Exception: any failure of the candidate, after putting its reason on the trial (``fail_reason``).
        """
        mark_worker(trial)
        self._seed_sampler(trial)
        try:
            return self._evaluate(trial)
        except optuna.TrialPruned:
            raise
        except (Exception, KeyboardInterrupt) as exc:
            trial.set_user_attr("fail_reason", fail_reason(exc))
            raise

    def _evaluate(self, trial: optuna.trial.Trial):
        """:meth:`__call__` without the failure bookkeeping."""
        spec, key = self._sample_feasible(trial)
        latency = self._measure_latency(trial, spec)
        reused = self._claim(trial, key)
        if reused is not None:
            return reused
        self.consecutive_duplicates = 0
        if self.cfg.fidelity == "zc":
            self._zero_cost_rung(trial, spec, latency, trial.user_attrs.get("macs"), trial.user_attrs.get("params"))
        self.attempted += 1
        self.untabulated_repeats.clear()
        self.on_status(f"trial {trial.number}: training")
        start = time.perf_counter()
        result = self._train(trial, spec, latency, start)
        self._record_result(trial, result, start)
        self.mode.after_train(trial, spec, result)
        self.trained_numbers.append(trial.number)
        trial.set_user_attr("status", "trained")
        score = getattr(result, "score", None)  # what ranks it: the val top-1, or -TSE per step (--proxy-score)
        value = float(result.accuracy if score is None else score)
        return value if self.n_objectives == 1 else (value, latency)

    def _seed_sampler(self, trial) -> None:
        """On this worker's first trial, reseed the study's sampler by :func:`worker_seed` (trial numbers
        are unique, so concurrent and resumed workers sample distinct sequences).  Relative (multivariate)
        parameters of this first trial were drawn at ``ask`` time, before its number was known: a clash
        there is caught by the duplicate check."""
        if self.first_trial is not None:
            return
        self.first_trial = trial.number
        seed = worker_seed(self.cfg.seed, trial.number)
        if seed != self.cfg.seed:
            trial.study.sampler = study_sampler(self.cfg, seed, self.n_objectives)

    def prior_look(self) -> Look:
        """The look at every candidate a sampler that uses priors reads before the first trial
        (:class:`~archspec.search._evaluation.priors.PriorSampler`): this objective's latency and zero-cost measures
        (:meth:`latency_of`, the ``--zc-score`` of :func:`~archspec.search._engine.early_stop.zero_cost_of`), so the
        look reads what the trials read and fills the same latency cache.

        Raises (when called):
            SpecError: the space cannot be listed, or (under ``--oracle``) a design or its latency is not in the
                table.
        """
        cfg = self.cfg
        return prior_candidates(self.space, self.data, self.oracle, self.latency_of,
                                lambda spec: zero_cost_of(spec, cfg, self.data, self.oracle, names=(cfg.zc_score,)),
                                budgets=cfg.budgets, protocol=cfg.protocol, score=cfg.zc_score)

    def _constraint(self, trial, key: str, value: float, budget: float | None) -> None:
        if budget is not None:
            trial.set_constraint(key, float(value) / float(budget) - 1.0)

    def _infeasible(self, trial, reason: str):
        trial.set_user_attr("status", "infeasible")
        trial.set_user_attr("infeasible_reason", reason)
        self.infeasible += 1
        self.consecutive_infeasible += 1
        raise optuna.TrialPruned(f"infeasible: {reason}")

    def _sample_feasible(self, trial: optuna.trial.Trial) -> tuple[ArchSpec, str]:
        """Sample the candidate and check it statically: ``(spec, architecture key)``; MACs and params on the trial.

        Raises:
            CandidateFailure: the space produced an invalid spec.
            optuna.TrialPruned: over the MAC, parameter or memory budget (status ``infeasible``).
        """

        budgets = self.cfg.budgets
        try:
            spec = self.space.sample(trial)
        except SpecError as exc:
            raise CandidateFailure(f"the search space produced an invalid spec: {first_problem(exc)}") from None
        trial.set_user_attr("spec", spec.model_dump(mode="json"))
        key = architecture_key(spec)
        trial.set_user_attr(ARCH_KEY_ATTR, key)
        check = static_check(spec, budgets, self.data, self.cfg.protocol)  # memory: also the proxy batch
        trial.set_user_attr("macs", int(check.macs))
        trial.set_user_attr("params", int(check.params))
        trial.set_user_attr("plan", spec.plan)
        if check.macs == 0 and check.params == 0 and not check.feasible:
            raise CandidateFailure(check.reason or "invalid spec")
        self._constraint(trial, "macs", check.macs, budgets.macs)
        self._constraint(trial, "params", check.params, budgets.params)
        untabulated = self.oracle is not None and key not in self.oracle.tabulated  # --oracle-subset (else exit 2)
        if untabulated and check.feasible:
            self.untabulated_repeats[key] += 1
        if not check.feasible or untabulated:
            if budgets.latency_ms is not None:  # not measured (never built): every trial carries every key
                trial.set_constraint("latency", 0.0)
            # A design the table lacks is outside the searched space, as one over a budget is: it costs nothing
            # and the sampler learns to avoid it (Optuna ranks a pruned trial below every completed one).
            self._infeasible(trial, (check.reason or "over budget") if not check.feasible
                             else "not in the oracle's table (--oracle-subset)")
        return spec, key

    def latency_of(self, spec: ArchSpec) -> float:
        """``spec``'s latency in ms: the oracle's tabulated figure, else measured (cached per architecture).

        Raises:
            SpecError: under ``--oracle``, the design or its latency is not in the table.
        """
        from archspec.search._evaluation.latency import measure_latency  # noqa: PLC0415 - torch-side

        if self.oracle is not None:
            return float(self.oracle.latency(spec))
        return float(measure_latency(spec, self.cfg.latency, self.cache))

    def _measure_latency(self, trial: optuna.trial.Trial, spec: ArchSpec) -> float:
        """Latency in ms (cached per architecture) on the trial; prunes a candidate over ``--budget-latency``."""
        budgets = self.cfg.budgets
        self.on_status(f"trial {trial.number}: latency")
        if self.oracle is not None and not self.oracle.latency_ms:  # accuracy only (check_oracle): rank by it alone
            self.consecutive_infeasible = 0
            return 0.0
        latency = self.latency_of(spec)
        trial.set_user_attr("latency_ms", latency)
        if budgets.latency_ms is not None:
            trial.set_constraint("latency", latency / budgets.latency_ms - 1.0)
            if latency > budgets.latency_ms:
                self._infeasible(trial, f"latency {latency:.2f} ms > budget {budgets.latency_ms:g} ms")
        self.consecutive_infeasible = 0
        return latency

    def _claim(self, trial, key: str):
        """Claim architecture ``key`` for training; if the study has it already, return the trial's value(s)
        copied from the trained original (``reused_from``) or raise ``TrialPruned`` (another worker is
        training it: ``duplicate_of``); ``None`` when this trial should train it."""
        trial.set_user_attr("status", "training")  # before the look-up: see same_architecture
        other = same_architecture(trial.study, key, trial.number)
        if other is None:
            return None
        self.consecutive_duplicates += 1
        if other.state == TrialState.COMPLETE:
            self.reused += 1
            for name, value in reused_attrs(other).items():
                trial.set_user_attr(name, value)
            trial.set_user_attr("reused_from", other.number)
            trial.set_user_attr("status", "reused")
            return other.values[0] if self.n_objectives == 1 else tuple(other.values)
        self.duplicates += 1
        trial.set_user_attr("duplicate_of", other.number)
        trial.set_user_attr("status", "duplicate")
        why = "stopped early at a rung" if other.state == TrialState.PRUNED else "running"
        raise optuna.TrialPruned(f"duplicate of trial {other.number} ({why})")

    def _deadline(self, start: float) -> tuple[float, str]:
        """``(perf_counter deadline, why)`` of a training started at ``start``: ``--trial-timeout`` or the search's
        ``--timeout``, whichever comes first; ``(inf, "")`` without either."""
        deadline, why = math.inf, ""
        if self.cfg.trial_timeout is not None:
            deadline, why = (start + self.cfg.trial_timeout,
                             f"training exceeded --trial-timeout {self.cfg.trial_timeout:g}s")
        if self.search_deadline is not None and self.search_deadline < deadline:
            deadline, why = self.search_deadline, "stopped: the search --timeout was reached during this trial"
        return deadline, why

    def _train(self, trial: optuna.trial.Trial, spec: ArchSpec, latency: float, start: float):
        """Train the proxy, reporting every eval point to the rungs / pruner, cut at the trial's or the search's
        deadline (whichever comes first) by a forward hook raising
        :class:`~archspec.search._engine.failures.TrialTimeout`."""

        def report_step(step: int, value: float) -> None:
            self.on_status(f"trial {trial.number}: step {step}, {self.score_name} {value:.3f}")
            if self.rungs is not None:
                self._rung(trial, step, value, latency)
            elif self.n_objectives == 1 and self.cfg.prune:
                trial.report(float(value), int(step))
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at step {step} ({self.score_name} {value:.3f})")

        train = self.train_fn
        shown = {"progress": f"trial {trial.number}"} if self.training_progress and self.oracle is None else {}
        deadline, why = self._deadline(start)
        if not math.isfinite(deadline):
            return train(spec, self.data, self.cfg.protocol, seed=self.cfg.seed, report=report_step, **shown)
        hook = deadline_hook(deadline, lambda: f"{why} (after {time.perf_counter() - start:.0f}s)")
        try:
            return train(spec, self.data, self.cfg.protocol, seed=self.cfg.seed, report=report_step, on_model=hook,
                         **shown)
        finally:
            hook.active = False

    def _rung(self, trial, step: int, value: float, latency: float) -> None:
        """Multi-fidelity: record the accuracy at a rung, stop the candidate there unless it is promotable
        (:func:`~archspec.search._engine.early_stop.rung_stops`).

        Raises:
            optuna.TrialPruned: stopped at the rung (status ``stopped``).
        """
        if rung_stops(trial, step, value, latency, self.rungs, self.n_objectives):
            self._stop(trial, f"stopped at rung {step} steps ({self.score_name} {value:.3f}): not promotable")

    def _zero_cost_rung(self, trial, spec: ArchSpec, latency: float, macs: int | None, params: int | None) -> None:
        """The zero-cost rung (``fidelity="zc"``, :func:`~archspec.search._engine.early_stop.zero_cost_stops`): score
        the
        untrained proxy, train only promising candidates.

        Raises:
            optuna.TrialPruned: not promotable (status ``stopped``).
        """
        self.on_status(f"trial {trial.number}: zero-cost scores")
        stops, message = zero_cost_stops(trial, spec, latency, macs, params, self.cfg, self.data, self.oracle)
        self.zc_scored += 1
        if stops:
            self._stop(trial, message)

    def _stop(self, trial, message: str):
        self.stopped += 1
        trial.set_user_attr("status", "stopped")
        raise optuna.TrialPruned(message)

    @staticmethod
    def _record_result(trial: optuna.trial.Trial, result, start: float) -> None:
        """Training time, accuracy and losses on the trial.

        Raises:
            CandidateFailure: a non-finite accuracy or loss (training diverged).
        """
        trial.set_user_attr("train_seconds", round(time.perf_counter() - start, 3))
        for key in ("accuracy", "val_loss", "train_loss", "loss_sum", "score"):
            value = getattr(result, key, None)
            if value is not None:
                trial.set_user_attr(key, float(value) if math.isfinite(float(value)) else None)
        trial.set_user_attr("steps", int(getattr(result, "steps", 0)))
        if getattr(result, "oracle_seed", None) is not None:  # the table seed that answered (--oracle)
            trial.set_user_attr("oracle_seed", int(result.oracle_seed))
        if getattr(result, "seconds", None) is not None:  # the loop's own seconds (the oracle's: tabulated)
            trial.set_user_attr("proxy_seconds", round(float(result.seconds), 3))
        geometry = getattr(result, "geometry", None)
        if geometry is not None:  # the proxy's stage grids next to the candidate's real ones
            trial.set_user_attr(GEOMETRY_ATTR, geometry.describe())
        bad = [k for k in ("accuracy", "train_loss", "val_loss")
               if getattr(result, k, None) is not None and not math.isfinite(float(getattr(result, k)))]
        if bad:
            raise CandidateFailure(f"non-finite {', '.join(bad)} (NaN/inf loss: training diverged)")
