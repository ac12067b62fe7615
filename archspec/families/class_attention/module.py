"""CaiT's class-attention stage: the module (rules: :mod:`.rules`).

CaiT (Touvron et al. 2021, sec. 3.2, Fig. 2) separates the patch self-attention stage from a
*class-attention* stage: the class token is inserted only after the last self-attention block, and
in the class-attention blocks only the class token queries (``q = W_q x_cls``) while keys and values
come from ``z = [x_cls, x_patches]``; the patches pass through unchanged.  Each block is pre-norm with
LayerScale (CaiT sec. 3.1)::

    x_cls = x_cls + gamma_1 * ClassAttn(norm1([x_cls, x_patches]))
    x_cls = x_cls + gamma_2 * MLP(norm2(x_cls))

Numerics and names mirror timm ``cait.ClassAttn`` (``q``, ``k``, ``v``, ``proj``) and
``cait.LayerScaleBlockClassAttn`` (``norm1``, ``attn``, ``gamma_1``, ``norm2``, ``mlp``, ``gamma_2``).
In archspec the block takes and returns the whole token sequence ``(B, 1 + N_p, C)`` with the class
token first (timm passes ``(x_patches, x_cls)`` separately and concatenates after the last block; the
values are identical), so the stage is an ordinary last :class:`~archspec.nn.model.Stage` of the model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import DropPath, Mlp, trunc_normal_
from torch import Tensor, nn

from ..activations import activation
from .rules import ClassAttentionShape

__all__ = ["ClassAttn", "ClassAttentionBlock", "build"]


class ClassAttn(nn.Module):
    """Class attention (CaiT sec. 3.2, timm ``cait.ClassAttn``): only the class token (token 0) queries.

    Shapes: ``(B, N, C) -> (B, 1, C)``; head dim ``C / heads``; scale ``head_dim ** -0.5``.

    Raises:
        ValueError: ``dim`` not divisible by ``num_heads``.
    """

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by {num_heads} heads")
        self.num_heads, self.dim = num_heads, dim
        self.scale = (dim // num_heads) ** -0.5
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, N, C = x.shape
        q = self.q(x[:, 0]).reshape(B, 1, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)
        k = self.k(x).reshape(B, N, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)
        v = self.v(x).reshape(B, N, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)
        return q, k, v

    def get_attention(self, x: Tensor) -> Tensor:
        """The class token's attention over all tokens, ``(B, H, 1, N)`` (rows sum to 1)."""
        q, k, _ = self._qkv(x)
        return ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, C) -> (B, 1, C)``: the attended class token (SDPA, as timm with fused attention)."""
        B, _, C = x.shape
        q, k, v = self._qkv(x)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, 1, C)))


class ClassAttentionBlock(nn.Module):
    """CaiT class-attention block with LayerScale (timm ``cait.LayerScaleBlockClassAttn``).

    Shapes: ``(B, 1 + N_p, C) -> (B, 1 + N_p, C)``: token 0 (the class token) is updated, the patch
    tokens are returned unchanged.

    Args:
        dim: width ``C``; num_heads: heads of :class:`ClassAttn`; mlp_ratio: MLP hidden ``int(C * ratio)``.
        qkv_bias: bias on q, k, v.  act_layer: MLP activation.  norm_eps: LayerNorm eps (CaiT 1e-6).
        layer_scale: LayerScale init ``gamma_1 = gamma_2 = layer_scale * 1``; ``None``: no LayerScale
            (plain residuals, no ``gamma`` parameters).
        drop_path: stochastic depth on both residual branches (timm CaiT: 0 in these blocks).
    """

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = True,
                 act_layer: type[nn.Module] = nn.GELU, norm_eps: float = 1e-6, layer_scale: float | None = 1e-5,
                 drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = ClassAttn(dim, num_heads, qkv_bias=qkv_bias)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer)
        if layer_scale is not None:
            self.gamma_1 = nn.Parameter(layer_scale * torch.ones(dim))
            self.gamma_2 = nn.Parameter(layer_scale * torch.ones(dim))
        else:
            self.gamma_1 = self.gamma_2 = None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """timm ``Cait._init_weights``: ``trunc_normal_(std=.02)`` Linear weights, zero biases."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def _scale(self, gamma: Tensor | None, x: Tensor) -> Tensor:
        return x if gamma is None else gamma * x

    def forward(self, x: Tensor) -> Tensor:
        """``(B, 1 + N_p, C) -> (B, 1 + N_p, C)``, the class token first."""
        x_cls, patches = x[:, :1], x[:, 1:]
        x_cls = x_cls + self.drop_path(self._scale(self.gamma_1, self.attn(self.norm1(x))))
        x_cls = x_cls + self.drop_path(self._scale(self.gamma_2, self.mlp(self.norm2(x_cls))))
        return torch.cat((x_cls, patches), dim=1)


def build(shape: ClassAttentionShape) -> ClassAttentionBlock:
    """The module of a :class:`~.rules.ClassAttentionShape` (``n_tokens`` is not needed to build it)."""
    return ClassAttentionBlock(shape.dim, shape.heads, mlp_ratio=shape.mlp_ratio, qkv_bias=shape.qkv_bias,
                               act_layer=activation(shape.act), norm_eps=shape.norm_eps, layer_scale=shape.layer_scale)
