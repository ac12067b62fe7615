"""Mode 1 of ``archspec search``: design an architecture under MAC / parameter / latency budgets.

A thin client of :mod:`archspec.search._engine.loop`: :class:`DesignMode` is the
:class:`~archspec.search._engine.mode.SampledMode` of a design space (``--space``, default the embedded LeViT-family
space) with the engine's defaults for training and results; :func:`run_design` names the study after the
space, objective and budgets and hands the mode to :func:`~archspec.search._engine.loop.run_sampled`, which samples
candidates, rejects over-budget ones statically (never trained), measures latency, proxy-trains the rest and
writes the run directory.

Objectives: ``pareto`` (default) maximises proxy accuracy and minimises latency (a Pareto front under
``pareto/``); ``accuracy`` maximises accuracy alone, the budgets acting as constraints.
"""

from __future__ import annotations

from typing import Any

from archspec._util.units import human
from archspec.search._engine.config import SearchConfig, SearchOutcome, complete_config
from archspec.search._engine.loop import run_sampled
from archspec.search._engine.mode import SampledMode
from archspec.search._space.language import SearchSpace, load_space

__all__ = ["run_design", "default_study_name", "DesignMode"]


class DesignMode(SampledMode):
    """Mode 1: candidates sampled from ``space``, trained by :func:`~archspec.search._evaluation.proxy.train_proxy`;
    the engine
    writes the Pareto front / best spec, nothing more."""

    label = "design"

    def __init__(self, space: SearchSpace):
        self.space = space


def _tag(value: float) -> str:
    """``1e9`` -> ``1G``, ``2.5e6`` -> ``2p5M``: a count as a study-name fragment."""
    return human(value).replace(".00", "").replace(".", "p")


def default_study_name(space_name: str, objective: str, budgets) -> str:
    """``<space>-<objective>[-macs1G][-params5M][-lat20ms]``: re-running the same command resumes the same study.

    ``budgets`` is an :class:`~archspec.search._evaluation.budget.Budgets`; the name keeps ``[A-Za-z0-9_.-]`` only, at
    most
    80 characters.  Raises nothing."""
    parts = [space_name, objective]
    if budgets.macs:
        parts.append(f"macs{_tag(budgets.macs)}")
    if budgets.params:
        parts.append(f"params{_tag(budgets.params)}")
    if budgets.latency_ms:
        parts.append(f"lat{budgets.latency_ms:g}ms".replace(".", "p"))
    name = "-".join(parts)
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)[:80]


def run_design(cfg: SearchConfig | None = None, /, **options: Any) -> SearchOutcome:
    """Mode 1: design under budgets (``archspec search --budget-flops 1G``), from Python.

    ``cfg`` is a :class:`~archspec.search._engine.config.SearchConfig`; ``options`` replace its fields (or make one):
    ``run_design(budgets={"macs": "1G"}, trials=8, out="runs", fidelity="zc")``.  Returns a
    :class:`~archspec.search._engine.config.SearchOutcome`: ``.study`` (the ``optuna.Study``), ``.pareto_specs``,
    ``.best_spec``, ``.summary`` (what ``summary.json`` holds) and ``.run_dir``.

    Raises:
        TypeError: an unknown option.
        SpecError: a bad space file, or any input :func:`~archspec.search._engine.loop.run_sampled` refuses;
            nothing is written then.
    """
    cfg = complete_config(cfg, **options)
    space = load_space(cfg.space)
    name = cfg.study_name or default_study_name(space.name, cfg.objective, cfg.budgets)
    return run_sampled(DesignMode(space), cfg, name)
