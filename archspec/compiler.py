"""Step 3 of 3 (spec -> graph -> **compile**), the compiler: turn the IR into an :class:`~archspec.model.ArchModel`.

Each graph node becomes one module from :mod:`archspec.blocks`; the walk is in execution order and
runs under ``torch.manual_seed(spec.seed)`` inside a forked RNG, so the same spec gives bitwise
identical initial weights and the caller's random state is left untouched.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from archspec.blocks import (Attention, ConvStem, IdentityStem, LevitBlock, PatchStem, TransformerBlock,
                             ZeroPadTokens)
from archspec.errors import SpecError
from archspec.families import family
from archspec.graph import build_graph, check_memory, nodes_in_order
from archspec.loader import load_spec
from archspec.model import ArchModel, Stage, with_resolution
from archspec.spec import ArchSpec

ACTIVATIONS: dict[str, type[nn.Module]] = {"gelu": nn.GELU, "hardswish": nn.Hardswish, "relu": nn.ReLU}


def _stem(node: dict, spec: ArchSpec) -> nn.Module:
    stem = spec.stem
    if stem.kind == "patch":
        return PatchStem(spec.input.channels, spec.stages[0].dim, stem.patch_size, spec.input.resolution)
    if stem.kind == "identity":
        return IdentityStem(spec.input.channels, stem.patch_size)
    return ConvStem(spec.input.channels, node["config"]["channels"], ACTIVATIONS[stem.activation])


def _block(node: dict, spec: ArchSpec) -> nn.Module:
    cfg = node["config"]
    stage = spec.stages[cfg["stage"]]
    plan, dims, grid = cfg["plan"], cfg["dims"], cfg["grid"]
    act = ACTIVATIONS[stage.act]
    batchnorm = stage.norm == "batchnorm"
    pad = plan.mixer.pad_tokens
    if plan.mixer.kind == "conv":
        mixer: nn.Module = family("conv_mixer").build(stage.dim, plan.mixer.kernel, grid, spec.pixel_patch(plan.mixer))
    elif stage.talking_heads:  # CaiT (archspec/blocks/talking_heads.py)
        mixer = family("talking_heads").build(stage.dim, plan.heads, grid, cfg["n_prefix"], stage.qkv_bias)
    else:
        attn_grid = (grid[0] + 2 * pad, grid[1] + 2 * pad)
        mixer = Attention(
            stage.dim, plan.heads, attn_grid, num_prefix_tokens=cfg["n_prefix"], qk_dim=dims.qk_dim, v_dim=dims.v_dim,
            qkv_bias=stage.qkv_bias and not batchnorm, norm=stage.norm, proj_act=act if batchnorm else None,
        )
        if pad:  # CMHSA App. A.2: zero tokens around the grid keep a transferred conv exact at the border
            mixer = ZeroPadTokens(mixer, grid, pad)
    if batchnorm:
        return LevitBlock(stage.dim, mixer, mlp_ratio=stage.mlp_ratio, act_layer=act, drop_path=plan.drop_path)
    return TransformerBlock(stage.dim, mixer, mlp_ratio=stage.mlp_ratio, act_layer=act, norm_eps=stage.norm_eps,
                            drop_path=plan.drop_path, layer_scale=stage.layer_scale)


def _class_attention(node: dict, spec: ArchSpec) -> nn.Module:
    """A CaiT class-attention block (archspec/blocks/class_attention.py); width and activation of the last stage."""
    last = spec.stages[-1]
    return family("class_attention").build(**node["config"], act_layer=ACTIVATIONS[last.act], norm_eps=last.norm_eps)


def _shrink(node: dict) -> nn.Module:
    """LeViT shrinking attention (archspec/blocks/shrink.py) for the node's shape."""
    cfg = dict(node["config"])
    act = ACTIVATIONS[cfg.pop("act")]
    return family("shrink").build(**cfg, act_layer=act)


def compile(spec: "ArchSpec | str | os.PathLike | dict", max_memory: float | None = None,  # noqa: A001
            img_size: "int | tuple[int, int] | None" = None, drop_rate: float = 0.0) -> ArchModel:
    """Compile a spec (or a path / shipped spec name / YAML text / dict) into an :class:`ArchModel`.

    The model maps images ``(B, C_in, H, W)`` to logits ``(B, num_classes)`` and keeps its spec as
    ``model.spec``.  Initial weights depend only on the spec (``spec.seed``): compiling twice gives
    bitwise identical state dicts.

    Args:
        max_memory: limit in bytes on the estimated memory of a batch-1 float32 forward (weights,
            buffers, peak activations; :func:`archspec.graph.check_memory`); ``None`` takes
            :data:`archspec.graph.DEFAULT_MAX_MEMORY` (8 GiB), ``math.inf`` disables it.
        img_size: input resolution in pixels (an int or ``(H, W)``, timm's name) replacing the spec's
            ``input.resolution``; the spec is re-checked at that size.
        drop_rate: dropout before the classifier (timm's ``drop_rate``); not stored in the spec.

    Raises:
        SpecError: the spec is invalid or over the memory limit (every problem, located in its file).
    """
    spec = load_spec(spec, check=False) if not isinstance(spec, ArchSpec) else spec
    if img_size is not None:
        spec = with_resolution(spec, img_size)
    graph = build_graph(spec)
    problems = check_memory(graph, max_memory)
    if problems:
        raise SpecError(problems)
    nodes = nodes_in_order(graph)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        stem = _stem(next(n for n in nodes if n["kind"] == "stem"), spec)
        embed = next(n for n in nodes if n["kind"] == "embed")["config"]
        stages = []
        for i in range(len(spec.stages)):
            downsample = [_shrink(n) for n in nodes if n["kind"] == "shrink" and n["stage"] == i]
            blocks = [_block(n, spec) for n in nodes if n["kind"] == "block" and n["stage"] == i]
            stages.append(Stage(downsample[0] if downsample else None, blocks))
        class_blocks = [_class_attention(n, spec) for n in nodes if n["kind"] == "class_attn"]
        if class_blocks:  # the class-attention stage runs after the class token is inserted (CaiT)
            stages.append(Stage(None, class_blocks))
        model = ArchModel(spec, stem, stages, dim_in=spec.stages[0].dim, dim_out=spec.stages[-1].dim,
                          cls_at=embed["cls_at"], n_extra=embed["n_extra"], pos_embed_len=embed["pos_embed_len"],
                          token_dim=embed["token_dim"], drop_rate=drop_rate)
    model.analysis = graph
    return model
