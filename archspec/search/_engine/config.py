"""The settings and the result of one search run: :class:`SearchConfig`, :class:`SearchOutcome`, the defaults.

Imports neither Optuna nor torch; the defaults themselves live in :mod:`archspec.search._engine.defaults`
(stdlib only, re-exported here), so the command line builds its parser and prints them in ``--help`` without
importing even the spec parser.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from archspec.ir.checked import load_spec
from archspec.search._engine.defaults import (
    BUDGET_OPTIONS,
    DEFAULT_FIDELITY,
    DEFAULT_SAMPLER,
    DEFAULT_SAMPLER_STARTUP,
    DEFAULT_TIMEOUT_S,
    DEFAULT_TRIAL_TIMEOUT_S,
    DEFAULT_TRIALS,
    DEFAULT_VERIFY,
    FIDELITIES,
    MASKS_PROXY_DEFAULTS,
    MASKS_TRIAL_TIMEOUT_S,
    SAMPLERS,
    ZERO_COST_ATTR,
    ZERO_COST_RANKINGS,
)
from archspec.search._evaluation.budget import Budgets, parse_quantity
from archspec.search._evaluation.protocols import LatencyProtocol, ProxyProtocol

__all__ = [
    "SearchConfig", "SearchOutcome", "complete_config", "FIDELITIES", "ZERO_COST_RANKINGS", "DEFAULT_FIDELITY",
    "DEFAULT_TRIALS", "DEFAULT_TIMEOUT_S", "DEFAULT_TRIAL_TIMEOUT_S", "BUDGET_OPTIONS",
    "ZERO_COST_ATTR", "MASKS_PROXY_DEFAULTS", "MASKS_TRIAL_TIMEOUT_S", "warmup_warning", "SAMPLERS",
    "DEFAULT_SAMPLER", "DEFAULT_SAMPLER_STARTUP", "DEFAULT_VERIFY",
]

@dataclass
class SearchConfig:
    """Everything a search run needs (built by the CLI from its options).

    Units: ``timeout`` and ``trial_timeout`` in seconds (``None``: no limit); ``max_images`` a count of
    images; ``min_steps`` proxy optimizer steps.  ``budgets`` is an :class:`archspec.search._evaluation.budget.Budgets`
    (MACs per image, parameters, latency in ms, memory in bytes), ``protocol`` an
    :class:`archspec.search._evaluation.proxy.ProxyProtocol`, ``latency`` an
    :class:`archspec.search._evaluation.latency.LatencyProtocol`.
    ``budgets``, ``protocol`` and ``latency`` may also be dicts of their fields (a budget as a number or a
    quantity such as ``"1G"``), or ``None`` for the defaults; :func:`complete_config` makes the objects.
    Nothing else is checked here: :func:`archspec.search._engine.loop.run_sampled` checks every field before
    it writes anything.
    """

    budgets: Any = None                             # archspec.search.Budgets (None: unconstrained)
    protocol: Any = None                            # archspec.search.ProxyProtocol (None: its defaults)
    latency: Any = None                             # archspec.search.LatencyProtocol (None: LeViT's CPU)
    study_name: str | None = None
    out: Path | None = None
    storage: str | None = None
    objective: str = "pareto"                       # "pareto" | "accuracy"
    trials: int = DEFAULT_TRIALS
    timeout: float | None = DEFAULT_TIMEOUT_S
    seed: int = 0
    sampler: str = DEFAULT_SAMPLER
    sampler_startup: int = DEFAULT_SAMPLER_STARTUP  # random trials before the model (Optuna's n_startup_trials)
    space: Any = None                               # path, dict or None (embedded default)
    data: str | None = None
    max_images: int | None = None
    progress: bool = True
    prune: bool = False                             # MedianPruner on intermediate accuracy (single objective only)
    fidelity: str = DEFAULT_FIDELITY                # none | zc | sha | hyperband (archspec.search._engine.fidelity)
    eta: int = 3                                    # its reduction factor (zc: train the top 1/eta)
    zc_score: str = "synflow"                       # the zero-cost rung's ranking score (ZERO_COST_RANKINGS)
    min_steps: int | None = None                    # its first rung (default: proxy steps / eta**2)
    trial_timeout: float | None = DEFAULT_TRIAL_TIMEOUT_S  # per-candidate training limit (FAIL beyond it)
    oracle: Any = None                              # a table (path or shipped name): answers instead of training
    oracle_subset: bool = False                     # search only the table's designs (others: infeasible)
    verify: int = DEFAULT_VERIFY                    # front designs re-trained with a second seed (0: none)
    strata: int | None = None                       # sampler "strata": cost strata (None: trials less verify)


def complete_config(cfg: SearchConfig | None = None, **options: Any) -> SearchConfig:
    """``cfg`` (or a fresh :class:`SearchConfig`) with ``options`` replaced and budgets / protocols made objects.

    ``budgets={"macs": "1G"}`` becomes ``Budgets(macs=1e9)``; ``protocol={"steps": 50}`` a
    :class:`~archspec.search._evaluation.proxy.ProxyProtocol` with that field changed; ``None`` the defaults.

    Raises:
        TypeError: an unknown option or field name.
        SpecError: a budget that is not a quantity (located at its field, ``budgets.macs``; the command line
            names its option).
    """

    cfg = SearchConfig(**options) if cfg is None else replace(cfg, **options)
    budgets = cfg.budgets
    if budgets is None or isinstance(budgets, dict):
        budgets = Budgets(**{k: None if v is None else parse_quantity(v, ("budgets", k))
                             for k, v in (budgets or {}).items()})
    protocol = (cfg.protocol if not isinstance(cfg.protocol, dict | None)
                else ProxyProtocol.from_dict(cfg.protocol or {}))
    latency = cfg.latency if not isinstance(cfg.latency, dict | None) else LatencyProtocol.from_dict(cfg.latency or {})
    return replace(cfg, budgets=budgets, protocol=protocol, latency=latency)


def warmup_warning(protocol: Any) -> str | None:
    """A warning when the proxy's warm-up is longer than its training (the learning rate never peaks), else None."""
    if protocol.warmup_steps <= protocol.steps:
        return None
    return (f"warning: the proxy's learning-rate warm-up ({protocol.warmup_steps} steps) is longer than its training "
            f"(--proxy-steps {protocol.steps}): the learning rate never reaches its peak {protocol.lr:g}; "
            f"use --proxy-steps {protocol.warmup_steps} or more")


