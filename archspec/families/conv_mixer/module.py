"""CMHSA's convolution phase (Li et al., "Can Vision Transformers Perform Convolution?"): the conv token mixer.

:class:`ConvMixer` is a K x K convolution over the pixel view of the tokens (Thm. 1); its torch-free rules
(shape, checks, counts, memory) are :mod:`.rules`.  The zero-padding tokens of App. A.2's attention are the
attention family's (:class:`archspec.families.attention.module.ZeroPadTokens`).
"""

from __future__ import annotations

from torch import Tensor, nn

from .rules import ConvMixerShape

__all__ = ["ConvMixer", "tokens_to_pixels", "pixels_to_tokens", "build"]


def tokens_to_pixels(x: Tensor, grid: tuple[int, int], patch: int) -> Tensor:
    """Pixel view of patch tokens: ``(B, N, c P P) -> (B, c, H P, W P)``.

    A token holds its ``P x P x c`` pixels channel-major ``(c, i, j)``, the order of
    :class:`archspec.families.stem.module.IdentityStem` (``nn.Unfold``); tokens are row-major on the ``(H, W)`` grid.
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


def build(shape: ConvMixerShape) -> ConvMixer:
    """The module of a :class:`~.rules.ConvMixerShape` (raises as :class:`ConvMixer`)."""
    return ConvMixer(shape.dim, shape.kernel, shape.grid, shape.patch)
