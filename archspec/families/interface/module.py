"""The map-to-token interface of a hybrid (rules and sources: :mod:`.rules`)."""

from __future__ import annotations

from torch import Tensor, nn

from .rules import InterfaceShape, TokensToMapShape

__all__ = ["MapToTokens", "TokensToMap", "build"]


class MapToTokens(nn.Module):
    """Feature map ``(B, C, H, W)`` -> tokens ``(B, gh gw, D)``: ``nn.AdaptiveAvgPool2d(grid)`` with ``pool`` (LeViT
    sec. 3.2; at any input size), a 1x1 conv + bias ``C -> D`` when ``proj`` (timm ``HybridEmbed``'s
    ``proj`` with ``patch_size=1``, PyTorch's default init as there), then row-major flattening (timm's
    ``flatten(2).transpose(1, 2)``)."""

    def __init__(self, channels: int, dim: int, grid: tuple[int, int], proj: bool, pool: bool):
        super().__init__()
        self.grid = tuple(grid)
        self.pool = nn.AdaptiveAvgPool2d(self.grid) if pool else nn.Identity()
        self.proj = nn.Conv2d(channels, dim, kernel_size=1) if proj else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.pool(x)).flatten(2).transpose(1, 2)


class TokensToMap(nn.Module):
    """Tokens ``(B, n_prefix + gh gw, C)`` -> map ``(B, C, gh, gw)`` (a conv stage after attention stages): the
    ``n_prefix`` class/distillation tokens are dropped and the patch tokens laid out row-major on ``grid`` (timm
    ``forward_intermediates``' NCHW reshape).  ``grid`` is the token grid at the spec's input size; the model passes
    the grid of the actual input at forward.  No weights."""

    def __init__(self, grid: tuple[int, int], n_prefix: int):
        super().__init__()
        self.grid = tuple(grid)
        self.n_prefix = n_prefix

    def forward(self, x: Tensor, grid: tuple[int, int] | None = None) -> Tensor:
        rows, cols = self.grid if grid is None else grid
        return x[:, self.n_prefix:].transpose(1, 2).reshape(x.shape[0], x.shape[2], rows, cols)


def build(shape: InterfaceShape | TokensToMapShape) -> MapToTokens | TokensToMap:
    """The interface of ``shape``."""
    if isinstance(shape, TokensToMapShape):
        return TokensToMap(shape.grid, shape.n_prefix)
    return MapToTokens(shape.channels, shape.dim, shape.grid, shape.proj, shape.pool)
