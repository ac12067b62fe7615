"""Per-head composable self-attention: MHSA plus any registered head kinds, per head, in one layer.

Each head of an :class:`Attention` layer is described by a
:class:`~archspec.families.attention.heads.HeadSpec` and computes

1. content logits ``S_h = Q_h K_h^T * qk_dim ** -0.5``;
2. ``+ B_h``, the additive bias of its kinds (LeViT's and CMHSA's relative-position tables, GMM-Mask's Gaussian);
3. its kinds' other logit terms: pairs set to 0 (MaiT's hard mask, eq. 2), scaled (MaiT's soft mask, eq. 4) or
   set to ``-inf`` (a strict mask);
4. ``softmax`` over keys;
5. its kinds' change of the probabilities (ConViT's GPSA, eq. 5-7:
   ``A_h = normalize[(1 - sigmoid(lambda_h)) A_h + sigmoid(lambda_h) softmax(v_pos_h . r)]``);

then ``out = proj(proj_act(concat_h(A_h V_h)))``.

Each head kind is one module of :mod:`archspec.families.attention.kinds` holding both its rules and its torch half
(:class:`~archspec.families.attention.kinds.KindTerms`: its parameters and buffers, the terms above, its fast
path); the layer builds one torch half per kind it hosts, in registry order, and composes them by looping over
them -- nothing here names a kind.  A kind may add public methods to the layer (``mask_alpha()``,
``positional_attention()``, ``gauss_bias()``): the classes its ``HeadKind.layer_methods`` names are bases of
:class:`Attention`.

That formula is the *dense reference* (``attn_impl='dense'``, :meth:`Attention._probs`).  By default
(``attn_impl='auto'``) each layer groups its heads at construction and runs each group on an exact faster path
(:func:`~archspec.families.attention.rules.head_path`): heads whose terms SDPA takes in one SDPA call, and each
kind's own paths (GPSA as ``(1 - g) SDPA + g P V``, MaiT's hard masks in linear time on grids past the measured
crossover: :mod:`archspec.families.attention.kernels`).  With attention dropout active in training every head
takes the dense reference (the fast paths have no dropout on the implicit non-neighbour weights).

This module holds the layer's construction, q/k/v projection and ``forward``, :func:`build` and the
:func:`set_attention_impl` / :func:`attention_impl` switches.  ``Attention`` inherits its logit terms, grid
tables and caches from :class:`~archspec.families.attention.position_terms.PositionTermsMixin` and its head
grouping and forward paths from :class:`~archspec.families.attention.head_paths.HeadPathsMixin`;
:class:`~archspec.families.attention.zero_pad.ZeroPadTokens` (CMHSA App. A.2) lives in ``zero_pad.py`` and is
re-exported here.
"""

from __future__ import annotations

import math
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
from .head_paths import HeadPathsMixin
from .heads import KINDS, HeadSpec, coerce_heads
from .kinds import SDPA_TERMS, head_kind
from .position_terms import PositionTermsMixin, cache_usable, may_cache
from .rules import AttentionShape, head_terms
from .tables import check_grid
from .zero_pad import ZeroPadTokens

__all__ = ["Attention", "ZeroPadTokens", "build", "coerce_heads", "ATTN_IMPLS", "set_attention_impl",
           "attention_impl"]

#: Attention implementations: ``dense`` the explicit-logits reference formula (every head in one ``(B, H, N, N)``
#: softmax, or one SDPA call when no head needs explicit logits); ``auto`` each group of heads on its fastest
#: exact path (a kind's fast path where its rule says it pays); ``fast`` the kinds' fast paths on every grid
#: (tests, benchmarks); ``flex`` the kinds' FlexAttention paths.
ATTN_IMPLS = ("auto", "dense", "fast", "flex")
#: the linears' initialisations (:meth:`Attention.init_linear`)
INITS = ("trunc_normal", "xavier")

#: the kinds an Attention layer runs, in registry order
_HOSTED = tuple(kind for kind in KINDS if "attention" in kind.hosts and kind.layer_terms is not None)


