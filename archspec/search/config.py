"""The settings and the result of one search run: :class:`SearchConfig`, :class:`SearchOutcome`, the defaults.

Imports neither Optuna nor torch, so the command line (:mod:`archspec.search.cli`) can build its parser,
and print its defaults in ``--help``, without paying for either; :mod:`archspec.search.engine` re-exports
every name here as part of its public API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SearchConfig", "SearchOutcome", "DEFAULT_TRIALS", "DEFAULT_TIMEOUT_S", "DEFAULT_TRIAL_TIMEOUT_S",
           "BUDGET_OPTIONS"]

DEFAULT_TRIALS = 16          # trained candidates of the bare `archspec search --budget-flops 1G`
DEFAULT_TIMEOUT_S = 540.0    # ... or this many seconds of search, whichever comes first (2 CPU cores: < 10 min)
DEFAULT_TRIAL_TIMEOUT_S = 150.0  # one candidate's proxy training may take at most this long

# The command-line option of each budget, named in the error when no point of the space fits it.
BUDGET_OPTIONS = {"macs": "--budget-flops", "params": "--budget-params", "latency_ms": "--budget-latency"}


@dataclass
class SearchConfig:
    """Everything a search run needs (built by the CLI from its options).

    Units: ``timeout`` and ``trial_timeout`` in seconds (``None``: no limit); ``max_images`` a count of
    images; ``min_steps`` proxy optimizer steps.  ``budgets`` is an :class:`archspec.search.budget.Budgets`
    (MACs per image, parameters, latency in ms, memory in bytes), ``protocol`` an
    :class:`archspec.search.proxy.ProxyProtocol`, ``latency`` an :class:`archspec.search.latency.LatencyProtocol`.
    Nothing is checked here: :func:`archspec.search.engine.run_optuna_search` checks every field before it
    writes anything.
    """

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
    budget_options: dict = field(default_factory=lambda: dict(BUDGET_OPTIONS))


@dataclass
class SearchOutcome:
    """What a search run returns.

    Attributes:
        study: the ``optuna.Study`` (every worker's trials, not only this run's).
        summary: the JSON-ready summary, as written to ``summary.json``.
        run_dir: the run directory.
        interrupted: Ctrl-C stopped the run (the CLI exits 130; the same command resumes).
        best_file: ``best.yaml``'s path, ``None`` when nothing usable was trained (the CLI exits 1).
    """

    study: Any
    summary: dict
    run_dir: Path
    interrupted: bool = False
    best_file: Path | None = None
