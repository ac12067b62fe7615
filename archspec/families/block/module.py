"""Transformer blocks around a token mixer: the pre-norm ViT/ConViT/MaiT/CaiT block and LeViT's residual block.

Their torch-free rules (shape, MLP counts and memory, composition with the mixer's family) are :mod:`.rules`.
"""

from __future__ import annotations

import torch
from timm.layers import DropPath, LayerScale, Mlp, trunc_normal_
from timm.models.levit import LevitMlp
from torch import Tensor, nn

from archspec.families import build as build_family

from ..activations import activation
from .rules import BlockShape

__all__ = ["TransformerBlock", "LevitBlock", "build"]


class TransformerBlock(nn.Module):
    """Pre-norm transformer block, mirroring timm ``vision_transformer.Block`` (and ``convit.Block``).

    ``x = x + drop_path1(ls1(attn(norm1(x))))``; ``x = x + drop_path2(ls2(mlp(norm2(x))))``.
    Names as timm: ``norm1``, ``attn`` (the token mixer), ``ls1``, ``drop_path1``, ``norm2``,
    ``mlp`` (timm ``Mlp``: ``fc1``, ``act``, ``fc2``), ``ls2``, ``drop_path2``.  timm's
    ``convit.Block`` has a single ``drop_path``; with the same weights the outputs are identical.
    LayerNorm eps defaults to 1e-6, as timm's ``LayerNorm`` used by both timm blocks.
    LayerScale (CaiT, used by MaiT*) when ``layer_scale`` is given (its init value).

    Shapes: ``(B, N, C) -> (B, N, C)``.

    Args:
        dim: token width ``C``.
        mixer: token mixer ``(B, N, C) -> (B, N, C)`` (:class:`Attention` or :class:`ConvMixer`).
        mlp_ratio: hidden width of the MLP is ``int(dim * mlp_ratio)``.
        act_layer: MLP activation class.
        norm_eps: LayerNorm eps.
        drop_path: stochastic-depth rate.
        layer_scale: LayerScale init value, or ``None`` for no LayerScale.
        mlp_bias: bias on ``fc1`` / ``fc2``.
        mlp_drop: dropout inside the MLP (timm ``proj_drop``).

    Raises:
        ValueError: if ``mlp_ratio <= 0``.
    """

    def __init__(
        self,
        dim: int,
        mixer: nn.Module,
        mlp_ratio: float = 4.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_eps: float = 1e-6,
        drop_path: float = 0.0,
        layer_scale: float | None = None,
        mlp_bias: bool = True,
        mlp_drop: float = 0.0,
    ) -> None:
        super().__init__()
        if mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be > 0, got {mlp_ratio}")
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = mixer
        self.ls1 = LayerScale(dim, init_values=layer_scale) if layer_scale else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer,
                       bias=mlp_bias, drop=mlp_drop)
        self.ls2 = LayerScale(dim, init_values=layer_scale) if layer_scale else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The MLP as timm's ViT ``init_weights_vit_timm``, ConViT and CaiT ``_init_weights`` initialise it:
        ``trunc_normal_(std=.02)`` on ``fc1`` / ``fc2`` weights, zero biases (the mixer initialises itself,
        the LayerNorms keep weight 1 and bias 0, LayerScale its init value)."""
        for linear in (self.mlp.fc1, self.mlp.fc2):
            trunc_normal_(linear.weight, std=0.02)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, C) -> (B, N, C)``."""
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


class LevitBlock(nn.Module):
    """LeViT residual block without pre-norm, mirroring timm ``levit.LevitBlock`` (LeViT sec. 4).

    ``x = x + drop_path1(attn(x))``; ``x = x + drop_path2(mlp(x))`` with ``mlp`` a timm ``LevitMlp``
    (``ln1`` LinearNorm, ``act``, ``ln2`` LinearNorm with BN weight init 0).

    Shapes: ``(B, N, C) -> (B, N, C)``.

    Args:
        dim: token width ``C``.
        mixer: token mixer, usually :class:`Attention` with ``norm='batchnorm'`` and ``proj_act=nn.Hardswish``.
        mlp_ratio: LevitMlp expansion (2 in LeViT).
        act_layer: MLP activation (Hardswish in LeViT).
        drop_path: stochastic-depth rate.
    """

    def __init__(
        self,
        dim: int,
        mixer: nn.Module,
        mlp_ratio: float = 2.0,
        act_layer: type[nn.Module] = nn.Hardswish,
        drop_path: float = 0.0,
    ) -> None:
        super().__init__()
        self.attn = mixer
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.mlp = LevitMlp(dim, int(dim * mlp_ratio), act_layer=act_layer)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, C) -> (B, N, C)``."""
        x = x + self.drop_path1(self.attn(x))
        x = x + self.drop_path2(self.mlp(x))
        return x



def build(shape: BlockShape) -> nn.Module:
    """The block of a :class:`~.rules.BlockShape`: its mixer built by the mixer's family, then a
    :class:`LevitBlock` (batchnorm) or a :class:`TransformerBlock` around it.  The mixer is built first, so
    the initial weights follow the order of the module tree (``attn`` before ``mlp``)."""

    mixer = build_family(shape.mixer_family, shape.mixer)
    act = activation(shape.act)
    if shape.batchnorm:
        return LevitBlock(shape.dim, mixer, mlp_ratio=shape.mlp_ratio, act_layer=act, drop_path=shape.drop_path)
    return TransformerBlock(shape.dim, mixer, mlp_ratio=shape.mlp_ratio, act_layer=act, norm_eps=shape.norm_eps,
                            drop_path=shape.drop_path, layer_scale=shape.layer_scale)
