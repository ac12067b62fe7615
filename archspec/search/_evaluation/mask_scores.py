"""Scores read off a trained model for mask placement (torch): ALS per head, its uniform baseline, learned alphas.

The model side of :mod:`archspec.search._modes.masks`: :func:`layer_scores` (MaiT eq. 3 per head, by
:func:`archspec.diagnostics.metrics.layer_als`), :func:`uniform_baselines` (what uniform attention scores on each
layer's grid) and :func:`learned_alphas` (sec. 4.3's soft-mask alphas, eq. 4), keyed ``(stage, layer)`` like a
placement.
"""

from __future__ import annotations

from typing import Any

import torch

from archspec.diagnostics.metrics import attention_locality_score, layer_als, patch_window_mask
from archspec.families.attention.module import Attention
from archspec.search._evaluation import proxy
from archspec.search._space.mask_placement import token_stages
from archspec.spec import ArchSpec

__all__ = ["ALS_IMAGES", "als_images", "attention_modules", "layer_scores", "uniform_baselines", "learned_alphas",
           "train_keeping_model"]

ALS_IMAGES = 128  # held-out images the ALS is averaged over


def als_images(data, result) -> torch.Tensor:
    """The first :data:`ALS_IMAGES` validation images at the input size the proxy in ``result`` was trained at.

    ``data`` is the search's dataset, decoded at ``protocol.image_size``; the proxy's input size is its geometry's
    (:func:`archspec.search._evaluation.proxy.proxy_spec`: the size that gives the candidate its token grid, which is
    ``protocol.image_size`` only by chance -- 64 px for MaiT's 224 px specs at ``min_grid`` 8, 32 px for a 32 px
    spec), so the images are resized to it (``Dataset.at_size``, kept for reuse).  Returns ``(n, C, H, W)``.
    """
    return data.at_size(result.geometry.image_size).val.tensors[0][:ALS_IMAGES]


def attention_modules(model) -> dict[tuple[int, int], Any]:
    """(stage, layer) -> the block's :class:`~archspec.families.attention.module.Attention` module."""
    out = {}
    tokens = set(token_stages(model.spec))
    for s, stage in enumerate(model.stages):
        if s not in tokens:  # a conv stage (attention inside a bottleneck takes no MaiT mask)
            continue
        for l, block in enumerate(stage.blocks):
            for module in block.modules():
                if isinstance(module, Attention):
                    out[(s, l)] = module
                    break
    return out


def layer_scores(model, images, window: tuple[int, int]) -> dict[tuple[int, int], list[float]]:
    """ALS per head of every attention layer (:func:`archspec.diagnostics.metrics.layer_als`), keyed by
    ``(stage, layer)``."""
    modules = attention_modules(model)
    by_id = {id(m): key for key, m in modules.items()}
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            raw = layer_als(model, images, window=window)
    finally:
        model.train(was)
    out = {}
    for name, values in raw.items():
        key = None
        try:
            key = by_id.get(id(model.get_submodule(name)))
        except AttributeError:
            pass
        if key is None:  # names such as "stages.0.blocks.3" (the block, not its attention module)
            try:
                sub = model.get_submodule(name)
                key = next((by_id[id(m)] for m in sub.modules() if id(m) in by_id), None)
            except AttributeError:
                key = None
        if key is not None:
            out[key] = [float(v) for v in values.detach().flatten().tolist()]
    return out


def uniform_baselines(model, window: tuple[int, int]) -> dict[tuple[int, int], float]:
    """ALS a head would score with uniform attention (every token weight ``1/N``), per attention layer.

    ``ALS_uniform = mean over patch queries of |window neighbours| / N``: 0.05 on MaiT's 14x14 grid with
    a 3x3 window and a class token, but 0.37 on a 4x4 proxy grid -- the level "no locality" sits at.
    Computed with :func:`archspec.diagnostics.metrics.attention_locality_score` on a uniform map.
    """
    out = {}
    for key, module in attention_modules(model).items():
        n = module.num_tokens
        mask = patch_window_mask(module.grid, window, module.num_prefix_tokens)
        uniform = torch.full((1, 1, n, n), 1.0 / n)
        out[key] = float(attention_locality_score(uniform, mask, module.num_prefix_tokens)[0])
    return out



def learned_alphas(model) -> dict[tuple[int, int], list[float | None]]:
    """Learned soft-mask alpha per head (None for heads without a soft mask in the trained model)."""
    out = {}
    for key, module in attention_modules(model).items():
        values: list[float | None] = [None] * module.num_heads
        alpha = module.mask_alpha()
        alpha = alpha.detach() if alpha is not None else None
        if alpha is not None:
            for i, head in enumerate(module.soft_heads):
                values[head] = float(alpha[i])
        out[key] = values
    return out


def train_keeping_model(spec: ArchSpec, data, protocol, seed: int, report=None, progress: str | None = None):
    """``train_proxy`` and the trained model (eval mode): ``(result, model)``; ``progress`` labels the loop's
    progress lines on stderr (``None``: silent)."""
    result = proxy.train_proxy(spec, data, protocol, seed=seed, report=report, progress=progress)
    return result, result.model
