"""The search engine: one Optuna study, its run directory, and the trial loop every search mode shares.

The modes are thin clients, as Optuna's samplers are of its study: mode 1 (:mod:`archspec.search.design`)
hands :func:`run_optuna_search` a design space, mode 2's ``--strategy optuna``
(:mod:`archspec.search.masks`) a mask-placement space with its own training and result hooks, and
mode 2's ``als`` / ``soft`` strategies drive a study of their own through :func:`open_run`,
:func:`run_lock` and :func:`zombie_notes`.

One Optuna trial = one candidate of the space (:class:`CandidateObjective`):

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

Objectives: ``pareto`` maximises proxy accuracy and minimises latency (a Pareto front); ``accuracy``
maximises accuracy alone, the budgets acting as constraints.  A candidate that raises, runs out of
memory, produces a NaN loss or runs past ``--trial-timeout`` becomes a FAIL trial with user attr
``fail_reason`` (:func:`fail_reason`); the study goes on.  ``--trials N`` counts candidates that reach
training (failures included); infeasible samples are extra and cheap.

Distinct candidates: each trial records its architecture key (user attr ``arch_key``,
:func:`~archspec.search.latency.architecture_key`, the key latency is cached by).  Before training, a
candidate the study has already trained is not retrained: the trial copies the original's values and
result attrs (``reused_from``, state COMPLETE, never ranked in the front); one that another worker is
training is pruned (``status = duplicate``, ``duplicate_of``) and the sampler proposes another.  After
:data:`MAX_CONSECUTIVE_DUPLICATES` such samples in a row the run stops (:class:`StopRules`): the space
has no untried architectures left.  Each worker reseeds its sampler on its first trial
(:func:`~archspec.search.study.worker_seed`: ``--seed`` itself for a fresh study), so workers sharing a
storage and resumed runs do not replay one another's sequence.

Progress, trials.csv, the Pareto / best specs, plots and the printed summary are
:mod:`archspec.search.report`; the run directory's files :mod:`archspec.search.runs`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from archspec.errors import SpecError
from archspec.ir.analysis import human
from archspec.search import report, runs
from archspec.search.config import (
    BUDGET_OPTIONS,
    DEFAULT_TIMEOUT_S,
    DEFAULT_TRIAL_TIMEOUT_S,
    DEFAULT_TRIALS,
    GEOMETRY_ATTR,
    ZERO_COST_ATTR,
    SearchConfig,
    SearchOutcome,
    complete_config,
)
from archspec.search.study import (
    ARCH_KEY_ATTR,
    HEARTBEAT_INTERVAL_S,
    check_storage,
    fail_zombie_trials,
    make_sampler,
    mark_worker,
    open_study,
    resolve_storage,
    reused_attrs,
    same_architecture,
    worker_seed,
)
from archspec.spec import ArchSpec

if TYPE_CHECKING:  # annotations only: the space, the data and the cache import torch-side modules
    from archspec.io.datasets import Dataset
    from archspec.search.latency import LatencyCache
    from archspec.search.space import SearchSpace

__all__ = [
    # settings and result (archspec.search.config)
    "SearchConfig", "SearchOutcome", "DEFAULT_TRIALS", "DEFAULT_TIMEOUT_S", "DEFAULT_TRIAL_TIMEOUT_S", "BUDGET_OPTIONS",
    # the loop
    "run_optuna_search", "CandidateObjective", "StopRules", "stop_notes",
    "MAX_CONSECUTIVE_INFEASIBLE", "MAX_CONSECUTIVE_DUPLICATES",
    # failures and deadlines
    "CandidateFailure", "TrialTimeout", "deadline_hook", "fail_reason",
    # study and run directory
    "quiet_optuna", "run_dir_of", "check_outputs", "open_run", "run_lock", "zombie_notes", "resume_message",
    # input checks
    "check_budgets_feasible", "check_space_valid", "check_data_path", "check_fidelity",
]

MAX_CONSECUTIVE_INFEASIBLE = 2000
# Samples in a row, since the last trained candidate, of architectures the study already trained or is
# training: the space (within the budgets) has nothing new left for this sampler.
MAX_CONSECUTIVE_DUPLICATES = 20


# ----------------------------------------------------------------------------------- study and run directory
def quiet_optuna() -> None:
    """Silence Optuna's per-trial log and its experimental-feature warnings (for this process).

    Failed trials are reported by the summary (with their ``fail_reason``); Optuna's per-trial warnings
    with tracebacks would bury the progress bar."""
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
    ``--storage`` is connected to before the run directory is created.  ``heartbeat`` (seconds, or
    ``None`` for ask/tell runs whose zombies are found by pid) is Optuna's trial heartbeat.

    Returns ``(run_dir, storage info, study)``.

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
    announce_resume(study, info.url)
    return run_dir, info, study


def resume_message(study: optuna.Study, url: str) -> str | None:
    """``resuming study NAME in URL: 12 trials already there (5 trained, 7 pruned)``, or ``None`` for a new study."""
    trials = study.get_trials(deepcopy=False)
    if not trials:
        return None
    counts: dict[str, int] = {}
    for t in trials:
        label = "trained" if t.state == TrialState.COMPLETE else t.state.name.lower()
        counts[label] = counts.get(label, 0) + 1
    parts = ", ".join(f"{v} {k}" for k, v in counts.items())
    return f"resuming study {study.study_name} in {url}: {len(trials)} trials already there ({parts})"


def announce_resume(study: optuna.Study, url: str) -> None:
    """Say on stderr, before any trial runs, that this run continues an existing study (and how far it got)."""
    message = resume_message(study, url)
    if message is not None:
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Serialise the final writes of concurrent workers sharing a run directory (``fcntl.flock`` on
    ``.finalize.lock``; no lock where ``fcntl`` does not exist)."""
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


