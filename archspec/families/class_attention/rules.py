"""CaiT's class-attention stage (Touvron et al. 2021, sec. 3.2): torch-free rules -- spec, shape, checks,
parameters, MACs, memory.

The module is :class:`archspec.families.class_attention.module.ClassAttentionBlock` (timm
``cait.LayerScaleBlockClassAttn``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from archspec._util.memory import F32, NodeMemory
from archspec._util.pydantic_base import StrictModel

__all__ = ["ClassAttentionSpec", "ClassAttentionShape", "plan", "counts", "memory", "NO_WEIGHT_DECAY", "MAX_DEPTH",
           "MAX_HEADS"]

MAX_DEPTH = 64
MAX_HEADS = 64
NO_WEIGHT_DECAY: frozenset[str] = frozenset()


class ClassAttentionSpec(StrictModel):
    """CaiT class-attention stage after the last stage (CaiT sec. 3.2): only the class token queries.

    Needs the class token inserted after the last block (``tokens.cls_token: <total depth>``); width,
    activation and LayerNorm eps are the last stage's.
    """

    depth: int = Field(2, ge=1, le=MAX_DEPTH, description="Class-attention blocks (CaiT: 2).")
    heads: int | None = Field(None, ge=1, le=MAX_HEADS, description="Heads; default: the last stage's.")
    mlp_ratio: float = Field(4.0, gt=0, le=16, description="MLP hidden = mlp_ratio * dim (CaiT: 4).")
    qkv_bias: bool = Field(True, description="Bias on q, k, v (timm CaiT: True).")
    layer_scale: float | None = Field(1e-5, gt=0, le=1, description="LayerScale init of gamma_1/gamma_2 "
                                      "(CaiT-XXS: 1e-5, larger CaiTs 1e-6); None = off.")


@dataclass(frozen=True)
class ClassAttentionShape:
    """One class-attention block of width ``dim`` over ``n_tokens`` = 1 + patches; LayerScale init
    ``layer_scale`` (None: off); ``act`` and ``norm_eps`` are the last stage's."""

    dim: int
    heads: int
    n_tokens: int
    mlp_ratio: float
    qkv_bias: bool
    layer_scale: float | None
    act: str = "gelu"
    norm_eps: float = 1e-6


def plan(spec: ClassAttentionSpec, dim: int, n_tokens: int, cls_at: int | None, depth: int, dist_token: bool,
         last_heads: int, act: str, norm_eps: float) -> tuple[ClassAttentionShape | None, list[tuple[tuple, str, str]]]:
    """The shape of the stage's blocks, or None, and its problems ``(path, message, hint)``: the class token not
    (or not alone) inserted after the last block, heads not dividing the width, an MLP hidden width of 0."""
    if cls_at != depth or dist_token:
        return None, [(("class_attention",), "the class-attention stage needs the class token, and only it, "
                       "inserted after the last block", f"set tokens.cls_token: {depth} (CaiT) and no dist_token")]
    heads = spec.heads if spec.heads is not None else last_heads
    if dim % heads:
        return None, [(("class_attention", "heads"), f"dim {dim} is not divisible by {heads} heads",
                       "choose heads dividing the last stage's dim")]
    if int(dim * spec.mlp_ratio) < 1:
        return None, [(("class_attention", "mlp_ratio"), f"the MLP hidden width int({dim} * {spec.mlp_ratio:g}) "
                       f"is 0", f"use mlp_ratio >= {1 / dim:g}")]
    return ClassAttentionShape(dim=dim, heads=heads, n_tokens=n_tokens, mlp_ratio=spec.mlp_ratio,
                               qkv_bias=spec.qkv_bias,
                               layer_scale=spec.layer_scale, act=act, norm_eps=norm_eps), []


def counts(shape: ClassAttentionShape) -> tuple[int, int]:
    """(params, MACs per image) of one :class:`~.module.ClassAttentionBlock` on ``n_tokens`` = 1 + patches.

    Params: 2 LayerNorms ``4C``; q, k, v, proj ``4C^2 + C (+3C bias)``; MLP ``2 C h + h + C``; LayerScale ``2C``.
    MACs: q ``C^2`` (one token); k, v ``2 N C^2``; ``q K^T`` and ``A V`` ``N C`` each; proj ``C^2``;
    MLP ``2 C h`` (one token), with ``h = int(C * mlp_ratio)``.  ``heads`` does not change either count.
    """
    dim, n = shape.dim, shape.n_tokens
    hidden = int(dim * shape.mlp_ratio)
    params = 4 * dim + 4 * dim * dim + dim + (3 * dim if shape.qkv_bias else 0) + 2 * dim * hidden + hidden + dim
    params += 2 * dim if shape.layer_scale is not None else 0
    macs = 2 * dim * dim + 2 * n * dim * dim + 2 * n * dim + 2 * dim * hidden
    return params, macs


def memory(shape: ClassAttentionShape) -> NodeMemory:
    """Bytes (batch 1, float32) of one :class:`~.module.ClassAttentionBlock`.

    Alive at the peak: the block input, ``norm1`` of it, k and v (and a contiguous copy of each for the
    attention kernel), the ``(H, 1, N)`` logits twice, the one-token vectors (q, output, residuals, MLP
    hidden) and the concatenated output.
    """
    x, hidden = shape.n_tokens * shape.dim, int(shape.dim * shape.mlp_ratio)
    small = 8 * shape.dim + 2 * hidden + 2 * shape.heads * shape.n_tokens
    return NodeMemory(act=F32 * (6 * x + small), saved=F32 * (5 * x + small))
