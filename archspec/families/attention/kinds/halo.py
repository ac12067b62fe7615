"""Head kind ``halo``: HaloNet's blocked local self-attention with a halo, torch-free rules.

Vaswani et al. 2021, "Scaling Local Self-Attention for Parameter Efficient Visual Backbones", sec. 2.2 and fig. 1
("blocked local self-attention"): the ``H x W`` map is cut into non-overlapping ``b x b`` query blocks; each block
attends to its ``(b + 2h) x (b + 2h)`` neighbourhood (the block and a halo of ``h`` pixels of the neighbouring
blocks), the same keys for every query of the block.  The logits carry 2D relative position logits (as BoTNet's
:mod:`.rel_logits`: ``q_i . R^W[c_j - c_i] + q_i . R^H[r_j - r_i]``, tables shared by the layer's heads); a
strided layer subsamples its queries (the paper's attention downsampling), the keys stay the full neighbourhood.

The torch side is timm's own ``layers.halo_attn.HaloAttn`` (built by
:func:`archspec.families.conv_block.module.build_bot`), the kind's only host (``halo_attn``), so the kind has no
torch half of its own: it runs inside a bottleneck's attention mixer (``mixer: {kind: attention}`` of a conv
stage) only, where every head of the layer is the same ``halo`` -- a token stage, or a layer mixing it with other
kinds or other halos, is refused (located, at validation).  Readings, timm's where the paper leaves room:

* widths: ``d_qk = dim_head``, else ``make_divisible(C qk_ratio, 8) / heads``; ``d_v = C / heads``; no output
  projection (the bottleneck's ``bn2`` and 1x1 expansion follow);
* the halo past the map's border is zero padding of the projected keys and values (``F.pad`` after the ``kv``
  conv): a padded key is attended with its relative logit alone and contributes a zero value;
* the relative tables have ``2 (b + 2h) - 1`` rows each, indexed ``key - query + b + 2h - 1`` in the block's and
  window's own coordinates (its first ``2h`` rows are never read);
* stride 2: where ``b`` is even the ``q`` conv strides (``b / 2 x b / 2`` queries a block, the relative logits
  indexed by the subsampled query position); where ``b`` is odd the layer attends at stride 1 and a 2x2 average
  pool follows;
* relative logits unscaled (``scale_pos_embed=False``).

Counts (:func:`layer_counts`), with ``b_q`` queries a block side (``b``, or ``b / 2`` strided), ``B = (H / b)(W /
b)`` blocks and ``w = b + 2h``: every executed (query, key) pair -- ``B b_q^2 w^2`` per head, the halo's padded
keys included -- in ``Q K^T`` and ``A V``, the relative logits ``B b_q^2 2 (2 w - 1) d_qk`` per head, and the
``q`` (on the query map) and ``kv`` (on the whole map) 1x1 convs.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from archspec._util.pydantic_base import HINT, StrictModel
from archspec._util.units import make_divisible

from .registry import HeadKind, register_head_kind

__all__ = ["HaloSpec", "FIELD", "HOST", "SHORTHANDS", "LEGEND", "letter", "terms", "problems", "NO_WEIGHT_DECAY",
           "layer_dims", "query_stride", "window", "layer_counts", "layer_memory", "layer_problems", "KIND"]

FIELD = "halo"
HOST = "halo_attn"
SHORTHANDS = {"halo": {"halo": {}}}
LEGEND = {"H": "halo attention (HaloNet)"}
NO_WEIGHT_DECAY: frozenset[str] = frozenset()  # timm's HaloNet decays height_rel / width_rel (no no_weight_decay)
MAX_BLOCK = 64


class HaloSpec(StrictModel):
    """HaloNet's blocked local attention of one head (Vaswani et al. 2021 sec. 2.2, fig. 1; timm ``HaloAttn``):
    ``block_size x block_size`` query blocks, each attending its block grown by ``halo_size`` pixels a side, with
    2D relative position logits.  Every head of a layer is the same halo (one timm ``HaloAttn``)."""

    block_size: int = Field(8, ge=1, le=MAX_BLOCK, description="Side b of the query blocks (timm HaloAttn: 8); "
                            "it must divide the map's sides.")
    halo_size: int = Field(3, ge=0, le=MAX_BLOCK, description="Halo h: pixels of the neighbouring blocks each "
                           "block's keys add a side, (b + 2h)^2 keys (timm HaloAttn: 3; halonet26t: 2); at most b.")
    dim_head: int | None = Field(None, ge=1, le=1024, description="Query/key width per head (timm dim_head); "
                                 "default make_divisible(C x qk_ratio, 8) / heads.")
    qk_ratio: float = Field(1.0, gt=0, le=4, allow_inf_nan=False, description="Query/key width relative to the "
                            "layer's width C when dim_head is not set (timm qk_ratio).")

    @model_validator(mode="after")
    def _halo_within_the_neighbours(self) -> HaloSpec:
        if self.halo_size > self.block_size:
            raise ValueError(
                f"halo_size {self.halo_size} is larger than block_size {self.block_size}: a halo is a band of the "
                "neighbouring blocks (HaloNet fig. 1: b = 2, h = 1); wider, it reaches past them"
                f"{HINT}use halo_size <= {self.block_size}, or a larger block_size for more context")
        return self


def letter(spec: HaloSpec) -> str:
    """Table letter: ``H`` (HaloNet)."""
    return "H"


def terms(spec: HaloSpec) -> frozenset[str]:
    """Blocked local attention with query-dependent relative logits: none of archspec's layer terms (timm's
    ``HaloAttn`` computes them; archspec's layers refuse the kind)."""
    return frozenset({"blocked_local", "relative_logits"})


