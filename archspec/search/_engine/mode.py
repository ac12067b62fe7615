"""The contract between the search engine and a search mode, as Optuna's ``BaseSampler`` is between a study and
its sampler.

A search mode (mode 1's design search, mode 2's ``optuna``, ``als`` and ``soft`` mask placements) states
three things and nothing else; the engine (:mod:`archspec.search._engine.loop`) owns the rest -- the preflight
checks, the run directory and its lock, the study, the trial bookkeeping (states, failures, deadlines), the
stop rules, trials.csv and summary.json:

1. **what it samples or proposes.**  A :class:`SampledMode` gives a search space (``space``); the study's
   sampler (TPE, random, ...) draws each candidate from it with ``space.sample(trial)``, and the engine's
   objective (:class:`~archspec.search._engine.objective.CandidateObjective`) checks it statically against the
   budgets, measures its latency and trains it.  A :class:`RoundsMode` proposes each candidate itself from
   what the earlier ones taught it (:meth:`RoundsMode.propose` -> a :class:`Candidate`, or ``None`` when
   done); the engine asks the study for a trial per candidate and tells it the result (Optuna's ask/tell).
2. **how one trial is evaluated.**  :meth:`SearchMode.train` trains a candidate's proxy (by default
   :func:`archspec.search._evaluation.proxy.train_proxy`, looked up at each call) and :meth:`SearchMode.after_train`
   reads the trained result onto the trial (mask placement: the ALS of every head).
3. **what it writes at the end.**  :meth:`SampledMode.finish` adds its own files after the engine wrote the
   best / Pareto specs; a rounds mode writes its results itself (:meth:`RoundsMode.summary`,
   :meth:`RoundsMode.write_results`), under the run directory's lock.

The engine entry points are :func:`archspec.search._engine.loop.run_sampled` and
:func:`archspec.search._engine.loop.run_rounds`.  The contract lives beside the loop, as ``BaseSampler`` lives with
Optuna's samplers: the engine imports nothing of the modes (:mod:`archspec.search._modes`), they import the engine.
This module imports neither torch nor Optuna.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the study, the space and the data import Optuna / torch-side modules
    import optuna

    from archspec.io.datasets import Dataset
    from archspec.search._engine.config import SearchConfig
    from archspec.search._space.language import SearchSpace
    from archspec.search._storage import StorageInfo
    from archspec.spec import ArchSpec

__all__ = ["SearchMode", "SampledMode", "RoundsMode", "Candidate", "RoundResult", "RunContext"]


class SearchMode:
    """What every search mode tells the engine (every method has a default; subclass a :class:`SampledMode` or a
    :class:`RoundsMode`).

    Attributes:
        label: the mode's name in ``summary.json`` and the study's ``mode`` attribute (``design``,
            ``masks/optuna``, ``masks/als``, ``masks/soft``).
    """

    label: str = "search"

    def study_attrs(self) -> dict[str, Any]:
        """Study user attributes this mode adds (provenance, compared when a study is resumed); default none."""
        return {}

    def train(self, spec: ArchSpec, data: Dataset, protocol, seed: int = 0,
              report: Callable[[int, float], None] | None = None, on_model: Callable | None = None,
              progress: str | None = None):
        """Train the proxy of ``spec`` on ``data`` under ``protocol`` (a
        :class:`~archspec.search._evaluation.proxy.ProxyProtocol`).

        ``report(step, val_accuracy)`` hears every evaluation point; ``on_model(model)`` gets the built model
        (the engine's deadline hook); ``progress`` labels progress lines on stderr.  Returns a
        :class:`~archspec.search._evaluation.proxy.ProxyResult` (``accuracy``, ``val_loss``, ``train_loss``,
        ``model``...).

        Raises:
            archspec.train.failures.TrainingFailure: the candidate could not be trained (the engine records a FAIL).
        """

        kwargs = {} if progress is None else {"progress": progress}
        if on_model is not None:
            kwargs["on_model"] = on_model
        from archspec.search._evaluation import proxy  # noqa: PLC0415 - torch-side; looked up per call (tests replace train_proxy)

        return proxy.train_proxy(spec, data, protocol, seed=seed, report=report, **kwargs)

    def after_train(self, trial: optuna.trial.Trial, spec: ArchSpec, result) -> Any:
        """Called after a successful training of ``spec`` with its ``result``; may set user attrs on ``trial``.

        What it returns reaches a rounds mode as :attr:`RoundResult.extra`.  An exception fails the trial
        (catch it here to keep a trained trial).  Default: nothing."""
        return None


class SampledMode(SearchMode):
    """A mode whose candidates the study's sampler draws from a search space (mode 1; mode 2 ``optuna``).

    Attributes:
        space: the :class:`~archspec.search.SearchSpace` sampled (``space.sample(trial)`` -> ``ArchSpec``).
    """

    space: SearchSpace

    def finish(self, study: optuna.Study, run_dir: Path, summary: dict, files: list[str],
               best_file: Path | None) -> Path | None:
        """Write the mode's own files after trials.csv and the best / Pareto specs, under the run lock.

        Append their names to ``files`` and entries to ``summary`` (written as summary.json afterwards); a path
        returned replaces ``best_file`` (``best.yaml``).  Default: nothing, ``None``."""
        return None


@dataclass
class Candidate:
    """One candidate a :class:`RoundsMode` proposes: ``spec`` trained as round ``round`` (1-based).

    ``attrs`` are user attributes the trial records first (before ``round``, ``spec``, ``macs``, ``params``);
    ``label`` names the round in notes (``round 2``); ``progress`` labels the training's progress lines
    (``None``: silent)."""

    spec: ArchSpec
    round: int
    label: str
    attrs: dict[str, Any] = field(default_factory=dict)
    progress: str | None = None


@dataclass
class RoundResult:
    """A trained round: its ``trial`` number, the proxy ``result`` and what ``after_train`` returned (``extra``)."""

    trial: int
    result: Any
    extra: Any = None


@dataclass
class RunContext:
    """The open run the engine hands a :class:`RoundsMode` (:meth:`RoundsMode.start`) before the first round.

    ``notes`` is the run's list of notes (summary.json's ``notes``): append to it; ``files`` the files written
    so far (names inside ``run_dir``); ``wall_start`` the ``time.perf_counter()`` the run started at."""

    name: str
    cfg: SearchConfig
    data: Dataset
    run_dir: Path
    info: StorageInfo
    study: optuna.Study
    notes: list[str]
    wall_start: float
    files: list[str] = field(default_factory=list)


class RoundsMode(SearchMode, abc.ABC):
    """A mode that proposes each candidate from the results so far (mode 2 ``als`` and ``soft``).

    The engine (:func:`~archspec.search._engine.loop.run_rounds`) opens the run, calls :meth:`start`, then
    repeatedly :meth:`propose` -> evaluates the candidate as one trial (latency, :meth:`train`,
    :meth:`after_train`) -> :meth:`observe`, until :meth:`propose` returns ``None``; then, under the run
    lock, :meth:`summary` and :meth:`write_results`, and writes summary.json.  Ctrl-C ends the rounds, not the run.
    """

    def start(self, run: RunContext) -> None:
        """Hear of the open run (its study, run directory and notes) before the first :meth:`propose`."""
        self.run = run

    @abc.abstractmethod
    def propose(self) -> Candidate | None:
        """The next candidate to train, or ``None`` when the mode has decided."""

    @abc.abstractmethod
    def observe(self, candidate: Candidate, outcome: RoundResult | None) -> None:
        """Learn from a trained ``candidate`` (``outcome``), or of its failure (``None``: the reason is already on
        the trial and in the notes)."""

    @abc.abstractmethod
    def summary(self, interrupted: bool) -> dict:
        """summary.json's leading entries (the engine adds ``wall_seconds`` and writes it)."""

    @abc.abstractmethod
    def write_results(self, summary: dict, interrupted: bool) -> Path | None:
        """Write the result files into the run directory (under its lock), completing ``summary``; return
        ``best.yaml``'s path, or ``None`` when no result was decided."""
