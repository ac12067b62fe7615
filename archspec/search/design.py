"""Mode 1 of ``archspec search``: design an architecture under MAC / parameter / latency budgets.

One Optuna trial = one candidate of the search space:

1. ``space.sample(trial)`` -> an :class:`~archspec.spec.ArchSpec` at its real input size;
2. :func:`~archspec.search.budget.static_check` on the IR (no weights): MACs and params; each budget
   becomes an Optuna constraint (``trial.set_constraint``, ``value / budget - 1 <= 0`` feasible).  An
   over-budget candidate is recorded as a PRUNED trial (user attr ``status = infeasible``) with its
   constraint values -- Optuna's TPE ranks it below every feasible trial -- and costs only the
   static check: it is never built, measured or trained;
3. latency: median forward time at the spec's real input size under the latency protocol
   (:func:`~archspec.search.latency.measure_latency`, cached per architecture); with a latency
   budget an over-budget candidate is infeasible (never trained);
4. proxy training on real data (:func:`~archspec.search.proxy.train_proxy`) -> validation accuracy.

Objectives: ``pareto`` (default) maximises proxy accuracy and minimises latency (a Pareto front);
``accuracy`` maximises accuracy alone, the budgets acting as constraints.  A candidate that raises,
runs out of memory or produces a NaN loss becomes a FAIL trial with user attr ``fail_reason``; the
study goes on.  ``--trials N`` counts candidates that reach training (failures included); infeasible
samples are extra and cheap.

Distinct candidates: each trial records its architecture key (user attr ``arch_key``,
:func:`~archspec.search.latency.architecture_key`, the key latency is cached by).  Before training, a
candidate the study has already trained is not retrained: the trial copies the original's values and
result attrs (``reused_from``, state COMPLETE, never ranked in the front); one that another worker is
training is pruned (``status = duplicate``, ``duplicate_of``) and the sampler proposes another.  After
:data:`MAX_CONSECUTIVE_DUPLICATES` such samples in a row the run stops: the space has no untried
architectures left.  Each worker reseeds its sampler on its first trial
(:func:`~archspec.search.study.worker_seed`: ``--seed`` itself for a fresh study), so workers sharing a
storage and resumed runs do not replay one another's sequence.  When stdout is not a terminal, progress
is one line per finished trial (:func:`progress_line`).

The same engine (:func:`run_optuna_search`) runs mode 2's ``--strategy optuna`` on a mask-placement
space (:mod:`archspec.search.masks`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from archspec.analysis import human
from archspec.errors import SpecError
from archspec.search import runs
from archspec.spec import ArchSpec
from archspec.search.study import (ARCH_KEY_ATTR, HEARTBEAT_INTERVAL_S, check_storage, fail_zombie_trials, make_sampler,
                                   mark_worker, open_study, resolve_storage, reused_attrs, same_architecture,
                                   worker_seed)

__all__ = ["SearchConfig", "run_design", "run_optuna_search", "default_study_name", "check_outputs", "open_run",
           "run_dir_of", "DEFAULT_TRIALS", "DEFAULT_TIMEOUT_S"]

DEFAULT_TRIALS = 16          # trained candidates of the bare `archspec search --budget-flops 1G`
DEFAULT_TIMEOUT_S = 540.0    # ... or this many seconds of search, whichever comes first (2 CPU cores: < 10 min)
DEFAULT_TRIAL_TIMEOUT_S = 150.0  # one candidate's proxy training may take at most this long
MAX_CONSECUTIVE_INFEASIBLE = 2000
# Samples in a row, since the last trained candidate, of architectures the study already trained or is
# training: the space (within the budgets) has nothing new left for this sampler.
MAX_CONSECUTIVE_DUPLICATES = 20


@dataclass
class SearchConfig:
    """Everything a search run needs (built by the CLI from its options)."""

    budgets: Any                                    # archspec.search.budget.Budgets
    protocol: Any                                   # archspec.search.proxy.ProxyProtocol
    latency: Any                                    # archspec.search.latency.LatencyProtocol
    study_name: str | None = None
    out: Path | None = None
    storage: str | None = None
    objective: str = "pareto"                       # "pareto" | "accuracy"
    trials: int = DEFAULT_TRIALS
    timeout: float | None = DEFAULT_TIMEOUT_S
    seed: int = 0
    sampler: str = "tpe"
    space: Any = None                               # path, dict or None (embedded default)
    data: str | None = None
    max_images: int | None = None
    progress: bool = True
    prune: bool = False                             # MedianPruner on intermediate accuracy (single objective only)
    fidelity: str = "none"                          # multi-fidelity: none | sha | hyperband (archspec.search.fidelity)
    eta: int = 3                                    # its reduction factor
    min_steps: int | None = None                    # its first rung (default: proxy steps / eta**2)
    trial_timeout: float | None = DEFAULT_TRIAL_TIMEOUT_S  # per-candidate training limit (FAIL beyond it)
    budget_options: dict = field(default_factory=lambda: {"macs": "--budget-flops", "params": "--budget-params",
                                                          "latency_ms": "--budget-latency"})


def _tag(value: float) -> str:
    return human(value).replace(".00", "").replace(".", "p")


def default_study_name(space_name: str, objective: str, budgets) -> str:
    """``<space>-<objective>[-macs1G][-params5M][-lat20ms]``: re-running the same command resumes the same study."""
    parts = [space_name, objective]
    if budgets.macs:
        parts.append(f"macs{_tag(budgets.macs)}")
    if budgets.params:
        parts.append(f"params{_tag(budgets.params)}")
    if budgets.latency_ms:
        parts.append(f"lat{budgets.latency_ms:g}ms".replace(".", "p"))
    name = "-".join(parts)
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)[:80]


def _first_problem(exc: SpecError) -> str:
    return exc.problems[0].format() if exc.problems else str(exc)


# ----------------------------------------------------------------------------------- pre-flight checks
def check_budgets_feasible(space, budgets, options: dict) -> Any:
    """Raise :class:`SpecError` when even ``space.smallest()`` breaks a static budget."""
    from archspec.search.budget import static_check

    smallest = space.smallest()
    check = static_check(smallest, budgets)
    if check.feasible:
        return check
    if check.macs == 0 and check.params == 0 and check.reason:
        raise SpecError.single(("--space",), f"search space {space.name!r}: its smallest point is invalid: {check.reason}")
    over_macs = budgets.macs is not None and check.macs > budgets.macs
    if not over_macs and not (budgets.params is not None and check.params > budgets.params):  # the memory limit
        raise SpecError.single(("--max-memory",), f"search space {space.name!r}: its smallest point: {check.reason}",
                               "raise --max-memory, or search a smaller space (--space)")
    if over_macs:
        option, what = options["macs"], "MACs"
        message = (f"no point of search space {space.name!r} fits {human(budgets.macs)} MACs: the smallest achievable "
                   f"is {human(check.macs)} MACs ({check.macs:,}) and {human(check.params)} params")
    else:
        option, what = options["params"], "params"
        message = (f"no point of search space {space.name!r} fits {human(budgets.params)} params: the smallest "
                   f"achievable is {human(check.params)} params ({check.params:,}) at {human(check.macs)} MACs")
    raise SpecError.single((option,), message, f"raise {option} to at least the smallest achievable {what}, "
                                               "or search a smaller space (--space)")


def check_space_valid(space, n: int = 12, seed: int = 0) -> None:
    """Sample ``n`` random points; a point that is not a valid spec is reported with its field path."""
    sampler = optuna.samplers.RandomSampler(seed=seed)
    study = optuna.create_study(sampler=sampler)
    for _ in range(n):
        trial = study.ask()
        try:
            space.sample(trial)
        except SpecError as exc:
            raise SpecError([dataclasses.replace(p, message=f"search space {space.name!r} produced an invalid spec "
                                                             f"(params {trial.params}): {p.message}")
                             for p in exc.problems]) from None
        study.tell(trial, 0.0)


def check_data_path(data: str | None) -> None:
    """Fail fast, before a study is opened, when ``--data`` names nothing (see
    :func:`archspec.data.check_source`).

    Raises:
        SpecError: a missing path, or Fashion-MNIST asked for where it is not installed (exit 2 from the CLI).
    """
    from archspec.data import check_source

    check_source(data)


# ----------------------------------------------------------------------------------- objective
class _Objective:
    """The Optuna objective of a design (or mask-placement) search; counts what it did."""

    def __init__(self, space, data, cfg: SearchConfig, cache, n_objectives: int,
                 on_status: Callable[[str], None] | None = None,
                 after_train: Callable[[optuna.trial.Trial, Any, Any], None] | None = None,
                 train_fn: Callable | None = None):
        self.space, self.data, self.cfg, self.cache = space, data, cfg, cache
        self.train_fn = train_fn
        self.n_objectives = n_objectives
        self.on_status = on_status or (lambda text: None)
        self.after_train = after_train
        self.attempted = 0             # candidates that reached training (the --trials count)
        self.infeasible = 0
        self.consecutive_infeasible = 0
        self.trained_numbers: list[int] = []
        self.reused = 0                # candidates whose finished result was copied (not retrained)
        self.duplicates = 0            # candidates another worker was training: stepped back
        self.consecutive_duplicates = 0
        self.first_trial: int | None = None  # this worker's first trial number (its sampler seed)
        self.search_deadline: float | None = None  # perf_counter() time at which --timeout runs out
        self.rungs = None              # archspec.search.fidelity.Rungs when multi-fidelity is on
        self.stopped = 0               # candidates stopped at a rung below the last

    def _constraint(self, trial, key: str, value: float, budget: float | None) -> None:
        if budget is not None:
            trial.set_constraint(key, float(value) / float(budget) - 1.0)

    def _infeasible(self, trial, reason: str):
        trial.set_user_attr("status", "infeasible")
        trial.set_user_attr("infeasible_reason", reason)
        self.infeasible += 1
        self.consecutive_infeasible += 1
        raise optuna.TrialPruned(f"infeasible: {reason}")

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
            trial.study.sampler = make_sampler(self.cfg.sampler, seed, self.n_objectives)

    def _rung(self, trial, step: int, value: float, latency: float) -> None:
        """Multi-fidelity (:mod:`archspec.search.fidelity`): record the accuracy at a rung and stop the
        candidate there unless it is promotable (Optuna's pruner when single-objective)."""
        from archspec.search.fidelity import RUNGS_ATTR, promotable

        if step not in self.rungs.steps:
            return
        reached = {**trial.user_attrs.get(RUNGS_ATTR, {}), str(step): float(value)}
        trial.set_user_attr(RUNGS_ATTR, reached)
        if step == self.rungs.steps[-1]:
            return
        if self.n_objectives == 1:
            trial.report(float(value), int(step))
            stop = trial.should_prune()
        else:
            competitors = [(t.user_attrs[RUNGS_ATTR][str(step)], t.user_attrs.get("latency_ms", math.inf))
                           for t in trial.study.get_trials(deepcopy=False)
                           if t.number != trial.number and "reused_from" not in t.user_attrs
                           and str(step) in t.user_attrs.get(RUNGS_ATTR, {})]
            stop = not promotable(value, latency, [*competitors, (value, latency)], self.rungs.eta)
        if stop:
            self.stopped += 1
            trial.set_user_attr("status", "stopped")
            raise optuna.TrialPruned(f"stopped at rung {step} steps (val acc {value:.3f}): not promotable")

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
            trial.set_user_attr("fail_reason", _fail_reason(exc))
            raise

    def _evaluate(self, trial: optuna.trial.Trial):
        """:meth:`__call__` without the failure bookkeeping."""
        spec, key = self._sample_feasible(trial)
        latency = self._measure_latency(trial, spec)
        reused = self._claim(trial, key)
        if reused is not None:
            return reused
        self.consecutive_duplicates = 0
        self.attempted += 1
        self.on_status(f"trial {trial.number}: training")
        start = time.perf_counter()
        result = self._train(trial, spec, latency, start)
        self._record_result(trial, result, start)
        if self.after_train is not None:
            self.after_train(trial, spec, result)
        self.trained_numbers.append(trial.number)
        trial.set_user_attr("status", "trained")
        accuracy = float(result.accuracy)
        return accuracy if self.n_objectives == 1 else (accuracy, latency)

    def _sample_feasible(self, trial: optuna.trial.Trial) -> tuple[ArchSpec, str]:
        """Sample the candidate and check it statically: ``(spec, architecture key)``; MACs and params on the trial.

        Raises:
            _Failure: the space produced an invalid spec.
            optuna.TrialPruned: over the MAC, parameter or memory budget (status ``infeasible``).
        """
        from archspec.search.budget import static_check
        from archspec.search.latency import architecture_key

        budgets = self.cfg.budgets
        try:
            spec = self.space.sample(trial)
        except SpecError as exc:
            raise _Failure(f"the search space produced an invalid spec: {_first_problem(exc)}") from None
        trial.set_user_attr("spec", spec.model_dump(mode="json"))
        key = architecture_key(spec)
        trial.set_user_attr(ARCH_KEY_ATTR, key)
        check = static_check(spec, budgets, self.data, self.cfg.protocol)  # memory: also the proxy batch
        trial.set_user_attr("macs", int(check.macs))
        trial.set_user_attr("params", int(check.params))
        if check.macs == 0 and check.params == 0 and not check.feasible:
            raise _Failure(check.reason or "invalid spec")
        self._constraint(trial, "macs", check.macs, budgets.macs)
        self._constraint(trial, "params", check.params, budgets.params)
        if not check.feasible:
            if budgets.latency_ms is not None:  # not measured (never built): every trial carries every key
                trial.set_constraint("latency", 0.0)
            self._infeasible(trial, check.reason or "over budget")
        return spec, key

    def _measure_latency(self, trial: optuna.trial.Trial, spec: ArchSpec) -> float:
        """Latency in ms (cached per architecture) on the trial; prunes a candidate over ``--budget-latency``."""
        from archspec.search.latency import measure_latency

        budgets = self.cfg.budgets
        self.on_status(f"trial {trial.number}: latency")
        latency = float(measure_latency(spec, self.cfg.latency, self.cache))
        trial.set_user_attr("latency_ms", latency)
        if budgets.latency_ms is not None:
            trial.set_constraint("latency", latency / budgets.latency_ms - 1.0)
            if latency > budgets.latency_ms:
                self._infeasible(trial, f"latency {latency:.2f} ms > budget {budgets.latency_ms:g} ms")
        self.consecutive_infeasible = 0
        return latency

    def _train(self, trial: optuna.trial.Trial, spec: ArchSpec, latency: float, start: float):
        """Train the proxy, reporting every eval point to the rungs / pruner, cut at the trial's or the search's
        deadline (whichever comes first) by a forward hook raising :class:`TrialTimeout`."""
        from archspec.search.proxy import train_proxy

        def report(step: int, value: float) -> None:
            self.on_status(f"trial {trial.number}: step {step}, val acc {value:.3f}")
            if self.rungs is not None:
                self._rung(trial, step, value, latency)
            elif self.n_objectives == 1 and self.cfg.prune:
                trial.report(float(value), int(step))
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at step {step} (val acc {value:.3f})")

        train = self.train_fn or train_proxy
        deadline, why = math.inf, ""
        if self.cfg.trial_timeout is not None:
            deadline, why = start + self.cfg.trial_timeout, f"training exceeded --trial-timeout {self.cfg.trial_timeout:g}s"
        if self.search_deadline is not None and self.search_deadline < deadline:
            deadline, why = self.search_deadline, "stopped: the search --timeout was reached during this trial"
        if not math.isfinite(deadline):
            return train(spec, self.data, self.cfg.protocol, seed=self.cfg.seed, report=report)
        hook = deadline_hook(deadline, lambda: f"{why} (after {time.perf_counter() - start:.0f}s)")
        try:
            return train(spec, self.data, self.cfg.protocol, seed=self.cfg.seed, report=report, on_model=hook)
        finally:
            hook.active = False

    @staticmethod
    def _record_result(trial: optuna.trial.Trial, result, start: float) -> None:
        """Training time, accuracy and losses on the trial.

        Raises:
            _Failure: a non-finite accuracy or loss (training diverged).
        """
        trial.set_user_attr("train_seconds", round(time.perf_counter() - start, 3))
        for key in ("accuracy", "val_loss", "train_loss"):
            value = getattr(result, key, None)
            if value is not None:
                trial.set_user_attr(key, float(value) if math.isfinite(float(value)) else None)
        trial.set_user_attr("steps", int(getattr(result, "steps", 0)))
        bad = [k for k in ("accuracy", "train_loss", "val_loss")
               if getattr(result, k, None) is not None and not math.isfinite(float(getattr(result, k)))]
        if bad:
            raise _Failure(f"non-finite {', '.join(bad)} (NaN/inf loss: training diverged)")


def _fail_reason(exc: BaseException) -> str:
    """The ``fail_reason`` a trial records for ``exc`` (at most 1,000 characters); frees memory after an OOM."""
    from archspec.search.proxy import TrialFailure

    if isinstance(exc, _Failure):
        return exc.reason
    if isinstance(exc, TrialTimeout):
        return str(exc)
    if isinstance(exc, TrialFailure):
        return str(getattr(exc, "reason", exc))[:1000]
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C / SIGINT)"
    if isinstance(exc, MemoryError):
        gc.collect()
        return f"out of memory: {exc}"[:1000]
    text = f"{type(exc).__name__}: {exc}".strip()
    if "out of memory" in text.lower():
        gc.collect()
        text = "out of memory: " + text
    return text[:1000]