def problems(heads: Sequence, grid: tuple[int, int], n_prefix: int, where: tuple) -> list[tuple[tuple, str, str]]:
    """A token stage's attention layer has no halo heads (the kind lives in bottlenecks, on a feature map)."""
    if any(getattr(h, FIELD, None) is not None for h in heads):
        return [(where, "halo attention (HaloNet) runs inside a bottleneck's attention mixer only (mixer: {kind: "
                 "attention} of a kind: conv stage), on the feature map's blocks, with every head of the layer the "
                 "same halo", "use mhsa, levit_bias or mask heads here, or move the layer into a bottleneck stage")]
    return []


def layer_dims(spec: HaloSpec, dim: int, heads: int) -> tuple[int, int]:
    """``(d_qk, d_v)`` per head of a ``dim``-channel layer: timm ``HaloAttn``'s ``dim_head or make_divisible(dim
    qk_ratio, 8) // heads`` and ``dim // heads``."""
    return spec.dim_head or make_divisible(dim * spec.qk_ratio) // heads, dim // heads


def query_stride(spec: HaloSpec, stride: int) -> int:
    """The stride of the ``q`` conv: the layer's where it divides the block (timm's strided query blocks), else 1
    (the layer attends at stride 1 and pools 2x2 after)."""
    return stride if stride > 1 and spec.block_size % stride == 0 else 1


def window(spec: HaloSpec) -> int:
    """The side of each block's key window, ``b + 2h``."""
    return spec.block_size + 2 * spec.halo_size


