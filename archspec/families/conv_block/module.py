"""ResNet residual blocks built on timm's own (rules: :mod:`.rules`): ``timm.models.resnet.BasicBlock`` /
``Bottleneck`` with timm's ``downsample_conv`` / ``downsample_avg`` shortcuts and timm's ``SEModule``, initialised
as timm ``ResNet.init_weights``, so weights, names and numerics are timm's."""

from __future__ import annotations

from functools import partial

from timm.layers import DropPath
from timm.layers.squeeze_excite import SEModule
from timm.models.resnet import BasicBlock, Bottleneck, downsample_avg, downsample_conv
from torch import nn

from .rules import EXPANSION, ConvBlockShape

__all__ = ["build", "BLOCKS"]

BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


def _block_class(block: str, expansion: int) -> type[nn.Module]:
    """timm's block class, subclassed only to change its class attribute ``expansion`` when the spec does."""
    cls = BLOCKS[block]
    if expansion == EXPANSION[block]:
        return cls
    return type(f"{cls.__name__}{expansion}", (cls,), {"expansion": expansion})


def build(shape: ConvBlockShape) -> nn.Module:
    """The residual block of ``shape``: ``(B, in_chans, H, W) -> (B, channels, ceil(H / s), ceil(W / s))``.

    As timm ``make_blocks`` + ``ResNet.init_weights``: every conv (shortcut and SE included)
    ``kaiming_normal_(mode='fan_out', nonlinearity='relu')``, BatchNorms at weight 1 and bias 0, SE biases at
    torch's default; with ``zero_init_last`` the block's ``zero_init_last()`` (its last BatchNorm's weight 0).
    """
    downsample = None
    if shape.downsample is not None:
        make = downsample_avg if shape.downsample == "avg" else downsample_conv
        downsample = make(shape.in_chans, shape.channels, kernel_size=1, stride=shape.stride, dilation=1,
                          first_dilation=1)
    attn = partial(SEModule, rd_ratio=shape.rd_ratio, rd_divisor=shape.rd_divisor) if shape.se_channels else None
    cls = _block_class(shape.block, shape.expansion)
    module = cls(shape.in_chans, shape.width, shape.stride, downsample, attn_layer=attn,
                 drop_path=DropPath(shape.drop_path) if shape.drop_path > 0 else None)
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    if shape.zero_init_last:
        module.zero_init_last()
    return module
