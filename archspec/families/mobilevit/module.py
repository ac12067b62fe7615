"""MobileViT's blocks built on timm's own modules (rules: :mod:`.rules`), so weights, names and numerics are timm's:
an MV2 block is timm ``byobnet.BottleneckBlock`` (``conv1_1x1``, ``conv2_kxk``, ``conv3_1x1``; ``bottle_in``,
``linear_out``, depthwise, no projected shortcut), a MobileViT block timm ``mobilevit.MobileVitBlock``
(``conv_kxk``, ``conv_1x1``, ``transformer.{i}``, ``norm``, ``conv_proj``, ``conv_fusion``), a ``conv_bn_act`` block
timm ``ConvNormAct`` (``conv``, ``bn``), each with ByobNet's layers (``ConvNormAct`` + ``BatchNormAct2d`` with the
stage's activation) and initialised as timm ``ByobNet`` initialises its blocks.
"""

from __future__ import annotations

from functools import partial, singledispatch

from timm.models import named_apply
from timm.models.byobnet import BottleneckBlock, ByoModelCfg, LayerFn, _init_weights, get_layer_fns
from timm.models.mobilevit import MobileVitBlock
from torch import nn

from .rules import ConvBNActShape, MobileViTShape, MV2Shape

__all__ = ["build", "byob_layers", "init_as_byobnet"]


def byob_layers(act: str) -> LayerFn:
    """timm ByobNet's layer functions for activation ``act`` (``get_layer_fns`` of a ``ByoModelCfg`` with
    ``act_layer=act``: ``ConvNormAct`` with BatchNorm, ``BatchNormAct2d``, the activation)."""
    return get_layer_fns(ByoModelCfg(blocks=(), act_layer=act))


def init_as_byobnet(module: nn.Module) -> nn.Module:
    """Initialise ``module`` and its children as timm ``ByobNet.init_weights`` does (``named_apply`` of byobnet's
    ``_init_weights``, ``zero_init_last=True``): convs ``normal(0, sqrt(2 / fan_out))`` (``fan_out = k^2 c_out /
    groups``), biases 0, Linears ``normal(0, 0.01)`` with zero biases, BatchNorms at 1 and 0, then each block's own
    ``init_weights`` (an MV2 block with its identity shortcut: its last BatchNorm's weight 0); LayerNorms keep torch's
    ones and zeros.  Returns ``module``."""
    return named_apply(partial(_init_weights, zero_init_last=True), module, include_root=True)


@singledispatch
def build(shape) -> nn.Module:
    """The block of ``shape``: ``(B, C_in, H, W) -> (B, C, H', W')`` (``H'`` :func:`~.rules.out_grid`).

    Raises:
        TypeError: a shape of another family.
    """
    raise TypeError(f"not a mobilevit-family shape: {type(shape).__name__}")


@build.register
def _build_mv2(shape: MV2Shape) -> nn.Module:
    """timm ``BottleneckBlock(in_chans, channels, kernel, stride, bottle_ratio=expansion, group_size=1,
    downsample='', bottle_in=True, linear_out=True)``: MobileViT's MV2 (timm ``_inverted_residual_block``)."""
    block = BottleneckBlock(shape.in_chans, shape.channels, kernel_size=shape.kernel, stride=shape.stride,
                            bottle_ratio=shape.expansion, group_size=1, downsample="", bottle_in=True, linear_out=True,
                            layers=byob_layers(shape.act), drop_path_rate=shape.drop_path)
    return init_as_byobnet(block)


@build.register
def _build_mobilevit(shape: MobileViTShape) -> nn.Module:
    """timm ``MobileVitBlock(C, C, kernel, transformer_dim, transformer_depth, patch_size, num_heads, mlp_ratio,
    no_fusion)`` with the stage's activation in its convs and MLPs, its transformer layers' ``drop_path``."""
    block = MobileVitBlock(shape.channels, shape.channels, kernel_size=shape.kernel, mlp_ratio=shape.mlp_ratio,
                           transformer_dim=shape.dim, transformer_depth=shape.depth, patch_size=shape.patch,
                           num_heads=len(shape.heads), no_fusion=not shape.fusion, drop_path_rate=shape.drop_path,
                           layers=byob_layers(shape.act))
    return init_as_byobnet(block)


@build.register
def _build_conv(shape: ConvBNActShape) -> nn.Module:
    """timm ``ConvNormAct(in_chans, channels, kernel, stride)`` with BatchNorm and the stage's activation (ByobNet's
    ``final_conv``)."""
    return init_as_byobnet(byob_layers(shape.act).conv_norm_act(shape.in_chans, shape.channels, shape.kernel,
                                                               stride=shape.stride))
