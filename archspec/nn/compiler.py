"""Step 3 of 3 (spec -> graph -> **compile**), the compiler: turn the IR into an :class:`~archspec.nn.model.ArchModel`.

Each node record of the IR's plan (:mod:`archspec.ir.plan`) carries its family and typed shape
(:mod:`archspec.families`); the compiler hands the shape to the family's ``build``, and the model's structure
(stage counts and widths, the token grid, the tokens, the head: :func:`archspec.nn.layout.layout_of`) is read
from the records too.  The spec is read for its seed only, and kept on the model as metadata (``model.spec``).
The walk is in execution order and runs under ``torch.manual_seed(spec.seed)`` inside a forked RNG, so the same
spec gives bitwise identical initial weights and the caller's random state is left untouched.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from archspec.errors import SpecError
from archspec.families import build
from archspec.ir.checked import load_spec, with_resolution
from archspec.ir.graph import graph_of
from archspec.ir.plan import build_plan, check_memory
from archspec.nn.layout import TRANSITIONS, layout_of
from archspec.nn.model import ArchModel, Stage
from archspec.spec import ArchSpec


def _stages(nodes: Sequence[Mapping[str, Any]], n_stages: int) -> list[Stage]:
    """The model's stages in execution order: each one's transition (LeViT's shrinking attention, Swin's patch
    merging or NAT's conv downsampler) and blocks, then CaiT's class-attention stage when the IR has one (it runs
    after the class token is inserted)."""
    stages = []
    for i in range(n_stages):
        downsample = [build(n["family"], n["shape"]) for n in nodes
                      if n["kind"] in TRANSITIONS and n["stage"] == i]
        blocks = [build(n["family"], n["shape"]) for n in nodes if n["kind"] == "block" and n["stage"] == i]
        stages.append(Stage(downsample[0] if downsample else None, blocks))
    class_blocks: list[nn.Module] = [build("class_attention", n["shape"]) for n in nodes if n["kind"] == "class_attn"]
    if class_blocks:
        stages.append(Stage(None, class_blocks))
    return stages


def compile(spec: ArchSpec | str | os.PathLike | dict, max_memory: float | None = None,  # noqa: A001
            img_size: int | tuple[int, int] | None = None, drop_rate: float = 0.0) -> ArchModel:
    """Compile a spec (or a path / shipped spec name / YAML text / dict) into an :class:`ArchModel`.

    Every spec compiles to the one class, as timm's ``create_model`` builds a ``VisionTransformer``, ``Levit``
    or ``ResNet``: a token model, a hybrid (conv stages, then attention stages, maybe a conv tail) or a conv net
    (conv stages only: a hybrid without token stages, with timm ResNet's forward and head).  The model maps
    images ``(B, C_in, H, W)`` to logits ``(B, num_classes)`` and keeps its spec as ``model.spec``.  Initial
    weights depend only on the spec (``spec.seed``): compiling twice gives bitwise identical state dicts.

    Args:
        max_memory: limit in bytes on the estimated memory of a batch-1 float32 forward (weights,
            buffers, peak activations; :func:`archspec.ir.plan.check_memory`); ``None`` takes
            :data:`archspec.ir.plan.DEFAULT_MAX_MEMORY` (8 GiB), ``math.inf`` disables it.
        img_size: input resolution in pixels (an int or ``(H, W)``, timm's name) replacing the spec's
            ``input.resolution``; the spec is re-checked at that size.
        drop_rate: dropout before the classifier (timm's ``drop_rate``); not stored in the spec.

    Raises:
        SpecError: the spec is invalid or over the memory limit (every problem, located in its file).
    """
    spec = load_spec(spec, check=False) if not isinstance(spec, ArchSpec) else spec
    if img_size is not None:
        spec = with_resolution(spec, img_size)
    plan = build_plan(spec)
    problems = check_memory(plan, max_memory)
    if problems:
        raise SpecError(problems)
    nodes, layout = plan.nodes, layout_of(plan)
    # a hybrid's map -> tokens node (LeViT sec. 3.2 grafting), between its conv and attention stages
    interface = plan.first("interface")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        stem_module = build("stem", plan.first("stem")["shape"])
        stages = _stages(nodes, layout.n_stages)
        interface_module = build("interface", interface["shape"]) if interface is not None else None
        # a conv tail's tokens -> map node (conv stages after the attention stages)
        to_map = next((build("interface", n["shape"]) for n in plan.of_kind("to_map")), None)
        model = ArchModel(spec, layout, stem_module, stages, drop_rate=drop_rate, interface=interface_module,
                          to_map=to_map)
    model.analysis = graph_of(plan)
    return model