def zombie_notes(study: optuna.Study) -> list[str]:
    """Fail the RUNNING trials of dead workers (:func:`~archspec.search.study.fail_zombie_trials`); the note
    saying so, if there were any."""
    zombies = fail_zombie_trials(study)
    return [f"marked {len(zombies)} stale RUNNING trial(s) of dead workers as FAIL: {zombies}"] if zombies else []


def _settings_notes(study: optuna.Study, attrs: dict) -> list[str]:
    """Notes on a resumed study created with other settings: old and new values may not compare."""
    notes = []
    old = study.user_attrs
    for key in ("budgets", "proxy", "data", "latency_protocol", "space"):
        if key in old and key in attrs and runs.jsonable(old[key]) != runs.jsonable(attrs[key]):
            notes.append(f"resumed study was created with a different {key} ({old[key]}); "
                         "objective values of old and new trials may not be comparable")
    return notes


# ----------------------------------------------------------------------------------- input checks
def _first_problem(exc: SpecError) -> str:
    return exc.problems[0].format() if exc.problems else str(exc)


def check_budgets_feasible(space, budgets, options: dict) -> Any:
    """Raise :class:`SpecError` when even ``space.smallest()`` breaks a static budget; else its static check.

    ``options`` maps a budget (``macs``, ``params``) to the command-line option the error names
    (:data:`~archspec.search.config.BUDGET_OPTIONS`).

    Raises:
        SpecError: the smallest point is invalid, over the memory limit (``--max-memory``), or over the MAC or
            parameter budget (the error gives the smallest achievable value).
    """
    from archspec.search.budget import static_check

    check = static_check(space.smallest(), budgets)
    if check.feasible:
        return check
    if check.macs == 0 and check.params == 0 and check.reason:
        raise SpecError.single(("--space",),
                               f"search space {space.name!r}: its smallest point is invalid: {check.reason}")
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
    """Sample ``n`` random points (seeded by ``seed``).

    Raises:
        SpecError: a point is not a valid spec; each problem keeps its field path and names the sampled params.
    """
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
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
    """Fail fast, before a study is opened, when ``--data`` names nothing
    (see :func:`archspec.io.datasets.check_source`).

    Raises:
        SpecError: a missing path, or Fashion-MNIST asked for where it is not installed (exit 2 from the CLI).
    """
    from archspec.io.datasets import check_source

    check_source(data)


def check_fidelity(cfg: SearchConfig) -> None:
    """``cfg.fidelity`` is known and ``cfg.zc_score`` a zero-cost ranking.

    Raises:
        SpecError: at ``--fidelity`` or ``--zc-score``, naming the choices.
    """
    from archspec.search.fidelity import FIDELITIES, ZERO_COST_RANKINGS

    if cfg.fidelity not in FIDELITIES:
        raise SpecError.single(("--fidelity",), f"unknown fidelity {cfg.fidelity!r}", f"one of {', '.join(FIDELITIES)}")
    if cfg.zc_score not in ZERO_COST_RANKINGS:
        raise SpecError.single(("--zc-score",), f"unknown zero-cost score {cfg.zc_score!r}",
                               f"one of {', '.join(ZERO_COST_RANKINGS)}")


