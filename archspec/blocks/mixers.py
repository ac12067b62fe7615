"""Convolutional token mixer: the phase-1 replacement of MHSA in CMHSA's two-phase training."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["ConvMixer"]


class ConvMixer(nn.Module):
    """``K x K`` convolution over the token grid, used in place of MHSA (CMHSA paper, sec. 4.1, phase 1).

    ``(B, N, C)`` -> reshape to ``(B, C, H, W)`` (tokens row-major) -> ``Conv2d(C, C, K, padding=K // 2, bias=True)``
    -> ``(B, N, C)``.  Zero padding keeps the grid size.  No prefix tokens (the convolution phase has no
    class token; classification uses global average pooling).  The conv module is named ``conv``.

    Args:
        dim: token width ``C`` (in and out channels).
        kernel: odd kernel size ``K`` (3 or 5 in the paper).
        grid: ``(H, W)`` token grid.

    Raises:
        ValueError: for an even or non-positive kernel, a grid side < 1, or (in ``forward``) an input whose
            ``N`` is not ``H * W`` or whose width is not ``dim``.
    """

    def __init__(self, dim: int, kernel: int, grid: tuple[int, int]) -> None:
        super().__init__()
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"ConvMixer kernel must be odd and positive (same-size output), got {kernel}")
        rows, cols = int(grid[0]), int(grid[1])
        if rows < 1 or cols < 1:
            raise ValueError(f"grid sides must be >= 1, got {grid!r}")
        self.dim = dim
        self.kernel = kernel
        self.grid = (rows, cols)
        self.conv = nn.Conv2d(dim, dim, kernel, padding=kernel // 2, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, C) -> (B, N, C)`` with ``N = H * W``."""
        rows, cols = self.grid
        if x.dim() != 3 or x.shape[1] != rows * cols or x.shape[2] != self.dim:
            raise ValueError(f"ConvMixer expects (B, {rows * cols}, {self.dim}), got {tuple(x.shape)}")
        B, N, C = x.shape
        y = self.conv(x.transpose(1, 2).reshape(B, C, rows, cols))
        return y.flatten(2).transpose(1, 2)
