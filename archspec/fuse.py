"""LeViT inference folding: every BatchNorm into the linear / conv before it (LeViT sec. 5.3).

For inference, ``BN(W x) = (gamma / sqrt(var + eps)) W x + (beta - gamma mean / sqrt(var + eps))`` is one linear
map, so LeViT folds each BatchNorm into the preceding linear or convolution.  archspec's BatchNorm-family layers
are timm's ``LinearNorm`` / ``ConvNorm`` / ``NormLinear`` (timm ``models/levit.py``), which implement the fold as
``fuse()``; :func:`timm.utils.reparameterize_model` walks a model and swaps each for its ``fuse()`` result.
"""

from __future__ import annotations

from timm.utils.model import reparameterize_model
from torch import nn

__all__ = ["fuse_model", "count_batchnorms"]


def count_batchnorms(model: nn.Module) -> int:
    """Number of BatchNorm modules (1d/2d) left in ``model``."""
    return sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def fuse_model(model: nn.Module, inplace: bool = False) -> nn.Module:
    """Fold every ``LinearNorm`` / ``ConvNorm`` / ``NormLinear`` of ``model`` into an ``nn.Linear`` / ``nn.Conv2d``.

    The result is an inference model (returned in eval mode): it uses the BatchNorm running statistics, so it
    equals ``model.eval()`` up to float rounding (about 1e-6 relative in float32), with fewer parameters
    (BatchNorm's ``weight``/``bias`` become the linear's bias) and no BatchNorm ops.  Shapes are unchanged:
    images ``(B, C, H, W)`` -> logits ``(B, num_classes)``.  Models without BatchNorm come back unchanged
    (a copy unless ``inplace``).  A folded model has a different ``state_dict`` layout: save the unfolded model.

    Source: LeViT sec. 5.3 (BN folding); timm ``reparameterize_model`` + ``levit.LinearNorm.fuse`` etc.

    Args:
        model: an archspec (or any timm-style) model.
        inplace: fold ``model`` itself instead of a deep copy.
    """
    return reparameterize_model(model.eval(), inplace=inplace).eval()
