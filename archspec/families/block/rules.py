"""The block around a token mixer: pre-norm ViT block or LeViT residual block, torch-free rules.

A block is a token mixer of some family (attention, CaiT's talking heads, CMHSA's conv mixer) followed by
an MLP, with LayerNorms and optional LayerScale (ViT family) or BatchNorm after every linear (LeViT).
:class:`BlockShape` holds the mixer's family and shape; counts, memory and executed MACs compose the
mixer family's rules with the MLP's.  The modules are :class:`~archspec.families.block.module.TransformerBlock`
(timm ``vision_transformer.Block``) and :class:`~archspec.families.block.module.LevitBlock` (timm
``levit.LevitBlock``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from archspec._util.memory import F32, NodeMemory
from archspec._util.pydantic_base import HINT
from archspec.families import rules

__all__ = ["BlockShape", "BlockEntry", "counts", "executed_macs", "memory", "batchnorm_channels", "label",
           "mlp_memory", "in_grid", "check_mlp_ratio", "NO_WEIGHT_DECAY", "POOLS"]

NO_WEIGHT_DECAY: frozenset[str] = frozenset()
#: the 2x2 stride-2 pools of a block that downsamples inside itself (timm ``Downsample2d``'s ``avg2`` / ``max2``)
POOLS = ("avg2", "max2")


@dataclass(frozen=True)
class BlockEntry:
    """How a block that downsamples inside itself takes its input (CoAtNet's first transformer block of a stage: timm
    ``TransformerBlock2d(stride=2)``): ``in_dim`` tokens on the ``in_grid`` (both sides even), the 2x2 stride-2
    ``pool`` (``avg2`` / ``max2``), the shortcut's 1x1 projection's bias (``shortcut_bias``; there is a projection only
    when ``in_dim`` differs from the block's width)."""

    in_dim: int
    in_grid: tuple[int, int]
    pool: str = "avg2"
    shortcut_bias: bool = True


def check_mlp_ratio(dim: int | None, mlp_ratio: float) -> float:
    """An MLP ratio that leaves a hidden width: ``int(dim x mlp_ratio) >= 1`` (timm's ``Mlp`` would silently use a
    hidden width of ``dim`` for 0, and the counts would be wrong); a pydantic validator's check (``dim`` None: not
    known yet, passed).  Returns ``mlp_ratio``.

    Raises:
        ValueError: the hidden width rounds to 0 (the message carries a hint after ``HINT``).
    """
    if dim is not None and int(dim * mlp_ratio) < 1:
        raise ValueError(f"MLP hidden width int(dim * mlp_ratio) = int({dim} * {mlp_ratio:g}) is 0"
                         f"{HINT}use mlp_ratio >= {1 / dim:g} (timm would silently widen it to dim)")
    return mlp_ratio


@dataclass(frozen=True)
class BlockShape:
    """One block on ``n_tokens`` tokens of width ``dim``: its mixer (``mixer_family`` and that family's shape)
    and its MLP (``int(dim * mlp_ratio)`` hidden, ``act``); ``norm`` ``'layernorm'`` (pre-norm, ``norm_eps``,
    LayerScale init ``layer_scale`` or None) or ``'batchnorm'`` (LeViT).  ``entry``: a block that downsamples inside
    itself (:class:`BlockEntry`: its input is ``entry.in_dim`` tokens on ``entry.in_grid``; ``n_tokens`` and the mixer
    are on the pooled grid); ``init``: the linears' initialisation (``'trunc_normal'`` timm ViT's, ``'xavier'`` timm
    ``MaxxVit``'s)."""

    dim: int
    n_tokens: int
    mlp_ratio: float
    norm: str
    norm_eps: float
    act: str
    layer_scale: float | None
    drop_path: float
    mixer_family: str
    mixer: Any
    entry: BlockEntry | None = None
    init: str = "trunc_normal"

    @property
    def in_dim(self) -> int:
        """The width of the block's input: ``entry.in_dim``, else ``dim``."""
        return self.dim if self.entry is None else self.entry.in_dim

    @property
    def shortcut_proj(self) -> bool:
        """Whether the shortcut projects (a downsampling block that changes the width)."""
        return self.entry is not None and self.entry.in_dim != self.dim

    @property
    def hidden(self) -> int:
        """MLP hidden width ``int(dim * mlp_ratio)`` (timm's rounding)."""
        return int(self.dim * self.mlp_ratio)

    @property
    def batchnorm(self) -> bool:
        """LeViT's block (BatchNorm after every linear, no pre-norm)."""
        return self.norm == "batchnorm"


def _mixer_rules(shape: BlockShape):
    return rules(shape.mixer_family)


def in_grid(shape: BlockShape) -> tuple[int, int] | None:
    """The grid the block's input lies on when it downsamples inside itself (else None: the mixer's)."""
    return None if shape.entry is None else shape.entry.in_grid


def _mlp_counts(shape: BlockShape) -> tuple[int, int]:
    """(params, MACs) of the MLP and the norms: fc1, fc2 (bias, or BatchNorm), 2 LayerNorms (the first at the input
    width), LayerScale; a downsampling block's shortcut projection, ``in_dim dim`` (+ bias) parameters and ``N in_dim
    dim`` MACs on the pooled grid (pools count 0, as the ResNet-D shortcut's)."""
    dim, hidden, n, bn = shape.dim, shape.hidden, shape.n_tokens, shape.batchnorm
    per_channel = 2 if bn else 1  # BatchNorm weight and bias, or a linear bias
    params = 2 * dim * hidden + per_channel * (hidden + dim)
    params += 0 if bn else 2 * shape.in_dim + 2 * dim + (2 * dim if shape.layer_scale is not None else 0)
    macs = 2 * n * dim * hidden
    if shape.shortcut_proj:
        params += shape.in_dim * dim + (dim if shape.entry.shortcut_bias else 0)
        macs += n * shape.in_dim * dim
    return params, macs


def counts(shape: BlockShape) -> tuple[int, int]:
    """(params, MACs per image): the mixer's (its family's rule) plus the MLP's ``2 N C hidden`` MACs and the
    parameters of fc1, fc2 (biases, or LeViT's BatchNorms: 2 per channel), the LayerNorms and LayerScale."""
    p_mix, m_mix = _mixer_rules(shape).counts(shape.mixer)
    p_mlp, m_mlp = _mlp_counts(shape)
    return p_mix + p_mlp, m_mix + m_mlp


def executed_macs(shape: BlockShape) -> int:
    """MACs per image as executed: the mixer's executed MACs (where its family has fast paths) plus the MLP's."""
    rules = _mixer_rules(shape)
    mixer = rules.executed_macs(shape.mixer) if hasattr(rules, "executed_macs") else rules.counts(shape.mixer)[1]
    return mixer + _mlp_counts(shape)[1]


def mlp_memory(n: int, dim: int, hidden: int, batchnorm: bool, layer_scale: bool) -> NodeMemory:
    """The MLP half of a block: input, the attention residual sum, the norm output, and two hidden copies
    (fc1 output and its activation; LeViT: linear and BatchNorm outputs) at once."""
    x, hid = n * dim, n * hidden
    extra = x if layer_scale else 0
    act = 3 * x + 2 * hid + extra
    saved = (2 if batchnorm else 1) * x + (3 if batchnorm else 2) * hid + 2 * x + extra
    return NodeMemory(act=F32 * act, saved=F32 * saved)


def _entry_memory(shape: BlockShape) -> NodeMemory:
    """A downsampling block's entry: its input and norm at ``in_dim`` on the input grid, the pooled norm output and the
    shortcut (pooled input, its projection) on the pooled grid, alive at once; the norm output and the pooled tensors
    saved."""
    if shape.entry is None:
        return NodeMemory()
    rows, cols = shape.entry.in_grid
    full = rows * cols * shape.in_dim
    pooled = shape.n_tokens * shape.in_dim
    short = shape.n_tokens * shape.dim if shape.shortcut_proj else 0
    return NodeMemory(act=F32 * (2 * full + 2 * pooled + short), saved=F32 * (full + 2 * pooled))


def memory(shape: BlockShape) -> NodeMemory:
    """Bytes (batch 1, float32; rule in :mod:`archspec.ir.plan`): the larger of the mixer's, the MLP's and (a block
    that downsamples inside itself) its entry's peaks, the sum of what they save for backward, the mixer's
    buffers."""
    mix = _mixer_rules(shape).memory(shape.mixer)
    layer_scale = shape.layer_scale is not None and not shape.batchnorm
    mlp = mlp_memory(shape.n_tokens, shape.dim, shape.hidden, shape.batchnorm, layer_scale)
    entry = _entry_memory(shape)
    return NodeMemory(act=max(mix.act, mlp.act, entry.act), saved=mix.saved + mlp.saved + entry.saved,
                      buffers=mix.buffers)


def batchnorm_channels(shape: BlockShape) -> int:
    """BatchNorm channels ``model.fuse()`` folds away: LeViT's fc1 and fc2, plus the mixer's."""
    if not shape.batchnorm:
        return 0
    rules = _mixer_rules(shape)
    mixer = rules.batchnorm_channels(shape.mixer) if hasattr(rules, "batchnorm_channels") else 0
    return shape.hidden + shape.dim + mixer


def label(shape: BlockShape) -> tuple[str, str]:
    """``(kind, heads)`` of the analysis table: the mixer family's label and head letters."""
    return _mixer_rules(shape).label(shape.mixer)
