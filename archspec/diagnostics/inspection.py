"""``archspec inspect``: attention diagnostics of a model on real photographs, as PNG plots and JSON.

For a spec (random initialisation from its seed) or a saved model directory, one forward pass over
real images gives every self-attention layer's maps (attention inside BoTNet / T-CNN bottlenecks included, on the
map's pixels: :func:`archspec.diagnostics.metrics.attention_layers`); from them:

* ALS (MaiT eq. 3): per layer and head, the attention mass a patch puts inside its window
  (:func:`archspec.diagnostics.metrics.attention_locality_score` with a spatial window mask);
* nonlocality (ConViT eq. 8): per layer and head, the attention-weighted distance in patches;
* gating (ConViT eq. 7): ``sigmoid(lambda_h)`` of every GPSA head (none for models without GPSA);
* cross-layer similarity (MaiT App. A.3 eq. 5): per head, the ``L x L`` cosine similarity of the
  layers' attention rows, averaged over tokens and images.  Layers are compared within runs of
  consecutive layers whose maps have the same shape (one run for DeiT/MaiT/CaiT/ConViT; one per
  stage for LeViT).

The output directory follows :mod:`archspec.io.builddir`'s rules with the layout :data:`INSPECT`:
missing or empty directories are filled, an earlier ``archspec inspect`` output is replaced
atomically, anything else is refused and left untouched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from matplotlib.figure import Figure  # the Agg canvas; no pyplot, no display
from matplotlib.ticker import MaxNLocator
from torch import Tensor, nn

from archspec.diagnostics.metrics import (
    attention_layers,
    attention_locality_score,
    cross_layer_similarity,
    layer_gating,
    layer_gauss,
    nonlocality,
    patch_window_mask,
)
from archspec.families.attention.tables import squared_distances
from archspec.io.builddir import Layout
from archspec.io.images import load_image, sample_batch

REPORT = "inspect.json"
PLOTS = ("als.png", "nonlocality.png", "gating.png", "similarity.png")
INSPECT = Layout(frozenset({REPORT, *PLOTS}), REPORT)

__all__ = ["diagnose", "write_plots", "INSPECT", "PLOTS", "REPORT"]


def _similarity_runs(names: list[str], maps: list[Tensor], prefixes: list[int]) -> list[dict]:
    """Cross-layer similarity within runs of consecutive layers whose maps have one shape.

    A run whose layers differ only in prefix tokens (ConViT's late class token) compares patch blocks.
    """
    full = [m[..., p:, p:] if len({t.shape for t in maps}) > 1 else m for m, p in zip(maps, prefixes)]
    runs: list[list[int]] = []
    for k, m in enumerate(full):
        if runs and full[runs[-1][-1]].shape == m.shape:
            runs[-1].append(k)
        else:
            runs.append([k])
    out = []
    for run in runs:
        sim = cross_layer_similarity([full[k] for k in run]).mean(dim=(0, 4))  # (H, L, L)
        out.append({"layers": [names[k] for k in run], "per_head": sim.tolist()})
    return out


@torch.no_grad()
def diagnose(model: nn.Module, images: Tensor, window: tuple[int, int] = (3, 3)) -> dict:
    """The four diagnostics of ``model`` on ``images`` ``(B, C, H, W)`` as plain numbers (JSON-ready).

    Returns ``{"window", "layers": [{"name", "grid", "heads", "als": (H,), "nonlocality": (H,) in patches,
    "gating": (n_gpsa,) or None, "gauss": {"alpha": (n_gauss,), "sigma": (n_gauss,) in patches} or None}],
    "similarity": [{"layers", "per_head": (H, L, L)}]}`` (``gauss``: :func:`~.metrics.layer_gauss`).

    Raises:
        ValueError: the model has no self-attention layer.
    """
    found = attention_layers(model, images)
    if not found:
        raise ValueError("the model has no self-attention layer to inspect")
    gates, gauss = layer_gating(model), layer_gauss(model)
    layers = []
    for name, layer in found.items():
        attn = layer.attn
        mask = patch_window_mask(layer.grid, window, layer.num_prefix_tokens).to(attn.device)
        layers.append({
            "name": name, "grid": list(layer.grid), "heads": layer.letters,
            "als": attention_locality_score(attn, mask, layer.num_prefix_tokens).tolist(),
            "nonlocality": nonlocality(attn, layer.grid, layer.num_prefix_tokens).tolist(),
            "gating": gates[name].tolist() if name in gates else None,
            "gauss": ({"alpha": gauss[name][:, 0].tolist(), "sigma": gauss[name][:, 1].tolist()}
                      if name in gauss else None),
        })
    prefixes = [layer.num_prefix_tokens for layer in found.values()]
    return {"window": list(window), "layers": layers,
            "similarity": _similarity_runs(list(found), [layer.attn for layer in found.values()], prefixes)}


def _per_head_lines(ax, layers: list[dict], key: str, ylabel: str) -> None:
    """One line per head index over the layers (a layer with fewer heads leaves a gap)."""
    width = max(len(row[key]) for row in layers)
    for h in range(width):
        ys = [row[key][h] if h < len(row[key]) else math.nan for row in layers]
        ax.plot(range(len(layers)), ys, marker="o", markersize=3, label=f"head {h}")
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small", ncol=min(width, 4))


def _figure(title: str, ncols: int = 1):
    fig = Figure(figsize=(max(6.0, 3.2 * ncols), 4.0), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    fig.suptitle(title)
    return fig, axes


def _plot_gating(path: Path, name: str, layers: list[dict]) -> None:
    gated = [row for row in layers if row["gating"] is not None]
    fig, (ax,) = _figure(f"{name}: GPSA gating sigmoid(lambda) (ConViT eq. 7)")
    if gated:
        _per_head_lines(ax, gated, "gating", "weight of positional attention")
        ax.set_xticks(range(len(gated)), [row["name"].rsplit(".attn", 1)[0] for row in gated], rotation=90,
                      fontsize="x-small")
        ax.set_ylim(0, 1)
    else:
        ax.text(0.5, 0.5, "no GPSA heads in this model", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
    fig.savefig(path, dpi=100)


def _plot_similarity(path: Path, name: str, runs: list[dict]) -> None:
    run = max(runs, key=lambda r: len(r["layers"]))  # the longest run of comparable layers
    sims = torch.tensor(run["per_head"])
    fig, axes = _figure(f"{name}: cross-layer similarity of attention maps (MaiT eq. 5), "
                        f"{len(run['layers'])} layers", ncols=sims.shape[0])
    low = min(0.0, float(sims.min()))
    for h, ax in enumerate(axes):
        image = ax.imshow(sims[h].numpy(), vmin=low, vmax=1.0, cmap="viridis", origin="lower")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"head {h}")
        ax.set_xlabel("layer j")
        ax.set_ylabel("layer i")
    fig.colorbar(image, ax=list(axes), shrink=0.8)
    fig.savefig(path, dpi=100)


def _uniform_distance(grid: tuple[int, int]) -> float:
    """ConViT eq. 8's nonlocality of uniform attention on ``grid``: the mean distance between two patches."""
    return float(squared_distances(grid).double().sqrt().mean())


def write_plots(report: dict, directory: str | Path, name: str) -> None:
    """Write :data:`PLOTS` for a :func:`diagnose` report into ``directory`` (matplotlib, Agg canvas)."""
    directory = Path(directory)
    layers, (rows, cols) = report["layers"], report["window"]
    # Fixed scales from 0, so that noise at random init does not look like structure: ALS is a share of
    # attention, in [0, 1]; nonlocality runs up to what uniform attention on the largest grid gives.
    fig, (ax,) = _figure(f"{name}: attention locality score (MaiT eq. 3)")
    _per_head_lines(ax, layers, "als", f"ALS ({rows}x{cols} window)")
    ax.set_ylim(0, 1)
    fig.savefig(directory / "als.png", dpi=100)
    fig, (ax,) = _figure(f"{name}: nonlocality (ConViT eq. 8)")
    _per_head_lines(ax, layers, "nonlocality", "mean attention distance (patches)")
    uniform = max(_uniform_distance(tuple(row["grid"])) for row in layers)
    ax.axhline(uniform, color="grey", linestyle="--", linewidth=1)
    ax.annotate("uniform attention", (0, uniform), textcoords="offset points", xytext=(2, 3), fontsize="small",
                color="grey")
    top = max([uniform, *(v for row in layers for v in row["nonlocality"])])
    ax.set_ylim(0, 1.1 * top if top > 0 else 1)
    fig.savefig(directory / "nonlocality.png", dpi=100)
    _plot_gating(directory / "gating.png", name, layers)
    _plot_similarity(directory / "similarity.png", name, report["similarity"])


def image_batch(paths: Sequence[str] | None, resolution: tuple[int, int], channels: int) -> tuple[Tensor, list[str]]:
    """The images to run: the given files (each through :func:`archspec.io.images.load_image`), or the three
    shipped photographs (:func:`archspec.io.images.sample_batch`).  Returns ``(batch, names)``.

    Raises:
        SpecError: an unreadable or unsafe image file (located at ``--image``).
    """

    if paths:
        return torch.cat([load_image(p, resolution, channels) for p in paths]), [str(p) for p in paths]
    return sample_batch(resolution, channels), ["grace_hopper (matplotlib)", "china (scikit-learn)",
                                                "flower (scikit-learn)"]