class TrialTimeout(Exception):
    """Raised from inside the model's forward pass when a candidate's training runs past its deadline.

    Deliberately not a ``RuntimeError``: it must pass through ``train_proxy``'s own error handling.
    """


class deadline_hook:  # noqa: N801 - used like a function
    """``on_model`` for :func:`~archspec.search.proxy.train_proxy`: the model's forward raises :class:`TrialTimeout` after ``deadline``
    (``perf_counter`` time) while ``active``; set ``active = False`` once training is over."""

    def __init__(self, deadline: float, describe: Callable[[], str]):
        self.deadline, self.describe, self.active = deadline, describe, True

    def __call__(self, model) -> None:
        def check(module, args):
            if self.active and time.perf_counter() > self.deadline:
                raise TrialTimeout(self.describe())
        model.register_forward_pre_hook(check)


class _Failure(Exception):
    """A candidate failure with a readable reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _StopAfter:
    """Optuna callback: stop when this worker has trained ``n`` candidates, or sampled only infeasible ones
    or only architectures the study already has (:data:`MAX_CONSECUTIVE_DUPLICATES`)."""

    def __init__(self, objective: _Objective, n: int, on_done: Callable[[Any], None]):
        self.objective, self.n, self.on_done = objective, n, on_done

    def __call__(self, study: optuna.Study, trial) -> None:
        # Free the candidate's model and optimiser now (Optuna's gc_after_trial, but a full collection
        # costs ~0.3 s with torch loaded: skipped for samples that never built a model).
        if trial.user_attrs.get("status") not in ("infeasible", "reused", "duplicate"):
            gc.collect()
        self.on_done(trial)
        if self.objective.attempted >= self.n:
            study.stop()
        elif self.objective.consecutive_infeasible >= MAX_CONSECUTIVE_INFEASIBLE:
            study.stop()
        elif self.objective.consecutive_duplicates >= MAX_CONSECUTIVE_DUPLICATES:
            study.stop()


def _state_label(trial) -> str:
    """COMPLETE / REUSED / PRUNED / FAIL, with why for the last two (infeasible, duplicate, reason)."""
    ua = trial.user_attrs
    if trial.state == TrialState.COMPLETE:
        return f"REUSED (trial {ua['reused_from']})" if "reused_from" in ua else "COMPLETE"
    why = ua.get("infeasible_reason") or (f"duplicate of trial {ua['duplicate_of']}" if "duplicate_of" in ua else None)
    why = why or ua.get("fail_reason") or ua.get("status")
    return f"{trial.state.name} ({str(why)[:80]})" if why else trial.state.name


def progress_line(trial, elapsed: float, attempted: int, total: int, timeout: float | None) -> str:
    """One log line for a finished trial (the progress report when stdout is not a terminal).

    ``trial 3 COMPLETE accuracy=0.912 latency_ms=12.80 macs=807.2M elapsed=35s eta=130s trained=5/16``;
    a value the trial does not have is ``-``.  ETA (seconds): the pace so far (elapsed /
    trained) times the candidates still to train, capped by what is left of ``timeout``; ``-`` before
    the first trained one without a timeout.  Raises nothing.  Source: archspec.
    """
    ua = trial.user_attrs
    acc, lat, macs = ua.get("accuracy"), ua.get("latency_ms"), ua.get("macs")
    left = [elapsed / attempted * max(total - attempted, 0)] if attempted else []
    if timeout is not None:
        left.append(max(timeout - elapsed, 0.0))
    return (f"trial {trial.number} {_state_label(trial)} accuracy={'-' if acc is None else f'{acc:.3f}'} "
            f"latency_ms={'-' if lat is None else f'{lat:.2f}'} macs={'-' if macs is None else human(macs)} "
            f"elapsed={elapsed:.0f}s eta={f'{min(left):.0f}s' if left else '-'} trained={attempted}/{total}")


class _Progress:
    """Progress of a search: a rich bar on stderr when stdout is a terminal, else one line per finished
    trial on stdout (:func:`progress_line`; logs and pipes get a readable record)."""

    def __init__(self, total: int, enabled: bool, n_objectives: int, timeout: float | None):
        import sys

        self.enabled = enabled
        self.lines = enabled and not sys.stdout.isatty()
        self.timeout = timeout
        self.start = time.perf_counter()
        self.total = total
        self.n_objectives = n_objectives
        self.best_acc: float | None = None
        self.best_lat: float | None = None
        self.failed = 0
        self.infeasible = 0
        self.progress = None
        if enabled and not self.lines:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
                TimeRemainingColumn

            self.progress = Progress(
                TextColumn("[bold]search"), BarColumn(), MofNCompleteColumn(), TextColumn("trained"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                console=Console(stderr=True, highlight=False), transient=False, refresh_per_second=4)
            self.task = self.progress.add_task("search", total=total, info=self._info("starting"))

    def _info(self, status: str) -> str:
        parts = []
        if self.best_acc is not None:
            parts.append(f"best acc {self.best_acc:.3f}")
        if self.best_lat is not None and self.n_objectives > 1:
            parts.append(f"fastest {self.best_lat:.1f} ms")
        if self.infeasible:
            parts.append(f"{self.infeasible} infeasible")
        if self.failed:
            parts.append(f"{self.failed} failed")
        parts.append(status)
        return " | ".join(parts)

    def __enter__(self):
        self.start = time.perf_counter()
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()
        return False

    def status(self, text: str) -> None:
        if self.progress is not None:
            self.progress.update(self.task, info=self._info(text))

    def done(self, trial, attempted: int) -> None:
        ua = trial.user_attrs
        if trial.state == TrialState.COMPLETE:
            acc = ua.get("accuracy")
            lat = ua.get("latency_ms")
            if acc is not None:
                self.best_acc = acc if self.best_acc is None else max(self.best_acc, acc)
            if lat is not None:
                self.best_lat = lat if self.best_lat is None else min(self.best_lat, lat)
        elif trial.state == TrialState.FAIL:
            self.failed += 1
        elif ua.get("status") == "infeasible":
            self.infeasible += 1
        if self.lines:
            elapsed = time.perf_counter() - self.start
            print(progress_line(trial, elapsed, attempted, self.total, self.timeout), flush=True)
        if self.progress is not None:
            self.progress.update(self.task, completed=min(attempted, self.total), info=self._info(f"#{trial.number} done"))


# ----------------------------------------------------------------------------------- the engine
@dataclass
class SearchOutcome:
    """What :func:`run_optuna_search` returns: the study, its trials and the summary dict."""

    study: optuna.Study
    summary: dict
    run_dir: Path
    interrupted: bool = False
    best_file: Path | None = None


@contextlib.contextmanager
def _run_lock(run_dir: Path):
    """Serialise the final writes of concurrent workers sharing a run directory (``fcntl.flock``)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(run_dir / ".finalize.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _quiet_optuna() -> None:
    # Failed trials are reported by the summary (with their fail_reason); Optuna's per-trial warnings
    # with tracebacks would bury the progress bar.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def run_dir_of(cfg: SearchConfig, name: str) -> Path:
    """The run directory: ``--out``, or ``runs/<study name>``."""
    return Path(cfg.out).expanduser() if cfg.out else Path("runs") / name


def check_outputs(cfg: SearchConfig, name: str) -> None:
    """Check ``--out`` and ``--storage`` without creating or connecting to anything.

    Raises:
        SpecError: ``--out`` is not a usable run directory (:func:`runs.check_run_dir`), or ``--storage``
            is refused by :func:`~archspec.search.study.check_storage` (a non-SQLite ``study.db`` in an
            existing run directory included).
    """
    out = run_dir_of(cfg, name)
    runs.check_run_dir(out)
    if cfg.storage is not None:
        check_storage(cfg.storage)
    elif out.is_dir():  # a new run directory is archspec's own and empty
        check_storage(None, out)


def open_run(cfg: SearchConfig, name: str, directions: list[str], metric_names: list[str], attrs: dict,
             sampler: optuna.samplers.BaseSampler, pruner: optuna.pruners.BasePruner | None = None,
             heartbeat: int | None = HEARTBEAT_INTERVAL_S):
    """Create the run directory, open the storage and the study: the first writes of a run.

    Call only after every input is checked (:func:`check_outputs` among them).  An explicit
    ``--storage`` is connected to before the run directory is created.

    Raises:
        SpecError: the storage cannot be reached, or the study exists with other objectives.
    """
    out = run_dir_of(cfg, name)
    if cfg.storage is not None:
        info = resolve_storage(cfg.storage, heartbeat=heartbeat)
        run_dir = runs.prepare_run_dir(out)
    else:
        run_dir = runs.prepare_run_dir(out)
        info = resolve_storage(None, run_dir, heartbeat=heartbeat)
    study = open_study(name, info, directions, sampler, pruner, metric_names, attrs)
    return run_dir, info, study


def _settings_notes(study: optuna.Study, attrs: dict) -> list[str]:
    notes = []
    old = study.user_attrs
    for key in ("budgets", "proxy", "data", "latency_protocol", "space"):
        if key in old and key in attrs and runs.jsonable(old[key]) != runs.jsonable(attrs[key]):
            notes.append(f"resumed study was created with a different {key} ({old[key]}); "
                         "objective values of old and new trials may not be comparable")
    return notes


def _preflight(space, cfg: SearchConfig, name: str, n_objectives: int):
    """Check every input of a search, cheapest first, writing nothing; return ``(data, sampler)``.

    Raises:
        SpecError: the first bad input (trials, timeout, budgets, space, data, ``--out``, ``--storage``).
    """
    from archspec.data import load_data

    if cfg.trials < 1:
        raise SpecError.single(("--trials",), f"needs at least 1 trial, got {cfg.trials}")
    if cfg.timeout is not None and cfg.timeout <= 0:
        raise SpecError.single(("--timeout",), f"must be positive seconds, got {cfg.timeout}")
    check_budgets_feasible(space, cfg.budgets, cfg.budget_options)
    check_space_valid(space, seed=cfg.seed)
    check_data_path(cfg.data)
    check_outputs(cfg, name)
    sampler = make_sampler(cfg.sampler, cfg.seed, n_objectives)
    # Decoding every image is the last input check (the slowest): still nothing written.
    data = load_data(cfg.data, image_size=cfg.protocol.image_size, seed=cfg.seed, max_images=cfg.max_images)
    return data, sampler


def run_optuna_search(space, cfg: SearchConfig, *, mode: str, name: str, extra_attrs: dict | None = None,
                      after_train=None, finalize_extra=None, train_fn=None) -> SearchOutcome:
    """Run (or resume) an Optuna search of ``space`` and write the run directory.

    Args:
        space: a :class:`~archspec.search.space.SearchSpace`.
        cfg: the settings.
        mode: label for the summary ("design" or "masks/optuna").
        name: the study name.
        extra_attrs: more study attributes (provenance).
        after_train: ``f(trial, spec, result)`` after a successful proxy training (mode 2 stores ALS).
        finalize_extra: ``f(study, run_dir, best_trial, summary)`` adds files / summary entries.

    Every input (options, budgets, space, data -- every image decoded --, ``--out``, ``--storage``)
    is checked before the run directory, the study or any file is created.

    Raises:
        SpecError: bad input (budgets, space, data, run directory, storage); nothing is written then.
    """
    from archspec.search.budget import static_check_rate
    from archspec.search.latency import LatencyCache

    _quiet_optuna()
    wall_start = time.perf_counter()
    multi = cfg.objective == "pareto"
    directions = ["maximize", "minimize"] if multi else ["maximize"]
    metric_names = ["accuracy", "latency_ms"] if multi else ["accuracy"]
    data, sampler = _preflight(space, cfg, name, len(directions))
    rate = static_check_rate(space, cfg.budgets, n=200, seed=cfg.seed)
    attrs = {
        "mode": mode, "space": getattr(space, "name", "space"), "objective": cfg.objective,
        "budgets": cfg.budgets.describe(), "proxy": cfg.protocol.describe(),
        "latency_protocol": dataclasses.asdict(cfg.latency), "data": cfg.data or "embedded",
        "max_images": cfg.max_images, "seed": cfg.seed, "sampler": cfg.sampler, **(extra_attrs or {}),
    }
    rungs, pruner = _fidelity(cfg, multi)
    if rungs is not None:  # every rung is an evaluation point: multiples of the first rung, and the end
        cfg = dataclasses.replace(cfg, protocol=dataclasses.replace(cfg.protocol, eval_every=rungs.min_steps))
        attrs["proxy"], attrs["fidelity"] = cfg.protocol.describe(), {"kind": cfg.fidelity, **rungs.describe()}
    run_dir, info, study = open_run(cfg, name, directions, metric_names, attrs, sampler, pruner)
    notes = _settings_notes(study, attrs)
    zombies = fail_zombie_trials(study)
    if zombies:
        notes.append(f"marked {len(zombies)} stale RUNNING trial(s) of dead workers as FAIL: {zombies}")

    cache = LatencyCache(run_dir / "latency.json")
    progress = _Progress(cfg.trials, cfg.progress, len(directions), cfg.timeout)
    objective = _Objective(space, data, cfg, cache, len(directions), on_status=progress.status, after_train=after_train,
                           train_fn=train_fn)
    objective.rungs = rungs
    stopper = _StopAfter(objective, cfg.trials, lambda t: progress.done(t, objective.attempted))
    interrupted = False
    optimize_start = time.perf_counter()
    if cfg.timeout is not None:
        objective.search_deadline = optimize_start + cfg.timeout
    try:
        with progress:
            study.optimize(objective, n_trials=None, timeout=cfg.timeout, callbacks=[stopper], catch=(Exception,),
                           gc_after_trial=False)  # _StopAfter collects after a trained candidate
    except KeyboardInterrupt:
        interrupted = True
        notes.append("interrupted: the study keeps every finished trial; re-run the same command to resume")
    search_seconds = time.perf_counter() - optimize_start
    notes += _stop_notes(objective, cfg, interrupted, search_seconds)
    summary = {
        "mode": mode, "study": name, "storage": info.url, "run_dir": str(run_dir), "objective": cfg.objective,
        "budgets": cfg.budgets.describe(), "static_check_rate": round(rate, 1),
        "trained_this_run": len(objective.trained_numbers), "attempted_this_run": objective.attempted,
        "infeasible_this_run": objective.infeasible, "reused_this_run": objective.reused,
        "duplicates_this_run": objective.duplicates, "sampler_seed": (worker_seed(cfg.seed, objective.first_trial)
                                                             if objective.first_trial is not None else cfg.seed),
        "search_seconds": round(search_seconds, 2),
        "data": {**data.describe(), "source": cfg.data or "embedded"},
        "proxy": cfg.protocol.describe(), "latency_protocol": dataclasses.asdict(cfg.latency),
        "seed": cfg.seed, "sampler": cfg.sampler, "timeout_s": cfg.timeout, "trial_timeout_s": cfg.trial_timeout,
        "notes": notes, "interrupted": interrupted,
        "candidates_per_hour": round(objective.attempted * 3600 / search_seconds, 1) if search_seconds > 0 else None,
        "fidelity": _fidelity_summary(study, cfg, rungs, objective),
    }
    with _run_lock(run_dir):
        best_file = _finalize(study, space, cfg, run_dir, info, summary, multi, finalize_extra)
    summary["wall_seconds"] = round(time.perf_counter() - wall_start, 2)
    runs.atomic_write_text(run_dir / "summary.json", _json(summary))
    return SearchOutcome(study, summary, run_dir, interrupted, best_file)


def _stop_notes(objective: _Objective, cfg: SearchConfig, interrupted: bool, search_seconds: float) -> list[str]:
    """Why the search stopped before ``--trials`` candidates, when it did: a space exhausted by the budgets or by
    duplicates, or ``--timeout``."""
    notes = []
    if objective.consecutive_infeasible >= MAX_CONSECUTIVE_INFEASIBLE:
        notes.append(f"stopped after {MAX_CONSECUTIVE_INFEASIBLE} infeasible samples in a row: the budgets leave "
                     "almost nothing of the space")
    if objective.consecutive_duplicates >= MAX_CONSECUTIVE_DUPLICATES:
        notes.append(f"stopped: the space has no untried architectures left ({MAX_CONSECUTIVE_DUPLICATES} samples in "
                     "a row were architectures this study already trained or is training)")
    if cfg.timeout is not None and objective.attempted < cfg.trials and not interrupted and search_seconds >= cfg.timeout:
        notes.append(f"--timeout {cfg.timeout:g}s reached after {objective.attempted} of {cfg.trials} trials")
    return notes


def _fidelity(cfg: SearchConfig, multi: bool):
    """``(rungs, pruner)`` for ``cfg.fidelity`` (see :mod:`archspec.search.fidelity`).

    Raises:
        SpecError: ``--fidelity hyperband`` with ``--objective pareto`` (Optuna prunes single-objective
            studies only; the Pareto mode has archspec's successive halving, ``sha``), or bad rungs.
    """
    from archspec.search.fidelity import make_pruner, rung_schedule

    if cfg.fidelity == "none":
        median = optuna.pruners.MedianPruner(n_startup_trials=3) if (cfg.prune and not multi) else None
        return None, median or optuna.pruners.NopPruner()
    if cfg.fidelity == "hyperband" and multi:
        raise SpecError.single(("--fidelity",), "hyperband needs --objective accuracy",
                               "Optuna prunes single-objective studies only; the Pareto search has --fidelity sha")
    rungs = rung_schedule(cfg.protocol.steps, cfg.eta, cfg.min_steps)
    pruner = make_pruner(cfg.fidelity, rungs) if not multi else None
    return rungs, pruner or optuna.pruners.NopPruner()


def _fidelity_summary(study, cfg: SearchConfig, rungs, objective) -> dict | None:
    """Rungs, candidates stopped early, and each rung's rank correlation with the last (whole study)."""
    from archspec.search.fidelity import RUNGS_ATTR, rung_correlations

    if rungs is None:
        return None
    values = [t.user_attrs[RUNGS_ATTR] for t in study.get_trials(deepcopy=False)
              if RUNGS_ATTR in t.user_attrs and "reused_from" not in t.user_attrs]  # a reused copy is no new run
    return {"kind": cfg.fidelity, **rungs.describe(), "stopped_this_run": objective.stopped,
            "rung_correlations": rung_correlations(values, rungs)}


def _json(obj) -> str:
    import json

    return json.dumps(runs.jsonable(obj), indent=2) + "\n"


def _feasible(trial) -> bool:
    return all(v <= 0 for v in trial.constraints.values())


def trial_provenance(study_name: str, trial, cfg: SearchConfig, info, summary: dict, spec) -> dict:
    """The provenance block of an emitted spec."""
    ua = trial.user_attrs
    objectives = {"accuracy": ua.get("accuracy")}
    if ua.get("latency_ms") is not None:
        objectives["latency_ms"] = round(float(ua["latency_ms"]), 3)
    return {
        "study": study_name, "trial": trial.number, "storage": info.url, "objectives": objectives,
        "macs": ua.get("macs"), "params": ua.get("params"), "input": list(spec.input.resolution),
        "latency": summary.get("latency_protocol"), "data": summary.get("data"), "proxy": summary.get("proxy"),
        "budgets": summary.get("budgets"), "objective": cfg.objective, "sampler": cfg.sampler, "seed": cfg.seed,
        "created": runs.now_iso(),
    }


def spec_of_trial(trial, space=None):
    """The :class:`ArchSpec` a trial evaluated (user attr ``spec``, else re-sampled from its params)."""
    from archspec.loader import load_spec

    data = trial.user_attrs.get("spec")
    if data is not None:
        return load_spec(data)
    if space is None:
        raise ValueError(f"trial {trial.number} has no stored spec")
    return space.sample(optuna.trial.FixedTrial(trial.params, trial.number))


def _finalize(study, space, cfg: SearchConfig, run_dir: Path, info, summary: dict, multi: bool, finalize_extra) -> Path | None:
    """Counts, failures and timings into ``summary``; trials.csv, the Pareto specs or the best spec, the plot.

    Returns ``best.yaml``'s path, or ``None`` when no trained feasible trial exists yet."""
    trials = study.get_trials(deepcopy=False)
    counts: dict[str, int] = {}
    for t in trials:
        key = runs._state_status(t)
        counts[key] = counts.get(key, 0) + 1
    summary["counts"] = counts
    summary["failures"] = [{"trial": t.number, "reason": t.user_attrs.get("fail_reason", "unknown")}
                           for t in trials if t.state == TrialState.FAIL]
    # A reused trial is a copy of its original's result: counted and listed, never ranked twice.
    trained = [t for t in trials if t.state == TrialState.COMPLETE and "reused_from" not in t.user_attrs]
    durations = [t.duration.total_seconds() for t in trained if t.duration is not None]
    summary["per_trial_seconds"] = round(statistics.median(durations), 2) if durations else None
    summary["trained_total"] = len(trained)
    files = []
    runs.write_trials_csv(trials, run_dir / "trials.csv")
    files.append("trials.csv")
    feasible = [t for t in trained if _feasible(t)]
    write = _write_pareto if multi else _write_best_trial
    best_file = write(study, space, cfg, run_dir, info, summary, feasible, files)
    if finalize_extra is not None:
        best_file = finalize_extra(study, run_dir, summary, files, best_file) or best_file
    if best_file is not None:
        files.insert(0, "best.yaml")
        summary["best"] = str(best_file)
    else:
        summary["notes"].append("no trained feasible trial yet: no best.yaml written")
    files.append("summary.json")
    summary["files"] = files
    return best_file


def _write_pareto(study, space, cfg: SearchConfig, run_dir: Path, info, summary: dict, feasible: list,
                  files: list[str]) -> Path | None:
    """Pareto mode: one spec per front point under ``pareto/`` (rank 0 = most accurate, also ``best.yaml``), the
    front into ``summary["pareto"]``, and ``pareto.png``."""
    front = [t for t in study.best_trials if _feasible(t) and "reused_from" not in t.user_attrs] if feasible else []
    front.sort(key=lambda t: (-t.values[0], t.values[1], t.number))
    pareto_files, points, best_file = {}, [], None
    for rank, t in enumerate(front):
        spec = spec_of_trial(t, space)
        prov = trial_provenance(summary["study"], t, cfg, info, summary, spec)
        prov["pareto_rank"] = rank
        _, text = runs.emit_spec(spec, None, f"{summary['study']}_trial{t.number}"[:100], prov)
        fname = f"{rank}_trial{t.number}.yaml"
        pareto_files[fname] = text
        points.append({"rank": rank, "trial": t.number, "accuracy": t.values[0], "latency_ms": t.values[1],
                       "macs": t.user_attrs.get("macs"), "params": t.user_attrs.get("params"),
                       "file": f"pareto/{fname}"})
    if pareto_files:
        runs.replace_dir(run_dir / "pareto", pareto_files)
        files.append(f"pareto/ ({len(pareto_files)} specs)")
        best_file = runs.atomic_write_text(run_dir / "best.yaml", pareto_files[f"0_trial{front[0].number}.yaml"])
    _plot(summary, files, runs.plot_pareto, feasible, run_dir / "pareto.png", ["maximize", "minimize"],
          ["proxy accuracy", "latency (ms)"], f"{summary['study']}: {len(feasible)} trained feasible trials")
    summary["table_title"] = "Pareto front: proxy accuracy vs latency (trained, feasible)"
    summary["pareto"] = points
    return best_file


def _write_best_trial(study, space, cfg: SearchConfig, run_dir: Path, info, summary: dict, feasible: list,
                      files: list[str]) -> Path | None:
    """Single-objective mode: the most accurate feasible trial as ``best.yaml`` and the optimisation history plot."""
    best_trial = max(feasible, key=lambda t: (t.value, -t.number)) if feasible else None
    points, best_file = [], None
    if best_trial is not None:
        spec = spec_of_trial(best_trial, space)
        prov = trial_provenance(summary["study"], best_trial, cfg, info, summary, spec)
        _, text = runs.emit_spec(spec, None, f"{summary['study']}_trial{best_trial.number}"[:100], prov)
        best_file = runs.atomic_write_text(run_dir / "best.yaml", text)
        points.append({"rank": 0, "trial": best_trial.number, "accuracy": best_trial.value,
                       "latency_ms": best_trial.user_attrs.get("latency_ms"),
                       "macs": best_trial.user_attrs.get("macs"), "params": best_trial.user_attrs.get("params"),
                       "file": "best.yaml"})
    _plot(summary, files, runs.plot_history, feasible, run_dir / "pareto.png", "maximize", "proxy accuracy",
          f"{summary['study']}: optimisation history ({len(feasible)} trained feasible)")
    summary["table_title"] = "best trial (single objective: proxy accuracy, budgets as constraints)"
    summary["best_trial"] = best_trial.number if best_trial is not None else None
    summary["pareto"] = points
    return best_file


def _plot(summary: dict, files: list[str], plot, *args) -> None:
    """``plot(*args)`` into ``pareto.png``; a failing plot becomes a note, never a lost search."""
    try:
        if plot(*args):
            files.append("pareto.png")
    except Exception as exc:  # noqa: BLE001 - a plot must never lose the search results
        summary["notes"].append(f"pareto.png not written: {type(exc).__name__}: {exc}")


# ----------------------------------------------------------------------------------- mode 1 entry point
def run_design(cfg: SearchConfig) -> SearchOutcome:
    """Mode 1: design under budgets (``archspec search --budget-flops 1G``)."""
    from archspec.search.space import load_space

    space = load_space(cfg.space)
    name = cfg.study_name or default_study_name(space.name, cfg.objective, cfg.budgets)
    return run_optuna_search(space, cfg, mode="design", name=name)
