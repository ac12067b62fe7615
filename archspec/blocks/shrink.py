"""LeViT shrinking attention between stages (LeViT sec. 4.2), the block family ``shrink``.

One file holds the module (:class:`ShrinkBlock`, timm ``levit.LevitDownsample``), its shape rule
(:func:`shrink_grid`), its count rule (:func:`shrink_counts`, parameters and MACs per image) and its
memory rule (:func:`shrink_memory`), registered as :data:`FAMILY` for :mod:`archspec.graph` and
:mod:`archspec.compiler` (see :mod:`archspec.families`).  Validating a spec without shrinking attention
never imports this file (nor torch).
"""

from __future__ import annotations

import torch
from timm.models.levit import LevitDownsample
from torch import Tensor, nn

from archspec.families import BlockFamily
from archspec.memory import F32, I64, NodeMemory, mlp_memory

from .position import check_grid, levit_bias_idxs, resample_bias_table

__all__ = ["ShrinkBlock", "shrink_grid", "shrink_counts", "shrink_memory", "build_shrink", "FAMILY"]


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


# ------------------------------------------------------------------------------------------- rules
def shrink_grid(grid: tuple[int, int], stride: int, **_shape) -> tuple[int, int]:
    """Query grid after subsampling with ``stride``: ``(ceil(H / stride), ceil(W / stride))`` (timm ``LevitDownsample``).

    Takes the family's other shape arguments and ignores them, so every rule is called with the same ``**shape``."""
    rows, cols = grid
    return (rows - 1) // stride + 1, (cols - 1) // stride + 1


def _bn_linear(n_tokens: int, d_in: int, d_out: int) -> tuple[int, int]:
    """(params, MACs) of a timm ``LinearNorm`` (bias-free linear + BatchNorm, 2 d_out params) over N tokens."""
    return d_in * d_out + 2 * d_out, n_tokens * d_in * d_out


def shrink_counts(in_dim: int, out_dim: int, heads: int, key_dim: int, attn_ratio: float, mlp_ratio: float,
                  grid: tuple[int, int], stride: int) -> tuple[int, int]:
    """(params, MACs per image) of :class:`ShrinkBlock` (shrinking attention + its residual MLP).

    With ``N = H W`` keys, ``Nq`` subsampled queries (:func:`shrink_grid`), ``h`` heads, key dim ``D`` and value
    dim ``Dv = int(attn_ratio D)``: kv ``N C_in h (D + Dv)``, q ``Nq C_in h D``, ``QK^T`` and ``AV``
    ``h Nq N (D + Dv)``, proj ``Nq h Dv C_out``, MLP ``2 Nq C_out hidden``; every linear is a ``LinearNorm``
    (BatchNorm: 2 params per channel); the attention bias table has ``h N`` entries.
    """
    out_grid = shrink_grid(grid, stride)
    n, nq = grid[0] * grid[1], out_grid[0] * out_grid[1]
    v_dim, hidden = int(attn_ratio * key_dim), int(out_dim * mlp_ratio)
    parts = [_bn_linear(n, in_dim, heads * (key_dim + v_dim)), _bn_linear(nq, in_dim, heads * key_dim),
             _bn_linear(nq, heads * v_dim, out_dim), _bn_linear(nq, out_dim, hidden), _bn_linear(nq, hidden, out_dim)]
    params = sum(p for p, _ in parts) + heads * n
    macs = sum(m for _, m in parts) + nq * n * heads * (key_dim + v_dim)
    return params, macs


def shrink_memory(in_dim: int, out_dim: int, heads: int, key_dim: int, attn_ratio: float, mlp_ratio: float,
                  grid: tuple[int, int], stride: int) -> NodeMemory:
    """Bytes (batch 1, float32; rule in :mod:`archspec.graph`) of :class:`ShrinkBlock`: ``AttentionDownsample``
    (kv over ``N`` keys, q over ``Nq`` subsampled queries, logits ``(h, Nq, N)``) then the residual ``LevitMlp``
    on ``Nq`` tokens.  Buffers: the bias index table and timm's eval-mode bias cache."""
    out_grid = shrink_grid(grid, stride)
    n, nq = grid[0] * grid[1], out_grid[0] * out_grid[1]
    v_dim, hidden = int(attn_ratio * key_dim), int(out_dim * mlp_ratio)
    x_in, x_out = n * in_dim, nq * out_dim
    kv, q_sub, q = n * heads * (key_dim + v_dim), nq * in_dim, nq * heads * key_dim
    logits, v, out = heads * nq * n, n * heads * v_dim, nq * heads * v_dim
    base = x_in + kv + q_sub + 2 * q
    phases = [kv, 2 * logits + n * heads * key_dim, logits + v + out, 3 * out + 2 * x_out]
    attn_act = base + max(phases)
    mlp = mlp_memory(nq, out_dim, hidden, batchnorm=True, layer_scale=False)
    act = max(attn_act, x_in + mlp.act)
    saved = 2 * kv + q_sub + 2 * q + 4 * logits + v + 3 * out + 2 * x_out
    buffers = I64 * nq * n + F32 * logits  # bias index table and timm's eval-mode bias cache
    return NodeMemory(act=F32 * act, saved=F32 * saved + mlp.saved, buffers=buffers)


def build_shrink(in_dim: int, out_dim: int, heads: int, key_dim: int, attn_ratio: float, mlp_ratio: float,
                 grid: tuple[int, int], stride: int, act_layer: type[nn.Module] = nn.Hardswish) -> ShrinkBlock:
    """The module for the same shape as the count rule.

    Raises:
        ValueError: a stride other than 2 (timm's ``AttentionDownsample`` subsamples by 2; the spec allows only 2).
    """
    if stride != 2:
        raise ValueError(f"shrinking attention subsamples with stride 2 (timm LevitDownsample), got {stride}")
    return ShrinkBlock(in_dim, out_dim, key_dim, grid, num_heads=heads, attn_ratio=attn_ratio, mlp_ratio=mlp_ratio,
                       act_layer=act_layer)


FAMILY = BlockFamily("shrink", counts=shrink_counts, memory=shrink_memory, build=build_shrink, out_grid=shrink_grid)
