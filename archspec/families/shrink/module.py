"""LeViT shrinking attention between stages (LeViT sec. 4.2): the module, timm ``levit.LevitDownsample``.

Its torch-free rules (spec, shape, checks, counts, memory, output grid) are :mod:`.rules`.
"""

from __future__ import annotations

import torch
from timm.models.levit import LevitDownsample
from torch import Tensor, nn

from ..activations import activation
from ..attention.tables import check_grid, levit_bias_idxs, resample_bias_table
from .rules import ShrinkShape

__all__ = ["ShrinkBlock", "build"]


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
        (:func:`~archspec.families.attention.tables.resample_bias_table`, as timm ``resize_rel_pos_bias_table_levit``)
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


def build(shape: ShrinkShape) -> ShrinkBlock:
    """The module of a :class:`~.rules.ShrinkShape`.

    Raises:
        ValueError: a stride other than 2 (timm's ``AttentionDownsample`` subsamples by 2; the spec allows only 2).
    """
    if shape.stride != 2:
        raise ValueError(f"shrinking attention subsamples with stride 2 (timm LevitDownsample), got {shape.stride}")
    return ShrinkBlock(shape.in_dim, shape.out_dim, shape.key_dim, shape.grid, num_heads=shape.heads,
                       attn_ratio=shape.attn_ratio, mlp_ratio=shape.mlp_ratio, act_layer=activation(shape.act))
