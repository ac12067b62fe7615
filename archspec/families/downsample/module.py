"""Token-grid downsampling between hierarchical stages: Swin's patch merging (timm ``swin_transformer.PatchMerging``,
reused as is) and NAT's convolutional downsampler, on row-major tokens ``(B, H*W, C)``.

Their torch-free rules (spec, shape, checks, counts, memory, output grid) are :mod:`.rules`.
"""

from __future__ import annotations

from functools import partial

from timm.layers import trunc_normal_
from timm.models.swin_transformer import PatchMerging
from torch import Tensor, nn

from .rules import DownsampleShape

__all__ = ["TokenPatchMerging", "ConvDownsample", "build"]


def _halved(grid: tuple[int, int]) -> tuple[int, int]:
    return (int(grid[0]) + 1) // 2, (int(grid[1]) + 1) // 2


class _GridTokens:
    """What both downsamplers share: the input grid they reshape the tokens to, the halved grid they return, and
    a shape check."""

    grid: tuple[int, int]
    out_grid: tuple[int, int]
    in_dim: int

    def set_grid(self, grid: tuple[int, int]) -> None:
        """Take tokens on ``grid`` ``(H, W)`` from now on (no weights depend on the grid); :attr:`out_grid` becomes
        ``(ceil(H/2), ceil(W/2))``.

        Raises:
            ValueError: a side < 1.
        """
        if min(grid) < 1:
            raise ValueError(f"grid sides must be at least 1, got {tuple(grid)}")
        self.grid, self.out_grid = (int(grid[0]), int(grid[1])), _halved(grid)

    def _as_map(self, x: Tensor) -> Tensor:
        """``(B, H*W, C) -> (B, H, W, C)``, checked."""
        rows, cols = self.grid
        if x.dim() != 3 or x.shape[1] != rows * cols or x.shape[2] != self.in_dim:
            raise ValueError(f"{type(self).__name__} expects (B, {rows * cols}, {self.in_dim}), got {tuple(x.shape)}")
        return x.reshape(x.shape[0], rows, cols, self.in_dim)


class TokenPatchMerging(_GridTokens, PatchMerging):
    """Swin's patch merging on row-major tokens: timm ``swin_transformer.PatchMerging`` (``norm`` =
    LayerNorm(4 C_in), ``reduction`` = Linear(4 C_in, C_out, bias=False)) with the tokens laid out on their grid.

    timm's order of the merged vector: offsets (row, col) ``(0,0), (1,0), (0,1), (1,1)``, each ``C_in`` channels
    (Swin's ``x0, x1, x2, x3``); an odd side is zero-padded at the bottom / right before merging (timm).  The
    reduction is initialised trunc-normal(.02), as timm ``SwinTransformer`` initialises every Linear.

    Shapes: ``(B, H*W, C_in) -> (B, ceil(H/2)*ceil(W/2), C_out)``.  MACs: ``ceil(H/2) ceil(W/2) 4 C_in C_out``.

    Raises:
        ValueError: (in ``forward``) tokens not ``(B, H*W, C_in)``.
    """

    def __init__(self, in_dim: int, out_dim: int, grid: tuple[int, int], norm_eps: float = 1e-5) -> None:
        super().__init__(in_dim, out_dim, norm_layer=partial(nn.LayerNorm, eps=norm_eps))
        trunc_normal_(self.reduction.weight, std=0.02)
        self.in_dim, self.out_dim = in_dim, out_dim
        self.set_grid(grid)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H*W, C_in) -> (B, ceil(H/2)*ceil(W/2), C_out)``."""
        return super().forward(self._as_map(x)).flatten(1, 2)


class ConvDownsample(_GridTokens, nn.Module):
    """NAT's convolutional downsampler on row-major tokens (Hassani et al. 2022, sec. 3.2; the authors'
    ``ConvDownsampler``, Hugging Face ``NatDownsampler``): ``reduction`` = Conv2d(C_in, C_out, 3, stride 2,
    padding 1, bias=False), then ``norm`` = LayerNorm(C_out) on the tokens.  PyTorch's default conv init (NAT
    initialises only its Linears).

    Shapes: ``(B, H*W, C_in) -> (B, ceil(H/2)*ceil(W/2), C_out)``.  MACs: ``ceil(H/2) ceil(W/2) 9 C_in C_out``.

    Raises:
        ValueError: (in ``forward``) tokens not ``(B, H*W, C_in)``.
    """

    def __init__(self, in_dim: int, out_dim: int, grid: tuple[int, int], norm_eps: float = 1e-5) -> None:
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.reduction = nn.Conv2d(in_dim, out_dim, kernel_size=3, stride=2, padding=1, bias=False)
        self.norm = nn.LayerNorm(out_dim, eps=norm_eps)
        self.set_grid(grid)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H*W, C_in) -> (B, ceil(H/2)*ceil(W/2), C_out)``."""
        x = self.reduction(self._as_map(x).permute(0, 3, 1, 2))
        return self.norm(x.flatten(2).transpose(1, 2))


def build(shape: DownsampleShape) -> nn.Module:
    """The module of a :class:`~.rules.DownsampleShape`: :class:`TokenPatchMerging` or :class:`ConvDownsample`.

    Raises:
        ValueError: an unknown kind (the spec allows only the two).
    """
    kinds = {"patch_merging": TokenPatchMerging, "conv": ConvDownsample}
    if shape.kind not in kinds:
        raise ValueError(f"no downsample kind {shape.kind!r}; known: {', '.join(kinds)}")
    return kinds[shape.kind](shape.in_dim, shape.out_dim, shape.grid, shape.norm_eps)
