"""Head kind ``rel_logits``: BoTNet's relative position logits.

Srinivas et al. 2021, "Bottleneck Transformers for Visual Recognition", fig. 4 (the MHSA layer of a BoT block),
after Bello et al. 2019, "Attention Augmented Convolutional Networks", sec. 3.2.1 (eq. 3): the logit of query
pixel ``i = (r_i, c_i)`` and key pixel ``j = (r_j, c_j)`` is

    l_ij = q_i . k_j / sqrt(d)  +  q_i . R^W[c_j - c_i]  +  q_i . R^H[r_j - r_i]

with learned tables ``R^H`` of ``(2 H - 1, d)`` and ``R^W`` of ``(2 W - 1, d)`` rows, shared by the layer's heads
(timm ``layers.bottleneck_attn.PosEmbedRel``: ``height_rel``, ``width_rel``; timm's default adds them unscaled,
``scale_pos_embed=False``, which we follow).  Unlike LeViT's or CMHSA's additive bias (:mod:`.rel_bias`), these
logits depend on the query: ``2 x N x (2 side - 1) x d`` MACs per head on an ``N``-pixel map.

The torch side is timm's own ``BottleneckAttn`` (:mod:`archspec.families.conv_block.module`), the kind's only
host (``bottleneck_attn``), so the kind has no torch half of its own: it runs inside a bottleneck's attention
mixer (``mixer: {kind: attention}`` of a conv stage) only, where every head of the layer is ``botnet_rel`` -- a
token stage, or a layer mixing it with other kinds, is refused (located, at validation).
"""

from __future__ import annotations

from collections.abc import Sequence

from archspec._util.pydantic_base import StrictModel

from .registry import HeadKind, register_head_kind

__all__ = ["RelLogitsSpec", "FIELD", "SHORTHANDS", "LEGEND", "letter", "terms", "params", "macs", "tables",
           "problems", "NO_WEIGHT_DECAY", "table_params", "table_macs", "KIND"]

FIELD = "rel_logits"
SHORTHANDS = {"botnet_rel": {"rel_logits": {}}}
LEGEND = {"B": "relative logits (BoTNet)"}
NO_WEIGHT_DECAY: frozenset[str] = frozenset()  # timm's BoTNet decays height_rel / width_rel (no no_weight_decay)


class RelLogitsSpec(StrictModel):
    """BoTNet's query-dependent relative position logits (Srinivas et al. 2021 fig. 4; Bello et al. 2019 eq. 3):
    ``q_i . R^W[c_j - c_i] + q_i . R^H[r_j - r_i]`` added to the content logits; tables shared by the layer."""


def letter(spec: RelLogitsSpec) -> str:
    """Table letter: ``B`` (BoTNet)."""
    return "B"


def terms(spec: RelLogitsSpec) -> frozenset[str]:
    """Query-dependent logits, ``q_i . R[offset]``: none of archspec's layer terms (timm's ``BottleneckAttn`` computes
    them; archspec's layers refuse the kind)."""
    return frozenset({"relative_logits"})


def table_params(grid: tuple[int, int], qk_dim: int) -> int:
    """``R^H`` and ``R^W``: ``(2 H - 1 + 2 W - 1) d`` parameters (one pair per layer, timm ``PosEmbedRel``)."""
    return (2 * grid[0] - 1 + 2 * grid[1] - 1) * qk_dim


def table_macs(grid: tuple[int, int], qk_dim: int, heads: int) -> int:
    """Per image: every head's queries against both tables, ``heads x H W x (2 W - 1 + 2 H - 1) x d`` (timm's
    ``q @ rel_k^T`` of ``rel_logits_1d``; the shifts and the tiling are copies, 0 MACs)."""
    return heads * grid[0] * grid[1] * (2 * grid[1] - 1 + 2 * grid[0] - 1) * qk_dim


def params(heads: Sequence, grid: tuple[int, int]) -> int:
    """0 here: a layer of relative-logit heads is counted by the conv-block family (its only home)."""
    return 0


def macs(heads: Sequence, grid: tuple[int, int]) -> int:
    """0 here (see :func:`params`)."""
    return 0


def tables(heads: Sequence, n_tokens: int, n_patches: int) -> int:
    """No index tables (the shift is a reshape)."""
    return 0


def problems(heads: Sequence, grid: tuple[int, int], n_prefix: int, where: tuple) -> list[tuple[tuple, str, str]]:
    """A token stage's attention layer has no relative-logit heads in this version (the kind lives in bottlenecks)."""
    if any(getattr(h, FIELD, None) is not None for h in heads):
        return [(where, "botnet_rel (BoTNet's relative logits) runs inside a bottleneck's attention mixer only "
                 "(mixer: {kind: attention} of a kind: conv stage), with every head of the layer botnet_rel",
                 "use mhsa, levit_bias or signed_bias heads here, or move the layer into a bottleneck stage")]
    return []


KIND = register_head_kind(HeadKind(
    field=FIELD, spec=RelLogitsSpec,
    description="BoTNet's relative position logits q . R[offset] (Srinivas et al. 2021; shorthand botnet_rel); in a "
    "bottleneck's attention mixer only.",
    shorthands=SHORTHANDS, legend=LEGEND, letter=letter, terms=terms, params=params, macs=macs, tables=tables,
    problems=problems, no_weight_decay=NO_WEIGHT_DECAY, hosts=frozenset({"bottleneck_attn"}), hashed_when_unused=True))
