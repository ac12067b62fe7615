"""Transformer blocks around a token mixer: the pre-norm ViT/ConViT/MaiT/CaiT block and LeViT's residual block.

Their torch-free rules (shape, MLP counts and memory, composition with the mixer's family) are :mod:`.rules`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import DropPath, LayerScale, Mlp, trunc_normal_
from timm.models.levit import LevitMlp
from torch import Tensor, nn

from archspec.families import build as build_family

from ..activations import activation
from .rules import BlockShape

__all__ = ["TransformerBlock", "LevitBlock", "TokenPool", "PoolShortcut", "build"]


class TokenPool(nn.Module):
    """A 2x2 stride-2 pool of row-major tokens on their grid (timm ``Downsample2d``'s ``avg2`` / ``max2`` on the map):
    ``(B, H W, C) -> (B, H W / 4, C)``, both sides even.  The pool runs on the channels-last view of the tokens (no
    copy in), as ``F.avg_pool2d`` / ``F.max_pool2d`` compute it.

    Raises:
        ValueError: (construction, :meth:`set_grid`) an odd side or an unknown pool.
    """

    def __init__(self, pool: str, grid: tuple[int, int]) -> None:
        super().__init__()
        if pool not in ("avg2", "max2"):
            raise ValueError(f"pool must be 'avg2' or 'max2', got {pool!r}")
        self.pool = pool
        self.set_grid(grid)

    def set_grid(self, grid: tuple[int, int]) -> None:
        """Pool tokens on ``grid`` ``(H, W)`` from now on; :attr:`out_grid` is ``(H / 2, W / 2)``.

        Raises:
            ValueError: an odd side (timm's 2x2 pool would floor it while the stage's grid rounds up).
        """
        rows, cols = int(grid[0]), int(grid[1])
        if rows % 2 or cols % 2 or min(rows, cols) < 2:
            raise ValueError(f"a 2x2 stride-2 pool needs even sides, got a {rows}x{cols} grid")
        self.grid, self.out_grid = (rows, cols), (rows // 2, cols // 2)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H W, C) -> (B, H W / 4, C)``."""
        B, _, C = x.shape
        rows, cols = self.grid
        nchw = x.view(B, rows, cols, C).permute(0, 3, 1, 2)
        pooled = F.avg_pool2d(nchw, 2) if self.pool == "avg2" else F.max_pool2d(nchw, 2)
        return pooled.permute(0, 2, 3, 1).reshape(B, -1, C)

    def extra_repr(self) -> str:
        return f"{self.pool}, grid={self.grid}"


class PoolShortcut(nn.Module):
    """The shortcut of a block that downsamples inside itself (CoAtNet; timm ``Downsample2d``): the 2x2 pool, then
    ``expand``, a per-token Linear(``in_dim``, ``dim``) (timm's 1x1 conv) when the widths differ.
    ``(B, H W, in_dim) -> (B, H W / 4, dim)``."""

    def __init__(self, in_dim: int, dim: int, pool: str, grid: tuple[int, int], bias: bool = True) -> None:
        super().__init__()
        self.pool = TokenPool(pool, grid)
        self.expand = nn.Linear(in_dim, dim, bias=bias) if in_dim != dim else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H W, in_dim) -> (B, H W / 4, dim)``."""
        return self.expand(self.pool(x))


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
        in_dim, in_grid, pool, shortcut_bias: a block that downsamples inside itself (CoAtNet's first transformer
            block of a stage, timm ``TransformerBlock2d(stride=2)``): its input is ``in_dim`` tokens on ``in_grid``;
            ``norm1`` is at ``in_dim`` and followed by the 2x2 ``pool`` (``pool1``), the mixer runs on the pooled
            grid from ``in_dim`` to ``dim``, and the shortcut is :class:`PoolShortcut` (``shortcut``).  Default:
            none (``in_grid=None``).
        init: the linears' initialisation, ``'trunc_normal'`` (timm ViT's) or ``'xavier'`` (timm ``MaxxVit``'s
            ``vit_eff``: xavier-uniform weights, zero biases but the MLP's ``normal(1e-6)``).

    Raises:
        ValueError: if ``mlp_ratio <= 0``; an odd ``in_grid`` side.
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
        in_dim: int | None = None,
        in_grid: tuple[int, int] | None = None,
        pool: str = "avg2",
        shortcut_bias: bool = True,
        init: str = "trunc_normal",
    ) -> None:
        super().__init__()
        if mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be > 0, got {mlp_ratio}")
        self.init = init
        in_dim = dim if in_dim is None else in_dim
        self.norm1 = nn.LayerNorm(in_dim, eps=norm_eps)
        # whether the block pools its input (CoAtNet's first transformer block of a stage)
        self.downsamples = in_grid is not None
        if in_grid is not None:
            self.pool1 = TokenPool(pool, in_grid)
            self.shortcut = PoolShortcut(in_dim, dim, pool, in_grid, bias=shortcut_bias)
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
        """The MLP (and a downsampling block's shortcut projection) as the block's ``init`` says: ``trunc_normal`` as
        timm's ViT ``init_weights_vit_timm``, ConViT and CaiT ``_init_weights`` -- ``trunc_normal_(std=.02)``, zero
        biases; ``xavier`` as timm ``MaxxVit``'s ``_init_transformer`` -- ``xavier_uniform_``, zero biases but the
        MLP's ``normal(std=1e-6)`` (timm's ``'mlp' in name``).  The mixer initialises itself, the LayerNorms keep
        weight 1 and bias 0, LayerScale its init value."""
        expand = getattr(getattr(self, "shortcut", None), "expand", None)
        for linear, mlp in ((self.mlp.fc1, True), (self.mlp.fc2, True), (expand, False)):
            if not isinstance(linear, nn.Linear):
                continue
            if self.init == "xavier":
                nn.init.xavier_uniform_(linear.weight)
                if linear.bias is not None:
                    nn.init.normal_(linear.bias, std=1e-6) if mlp else nn.init.zeros_(linear.bias)
                continue
            trunc_normal_(linear.weight, std=0.02)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def set_grid(self, grid: tuple[int, int]) -> None:
        """Take tokens on ``grid`` from now on: a downsampling block's pools move to it and its mixer to the pooled
        grid; another block's mixer to ``grid`` (an :class:`~archspec.families.attention.module.Attention` rebuilds its
        tables, a conv mixer runs on any grid).

        Raises:
            ValueError: an odd side of a downsampling block's grid; what the mixer's ``set_grid`` raises.
        """
        if self.downsamples:
            self.pool1.set_grid(grid)
            self.shortcut.pool.set_grid(grid)
            grid = self.pool1.out_grid
        if tuple(self.attn.grid) == tuple(grid):
            return
        if hasattr(self.attn, "set_grid"):
            self.attn.set_grid(grid)
        else:  # ConvMixer: a convolution runs on any grid
            self.attn.grid = tuple(grid)

    @property
    def out_grid(self) -> tuple[int, int]:
        """The grid of the block's output: its mixer's."""
        return tuple(self.attn.grid)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, C) -> (B, N, C)``; a downsampling block ``(B, H W, C_in) -> (B, H W / 4, C)``."""
        if self.downsamples:
            x = self.shortcut(x) + self.drop_path1(self.ls1(self.attn(self.pool1(self.norm1(x)))))
        else:
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
    entry = shape.entry
    return TransformerBlock(shape.dim, mixer, mlp_ratio=shape.mlp_ratio, act_layer=act, norm_eps=shape.norm_eps,
                            drop_path=shape.drop_path, layer_scale=shape.layer_scale, in_dim=shape.in_dim,
                            in_grid=None if entry is None else entry.in_grid,
                            pool="avg2" if entry is None else entry.pool,
                            shortcut_bias=True if entry is None else entry.shortcut_bias, init=shape.init)