def _preflight(space, cfg: SearchConfig, name: str, n_objectives: int):
    """Check every input of a search, cheapest first, writing nothing; return ``(data, sampler)``.

    Raises:
        SpecError: the first bad input (trials, timeout, budgets, space, data, ``--out``, ``--storage``).
    """
    from archspec.io.datasets import load_data

    if cfg.trials < 1:
        raise SpecError.single(("--trials",), f"needs at least 1 trial, got {cfg.trials}")
    if cfg.timeout is not None and cfg.timeout <= 0:
        raise SpecError.single(("--timeout",), f"must be positive seconds, got {cfg.timeout}")
    check_fidelity(cfg)
    check_budgets_feasible(space, cfg.budgets, cfg.budget_options)
    check_space_valid(space, seed=cfg.seed)
    oracle = check_oracle(cfg, space, n_objectives)
    if oracle is None:
        check_data_path(cfg.data)
    check_outputs(cfg, name)
    sampler = make_sampler(cfg.sampler, cfg.seed, n_objectives)
    if oracle is not None:  # nothing is trained: the table answers; no images are read
        return oracle.dataset(), sampler, oracle
    # Decoding every image is the last input check (the slowest): still nothing written.
    data = load_data(cfg.data, image_size=cfg.protocol.image_size, seed=cfg.seed, max_images=cfg.max_images)
    return data, sampler, None


MAX_ORACLE_POINTS = 10_000  # an oracle search checks every point of its space against the table


def check_oracle(cfg: SearchConfig, space, n_objectives: int):
    """The :class:`~archspec.search.oracle.OracleTable` of ``cfg.oracle`` (``None`` without one), checked against
    the search: the table tabulates ``space``, covers ``--proxy-steps``, and has latency where the search needs it.

    Raises:
        SpecError: at ``--oracle`` / ``--proxy-steps``.
    """
    from archspec.search.latency import architecture_key
    from archspec.search.oracle import load_table

    if cfg.oracle is None:
        return None
    table = load_table(cfg.oracle)
    if table.space != space.name:
        raise SpecError.single(("--oracle",), f"the table tabulates space {table.space!r}, not {space.name!r}",
                               f"add --space {table.space}", str(cfg.oracle))
    table.check_steps(cfg.protocol.steps)
    missing = [params for params, spec in space.points(limit=MAX_ORACLE_POINTS)
               if architecture_key(spec) not in table.rows]
    if missing:
        raise SpecError.single(("--oracle",), f"the table lacks {len(missing)} design(s) of space {space.name!r}, "
                               f"e.g. {missing[0]}", "finish it: nice -n 19 python bench/space_table.py --resume",
                               str(cfg.oracle))
    if (n_objectives == 2 or cfg.budgets.latency_ms is not None) and not table.latency_ms:
        raise SpecError.single(("--oracle",), "the table has no latency yet (its latency pass has not run)",
                               "search with --objective accuracy, or run bench/space_table.py --latency",
                               str(cfg.oracle))
    return table


# ----------------------------------------------------------------------------------- failures and deadlines
class CandidateFailure(Exception):
    """A candidate failure with a readable reason (``reason``: what the trial's ``fail_reason`` says)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class TrialTimeout(Exception):
    """Raised from inside the model's forward pass when a candidate's training runs past its deadline.

    Deliberately not a ``RuntimeError``: it must pass through ``train_proxy``'s own error handling.
    """


class deadline_hook:  # noqa: N801 - used like a function
    """``on_model`` for :func:`~archspec.search.proxy.train_proxy`: the model's forward raises :class:`TrialTimeout`
    after ``deadline`` (``time.perf_counter()`` seconds) while ``active``; set ``active = False`` once training is
    over.  ``describe()`` gives the exception's message."""

    def __init__(self, deadline: float, describe: Callable[[], str]):
        self.deadline, self.describe, self.active = deadline, describe, True

    def __call__(self, model) -> None:
        def check(module, args):
            if self.active and time.perf_counter() > self.deadline:
                raise TrialTimeout(self.describe())
        model.register_forward_pre_hook(check)


