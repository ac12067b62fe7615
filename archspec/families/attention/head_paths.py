"""The forward paths of :class:`~archspec.families.attention.module.Attention`: a mixin, :class:`HeadPathsMixin`,
that ``Attention`` inherits.

What it holds: the per-head path plan (heads grouped by :func:`~archspec.families.attention.rules.head_path` at
construction, for eager and for ``torch.compile``), the dense reference formula (explicit ``(B, H, N, N)``
logits with the kinds' bias and logit terms, then each kind's change of the probabilities, e.g. ConViT's GPSA
gating, eq. 5-7), the generic SDPA path (plain heads and heads whose terms SDPA takes, in one call), the dispatch
of a group to the kind that owns its path (``KindTerms.path_forward``: GPSA as ``(1 - g) SDPA + g P V``, MaiT's
hard masks in linear time, FlexAttention), the heads' concatenation back into head order, and the training-time
output projection per group.  No branch on a kind.  Shapes: q, k ``(B, H, N, qk_dim)``, v ``(B, H, N, v_dim)``,
outputs ``(B, H, N, v_dim)`` (or ``(B, N, C)`` for the per-group projection).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .kernels import is_compiling
from .position_terms import apply_logit_terms
from .rules import head_path, head_terms

__all__ = ["HeadPathsMixin"]


class HeadPathsMixin:
    """Head grouping and forward paths of :class:`~archspec.families.attention.module.Attention` (which sets the
    dims, projections, ``attn_impl`` and ``_path_terms``, the kind owning each named path, that these methods read;
    the logit terms come from :class:`~archspec.families.attention.position_terms.PositionTermsMixin`).
    """

    # ------------------------------------------------------------------ path plan
    def _head_path(self, head: int, compiled: bool = False) -> tuple:
        """Path of one head under ``attn_impl`` (not ``'dense'``): the family rules' :func:`~.rules.head_path`."""
        return head_path(self.head_specs[head], self.grid, self.attn_impl, compiled, self.num_prefix_tokens)

    def _plan_paths(self) -> None:
        """Group heads by path (static: head kinds, grid, ``attn_impl``); ``_groups`` lists ``(key, heads)``
        by first head, ``_head_order`` the permutation restoring head order after concatenation (or None).

        The dense reference has its own plan, ``_dense_plan``: every head on ``("dense",)`` (then ``_dense_whole``:
        the layer's one reference formula) except the heads of a kind that ``owns_reference`` (Swin's windows), on
        that kind's path, where it runs its own reference.  ``_sdpa_unmasked``: heads without logit terms, which an
        SDPA group made only of them runs with no mask."""
        self._sdpa_unmasked = frozenset(h for h, spec in enumerate(self.head_specs) if not head_terms(spec))
        self._dense_plan = self._group_heads(compiled=False, impl="dense")
        self._dense_whole = all(key == ("dense",) for key, _ in self._dense_plan[0])
        if self.attn_impl == "dense":
            self._groups, self._head_order = [], None
            self._compiled_plan = ([], None)
            self.token_roll = None
            return
        self._groups, self._head_order = self._group_heads(compiled=False)
        self._compiled_plan = self._group_heads(compiled=True)
        self.token_roll = self._plan_token_roll()

    def _plan_token_roll(self) -> tuple[int, int] | None:
        """The roll of the token grid the layer applies around its projections (``KindTerms.token_roll``): only
        when every head takes one kind's path, in eager and compiled plans alike, and no prefix token is present."""
        groups, compiled = self._groups, self._compiled_plan[0]
        if len(groups) != 1 or [key for key, _ in compiled] != [groups[0][0]] or self.num_prefix_tokens:
            return None
        owner = self._path_terms.get(groups[0][0][0])
        return None if owner is None else owner.token_roll(self, groups[0][0])

    def _group_heads(self, compiled: bool, impl: str | None = None
                     ) -> tuple[list[tuple[tuple, list[int]]], list[int] | None]:
        groups: dict[tuple, list[int]] = {}
        for head in range(self.num_heads):
            key = (self._head_path(head, compiled) if impl is None else
                   head_path(self.head_specs[head], self.grid, impl, compiled, self.num_prefix_tokens))
            groups.setdefault(key, []).append(head)
        ordered = sorted(groups.items(), key=lambda item: item[1][0])
        order = [h for _, heads in ordered for h in heads]
        in_order = order == list(range(self.num_heads))
        return ordered, None if in_order else [order.index(h) for h in range(self.num_heads)]

    # ------------------------------------------------------------------ paths
    def _probs(self, q: Tensor, k: Tensor, heads: list[int] | None = None) -> Tensor:
        """Explicit (dense reference) path: final attention probabilities ``(B, h, N, N)`` before dropout.

        ``q``, ``k`` hold the heads ``heads`` (all heads when None), in that order: ``softmax(terms(Q K^T s + B))``
        (:meth:`~.position_terms.PositionTermsMixin.position_bias`, :func:`~.position_terms.apply_logit_terms`),
        then each kind's change of its heads' probabilities (``KindTerms.mix_probs``: ConViT eq. 5-7)."""
        heads = list(range(self.num_heads)) if heads is None else heads
        attn = (q @ k.transpose(-2, -1)) * self.scale
        bias = self.position_bias()
        if bias is not None:
            attn = attn + self.select_heads(bias, heads, dim=0).to(attn.dtype)
        terms = [None if t is None else self.select_heads(t, heads, dim=0) for t in self.logit_terms(attn.dtype)]
        attn = apply_logit_terms(attn, *terms).softmax(dim=-1)
        for kind_terms in self._active_terms:
            attn = kind_terms.mix_probs(self, attn, heads)
        return attn

    def _dense_forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Reference path ``(B, H, N, v_dim)``: one explicit softmax over all heads, or one SDPA call."""
        if self.explicit_logits:
            return self.attn_drop(self._probs(q, k)) @ v
        additive = self.additive_mask(q.dtype)
        return F.scaled_dot_product_attention(
            q, k, v,
            attn_mask=None if additive is None else additive.unsqueeze(0),
            dropout_p=self.attn_drop_p if self.training else 0.0,
            scale=self.scale,
        )

    def _group_forward(self, key: tuple, heads: list[int], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Output ``(B, len(heads), N, v_dim)`` of one group of heads on its path (see :meth:`_head_path`): the
        explicit reference (``dense``), the kind that owns the path, or SDPA."""
        if key[0] == "dense":
            return self.attn_drop(self._probs(q, k, heads)) @ v
        owner = self._path_terms.get(key[0])
        if owner is not None:
            return owner.path_forward(self, key, heads, q, k, v)
        # a group of heads without terms needs no mask, even where other heads of the layer have one (it would be
        # zero on these heads, and building it costs (H, N, N): Swin's windows beside global heads)
        additive = None if self._sdpa_unmasked.issuperset(heads) else self.additive_mask(q.dtype)
        if additive is not None:
            additive = self.select_heads(additive, heads, dim=0)
        if additive is not None and not self._masked_sdpa_fused:
            # CPU SDPA runs a float attn_mask on its math backend plus a "safe softmax" (where/all per call):
            # the plain formula, as timm's LeViT writes it, is cheaper there.
            return ((q @ k.transpose(-2, -1)) * self.scale + additive).softmax(dim=-1) @ v
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if additive is None else additive.unsqueeze(0),
            dropout_p=self.attn_drop_p if self.training else 0.0, scale=self.scale)

    def select_heads(self, t: Tensor, heads: list[int], dim: int = 1) -> Tensor:
        """The heads ``heads`` of ``t`` along ``dim`` (``(B, H, N, d)``: 1; ``(H, N, N)`` tables: 0; also the rows of
        a per-kind tensor, ``(n_kind, ...)``): a view (no copy, no index tensor) when they are contiguous, ``t``
        itself when they are all of ``dim`` in order; otherwise an ``index_select`` (one small index tensor)."""
        if heads == list(range(heads[0], heads[-1] + 1)):
            return t if len(heads) == t.shape[dim] else t.narrow(dim, heads[0], len(heads))
        return t.index_select(dim, torch.tensor(heads, device=t.device))

    def _plan(self) -> tuple[list[tuple[tuple, list[int]]], list[int] | None]:
        """``(groups, head_order)`` of the running mode: the dense reference's (:meth:`uses_dense_reference`), else
        the eager or the compiled plan.  Under ``torch.compile`` this is a trace-time branch: the compiled plan is
        fixed into the graph."""
        if self.uses_dense_reference():
            return self._dense_plan
        return self._compiled_plan if is_compiling() else (self._groups, self._head_order)

    def _group_outputs(self, q: Tensor, k: Tensor, v: Tensor, groups) -> list[Tensor]:
        """One ``(B, len(heads), N, v_dim)`` output per group of :meth:`_plan`; several groups share one position
        bias, additive mask and kind term (:meth:`~.position_terms.PositionTermsMixin._open_forward_memo`)."""
        if len(groups) == 1:
            return [self._group_forward(*groups[0], q, k, v)]
        opened = self._open_forward_memo()
        try:
            return [self._group_forward(key, heads, self.select_heads(q, heads), self.select_heads(k, heads),
                                        self.select_heads(v, heads))
                    for key, heads in groups]
        finally:
            if opened:
                self._forward_memo = None

    def uses_dense_reference(self) -> bool:
        """The dense reference runs: ``attn_impl == 'dense'``, or attention dropout active in training (the fast
        paths have no dropout on implicit weights).  A kind that ``owns_reference`` reads it in its
        ``path_forward`` to run its own reference."""
        return self.attn_impl == "dense" or (self.training and self.attn_drop_p > 0)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``(B, H, N, v_dim)`` on the planned paths (or the dense reference, :meth:`uses_dense_reference`: the
        layer's one formula, with the heads of a kind that owns its reference on that kind's path)."""
        if self.uses_dense_reference() and self._dense_whole:
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
        return (self.norm == "layernorm" and torch.is_grad_enabled() and not self.uses_dense_reference()
                and len(self._plan()[0]) > 1)

    def _project_groups(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """``proj(act(concat_heads(out)))`` as ``sum_g act(out_g) @ W[:, heads_g]^T + b``, ``(B, N, out_dim)``.

        Why: autograd keeps the projection's input for backward.  Unmasked, that input is SDPA's own output
        (laid out ``(B, N, H, d)``, so the reshape is a view), which SDPA keeps anyway; a concatenation of head
        groups would be one more ``(B, N, H d)`` tensor to keep.  Per group, the SDPA group's input is again
        its output, and the other groups keep what the concatenation would have: the training step keeps no
        more than the unmasked model's."""
        B, N = q.shape[0], q.shape[2]
        groups, _ = self._plan()
        weight = self.proj.weight.view(self.out_dim, self.num_heads, self.v_dim)
        out = None
        for (_, heads), o in zip(groups, self._group_outputs(q, k, v, groups)):
            w = self.select_heads(weight, heads, dim=1).reshape(self.out_dim, len(heads) * self.v_dim)
            part = F.linear(self.proj_act(o.transpose(1, 2).reshape(B, N, -1)), w)
            out = part if out is None else out + part
        return out if self.proj.bias is None else out + self.proj.bias
