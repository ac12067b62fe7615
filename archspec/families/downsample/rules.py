"""Token-grid downsampling between hierarchical stages: torch-free rules -- spec model, shape, checks, parameters,
MACs, memory and output grid.

Two kinds, each entering a stage (``stages[i].downsample``, ``i > 0``) and halving its token grid (ceil):

``patch_merging``  Swin's patch merging (Liu et al. 2021, sec. 3.1 "Patch Merging"; timm 1.0
                   ``swin_transformer.PatchMerging``, at the start of stages 1..3 as timm's
                   ``SwinTransformerStage(downsample=True)``): each 2x2 neighbourhood of tokens is concatenated
                   into one ``4 C_in`` vector in timm's channel order ``(0,0), (1,0), (0,1), (1,1)`` (row, col
                   offsets), LayerNorm(4 C_in), Linear(4 C_in, C_out, bias=False).  An odd side is zero-padded at
                   the bottom / right first, as timm pads.
``conv``           NAT's convolutional downsampler (Hassani et al. 2022, sec. 3.2; the authors' ``ConvDownsampler``,
                   Hugging Face ``NatDownsampler``): Conv2d(C_in, C_out, 3, stride 2, padding 1, bias=False), then
                   LayerNorm(C_out).  NAT puts it at the end of a level; entering the next stage is the same place.

The modules are in :mod:`archspec.families.downsample.module`.

A third kind is not a node of its own: ``pool`` (:class:`BlockPoolSpec`) makes the stage's *first block* downsample
inside itself, as CoAtNet's transformer stages do (Dai et al. 2021, App. A.1: ``x <- Proj(Pool(x)) +
Attention(Pool(Norm(x)))``; timm ``maxxvit.TransformerBlock2d(stride=2)``): LayerNorm at the input width, a 2x2
stride-2 pool, attention from the input width to the stage's (``attention``: at the input width, timm
``expand_first=False``, or at the stage's), and a shortcut of the same pool then a 1x1 projection when the width
changes.  Neither ``patch_merging`` nor ``conv`` can express it: the norm comes before the pool, and only the shortcut
projects.  The block family holds it (:class:`~archspec.families.block.rules.BlockEntry`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from archspec._util.memory import F32, NodeMemory
from archspec._util.pydantic_base import HINT, StrictModel

__all__ = ["DownsampleSpec", "BlockPoolSpec", "AnyDownsample", "DownsampleShape", "KINDS", "plan", "out_grid", "counts",
           "memory", "label", "NO_WEIGHT_DECAY"]

NO_WEIGHT_DECAY: frozenset[str] = frozenset()
KINDS = ("patch_merging", "conv")
#: every ``downsample`` kind a stage may open with: the two nodes, and the first block's own pooling
ALL_KINDS = (*KINDS, "pool")
_HELP = "patch_merging: Swin's 2x2 merging; conv: NAT's 3x3 stride-2 conv; pool: CoAtNet's first block pools"


class _KindShorthand(StrictModel):
    """A ``downsample:`` model that also reads the kind alone (``downsample: pool``) as ``{kind: pool}``."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return _expand(value)


class DownsampleSpec(_KindShorthand):
    """Downsampling entering a hierarchical stage (not stage 0): the token grid halves (ceil) and the width becomes
    the stage's ``dim``.  ``patch_merging``: Swin's 2x2 patch merging (timm ``PatchMerging``: LayerNorm(4C) +
    Linear(4C, dim, bias=False)); ``conv``: NAT's 3x3 stride-2 conv (bias-free) + LayerNorm.  Shorthand: the kind
    alone, ``downsample: patch_merging``."""

    kind: Literal["patch_merging", "conv"] = Field(
        ..., description="'patch_merging': Swin's 2x2 concatenation + LayerNorm + Linear (timm PatchMerging); "
        "'conv': NAT's 3x3 stride-2 conv + LayerNorm (NAT ConvDownsampler).")


def _expand(value: Any) -> Any:
    """``downsample: <kind>`` as ``{kind: <kind>}``.

    Raises:
        ValueError: a string naming no kind.
    """
    if isinstance(value, str):
        if value.strip() not in ALL_KINDS:
            raise ValueError(f"downsample must be one of {', '.join(ALL_KINDS)} or a mapping, got {value!r}"
                             f"{HINT}{_HELP}")
        return {"kind": value.strip()}
    return value


class BlockPoolSpec(_KindShorthand):
    """CoAtNet's downsampling entering a transformer stage: the stage's first block downsamples inside itself (timm
    ``TransformerBlock2d(stride=2)``; Dai et al. 2021, App. A.1): ``x <- Proj(Pool(x)) + Attention(Pool(Norm(x)))``,
    then its MLP at the stage's width.  The grid halves (both sides must be even), the width becomes ``dim``.
    Shorthand: ``downsample: pool``."""

    kind: Literal["pool"] = Field(..., description="'pool': the stage's first block pools inside itself (CoAtNet).")
    pool: Literal["avg2", "max2"] = Field("avg2", description="The 2x2 stride-2 pool of the attention's input and "
                                          "of the shortcut (timm pool_type avg2; max2 a max-pool).")
    attention: Literal["input", "output"] = Field(
        "output", description="The width the first block's attention runs at: 'output' the stage's dim (timm "
        "expand_first=True, its default), heads as the stage's; 'input' the block's input width (timm's rw "
        "configs, expand_first=False), input / head_dim heads, the output projection widening to dim.")
    shortcut_bias: bool = Field(True, description="Bias of the shortcut's 1x1 projection (timm shortcut_bias; False "
                                "in coatnet_0_rw).")