def fail_reason(exc: BaseException) -> str:
    """The ``fail_reason`` a trial records for ``exc`` (at most 1,000 characters); frees memory after an OOM."""
    from archspec.search.proxy import TrialFailure

    if isinstance(exc, CandidateFailure):
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


# ----------------------------------------------------------------------------------- the objective
class CandidateObjective:
    """The Optuna objective of a search (design or mask placement): one call evaluates one candidate.

    Args:
        space: the :class:`~archspec.search.space.SearchSpace` to sample.
        data: the :class:`~archspec.io.datasets.Dataset` of the proxy training.
        cfg: the :class:`~archspec.search.config.SearchConfig` (budgets, protocols, limits).
        cache: the :class:`~archspec.search.latency.LatencyCache` of the run directory.
        n_objectives: 1 (accuracy) or 2 (accuracy, latency in ms).
        on_status: ``f(text)`` told what the running trial does (the progress display).
        after_train: ``f(trial, spec, result)`` after a successful proxy training.
        train_fn: replaces :func:`~archspec.search.proxy.train_proxy` (same signature).
        oracle: an :class:`~archspec.search.oracle.OracleTable` that answers training, the zero-cost rung and
            latency from a tabulated space instead of measuring them (``--oracle``).

    Counts what it did (``attempted``, ``infeasible``, ``reused``, ``duplicates``, ``stopped``, the
    ``consecutive_*`` runs :class:`StopRules` reads); ``search_deadline`` (``perf_counter`` seconds) is when
    ``--timeout`` runs out and ``rungs`` the multi-fidelity schedule, both set by the engine.
    """

    def __init__(self, space: SearchSpace, data: Dataset, cfg: SearchConfig, cache: LatencyCache, n_objectives: int,
                 on_status: Callable[[str], None] | None = None,
                 after_train: Callable[[optuna.trial.Trial, Any, Any], None] | None = None,
                 train_fn: Callable | None = None, oracle: Any = None):
        self.space, self.data, self.cfg, self.cache = space, data, cfg, cache
        self.oracle = oracle
        self.train_fn = oracle.train if oracle is not None and train_fn is None else train_fn
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
        self.stopped = 0               # candidates stopped at a rung below the last (or the zero-cost rung)
        self.zc_scored = 0             # candidates the zero-cost rung scored

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
        from archspec.search.budget import static_check
        from archspec.search.latency import architecture_key

        budgets = self.cfg.budgets
        try:
            spec = self.space.sample(trial)
        except SpecError as exc:
            raise CandidateFailure(f"the search space produced an invalid spec: {_first_problem(exc)}") from None
        trial.set_user_attr("spec", spec.model_dump(mode="json"))
        key = architecture_key(spec)
        trial.set_user_attr(ARCH_KEY_ATTR, key)
        check = static_check(spec, budgets, self.data, self.cfg.protocol)  # memory: also the proxy batch
        trial.set_user_attr("macs", int(check.macs))
        trial.set_user_attr("params", int(check.params))
        if check.macs == 0 and check.params == 0 and not check.feasible:
            raise CandidateFailure(check.reason or "invalid spec")
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
        if self.oracle is not None and not self.oracle.latency_ms:  # accuracy only (check_oracle): rank by it alone
            self.consecutive_infeasible = 0
            return 0.0
        if self.oracle is not None:
            latency = float(self.oracle.latency(spec))
        else:
            latency = float(measure_latency(spec, self.cfg.latency, self.cache))
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
        deadline (whichever comes first) by a forward hook raising :class:`TrialTimeout`."""
        from archspec.search.proxy import train_proxy  # looked up per call: tests replace it

        def report_step(step: int, value: float) -> None:
            self.on_status(f"trial {trial.number}: step {step}, val acc {value:.3f}")
            if self.rungs is not None:
                self._rung(trial, step, value, latency)
            elif self.n_objectives == 1 and self.cfg.prune:
                trial.report(float(value), int(step))
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at step {step} (val acc {value:.3f})")

        train = self.train_fn or train_proxy
        deadline, why = self._deadline(start)
        if not math.isfinite(deadline):
            return train(spec, self.data, self.cfg.protocol, seed=self.cfg.seed, report=report_step)
        hook = deadline_hook(deadline, lambda: f"{why} (after {time.perf_counter() - start:.0f}s)")
        try:
            return train(spec, self.data, self.cfg.protocol, seed=self.cfg.seed, report=report_step, on_model=hook)
        finally:
            hook.active = False

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

    def _zero_cost_rung(self, trial, spec: ArchSpec, latency: float, macs: int | None, params: int | None) -> None:
        """The zero-cost rung (``fidelity="zc"``): score the untrained proxy, train only promising candidates.

        Every score (:mod:`archspec.search.zero_cost`, plus ``params`` and ``macs`` at the real size) goes on
        the trial (:data:`~archspec.search.config.ZERO_COST_ATTR`, with the seconds each took); the candidate
        goes on to training if ``cfg.zc_score`` is promotable among every candidate scored so far
        (:func:`~archspec.search.fidelity.promotable`: the top ``1/eta``, or not dominated in (score, latency)).

        Raises:
            optuna.TrialPruned: not promotable (status ``stopped``).
        """
        from archspec.search.fidelity import promotable
        from archspec.search.proxy import score_proxy
        from archspec.search.zero_cost import ZERO_COST_SCORES

        self.on_status(f"trial {trial.number}: zero-cost scores")
        if self.oracle is not None:
            result, geometry = self.oracle.zero_cost(spec, seed=self.cfg.seed)
        else:
            result, geometry = score_proxy(spec, self.data, self.cfg.protocol, ZERO_COST_SCORES, seed=self.cfg.seed)
        scores = {**result.scores, "params": params, "macs": macs}
        scores = {k: (v if v is None or not math.isnan(v) else -math.inf) for k, v in scores.items()}
        self.zc_scored += 1
        trial.set_user_attr(ZERO_COST_ATTR, {"scores": scores, "seconds": result.seconds,
                                             "total_seconds": round(sum(result.seconds.values()), 4)})
        if geometry is not None:
            trial.set_user_attr(GEOMETRY_ATTR, geometry.describe())
        name = self.cfg.zc_score
        value = scores[name]
        competitors = [(t.user_attrs[ZERO_COST_ATTR]["scores"][name], t.user_attrs.get("latency_ms", math.inf))
                       for t in trial.study.get_trials(deepcopy=False)
                       if t.number != trial.number and "reused_from" not in t.user_attrs
                       and ZERO_COST_ATTR in t.user_attrs]
        if not promotable(value, latency, [*competitors, (value, latency)], self.cfg.eta):
            self.stopped += 1
            trial.set_user_attr("status", "stopped")
            raise optuna.TrialPruned(f"stopped at the zero-cost rung ({name} {value:.4g}): not promotable")

    @staticmethod
    def _record_result(trial: optuna.trial.Trial, result, start: float) -> None:
        """Training time, accuracy and losses on the trial.

        Raises:
            CandidateFailure: a non-finite accuracy or loss (training diverged).
        """
        trial.set_user_attr("train_seconds", round(time.perf_counter() - start, 3))
        for key in ("accuracy", "val_loss", "train_loss"):
            value = getattr(result, key, None)
            if value is not None:
                trial.set_user_attr(key, float(value) if math.isfinite(float(value)) else None)
        trial.set_user_attr("steps", int(getattr(result, "steps", 0)))
        if getattr(result, "seconds", None) is not None:  # the loop's own seconds (the oracle's: tabulated)
            trial.set_user_attr("proxy_seconds", round(float(result.seconds), 3))
        geometry = getattr(result, "geometry", None)
        if geometry is not None:  # the proxy's stage grids next to the candidate's real ones
            trial.set_user_attr(GEOMETRY_ATTR, geometry.describe())
        bad = [k for k in ("accuracy", "train_loss", "val_loss")
               if getattr(result, k, None) is not None and not math.isfinite(float(getattr(result, k)))]
        if bad:
            raise CandidateFailure(f"non-finite {', '.join(bad)} (NaN/inf loss: training diverged)")


# ----------------------------------------------------------------------------------- stop rules
class StopRules:
    """Optuna callback: stop when this worker has trained ``n`` candidates, or sampled only infeasible ones
    (:data:`MAX_CONSECUTIVE_INFEASIBLE`) or only architectures the study already has
    (:data:`MAX_CONSECUTIVE_DUPLICATES`) in a row.  ``on_done(trial)`` hears of every finished trial."""

    def __init__(self, objective: CandidateObjective, n: int, on_done: Callable[[Any], None]):
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


def stop_notes(objective: CandidateObjective, cfg: SearchConfig, interrupted: bool, search_seconds: float) -> list[str]:
    """Why the search stopped before ``--trials`` candidates, when it did: a space exhausted by the budgets or by
    duplicates, or ``--timeout`` (``search_seconds``: how long the optimisation ran)."""
    notes = []
    if objective.consecutive_infeasible >= MAX_CONSECUTIVE_INFEASIBLE:
        notes.append(f"stopped after {MAX_CONSECUTIVE_INFEASIBLE} infeasible samples in a row: the budgets leave "
                     "almost nothing of the space")
    if objective.consecutive_duplicates >= MAX_CONSECUTIVE_DUPLICATES:
        notes.append(f"stopped: the space has no untried architectures left ({MAX_CONSECUTIVE_DUPLICATES} samples in "
                     "a row were architectures this study already trained or is training)")
    if (cfg.timeout is not None and objective.attempted < cfg.trials and not interrupted
            and search_seconds >= cfg.timeout):
        notes.append(f"--timeout {cfg.timeout:g}s reached after {objective.attempted} of {cfg.trials} trials")
    return notes


# ----------------------------------------------------------------------------------- multi-fidelity
def _fidelity(cfg: SearchConfig, multi: bool):
    """``(rungs, pruner)`` for ``cfg.fidelity`` (see :mod:`archspec.search.fidelity`).

    Raises:
        SpecError: ``--fidelity hyperband`` with ``--objective pareto`` (Optuna prunes single-objective
            studies only; the Pareto mode has archspec's successive halving, ``sha``), or bad rungs.
    """
    from archspec.search.fidelity import make_pruner, rung_schedule

    if cfg.fidelity == "zc":  # the zero-cost rung (CandidateObjective._zero_cost_rung), then full training
        return None, optuna.pruners.NopPruner()
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


def _zero_cost_summary(study, cfg: SearchConfig, objective) -> dict:
    """The zero-cost rung over the whole study (:func:`~archspec.search.fidelity.zero_cost_summary`), plus this
    run's counts."""
    from archspec.search.fidelity import zero_cost_summary

    scored = [{**t.user_attrs[ZERO_COST_ATTR],
               "accuracy": t.values[0] if t.state == TrialState.COMPLETE else None}
              for t in study.get_trials(deepcopy=False)
              if ZERO_COST_ATTR in t.user_attrs and "reused_from" not in t.user_attrs]
    return {**zero_cost_summary(scored, cfg.zc_score, cfg.eta), "scored_this_run": objective.zc_scored,
            "stopped_this_run": objective.stopped}


# ----------------------------------------------------------------------------------- the loop
def _study_attrs(space, cfg: SearchConfig, mode: str, extra_attrs: dict | None) -> dict:
    """The study's user attributes: what the run searched, how, on what (provenance; compared on resume)."""
    return {
        "mode": mode, "space": getattr(space, "name", "space"), "objective": cfg.objective,
        "budgets": cfg.budgets.describe(), "proxy": cfg.protocol.describe(),
        "latency_protocol": dataclasses.asdict(cfg.latency), "data": cfg.data or "embedded",
        "max_images": cfg.max_images, "seed": cfg.seed, "sampler": cfg.sampler, **(extra_attrs or {}),
    }


def _optimize(study: optuna.Study, objective: CandidateObjective, progress, cfg: SearchConfig,
              notes: list[str]) -> tuple[bool, float]:
    """Run Optuna's loop until :class:`StopRules` or ``--timeout`` stop it: ``(interrupted, seconds)``.

    Ctrl-C ends the loop, not the run: every finished trial is in the study and the results still get written."""
    stopper = StopRules(objective, cfg.trials, lambda t: progress.done(t, objective.attempted))
    interrupted = False
    start = time.perf_counter()
    if cfg.timeout is not None:
        objective.search_deadline = start + cfg.timeout
    try:
        with progress:
            study.optimize(objective, n_trials=None, timeout=cfg.timeout, callbacks=[stopper], catch=(Exception,),
                           gc_after_trial=False)  # StopRules collects after a trained candidate
    except KeyboardInterrupt:
        interrupted = True
        notes.append("interrupted: the study keeps every finished trial; re-run the same command to resume")
    return interrupted, time.perf_counter() - start


def _run_summary(mode: str, name: str, info, run_dir: Path, cfg: SearchConfig, data, rate: float,
                 objective: CandidateObjective, search_seconds: float, notes: list[str], interrupted: bool) -> dict:
    """This run's summary before the results are written (counts of this process; seconds; candidates per hour)."""
    return {
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
    }


def run_optuna_search(space: SearchSpace, cfg: SearchConfig, *, mode: str, name: str, extra_attrs: dict | None = None,
                      after_train: Callable | None = None, finalize_extra: Callable | None = None,
                      train_fn: Callable | None = None) -> SearchOutcome:
    """Run (or resume) an Optuna search of ``space`` and write the run directory.

    Args:
        space: a :class:`~archspec.search.space.SearchSpace`.
        cfg: the settings.
        mode: label for the summary ("design" or "masks/optuna").
        name: the study name.
        extra_attrs: more study attributes (provenance).
        after_train: ``f(trial, spec, result)`` after a successful proxy training (mode 2 stores ALS).
        finalize_extra: ``f(study, run_dir, summary, files, best_file)`` adds files / summary entries; a path it
            returns replaces ``best_file``.
        train_fn: replaces :func:`~archspec.search.proxy.train_proxy` (same signature).

    Every input (options, budgets, space, data -- every image decoded --, ``--out``, ``--storage``)
    is checked before the run directory, the study or any file is created.

    Raises:
        SpecError: bad input (budgets, space, data, run directory, storage); nothing is written then.
    """
    from archspec.search.budget import static_check_rate
    from archspec.search.latency import LatencyCache

    quiet_optuna()
    cfg = complete_config(cfg)  # a SearchConfig left with budgets / protocols None or dicts: the defaults
    wall_start = time.perf_counter()
    multi = cfg.objective == "pareto"
    directions = ["maximize", "minimize"] if multi else ["maximize"]
    metric_names = ["accuracy", "latency_ms"] if multi else ["accuracy"]
    data, sampler, oracle = _preflight(space, cfg, name, len(directions))
    rate = static_check_rate(space, cfg.budgets, n=200, seed=cfg.seed)
    attrs = _study_attrs(space, cfg, mode, extra_attrs)
    rungs, pruner = _fidelity(cfg, multi)
    if rungs is not None:  # every rung is an evaluation point: multiples of the first rung, and the end
        cfg = dataclasses.replace(cfg, protocol=dataclasses.replace(cfg.protocol, eval_every=rungs.min_steps))
        attrs["proxy"], attrs["fidelity"] = cfg.protocol.describe(), {"kind": cfg.fidelity, **rungs.describe()}
    elif not (cfg.prune and not multi):  # nothing reads an accuracy before the end: evaluate there only
        cfg = dataclasses.replace(cfg, protocol=dataclasses.replace(cfg.protocol, eval_every=cfg.protocol.steps))
        attrs["proxy"] = cfg.protocol.describe()
    run_dir, info, study = open_run(cfg, name, directions, metric_names, attrs, sampler, pruner)
    notes = _settings_notes(study, attrs) + zombie_notes(study)

    progress = report.ProgressDisplay(cfg.trials, cfg.progress, len(directions), cfg.timeout)
    objective = CandidateObjective(space, data, cfg, LatencyCache(run_dir / "latency.json"), len(directions),
                                   on_status=progress.status, after_train=after_train, train_fn=train_fn,
                                   oracle=oracle)
    objective.rungs = rungs
    interrupted, search_seconds = _optimize(study, objective, progress, cfg, notes)
    notes += stop_notes(objective, cfg, interrupted, search_seconds)
    summary = _run_summary(mode, name, info, run_dir, cfg, data, rate, objective, search_seconds, notes, interrupted)
    summary["fidelity"] = _fidelity_summary(study, cfg, rungs, objective)
    if oracle is not None:
        summary["oracle"] = oracle.describe()
    if cfg.fidelity == "zc":
        summary["zero_cost"] = _zero_cost_summary(study, cfg, objective)
    with run_lock(run_dir):
        best_file = report.write_results(study, space, cfg, run_dir, info, summary, multi, finalize_extra)
    summary["wall_seconds"] = round(time.perf_counter() - wall_start, 2)
    runs.atomic_write_text(run_dir / "summary.json", report.summary_json(summary))
    return SearchOutcome(study, summary, run_dir, interrupted, best_file)