@dataclass
class SearchOutcome:
    """What a search run returns.

    Attributes:
        study: the ``optuna.Study`` (every worker's trials, not only this run's).
        summary: the JSON-ready summary, as written to ``summary.json``.
        run_dir: the run directory.
        interrupted: Ctrl-C stopped the run (the CLI exits 130; the same command resumes).
        best_file: ``best.yaml``'s path, ``None`` when nothing usable was trained (the CLI exits 1).
        best_spec: the best spec (:class:`~archspec.spec.ArchSpec`, read from ``best.yaml``), or ``None``.
        pareto_specs: the Pareto front's specs, most accurate first (with ``objective="accuracy"``: the best
            spec alone); each carries its provenance in ``description``.
    """

    study: Any
    summary: dict
    run_dir: Path
    interrupted: bool = False
    best_file: Path | None = None

    @property
    def best_spec(self) -> Any:
        """The spec of ``best.yaml``, loaded and checked (``None`` when none was written)."""

        return None if self.best_file is None else load_spec(str(self.best_file))

    @property
    def pareto_specs(self) -> list:
        """The specs of ``pareto/`` in rank order (most accurate first); ``[best_spec]`` for one objective."""
        if "pareto" not in self.summary:
            return [] if self.best_file is None else [self.best_spec]
        return [load_spec(str(self.run_dir / point["file"])) for point in self.summary["pareto"]]
