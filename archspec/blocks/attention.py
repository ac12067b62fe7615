"""Per-head composable self-attention: MHSA, GPSA, relative position bias and MaiT masks in one layer.

Each head of an :class:`Attention` layer is described by a :class:`~archspec.heads.HeadSpec` and computes

1. content logits ``S_h = Q_h K_h^T * qk_dim ** -0.5``;
2. ``+ B_h`` on the patch-patch block when the head has a relative position bias
   (LeViT table on absolute offsets, LeViT eq. 1; or CMHSA table on signed offsets, CMHSA eq. 4);
3. the MaiT mask transform when it has a mask (hard: ``M (.) S``, eq. 2; soft: non-neighbours
   ``* alpha``, eq. 4; strict: non-neighbours ``-inf``);
4. ``softmax`` over keys;
5. for GPSA heads, ``A_h = normalize[(1 - sigmoid(lambda_h)) A_h + sigmoid(lambda_h) softmax(v_pos_h . r)]``
   (ConViT eq. 5-7), with ``lambda_h`` the gating parameter;

then ``out = proj(proj_act(concat_h(A_h V_h)))``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from timm.models.levit import LinearNorm
from torch import Tensor, nn

from archspec.heads import HeadSpec

from .masks import alpha_to_logit, soft_mask_scale, window_mask
from .position import conv_kernel_offsets, gpsa_rel_indices, levit_bias_idxs, resample_bias_table, signed_bias_idxs

__all__ = ["Attention", "coerce_heads"]


def coerce_heads(heads: Sequence[HeadSpec | str | dict]) -> tuple[HeadSpec, ...]:
    """Turn shorthands (``'mhsa'``, ``'gpsa'``, ``'mask:3x5'``, ...) or mappings into :class:`HeadSpec` objects.

    Raises:
        ValueError: for an empty list or an invalid head (pydantic's ``ValidationError`` is a ``ValueError``).
    """
    out = tuple(h if isinstance(h, HeadSpec) else HeadSpec.model_validate(h) for h in heads)
    if not out:
        raise ValueError("an attention layer needs at least one head")
    return out


class Attention(nn.Module):
    """Multi-head self-attention whose heads each compose MHSA, GPSA, a relative bias and a MaiT mask.

    Shapes: input ``x`` is ``(B, N, C)`` with ``C = dim`` and ``N = num_prefix_tokens + H_grid * W_grid``
    (prefix = class / distillation tokens first, then patches in row-major order); output ``(B, N, C)``.

    Sources, per mechanism:

    * MHSA: timm ``vision_transformer.Attention`` (layernorm family; ``qkv`` split into ``qk`` and ``v``).
    * GPSA: ConViT eq. 5-7, timm ``convit.GPSA`` (names ``qk``, ``v``, ``proj``, ``pos_proj``, ``gating_param``).
      The positional scores ``softmax(pos_proj(r))`` are computed once per forward on the ``(N, N, 3)``
      relative indices, *not* expanded over the batch: ``N * N * 3 * n_gpsa`` MACs independent of ``B``.
    * LeViT attention bias on absolute offsets: LeViT eq. 1, timm ``levit.Attention``
      (names ``attention_biases`` ``(n_bias_heads, H*W)`` and non-persistent buffer ``attention_bias_idxs``).
      With ``norm='batchnorm'`` the projections are timm ``LinearNorm`` as in ``levit.Attention``
      (``qkv`` with per-head layout ``(H, [q, k, v])``, ``proj = Sequential(act, ln)``).
    * Signed relative bias: CMHSA eq. 4 (``signed_biases`` ``(n_signed_heads, (2H-1)(2W-1))``).
    * Masks: MaiT eq. 2 (hard), eq. 4 (soft, ``mask_alpha_logit`` per soft head, ``alpha = sigmoid``),
      strict (``-inf``, our named option).  Prefix tokens are neighbours of everything (see
      :func:`archspec.blocks.masks.window_mask`).

    Parameters exist only for heads that use them, so parameter counts are honest.

    Args:
        dim: token width ``C``.
        heads: one :class:`HeadSpec` (or shorthand string / mapping) per head; ``len(heads)`` = number of heads.
        grid: ``(H, W)`` patch grid the patch tokens lie on.
        num_prefix_tokens: class / distillation tokens before the patches (0 for GPSA layers).
        qk_dim: per-head query/key dim (LeViT's key dim ``D``); default ``dim // len(heads)``.
        v_dim: per-head value dim (LeViT: ``attn_ratio * D``); default ``dim // len(heads)``.
        qkv_bias: bias on ``qk`` and ``v`` (layernorm family only; BatchNorm supplies the bias otherwise).
        norm: ``'layernorm'`` (ViT / ConViT / MaiT style plain linears) or ``'batchnorm'`` (LeViT ``LinearNorm``).
        proj_act: activation class applied to ``concat_h(A_h V_h)`` before ``proj`` (LeViT: ``nn.Hardswish``).
        attn_drop: dropout on the attention probabilities (only instantiated as a real dropout when > 0).
        proj_drop: dropout after ``proj``.

    Raises:
        ValueError: empty ``heads``; ``dim`` not divisible by the head count when ``qk_dim``/``v_dim`` are
            defaulted; unknown ``norm``; a GPSA head with ``num_prefix_tokens > 0``; a number of
            conv-initialised GPSA heads that is not a perfect square; GPSA heads of one layer that
            disagree on ``gating_trainable`` (the layer has a single ``gating_param``).
    """

    def __init__(
        self,
        dim: int,
        heads: Sequence[HeadSpec | str | dict],
        grid: tuple[int, int],
        num_prefix_tokens: int = 0,
        qk_dim: int | None = None,
        v_dim: int | None = None,
        qkv_bias: bool = True,
        norm: Literal["layernorm", "batchnorm"] = "layernorm",
        proj_act: type[nn.Module] | None = None,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        specs = coerce_heads(heads)
        n_heads = len(specs)
        if (qk_dim is None or v_dim is None) and dim % n_heads != 0:
            raise ValueError(f"dim {dim} is not divisible by {n_heads} heads; pass qk_dim and v_dim explicitly")
        if norm not in ("layernorm", "batchnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'batchnorm', got {norm!r}")
        if num_prefix_tokens < 0:
            raise ValueError(f"num_prefix_tokens must be >= 0, got {num_prefix_tokens}")
        rows, cols = int(grid[0]), int(grid[1])
        if rows < 1 or cols < 1:
            raise ValueError(f"grid sides must be >= 1, got {grid!r}")

        self.dim = dim
        self.head_specs = specs
        self.num_heads = n_heads
        self.grid = (rows, cols)
        self.num_prefix_tokens = num_prefix_tokens
        self.num_patches = rows * cols
        self.num_tokens = num_prefix_tokens + rows * cols
        self.qk_dim = int(qk_dim if qk_dim is not None else dim // n_heads)
        self.v_dim = int(v_dim if v_dim is not None else dim // n_heads)
        if self.qk_dim < 1 or self.v_dim < 1:
            raise ValueError(f"qk_dim and v_dim must be >= 1, got {self.qk_dim}, {self.v_dim}")
        self.scale = self.qk_dim ** -0.5
        self.norm = norm

        # ---- which head does what (python lists of head indices, in head order)
        self.abs_bias_heads = [i for i, h in enumerate(specs) if h.rel_bias is not None and h.rel_bias.table == "absolute"]
        self.signed_bias_heads = [i for i, h in enumerate(specs) if h.rel_bias is not None and h.rel_bias.table == "signed"]
        self.gpsa_heads = [i for i, h in enumerate(specs) if h.gpsa is not None]
        self.mask_heads = [i for i, h in enumerate(specs) if h.mask is not None]
        self.hard_heads = [i for i in self.mask_heads if specs[i].mask.mode == "hard"]
        self.soft_heads = [i for i in self.mask_heads if specs[i].mask.mode == "soft"]
        self.strict_heads = [i for i in self.mask_heads if specs[i].mask.mode == "strict"]
        # SDPA handles additive terms only (bias, -inf); hard/soft masks and GPSA need explicit logits.
        self.explicit_logits = bool(self.gpsa_heads or self.hard_heads or self.soft_heads)

        if self.gpsa_heads and num_prefix_tokens > 0:
            raise ValueError(
                "GPSA heads need num_prefix_tokens == 0: ConViT concatenates the class token only after "
                f"the last GPSA block (got num_prefix_tokens={num_prefix_tokens})"
            )
        conv_init_heads = [i for i in self.gpsa_heads if specs[i].gpsa.conv_init]
        if conv_init_heads:
            conv_kernel_offsets(len(conv_init_heads))  # raises ValueError when not a perfect square
        self.conv_init_heads = conv_init_heads
        trainable = {specs[i].gpsa.gating_trainable for i in self.gpsa_heads}
        if len(trainable) > 1:
            raise ValueError("GPSA heads of one layer must agree on gating_trainable (one gating_param per layer)")

        # ---- projections
        H, dqk, dv = n_heads, self.qk_dim, self.v_dim
        if norm == "layernorm":
            # layout (2, H, qk_dim) as timm convit.GPSA.qk; v (H, v_dim)
            self.qk = nn.Linear(dim, 2 * H * dqk, bias=qkv_bias)
            self.v = nn.Linear(dim, H * dv, bias=qkv_bias)
            self.proj_act = proj_act() if proj_act is not None else nn.Identity()
            self.proj = nn.Linear(H * dv, dim)
        else:
            # timm levit.Attention: qkv = LinearNorm, per-head layout (H, [q, k, v]); proj = (act, ln)
            self.qkv = LinearNorm(dim, H * (2 * dqk + dv))
            self.proj = nn.Sequential(OrderedDict([
                ("act", proj_act() if proj_act is not None else nn.Identity()),
                ("ln", LinearNorm(H * dv, dim, bn_weight_init=0)),
            ]))
        self.attn_drop = nn.Dropout(attn_drop) if attn_drop > 0 else nn.Identity()
        self.attn_drop_p = float(attn_drop)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 else nn.Identity()

        # ---- per-head extras: parameters only for the heads that use them
        grid_t = (rows, cols)
        if self.abs_bias_heads:
            self.attention_biases = nn.Parameter(torch.zeros(len(self.abs_bias_heads), rows * cols))
            self.register_buffer("attention_bias_idxs", levit_bias_idxs(grid_t), persistent=False)
        if self.signed_bias_heads:
            self.signed_biases = nn.Parameter(torch.zeros(len(self.signed_bias_heads), (2 * rows - 1) * (2 * cols - 1)))
            self.register_buffer("signed_bias_idxs", signed_bias_idxs(grid_t), persistent=False)
        if self.gpsa_heads:
            n_g = len(self.gpsa_heads)
            self.pos_proj = nn.Linear(3, n_g)
            self.gating_param = nn.Parameter(torch.zeros(n_g), requires_grad=trainable == {True})
            self.register_buffer("rel_indices", gpsa_rel_indices(grid_t), persistent=False)
            self.register_buffer("gpsa_head_idx", torch.tensor(self.gpsa_heads, dtype=torch.long), persistent=False)
        if self.mask_heads:
            masks = [window_mask(grid_t, specs[i].mask.window, num_prefix_tokens) for i in self.mask_heads]
            self.register_buffer("attn_masks", torch.stack(masks), persistent=False)  # (n_mask, N, N) bool
        if self.soft_heads:
            self.mask_alpha_logit = nn.Parameter(torch.zeros(len(self.soft_heads)))

        self._bias_cache: Tensor | None = None
        self._mult_cache: Tensor | None = None
        self.reset_parameters()

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise all parameters (deterministic given torch's RNG state).

        layernorm family: like timm ViT / ConViT ``_init_weights`` -- ``trunc_normal_(std=.02)`` on every
        Linear weight (``qk``, ``v``, ``proj``, ``pos_proj``), zero biases.  batchnorm family: timm
        ``LinearNorm`` defaults (PyTorch Linear init, BN weight 1, ``proj`` BN weight 0), as timm LeViT.
        Bias tables start at 0 (LeViT / timm); soft-mask logits at ``logit(alpha_init)``; the gating
        parameter at ``gating_init``.  Finally the ConViT convolutional init (eq. 5, timm ``local_init``)
        of the conv-initialised GPSA heads.
        """
        if self.norm == "layernorm":
            for lin in (self.qk, self.v, self.proj):
                trunc_normal_(lin.weight, std=0.02)
                if lin.bias is not None:
                    nn.init.zeros_(lin.bias)
        if self.abs_bias_heads:
            self.attention_biases.zero_()
        if self.signed_bias_heads:
            # CMHSA does not state an init; we start at 0 like LeViT (the head begins as plain MHSA).
            self.signed_biases.zero_()
        if self.soft_heads:
            self.mask_alpha_logit.copy_(torch.tensor(
                [alpha_to_logit(self.head_specs[i].mask.alpha_init) for i in self.soft_heads]))
        if self.gpsa_heads:
            trunc_normal_(self.pos_proj.weight, std=0.02)
            nn.init.zeros_(self.pos_proj.bias)
            self.gating_param.copy_(torch.tensor([self.head_specs[i].gpsa.gating_init for i in self.gpsa_heads]))
            self._conv_init()

    def _value_rows(self, head: int) -> tuple[Tensor, slice]:
        """(weight matrix, row slice) holding head ``head``'s value projection."""
        if self.norm == "layernorm":
            return self.v.weight, slice(head * self.v_dim, (head + 1) * self.v_dim)
        per = 2 * self.qk_dim + self.v_dim
        start = head * per + 2 * self.qk_dim
        return self.qkv.linear.weight, slice(start, start + self.v_dim)

    @torch.no_grad()
    def _conv_init(self) -> None:
        """ConViT convolutional init (eq. 5), mirroring timm ``convit.GPSA.local_init``.

        The conv-initialised GPSA heads, in head order, take the offsets of
        :func:`~archspec.blocks.position.conv_kernel_offsets` for their count.  Their ``pos_proj`` rows become
        ``locality_strength * (2 d_col, 2 d_row, -1)`` on timm's channels ``(dx, dy, dx^2+dy^2)``; their value
        rows become the matching slice of the identity when ``H * v_dim == dim`` (timm sets ``v = eye``).
        """
        if not self.conv_init_heads:
            return
        offsets = conv_kernel_offsets(len(self.conv_init_heads))
        identity_v = self.num_heads * self.v_dim == self.dim
        eye = torch.eye(self.dim) if identity_v else None
        for pos, head in enumerate(self.conv_init_heads):
            d_row, d_col = offsets[pos]
            strength = self.head_specs[head].gpsa.locality_strength
            row = self.gpsa_heads.index(head)
            self.pos_proj.weight[row] = strength * torch.tensor([2.0 * d_col, 2.0 * d_row, -1.0])
            if identity_v:
                weight, rows = self._value_rows(head)
                weight[rows] = eye[head * self.v_dim:(head + 1) * self.v_dim].to(weight.dtype)

    # ------------------------------------------------------------------ pieces
    def _check_input(self, x: Tensor) -> None:
        if x.dim() != 3 or x.shape[1] != self.num_tokens or x.shape[2] != self.dim:
            raise ValueError(
                f"Attention expects (B, {self.num_tokens}, {self.dim}) = (B, prefix {self.num_prefix_tokens} + "
                f"grid {self.grid[0]}x{self.grid[1]}, dim), got {tuple(x.shape)}"
            )

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q, k ``(B, H, N, qk_dim)`` and v ``(B, H, N, v_dim)``."""
        B, N, _ = x.shape
        H = self.num_heads
        if self.norm == "layernorm":
            qk = self.qk(x).reshape(B, N, 2, H, self.qk_dim).permute(2, 0, 3, 1, 4)
            q, k = qk[0], qk[1]
            v = self.v(x).reshape(B, N, H, self.v_dim).permute(0, 2, 1, 3)
        else:
            q, k, v = self.qkv(x).view(B, N, H, -1).split([self.qk_dim, self.qk_dim, self.v_dim], dim=3)
            q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
        return q, k, v

    def position_bias(self) -> Tensor | None:
        """Additive relative-position bias of every head, ``(H, N, N)`` (zero outside the patch-patch block
        and for heads without a bias), or ``None`` when no head has one."""
        if not (self.abs_bias_heads or self.signed_bias_heads):
            return None
        # In eval mode the bias is a constant: build it once per device, as timm's LeViT does.
        if not self.training and self._bias_cache is not None and self._bias_cache.device == self.attention_bias_device:
            return self._bias_cache
        bias = self._build_position_bias()
        self._bias_cache = None if self.training else bias.detach()
        return bias

    @property
    def attention_bias_device(self) -> torch.device:
        """Device of the bias table (the eval-mode bias cache is valid only there)."""
        return (self.attention_biases if self.abs_bias_heads else self.signed_biases).device

    def train(self, mode: bool = True) -> "Attention":
        """Switch train/eval mode; drops the eval-mode bias and mask caches."""
        self._bias_cache = None
        self._mult_cache = None
        return super().train(mode)

    def _load_from_state_dict(self, *args, **kwargs) -> None:  # new weights invalidate the eval-mode bias cache
        self._bias_cache = None
        super()._load_from_state_dict(*args, **kwargs)

    def _build_position_bias(self) -> Tensor:
        p = self.num_prefix_tokens
        if p == 0 and len(self.abs_bias_heads) == self.num_heads:  # LeViT: every head biased, no prefix
            return self.attention_biases[:, self.attention_bias_idxs]
        ref = self.attention_biases if self.abs_bias_heads else self.signed_biases
        bias = ref.new_zeros(self.num_heads, self.num_tokens, self.num_tokens)
        if self.abs_bias_heads:
            bias[self.abs_bias_heads, p:, p:] = self.attention_biases[:, self.attention_bias_idxs]
        if self.signed_bias_heads:
            bias[self.signed_bias_heads, p:, p:] = self.signed_biases[:, self.signed_bias_idxs]
        return bias

    def mask_alpha(self) -> Tensor | None:
        """Soft-mask scale ``alpha = sigmoid(mask_alpha_logit)`` per soft head ``(n_soft,)``, or ``None``."""
        return torch.sigmoid(self.mask_alpha_logit) if self.soft_heads else None

    def gating(self) -> Tensor | None:
        """``sigmoid(gating_param)`` per GPSA head ``(n_gpsa,)``: the weight of positional attention, or ``None``."""
        return torch.sigmoid(self.gating_param) if self.gpsa_heads else None

    def _mask_terms(self, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
        """(multiplier ``(H, N, N)`` for hard/soft heads or None, boolean ``-inf`` mask ``(H, N, N)`` or None)."""
        mult = block = None
        N = self.num_tokens
        if self.hard_heads and not self.soft_heads:  # constant: cache per dtype and device
            cached = self._mult_cache
            if cached is None or cached.dtype != dtype or cached.device != self.attn_masks.device:
                cached = torch.ones(self.num_heads, N, N, dtype=dtype, device=self.attn_masks.device)
                cached[self.hard_heads] = self.attn_masks.to(dtype)[[self.mask_heads.index(i) for i in self.hard_heads]]
                self._mult_cache = cached
            mult = cached
        elif self.hard_heads or self.soft_heads:
            mult = torch.ones(self.num_heads, N, N, dtype=dtype, device=self.attn_masks.device)
            if self.hard_heads:
                sel = [self.mask_heads.index(i) for i in self.hard_heads]
                mult[self.hard_heads] = self.attn_masks[sel].to(dtype)
            if self.soft_heads:
                sel = [self.mask_heads.index(i) for i in self.soft_heads]
                mult[self.soft_heads] = soft_mask_scale(self.attn_masks[sel], self.mask_alpha().to(dtype))
        if self.strict_heads:
            block = torch.zeros(self.num_heads, N, N, dtype=torch.bool, device=self.attn_masks.device)
            sel = [self.mask_heads.index(i) for i in self.strict_heads]
            block[self.strict_heads] = ~self.attn_masks[sel]
        return mult, block

    def positional_attention(self) -> Tensor:
        """GPSA positional attention ``softmax(pos_proj(r))`` ``(n_gpsa, N, N)`` (ConViT eq. 5).

        Computed on the ``(N, N, 3)`` relative indices once, not per batch element
        (``N * N * 3 * n_gpsa`` MACs).

        Raises:
            ValueError: when the layer has no GPSA head.
        """
        if not self.gpsa_heads:
            raise ValueError("this attention layer has no GPSA head")
        return self.pos_proj(self.rel_indices.to(self.pos_proj.weight.dtype)).permute(2, 0, 1).softmax(dim=-1)

    def _probs(self, q: Tensor, k: Tensor) -> Tensor:
        """Explicit path: final attention probabilities ``(B, H, N, N)`` before dropout."""
        attn = (q @ k.transpose(-2, -1)) * self.scale
        bias = self.position_bias()
        if bias is not None:
            attn = attn + bias.to(attn.dtype)
        mult, block = self._mask_terms(attn.dtype)
        if mult is not None:
            attn = attn * mult
        if block is not None:
            attn = attn.masked_fill(block, float("-inf"))
        attn = attn.softmax(dim=-1)
        if self.gpsa_heads:
            pos = self.positional_attention().to(attn.dtype)
            gate = self.gating().to(attn.dtype).view(1, -1, 1, 1)
            content = attn if len(self.gpsa_heads) == self.num_heads else attn[:, self.gpsa_heads]
            mixed = (1.0 - gate) * content + gate * pos
            mixed = mixed / mixed.sum(dim=-1, keepdim=True)
            if len(self.gpsa_heads) == self.num_heads:
                attn = mixed
            else:
                attn = attn.index_copy(1, self.gpsa_head_idx, mixed)
        return attn

    # ------------------------------------------------------------------ API
    def get_attention(self, x: Tensor) -> Tensor:
        """Final attention probabilities ``(B, H, N, N)`` (after masks and GPSA gating, without dropout).

        Args:
            x: ``(B, N, C)``.

        Raises:
            ValueError: if ``x`` is not ``(B, num_prefix_tokens + H*W, dim)``.
        """
        self._check_input(x)
        q, k, _ = self._qkv(x)
        return self._probs(q, k)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, N, C) -> (B, N, C)``.

        Uses ``F.scaled_dot_product_attention`` when no head needs explicit logits (plain heads, additive
        biases and strict masks go in as a float ``attn_mask``); the explicit softmax path otherwise.

        Raises:
            ValueError: if ``x`` is not ``(B, num_prefix_tokens + H*W, dim)``.
        """
        self._check_input(x)
        B, N, _ = x.shape
        q, k, v = self._qkv(x)
        if self.explicit_logits:
            attn = self.attn_drop(self._probs(q, k))
            out = attn @ v
        else:
            mask = self.position_bias()
            if mask is not None:
                mask = mask.to(q.dtype)
            _, block = self._mask_terms(q.dtype)
            if block is not None:
                mask = torch.zeros(block.shape, dtype=q.dtype, device=q.device) if mask is None else mask
                mask = mask.masked_fill(block, float("-inf"))
            out = F.scaled_dot_product_attention(
                q, k, v,
                attn_mask=None if mask is None else mask.unsqueeze(0),
                dropout_p=self.attn_drop_p if self.training else 0.0,
                scale=self.scale,
            )
        out = out.transpose(1, 2).reshape(B, N, self.num_heads * self.v_dim)
        if self.norm == "layernorm":
            out = self.proj(self.proj_act(out))
        else:
            out = self.proj(out)
        return self.proj_drop(out)

    def extra_repr(self) -> str:
        letters = "".join(f"[{h.letter}]" for h in self.head_specs)
        return (f"dim={self.dim}, heads={letters}, grid={self.grid}, prefix={self.num_prefix_tokens}, "
                f"qk_dim={self.qk_dim}, v_dim={self.v_dim}, norm={self.norm}")

    @torch.no_grad()
    def set_grid(self, grid: tuple[int, int]) -> None:
        """Move the layer to another patch grid ``(H', W')`` (a new input resolution), keeping its weights.

        Rebuilt for the new grid: the relative-offset index tables, GPSA's fixed ``r_ij``
        (:func:`~archspec.blocks.position.gpsa_rel_indices`) and the MaiT masks (same window, new grid).
        The learned bias tables are resampled bicubically on their offset grids
        (:func:`~archspec.blocks.position.resample_bias_table`, as timm ``resize_rel_pos_bias_table_levit``):
        LeViT's ``attention_biases`` ``(h, H*W) -> (h, H'*W')``, CMHSA's ``signed_biases``
        ``(h, (2H-1)(2W-1)) -> (h, (2H'-1)(2W'-1))``.  Afterwards the layer expects ``(B, prefix + H'*W', C)``.

        Raises:
            ValueError: for a grid side < 1.
        """
        rows, cols = int(grid[0]), int(grid[1])
        if rows < 1 or cols < 1:
            raise ValueError(f"grid sides must be >= 1, got {grid!r}")
        old = self.grid
        device = next(self.parameters()).device
        if self.abs_bias_heads:
            table = resample_bias_table(self.attention_biases.data, old, (rows, cols))
            self.attention_biases = nn.Parameter(table, requires_grad=self.attention_biases.requires_grad)
            self.attention_bias_idxs = levit_bias_idxs((rows, cols)).to(device)
        if self.signed_bias_heads:
            table = resample_bias_table(self.signed_biases.data, (2 * old[0] - 1, 2 * old[1] - 1),
                                        (2 * rows - 1, 2 * cols - 1))
            self.signed_biases = nn.Parameter(table, requires_grad=self.signed_biases.requires_grad)
            self.signed_bias_idxs = signed_bias_idxs((rows, cols)).to(device)
        if self.gpsa_heads:
            self.rel_indices = gpsa_rel_indices((rows, cols)).to(device)
        if self.mask_heads:
            masks = [window_mask((rows, cols), self.head_specs[i].mask.window, self.num_prefix_tokens)
                     for i in self.mask_heads]
            self.attn_masks = torch.stack(masks).to(device)
        self.grid = (rows, cols)
        self.num_patches = rows * cols
        self.num_tokens = self.num_prefix_tokens + rows * cols
        self._bias_cache = None
        self._mult_cache = None
