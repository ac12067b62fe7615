"""LeViT inference folding: every BatchNorm into the linear / conv before it (LeViT sec. 5.3); conv stages' and
the ResNet stem's conv -> BatchNorm pairs too (:func:`fold_conv_batchnorms`).

For inference, ``BN(W x) = (gamma / sqrt(var + eps)) W x + (beta - gamma mean / sqrt(var + eps))`` is one linear
map, so LeViT folds each BatchNorm into the preceding linear or convolution.  archspec's BatchNorm-family layers
are timm's ``LinearNorm`` / ``ConvNorm`` / ``NormLinear`` (timm ``models/levit.py``), which implement the fold as
``fuse()``; :func:`timm.utils.reparameterize_model` walks a model and swaps each for its ``fuse()`` result.
"""

from __future__ import annotations

import torch
from timm.models.resnet import BasicBlock, Bottleneck
from timm.utils.model import reparameterize_model
from torch import nn
from torch.nn.utils.fusion import fuse_conv_bn_eval, fuse_linear_bn_weights

from archspec.families.conv_block.module import ConvGPSA, MapAttention
from archspec.families.stem.module import ResNetStem

__all__ = ["fuse_model", "count_batchnorms", "fold_conv_batchnorms", "fold_mixer_batchnorm"]

# (conv, BatchNorm) attribute pairs a module applies one right after the other: timm ResNet's BasicBlock /
# Bottleneck (conv1 -> bn1, conv2 -> bn2, conv3 -> bn3) and archspec's ResNet stem (conv1, or the deep stem's
# last conv, -> bn1)
_PAIRS = (("conv1", "bn1"), ("conv2", "bn2"), ("conv3", "bn3"))


def _resnet_parts() -> tuple[type, ...]:
    return BasicBlock, Bottleneck, ResNetStem


def fold_conv_batchnorms(model: nn.Module) -> int:
    """Fold, in place, every ``nn.Conv2d`` -> ``nn.BatchNorm2d`` pair of the conv stages and the ResNet stem into the
    conv (``torch.nn.utils.fusion.fuse_conv_bn_eval``: ``W' = W gamma / sqrt(var + eps)``, a bias
    ``beta - gamma mean / sqrt(var + eps)``), the BatchNorm becoming ``nn.Identity``: timm ResNet blocks'
    ``convN`` / ``bnN``, the stem's ``conv1`` (or its deep ``Sequential``'s last conv) / ``bn1``, and adjacent conv /
    BatchNorm children of any ``nn.Sequential`` (deep stem, conv pool, ``downsample`` shortcuts).  A bottleneck's
    ``bn2`` after a mixer in ``conv2``'s place folds into the mixer's output layer (:func:`fold_mixer_batchnorm`);
    only timm's ``BottleneckAttn`` and ``HaloAttn`` (no output projection) keep it.  Eval-mode semantics (the
    running statistics).  Returns the number of BatchNorms folded."""
    folded = 0
    parts = _resnet_parts()
    for module in list(model.modules()):
        if isinstance(module, nn.Sequential):
            names = list(module._modules)
            for a, b in zip(names, names[1:]):
                conv, bn = module._modules[a], module._modules[b]
                if isinstance(conv, nn.Conv2d) and type(bn) is nn.BatchNorm2d:
                    module._modules[a], module._modules[b] = fuse_conv_bn_eval(conv, bn), nn.Identity()
                    folded += 1
        if isinstance(module, parts):
            for conv_name, bn_name in _PAIRS:
                conv, bn = getattr(module, conv_name, None), getattr(module, bn_name, None)
                if type(bn) is not nn.BatchNorm2d:
                    continue
                owner, key = module, conv_name
                if isinstance(conv, nn.Sequential) and len(conv) and isinstance(conv[-1], nn.Conv2d):  # deep stem
                    owner, key, conv = conv, list(conv._modules)[-1], conv[-1]
                if isinstance(conv, nn.Conv2d):
                    owner._modules[key] = fuse_conv_bn_eval(conv, bn)
                    setattr(module, bn_name, nn.Identity())
                    folded += 1
                elif fold_mixer_batchnorm(conv, bn):
                    setattr(module, bn_name, nn.Identity())
                    folded += 1
    return folded


