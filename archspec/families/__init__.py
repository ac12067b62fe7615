"""Block families: one folder each, its torch-free rules beside its module.

A *family* is one kind of part of a model.  Its folder ``archspec/families/<family>/`` holds:

``rules.py``  torch-free: its spec models (pydantic), the typed ``*Shape`` an IR node carries, the checks
              that need shapes, ``counts(shape) -> (params, MACs per image)``, ``memory(shape) ->
              NodeMemory`` (bytes, batch 1, float32), and where they apply ``out_grid``,
              ``executed_macs``, ``batchnorm_channels``, ``label``; and ``NO_WEIGHT_DECAY``, the parameter
              leaf names an optimizer must not decay.
``module.py`` the ``nn.Module`` and ``build(shape) -> nn.Module``.

:mod:`archspec.ir.walk` walks the spec and asks each family's rules; :mod:`archspec.nn.compiler` hands every
node's shape to :func:`build` without reading the spec again.  :data:`FAMILIES` is the registry: a new
family is a folder plus a line here (the checklist is in ``docs/architecture.md``).  This module and every
``rules.py`` import no torch, so ``archspec validate`` never does; a family's ``module.py`` is imported the
first time a model with that family is built.

The attention family's head kinds (ConViT's GPSA, LeViT's and CMHSA's relative biases, MaiT's masks, ...) are
modules of ``families/attention/kinds/``, reached through one registry: see
:mod:`archspec.families.attention.kinds`.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__all__ = ["FAMILIES", "CONV_STAGE_FAMILIES", "rules", "module", "build", "no_weight_decay_leaves"]

#: family name -> its package (``<package>.rules`` torch-free, ``<package>.module`` the torch side)
FAMILIES: dict[str, str] = {
    "stem": "archspec.families.stem",
    "tokens": "archspec.families.tokens",          # rules only: the model's own parameters
    "attention": "archspec.families.attention",
    "talking_heads": "archspec.families.talking_heads",
    "conv_mixer": "archspec.families.conv_mixer",
    "block": "archspec.families.block",
    "shrink": "archspec.families.shrink",
    "downsample": "archspec.families.downsample",  # Swin's patch merging, NAT's conv downsampler
    "class_attention": "archspec.families.class_attention",
    "head": "archspec.families.head",
    "conv_block": "archspec.families.conv_block",  # ResNet residual blocks of conv stages
    "mbconv": "archspec.families.mbconv",          # MBConv blocks of conv stages (CoAtNet, MaxViT)
    "mobilevit": "archspec.families.mobilevit",    # MV2, MobileViT and conv + BN + act blocks of conv stages
    "interface": "archspec.families.interface",    # a conv stage's map -> the next attention stage's tokens
}

#: the families whose blocks make a conv stage (``kind: conv``), on a feature map ``(B, C, H, W)``
CONV_STAGE_FAMILIES = ("conv_block", "mbconv", "mobilevit")


def _package(name: str) -> str:
    if name not in FAMILIES:
        raise KeyError(f"no block family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def rules(name: str) -> ModuleType:
    """The torch-free rules module of family ``name``.

    Raises:
        KeyError: no family of that name.
    """
    return importlib.import_module(_package(name) + ".rules")


def module(name: str) -> ModuleType:
    """The torch module of family ``name`` (imports torch on first use).

    Raises:
        KeyError: no family of that name.
    """
    return importlib.import_module(_package(name) + ".module")


def build(name: str, shape: Any) -> Any:
    """The ``nn.Module`` of family ``name`` for ``shape`` (its rules' ``*Shape``): ``module(name).build(shape)``.

    Raises:
        KeyError: no family of that name.  ValueError: as the family's module (the IR's checks come first).
    """
    return module(name).build(shape)


def no_weight_decay_leaves() -> frozenset[str]:
    """Every family's parameter leaf names that timm-style optimizers must not decay (position embedding,
    tokens, attention biases, GPSA gating, soft-mask alphas)."""
    return frozenset().union(*(rules(name).NO_WEIGHT_DECAY for name in FAMILIES))
