"""The map-to-token interface of a hybrid (rules and sources: :mod:`.rules`)."""

from __future__ import annotations

from torch import Tensor, nn

from .rules import InterfaceShape

__all__ = ["MapToTokens", "build"]


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


def build(shape: InterfaceShape) -> MapToTokens:
    """The interface of ``shape``."""
    return MapToTokens(shape.channels, shape.dim, shape.grid, shape.proj, shape.pool)
