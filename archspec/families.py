"""Block families whose module, shape rule and count rule live together in one file of :mod:`archspec.blocks`.

A *family* is one kind of block (timm keeps one model family per file; archspec keeps one block
family per file).  Its file in ``archspec/blocks/`` defines the ``nn.Module`` and, next to it, the
closed-form rules the IR needs -- parameters, MACs per image, memory (:class:`archspec.memory.NodeMemory`)
-- and registers them as a :class:`BlockFamily` named ``FAMILY``.  :mod:`archspec.graph` asks
:func:`family` for the counts, :mod:`archspec.compiler` for the module; neither holds the family's
formulas.  Adding a family is then one new file plus its spec model in :mod:`archspec.spec`, and a
line in :data:`FAMILY_MODULES`.

The registry is torch-free: a family's file (which imports torch) is imported the first time a spec
uses that family, so ``archspec validate`` of a spec without it never imports torch.

Families registered here: ``talking_heads`` (CaiT's TalkingHeadAttn, with MaiT masks; CaiT eq. in
Touvron et al. 2021 sec. 2 / timm ``cait.TalkingHeadAttn``), ``class_attention`` (CaiT's class-attention
stage, timm ``cait.ClassAttn`` / ``LayerScaleBlockClassAttn``), ``shrink`` (LeViT's shrinking attention,
timm ``levit.LevitDownsample``) and ``conv_mixer`` (CMHSA's convolution phase, a ``K x K`` conv on the
pixel view of the tokens).

The one family that stays outside the registry is the multi-head ``Attention`` of every ViT/DeiT/ConViT/
MaiT/LeViT block (MHSA, GPSA, attention bias, masks): its count and memory rules stay torch-free in
:mod:`archspec.graph` and :mod:`archspec.memory` so that validating, counting and searching the common
specs never imports torch (``tests/test_cait.py`` checks it); its module is
:class:`archspec.blocks.attention.Attention`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

# family name -> module of archspec/blocks that defines FAMILY (imported on first use)
FAMILY_MODULES = {
    "talking_heads": "archspec.blocks.talking_heads",
    "class_attention": "archspec.blocks.class_attention",
    "shrink": "archspec.blocks.shrink",
    "conv_mixer": "archspec.blocks.mixers",
}


@dataclass(frozen=True)
class BlockFamily:
    """The rules of one block family.

    Attributes:
        name: the family's name (a key of :data:`FAMILY_MODULES`).
        counts: ``(**shape) -> (params, MACs per image)``, closed form, no tensor allocated.
        memory: ``(**shape) -> archspec.memory.NodeMemory`` (bytes, batch 1, float32).
        build: ``(**shape, **options) -> nn.Module`` the compiled module for the same shape.
        out_grid: ``(**shape) -> (rows, cols)`` the token grid after the block; ``None``: the grid is unchanged.
    """

    name: str
    counts: Callable[..., tuple[int, int]]
    memory: Callable[..., Any]
    build: Callable[..., Any]
    out_grid: Callable[..., tuple[int, int]] | None = None


def family(name: str) -> BlockFamily:
    """The registered :class:`BlockFamily` ``name`` (imports its file on first use).

    Raises:
        KeyError: no family of that name.
    """
    if name not in FAMILY_MODULES:
        raise KeyError(f"no block family {name!r}; known: {', '.join(sorted(FAMILY_MODULES))}")
    return importlib.import_module(FAMILY_MODULES[name]).FAMILY
