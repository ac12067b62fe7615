"""Talking-heads attention (CaiT), optionally with MaiT masks: the module (rules: :mod:`.rules`).

CaiT (Touvron et al. 2021, "Going deeper with image transformers", sec. 2 and 3.1) uses talking-heads
attention (Shazeer et al. 2020) in its self-attention stage: the per-head logits are mixed across heads
by a learned ``H x H`` linear map ``proj_l`` *before* the softmax and the probabilities again by
``proj_w`` *after* it::

    S = (Q * d^-0.5) K^T                       (B, H, N, N)
    S' = proj_l(S over the head axis)          (B, H, N, N)
    S'' = mask_h(S')  for masked heads h       MaiT eq. 2 (hard), eq. 4 (soft), or strict (-inf)
    A = proj_w(softmax(S'') over the head axis)
    out = proj(concat_h(A_h V_h))

Numerics and parameter names mirror timm ``cait.TalkingHeadAttn`` (``qkv``, ``proj_l``, ``proj_w``,
``proj``), so timm weights load unchanged.

**Where the mask sits (Masked CaiT, MaiT Tab. 4).**  MaiT's eq. 2 multiplies the logits that enter the
softmax by M.  With talking heads the logits entering the softmax are ``S' = proj_l(S)``, so the mask is
applied to ``S'``, after ``proj_l`` and before the softmax.  Masking ``S`` before ``proj_l`` would not
localise anything: ``proj_l`` mixes the unmasked logits of the other heads back into the masked head, so
its softmax would again see every token.  ``proj_w`` then mixes the (masked) probabilities of all heads,
as CaiT does for any head; the paper does not say more (our reading, stated in specs/masked_cait_xxs24.yaml).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.layers import trunc_normal_
from torch import Tensor, nn

from ..attention.heads import HeadSpec, coerce_heads
from ..attention.mask_terms import alpha_to_logit, mask_terms, window_mask
from ..attention.position_terms import apply_logit_terms
from .rules import TalkingHeadsShape, unsupported_kinds

__all__ = ["TalkingHeadAttn", "build"]


def _check_heads(specs: Sequence[HeadSpec]) -> None:
    for i, h in enumerate(specs):
        if unsupported_kinds(h):
            raise ValueError(f"talking-heads attention supports plain and masked heads only; head {i} is {h.letter!r}")


class TalkingHeadAttn(nn.Module):
    """CaiT talking-heads self-attention with optional per-head MaiT masks (timm ``cait.TalkingHeadAttn``).

    Shapes: ``(B, N, C) -> (B, N, C)``, ``N = num_prefix_tokens + rows * cols``, head dim ``C / H``.

    Args:
        dim: token width ``C`` (divisible by the number of heads).
        heads: one :class:`~archspec.families.attention.heads.HeadSpec` (or shorthand) per head: ``mhsa`` or a mask
            (hard / soft / strict); the mask acts on the logits after ``proj_l`` (module docstring).
        grid: ``(rows, cols)`` patch grid of the patch tokens.
        num_prefix_tokens: class / distillation tokens before the patches (CaiT: 0).
        qkv_bias: bias on ``qkv`` (timm CaiT: True).
        attn_drop, proj_drop: dropout rates (0 in CaiT's XXS models).

    Raises:
        ValueError: empty heads, a GPSA or biased head, ``dim`` not divisible by the heads.
    """

    def __init__(self, dim: int, heads: Sequence[HeadSpec | str | dict], grid: tuple[int, int],
                 num_prefix_tokens: int = 0, qkv_bias: bool = True, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        specs = coerce_heads(heads)
        _check_heads(specs)
        n_heads = len(specs)
        if dim % n_heads:
            raise ValueError(f"dim {dim} is not divisible by {n_heads} heads")
        self.dim, self.head_specs, self.num_heads = dim, specs, n_heads
        self.grid = (int(grid[0]), int(grid[1]))
        self.num_prefix_tokens = num_prefix_tokens
        self.num_tokens = num_prefix_tokens + self.grid[0] * self.grid[1]
        self.scale = (dim // n_heads) ** -0.5
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_l = nn.Linear(n_heads, n_heads)
        self.proj_w = nn.Linear(n_heads, n_heads)
        self.proj_drop = nn.Dropout(proj_drop)
        self.mask_heads = [i for i, h in enumerate(specs) if h.mask is not None]
        self.soft_heads = [i for i in self.mask_heads if specs[i].mask.mode == "soft"]
        self.strict_heads = [i for i in self.mask_heads if specs[i].mask.mode == "strict"]
        if self.mask_heads:
            masks = [window_mask(self.grid, specs[i].mask.window, num_prefix_tokens) for i in self.mask_heads]
            self.register_buffer("attn_masks", torch.stack(masks), persistent=False)  # (n_mask, N, N) bool
        if self.soft_heads:
            self.mask_alpha_logit = nn.Parameter(torch.zeros(len(self.soft_heads)))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """timm ``Cait._init_weights``: ``trunc_normal_(std=.02)`` on every Linear weight, zero biases;
        soft-mask logits at ``logit(alpha_init)``."""
        for lin in (self.qkv, self.proj, self.proj_l, self.proj_w):
            trunc_normal_(lin.weight, std=0.02)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        if self.soft_heads:
            self.mask_alpha_logit.copy_(torch.tensor(
                [alpha_to_logit(self.head_specs[i].mask.alpha_init) for i in self.soft_heads]))

    def gating(self) -> None:
        """No GPSA gating in talking-heads attention (the diagnostics ask every attention layer)."""
        return None

    def _mask(self, logits: Tensor) -> Tensor:
        """MaiT masks on the mixed logits ``(B, H, N, N)``: hard ``M (.) S``, soft ``alpha`` off-window, strict -inf
        -- the attention family's one mask rule (:func:`~archspec.families.attention.mask_terms.mask_terms`)."""
        if not self.mask_heads:
            return logits
        alpha = torch.sigmoid(self.mask_alpha_logit) if self.soft_heads else None
        modes = [h.mask.mode if h.mask is not None else None for h in self.head_specs]
        return apply_logit_terms(logits, *mask_terms(self.num_heads, modes, self.attn_masks, alpha, logits.dtype))

    def _softmax(self, q: Tensor, k: Tensor) -> Tensor:
        """Per-head probabilities ``softmax(mask(proj_l(q k^T)))`` ``(B, H, N, N)``, rows summing to 1."""
        attn = q @ k.transpose(-2, -1)
        attn = self.proj_l(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self._mask(attn).softmax(dim=-1)

    def _mix(self, attn: Tensor) -> Tensor:
        """``proj_w`` over the head axis: the map that weighs the values (rows need not sum to 1)."""
        return self.proj_w(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, N, C = x.shape
        if N != self.num_tokens or C != self.dim:
            raise ValueError(f"TalkingHeadAttn expects (B, {self.num_tokens}, {self.dim}), got {tuple(x.shape)}")
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        return qkv[0] * self.scale, qkv[1], qkv[2]

    def get_attention(self, x: Tensor, mixed: bool = False) -> Tensor:
        """Attention maps ``(B, H, N, N)`` for the diagnostics.

        Default: each head's softmax probabilities (after ``proj_l`` and the masks, before ``proj_w``):
        rows sum to 1, and a masked head's map is the one its mask shaped -- what ALS (MaiT eq. 3),
        nonlocality (ConViT eq. 8) and the cross-layer similarity (MaiT eq. 5) read (our choice).
        ``mixed=True``: after ``proj_w``, the map that actually weighs the values (a signed mix of heads).

        Raises:
            ValueError: ``x`` is not ``(B, N, dim)``.
        """
        q, k, _ = self._qkv(x)
        attn = self._softmax(q, k)
        return self._mix(attn) if mixed else attn

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, C) -> (B, N, C)``, as timm ``cait.TalkingHeadAttn.forward``.

        Raises:
            ValueError: ``x`` is not ``(B, N, dim)``.
        """
        B, N, C = x.shape
        q, k, v = self._qkv(x)
        attn = self.attn_drop(self._mix(self._softmax(q, k)))
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))

    def set_grid(self, grid: tuple[int, int]) -> None:
        """Move to patch grid ``grid`` (``ArchModel.set_input_size``): the token count and the MaiT masks
        follow; talking heads has no position table, so the weights are unchanged."""
        self.grid = (int(grid[0]), int(grid[1]))
        self.num_tokens = self.num_prefix_tokens + self.grid[0] * self.grid[1]
        if self.mask_heads:
            device = self.attn_masks.device
            masks = [window_mask(self.grid, self.head_specs[i].mask.window, self.num_prefix_tokens)
                     for i in self.mask_heads]
            self.attn_masks = torch.stack(masks).to(device)

    def extra_repr(self) -> str:
        letters = "".join(f"[{h.letter}]" for h in self.head_specs)
        return f"dim={self.dim}, heads={letters}, grid={self.grid}, prefix={self.num_prefix_tokens}, talking_heads"


def build(shape: TalkingHeadsShape) -> TalkingHeadAttn:
    """The module of a :class:`~.rules.TalkingHeadsShape` (raises as :class:`TalkingHeadAttn`)."""
    return TalkingHeadAttn(shape.dim, shape.heads, shape.grid, num_prefix_tokens=shape.n_prefix,
                           qkv_bias=shape.qkv_bias)
