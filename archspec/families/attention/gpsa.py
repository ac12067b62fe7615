"""Head kind ``gpsa``: ConViT's gated positional self-attention (d'Ascoli et al. 2021, eq. 5-7), torch-free rules.

Everything archspec knows about a GPSA head without building it: its spec model, YAML shorthand, table
letter, parameters and MACs it adds to an attention layer, its buffers, the checks that need the layer's
shape, and the names of its parameters for optimizers.  The module side is
:class:`archspec.families.attention.module.Attention` (``pos_proj``, ``gating_param``, the
``(1 - g) SDPA + g P V`` path of :func:`archspec.families.attention.kernels.gpsa_attention`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import Field

from archspec._util.pydantic_base import StrictModel

__all__ = ["GPSASpec", "FIELD", "SHORTHANDS", "LEGEND", "letter", "params", "macs", "tables", "problems",
           "NO_WEIGHT_DECAY"]

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
