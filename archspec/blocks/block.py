"""Transformer blocks: pre-norm ViT/ConViT/MaiT block, LeViT residual block and LeViT shrinking block."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from timm.layers import DropPath, LayerScale, Mlp
from timm.models.levit import LevitDownsample, LevitMlp

from .position import check_grid, levit_bias_idxs, resample_bias_table

__all__ = ["TransformerBlock", "LevitBlock", "ShrinkBlock"]


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


class ShrinkBlock(LevitDownsample):
    """LeViT shrinking attention block between stages: timm ``levit.LevitDownsample`` reused as is.

    ``attn_downsample`` (timm ``AttentionDownsample``: queries subsampled with stride 2, attention bias
    on absolute offsets, value dim ``attn_ratio * key_dim``, Hardswish before the projection, no residual)
    followed by a residual ``mlp`` (``LevitMlp``, ratio 2): LeViT sec. 4.2 "shrinking attention".

    Shapes: ``(B, H*W, C_in) -> (B, ceil(H/2)*ceil(W/2), C_out)``; the output grid is :attr:`out_grid`.

    MACs per image (``N = H*W``, ``Nq = ceil(H/2) ceil(W/2)``, ``h`` heads, ``D`` key dim, ``Dv = attn_ratio D``):
    ``kv``: ``N C_in h (D + Dv)``; ``q``: ``Nq C_in h D``; ``QK^T``: ``h Nq N D``; ``AV``: ``h Nq N Dv``;
    ``proj``: ``Nq h Dv C_out``; ``mlp``: ``2 Nq C_out^2 mlp_ratio``.

    Args:
        in_dim: input width ``C_in``.
        out_dim: output width ``C_out``.
        key_dim: per-head key dim ``D``.
        grid: input ``(H, W)`` grid.
        num_heads: default ``in_dim // key_dim`` (LeViT: ``C_in / D``).
        attn_ratio: value dim ratio (4 in LeViT).
        mlp_ratio: residual MLP ratio (2 in LeViT).
        act_layer: activation (Hardswish in LeViT), used for the attention and the MLP.
        drop_path: stochastic-depth rate on the MLP branch.

    Raises:
        ValueError: ``num_heads`` defaulted with ``in_dim < key_dim``; in ``forward`` a wrong ``N`` or width.
    """

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        key_dim: int,
        grid: tuple[int, int],
        num_heads: int | None = None,
        attn_ratio: float = 4.0,
        mlp_ratio: float = 2.0,
        act_layer: type[nn.Module] = nn.Hardswish,
        drop_path: float = 0.0,
    ) -> None:
        if num_heads is None:
            num_heads = in_dim // key_dim
        if num_heads < 1:
            raise ValueError(f"shrink attention needs >= 1 head (in_dim {in_dim} // key_dim {key_dim} = 0)")
        rows, cols = int(grid[0]), int(grid[1])
        super().__init__(
            in_dim, out_dim, key_dim=key_dim, num_heads=num_heads, attn_ratio=attn_ratio, mlp_ratio=mlp_ratio,
            act_layer=act_layer, resolution=(rows, cols), drop_path=drop_path,
        )
        self.in_dim = in_dim
        self.out_dim = out_dim
        self.grid = (rows, cols)
        self.out_grid = ((rows - 1) // 2 + 1, (cols - 1) // 2 + 1)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H*W, C_in) -> (B, ceil(H/2)*ceil(W/2), C_out)``."""
        rows, cols = self.grid
        if x.dim() != 3 or x.shape[1] != rows * cols or x.shape[2] != self.in_dim:
            raise ValueError(f"ShrinkBlock expects (B, {rows * cols}, {self.in_dim}), got {tuple(x.shape)}")
        return super().forward(x.contiguous())

    @torch.no_grad()
    def set_grid(self, grid: tuple[int, int]) -> None:
        """Move the block to another input grid ``(H', W')``, keeping its weights.

        Resamples the attention-bias table ``(h, H*W) -> (h, H'*W')`` bicubically on its offset grid
        (:func:`~archspec.blocks.position.resample_bias_table`, as timm ``resize_rel_pos_bias_table_levit``)
        and recomputes timm ``AttentionDownsample``'s index table and its query subsampler's resolution.
        Afterwards :attr:`grid` is ``(H', W')`` and :attr:`out_grid` ``(ceil(H'/2), ceil(W'/2))``.

        Raises:
            ValueError: for a grid side < 1.
        """
        rows, cols = check_grid(grid)
        attn = self.attn_downsample
        table = resample_bias_table(attn.attention_biases.data, self.grid, (rows, cols))
        attn.attention_biases = nn.Parameter(table, requires_grad=attn.attention_biases.requires_grad)
        attn.resolution = (rows, cols)
        attn.q.down.resolution = (rows, cols)
        attn.attention_bias_idxs = levit_bias_idxs((rows, cols), stride=attn.stride).to(table.device)
        attn.attention_bias_cache = {}
        self.grid = (rows, cols)
        self.out_grid = ((rows - 1) // 2 + 1, (cols - 1) // 2 + 1)
