"""Head kind ``gpsa``: ConViT's gated positional self-attention (d'Ascoli et al. 2021, eq. 5-7).

The rules (torch-free): its spec model, YAML shorthand, table letter, the parameters and MACs it adds to an
attention layer, its buffers and caches, the checks that need the layer's shape, the names of its parameters for
optimizers, and its path: a GPSA head whose content logits need no explicit form runs as
``(1 - g) SDPA + g P V`` (:func:`archspec.families.attention.kernels.gpsa_attention`).

The torch side (:class:`GPSATerms`, reached when a layer is built): ``pos_proj`` and ``gating_param`` as timm
``convit.GPSA``, the relative indices ``r_ij`` (``rel_indices``), the positional attention ``softmax(pos_proj(r))``
mixed into the probabilities after the softmax, ConViT's convolutional init (eq. 5, timm ``local_init``), and the
GPSA path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field

from archspec._util.lazy import lazy_module
from archspec._util.pydantic_base import HINT, StrictModel

from .layer_terms import KindTerms
from .registry import SDPA_TERMS, HeadKind, PathContext, register_head_kind

if TYPE_CHECKING:  # annotations only
    from torch import Tensor

__all__ = ["GPSASpec", "FIELD", "SHORTHANDS", "LEGEND", "letter", "terms", "params", "macs", "tables", "caches",
           "problems", "check_heads", "path", "path_macs", "NO_WEIGHT_DECAY", "GPSATerms", "GPSAMethods", "KIND"]

torch = lazy_module("torch")
nn = lazy_module("torch.nn")
timm_layers = lazy_module("timm.layers")
grid_tables = lazy_module("archspec.families.attention.tables")
kernels = lazy_module("archspec.families.attention.kernels")

FIELD = "gpsa"  # the HeadSpec field that holds this kind
SHORTHANDS = {"gpsa": {"gpsa": {}}}
LEGEND = {"P": "GPSA (ConViT)"}
NO_WEIGHT_DECAY = frozenset({"gating_param"})  # ConViT trains lambda without weight decay (timm convit)
F32, I64 = 4, 8


class GPSASpec(StrictModel):
    """Gated positional self-attention for one head (ConViT, eq. 5-7).

    ``A = normalize[(1 - sigmoid(lambda)) softmax(Q K^T / sqrt(d)) + sigmoid(lambda) softmax(v_pos . r)]``
    with ``r_ij = (dx, dy, dx^2 + dy^2)`` between key ``j`` and query ``i`` on the patch grid.
    """

    gating_init: float = Field(
        1.0, ge=-20, le=20,
        description="Initial gating parameter lambda; sigmoid(1) = 0.73 weighs positional attention "
        "(ConViT default 1).",
    )
    locality_strength: float = Field(
        1.0, gt=0, le=100,
        description="alpha in the convolutional init v_pos = -alpha (1, -2 Delta_1, -2 Delta_2); larger is more local.",
    )
    conv_init: bool = Field(
        True,
        description="Convolutional ('local') init: the GPSA heads of a layer get the kernel offsets of a "
        "sqrt(H) x sqrt(H) grid centred on the query, and the value projection the identity. "
        "The number of conv-initialised GPSA heads in a layer must be a perfect square.",
    )
    gating_trainable: bool = Field(
        True, description="Train the gating parameter (False freezes it, ConViT Tab. 3 ablation)."
    )


def letter(spec: GPSASpec) -> str:
    """Table letter: ``P`` (positional; no 'G', which readers take for any gating)."""
    return "P"


def terms(spec: GPSASpec) -> frozenset[str]:
    """A GPSA head mixes a positional attention into its probabilities: ``positional``."""
    return frozenset({"positional"})


def _count(heads: Sequence) -> int:
    return sum(h.gpsa is not None for h in heads)


def params(heads: Sequence, grid: tuple[int, int]) -> int:
    """Parameters GPSA adds to a layer: per GPSA head a ``pos_proj`` row (3 weights + 1 bias) and a gating
    parameter (timm ``convit.GPSA``)."""
    return 5 * _count(heads)


def macs(heads: Sequence, grid: tuple[int, int]) -> int:
    """MACs per image GPSA adds: the positional projection ``N_p^2 * 3`` per GPSA head, once per forward
    (computed on the ``(N_p, N_p, 3)`` relative indices, not per batch element)."""
    return (grid[0] * grid[1]) ** 2 * 3 * _count(heads)


def tables(heads: Sequence, n_tokens: int, n_patches: int) -> int:
    """Bytes of GPSA's constant tables in a layer: the relative indices ``r_ij`` ``(N_p, N_p, 3)`` float32 and the
    int64 indices of the GPSA heads ``gpsa_head_idx`` ``(n_gpsa,)`` (where the explicit-logits reference writes the
    gated heads back among all heads)."""
    n_gpsa = _count(heads)
    return F32 * 3 * n_patches * n_patches + I64 * n_gpsa if n_gpsa else 0


def caches(heads: Sequence, paths: frozenset[str], n_tokens: int, n_patches: int) -> int:
    """Bytes of the positional attention ``softmax(pos_proj(r))`` ``(n_gpsa, N_p, N_p)`` float32 that the first eval
    forward caches, whatever path the heads take."""
    return F32 * _count(heads) * n_patches * n_patches


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def problems(heads: Sequence, grid: tuple[int, int], n_prefix: int, where: tuple) -> list[tuple[tuple, str, str]]:
    """``(path, message, hint)`` of every shape problem of the layer's GPSA heads: a class token already present
    (GPSA sees patch tokens only), a number of conv-initialised heads that is not a perfect square."""
    gpsa = [h for h in heads if h.gpsa is not None]
    out = []
    if gpsa and n_prefix:
        out.append((where, "GPSA heads, but the class token is already present",
                    "GPSA sees patch tokens only: insert the class token after the last GPSA layer "
                    "(tokens.cls_token: <index of the first non-GPSA block>, as ConViT)"))
    conv_init = sum(h.gpsa.conv_init for h in gpsa)
    if conv_init and not _is_square(conv_init):
        k = math.isqrt(conv_init)
        out.append((where, f"{conv_init} GPSA heads have conv_init, which cannot form a square kernel",
                    f"ConViT places conv-initialised heads on a sqrt(H) x sqrt(H) grid; use {k * k} or "
                    f"{(k + 1) ** 2} such heads, or set conv_init: false on {conv_init - k * k} of them"))
    return out


def check_heads(heads: Sequence) -> None:
    """A layer's heads list as parsed: its GPSA heads agree on ``gating_trainable`` (the layer has one
    ``gating_param`` tensor, trained or frozen as a whole).

    Raises:
        ValueError: they disagree (the message names the frozen heads, with a hint).
    """
    gpsa = [(k, h.gpsa.gating_trainable) for k, h in enumerate(heads) if h.gpsa is not None]
    if len({flag for _, flag in gpsa}) > 1:
        frozen = [k for k, flag in gpsa if not flag]
        raise ValueError(f"GPSA heads of one layer disagree on gating_trainable (frozen: head "
                         f"{', '.join(map(str, frozen))}; trainable: the other GPSA heads)"
                         f"{HINT}the layer's gating parameters are frozen or trained together: set the same "
                         "gating_trainable on every GPSA head of the layer")


#: what the GPSA path computes besides the gated mix: the content logits' SDPA mask
_PATH_TERMS = SDPA_TERMS | {"positional"}


def path(spec: GPSASpec, context: PathContext) -> tuple | None:
    """``("gpsa",)``: ``(1 - g) SDPA(q, k, v) + g (P @ v)`` when the head's content logits need nothing SDPA
    cannot take (a bias, ``-inf``); None (the dense reference) with a hard or soft mask."""
    return ("gpsa",) if context.terms <= _PATH_TERMS else None


def path_macs(key: tuple, grid: tuple[int, int], n_prefix: int, qk_dim: int, v_dim: int) -> int:
    """The GPSA path's ``P @ v``, ``N^2 v_dim`` per head more than the papers' count."""
    n = n_prefix + grid[0] * grid[1]
    return n * n * v_dim


# ----------------------------------------------------------------------------------- torch side
class GPSATerms(KindTerms):
    """GPSA in one layer (ConViT eq. 5-7, timm ``convit.GPSA``): ``pos_proj`` ``Linear(3, n_gpsa)``, ``gating_param``
    ``(n_gpsa,)`` (one tensor: its heads agree on ``gating_trainable``), the non-persistent buffers ``gpsa_head_idx``
    ``(n_gpsa,)`` (where the dense reference writes the gated heads back) and ``rel_indices`` ``(N_p, N_p, 3)``.
    Publishes ``layer.gpsa_heads`` and ``layer.conv_init_heads`` (head indices).

    Raises:
        ValueError: a class token before the GPSA layer, a conv-initialised head count that is not a perfect
            square, GPSA heads that disagree on ``gating_trainable``.
    """

    def __init__(self, layer: Any, heads: Sequence[int]) -> None:
        super().__init__(layer, heads)
        specs = layer.head_specs
        layer.gpsa_heads = self.heads
        layer.conv_init_heads = [i for i in self.heads if specs[i].gpsa.conv_init]
        if not self.heads:
            return
        for _, message, hint in problems(specs, layer.grid, layer.num_prefix_tokens, ()):  # the IR's own checks
            raise ValueError(f"{message} ({hint})")
        trainable = {specs[i].gpsa.gating_trainable for i in self.heads}
        if len(trainable) > 1:
            raise ValueError("GPSA heads of one layer must agree on gating_trainable (one gating_param per layer)")
        layer.pos_proj = nn.Linear(3, len(self.heads))
        layer.gating_param = nn.Parameter(torch.zeros(len(self.heads)), requires_grad=trainable.pop())
        layer.register_buffer("gpsa_head_idx", torch.tensor(self.heads, dtype=torch.long), persistent=False)

    def reset_parameters(self, layer: Any) -> None:
        """timm ConViT: ``trunc_normal_(std=.02)`` on ``pos_proj``, zero bias; the gating parameter at
        ``gating_init``; then the convolutional init of the conv-initialised heads (:meth:`conv_init`)."""
        if not self.heads:
            return
        timm_layers.trunc_normal_(layer.pos_proj.weight, std=0.02)
        nn.init.zeros_(layer.pos_proj.bias)
        layer.gating_param.copy_(torch.tensor([layer.head_specs[i].gpsa.gating_init for i in self.heads]))
        self.conv_init(layer)

    def conv_init(self, layer: Any) -> None:
        """ConViT convolutional init (eq. 5), mirroring timm ``convit.GPSA.local_init``.

        The conv-initialised GPSA heads, in head order, take the offsets of
        :func:`~archspec.families.attention.tables.conv_kernel_offsets` for their count.  Their ``pos_proj`` rows
        become ``locality_strength * (2 d_col, 2 d_row, -1)`` on timm's channels ``(dx, dy, dx^2+dy^2)``; their value
        rows become the matching slice of the identity when ``H * v_dim == dim`` (timm sets ``v = eye``)."""
        conv = layer.conv_init_heads
        if not conv:
            return
        offsets = grid_tables.conv_kernel_offsets(len(conv))
        identity_v = layer.num_heads * layer.v_dim == layer.dim
        eye = torch.eye(layer.dim) if identity_v else None
        for pos, head in enumerate(conv):
            d_row, d_col = offsets[pos]
            strength = layer.head_specs[head].gpsa.locality_strength
            layer.pos_proj.weight[self.heads.index(head)] = strength * torch.tensor([2.0 * d_col, 2.0 * d_row, -1.0])
            if identity_v:
                weight, rows = layer.value_rows(head)
                weight[rows] = eye[head * layer.v_dim:(head + 1) * layer.v_dim].to(weight.dtype)

    def build_grid_tables(self, layer: Any, device: Any) -> None:
        """``rel_indices``: GPSA's ``r_ij`` ``(N_p, N_p, 3)``
        (:func:`~archspec.families.attention.tables.gpsa_rel_indices`)."""
        layer.register_buffer("rel_indices", grid_tables.gpsa_rel_indices(layer.grid).to(device), persistent=False)

    def gating(self, layer: Any) -> Tensor | None:
        """``sigmoid(gating_param)`` per GPSA head ``(n_gpsa,)``: the weight of positional attention."""
        return torch.sigmoid(layer.gating_param) if self.heads else None

    def mix_probs(self, layer: Any, probs: Tensor, heads: list[int]) -> Tensor:
        """ConViT eq. 5-7 on the dense reference: each GPSA head among ``heads`` becomes
        ``normalize[(1 - g) A + g softmax(pos_proj(r))]``, written back at its position (among all heads at the
        ``gpsa_head_idx`` buffer)."""
        local = [pos for pos, h in enumerate(heads) if h in self.heads]
        if not local:
            return probs
        pos_attn, gate = layer.positional_attention(), self.gating(layer)
        if len(local) < len(self.heads):  # some GPSA heads only: their rows
            rows = [self.heads.index(heads[pos]) for pos in local]
            pos_attn, gate = pos_attn[rows], gate[rows]
        pos_attn, gate = pos_attn.to(probs.dtype), gate.to(probs.dtype).view(1, -1, 1, 1)
        content = probs if len(local) == len(heads) else probs[:, local]
        mixed = (1.0 - gate) * content + gate * pos_attn
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        if len(local) == len(heads):
            return mixed
        index = layer.gpsa_head_idx if len(heads) == layer.num_heads else torch.tensor(local, device=probs.device)
        return probs.index_copy(1, index, mixed)

    def path_forward(self, layer: Any, key: tuple, heads: list[int], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """The GPSA path: ``(1 - g) SDPA(q, k, v; bias, -inf) + g (P @ v)``
        (:func:`~archspec.families.attention.kernels.gpsa_attention`), ``(B, h, N, v_dim)``."""
        mask = layer.additive_mask(q.dtype)
        if mask is not None:
            mask = layer.select_heads(mask, heads, dim=0)
        rows = [self.heads.index(h) for h in heads]
        positional = layer.select_heads(layer.positional_attention(), rows, dim=0)
        gate = layer.select_heads(self.gating(layer), rows, dim=0)
        return kernels.gpsa_attention(q, k, v, positional, gate, layer.scale, mask)


class GPSAMethods:
    """What GPSA adds to :class:`~archspec.families.attention.module.Attention`'s public methods."""

    def positional_attention(self) -> Tensor:
        """GPSA positional attention ``softmax(pos_proj(r))`` ``(n_gpsa, N_p, N_p)`` (ConViT eq. 5).

        Computed on the ``(N_p, N_p, 3)`` relative indices once, not per batch element (``N_p^2 * 3 * n_gpsa``
        MACs).  It does not depend on the input, so in eval mode it is cached (dropped by ``train()``,
        ``load_state_dict`` and a grid change); in training a forward whose GPSA heads run on two paths (the GPSA
        path and the explicit-logits path of the hard/soft-masked ones) shares one build, autograd graph included,
        between them (``Attention.cached_term``): both take rows of this same all-heads tensor.

        Raises:
            ValueError: when the layer has no GPSA head.
        """
        if not self.gpsa_heads:
            raise ValueError("this attention layer has no GPSA head")
        weight = self.pos_proj.weight
        return self.cached_term(
            "gpsa.positional",
            lambda: self.pos_proj(self.rel_indices.to(weight.dtype)).permute(2, 0, 1).softmax(dim=-1), weight.device)


KIND = register_head_kind(HeadKind(
    field=FIELD, spec=GPSASpec, description="Gated positional self-attention (ConViT).", shorthands=SHORTHANDS,
    legend=LEGEND, letter=letter, terms=terms, params=params, macs=macs, tables=tables, caches=caches,
    problems=problems, check_heads=check_heads, no_weight_decay=NO_WEIGHT_DECAY, hashed_when_unused=True,
    paths=frozenset({"gpsa"}), path=path, path_macs=path_macs, additive_mask_paths=frozenset({"gpsa"}),
    layer_terms=GPSATerms, layer_methods=GPSAMethods))
