"""CMHSA's zero padding tokens (App. A.2): :class:`ZeroPadTokens`, an attention layer run on the token grid padded
with rings of zero tokens, so that attention reproduces a convolution's zero padding at the image border.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ZeroPadTokens"]


class ZeroPadTokens(nn.Module):
    """An attention layer over the token grid padded with ``pad`` rings of zero tokens (CMHSA App. A.2).

    ``(B, H W, C)`` -> zero-pad the grid to ``(H + 2 pad) x (W + 2 pad)`` -> ``attn`` (built for the padded
    grid, no prefix tokens) -> keep the ``H W`` inner outputs -> ``(B, H W, C)``.  The padding tokens are
    keys and values like any token: with App. A.2's ``W_V = I`` and zero value bias their values are 0, so a
    border query whose conv neighbour lies outside the image reads zeros, as the convolution's zero padding
    does.  MACs: those of ``attn`` on ``(H + 2 pad)(W + 2 pad)`` tokens.  The inner module is named ``attn``.

    Args:
        attn: attention ``(B, N', C) -> (B, N', C)`` on the padded grid, ``N' = (H + 2 pad)(W + 2 pad)``.
        grid: ``(H, W)`` unpadded token grid.
        pad: rings of padding tokens (``ceil((K - 1) / (2 P))`` for a K x K conv on P x P patches).

    Raises:
        ValueError: for ``pad < 1`` or (in ``forward``) an input that is not ``(B, H W, C)``.
    """

    def __init__(self, attn: nn.Module, grid: tuple[int, int], pad: int) -> None:
        super().__init__()
        if pad < 1:
            raise ValueError(f"pad must be >= 1, got {pad}")
        self.attn = attn
        self.grid = (int(grid[0]), int(grid[1]))
        self.pad = pad

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H W, C) -> (B, H W, C)``."""
        rows, cols = self.grid
        if x.dim() != 3 or x.shape[1] != rows * cols:
            raise ValueError(f"ZeroPadTokens expects (B, {rows * cols}, C), got {tuple(x.shape)}")
        B, N, C = x.shape
        p = self.pad
        padded = F.pad(x.reshape(B, rows, cols, C), (0, 0, p, p, p, p))
        out = self.attn(padded.reshape(B, (rows + 2 * p) * (cols + 2 * p), C))
        out = out.reshape(B, rows + 2 * p, cols + 2 * p, C)[:, p:p + rows, p:p + cols]
        return out.reshape(B, N, C)

    def set_grid(self, grid: tuple[int, int]) -> None:
        """Move to another token grid ``(H', W')`` (a new input size): the inner attention moves to the padded
        ``(H' + 2 pad, W' + 2 pad)`` (``Attention.set_grid``, which resamples its bias tables)."""
        self.grid = (int(grid[0]), int(grid[1]))
        self.attn.set_grid((self.grid[0] + 2 * self.pad, self.grid[1] + 2 * self.pad))

    def extra_repr(self) -> str:
        return f"grid={self.grid}, pad={self.pad}"
