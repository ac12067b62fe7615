"""LeViT's shrinking attention between stages (Graham et al. 2021, sec. 4.2): torch-free rules.

The spec model (:class:`ShrinkSpec`), the typed shape an IR node carries (:class:`ShrinkShape`), the checks
that need the flow of tokens, and parameters, MACs, memory and output grid.  The module is
:class:`archspec.families.shrink.module.ShrinkBlock` (timm ``levit.LevitDownsample``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, ValidationInfo, field_validator

from archspec._util.memory import F32, I64, NodeMemory
from archspec._util.pydantic_base import StrictModel

from ..attention.rules import check_value_dim
from ..block.rules import mlp_memory

__all__ = ["ShrinkSpec", "ShrinkShape", "plan", "out_grid", "counts", "memory", "batchnorm_channels",
           "NO_WEIGHT_DECAY", "MAX_HEADS"]

MAX_HEADS = 64
NO_WEIGHT_DECAY = frozenset({"attention_biases"})  # its bias table, as the attention family's


class ShrinkSpec(StrictModel):
    """LeViT shrinking attention entering a stage (LeViT sec. 4.2, 'attention downsampling').

    Queries are subsampled with ``stride``; ``heads`` defaults to C_in / key_dim; value dim is
    ``attn_ratio * key_dim``; no residual; followed by a residual MLP of ``mlp_ratio``.
    """

    stride: int = Field(2, ge=2, le=2, description="Query subsampling stride; grid side becomes ceil(side / 2). "
                        "LeViT (and timm's AttentionDownsample) use 2, the only value supported.")
    heads: int | None = Field(None, ge=1, le=MAX_HEADS, description="Heads; default C_in // key_dim (LeViT).")
    key_dim: int = Field(16, ge=4, le=256, description="Per-head query/key dim D.")
    attn_ratio: float = Field(4.0, gt=0, le=8, description="Value dim = attn_ratio * key_dim (LeViT: 4).")
    mlp_ratio: float = Field(2.0, gt=0, le=8, description="Expansion of the residual MLP after it (LeViT: 2).")

    @field_validator("attn_ratio")
    @classmethod
    def _value_dim(cls, value: float, info: ValidationInfo) -> float:
        key_dim = info.data.get("key_dim")
        return value if key_dim is None else check_value_dim(value, key_dim, "value dim", ", or a larger key_dim")


@dataclass(frozen=True)
class ShrinkShape:
    """Shrinking attention from ``in_dim`` on ``grid`` to ``out_dim`` on the subsampled grid; ``act`` names the
    activation of its attention and MLP (LeViT: hardswish)."""

    in_dim: int
    out_dim: int
    heads: int
    key_dim: int
    attn_ratio: float
    mlp_ratio: float
    grid: tuple[int, int]
    stride: int
    act: str = "hardswish"


def plan(spec: ShrinkSpec, in_dim: int, out_dim: int, grid: tuple[int, int], n_prefix: int, stage: int,
         act: str) -> tuple[ShrinkShape | None, list[tuple[tuple, str, str]]]:
    """The shape of the shrinking attention entering ``stages[stage]``, or None, and its problems
    ``(path, message, hint)``: the first stage, a class/distillation token present, an MLP hidden width of 0."""
    at = ("stages", stage, "shrink")
    if stage == 0:
        return None, [(at, "the first stage cannot start with shrinking attention", "put shrink on a later stage")]
    out = []
    if n_prefix:
        out.append((at, "shrinking attention needs a pure token grid, but a class/distillation token is present",
                    "use tokens.cls_token: none, or insert it after this stage (an index)"))
    if int(out_dim * spec.mlp_ratio) < 1:  # timm's LevitMlp would silently widen a 0 hidden width to dim
        out.append((at + ("mlp_ratio",), f"the MLP hidden width int(dim * mlp_ratio) = int({out_dim} * "
                    f"{spec.mlp_ratio:g}) is 0", f"use mlp_ratio >= {1 / out_dim:g}"))
        return None, out
    heads = spec.heads if spec.heads is not None else max(in_dim // spec.key_dim, 1)
    shape = ShrinkShape(in_dim=in_dim, out_dim=out_dim, heads=heads, key_dim=spec.key_dim, attn_ratio=spec.attn_ratio,
                        mlp_ratio=spec.mlp_ratio, grid=grid, stride=spec.stride, act=act)
    return shape, out


def out_grid(shape: ShrinkShape) -> tuple[int, int]:
    """Query grid after subsampling with ``stride``: ``(ceil(H / stride), ceil(W / stride))``
    (timm ``LevitDownsample``)."""
    rows, cols = shape.grid
    return (rows - 1) // shape.stride + 1, (cols - 1) // shape.stride + 1


def _bn_linear(n_tokens: int, d_in: int, d_out: int) -> tuple[int, int]:
    """(params, MACs) of a timm ``LinearNorm`` (bias-free linear + BatchNorm, 2 d_out params) over N tokens."""
    return d_in * d_out + 2 * d_out, n_tokens * d_in * d_out


def _sizes(shape: ShrinkShape) -> tuple[int, int, int, int]:
    """``(N, Nq, Dv, hidden)``: keys, subsampled queries, value dim, MLP hidden width."""
    rows, cols = out_grid(shape)
    return (shape.grid[0] * shape.grid[1], rows * cols, int(shape.attn_ratio * shape.key_dim),
            int(shape.out_dim * shape.mlp_ratio))


def counts(shape: ShrinkShape) -> tuple[int, int]:
    """(params, MACs per image) of :class:`~.module.ShrinkBlock` (shrinking attention + its residual MLP).

    With ``N = H W`` keys, ``Nq`` subsampled queries (:func:`out_grid`), ``h`` heads, key dim ``D`` and value
    dim ``Dv = int(attn_ratio D)``: kv ``N C_in h (D + Dv)``, q ``Nq C_in h D``, ``QK^T`` and ``AV``
    ``h Nq N (D + Dv)``, proj ``Nq h Dv C_out``, MLP ``2 Nq C_out hidden``; every linear is a ``LinearNorm``
    (BatchNorm: 2 params per channel); the attention bias table has ``h N`` entries.
    """
    n, nq, v_dim, hidden = _sizes(shape)
    h, d, c_in, c_out = shape.heads, shape.key_dim, shape.in_dim, shape.out_dim
    parts = [_bn_linear(n, c_in, h * (d + v_dim)), _bn_linear(nq, c_in, h * d), _bn_linear(nq, h * v_dim, c_out),
             _bn_linear(nq, c_out, hidden), _bn_linear(nq, hidden, c_out)]
    params = sum(p for p, _ in parts) + h * n
    macs = sum(m for _, m in parts) + nq * n * h * (d + v_dim)
    return params, macs


def memory(shape: ShrinkShape) -> NodeMemory:
    """Bytes (batch 1, float32; rule in :mod:`archspec.ir.plan`) of :class:`~.module.ShrinkBlock`:
    ``AttentionDownsample`` (kv over ``N`` keys, q over ``Nq`` subsampled queries, logits ``(h, Nq, N)``) then the
    residual ``LevitMlp`` on ``Nq`` tokens.  Buffers: the bias index table and timm's eval-mode bias cache."""
    n, nq, v_dim, hidden = _sizes(shape)
    h, d = shape.heads, shape.key_dim
    x_in, x_out = n * shape.in_dim, nq * shape.out_dim
    kv, q_sub, q = n * h * (d + v_dim), nq * shape.in_dim, nq * h * d
    logits, v, out = h * nq * n, n * h * v_dim, nq * h * v_dim
    base = x_in + kv + q_sub + 2 * q
    phases = [kv, 2 * logits + n * h * d, logits + v + out, 3 * out + 2 * x_out]
    attn_act = base + max(phases)
    mlp = mlp_memory(nq, shape.out_dim, hidden, batchnorm=True, layer_scale=False)
    act = max(attn_act, x_in + mlp.act)
    saved = 2 * kv + q_sub + 2 * q + 4 * logits + v + 3 * out + 2 * x_out
    buffers = I64 * nq * n + F32 * logits  # bias index table and timm's eval-mode bias cache
    return NodeMemory(act=F32 * act, saved=F32 * saved + mlp.saved, buffers=buffers)


def batchnorm_channels(shape: ShrinkShape) -> int:
    """BatchNorm channels ``model.fuse()`` folds away: kv, q, proj, fc1, fc2."""
    _, _, v_dim, hidden = _sizes(shape)
    return shape.heads * (2 * shape.key_dim + v_dim) + 2 * shape.out_dim + hidden
