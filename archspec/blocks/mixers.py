"""Token mixers of CMHSA's two-phase training (Li et al., "Can Vision Transformers Perform Convolution?").

* :class:`ConvMixer` -- the convolution phase: a K x K convolution over the pixel view of the tokens (Thm. 1).
  The block family ``conv_mixer``: this file also holds its count and memory rules (:func:`conv_mixer_counts`,
  :func:`conv_mixer_memory`), registered as :data:`FAMILY` (see :mod:`archspec.families`).
* :class:`ZeroPadTokens` -- runs an attention layer over the token grid surrounded by zero tokens, the
  zero-padding tokens App. A.2's construction needs to stay exact on border patches (a wrapper of the
  ``Attention`` family: its counts are the attention's on the padded grid).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from archspec.families import BlockFamily
from archspec.memory import F32, NodeMemory

__all__ = ["ConvMixer", "ZeroPadTokens", "tokens_to_pixels", "pixels_to_tokens", "conv_mixer_counts",
           "conv_mixer_memory", "FAMILY"]


def tokens_to_pixels(x: Tensor, grid: tuple[int, int], patch: int) -> Tensor:
    """Pixel view of patch tokens: ``(B, N, c P P) -> (B, c, H P, W P)``.

    A token holds its ``P x P x c`` pixels channel-major ``(c, i, j)``, the order of
    :class:`archspec.blocks.stems.IdentityStem` (``nn.Unfold``); tokens are row-major on the ``(H, W)`` grid.
    """
    B, N, D = x.shape
    rows, cols = grid
    c = D // (patch * patch)
    x = x.reshape(B, rows, cols, c, patch, patch).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(B, c, rows * patch, cols * patch)


def pixels_to_tokens(x: Tensor, patch: int) -> Tensor:
    """Inverse of :func:`tokens_to_pixels`: ``(B, c, H P, W P) -> (B, N, c P P)``."""
    B, c, h, w = x.shape
    rows, cols = h // patch, w // patch
    x = x.reshape(B, c, rows, patch, cols, patch).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(B, rows * cols, c * patch * patch)


class ConvMixer(nn.Module):
    """``K x K`` convolution over the pixel view of the tokens, in place of MHSA (CMHSA sec. 4.1, phase 1).

    A token of width ``d = P^2 c`` is a ``P x P x c`` block of pixels (Thm. 1's patch-input setting), so
    ``(B, N, d)`` -> :func:`tokens_to_pixels` ``(B, c, H P, W P)`` -> ``Conv2d(c, c, K, padding=K // 2)``
    -> ``(B, N, d)``.  With an identity stem the first layer's conv is a conv on the input image itself.
    ``patch = 1`` is a convolution on the token grid with ``d`` channels.  Zero padding keeps the size.
    No prefix tokens (the convolution phase has no class token).  Parameters ``K^2 c^2 + c``; MACs
    ``N P^2 K^2 c^2``.  The conv module is named ``conv``.

    Args:
        dim: token width ``d``.
        kernel: odd kernel size ``K`` (3 or 5 in the paper).
        grid: ``(H, W)`` token grid.
        patch: pixel-view patch side ``P`` (``P^2`` must divide ``dim``).

    Raises:
        ValueError: for an even or non-positive kernel, a grid side < 1, ``P^2`` not dividing ``dim``, or (in
            ``forward``) an input whose ``N`` is not ``H * W`` or whose width is not ``dim``.
    """

    def __init__(self, dim: int, kernel: int, grid: tuple[int, int], patch: int = 1) -> None:
        super().__init__()
        if kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"ConvMixer kernel must be odd and positive (same-size output), got {kernel}")
        rows, cols = int(grid[0]), int(grid[1])
        if rows < 1 or cols < 1:
            raise ValueError(f"grid sides must be >= 1, got {grid!r}")
        if patch < 1 or dim % (patch * patch):
            raise ValueError(f"the pixel view needs patch**2 to divide dim, got patch {patch}, dim {dim}")
        self.dim = dim
        self.kernel = kernel
        self.grid = (rows, cols)
        self.patch = patch
        self.channels = dim // (patch * patch)
        self.conv = nn.Conv2d(self.channels, self.channels, kernel, padding=kernel // 2, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, d) -> (B, N, d)`` with ``N = H * W``."""
        rows, cols = self.grid
        if x.dim() != 3 or x.shape[1] != rows * cols or x.shape[2] != self.dim:
            raise ValueError(f"ConvMixer expects (B, {rows * cols}, {self.dim}), got {tuple(x.shape)}")
        y = self.conv(tokens_to_pixels(x, self.grid, self.patch))
        return pixels_to_tokens(y, self.patch)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, grid={self.grid}, patch={self.patch}, channels={self.channels}"


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


# ------------------------------------------------------------------------------------------- rules
def conv_mixer_counts(dim: int, kernel: int, grid: tuple[int, int], patch: int) -> tuple[int, int]:
    """(params, MACs per image) of :class:`ConvMixer`: with ``c = dim / P^2`` channels, ``K^2 c^2 + c`` parameters
    and ``H W P^2 K^2 c^2`` MACs (a same-size ``K x K`` conv on the ``(H P) x (W P)`` pixel view)."""
    c = dim // (patch * patch)
    return kernel * kernel * c * c + c, grid[0] * grid[1] * patch * patch * kernel * kernel * c * c


def conv_mixer_memory(dim: int, kernel: int, grid: tuple[int, int], patch: int) -> NodeMemory:
    """Bytes (batch 1, float32; rule in :mod:`archspec.graph`) of the conv half of a block: its input, the norm
    output, the ``(B, c, H P, W P)`` copy, the conv output and the residual sum."""
    x = grid[0] * grid[1] * dim
    return NodeMemory(act=F32 * 5 * x, saved=F32 * 4 * x)


def build_conv_mixer(dim: int, kernel: int, grid: tuple[int, int], patch: int) -> ConvMixer:
    """The module for the same shape as the count rule."""
    return ConvMixer(dim, kernel, grid, patch)


FAMILY = BlockFamily("conv_mixer", counts=conv_mixer_counts, memory=conv_mixer_memory, build=build_conv_mixer)
