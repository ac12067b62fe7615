"""The plots of a search (PNG, written atomically): :func:`plot_pareto`, :func:`plot_history`,
:func:`plot_als_heatmap`.  matplotlib (Agg) loads when a plot is drawn; Optuna (and numpy with it) is imported at
the top, as by every module of the report (:mod:`~archspec.search._report.results` imports this one).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import optuna

from archspec.search._report import run_files

__all__ = ["plot_pareto", "plot_history", "plot_als_heatmap"]


def _pyplot():
    import matplotlib  # noqa: PLC0415 - rich/optuna/matplotlib load when a report is written

    if matplotlib.get_backend().lower() != "agg":
        try:
            matplotlib.use("Agg", force=True)
        except Exception:  # noqa: BLE001 - an interactive backend already in use: plotting still works
            pass
    import matplotlib.pyplot as plt  # noqa: PLC0415 - rich/optuna/matplotlib load when a report is written

    return plt


def _subset_study(trials: Sequence, directions: Sequence[str], metric_names: Sequence[str] | None):
    """An in-memory study holding only ``trials`` (the plots show the trained, feasible ones)."""
    study = optuna.create_study(directions=list(directions))
    if metric_names:
        study.set_metric_names(list(metric_names))
    study.add_trials(trials)
    return study


def plot_pareto(trials: Sequence, path: Path, directions: Sequence[str], names: Sequence[str],
                title: str) -> Path | None:
    """Pareto front of the trained trials (``optuna.visualization.matplotlib.plot_pareto_front``), as PNG;
    ``None`` (nothing written) without trials."""
    if not trials:
        return None
    plt = _pyplot()
    study = _subset_study(trials, directions, names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ax = optuna.visualization.matplotlib.plot_pareto_front(study, target_names=list(names))
    return _save_axes(ax, title, path, plt)


def _save_axes(ax, title: str, path: Path, plt) -> Path:
    """Title the Optuna plot's axes, write its figure atomically as PNG, and close it."""
    ax.set_title(title)
    try:
        run_files.atomic_savefig(ax.figure, path)
    finally:
        plt.close(ax.figure)
    return path


def plot_history(trials: Sequence, path: Path, direction: str, name: str, title: str) -> Path | None:
    """Optimisation history of a single-objective study (``plot_optimization_history``), as PNG; ``None``
    (nothing written) without trials."""
    if not trials:
        return None
    plt = _pyplot()
    study = _subset_study(trials, [direction], [name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ax = optuna.visualization.matplotlib.plot_optimization_history(study, target_name=name)
    return _save_axes(ax, title, path, plt)


def plot_als_heatmap(als: dict[str, Sequence[float]], path: Path, title: str,
                     masked: dict[str, Sequence[bool]] | None = None,
                     thresholds: tuple[float, float] | None = None) -> Path:
    """Heatmap of ALS (MaiT eq. 3, on [0, 1]) per layer (rows) x head (columns); masked heads are marked 'M'.

    ``als`` maps a layer label to one score per head (layers may differ in head count: blanks);
    ``thresholds`` = (high, low) of the ALS strategy, explained under the title.  Returns ``path``.
    """
    plt = _pyplot()
    labels = list(als)
    width = max((len(v) for v in als.values()), default=1)
    grid = np.full((len(labels), width), np.nan)
    for i, label in enumerate(labels):
        grid[i, : len(als[label])] = list(als[label])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * width, 1.0 + 0.32 * len(labels)))
    image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    for i, label in enumerate(labels):
        for j, value in enumerate(als[label]):
            flag = "M " if masked and label in masked and j < len(masked[label]) and masked[label][j] else ""
            ax.text(j, i, f"{flag}{value:.2f}", ha="center", va="center", fontsize=7,
                    color="white" if value < 0.6 else "black")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xticks(range(width), [f"head {j}" for j in range(width)], fontsize=8)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    text = title
    if thresholds:
        text += f"\n(ALS >= {thresholds[0]:g}: mask all heads; <= {thresholds[1]:g}: remove; M = masked)"
    ax.set_title(text, fontsize=9)
    fig.colorbar(image, ax=ax, label="attention locality score")
    try:
        run_files.atomic_savefig(fig, path)
    finally:
        plt.close(fig)
    return path
