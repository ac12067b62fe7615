"""Stems turning images ``(B, C_in, H, W)`` into tokens: torch-free rules -- spec models, shape, the one
grid rule, checks, parameters, MACs, memory and the name of the first convolution.

Three kinds: ViT's patch embedding (timm ``PatchEmbed``), LeViT's convolutional stem (sec. 4.2: 3x3
stride-2 convs with BatchNorm, timm ``levit.Stem16``) and CMHSA's identity patch stem (App. B: a token is its
raw ``P x P x C`` pixels).  The modules are in :mod:`archspec.families.stems.module`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, field_validator

from archspec.memory import F32, NodeMemory
from archspec.strict_model import StrictModel

__all__ = ["PatchStemSpec", "ConvStemSpec", "IdentityStemSpec", "StemSpec", "StemShape", "plan", "grid",
           "reduction", "counts", "memory", "batchnorm_channels", "first_conv_name", "NO_WEIGHT_DECAY", "MAX_DIM"]

MAX_DIM = 4096
NO_WEIGHT_DECAY: frozenset[str] = frozenset()
DEFAULT_CONV_LAYERS = 4  # LeViT's stem: C/8, C/4, C/2, C


class PatchStemSpec(StrictModel):
    """ViT patchify stem: a ``patch_size`` x ``patch_size`` stride-``patch_size`` convolution (timm ``PatchEmbed``)."""

    kind: Literal["patch"] = "patch"
    patch_size: int = Field(16, ge=1, le=64, description="Patch side P in pixels; tokens = (H/P) (W/P).")


class ConvStemSpec(StrictModel):
    """LeViT conv stem: 3x3 stride-2 conv + BatchNorm layers with an activation between (LeViT sec. 4.2)."""

    kind: Literal["conv"] = "conv"
    channels: list[int] | None = Field(
        None, min_length=1, max_length=6,
        description="Output channels of each 3x3 stride-2 conv; default [C/8, C/4, C/2, C] for the first stage's C. "
        "The last must equal the first stage's dim.",
    )
    activation: Literal["hardswish", "gelu", "relu"] = Field("hardswish", description="Activation between conv layers.")

    @field_validator("channels")
    @classmethod
    def _positive(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(not 1 <= c <= MAX_DIM for c in value):
            raise ValueError(f"stem channels must be between 1 and {MAX_DIM}")
        return value


class IdentityStemSpec(StrictModel):
    """Identity patch projection (CMHSA phase 1): a token is the raw flattened P x P patch, dim = P^2 C_in."""

    kind: Literal["identity"] = "identity"
    patch_size: int = Field(16, ge=1, le=64, description="Patch side P in pixels.")


StemSpec = Annotated[PatchStemSpec | ConvStemSpec | IdentityStemSpec, Field(discriminator="kind")]


@dataclass(frozen=True)
class StemShape:
    """A stem of ``kind`` from ``in_chans`` channels at ``img_size`` to tokens of width ``dim``: a patch side
    ``patch_size`` (patch, identity) or the conv layers' ``channels`` and ``act`` (conv)."""

    kind: str
    in_chans: int
    img_size: tuple[int, int]
    dim: int
    patch_size: int | None = None
    channels: tuple[int, ...] = ()
    act: str = "hardswish"


def grid(kind: str, img_size: Sequence[int], patch_size: int | None = None, conv_layers: int = DEFAULT_CONV_LAYERS
         ) -> tuple[int, int]:
    """Token grid ``(H, W)`` a stem makes of an image of ``img_size`` pixels: ``(H / P, W / P)`` for patch and
    identity stems (floor), ``conv_layers`` times ``s -> (s - 1) // 2 + 1`` for the conv stem (3x3, stride 2,
    padding 1).  Raises nothing."""
    h, w = int(img_size[0]), int(img_size[1])
    if kind == "conv":
        for _ in range(conv_layers):
            h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        return h, w
    return h // patch_size, w // patch_size


def reduction(kind: str, patch_size: int | None = None, conv_layers: int = DEFAULT_CONV_LAYERS) -> int:
    """Pixels per token side after the stem: the patch size, or ``2 ** layers`` for the conv stem."""
    return 2 ** conv_layers if kind == "conv" else patch_size


def first_conv_name(kind: str) -> str | None:
    """The stem's first convolution, as timm's cfgs name it: ``stem.proj`` for the patch stem (timm ViT's
    ``patch_embed.proj``), ``stem.conv1.linear`` for LeViT's conv stem (timm LeViT's); None for the identity
    stem, which has no weights (its token width is ``channels x patch^2``: another ``in_chans`` is another
    architecture)."""
    return {"patch": "stem.proj", "conv": "stem.conv1.linear"}.get(kind)


