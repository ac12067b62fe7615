"""Conv stages of ResNet residual blocks: torch-free rules -- the stage's spec model, the block's shape, the
checks that need the map's size, parameters, MACs, memory and the table label.

A conv stage is ``depth`` residual blocks of timm ``resnet.BasicBlock`` (two 3x3 convs, He et al. 2016 fig. 5
left) or ``resnet.Bottleneck`` (1x1 -> 3x3 -> 1x1 with expansion 4, fig. 5 right), as timm's ``make_blocks``
stacks them: the first block strides (in its first 3x3 conv) and, when the stride or the width changes,
has a downsample shortcut -- a 1x1 strided conv + BatchNorm (``conv``, timm ``downsample_conv``) or
ResNet-D's 2x2 average pool then a 1x1 conv + BatchNorm (``avg``, timm ``downsample_avg``, He et al. 2019
fig. 2c).  Optional squeeze-excitation after the last conv (timm ``SEModule``, ResNet-RS: ``rd_ratio`` 0.25).
Every conv is bias-free and followed by a BatchNorm; activations are ReLU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from archspec.memory import F32, NodeMemory
from archspec.strict_model import DropPathRate, StrictModel

__all__ = ["SESpec", "ConvStageSpec", "ConvBlockShape", "se_channels", "plan", "counts", "memory", "out_grid",
           "batchnorm_channels", "label", "strided_grid", "NO_WEIGHT_DECAY", "EXPANSION"]

NO_WEIGHT_DECAY: frozenset[str] = frozenset()
MAX_DIM = 4096
MAX_DEPTH = 64
EXPANSION = {"basic": 1, "bottleneck": 4}  # timm BasicBlock.expansion, Bottleneck.expansion


class SESpec(StrictModel):
    """Squeeze-excitation after the block's last conv (Hu et al. 2018; timm ``SEModule``): global average pool,
    1x1 conv to ``rd`` channels with bias, ReLU, 1x1 conv back with bias, sigmoid gate."""

    rd_ratio: float = Field(0.0625, gt=0, le=1, description="Reduction: rd = channels x rd_ratio rounded to a "
                            "multiple of rd_divisor (timm make_divisible); 0.25 in ResNet-RS, timm's default 1/16.")
    rd_divisor: int = Field(8, ge=1, le=64, description="rd is a multiple of this (at least this).")


class ConvStageSpec(StrictModel):
    """A conv stage (``kind: conv``): ``depth`` ResNet residual blocks of ``block`` with ``channels`` output
    channels; the first block strides by ``stride`` and gets a ``downsample`` shortcut when the stride or the
    width changes (timm ``resnet.make_blocks``)."""

    kind: Literal["conv"] = Field("conv", description="'conv': ResNet residual blocks on a feature map "
                                  "(stages without 'kind' are attention stages).")
    block: Literal["basic", "bottleneck"] = Field(..., description="'basic': two 3x3 convs (ResNet-18/34); "
                                                  "'bottleneck': 1x1, 3x3, 1x1 (ResNet-50 and up).")
    depth: int = Field(..., ge=1, le=MAX_DEPTH, description="Number of blocks.")
    channels: int = Field(..., ge=1, le=MAX_DIM, description="Output channels of every block (timm: planes x "
                          "expansion, e.g. 256 for ResNet-50's first stage).")
    stride: int = Field(1, ge=1, le=4, description="Stride of the stage's first block (timm: 1 for the first stage, "
                        "2 after).")
    expansion: int | None = Field(None, ge=1, le=8, description="Bottleneck ratio: the inner width (timm's planes) "
                                  "is channels / expansion; default 4 for bottleneck, 1 for basic (timm).")
    downsample: Literal["conv", "avg"] = Field("conv", description="Shortcut when the stride or width changes: "
                                               "'conv' a 1x1 strided conv + BN; 'avg' ResNet-D's 2x2 avg-pool, "
                                               "then a 1x1 conv + BN.")
    se: SESpec | None = Field(None, description="Squeeze-excitation after the last conv (ResNet-RS: rd_ratio 0.25).")
    zero_init_last: bool = Field(True, description="Initialise each block's last BatchNorm weight to 0 (timm's "
                                 "default, Goyal et al. 2017).")
    drop_path: DropPathRate = Field(
        0.0, description="Stochastic depth: one rate for every block, or [first, last] linearly spaced over the stage.")

    @property
    def dim(self) -> int:
        """The stage's output width, under the attention stages' name (``channels``)."""
        return self.channels

    @property
    def ratio(self) -> int:
        """The bottleneck ratio in force: ``expansion``, else timm's (4 bottleneck, 1 basic)."""
        return self.expansion if self.expansion is not None else EXPANSION[self.block]

    def drop_path_of(self, layer: int) -> float:
        """The stochastic-depth rate of block ``layer`` of the stage."""
        if isinstance(self.drop_path, tuple):
            first, last = self.drop_path
            return first + (last - first) * (layer / max(self.depth - 1, 1))
        return self.drop_path


