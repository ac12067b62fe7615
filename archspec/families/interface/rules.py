"""The interface between a conv stage's feature map and the first attention stage's tokens: torch-free rules --
its spec model, shape, checks, parameters, MACs, memory and label.

LeViT sec. 3.2 ("grafting", Tab. 1) puts a DeiT-S stack on the first stages of a ResNet-50: "since a cropped
ResNet produces larger activation maps than the 14x14 activations consumed by DeiT, we introduce a pooling layer
between them ... average pooling to perform best.  The positional embedding and classification token are
introduced at the interface".  The paper does not say how the map's channels (256, 512 or 1024) become DeiT-S's
384: we project with a 1x1 convolution + bias, as timm's hybrid ViTs do (``timm.layers.HybridEmbed`` with
``patch_size=1``, PyTorch's default init), only when the widths differ (``proj``).  The map ``(B, C, H, W)`` is
average-pooled to ``grid`` (``nn.AdaptiveAvgPool2d``; with ``pool: none`` it keeps its size), projected, and
flattened row-major to tokens ``(B, gh gw, D)``; the class token and position embedding are then the token
model's own (``tokens:``), added at this grid.

The other way (:class:`TokensToMapShape`): a conv stage after attention stages (a conv-attention-conv sandwich)
takes the tokens ``(B, n_prefix + gh gw, C)`` as the map ``(B, C, gh, gw)`` on the last attention stage's token grid.
The class and distillation tokens are dropped, as hybrids that put conv layers after a ViT backbone do (ViTDet's
simple feature pyramid, timm's ``forward_intermediates(output_fmt='NCHW')``); the papers put no norm there and
neither do we (the next bottleneck starts with a conv + BatchNorm).  No parameters, no MACs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator, model_validator

from archspec._util.memory import F32, NodeMemory
from archspec._util.pydantic_base import StrictModel

__all__ = ["MapToTokensSpec", "InterfaceShape", "TokensToMapShape", "plan", "token_grid", "out_grid", "counts",
           "memory", "label", "NO_WEIGHT_DECAY"]

NO_WEIGHT_DECAY: frozenset[str] = frozenset()


class MapToTokensSpec(StrictModel):
    """How the first attention stage after conv stages takes their feature map (``from_map:`` of that stage).

    ``pool: avg`` average-pools the map to ``grid`` (LeViT Tab. 1: to DeiT's 14x14); ``pool: none`` keeps every
    pixel as a token.  ``proj``: a 1x1 conv + bias from the map's channels to the stage's ``dim`` (timm
    ``HybridEmbed``); default (``null``) only when they differ."""

    pool: Literal["none", "avg"] = Field("none", description="'avg': adaptive average pooling of the map to grid "
                                         "(LeViT sec. 3.2); 'none': every map pixel is a token.")
    grid: tuple[int, int] | None = Field(None, strict=False, description="Token grid after pooling, an int or "
                                         "[H, W] (pool: avg only); each side at most the map's.")
    proj: bool | None = Field(None, description="1x1 conv projection from the map's channels to the stage's dim; "
                              "default: only when they differ (false needs equal widths).")

    @field_validator("grid", mode="before")
    @classmethod
    def _square(cls, value):
        return (value, value) if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _grid_with_pool(self) -> MapToTokensSpec:
        if self.pool == "avg" and self.grid is None:
            raise ValueError("pool: avg needs grid (the token grid to pool to, e.g. 14)")
        if self.pool == "none" and self.grid is not None:
            raise ValueError("grid needs pool: avg (without pooling the tokens are the map's pixels)")
        if self.grid is not None and min(self.grid) < 1:
            raise ValueError(f"grid sides must be at least 1, got {list(self.grid)}")
        return self


@dataclass(frozen=True)
class InterfaceShape:
    """A ``channels`` x ``map_grid`` feature map -> ``grid`` tokens of width ``dim`` (``proj``: a 1x1 conv)."""

    channels: int
    map_grid: tuple[int, int]
    grid: tuple[int, int]
    dim: int
    proj: bool
    pool: bool = False


@dataclass(frozen=True)
class TokensToMapShape:
    """Tokens ``(B, n_prefix + gh gw, dim)`` -> the map ``(B, dim, gh, gw)``: prefix tokens dropped, the rest laid
    out row-major on ``grid`` (a token grid is always a rectangle ``gh x gw``, so every token model has one)."""

    dim: int
    grid: tuple[int, int]
    n_prefix: int = 0


def plan(spec: MapToTokensSpec | None, channels: int, map_grid: tuple[int, int], dim: int, at: tuple
         ) -> tuple[InterfaceShape, list[tuple[tuple, str, str]]]:
    """The interface from a ``channels`` x ``map_grid`` map to the attention stage at ``at`` (its spec path) of
    width ``dim``, and the problems ``(path, message, hint)``: a pooled grid larger than the map, ``proj: false``
    with different widths."""
    spec = spec or MapToTokensSpec()
    problems: list[tuple[tuple, str, str]] = []
    grid = tuple(map_grid)
    if spec.pool == "avg":
        grid = tuple(spec.grid)
        if grid[0] > map_grid[0] or grid[1] > map_grid[1]:
            problems.append((at + ("from_map", "grid"), f"pooling a {map_grid[0]}x{map_grid[1]} map to "
                             f"{grid[0]}x{grid[1]} would enlarge it", f"use a grid of at most {map_grid[0]}x"
                             f"{map_grid[1]}, fewer strided conv stages, or a larger input resolution"))
            grid = tuple(map_grid)
    proj = spec.proj if spec.proj is not None else channels != dim
    if not proj and channels != dim:
        problems.append((at + ("from_map", "proj"), f"the map has {channels} channels but the stage's dim is {dim}; "
                         "without a projection they must be equal", "remove proj: false, or set dim to "
                         f"{channels}"))
    return InterfaceShape(channels, tuple(map_grid), grid, dim, proj, spec.pool == "avg"), problems


def token_grid(spec: MapToTokensSpec | None, map_grid: tuple[int, int]) -> tuple[int, int]:
    """The token grid of a ``map_grid`` map through ``spec``: the pooled grid, or the map's (unchecked)."""
    return tuple(spec.grid) if spec is not None and spec.pool == "avg" else tuple(map_grid)


def out_grid(shape: InterfaceShape | TokensToMapShape) -> tuple[int, int]:
    """The token grid: the pooled grid, or the map's (tokens -> map: the tokens' grid)."""
    return shape.grid


def counts(shape: InterfaceShape | TokensToMapShape) -> tuple[int, int]:
    """(params, MACs per image): the 1x1 conv's ``C D + D`` parameters and ``gh gw C D`` MACs (the average pool
    counts none, as the ResNet-D shortcut's); tokens -> map: none (a slice and a reshape)."""
    if isinstance(shape, TokensToMapShape) or not shape.proj:
        return 0, 0
    return shape.channels * shape.dim + shape.dim, shape.grid[0] * shape.grid[1] * shape.channels * shape.dim


def memory(shape: InterfaceShape | TokensToMapShape) -> NodeMemory:
    """Bytes (batch 1, float32): the map, its pooled copy and the projected tokens (flattening is a view);
    tokens -> map: the tokens and the map's contiguous copy."""
    if isinstance(shape, TokensToMapShape):
        pixels = shape.dim * shape.grid[0] * shape.grid[1]
        return NodeMemory(act=F32 * (shape.dim * shape.n_prefix + 2 * pixels), saved=F32 * pixels)
    pooled = shape.channels * shape.grid[0] * shape.grid[1]
    tokens = shape.dim * shape.grid[0] * shape.grid[1] if shape.proj else 0
    act = shape.channels * shape.map_grid[0] * shape.map_grid[1] + pooled + tokens
    return NodeMemory(act=F32 * act, saved=F32 * (pooled + tokens))


def label(shape: InterfaceShape | TokensToMapShape) -> str:
    """The analysis table's kind: ``map->tokens``, with ``avg/k`` for pooling and ``+proj``; ``tokens->map``
    (``-cls`` when prefix tokens are dropped)."""
    if isinstance(shape, TokensToMapShape):
        return "tokens->map" + (f" -{shape.n_prefix} prefix" if shape.n_prefix else "")
    return "map->tokens" + (f" avg {shape.map_grid[0]}->{shape.grid[0]}" if shape.pool else "") + \
        ("+proj" if shape.proj else "")
