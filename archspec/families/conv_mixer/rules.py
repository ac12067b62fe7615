"""CMHSA's convolution phase (Li et al., "Can Vision Transformers Perform Convolution?", Thm. 1, sec. 4.1):
the conv token mixer's torch-free rules -- shape, checks, parameters, MACs, memory.

A token of width ``d = P^2 c`` is a ``P x P x c`` block of pixels, so the mixer is a ``K x K`` convolution on
the ``(H P) x (W P)`` pixel view with ``c`` channels (``P = 1``: a conv on the token grid).  The module is
:class:`archspec.families.conv_mixer.module.ConvMixer`.
"""

from __future__ import annotations

from dataclasses import dataclass

from archspec._util.memory import F32, NodeMemory

__all__ = ["ConvMixerShape", "counts", "memory", "label", "problems", "NO_WEIGHT_DECAY"]

NO_WEIGHT_DECAY: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ConvMixerShape:
    """A conv token mixer on a ``grid`` of tokens of width ``dim``: ``kernel`` ``K``, pixel-view patch ``P``."""

    dim: int
    kernel: int
    grid: tuple[int, int]
    patch: int


def counts(shape: ConvMixerShape) -> tuple[int, int]:
    """(params, MACs per image): with ``c = dim / P^2`` channels, ``K^2 c^2 + c`` parameters and
    ``H W P^2 K^2 c^2`` MACs (a same-size ``K x K`` conv on the ``(H P) x (W P)`` pixel view)."""
    c = shape.dim // (shape.patch * shape.patch)
    k2 = shape.kernel * shape.kernel
    return k2 * c * c + c, shape.grid[0] * shape.grid[1] * shape.patch * shape.patch * k2 * c * c


def memory(shape: ConvMixerShape) -> NodeMemory:
    """Bytes (batch 1, float32; rule in :mod:`archspec.ir.plan`) of the conv half of a block: its input, the norm
    output, the ``(B, c, H P, W P)`` copy, the conv output and the residual sum."""
    x = shape.grid[0] * shape.grid[1] * shape.dim
    return NodeMemory(act=F32 * 5 * x, saved=F32 * 4 * x)


def label(shape: ConvMixerShape) -> tuple[str, str]:
    """``(kind, heads)`` of the analysis table: ``conv3`` and ``conv3x3`` (``/P4`` for a pixel view of 4x4 patches)."""
    k = shape.kernel
    return f"conv{k}", f"conv{k}x{k}" + (f"/P{shape.patch}" if shape.patch > 1 else "")


def problems(dim: int, kernel: int, grid: tuple[int, int], patch: int | None, n_prefix: int,
             where: tuple) -> list[tuple[tuple, str, str]]:
    """``(path, message, hint)`` of a conv mixer that cannot run: a class token present, no pixel view (a conv
    stem without ``mixer.patch``), ``P^2`` not dividing ``dim``, a kernel larger than the pixel grid.
    ``patch`` None means no pixel view could be derived."""
    out = []
    if n_prefix:
        out.append((where, "a conv token mixer needs a pure token grid, but a class/distillation token is present",
                    "use tokens.cls_token: none with head.pool: mean (CMHSA phase 1)"))
    if patch is None:
        out.append((where, "a conv mixer's pixel view needs a patch size, and a conv stem has none",
                    "set mixer: {kind: conv, patch: P} (1 = conv on the token grid)"))
    elif dim % (patch * patch):
        out.append((where, f"the conv mixer's pixel view needs dim {dim} to be a multiple of patch**2 = "
                    f"{patch * patch} (a token is a PxPxc block of pixels)",
                    "use a patch that fits, or token_conv3 for a conv on the token grid"))
    elif kernel > 2 * max(grid) * patch + 1:
        out.append((where + ("kernel",), f"conv kernel {kernel} is larger than the {grid[0] * patch}x{grid[1] * patch} "
                    f"{'token' if patch == 1 else 'pixel'} grid allows",
                    f"use a kernel of at most {2 * max(grid) * patch + 1}"))
    return out