@dataclass(frozen=True)
class ConvBlockShape:
    """One residual block: ``block`` (basic / bottleneck) from ``in_chans`` to ``channels`` channels on an
    ``grid`` input map, inner width ``width`` (timm's planes; ``channels = width x expansion``), ``stride``,
    shortcut ``downsample`` (None: identity; ``conv`` or ``avg``), ``se_channels`` (0: no SE), the SE's
    ``rd_ratio`` and ``rd_divisor``, ``zero_init_last`` and the block's ``drop_path`` rate."""

    block: str
    in_chans: int
    channels: int
    width: int
    stride: int
    grid: tuple[int, int]
    downsample: str | None = None
    se_channels: int = 0
    rd_ratio: float = 0.0625
    rd_divisor: int = 8
    zero_init_last: bool = True
    drop_path: float = 0.0

    @property
    def expansion(self) -> int:
        return self.channels // self.width


def se_channels(channels: int, rd_ratio: float, rd_divisor: int) -> int:
    """The SE's reduced width: timm ``make_divisible(channels * rd_ratio, rd_divisor, round_limit=0.)``."""
    v = channels * rd_ratio
    return max(rd_divisor, int(v + rd_divisor / 2) // rd_divisor * rd_divisor)


def _strided(side: int, stride: int) -> int:
    """A side after a 3x3 pad-1 (or 1x1 pad-0) conv of ``stride``: ``ceil(side / stride)``; the 2x2 ceil-mode
    average pool of the ``avg`` shortcut gives the same."""
    return (side - 1) // stride + 1


def strided_grid(grid: tuple[int, int], stride: int) -> tuple[int, int]:
    """A map's size after a stage of first stride ``stride``: ``ceil(side / stride)`` a side."""
    return _strided(grid[0], stride), _strided(grid[1], stride)


def plan(stage: ConvStageSpec, index: int, in_chans: int, grid: tuple[int, int]
         ) -> tuple[list[ConvBlockShape], list[tuple[tuple, str, str]]]:
    """The shapes of ``stages[index]``'s blocks entering at ``in_chans`` channels on a ``grid`` map, and the
    problems ``(path, message, hint)``: channels that the bottleneck ratio does not divide, a stride that would
    shrink the map below 1x1 (a side smaller than the stride)."""
    problems: list[tuple[tuple, str, str]] = []
    ratio = stage.ratio
    if stage.channels % ratio:
        problems.append((("stages", index, "channels"), f"{stage.channels} output channels are not divisible by the "
                         f"bottleneck ratio {ratio} (inner width = channels / expansion)",
                         f"use a multiple of {ratio}, e.g. {max(ratio, stage.channels // ratio * ratio)}"))
    if stage.stride > 1 and min(grid) < stage.stride:
        problems.append((("stages", index, "stride"), f"stride {stage.stride} on a {grid[0]}x{grid[1]} map would "
                         "shrink it below 1x1 (a strided conv needs at least as many pixels a side as its stride)",
                         "use stride: 1 here, fewer strided stages, or a larger input resolution"))
    if problems:
        return [], problems
    width = stage.channels // ratio
    se = se_channels(stage.channels, stage.se.rd_ratio, stage.se.rd_divisor) if stage.se else 0
    shapes, c = [], in_chans
    for layer in range(stage.depth):
        stride = stage.stride if layer == 0 else 1
        down = stage.downsample if layer == 0 and (stride != 1 or c != stage.channels) else None
        shapes.append(ConvBlockShape(stage.block, c, stage.channels, width, stride, tuple(grid), down, se,
                                     stage.se.rd_ratio if stage.se else 0.0625, stage.se.rd_divisor if stage.se else 8,
                                     stage.zero_init_last, stage.drop_path_of(layer)))
        grid = (_strided(grid[0], stride), _strided(grid[1], stride))
        c = stage.channels
    return shapes, problems


def out_grid(shape: ConvBlockShape) -> tuple[int, int]:
    """The map's size after the block: ``ceil(H / stride) x ceil(W / stride)``."""
    return _strided(shape.grid[0], shape.stride), _strided(shape.grid[1], shape.stride)


def _convs(shape: ConvBlockShape) -> list[tuple[int, int, int, int]]:
    """The block's convs with a BatchNorm after each ``(k, c_in, c_out, pixels_out)``, shortcut included."""
    h, w = shape.grid
    ho, wo = out_grid(shape)
    c, out, mid = shape.in_chans, shape.channels, shape.width
    if shape.block == "bottleneck":
        convs = [(1, c, mid, h * w), (3, mid, mid, ho * wo), (1, mid, out, ho * wo)]
    else:
        convs = [(3, c, mid, ho * wo), (3, mid, out, ho * wo)]
    if shape.downsample is not None:
        convs.append((1, c, out, ho * wo))
    return convs


def counts(shape: ConvBlockShape) -> tuple[int, int]:
    """(params, MACs per image): per conv ``k^2 c_in c_out`` weights + 2 BatchNorm parameters per output channel
    and ``H_out W_out k^2 c_in c_out`` MACs (the shortcut's 1x1 conv included; its average pool counts none);
    the SE adds ``2 C rd + rd + C`` parameters and ``2 C rd`` MACs (its 1x1 convs on the pooled 1x1 map)."""
    convs = _convs(shape)
    params = sum(k * k * c * o + 2 * o for k, c, o, _ in convs)
    macs = sum(n * k * k * c * o for k, c, o, n in convs)
    if shape.se_channels:
        rd, out = shape.se_channels, shape.channels
        params += 2 * out * rd + rd + out
        macs += 2 * out * rd
    return params, macs


def memory(shape: ConvBlockShape) -> NodeMemory:
    """Bytes (batch 1, float32): the input, and at the widest moment two copies (conv and BatchNorm outputs; the
    ReLUs are in place) of the largest inner map, then the output and the shortcut's two copies.  Training keeps
    every conv's and BatchNorm's output."""
    h, w = shape.grid
    convs = _convs(shape)
    sizes = [o * n for _, _, o, n in convs]
    x_in = shape.in_chans * h * w
    out = sizes[-1] if shape.downsample is None else sizes[-2]
    shortcut = 2 * out if shape.downsample is not None else 0
    act = x_in + max(2 * max(sizes), 2 * out + shortcut)
    return NodeMemory(act=F32 * act, saved=F32 * (2 * sum(sizes) + out))


def batchnorm_channels(shape: ConvBlockShape) -> int:
    """BatchNorm channels ``model.fuse()`` folds away: none (timm's blocks pair ``nn.Conv2d`` with ``nn.BatchNorm2d``,
    which ``timm.utils.reparameterize_model`` leaves as they are)."""
    return 0


def label(shape: ConvBlockShape) -> str:
    """The analysis table's kind: ``bottleneck``, ``basic``, with ``/2`` for a stride, ``+se``."""
    return shape.block + (f"/{shape.stride}" if shape.stride > 1 else "") + ("+se" if shape.se_channels else "")