def layer_counts(spec: HaloSpec, dim: int, heads: int, grid: tuple[int, int], stride: int = 1,
                 qkv_bias: bool = False) -> tuple[int, int]:
    """(params, MACs per image) of timm's ``HaloAttn(dim, heads, stride)`` on an ``(H, W)`` map (sides multiples of
    ``b``): ``q`` ``C h d_qk`` and ``kv`` ``C h (d_qk + d_v)`` weights (+ biases), the tables ``2 (2 w - 1) d_qk``;
    MACs (module docstring) ``(H W / s_q^2) C h d_qk + H W C h (d_qk + d_v)``, ``h B b_q^2 w^2 (d_qk + d_v)`` for
    the executed pairs and ``h B b_q^2 2 (2 w - 1) d_qk`` for the relative logits (timm ``rel_logits_1d``'s ``q @
    rel_k^T``; its shifts are copies, the pool 0)."""
    d_qk, d_v = layer_dims(spec, dim, heads)
    s_q, w = query_stride(spec, stride), window(spec)
    b_q = spec.block_size // s_q
    pixels, blocks = grid[0] * grid[1], (grid[0] // spec.block_size) * (grid[1] // spec.block_size)
    qk, kv = heads * d_qk, heads * (d_qk + d_v)
    params = dim * (qk + kv) + ((qk + kv) if qkv_bias else 0) + 2 * (2 * w - 1) * d_qk
    queries = blocks * b_q * b_q  # every query pixel, as a block holds them
    macs = (pixels // (s_q * s_q)) * dim * qk + pixels * dim * kv
    macs += heads * queries * (w * w * (d_qk + d_v) + 2 * (2 * w - 1) * d_qk)
    return params, macs


def layer_memory(spec: HaloSpec, dim: int, heads: int, grid: tuple[int, int], stride: int = 1) -> tuple[int, int]:
    """(peak, saved) float32 elements ``HaloAttn``'s forward creates (batch 1, its input not included), an estimate:
    ``q``, the ``kv`` map, its halo-padded copy and the unfolded windows, three ``(h, B, b_q^2, w^2)`` logit maps
    at the widest moment (content, content + relative, softmax) and the output with its fold copy; training saves
    them all."""
    d_qk, d_v = layer_dims(spec, dim, heads)
    s_q, w, h = query_stride(spec, stride), window(spec), spec.halo_size
    blocks = (grid[0] // spec.block_size) * (grid[1] // spec.block_size)
    queries = blocks * (spec.block_size // s_q) ** 2
    kv = heads * (d_qk + d_v)
    held = (queries * heads * d_qk + grid[0] * grid[1] * kv + (grid[0] + 2 * h) * (grid[1] + 2 * h) * kv
            + blocks * w * w * kv + 2 * queries * heads * d_v)
    peak = held + 3 * heads * queries * w * w
    return peak, peak


def layer_problems(heads: Sequence, grid: tuple[int, int], where: tuple, layer: int) -> list[tuple[tuple, str, str]]:
    """A halo layer's problems on its block's input map ``grid``: heads that are not one halo, a block size that
    does not divide the map's sides (timm ``HaloAttn`` asserts it)."""
    halos = [getattr(h, FIELD) for h in heads if getattr(h, FIELD, None) is not None]
    if any(other != halos[0] for other in halos):
        return [(where, "every head of a halo layer is the same halo (one timm HaloAttn: one block size, halo and "
                 "width)", "give every head the same halo mapping (write it once as attention:)")]
    b = halos[0].block_size
    if grid[0] % b or grid[1] % b:
        divisors = [d for d in range(1, MAX_BLOCK + 1) if grid[0] % d == 0 and grid[1] % d == 0]
        return [(where, f"block_size {b} does not divide the {grid[0]}x{grid[1]} map that the stage's block {layer} "
                 "attends on (HaloNet tiles the map with whole b x b query blocks)",
                 f"use a block_size dividing it ({', '.join(map(str, divisors[-4:]))}), or an input resolution "
                 f"whose map here is a multiple of {b} a side")]
    return []


KIND = register_head_kind(HeadKind(
    field=FIELD, spec=HaloSpec,
    description="HaloNet's blocked local attention (Vaswani et al. 2021; shorthand halo): b x b query blocks each "
    "attending its block plus a halo of h pixels, with relative position logits; in a bottleneck's attention mixer "
    "only.",
    shorthands=SHORTHANDS, legend=LEGEND, letter=letter, terms=terms, problems=problems,
    no_weight_decay=NO_WEIGHT_DECAY, hosts=frozenset({HOST}),
    argument_hint=f"{HINT}a halo's block and halo sizes are fields: write it as a mapping, {{halo: {{block_size: 8, "
    "halo_size: 2}}"))