def _layer_methods() -> tuple[type, ...]:
    """The public-method mixins of the hosted kinds, checked for names two of them (or the layer) define.

    Raises:
        TypeError: a name clash (a kind's method would hide another's).
    """
    mixins = tuple(kind.layer_methods for kind in _HOSTED if kind.layer_methods is not None)
    seen: dict[str, type] = {}
    for mixin in mixins:
        for name in vars(mixin):
            if name.startswith("__"):
                continue
            if name in seen or hasattr(nn.Module, name) or hasattr(PositionTermsMixin, name) \
                    or hasattr(HeadPathsMixin, name):
                raise TypeError(f"{mixin.__qualname__}.{name} clashes with another head kind's or the layer's")
            seen[name] = mixin
    return mixins


class Attention(*_layer_methods(), PositionTermsMixin, HeadPathsMixin, nn.Module):
    """Multi-head self-attention whose heads each compose MHSA with any of the registered head kinds.

    Shapes: input ``x`` is ``(B, N, C)`` with ``C = dim`` and ``N = num_prefix_tokens + H_grid * W_grid``
    (prefix = class / distillation tokens first, then patches in row-major order); output ``(B, N, C)``.

    MHSA mirrors timm ``vision_transformer.Attention`` (layernorm family; ``qkv`` split into ``qk`` and ``v``, as
    timm ``convit.GPSA``); with ``norm='batchnorm'`` the projections are timm ``LinearNorm`` as in
    ``levit.Attention`` (``qkv`` with per-head layout ``(H, [q, k, v])``, ``proj = Sequential(act, ln)``).  Each head
    kind adds its own parameters and buffers under the names its source uses (LeViT's ``attention_biases``, ConViT's
    ``pos_proj`` and ``gating_param``, MaiT's ``mask_alpha_logit``, ...), only for the heads that use it, so
    parameter counts are honest; its module in :mod:`archspec.families.attention.kinds` states them with their
    sources.  The kind's torch halves are ``_terms`` (every hosted kind, registry order), ``_active_terms`` (those
    some head has).

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
        out_dim: width of the output projection (layernorm family), default ``dim``: CoAtNet's downsampling block
            attends at its input width and projects to the stage's (timm ``Attention2d(dim, dim_out)``).
        init: the linears' initialisation (:meth:`init_linear`): ``'trunc_normal'`` timm ViT's, ``'xavier'`` timm
            ``MaxxVit``'s (``weight_init='vit_eff'``).

    Raises:
        ValueError: empty ``heads``; ``dim`` not divisible by the head count when ``qk_dim``/``v_dim`` are
            defaulted; unknown ``norm``; a head kind this layer does not run (BoTNet's relative logits); what a
            kind's torch half refuses (a GPSA head with ``num_prefix_tokens > 0``, ...).
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
        out_dim: int | None = None,
        init: Literal["trunc_normal", "xavier"] = "trunc_normal",
    ) -> None:
        super().__init__()
        specs = coerce_heads(heads)
        if init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {init!r}")
        self.init = init
        self.out_dim = int(out_dim if out_dim is not None else dim)
        self._set_dims(dim, specs, grid, num_prefix_tokens, qk_dim, v_dim, norm)
        self._check_kinds(specs)
        self._build_projections(qkv_bias, proj_act, attn_drop, proj_drop)
        self._attach_kinds(specs)
        self.attn_impl = "auto"
        # Whether SDPA has a fused kernel for a float attn_mask (CUDA: memory-efficient attention); on CPU the
        # biased / strict heads use the explicit formula instead.  Updated by _apply (.to(), .cuda()).
        self._masked_sdpa_fused = False
        self.parameter_device = next(self.parameters()).device  # where cached terms belong; updated by _apply
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

    def _check_kinds(self, specs: tuple[HeadSpec, ...]) -> None:
        """Refuse a head with a kind this layer does not run (one hosted elsewhere: BoTNet's relative logits run in
        timm's ``BottleneckAttn``)."""
        hosted = {kind.field for kind in _HOSTED}
        for i, head in enumerate(specs):
            other = sorted(head.kinds - hosted)
            if other:
                hosts = sorted(set().union(*(head_kind(name).hosts for name in other)))
                raise ValueError(f"head {i} ({head.letter}) has head kind {', '.join(other)}, which Attention does "
                                 f"not run (it runs in: {', '.join(hosts)})")
        # SDPA takes a bias and -inf pairs; any other term needs the explicit logits in the dense reference
        self.explicit_logits = any(not head_terms(head) <= SDPA_TERMS for head in specs)

    def _build_projections(self, qkv_bias: bool, proj_act: type[nn.Module] | None, attn_drop: float,
                           proj_drop: float) -> None:
        """q/k/v and output projections in timm's layout (ConViT ``qk`` + ``v``, or LeViT ``qkv`` LinearNorm)."""
        dim, H, dqk, dv = self.dim, self.num_heads, self.qk_dim, self.v_dim
        if self.norm == "layernorm":
            # layout (2, H, qk_dim) as timm convit.GPSA.qk; v (H, v_dim)
            self.qk = nn.Linear(dim, 2 * H * dqk, bias=qkv_bias)
            self.v = nn.Linear(dim, H * dv, bias=qkv_bias)
            self.proj_act = proj_act() if proj_act is not None else nn.Identity()
            self.proj = nn.Linear(H * dv, self.out_dim)
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

    def _attach_kinds(self, specs: tuple[HeadSpec, ...]) -> None:
        """One torch half per hosted kind, in registry order (``HeadKind.layer_terms(self, heads)``, with ``heads``
        the indices of its heads): each registers its parameters, buffers and published head lists on the layer.
        ``_path_terms`` maps each path a kind owns to its torch half."""
        heads = [[i for i, h in enumerate(specs) if getattr(h, kind.field) is not None] for kind in _HOSTED]
        self._terms = tuple(kind.layer_terms(self, of_kind) for kind, of_kind in zip(_HOSTED, heads))
        self._active_terms = tuple(terms for terms in self._terms if terms.heads)
        self._bias_terms = tuple(terms for kind, terms in zip(_HOSTED, self._terms)
                                 if any("bias" in kind.terms(getattr(specs[i], kind.field)) for i in terms.heads))
        self._path_terms = {name: terms for kind, terms in zip(_HOSTED, self._terms) for name in kind.paths}

    def value_rows(self, head: int) -> tuple[Tensor, slice]:
        """(weight matrix, row slice) holding head ``head``'s value projection (what ConViT's convolutional init
        sets to the identity)."""
        if self.norm == "layernorm":
            return self.v.weight, slice(head * self.v_dim, (head + 1) * self.v_dim)
        per = 2 * self.qk_dim + self.v_dim
        start = head * per + 2 * self.qk_dim
        return self.qkv.linear.weight, slice(start, start + self.v_dim)

    # ------------------------------------------------------------------ init
    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise all parameters (deterministic given torch's RNG state).

        layernorm family: every Linear by :meth:`init_linear` (``qk`` and ``v`` as the one ``qkv`` of timm's layouts:
        ``xavier`` draws them with the fused matrix's fans).  batchnorm family: timm ``LinearNorm`` defaults
        (PyTorch Linear init, BN weight 1, ``proj`` BN weight 0), as timm LeViT.  Then each kind's own init, in
        registry order (``KindTerms.reset_parameters``: bias tables at 0, soft-mask logits at ``logit(alpha_init)``,
        the Gaussian heads' ``alpha_init`` / ``sigma_init``, GPSA's ``pos_proj``, gating and ConViT's convolutional
        init, which also sets the conv-initialised heads' value rows).
        """
        if self.norm == "layernorm":
            fan_out = self.qk.out_features + self.v.out_features
            self.init_linear(self.qk, fans=(self.dim, fan_out))
            self.init_linear(self.v, fans=(self.dim, fan_out))
            self.init_linear(self.proj)
        for terms in self._active_terms:
            terms.reset_parameters(self)

    @torch.no_grad()
    def init_linear(self, linear: nn.Linear, fans: tuple[int, int] | None = None, mlp: bool = False) -> None:
        """One Linear of the layer (its kinds' too) by the layer's ``init``.  ``'trunc_normal'``: timm ViT's
        ``init_weights_vit_timm``, ``trunc_normal_(std=.02)``, zero bias.  ``'xavier'``: timm ``MaxxVit``'s
        ``_init_transformer`` (``weight_init='vit_eff'``), ``xavier_uniform_`` with ``fans`` ``(fan_in, fan_out)``
        (default the Linear's own: a part of a fused matrix passes the whole's), zero bias, or ``normal(1e-6)`` for a
        linear of an MLP (``mlp``: timm's ``'mlp' in name`` rule, which also covers ``RelPosMlp``)."""
        if self.init == "trunc_normal":
            trunc_normal_(linear.weight, std=0.02)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
            return
        fan_in, fan_out = fans if fans is not None else (linear.in_features, linear.out_features)
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        nn.init.uniform_(linear.weight, -bound, bound)
        if linear.bias is not None:
            nn.init.normal_(linear.bias, std=1e-6) if mlp else nn.init.zeros_(linear.bias)

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
        """Switch train/eval mode; drops the eval-mode caches (position bias, additive mask, the kinds' terms)."""
        self._drop_caches()
        return super().train(mode)

    def _apply(self, fn, *args, **kwargs):  # .to() / .cuda() / .half(): the cached constants are stale
        self._drop_caches()
        out = super()._apply(fn, *args, **kwargs)
        self.parameter_device = next(self.parameters()).device
        self._masked_sdpa_fused = self.parameter_device.type == "cuda"  # static: set when moved
        return out

    def _load_from_state_dict(self, *args, **kwargs) -> None:  # new weights invalidate the eval-mode caches
        self._drop_caches()
        super()._load_from_state_dict(*args, **kwargs)

    # ------------------------------------------------------------------ API
    def get_attention(self, x: Tensor) -> Tensor:
        """Final attention probabilities ``(B, H, N, N)`` (after every kind's terms, without dropout).

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

        Heads are grouped by path at construction (:meth:`_plan_paths`): heads whose terms SDPA takes in one SDPA
        call, the heads a kind claims on its own path, the rest on the explicit-logits reference formula.
        ``set_attn_impl('dense')`` selects the reference for all.

        Raises:
            ValueError: if ``x`` is not ``(B, num_prefix_tokens + H*W, dim)``.
        """
        self._check_input(x)
        B, N, _ = x.shape
        roll = None if self.uses_dense_reference() else self.token_roll
        if roll is not None:  # a kind's cyclic roll of the grid, around the per-token projections (Swin's shift)
            x = self._roll_tokens(x, (-roll[0], -roll[1]))
        q, k, v = self._qkv(x)
        if self._projects_per_group():
            return self.proj_drop(self._project_groups(q, k, v))
        out = self._attend(q, k, v)
        out = out.transpose(1, 2).reshape(B, N, self.num_heads * self.v_dim)
        if self.norm == "layernorm":
            out = self.proj(self.proj_act(out))
        else:
            out = self.proj(out)
        out = self.proj_drop(out)
        return out if roll is None else self._roll_tokens(out, roll)

    def _roll_tokens(self, x: Tensor, shifts: tuple[int, int]) -> Tensor:
        """``(B, N, C)`` rolled on the token grid by ``shifts`` ``(rows, cols)`` (no prefix tokens)."""
        B, N, C = x.shape
        return torch.roll(x.view(B, *self.grid, C), shifts, (1, 2)).view(B, N, C)

    def extra_repr(self) -> str:
        letters = "".join(f"[{h.letter}]" for h in self.head_specs)
        out = f", out_dim={self.out_dim}" if self.out_dim != self.dim else ""
        return (f"dim={self.dim}{out}, heads={letters}, grid={self.grid}, prefix={self.num_prefix_tokens}, "
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
                     norm=shape.norm, proj_act=activation(shape.act) if batchnorm else None,
                     out_dim=shape.out_dim, init=shape.init)
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