def _fuse_into_rows(weight: torch.Tensor, bias: torch.Tensor | None, bn: nn.BatchNorm2d):
    """``bn(W x + b)`` as one linear map, ``W`` ``(C, K)`` with the BatchNorm's channel ``C`` in rows:
    ``torch.nn.utils.fusion.fuse_linear_bn_weights`` (``W' = W gamma / sqrt(var + eps)``,
    ``b' = (b - mean) gamma / sqrt(var + eps) + beta``); a BatchNorm without affine parameters reads as
    ``gamma = 1``, ``beta = 0``.  Returns ``(W', b')`` as parameters, ``(C, K)`` and ``(C,)``."""
    gamma = bn.weight if bn.weight is not None else torch.ones_like(bn.running_var)
    beta = bn.bias if bn.bias is not None else torch.zeros_like(bn.running_mean)
    return fuse_linear_bn_weights(weight, bias, bn.running_mean, bn.running_var, bn.eps, gamma, beta)


@torch.no_grad()
def fold_mixer_batchnorm(mixer: nn.Module, bn: nn.BatchNorm2d) -> bool:
    """Fold a bottleneck's ``bn2`` into the mixer in ``conv2``'s place, in place; ``True`` if folded.

    ``bn2(mixer(x))`` is a per-channel affine map of the mixer's output, so it folds exactly into the mixer's last
    linear layer (``torch.nn.utils.fusion.fuse_linear_bn_weights``): T-CNN's
    :class:`~archspec.families.conv_block.module.ConvGPSA` (``W_out`` ``(heads, D_in, D_out)`` read as a
    ``(D_out, heads D_in)`` linear; its bias created if absent), and
    :class:`~archspec.families.conv_block.module.MapAttention`'s output projection (``proj``, or its last
    ``nn.Linear`` once LeViT's ``LinearNorm`` is folded).  MapAttention's stride-2 pool is a 2x2 average without
    padding, so it commutes with the affine map.  Anything else (timm's ``BottleneckAttn`` and ``HaloAttn``, which
    have no output projection) is left alone, as is a BatchNorm without running statistics (it normalises by the
    batch even in eval mode).
    """
    if type(bn) is not nn.BatchNorm2d or bn.running_mean is None or bn.running_var is None:
        return False
    if isinstance(mixer, ConvGPSA):
        w = mixer.out_weight  # (heads, D_in, D_out): D_out is the BatchNorm's channel
        rows = w.reshape(-1, w.shape[-1]).t()
        fused_w, fused_b = _fuse_into_rows(rows, mixer.out_bias, bn)
        mixer.out_weight = nn.Parameter(fused_w.t().reshape(w.shape).contiguous(), w.requires_grad)
        mixer.out_bias = fused_b
        return True
    proj = getattr(getattr(mixer, "attn", None), "proj", None) if isinstance(mixer, MapAttention) else None
    if isinstance(proj, nn.Sequential) and len(proj):
        proj = proj[-1]
    if not isinstance(proj, nn.Linear):
        return False
    proj.weight, proj.bias = _fuse_into_rows(proj.weight, proj.bias, bn)
    return True


def count_batchnorms(model: nn.Module) -> int:
    """Number of BatchNorm modules (1d/2d) left in ``model``."""
    return sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def fuse_model(model: nn.Module, inplace: bool = False) -> nn.Module:
    """Fold every ``LinearNorm`` / ``ConvNorm`` / ``NormLinear`` of ``model`` into an ``nn.Linear`` / ``nn.Conv2d``,
    and every conv -> BatchNorm pair of the conv stages and ResNet stem (:func:`fold_conv_batchnorms`).

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
    model = reparameterize_model(model.eval(), inplace=inplace).eval()
    fold_conv_batchnorms(model)
    return model