def _downsample_kind(value: Any) -> str:
    """Which model a ``downsample:`` is: ``pool`` a :class:`BlockPoolSpec`, anything else a :class:`DownsampleSpec`
    (whose own validation names a wrong kind).  The tags are in :mod:`archspec.spec.parsing`'s location markers, so
    that an error's path stays ``stages[i].downsample``."""
    kind = value.strip() if isinstance(value, str) else (value.get("kind") if isinstance(value, dict)
                                                         else getattr(value, "kind", None))
    return "block_pool" if kind == "pool" else "downsample_node"


#: a stage's ``downsample``: a node entering the stage (Swin's, NAT's) or its first block's pooling (CoAtNet's)
AnyDownsample = Annotated[Annotated[DownsampleSpec, Tag("downsample_node")]
                          | Annotated[BlockPoolSpec, Tag("block_pool")], Discriminator(_downsample_kind)]


@dataclass(frozen=True)
class DownsampleShape:
    """A downsampling of ``kind`` from ``in_dim`` tokens on ``grid`` (rows, cols) to ``out_dim`` on the halved
    grid; ``norm_eps`` its LayerNorm's epsilon (the stage's ``norm_eps``)."""

    kind: str
    in_dim: int
    out_dim: int
    grid: tuple[int, int]
    norm_eps: float = 1e-5


def plan(spec: DownsampleSpec, in_dim: int, out_dim: int, grid: tuple[int, int], n_prefix: int, stage: int,
         norm_eps: float) -> tuple[DownsampleShape | None, list[tuple[tuple, str, str]]]:
    """The shape of the downsampling entering ``stages[stage]``, or None, and its problems ``(path, message,
    hint)``: the first stage (nothing to downsample yet), a class/distillation token present (Swin and NAT have
    none: the tokens must be a pure grid)."""
    at = ("stages", stage, "downsample")
    if stage == 0:
        return None, [(at, "the first stage cannot start with a downsample (the stem makes its grid)",
                       "put downsample on a later stage, or use a larger stem patch")]
    if n_prefix:
        return None, [(at, f"{spec.kind} downsampling needs a pure token grid, but a class/distillation token is "
                       "present", "use tokens: {cls_token: none} (Swin and NAT have no class token), or insert it "
                       "after this stage (an index)")]
    return DownsampleShape(spec.kind, in_dim, out_dim, tuple(grid), norm_eps), []


def out_grid(shape: DownsampleShape) -> tuple[int, int]:
    """The grid after it: ``(ceil(H / 2), ceil(W / 2))`` for both kinds (patch merging pads an odd side with zeros,
    timm ``PatchMerging``; a 3x3 stride-2 conv with padding 1 maps ``s`` to ``(s - 1) // 2 + 1``)."""
    rows, cols = shape.grid
    return (rows + 1) // 2, (cols + 1) // 2


def _reduction_len(shape: DownsampleShape) -> int:
    """Inputs per output channel: ``4 C_in`` (the merged 2x2 vector) or ``9 C_in`` (the 3x3 conv)."""
    return (4 if shape.kind == "patch_merging" else 9) * shape.in_dim


def counts(shape: DownsampleShape) -> tuple[int, int]:
    """(params, MACs per image).  With ``Nq = ceil(H/2) ceil(W/2)`` output tokens: patch merging
    ``2 (4 C_in) + 4 C_in C_out`` params (LayerNorm(4 C_in), bias-free Linear) and ``Nq 4 C_in C_out`` MACs; conv
    ``9 C_in C_out + 2 C_out`` params (bias-free conv, LayerNorm(C_out)) and ``Nq 9 C_in C_out`` MACs.  Norms and
    the padding count 0 MACs (:mod:`archspec.ir.plan`'s convention)."""
    rows, cols = out_grid(shape)
    k = _reduction_len(shape)
    norm = 2 * (4 * shape.in_dim if shape.kind == "patch_merging" else shape.out_dim)
    return k * shape.out_dim + norm, rows * cols * k * shape.out_dim


def memory(shape: DownsampleShape) -> NodeMemory:
    """Bytes (batch 1, float32; rule in :mod:`archspec.ir.plan`).  Patch merging holds its input, the padded map,
    the merged ``Nq x 4 C_in`` copy (reshape + permute), its LayerNorm and the Linear's output at worst; the conv
    its input, the NCHW copy the conv reads, the conv output, its NHWC copy and the LayerNorm output."""
    rows, cols = shape.grid
    n_in, (orows, ocols) = rows * cols * shape.in_dim, out_grid(shape)
    n_out = orows * ocols * shape.out_dim
    if shape.kind == "patch_merging":
        merged = orows * ocols * 4 * shape.in_dim
        created = [merged, merged, merged, n_out]  # padded, merged, normed, reduced
    else:
        created = [n_in, n_out, n_out, n_out]  # NCHW input copy, conv output, NHWC copy, normed
    return NodeMemory(act=F32 * (n_in + sum(created)), saved=F32 * sum(created))


def label(shape: DownsampleShape) -> str:
    """The analysis table's kind: ``merge/2`` (patch merging) or ``conv/2``."""
    return ("merge" if shape.kind == "patch_merging" else "conv") + "/2"
