"""The logit terms of :class:`~archspec.families.attention.module.Attention`, composed from its head kinds, their grid
tables and eval-mode caches: a mixin, :class:`PositionTermsMixin`, that ``Attention`` inherits.

Each head kind contributes through its torch half (:class:`~archspec.families.attention.kinds.KindTerms`, one per
kind in the layer, in registry order); this module only composes, with no branch on a kind (shapes with ``H``
heads, ``N = num_prefix_tokens + H_grid * W_grid`` tokens):

* the additive ``position_bias`` ``(H, N, N)``: every kind's bias parts added on the patch-patch block (LeViT's
  and CMHSA's tables, GMM-Mask's Gaussian), zero for prefix tokens;
* the explicit-logit terms ``(zero, scale, block)`` (:meth:`~PositionTermsMixin.logit_terms`, applied by
  :func:`apply_logit_terms`: MaiT's hard, soft and strict masks) and SDPA's additive float mask (bias and ``-inf``);
* the grid-dependent buffers, rebuilt by ``set_grid`` for a new resolution (learned tables resampled by their kind);
* the eval-mode caches of these constants, and the rule for when a cached constant may be kept
  (:func:`cache_usable`, :func:`may_cache`, :meth:`~PositionTermsMixin.cached_term`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from .kernels import is_compiling
from .tables import check_grid

__all__ = ["PositionTermsMixin", "cache_usable", "may_cache", "apply_logit_terms"]


def cache_usable(cached: Tensor | None) -> bool:
    """A cached constant can be reused: it exists, and it was not made under ``inference_mode`` unless we are in it
    (autograd refuses to save inference tensors for backward).  Never under ``torch.compile``: the compiled graph
    recomputes (and constant-folds) the tables itself, and Dynamo cannot trace ``is_inference``."""
    if is_compiling():
        return False
    return cached is not None and (not cached.is_inference() or torch.is_inference_mode_enabled())


def may_cache(training: bool) -> bool:
    """Whether a constant computed now may be stored: eval mode, outside ``torch.compile`` tracing (a traced
    tensor stored on the module would leak out of the graph)."""
    return not training and not is_compiling()


def apply_logit_terms(logits: Tensor, zero: Tensor | None, scale: Tensor | None, block: Tensor | None) -> Tensor:
    """The explicit-logit terms on logits ``(B, H, N, N)`` (each term ``(H, N, N)``, broadcast over the batch), in
    this order: ``zero`` pairs to 0 (MaiT's hard mask, eq. 2), times ``scale`` (MaiT's soft mask, eq. 4), ``block``
    pairs to ``-inf``; returns the new logits.  Also CaiT's talking heads' mask rule."""
    if zero is not None:
        logits = logits.masked_fill(zero, 0.0)
    if scale is not None:
        logits = logits * scale
    if block is not None:
        logits = logits.masked_fill(block, float("-inf"))
    return logits


def _union(pairs: list[Tensor]) -> Tensor | None:
    """Logical or of bool ``(H, N, N)`` terms (the one term itself when one kind contributes)."""
    out = None
    for term in pairs:
        out = term if out is None else out | term
    return out


def _product(scales: list[Tensor]) -> Tensor | None:
    out = None
    for scale in scales:
        out = scale if out is None else out * scale
    return out


class PositionTermsMixin:
    """Logit terms, grid tables and eval-mode caches of :class:`~archspec.families.attention.module.Attention` (which
    sets the dims, the projections and its kinds' torch halves that these methods read: ``_active_terms``, those of
    the kinds some head has, and ``_bias_terms``, those among them with a bias).
    """

    # ------------------------------------------------------------------ grid tables
    def _build_grid_tables(self, grid: tuple[int, int]) -> None:
        """(Re)build everything that depends on the patch grid, except the learned tables.

        Sets ``grid``, ``num_patches``, ``num_tokens``; has each kind register its non-persistent buffers for the grid
        on the module's device (``KindTerms.build_grid_tables``); drops the eval-mode caches and re-plans which path
        each head takes (a kind's path may depend on the grid).  A resolution change (``set_grid``) calls this after
        the kinds resampled their learned tables.

        Raises:
            ValueError: a grid side < 1.
        """
        rows, cols = check_grid(grid)
        self.grid = (rows, cols)
        self.num_patches = rows * cols
        self.num_tokens = self.num_prefix_tokens + rows * cols
        device = next(self.parameters()).device
        for terms in self._active_terms:
            terms.build_grid_tables(self, device)
        self._drop_caches()
        self._plan_paths()

    def _drop_caches(self) -> None:
        self._forward_memo: dict | None = None  # set only while one forward runs several head groups
        self._term_cache: dict[str, Tensor | None] = {}
        self._qkv_cache: tuple[Tensor, Tensor | None] | None = None
        self._additive_cache: Tensor | None = None

    # ------------------------------------------------------------------ caching a term
    def cached_term(self, key: str, build: Callable[[], Tensor], device: torch.device, *,
                    constant: bool = False) -> Tensor:
        """A logit term the layer builds at most once per forward, by ``build()`` (``key`` names it: a kind's own
        prefixed with its field, ``"gpsa.positional"``).

        ``constant=False``, a term of the parameters (the position bias, GPSA's positional attention): in eval mode it
        is a constant, cached per device (dropped by ``train()``, ``load_state_dict``, a device move and a grid
        change); in training a forward that runs several head groups shares one build, autograd graph included,
        between them (:meth:`_open_forward_memo`; the eval cache comes first, so that an eval forward with grad
        enabled differentiates only the first build).  ``constant=True``, a term of buffers only (MaiT's hard-mask
        term): cached in training too.  Never cached while ``torch.compile`` traces.  Raises what ``build`` raises.
        """
        cached = self._term_cache.get(key)
        if constant:
            if cache_usable(cached) and cached.device == device:
                return cached
            value = build()
            if may_cache(False):
                self._term_cache[key] = value
            return value
        if not self.training and cache_usable(cached) and cached.device == device:
            return cached
        memo = self._forward_memo
        if memo is not None and key in memo:
            return memo[key]
        value = build()
        self._term_cache[key] = value.detach() if may_cache(self.training) else None
        if memo is not None:
            memo[key] = value
        return value

    def _open_forward_memo(self) -> bool:
        """Open the memo that lets the head groups of one forward share one :meth:`position_bias`, one
        :meth:`additive_mask` per dtype and each kind's :meth:`cached_term` (in training each is otherwise rebuilt
        per call, autograd graph included); the caller closes it (``_forward_memo = None``) when the forward's
        groups are done.  Returns whether it was opened: never under ``torch.compile`` (tracing must not store
        tensors on the module; the compiled graph de-duplicates the builds itself).  Raises nothing."""
        if is_compiling():
            return False
        self._forward_memo = {}
        return True

    # ------------------------------------------------------------------ the terms
    def position_bias(self) -> Tensor | None:
        """Additive position bias of every head, ``(H, N, N)``: the bias parts of the layer's kinds (relative-bias
        tables, Gaussian biases) added on the patch-patch block, zero outside it and for heads without one; or
        ``None`` when no head has one.  Built at most once per forward, cached in eval mode (:meth:`cached_term`)."""
        if not self._bias_terms:
            return None
        return self.cached_term("bias", lambda: self._build_position_bias(), self.parameter_device)

    def _build_position_bias(self) -> Tensor:
        """Every kind's ``(heads, b)`` bias parts in one ``(H, N, N)`` tensor: one part over every head in order is the
        bias itself (a patch-block part zero-padded for the prefix); otherwise the parts are added into zeros, at a
        list of heads by indexing, at a tensor of heads (a registered buffer: no index made per forward) by
        ``index_add``."""
        parts = [part for terms in self._bias_terms for part in terms.bias(self)]
        p, n = self.num_prefix_tokens, self.num_tokens
        heads, first = parts[0]
        if len(parts) == 1 and isinstance(heads, list) and heads == list(range(self.num_heads)):
            return first if first.shape[-1] == n else F.pad(first, (p, 0, p, 0))
        bias = first.new_zeros(self.num_heads, n, n)
        for heads, part in parts:
            if isinstance(heads, list):  # a part over every token, or over the patch block
                bias[(heads,) if part.shape[-1] == n else (heads, slice(p, None), slice(p, None))] += part
            else:
                part = part if part.shape[-1] == n else F.pad(part, (p, 0, p, 0))
                bias = bias.index_add(0, heads, part.to(bias.dtype))
        return bias

    def logit_terms(self, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        """The layer's explicit-logit terms ``(zero, scale, block)``, each ``(H, N, N)`` or None when no kind has it:
        the kinds' ``zero_pairs`` or-ed, ``logit_scale`` (in ``dtype``) multiplied, ``blocked_pairs`` or-ed
        (:func:`apply_logit_terms` applies them)."""
        return (_union(self._contributions("zero_pairs")), _product(self._contributions("logit_scale", dtype)),
                _union(self._contributions("blocked_pairs")))

    def _contributions(self, hook: str, *args) -> list[Tensor]:
        """What each of the layer's kinds returns from its ``KindTerms`` hook ``hook``, the Nones left out."""
        out = []
        for terms in self._active_terms:
            value = getattr(terms, hook)(self, *args)
            if value is not None:
                out.append(value)
        return out

    def additive_mask(self, dtype: torch.dtype) -> Tensor | None:
        """Additive float mask ``(H, N, N)`` for SDPA: the position bias, ``-inf`` on every kind's blocked pairs; or
        None.

        Cached in eval mode per dtype and device (it is a constant then); shared by the head groups of one forward
        in training (:meth:`_open_forward_memo`)."""
        cached = self._additive_cache
        if not self.training and cache_usable(cached) and cached.dtype == dtype:  # _apply drops it on a device move
            return cached
        memo = self._forward_memo  # after the eval cache, as in cached_term
        if memo is not None and ("additive", dtype) in memo:
            return memo["additive", dtype]
        additive = self.position_bias()
        if additive is not None:
            additive = additive.to(dtype)
        # only the -inf pairs: the zero and scale terms belong to the explicit paths, not SDPA's mask
        block = _union(self._contributions("blocked_pairs"))
        if block is not None:
            additive = torch.zeros(block.shape, dtype=dtype, device=block.device) if additive is None else additive
            additive = additive.masked_fill(block, float("-inf"))
        self._additive_cache = additive.detach() if may_cache(self.training) and additive is not None else None
        if memo is not None:
            memo["additive", dtype] = additive
        return additive

    def gating(self) -> Tensor | None:
        """The weight of positional attention per head that has one ``(n,)`` (ConViT's ``sigmoid(lambda)``), or
        ``None``: the first kind's that reports one."""
        for terms in self._active_terms:
            gate = terms.gating(self)
            if gate is not None:
                return gate
        return None

    # ------------------------------------------------------------------ resolution
    @torch.no_grad()
    def set_grid(self, grid: tuple[int, int]) -> None:
        """Move the layer to another patch grid ``(H', W')`` (a new input resolution), keeping its weights.

        Each kind resamples its learned tables (``KindTerms.resize_grid``: LeViT's ``attention_biases`` and CMHSA's
        ``signed_biases`` bicubically on their offset grids, as timm ``resize_rel_pos_bias_table_levit``), then
        :meth:`_build_grid_tables` rebuilds the grid buffers (index tables, GPSA's ``r_ij``, the MaiT masks with the
        same windows, the linear-time window tables), the eval caches and the per-head path plan.  Afterwards the
        layer expects ``(B, prefix + H'*W', C)``.

        Raises:
            ValueError: for a grid side < 1.
        """
        rows, cols = check_grid(grid)
        old = self.grid
        for terms in self._active_terms:
            terms.resize_grid(self, old, (rows, cols))
        self._build_grid_tables((rows, cols))
