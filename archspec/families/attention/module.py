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

This module holds the layer's construction, q/k/v projection and ``forward``, :func:`build` and the
:func:`set_attention_impl` / :func:`attention_impl` switches.  ``Attention`` inherits its position terms, grid
tables and caches from :class:`~archspec.families.attention.position_terms.PositionTermsMixin` and its head
grouping and forward paths from :class:`~archspec.families.attention.head_paths.HeadPathsMixin`;
:class:`~archspec.families.attention.zero_pad.ZeroPadTokens` (CMHSA App. A.2) lives in ``zero_pad.py`` and is
re-exported here.
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
from .head_paths import HeadPathsMixin
from .heads import HeadSpec, coerce_heads
from .mask import alpha_to_logit
from .position_terms import PositionTermsMixin, cache_usable, may_cache
from .rules import AttentionShape
from .tables import check_grid
from .zero_pad import ZeroPadTokens

__all__ = ["Attention", "ZeroPadTokens", "build", "coerce_heads", "ATTN_IMPLS", "set_attention_impl",
           "attention_impl"]

#: Attention implementations: ``dense`` the explicit-logits reference formula (every head in one ``(B, H, N, N)``
#: softmax, or one SDPA call when no head needs explicit logits); ``auto`` each group of heads on its fastest
#: exact path, hard masks linear-time where :func:`window_path_pays`; ``fast`` the same with the linear-time
#: hard-mask path on every grid (tests, benchmarks); ``flex`` hard/soft/biased-masked heads through FlexAttention.
ATTN_IMPLS = ("auto", "dense", "fast", "flex")


class Attention(PositionTermsMixin, HeadPathsMixin, nn.Module):
    """Multi-head self-attention whose heads each compose MHSA, GPSA, a relative bias and a MaiT mask.

    Shapes: input ``x`` is ``(B, N, C)`` with ``C = dim`` and ``N = num_prefix_tokens + H_grid * W_grid``
    (prefix = class / distillation tokens first, then patches in row-major order); output ``(B, N, C)``.

    Sources, per mechanism:

    * MHSA: timm ``vision_transformer.Attention`` (layernorm family; ``qkv`` split into ``qk`` and ``v``).
    * GPSA: ConViT eq. 5-7, timm ``convit.GPSA`` (names ``qk``, ``v``, ``proj``, ``pos_proj``, ``gating_param``).
      The positional scores ``softmax(pos_proj(r))`` are computed once per forward on the ``(N, N, 3)``
      relative indices, *not* expanded over the batch: ``N * N * 3 * n_gpsa`` MACs independent of ``B``.  The
      non-persistent buffer ``gpsa_head_idx`` ``(n_gpsa,)`` holds the GPSA heads' indices (where the dense
      reference writes the gated heads back).
    * LeViT attention bias on absolute offsets: LeViT eq. 1, timm ``levit.Attention``
      (names ``attention_biases`` ``(n_bias_heads, H*W)`` and non-persistent buffer ``attention_bias_idxs``).
      With ``norm='batchnorm'`` the projections are timm ``LinearNorm`` as in ``levit.Attention``
      (``qkv`` with per-head layout ``(H, [q, k, v])``, ``proj = Sequential(act, ln)``).
    * Signed relative bias: CMHSA eq. 4 (``signed_biases`` ``(n_signed_heads, (2H-1)(2W-1))``).
    * Gaussian bias (GMM-Mask, Li & Zhang, arXiv 2309.05375; authors' ``models/gmm.py`` with one Gaussian per head):
      ``gauss_alpha`` and ``gauss_sigma`` ``(n_gauss,)``, the bias ``alpha exp(-d^2 / (2 (sigma^2 + 1e-5)))`` on the
      patch-patch logits from the non-persistent squared-distance buffer ``gauss_dist2`` ``(H*W, H*W)`` (patch
      units); added to the logits (our choice: the authors' code multiplies them), prefix tokens unbiased.  When
      every head is Gaussian (and none has a relative bias) the layer's bias is that of the Gaussian heads,
      zero-padded for the prefix; otherwise it is added at the heads of the non-persistent index buffer
      ``gauss_head_idx`` ``(n_gauss,)``.
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
        self.gauss_scattered = gauss_mask.scattered(specs)
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
        if self.gauss_scattered:  # where the Gaussian biases are added into the layer's (H, N, N) bias
            self.register_buffer("gauss_head_idx", torch.tensor(self.gauss_heads, dtype=torch.long), persistent=False)

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

    # ------------------------------------------------------------------ implementation
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
        if cache_usable(cached[0] if cached else None):
            return cached
        weight = torch.cat([self.qk.weight, self.v.weight]).detach()
        bias = None if self.qk.bias is None else torch.cat([self.qk.bias, self.v.bias]).detach()
        if may_cache(False):
            self._qkv_cache = (weight, bias)
        return weight, bias

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
