"""The forward paths of :class:`~archspec.families.attention.module.Attention`: a mixin, :class:`HeadPathsMixin`,
that ``Attention`` inherits.

What it holds: the per-head path plan (heads grouped by :func:`~archspec.families.attention.rules.head_path` at
construction, for eager and for ``torch.compile``), the dense reference formula (explicit ``(B, H, N, N)``
logits with biases, MaiT mask terms and ConViT's GPSA gating, eq. 5-7), each group's exact fast path
(:mod:`archspec.families.attention.kernels`: one SDPA call for plain / biased / strict heads, GPSA as
``(1 - g) SDPA + g P V``, hard masks in linear time, FlexAttention), the heads' concatenation back into head
order, and the training-time output projection per group.  Shapes: q, k ``(B, H, N, qk_dim)``, v
``(B, H, N, v_dim)``, outputs ``(B, H, N, v_dim)`` (or ``(B, N, C)`` for the per-group projection).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .kernels import flex_masked_attention, gpsa_attention, hard_masked_attention, hard_window_attention, is_compiling
from .mask_terms import apply_mask_terms
from .rules import head_path

__all__ = ["HeadPathsMixin"]


class HeadPathsMixin:
    """Head grouping and forward paths of :class:`~archspec.families.attention.module.Attention` (which sets the
    head lists, dims, projections and ``attn_impl`` these methods read; the position terms come from
    :class:`~archspec.families.attention.position_terms.PositionTermsMixin`).
    """

    # ------------------------------------------------------------------ path plan
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

    # ------------------------------------------------------------------ paths
    def _probs(self, q: Tensor, k: Tensor, heads: list[int] | None = None) -> Tensor:
        """Explicit (dense reference) path: final attention probabilities ``(B, h, N, N)`` before dropout.

        ``q``, ``k`` hold the heads ``heads`` (all heads when None), in that order.  The GPSA heads among them are
        mixed with their positional attention (ConViT eq. 5-7), written back at their positions: on all heads at
        the ``gpsa_head_idx`` buffer ``(n_gpsa,)``."""
        heads = list(range(self.num_heads)) if heads is None else heads
        attn = (q @ k.transpose(-2, -1)) * self.scale
        bias = self.position_bias()
        if bias is not None:
            attn = attn + self._heads(bias, heads, dim=0).to(attn.dtype)
        terms = [None if t is None else self._heads(t, heads, dim=0) for t in self._mask_terms(attn.dtype)]
        attn = apply_mask_terms(attn, *terms).softmax(dim=-1)
        local = [pos for pos, h in enumerate(heads) if h in self.gpsa_heads]
        if local:
            pos_attn, gate = self.positional_attention(), self.gating()
            if len(local) < len(self.gpsa_heads):  # some GPSA heads only: their rows
                rows = [self.gpsa_heads.index(heads[pos]) for pos in local]
                pos_attn, gate = pos_attn[rows], gate[rows]
            pos_attn, gate = pos_attn.to(attn.dtype), gate.to(attn.dtype).view(1, -1, 1, 1)
            content = attn if len(local) == len(heads) else attn[:, local]
            mixed = (1.0 - gate) * content + gate * pos_attn
            mixed = mixed / mixed.sum(dim=-1, keepdim=True)
            if len(local) == len(heads):
                attn = mixed
            else:  # write the mixed heads back; among all heads (0..H-1) they are at the buffer gpsa_head_idx
                index = (self.gpsa_head_idx if len(heads) == self.num_heads
                         else torch.tensor(local, device=attn.device))
                attn = attn.index_copy(1, index, mixed)
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
            pos, gate = self._heads(self.positional_attention(), rows, dim=0), self._heads(self.gating(), rows, dim=0)
            return gpsa_attention(q, k, v, pos, gate, self.scale, mask)
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
                                     None if bias is None else self._heads(bias, heads, dim=0).to(q.dtype))

    def _heads(self, t: Tensor, heads: list[int], dim: int = 1) -> Tensor:
        """The heads ``heads`` of ``t`` along ``dim`` (``(B, H, N, d)``: 1; ``(H, N, N)`` tables: 0; also the rows of
        a per-GPSA-head tensor, ``(n_gpsa, ...)``): a view (no copy, no index tensor) when they are contiguous, ``t``
        itself when they are all of ``dim`` in order; otherwise an ``index_select`` (one small index tensor)."""
        if heads == list(range(heads[0], heads[-1] + 1)):
            return t if len(heads) == t.shape[dim] else t.narrow(dim, heads[0], len(heads))
        return t.index_select(dim, torch.tensor(heads, device=t.device))

    def _plan(self) -> tuple[list[tuple[tuple, list[int]]], list[int] | None]:
        """``(groups, head_order)`` of the running mode.  Under ``torch.compile`` this is a trace-time branch:
        the compiled plan is fixed into the graph."""
        return self._compiled_plan if is_compiling() else (self._groups, self._head_order)

    def _group_outputs(self, q: Tensor, k: Tensor, v: Tensor, groups) -> list[Tensor]:
        """One ``(B, len(heads), N, v_dim)`` output per group of :meth:`_plan`; several groups share one position
        bias and additive mask (:meth:`~.position_terms.PositionTermsMixin._open_forward_memo`)."""
        if len(groups) == 1:
            return [self._group_forward(*groups[0], q, k, v)]
        opened = self._open_forward_memo()
        try:
            return [self._group_forward(key, heads, self._heads(q, heads), self._heads(k, heads),
                                        self._heads(v, heads))
                    for key, heads in groups]
        finally:
            if opened:
                self._forward_memo = None

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
