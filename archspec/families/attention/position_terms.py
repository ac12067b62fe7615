"""The per-head position terms of :class:`~archspec.families.attention.module.Attention`, their grid tables and
eval-mode caches: a mixin, :class:`PositionTermsMixin`, that ``Attention`` inherits.

What it holds, per head kind (shapes with ``H`` heads, ``N = num_prefix_tokens + H_grid * W_grid`` tokens):

* relative position biases, ``position_bias`` ``(H, N, N)``: LeViT's table on absolute offsets (LeViT eq. 1,
  timm ``levit.Attention``) and CMHSA's on signed offsets (CMHSA eq. 4), plus the Gaussian bias
  ``gauss_bias`` of GMM-Mask (Li & Zhang, arXiv 2309.05375, one Gaussian per head);
* MaiT's mask terms (hard eq. 2, soft eq. 4, strict ``-inf``: :mod:`~archspec.families.attention.mask_terms`) and
  SDPA's additive float mask;
* GPSA's positional attention ``softmax(pos_proj(r))`` and gate (ConViT eq. 5-7) and ConViT's convolutional
  init (eq. 5, timm ``convit.GPSA.local_init``);
* the grid-dependent index, mask and window tables, rebuilt by ``set_grid`` for a new resolution (bias tables
  resampled as timm ``resize_rel_pos_bias_table_levit``);
* the eval-mode caches of these constants, and the rule for when a cached constant may be kept
  (:func:`cache_usable`, :func:`may_cache`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import gauss_mask
from .kernels import is_compiling, window_tables
from .mask_terms import hard_zero, mask_terms, strict_block, window_mask
from .tables import (
    check_grid,
    conv_kernel_offsets,
    gpsa_rel_indices,
    levit_bias_idxs,
    resample_bias_table,
    signed_bias_idxs,
    squared_distances,
)

__all__ = ["PositionTermsMixin", "cache_usable", "may_cache"]


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


class PositionTermsMixin:
    """Position terms, grid tables and eval-mode caches of :class:`~archspec.families.attention.module.Attention`
    (which sets the head lists, dims and parameters these methods read; see its docstring for each term's source).
    """

    # ------------------------------------------------------------------ ConViT convolutional init
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

    # ------------------------------------------------------------------ grid tables
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
            self.register_buffer("gauss_dist2", squared_distances(self.grid).to(device), persistent=False)
        if self.mask_heads:
            masks = [window_mask(self.grid, specs[i].mask.window, p) for i in self.mask_heads]
            self.register_buffer("attn_masks", torch.stack(masks).to(device), persistent=False)  # (n_mask, N, N) bool
        for window in sorted({tuple(specs[i].mask.window) for i in self.hard_heads}):
            for name, table in window_tables(self.grid, window, p).items():
                self.register_buffer(f"window{window[0]}x{window[1]}_{name}", table.to(device), persistent=False)
        self._drop_caches()
        self._plan_paths()

    def _drop_caches(self) -> None:
        self._forward_memo: dict | None = None  # set only while one forward runs several head groups
        self._bias_cache: Tensor | None = None
        self._zero_cache: Tensor | None = None
        self._qkv_cache: tuple[Tensor, Tensor | None] | None = None
        self._additive_cache: Tensor | None = None
        self._positional_cache: Tensor | None = None

    # ------------------------------------------------------------------ position and mask terms
    def position_bias(self) -> Tensor | None:
        """Additive position bias of every head, ``(H, N, N)``: relative-bias tables plus Gaussian biases
        (:meth:`gauss_bias`), zero outside the patch-patch block and for heads without either; or ``None`` when no
        head has one.

        Built at most once per forward: in eval mode it is cached (a constant); in training a forward that runs
        several head groups shares one build between them (:meth:`_open_forward_memo`)."""
        if not (self.abs_bias_heads or self.signed_bias_heads or self.gauss_heads):
            return None
        # In eval mode the bias is a constant: build it once per device, as timm's LeViT does.  The eval cache comes
        # before the forward memo, so that an eval forward with grad enabled differentiates what it did before the
        # memo existed (the first path's build; later paths the detached cache).
        if (not self.training and cache_usable(self._bias_cache)
                and self._bias_cache.device == self.attention_bias_device):
            return self._bias_cache
        memo = self._forward_memo
        if memo is not None and "bias" in memo:
            return memo["bias"]
        bias = self._build_position_bias()
        self._bias_cache = bias.detach() if may_cache(self.training) else None
        if memo is not None:
            memo["bias"] = bias
        return bias

    def _open_forward_memo(self) -> bool:
        """Open the memo that lets the head groups of one forward share one :meth:`position_bias`, one
        :meth:`_additive_mask` per dtype and one :meth:`positional_attention` (in training each is otherwise rebuilt
        per call, autograd graph included); the caller closes it (``_forward_memo = None``) when the forward's
        groups are done.  Returns whether it was opened: never under ``torch.compile`` (tracing must not store
        tensors on the module; the compiled graph de-duplicates the builds itself).  Raises nothing."""
        if is_compiling():
            return False
        self._forward_memo = {}
        return True

    @property
    def attention_bias_device(self) -> torch.device:
        """Device of the bias parameters (the eval-mode bias cache is valid only there)."""
        if self.abs_bias_heads:
            return self.attention_biases.device
        return (self.signed_biases if self.signed_bias_heads else self.gauss_alpha).device

    def _build_position_bias(self) -> Tensor:
        p = self.num_prefix_tokens
        if p == 0 and len(self.abs_bias_heads) == self.num_heads and not self.gauss_heads:  # LeViT: every head
            return self.attention_biases[:, self.attention_bias_idxs]                       # biased, no prefix
        if self.gauss_heads and not self.gauss_scattered:  # every head Gaussian and nothing else: the bias itself,
            gauss = self.gauss_bias()                          # zero rows / columns for the prefix, no scatter
            return F.pad(gauss, (p, 0, p, 0)) if p else gauss
        ref = (self.attention_biases if self.abs_bias_heads
               else self.signed_biases if self.signed_bias_heads else self.gauss_alpha)
        bias = ref.new_zeros(self.num_heads, self.num_tokens, self.num_tokens)
        if self.abs_bias_heads:
            bias[self.abs_bias_heads, p:, p:] = self.attention_biases[:, self.attention_bias_idxs]
        if self.signed_bias_heads:
            bias[self.signed_bias_heads, p:, p:] = self.signed_biases[:, self.signed_bias_idxs]
        if self.gauss_heads:  # added: a head may carry a relative bias and a Gaussian one
            gauss = F.pad(self.gauss_bias(), (p, 0, p, 0))
            bias = bias.index_add(0, self.gauss_head_idx, gauss.to(bias.dtype))
        return bias

    def gauss_bias(self) -> Tensor:
        """Gaussian bias of the Gaussian heads, ``(n_gauss, N_p, N_p)`` on the patch-patch block (GMM-Mask,
        Li & Zhang, arXiv 2309.05375, authors' ``models/gmm.py`` with one Gaussian per head):

            ``b_h[i, j] = gauss_alpha_h * exp(-d_ij^2 / (2 (gauss_sigma_h^2 + 1e-5)))``

        with ``d_ij^2`` the squared distance between patches ``i`` and ``j`` in patch units (``gauss_dist2``,
        :func:`~archspec.families.attention.tables.squared_distances`), in logit units; the heads in head order.
        Differentiable in ``gauss_alpha`` and ``gauss_sigma``.

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
            if not cache_usable(zero) or zero.device != self.attn_masks.device:
                zero = hard_zero(self.num_heads, self._mask_modes, self.attn_masks)
                if may_cache(False):
                    self._zero_cache = zero
        return mask_terms(self.num_heads, self._mask_modes, self.attn_masks, self.mask_alpha(), dtype, zero)

    def positional_attention(self) -> Tensor:
        """GPSA positional attention ``softmax(pos_proj(r))`` ``(n_gpsa, N, N)`` (ConViT eq. 5).

        Computed on the ``(N, N, 3)`` relative indices once, not per batch element
        (``N * N * 3 * n_gpsa`` MACs).  It does not depend on the input, so in eval mode it is cached
        (dropped by ``train()``, ``load_state_dict`` and :meth:`_build_grid_tables`); in training a forward whose
        GPSA heads run on two paths (the GPSA path and the explicit-logits path of the hard/soft-masked ones) shares
        one build, autograd graph included, between them (:meth:`_open_forward_memo`): both take rows of this same
        all-heads tensor.

        Raises:
            ValueError: when the layer has no GPSA head.
        """
        if not self.gpsa_heads:
            raise ValueError("this attention layer has no GPSA head")
        cached = self._positional_cache
        if not self.training and cache_usable(cached) and cached.device == self.pos_proj.weight.device:
            return cached  # before the memo: an eval forward's second path keeps the detached cache, as it did
        memo = self._forward_memo
        if memo is not None and "positional" in memo:
            return memo["positional"]
        pos = self.pos_proj(self.rel_indices.to(self.pos_proj.weight.dtype)).permute(2, 0, 1).softmax(dim=-1)
        self._positional_cache = pos.detach() if may_cache(self.training) else None
        if memo is not None:
            memo["positional"] = pos
        return pos

    def _additive_mask(self, dtype: torch.dtype) -> Tensor | None:
        """Additive float mask ``(H, N, N)`` for SDPA: relative biases, ``-inf`` on strict non-neighbours; or None.

        Cached in eval mode per dtype and device (it is a constant then); shared by the head groups of one forward
        in training (:meth:`_open_forward_memo`)."""
        cached = self._additive_cache
        if not self.training and cache_usable(cached) and cached.dtype == dtype:  # _apply drops it on a device move
            return cached
        memo = self._forward_memo  # after the eval cache, as in position_bias
        if memo is not None and ("additive", dtype) in memo:
            return memo["additive", dtype]
        mask = self.position_bias()
        if mask is not None:
            mask = mask.to(dtype)
        # only the strict heads' -inf: the hard and soft terms belong to the explicit paths, not SDPA's mask
        block = strict_block(self.num_heads, self._mask_modes, self.attn_masks) if self.strict_heads else None
        if block is not None:
            mask = torch.zeros(block.shape, dtype=dtype, device=block.device) if mask is None else mask
            mask = mask.masked_fill(block, float("-inf"))
        self._additive_cache = mask.detach() if may_cache(self.training) and mask is not None else None
        if memo is not None:
            memo["additive", dtype] = mask
        return mask

    # ------------------------------------------------------------------ resolution
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

