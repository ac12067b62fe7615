"""CaiT's talking-heads attention (Touvron et al. 2021, sec. 2; Shazeer et al. 2020), optionally with MaiT masks:
torch-free rules -- shape, checks, parameters, MACs, memory.

The module is :class:`archspec.families.talking_heads.module.TalkingHeadAttn` (timm ``cait.TalkingHeadAttn``);
its masks act on the logits after ``proj_l``, through the attention family's one mask rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from archspec._util.memory import BOOL, F32, NodeMemory

from ..attention.heads import HeadSpec
from ..attention.kinds import head_kind, hosted_by

__all__ = ["TalkingHeadsShape", "counts", "memory", "label", "stage_problems", "NO_WEIGHT_DECAY", "HEAD_KINDS",
           "unsupported_kinds"]

#: the head kinds (:attr:`HeadSpec.kinds <archspec.families.attention.heads.HeadSpec.kinds>`) talking heads take
#: besides plain MHSA, read from the registry (the kinds whose hosts name ``talking_heads``): MaiT masks, applied
#: after ``proj_l``; every other kind, a new one included, is refused
HEAD_KINDS = hosted_by("talking_heads")
NO_WEIGHT_DECAY = frozenset().union(*(head_kind(name).no_weight_decay for name in HEAD_KINDS))  # soft masks' alphas


def unsupported_kinds(head: HeadSpec) -> frozenset[str]:
    """The kinds of ``head`` that talking-heads attention does not take (not in :data:`HEAD_KINDS`); empty for a
    plain or masked head.  Raises nothing."""
    return head.kinds - HEAD_KINDS


@dataclass(frozen=True)
class TalkingHeadsShape:
    """Talking-heads attention of width ``dim`` with one head per entry of ``heads`` (plain or masked) on
    ``N = n_prefix + rows * cols`` tokens; head dim ``dim / len(heads)``."""

    dim: int
    heads: tuple[HeadSpec, ...]
    grid: tuple[int, int]
    n_prefix: int
    qkv_bias: bool

    @property
    def n_tokens(self) -> int:
        """Tokens ``N``."""
        return self.n_prefix + self.grid[0] * self.grid[1]


def stage_problems(norm: str, head_dim: int | None, key_dim: int | None, attn_ratio: float | None,
                   heads: Sequence[HeadSpec], at: tuple) -> list[tuple[tuple, str, str]]:
    """``(path, message, hint)`` of a stage that cannot use talking heads: a batchnorm (LeViT) block, a head dim
    other than ``dim / heads`` (timm CaiT), head kinds other than plain and masked (``heads``: every head of the
    stage's attention layers)."""
    out = []
    if norm == "batchnorm":
        out.append((at, "talking-heads attention is a pre-norm (layernorm) block", "set norm: layernorm"))
    if head_dim is not None or key_dim is not None or attn_ratio is not None:
        out.append((at, "talking-heads attention uses a head dim of dim / heads (timm CaiT)",
                    "remove head_dim, key_dim and attn_ratio from this stage"))
    other = sorted({h.letter for h in heads if unsupported_kinds(h)})
    if other:
        out.append((at, f"talking-heads attention takes plain (mhsa) and masked heads only, got head kinds "
                    f"{', '.join(other)}", "use mhsa, mask, soft_mask or strict_mask heads in this stage"))
    return out


def counts(shape: TalkingHeadsShape) -> tuple[int, int]:
    """(params, MACs per image) of :class:`~.module.TalkingHeadAttn` on ``N = n_prefix + rows * cols`` tokens.

    Params: ``qkv`` ``3C^2 (+3C)``, ``proj`` ``C^2 + C``, ``proj_l`` and ``proj_w`` ``H^2 + H`` each, one
    alpha per soft-masked head.  MACs: ``qkv`` ``3 N C^2``, ``Q K^T`` and ``A V`` ``N^2 C`` each, ``proj_l``
    and ``proj_w`` ``N^2 H^2`` each, ``proj`` ``N C^2`` (masks, softmax and biases count 0).
    """
    dim, n, h = shape.dim, shape.n_tokens, len(shape.heads)
    params = 3 * dim * dim + (3 * dim if shape.qkv_bias else 0) + dim * dim + dim + 2 * (h * h + h)
    params += sum(x.mask is not None and x.mask.mode == "soft" for x in shape.heads)
    macs = 4 * n * dim * dim + 2 * n * n * dim + 2 * n * n * h * h
    return params, macs


def memory(shape: TalkingHeadsShape) -> NodeMemory:
    """Bytes (batch 1, float32) of the attention half of a block with :class:`~.module.TalkingHeadAttn`.

    Alive throughout: the block input, the norm output, ``qkv`` (3 N C) and the scaled q (N C).  Then the
    largest of: ``Q K^T`` with contiguous q/k copies; ``proj_l`` / ``proj_w`` on permuted logits (the input,
    its contiguous copy, the output, plus one ``(H, N, N)`` per mask multiplier or strict fill); ``A V`` with
    contiguous copies of A and v; the output transpose and projection.  Plus the residual sum.  Buffers:
    the boolean ``(n_mask, N, N)`` mask table.
    """
    n = shape.n_tokens
    x, logits = n * shape.dim, len(shape.heads) * n * n
    modes = {h.mask.mode for h in shape.heads if h.mask is not None}
    base = 6 * x
    mixing = 3 * logits + (logits if modes else 0) + (logits if "strict" in modes else 0)
    phases = [2 * x + logits, mixing, 2 * logits + 2 * x, 3 * x]
    act = base + max(phases) + x
    saved = base + 6 * logits + (2 * logits if modes else 0) + 4 * x
    buffers = BOOL * sum(h.mask is not None for h in shape.heads) * n * n
    return NodeMemory(act=F32 * act, saved=F32 * saved, buffers=buffers)


def label(shape: TalkingHeadsShape) -> tuple[str, str]:
    """``(kind, heads)`` of the analysis table: ``talking`` and the head letters."""
    return "talking", " ".join(h.letter for h in shape.heads)
