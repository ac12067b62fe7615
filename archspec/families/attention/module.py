"""Per-head composable self-attention: MHSA, GPSA, relative position bias and MaiT masks in one layer.

Each head of an :class:`Attention` layer is described by a
:class:`~archspec.families.attention.heads.HeadSpec` and computes

1. content logits ``S_h = Q_h K_h^T * qk_dim ** -0.5``;
2. ``+ B_h`` on the patch-patch block when the head has a relative position bias
   (LeViT table on absolute offsets, LeViT eq. 1; or CMHSA table on signed offsets, CMHSA eq. 4), and
   ``+ alpha_h exp(-d^2 / (2 (sigma_h^2 + 1e-5)))`` when it has a Gaussian bias (GMM-Mask, arXiv 2309.05375,
   one Gaussian per head, added: :mod:`archspec.families.attention.gauss_mask`);
3. the MaiT mask transform when it has a mask (hard: ``M (.) S``, eq. 2; soft: non-neighbours
   ``* alpha``, eq. 4; strict: non-neighbours ``-inf``);
4. ``softmax`` over keys;
5. for GPSA heads, ``A_h = normalize[(1 - sigmoid(lambda_h)) A_h + sigmoid(lambda_h) softmax(v_pos_h . r)]``
   (ConViT eq. 5-7), with ``lambda_h`` the gating parameter;

then ``out = proj(proj_act(concat_h(A_h V_h)))``.

That formula is the *dense reference* (``attn_impl='dense'``, :meth:`Attention._probs`).  By default
(``attn_impl='auto'``) each layer groups its heads at construction and runs each group on an exact faster path
(:mod:`archspec.families.attention.kernels`): plain / biased / strict heads in one SDPA call, GPSA heads as
``(1 - g) SDPA + g P V``, hard-masked heads in linear time on grids past the measured crossover.  With attention
dropout active in training every head takes the dense reference (the fast paths have no dropout on the
implicit non-neighbour weights).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import torch
import torch.nn.functional as F
from timm.layers import trunc_normal_
from timm.models.levit import LinearNorm
from torch import Tensor, nn

from ..activations import activation
from . import gauss_mask, gpsa
from .heads import HeadSpec, coerce_heads
from .kernels import (
    flex_masked_attention,
    gpsa_attention,
    hard_masked_attention,
    hard_window_attention,
    is_compiling,
    window_tables,
)
from .mask import alpha_to_logit
from .mask_terms import apply_mask_terms, hard_zero, mask_terms, strict_block, window_mask
from .rules import AttentionShape, head_path
from .tables import (
    check_grid,
    conv_kernel_offsets,
    gpsa_rel_indices,
    grid_positions,
    levit_bias_idxs,
    resample_bias_table,
    signed_bias_idxs,
)

__all__ = ["Attention", "ZeroPadTokens", "build", "coerce_heads", "ATTN_IMPLS", "set_attention_impl",
           "attention_impl"]

#: Attention implementations: ``dense`` the explicit-logits reference formula (every head in one ``(B, H, N, N)``
#: softmax, or one SDPA call when no head needs explicit logits); ``auto`` each group of heads on its fastest
#: exact path, hard masks linear-time where :func:`window_path_pays`; ``fast`` the same with the linear-time
#: hard-mask path on every grid (tests, benchmarks); ``flex`` hard/soft/biased-masked heads through FlexAttention.
ATTN_IMPLS = ("auto", "dense", "fast", "flex")


def _usable(cached: Tensor | None) -> bool:
    """A cached constant can be reused: it exists, and it was not made under ``inference_mode`` unless we are in it
    (autograd refuses to save inference tensors for backward).  Never under ``torch.compile``: the compiled graph
    recomputes (and constant-folds) the tables itself, and Dynamo cannot trace ``is_inference``."""
    if is_compiling():
        return False
    return cached is not None and (not cached.is_inference() or torch.is_inference_mode_enabled())


def _cacheable(training: bool) -> bool:
    """Whether a constant computed now may be stored: eval mode, outside ``torch.compile`` tracing (a traced
    tensor stored on the module would leak out of the graph)."""
    return not training and not is_compiling()


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
    * Gaussian bias (GMM-Mask, Li & Zhang, arXiv 2309.05375; authors' ``models/gmm.py`` with one Gaussian per head):
      ``gauss_alpha`` and ``gauss_sigma`` ``(n_gauss,)``, the bias ``alpha exp(-d^2 / (2 (sigma^2 + 1e-5)))`` on the
      patch-patch logits from the non-persistent squared-distance buffer ``gauss_dist2`` ``(H*W, H*W)`` (patch
      units); added to the logits (our choice: the authors' code multiplies them), prefix tokens unbiased.
    * Masks: MaiT eq. 2 (hard), eq. 4 (soft, ``mask_alpha_logit`` per soft head, ``alpha = sigmoid``),
      strict (``-inf``, our named option).  Prefix tokens are neighbours of everything (see
      :func:`archspec.families.attention.mask_terms.window_mask`).

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
        self._set_dims(dim, specs, grid, num_prefix_tokens, qk_dim, v_dim, norm)
        self._classify_heads(specs)
        self._build_projections(qkv_bias, proj_act, attn_drop, proj_drop)
        self._build_head_parameters()
        self.attn_impl = "auto"
        # Whether SDPA has a fused kernel for a float attn_mask (CUDA: memory-efficient attention); on CPU the
        # biased / strict heads use the explicit formula instead.  Updated by _apply (.to(), .cuda()).
        self._masked_sdpa_fused = False
        self._build_grid_tables(self.grid)
        self.reset_parameters()

    def _set_dims(self, dim: int, specs: tuple[HeadSpec, ...], grid: tuple[int, int], num_prefix_tokens: int,
                  qk_dim: int | None, v_dim: int | None, norm: str) -> None:
        """Check and store the layer's sizes: width, heads, grid, prefix, per-head q/k and value dims, scale."""
        n_heads = len(specs)
        if (qk_dim is None or v_dim is None) and dim % n_heads != 0:
            raise ValueError(f"dim {dim} is not divisible by {n_heads} heads; pass qk_dim and v_dim explicitly")
        if norm not in ("layernorm", "batchnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'batchnorm', got {norm!r}")
        if num_prefix_tokens < 0:
            raise ValueError(f"num_prefix_tokens must be >= 0, got {num_prefix_tokens}")
        rows, cols = check_grid(grid)
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

    def _classify_heads(self, specs: tuple[HeadSpec, ...]) -> None:
        """Which head does what: python lists of head indices, in head order; checks GPSA's constraints."""
        self.abs_bias_heads = [i for i, h in enumerate(specs)
                               if h.rel_bias is not None and h.rel_bias.table == "absolute"]
        self.signed_bias_heads = [i for i, h in enumerate(specs)
                                  if h.rel_bias is not None and h.rel_bias.table == "signed"]
        self.gpsa_heads = [i for i, h in enumerate(specs) if h.gpsa is not None]
        self.gauss_heads = [i for i, h in enumerate(specs) if h.gauss_mask is not None]
        self.mask_heads = [i for i, h in enumerate(specs) if h.mask is not None]
        self.hard_heads = [i for i in self.mask_heads if specs[i].mask.mode == "hard"]
        self.soft_heads = [i for i in self.mask_heads if specs[i].mask.mode == "soft"]
        self.strict_heads = [i for i in self.mask_heads if specs[i].mask.mode == "strict"]
        self._mask_modes = [h.mask.mode if h.mask is not None else None for h in specs]
        # SDPA handles additive terms only (bias, -inf); hard/soft masks and GPSA need explicit logits.
        self.explicit_logits = bool(self.gpsa_heads or self.hard_heads or self.soft_heads)
        for _, message, hint in gpsa.problems(specs, self.grid, self.num_prefix_tokens, ()):  # the IR's own checks
            raise ValueError(f"{message} ({hint})")
        self.conv_init_heads = [i for i in self.gpsa_heads if specs[i].gpsa.conv_init]
        if len({specs[i].gpsa.gating_trainable for i in self.gpsa_heads}) > 1:
            raise ValueError("GPSA heads of one layer must agree on gating_trainable (one gating_param per layer)")

    def _build_projections(self, qkv_bias: bool, proj_act: type[nn.Module] | None, attn_drop: float,
                           proj_drop: float) -> None:
        """q/k/v and output projections in timm's layout (ConViT ``qk`` + ``v``, or LeViT ``qkv`` LinearNorm)."""
        dim, H, dqk, dv = self.dim, self.num_heads, self.qk_dim, self.v_dim
        if self.norm == "layernorm":
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

    def _build_head_parameters(self) -> None:
        """Per-head extras, only for the heads that use them: bias tables, GPSA's ``pos_proj`` and gating
        parameter, soft-mask logits."""
        rows, cols = self.grid
        if self.abs_bias_heads:
            self.attention_biases = nn.Parameter(torch.zeros(len(self.abs_bias_heads), rows * cols))
        if self.signed_bias_heads:
            self.signed_biases = nn.Parameter(torch.zeros(len(self.signed_bias_heads), (2 * rows - 1) * (2 * cols - 1)))
        if self.gpsa_heads:
            n_g = len(self.gpsa_heads)
            trainable = self.head_specs[self.gpsa_heads[0]].gpsa.gating_trainable  # one value: _classify_heads
            self.pos_proj = nn.Linear(3, n_g)
            self.gating_param = nn.Parameter(torch.zeros(n_g), requires_grad=trainable)
            self.register_buffer("gpsa_head_idx", torch.tensor(self.gpsa_heads, dtype=torch.long), persistent=False)
        if self.soft_heads:
            self.mask_alpha_logit = nn.Parameter(torch.zeros(len(self.soft_heads)))
        if self.gauss_heads:
            self.gauss_alpha = nn.Parameter(torch.zeros(len(self.gauss_heads)))
            self.gauss_sigma = nn.Parameter(torch.zeros(len(self.gauss_heads)))

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise all parameters (deterministic given torch's RNG state).

        layernorm family: like timm ViT / ConViT ``_init_weights`` -- ``trunc_normal_(std=.02)`` on every
        Linear weight (``qk``, ``v``, ``proj``, ``pos_proj``), zero biases.  batchnorm family: timm
        ``LinearNorm`` defaults (PyTorch Linear init, BN weight 1, ``proj`` BN weight 0), as timm LeViT.
        Bias tables start at 0 (LeViT / timm); soft-mask logits at ``logit(alpha_init)``; the Gaussian heads'
        ``gauss_alpha`` / ``gauss_sigma`` at their spec's ``alpha_init`` / ``sigma_init`` (default 5 and 1 patch:
        local, :mod:`~archspec.families.attention.gauss_mask`); the gating parameter at ``gating_init``.
        Finally the ConViT convolutional init (eq. 5, timm ``local_init``) of the conv-initialised GPSA heads.
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
        if self.gauss_heads:
            self.gauss_alpha.copy_(torch.tensor([self.head_specs[i].gauss_mask.alpha_init for i in self.gauss_heads]))
            self.gauss_sigma.copy_(torch.tensor([self.head_specs[i].gauss_mask.sigma_init for i in self.gauss_heads]))
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
        :func:`~archspec.families.attention.tables.conv_kernel_offsets` for their count.  Their ``pos_proj`` rows become
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

    # ------------------------------------------------------------------ grid tables and path plan
    def _build_grid_tables(self, grid: tuple[int, int]) -> None:
        """(Re)build everything that depends on the patch grid, except the learned bias tables.

        Sets ``grid``, ``num_patches``, ``num_tokens``; registers the non-persistent index / mask buffers
        (``attention_bias_idxs``, ``signed_bias_idxs``, ``rel_indices``, ``gauss_dist2``, ``attn_masks``, the window
        tables of
        the linear-time hard-mask heads ``window{r}x{c}_{outside,n0}``) on the module's device;
        drops the eval-mode caches and re-plans which path each head takes (the crossover depends on the grid).
        A resolution change (``set_grid``) calls this after resizing ``attention_biases`` / ``signed_biases``.

        Raises:
            ValueError: a grid side < 1.
        """
        rows, cols = check_grid(grid)
        self.grid = (rows, cols)
        self.num_patches = rows * cols
        self.num_tokens = self.num_prefix_tokens + rows * cols
        device = next(self.parameters()).device
        p, specs = self.num_prefix_tokens, self.head_specs
        if self.abs_bias_heads:
            self.register_buffer("attention_bias_idxs", levit_bias_idxs(self.grid).to(device), persistent=False)
        if self.signed_bias_heads:
            self.register_buffer("signed_bias_idxs", signed_bias_idxs(self.grid).to(device), persistent=False)
        if self.gpsa_heads:
            self.register_buffer("rel_indices", gpsa_rel_indices(self.grid).to(device), persistent=False)
        if self.gauss_heads:  # squared patch distances d_ij^2 (row and column offsets in patches), float32
            pos = grid_positions(self.grid).to(torch.float32)
            dist2 = (pos[:, :, None] - pos[:, None, :]).pow(2).sum(dim=0)
            self.register_buffer("gauss_dist2", dist2.to(device), persistent=False)
        if self.mask_heads:
            masks = [window_mask(self.grid, specs[i].mask.window, p) for i in self.mask_heads]
            self.register_buffer("attn_masks", torch.stack(masks).to(device), persistent=False)  # (n_mask, N, N) bool
        for window in sorted({tuple(specs[i].mask.window) for i in self.hard_heads}):
            for name, table in window_tables(self.grid, window, p).items():
                self.register_buffer(f"window{window[0]}x{window[1]}_{name}", table.to(device), persistent=False)
        self._drop_caches()
        self._plan_paths()

    def _drop_caches(self) -> None:
        self._bias_cache: Tensor | None = None
        self._zero_cache: Tensor | None = None
        self._qkv_cache: tuple[Tensor, Tensor | None] | None = None
        self._additive_cache: Tensor | None = None
        self._positional_cache: Tensor | None = None

    def set_attn_impl(self, impl: str) -> Attention:
        """Choose the implementation (one of :data:`ATTN_IMPLS`; ``'dense'`` is the reference) and re-plan.

        Raises:
            ValueError: an unknown name.
        """
        if impl not in ATTN_IMPLS:
            raise ValueError(f"attn_impl must be one of {ATTN_IMPLS}, got {impl!r}")
        self.attn_impl = impl
        self._plan_paths()
        return self

    def _head_path(self, head: int, compiled: bool = False) -> tuple:
        """Path of one head under ``attn_impl`` (not ``'dense'``): the family rules' :func:`~.rules.head_path`."""
        return head_path(self.head_specs[head], self.num_patches, self.attn_impl, compiled)

    def _plan_paths(self) -> None:
        """Group heads by path (static: head kinds, grid, ``attn_impl``); ``_groups`` lists ``(key, heads)``
        by first head, ``_head_order`` the permutation restoring head order after concatenation (or None)."""
        if self.attn_impl == "dense":
            self._groups, self._head_order = [], None
            self._compiled_plan = ([], None)
            return
        self._groups, self._head_order = self._group_heads(compiled=False)
        self._compiled_plan = self._group_heads(compiled=True)

    def _group_heads(self, compiled: bool) -> tuple[list[tuple[tuple, list[int]]], list[int] | None]:
        groups: dict[tuple, list[int]] = {}
        for head in range(self.num_heads):
            groups.setdefault(self._head_path(head, compiled), []).append(head)
        ordered = sorted(groups.items(), key=lambda item: item[1][0])
        order = [h for _, heads in ordered for h in heads]
        in_order = order == list(range(self.num_heads))
        return ordered, None if in_order else [order.index(h) for h in range(self.num_heads)]

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
            n_qk = 2 * H * self.qk_dim
            if self.training:
                qk, v = self.qk(x), self.v(x)
            else:  # one GEMM with the stacked weights instead of two (timm's single qkv linear)
                weight, bias = self._stacked_qkv()
                qkv = F.linear(x, weight, bias)
                qk, v = qkv[..., :n_qk], qkv[..., n_qk:]
            qk = qk.reshape(B, N, 2, H, self.qk_dim).permute(2, 0, 3, 1, 4)
            q, k = qk[0], qk[1]
            v = v.reshape(B, N, H, self.v_dim).permute(0, 2, 1, 3)
        else:
            q, k, v = self.qkv(x).view(B, N, H, -1).split([self.qk_dim, self.qk_dim, self.v_dim], dim=3)
            q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
        return q, k, v

    def _stacked_qkv(self) -> tuple[Tensor, Tensor | None]:
        """Eval mode: ``cat([qk.weight, v.weight])`` ``(2 H qk_dim + H v_dim, C)`` and the stacked biases, cached
        (dropped by ``train()``, ``load_state_dict`` and device / dtype moves)."""
        cached = self._qkv_cache
        if _usable(cached[0] if cached else None):
            return cached
        weight = torch.cat([self.qk.weight, self.v.weight]).detach()
        bias = None if self.qk.bias is None else torch.cat([self.qk.bias, self.v.bias]).detach()
        if _cacheable(False):
            self._qkv_cache = (weight, bias)
        return weight, bias

    def position_bias(self) -> Tensor | None:
        """Additive position bias of every head, ``(H, N, N)``: relative-bias tables plus Gaussian biases
        (:meth:`gauss_bias`), zero outside the patch-patch block and for heads without either; or ``None`` when no
        head has one."""
        if not (self.abs_bias_heads or self.signed_bias_heads or self.gauss_heads):
            return None
        # In eval mode the bias is a constant: build it once per device, as timm's LeViT does.
        if not self.training and _usable(self._bias_cache) and self._bias_cache.device == self.attention_bias_device:
            return self._bias_cache
        bias = self._build_position_bias()
        self._bias_cache = bias.detach() if _cacheable(self.training) else None
        return bias

    @property
    def attention_bias_device(self) -> torch.device:
        """Device of the bias parameters (the eval-mode bias cache is valid only there)."""
        if self.abs_bias_heads:
            return self.attention_biases.device
        return (self.signed_biases if self.signed_bias_heads else self.gauss_alpha).device

    def train(self, mode: bool = True) -> Attention:
        """Switch train/eval mode; drops the eval-mode bias, mask and positional-attention caches."""
        self._drop_caches()
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):  # .to() / .cuda() / .half(): the cached constants are stale
        self._drop_caches()
        out = super()._apply(fn, *args, **kwargs)
        self._masked_sdpa_fused = next(self.parameters()).device.type == "cuda"  # static: set when moved
        return out

    def _load_from_state_dict(self, *args, **kwargs) -> None:  # new weights invalidate the eval-mode caches
        self._drop_caches()
        super()._load_from_state_dict(*args, **kwargs)

    def _build_position_bias(self) -> Tensor:
        p = self.num_prefix_tokens
        if p == 0 and len(self.abs_bias_heads) == self.num_heads and not self.gauss_heads:  # LeViT: every head
            return self.attention_biases[:, self.attention_bias_idxs]                       # biased, no prefix
        tables = self.abs_bias_heads or self.signed_bias_heads
        if p == 0 and len(self.gauss_heads) == self.num_heads and not tables:
            return self.gauss_bias()  # every head Gaussian, no prefix: the bias itself, no scatter
        ref = (self.attention_biases if self.abs_bias_heads
               else self.signed_biases if self.signed_bias_heads else self.gauss_alpha)
        bias = ref.new_zeros(self.num_heads, self.num_tokens, self.num_tokens)
        if self.abs_bias_heads:
            bias[self.abs_bias_heads, p:, p:] = self.attention_biases[:, self.attention_bias_idxs]
        if self.signed_bias_heads:
            bias[self.signed_bias_heads, p:, p:] = self.signed_biases[:, self.signed_bias_idxs]
        if self.gauss_heads:  # added: a head may carry a relative bias and a Gaussian one
            gauss = F.pad(self.gauss_bias(), (p, 0, p, 0))
            bias = bias.index_add(0, torch.tensor(self.gauss_heads, device=bias.device), gauss.to(bias.dtype))
        return bias

    def gauss_bias(self) -> Tensor:
        """Gaussian bias of the Gaussian heads, ``(n_gauss, N_p, N_p)`` on the patch-patch block (GMM-Mask,
        Li & Zhang, arXiv 2309.05375, authors' ``models/gmm.py`` with one Gaussian per head):

            ``b_h[i, j] = gauss_alpha_h * exp(-d_ij^2 / (2 (gauss_sigma_h^2 + 1e-5)))``

        with ``d_ij^2`` the squared distance between patches ``i`` and ``j`` in patch units (``gauss_dist2``), in
        logit units; the heads in head order.  Differentiable in ``gauss_alpha`` and ``gauss_sigma``.

        Raises:
            ValueError: when the layer has no Gaussian head.
        """
        if not self.gauss_heads:
            raise ValueError("this attention layer has no gauss_mask head")
        sigma2 = self.gauss_sigma.pow(2) + gauss_mask.SIGMA_EPS
        return self.gauss_alpha.view(-1, 1, 1) * torch.exp(
            -self.gauss_dist2.to(sigma2.dtype) / (2.0 * sigma2).view(-1, 1, 1))

    def mask_alpha(self) -> Tensor | None:
        """Soft-mask scale ``alpha = sigmoid(mask_alpha_logit)`` per soft head ``(n_soft,)``, or ``None``."""
        return torch.sigmoid(self.mask_alpha_logit) if self.soft_heads else None

    def gating(self) -> Tensor | None:
        """``sigmoid(gating_param)`` per GPSA head ``(n_gpsa,)``: the weight of positional attention, or ``None``."""
        return torch.sigmoid(self.gating_param) if self.gpsa_heads else None

    def _mask_terms(self, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """The layer's mask terms ``(zero, mult, block)`` (:func:`~.mask_terms.mask_terms`); ``zero``, a constant,
        is cached (bool, a quarter of a float multiplier's memory)."""
        if not self.mask_heads:
            return None, None, None
        zero = None
        if self.hard_heads:
            zero = self._zero_cache
            if not _usable(zero) or zero.device != self.attn_masks.device:
                zero = hard_zero(self.num_heads, self._mask_modes, self.attn_masks)
                if _cacheable(False):
                    self._zero_cache = zero
        return mask_terms(self.num_heads, self._mask_modes, self.attn_masks, self.mask_alpha(), dtype, zero)

    def positional_attention(self) -> Tensor:
        """GPSA positional attention ``softmax(pos_proj(r))`` ``(n_gpsa, N, N)`` (ConViT eq. 5).

        Computed on the ``(N, N, 3)`` relative indices once, not per batch element
        (``N * N * 3 * n_gpsa`` MACs).  It does not depend on the input, so in eval mode it is cached
        (dropped by ``train()``, ``load_state_dict`` and :meth:`_build_grid_tables`).

        Raises:
            ValueError: when the layer has no GPSA head.
        """
        if not self.gpsa_heads:
            raise ValueError("this attention layer has no GPSA head")
        cached = self._positional_cache
        if not self.training and _usable(cached) and cached.device == self.pos_proj.weight.device:
            return cached
        pos = self.pos_proj(self.rel_indices.to(self.pos_proj.weight.dtype)).permute(2, 0, 1).softmax(dim=-1)
        self._positional_cache = pos.detach() if _cacheable(self.training) else None
        return pos

    def _additive_mask(self, dtype: torch.dtype) -> Tensor | None:
        """Additive float mask ``(H, N, N)`` for SDPA: relative biases, ``-inf`` on strict non-neighbours; or None.

        Cached in eval mode per dtype and device (it is a constant then)."""
        cached = self._additive_cache
        if not self.training and _usable(cached) and cached.dtype == dtype:  # _apply drops it on a device move
            return cached
        mask = self.position_bias()
        if mask is not None:
            mask = mask.to(dtype)
        # only the strict heads' -inf: the hard and soft terms belong to the explicit paths, not SDPA's mask
        block = strict_block(self.num_heads, self._mask_modes, self.attn_masks) if self.strict_heads else None
        if block is not None:
            mask = torch.zeros(block.shape, dtype=dtype, device=block.device) if mask is None else mask
            mask = mask.masked_fill(block, float("-inf"))
        self._additive_cache = mask.detach() if _cacheable(self.training) and mask is not None else None
        return mask

    def _probs(self, q: Tensor, k: Tensor, heads: list[int] | None = None) -> Tensor:
        """Explicit (dense reference) path: final attention probabilities ``(B, h, N, N)`` before dropout.

        ``q``, ``k`` hold the heads ``heads`` (all heads when None), in that order."""
        heads = list(range(self.num_heads)) if heads is None else heads
        attn = (q @ k.transpose(-2, -1)) * self.scale
        bias = self.position_bias()
        if bias is not None:
            attn = attn + self._heads(bias, heads, dim=0).to(attn.dtype)
        terms = [None if t is None else self._heads(t, heads, dim=0) for t in self._mask_terms(attn.dtype)]
        attn = apply_mask_terms(attn, *terms).softmax(dim=-1)
        local = [pos for pos, h in enumerate(heads) if h in self.gpsa_heads]
        if local:
            rows = [self.gpsa_heads.index(heads[pos]) for pos in local]
            pos_attn = self.positional_attention()[rows].to(attn.dtype)
            gate = self.gating()[rows].to(attn.dtype).view(1, -1, 1, 1)
            content = attn if len(local) == len(heads) else attn[:, local]
            mixed = (1.0 - gate) * content + gate * pos_attn
            mixed = mixed / mixed.sum(dim=-1, keepdim=True)
            if len(local) == len(heads):
                attn = mixed
            else:
                attn = attn.index_copy(1, torch.tensor(local, device=attn.device), mixed)
        return attn

    def _dense_forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Reference path ``(B, H, N, v_dim)``: one explicit softmax over all heads, or one SDPA call."""
        if self.explicit_logits:
            return self.attn_drop(self._probs(q, k)) @ v
        mask = self._additive_mask(q.dtype)
        return F.scaled_dot_product_attention(
            q, k, v,
            attn_mask=None if mask is None else mask.unsqueeze(0),
            dropout_p=self.attn_drop_p if self.training else 0.0,
            scale=self.scale,
        )

    def _group_forward(self, key: tuple, heads: list[int], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Output ``(B, len(heads), N, v_dim)`` of one group of heads on its path (see :meth:`_head_path`)."""
        kind = key[0]
        if kind == "window":
            prefix = f"window{key[1][0]}x{key[1][1]}_"
            tables = {name: getattr(self, prefix + name).to(q.dtype) for name in ("outside", "n0")}
            return hard_window_attention(q, k, v, self.grid, key[1], self.num_prefix_tokens, self.scale, tables)
        if kind == "dense":
            return self.attn_drop(self._probs(q, k, heads)) @ v
        if kind == "hard":
            zero, _, _ = self._mask_terms(q.dtype)
            return hard_masked_attention(q, k, v, self._heads(zero, heads, dim=0), self.scale)
        mask = self._additive_mask(q.dtype)
        if mask is not None:
            mask = self._heads(mask, heads, dim=0)
        if kind == "gpsa":
            rows = [self.gpsa_heads.index(h) for h in heads]
            gpsa_all = len(rows) == len(self.gpsa_heads)
            pos, gate = self.positional_attention(), self.gating()
            return gpsa_attention(q, k, v, pos if gpsa_all else pos[rows], gate if gpsa_all else gate[rows],
                                  self.scale, mask)
        if kind == "flex":
            return self._flex_forward(heads, q, k, v)
        if mask is not None and not self._masked_sdpa_fused:
            # CPU SDPA runs a float attn_mask on its math backend plus a "safe softmax" (where/all per call):
            # the plain formula, as timm's LeViT writes it, is cheaper there.
            return ((q @ k.transpose(-2, -1)) * self.scale + mask).softmax(dim=-1) @ v
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if mask is None else mask.unsqueeze(0),
            dropout_p=self.attn_drop_p if self.training else 0.0, scale=self.scale)

    def _flex_forward(self, heads: list[int], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Hard/soft-masked heads (optionally biased) through :func:`flex_masked_attention`."""
        sel = [self.mask_heads.index(h) for h in heads]
        scale = torch.zeros(len(heads), dtype=q.dtype, device=q.device)
        alpha = self.mask_alpha()
        if alpha is not None:
            soft = [pos for pos, h in enumerate(heads) if h in self.soft_heads]
            rows = [self.soft_heads.index(heads[pos]) for pos in soft]
            scale = scale.index_copy(0, torch.tensor(soft, device=q.device, dtype=torch.long), alpha[rows].to(q.dtype))
        bias = self.position_bias()
        return flex_masked_attention(q, k, v, self.scale, self.attn_masks[sel], scale,
                                     None if bias is None else bias[heads].to(q.dtype))

    def _heads(self, t: Tensor, heads: list[int], dim: int = 1) -> Tensor:
        """The heads ``heads`` of ``t`` along ``dim`` (``(B, H, N, d)``: 1; ``(H, N, N)`` tables: 0; ``H = num_heads``):
        a view (no copy) when they are contiguous, ``t`` itself when they are all heads in order."""
        if heads == list(range(heads[0], heads[-1] + 1)):
            return t if len(heads) == self.num_heads else t.narrow(dim, heads[0], len(heads))
        return t.index_select(dim, torch.tensor(heads, device=t.device))

    def _plan(self) -> tuple[list[tuple[tuple, list[int]]], list[int] | None]:
        """``(groups, head_order)`` of the running mode.  Under ``torch.compile`` this is a trace-time branch:
        the compiled plan is fixed into the graph."""
        return self._compiled_plan if is_compiling() else (self._groups, self._head_order)

    def _group_outputs(self, q: Tensor, k: Tensor, v: Tensor, groups) -> list[Tensor]:
        """One ``(B, len(heads), N, v_dim)`` output per group of :meth:`_plan`."""
        if len(groups) == 1:
            return [self._group_forward(*groups[0], q, k, v)]
        return [self._group_forward(key, heads, self._heads(q, heads), self._heads(k, heads), self._heads(v, heads))
                for key, heads in groups]

    def _uses_dense(self) -> bool:
        """The dense reference runs: ``attn_impl == 'dense'``, or attention dropout active in training (the fast
        paths have no dropout on implicit weights)."""
        return self.attn_impl == "dense" or (self.training and self.attn_drop_p > 0)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``(B, H, N, v_dim)`` on the planned paths (or the dense reference, :meth:`_uses_dense`)."""
        if self._uses_dense():
            return self._dense_forward(q, k, v)
        groups, head_order = self._plan()
        outs = self._group_outputs(q, k, v, groups)
        if len(outs) == 1:
            return outs[0]
        # Concatenate in (B, N, H, d) layout, as SDPA lays out its output: forward's transpose + reshape to
        # (B, N, H * d) is then a view, not one more copy.
        out = torch.cat([o.transpose(1, 2) for o in outs], dim=2)
        return (out if head_order is None else out[:, :, head_order]).transpose(1, 2)

    def _projects_per_group(self) -> bool:
        """Training through several head groups with a plain ``nn.Linear`` output projection (ConViT/DeiT layout):
        project each group's output by its columns of ``proj.weight`` and sum (:meth:`_project_groups`)."""
        return (self.norm == "layernorm" and torch.is_grad_enabled() and not self._uses_dense()
                and len(self._plan()[0]) > 1)

    def _project_groups(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``proj(act(concat_heads(out)))`` as ``sum_g act(out_g) @ W[:, heads_g]^T + b``, ``(B, N, dim)``.

        Why: autograd keeps the projection's input for backward.  Unmasked, that input is SDPA's own output
        (laid out ``(B, N, H, d)``, so the reshape is a view), which SDPA keeps anyway; a concatenation of head
        groups would be one more ``(B, N, H d)`` tensor to keep.  Per group, the SDPA group's input is again
        its output, and the other groups keep what the concatenation would have: the training step keeps no
        more than the unmasked model's."""
        B, N = q.shape[0], q.shape[2]
        groups, _ = self._plan()
        weight = self.proj.weight.view(self.dim, self.num_heads, self.v_dim)
        out = None
        for (_, heads), o in zip(groups, self._group_outputs(q, k, v, groups)):
            w = self._heads(weight, heads, dim=1).reshape(self.dim, len(heads) * self.v_dim)
            part = F.linear(self.proj_act(o.transpose(1, 2).reshape(B, N, -1)), w)
            out = part if out is None else out + part
        return out if self.proj.bias is None else out + self.proj.bias

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

        Heads are grouped by path at construction (:meth:`_plan_paths`): plain / biased / strict heads in one
        SDPA call, GPSA heads as ``(1 - g) SDPA + g P V``, hard-masked heads linear-time where it pays, the rest
        on the explicit-logits reference formula.  ``set_attn_impl('dense')`` selects the reference for all.

        Raises:
            ValueError: if ``x`` is not ``(B, num_prefix_tokens + H*W, dim)``.
        """
        self._check_input(x)
        B, N, _ = x.shape
        q, k, v = self._qkv(x)
        if self._projects_per_group():
            return self.proj_drop(self._project_groups(q, k, v))
        out = self._attend(q, k, v)
        out = out.transpose(1, 2).reshape(B, N, self.num_heads * self.v_dim)
        if self.norm == "layernorm":
            out = self.proj(self.proj_act(out))
        else:
            out = self.proj(out)
        return self.proj_drop(out)

    def extra_repr(self) -> str:
        letters = "".join(f"[{h.letter}]" for h in self.head_specs)
        return (f"dim={self.dim}, heads={letters}, grid={self.grid}, prefix={self.num_prefix_tokens}, "
                f"qk_dim={self.qk_dim}, v_dim={self.v_dim}, norm={self.norm}, attn_impl={self.attn_impl}")

    @torch.no_grad()
    def set_grid(self, grid: tuple[int, int]) -> None:
        """Move the layer to another patch grid ``(H', W')`` (a new input resolution), keeping its weights.

        Rebuilt for the new grid by :meth:`_build_grid_tables`: the relative-offset index tables, GPSA's fixed
        ``r_ij`` (:func:`~archspec.families.attention.tables.gpsa_rel_indices`), the MaiT masks (same window,
        new grid), the
        linear-time window tables, the eval caches and the per-head path plan (the crossover depends on the grid).
        The learned bias tables are resampled bicubically on their offset grids
        (:func:`~archspec.families.attention.tables.resample_bias_table`, as timm ``resize_rel_pos_bias_table_levit``):
        LeViT's ``attention_biases`` ``(h, H*W) -> (h, H'*W')``, CMHSA's ``signed_biases``
        ``(h, (2H-1)(2W-1)) -> (h, (2H'-1)(2W'-1))``.  Afterwards the layer expects ``(B, prefix + H'*W', C)``.

        Raises:
            ValueError: for a grid side < 1.
        """
        rows, cols = check_grid(grid)
        old = self.grid
        if self.abs_bias_heads:
            table = resample_bias_table(self.attention_biases.data, old, (rows, cols))
            self.attention_biases = nn.Parameter(table, requires_grad=self.attention_biases.requires_grad)
        if self.signed_bias_heads:
            table = resample_bias_table(self.signed_biases.data, (2 * old[0] - 1, 2 * old[1] - 1),
                                        (2 * rows - 1, 2 * cols - 1))
            self.signed_biases = nn.Parameter(table, requires_grad=self.signed_biases.requires_grad)
        # index tables, GPSA's r_ij, masks, linear-time window tables, caches and the per-head path plan
        self._build_grid_tables((rows, cols))


class ZeroPadTokens(nn.Module):
    """An attention layer over the token grid padded with ``pad`` rings of zero tokens (CMHSA App. A.2).

    ``(B, H W, C)`` -> zero-pad the grid to ``(H + 2 pad) x (W + 2 pad)`` -> ``attn`` (built for the padded
    grid, no prefix tokens) -> keep the ``H W`` inner outputs -> ``(B, H W, C)``.  The padding tokens are
    keys and values like any token: with App. A.2's ``W_V = I`` and zero value bias their values are 0, so a
    border query whose conv neighbour lies outside the image reads zeros, as the convolution's zero padding
    does.  MACs: those of ``attn`` on ``(H + 2 pad)(W + 2 pad)`` tokens.  The inner module is named ``attn``.

    Args:
        attn: attention ``(B, N', C) -> (B, N', C)`` on the padded grid, ``N' = (H + 2 pad)(W + 2 pad)``.
        grid: ``(H, W)`` unpadded token grid.
        pad: rings of padding tokens (``ceil((K - 1) / (2 P))`` for a K x K conv on P x P patches).

    Raises:
        ValueError: for ``pad < 1`` or (in ``forward``) an input that is not ``(B, H W, C)``.
    """

    def __init__(self, attn: nn.Module, grid: tuple[int, int], pad: int) -> None:
        super().__init__()
        if pad < 1:
            raise ValueError(f"pad must be >= 1, got {pad}")
        self.attn = attn
        self.grid = (int(grid[0]), int(grid[1]))
        self.pad = pad

    def forward(self, x: Tensor) -> Tensor:
        """``(B, H W, C) -> (B, H W, C)``."""
        rows, cols = self.grid
        if x.dim() != 3 or x.shape[1] != rows * cols:
            raise ValueError(f"ZeroPadTokens expects (B, {rows * cols}, C), got {tuple(x.shape)}")
        B, N, C = x.shape
        p = self.pad
        padded = F.pad(x.reshape(B, rows, cols, C), (0, 0, p, p, p, p))
        out = self.attn(padded.reshape(B, (rows + 2 * p) * (cols + 2 * p), C))
        out = out.reshape(B, rows + 2 * p, cols + 2 * p, C)[:, p:p + rows, p:p + cols]
        return out.reshape(B, N, C)

    def set_grid(self, grid: tuple[int, int]) -> None:
        """Move to another token grid ``(H', W')`` (a new input size): the inner attention moves to the padded
        ``(H' + 2 pad, W' + 2 pad)`` (``Attention.set_grid``, which resamples its bias tables)."""
        self.grid = (int(grid[0]), int(grid[1]))
        self.attn.set_grid((self.grid[0] + 2 * self.pad, self.grid[1] + 2 * self.pad))

    def extra_repr(self) -> str:
        return f"grid={self.grid}, pad={self.pad}"


def build(shape: AttentionShape) -> nn.Module:
    """The module of an :class:`~.rules.AttentionShape`: an :class:`Attention` on the (padded) grid, wrapped in
    :class:`ZeroPadTokens` when the shape has ``pad_tokens`` (CMHSA App. A.2).  LeViT's batchnorm family gets
    the shape's activation before the projection; the layernorm family has none (timm ViT).

    Raises:
        ValueError: as :class:`Attention` (the IR's checks catch these first).
    """
    batchnorm = shape.norm == "batchnorm"
    attn = Attention(shape.dim, shape.heads, shape.attention_grid, num_prefix_tokens=shape.n_prefix,
                     qk_dim=shape.dims.qk_dim, v_dim=shape.dims.v_dim, qkv_bias=shape.qkv_bias and not batchnorm,
                     norm=shape.norm, proj_act=activation(shape.act) if batchnorm else None)
    return ZeroPadTokens(attn, shape.grid, shape.pad_tokens) if shape.pad_tokens else attn


def set_attention_impl(model: nn.Module, impl: str) -> nn.Module:
    """Set ``attn_impl`` (one of :data:`ATTN_IMPLS`) on every :class:`Attention` in ``model``; returns ``model``.

    Raises:
        ValueError: an unknown name.
    """
    if impl not in ATTN_IMPLS:
        raise ValueError(f"attn_impl must be one of {ATTN_IMPLS}, got {impl!r}")
    for module in model.modules():
        if isinstance(module, Attention):
            module.set_attn_impl(impl)
    return model


@contextmanager
def attention_impl(model: nn.Module, impl: str) -> Iterator[nn.Module]:
    """Context manager: run ``model``'s attention layers with ``impl`` (e.g. ``'dense'``), then restore each.

    Raises:
        ValueError: an unknown name.
    """
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    before = [m.attn_impl for m in layers]
    set_attention_impl(model, impl)
    try:
        yield model
    finally:
        for layer, old in zip(layers, before):
            layer.set_attn_impl(old)
