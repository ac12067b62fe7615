"""The classifier of the head (rules: :mod:`.rules`): timm ViT's ``Linear`` or timm LeViT's ``NormLinear``."""

from __future__ import annotations

from timm.layers import trunc_normal_
from timm.models.levit import NormLinear
from torch import nn

__all__ = ["build_classifier"]


def build_classifier(num_features: int, num_classes: int, batchnorm: bool, drop: float = 0.0) -> nn.Module:
    """A fresh classifier ``(B, num_features) -> (B, num_classes)``; ``nn.Identity`` for ``num_classes <= 0``.

    ``batchnorm``: timm ``levit.NormLinear`` (BatchNorm1d, dropout ``drop``, Linear; its own init, trunc-normal
    .02); else an ``nn.Linear`` initialised as timm ViT's head (trunc-normal .02, zero bias).
    """
    if num_classes <= 0:
        return nn.Identity()
    if batchnorm:
        return NormLinear(num_features, num_classes, drop=drop)
    head = nn.Linear(num_features, num_classes)
    trunc_normal_(head.weight, std=0.02)
    nn.init.zeros_(head.bias)
    return head