def plan(stem: PatchStemSpec | ConvStemSpec | IdentityStemSpec, in_chans: int, img_size: tuple[int, int],
         first_dim: int) -> tuple[StemShape, list[tuple[tuple, str, str]]]:
    """The stem's shape and its problems ``(path, message, hint)``: a patch that does not divide the input, an
    identity stem whose token width is not the first stage's, conv channels that do not end at it."""
    if stem.kind == "conv":
        return _plan_conv(stem, in_chans, img_size, first_dim)
    p, (height, width) = stem.patch_size, img_size
    out = []
    if height % p or width % p:
        out.append((("stem", "patch_size"), f"patch size {p} does not divide the input resolution {height}x{width}",
                    f"use a resolution that is a multiple of {p}, e.g. {max(p, height // p * p)}"))
    dim = first_dim if stem.kind == "patch" else in_chans * p * p
    if stem.kind == "identity" and first_dim != dim:
        out.append((("stages", 0, "dim"), f"an identity stem makes tokens of P^2 C = {p}*{p}*{in_chans} = {dim} "
                    f"values, but stages[0].dim is {first_dim}", f"set stages[0].dim: {dim}"))
    return StemShape(stem.kind, in_chans, tuple(img_size), dim, patch_size=p), out


def _plan_conv(stem: ConvStemSpec, in_chans: int, img_size: tuple[int, int], first_dim: int
               ) -> tuple[StemShape, list[tuple[tuple, str, str]]]:
    channels, out = stem.channels, []
    if channels is None:
        if first_dim % 8:
            out.append((("stem", "channels"), "default conv stem channels [C/8, C/4, C/2, C] need stages[0].dim "
                        f"divisible by 8, got {first_dim}", "give stem.channels explicitly"))
        channels = [max(first_dim // 8, 1), max(first_dim // 4, 1), max(first_dim // 2, 1), first_dim]
    elif channels[-1] != first_dim:
        out.append((("stem", "channels"), f"the conv stem ends with {channels[-1]} channels but stages[0].dim is "
                    f"{first_dim}", f"make the last entry {first_dim}"))
    shape = StemShape("conv", in_chans, tuple(img_size), channels[-1], channels=tuple(channels), act=stem.activation)
    return shape, out


def out_grid(shape: StemShape) -> tuple[int, int]:
    """The token grid after the stem (:func:`grid`)."""
    return grid(shape.kind, shape.img_size, shape.patch_size, len(shape.channels))


def _conv_layers(shape: StemShape) -> list[tuple[int, int, int, int]]:
    """Per conv layer ``(c_in, c_out, h_out, w_out)``."""
    layers, (h, w), c = [], shape.img_size, shape.in_chans
    for c_out in shape.channels:
        h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        layers.append((c, c_out, h, w))
        c = c_out
    return layers


def counts(shape: StemShape) -> tuple[int, int]:
    """(params, MACs per image): patch ``C_in P^2 C + C`` and ``N C_in P^2 C``; conv, per layer, ``9 c_in c_out``
    weights + 2 BatchNorm parameters per channel and ``H_out W_out 9 c_in c_out`` MACs; identity 0 and 0."""
    if shape.kind == "conv":
        layers = _conv_layers(shape)
        return (sum(9 * c * c_out + 2 * c_out for c, c_out, _, _ in layers),
                sum(h * w * 9 * c * c_out for c, c_out, h, w in layers))
    if shape.kind == "identity":
        return 0, 0
    rows, cols = out_grid(shape)
    k = shape.in_chans * shape.patch_size ** 2
    return k * shape.dim + shape.dim, rows * cols * k * shape.dim


def memory(shape: StemShape) -> NodeMemory:
    """Bytes (batch 1, float32): a conv + BatchNorm layer holds its input, the conv output and the BN output at
    once; the activation between layers makes a third copy (``saved``).  The image itself is counted by the
    graph (it stays alive for the whole forward)."""
    if shape.kind == "conv":
        outputs, copies = [h * w * c_out for _, c_out, h, w in _conv_layers(shape)], 2
    else:
        rows, cols = out_grid(shape)
        outputs, copies = [rows * cols * shape.dim], 1
    inputs = [0] + outputs[:-1]
    act = max(i + copies * o for i, o in zip(inputs, outputs))
    saved = sum((copies + (1 if shape.kind == "conv" else 0)) * o for o in outputs)
    return NodeMemory(act=F32 * act, saved=F32 * saved)


def batchnorm_channels(shape: StemShape) -> int:
    """BatchNorm channels ``model.fuse()`` folds away: every conv layer's (conv stem)."""
    return sum(shape.channels)


def label(shape: StemShape) -> str:
    """The analysis table's kind: ``patch16``, ``identity16``, ``conv4``."""
    return f"conv{len(shape.channels)}" if shape.kind == "conv" else f"{shape.kind}{shape.patch_size}"
