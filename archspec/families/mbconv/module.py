"""MBConv blocks built on timm's own ``maxxvit.MbConvBlock`` (rules: :mod:`.rules`), so weights, names
(``shortcut.expand``, ``pre_norm``, ``down``, ``conv1_1x1``, ``norm1``, ``conv2_kxk``, ``se`` / ``se_early``,
``norm2``, ``conv3_1x1``) and numerics are timm's, initialised as timm ``MaxxVit`` initialises them
(``MbConvBlock.init_weights``: EfficientNet's fan-out normal, biases 0).
"""

from __future__ import annotations

from timm.models.maxxvit import MaxxVitConvCfg, MbConvBlock
from torch import nn

from .rules import MBConvShape

__all__ = ["build", "conv_cfg", "TIMM_PADDING"]

#: the spec's padding -> timm's ``padding`` argument
TIMM_PADDING = {"symmetric": "", "same": "same"}


def conv_cfg(shape: MBConvShape) -> MaxxVitConvCfg:
    """timm's ``MaxxVitConvCfg`` of ``shape``: MBConv, BatchNorm (``batchnorm2d``) with ``norm_eps``, depthwise
    (``group_size`` 1), the shortcut's pool also for stride mode 'pool' (timm's ``downsample_pool_type`` default);
    no SE is ``attn_layer=''``."""
    return MaxxVitConvCfg(
        block_type="mbconv", expand_ratio=shape.expansion, expand_output=shape.expand_output,
        kernel_size=shape.kernel, group_size=1, pre_norm_act=shape.pre_norm_act, output_bias=shape.output_bias,
        stride_mode=shape.stride_mode, pool_type=shape.pool, downsample_pool_type=shape.pool,
        padding=TIMM_PADDING[shape.padding], attn_early=shape.se_early, attn_layer="se" if shape.se_ratio else "",
        attn_act_layer=shape.se_act, attn_ratio=shape.se_ratio or 0.25, act_layer=shape.act,
        norm_layer="batchnorm2d", norm_eps=shape.norm_eps)


def build(shape: MBConvShape) -> nn.Module:
    """The block of ``shape``: timm ``MbConvBlock(in_chans, channels, stride, cfg=conv_cfg(shape), drop_path)``,
    ``(B, in_chans, H, W) -> (B, channels, H', W')`` (``H'`` :func:`~.rules.out_grid`), initialised by its
    ``init_weights()`` (timm ``_init_conv``: every conv ``normal(0, sqrt(2 / fan_out))``, fan-out
    ``k^2 c_out / groups``, biases 0; BatchNorms at weight 1, bias 0)."""
    block = MbConvBlock(shape.in_chans, shape.channels, stride=shape.stride, cfg=conv_cfg(shape),
                        drop_path=shape.drop_path)
    block.init_weights()
    return block
