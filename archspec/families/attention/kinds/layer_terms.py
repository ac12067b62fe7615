"""The torch half of a head kind: :class:`KindTerms`, what one kind adds to one attention layer.

Importing this module imports no torch: the hooks run only when a layer is built or runs, and reach torch
through the tensors they are handed or :func:`archspec._util.lazy.lazy_module`.

:class:`~archspec.families.attention.module.Attention` builds one ``KindTerms`` per registered kind it hosts
(``HeadKind.layer_terms(layer, heads)``, in registry order) and composes them by looping over them, with no
branch on a kind's name.  Shapes: ``H`` heads, ``N = p + N_p`` tokens (``p`` prefix tokens first, then the
``N_p = rows * cols`` patches in row-major order), q, k ``(B, h, N, qk_dim)``, v ``(B, h, N, v_dim)``.

What the layer offers its kinds (its public attributes and methods): ``grid``, ``num_patches``, ``num_tokens``,
``num_prefix_tokens``, ``num_heads``, ``head_specs``, ``qk_dim``, ``v_dim``, ``dim``, ``norm``, ``scale``,
``training``, ``parameter_device``; ``select_heads(t, heads, dim)``; ``uses_dense_reference()`` (the dense reference
runs: ``attn_impl='dense'`` or attention dropout in training); ``position_bias()`` ``(H, N, N)``;
``additive_mask(dtype)`` (bias and ``-inf``, ``(H, N, N)``, what SDPA takes); ``logit_terms(dtype)`` (the composed
``(zero, scale, block)``); ``cached_term(key, build, device, constant=False)`` (a term built once per forward, cached
in eval mode); ``value_rows(head)``; ``register_buffer`` / attribute assignment for its parameters, buffers and
modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from torch import Tensor

__all__ = ["KindTerms"]


class KindTerms:
    """One head kind's parameters, buffers and logit terms in one attention layer (the default: none of them).

    A kind overrides what it contributes.  Every hook takes the layer (an ``Attention``), so a ``KindTerms`` holds
    no tensor and no reference to its layer: it is copied, pickled and traced by ``torch.compile`` with it.

    Construction, ``__init__(layer, heads)``: ``heads`` are the indices of the layer's heads of this kind, in head
    order (empty when none is: the kind may still publish its attributes, ``layer.gpsa_heads = []``).  Register the
    kind's parameters and submodules on ``layer`` under the names its state dict keeps, check what only the layer
    can (raise ``ValueError``).  It runs after the layer's q/k/v and output projections exist.
    """

    def __init__(self, layer: Any, heads: Sequence[int]) -> None:
        self.heads = list(heads)

    # ------------------------------------------------------------------ construction and grid
    def reset_parameters(self, layer: Any) -> None:
        """Initialise the kind's parameters (under ``torch.no_grad``, after the projections'; the kinds in registry
        order, so a kind drawing random numbers keeps its place in the seeded sequence)."""

    def build_grid_tables(self, layer: Any, device: Any) -> None:
        """Register the kind's grid-dependent, non-persistent buffers for ``layer.grid`` on ``device`` (at
        construction and on every grid change)."""

    def resize_grid(self, layer: Any, old: tuple[int, int], new: tuple[int, int]) -> None:
        """Resample the kind's learned tables from grid ``old`` to ``new`` (``set_grid``, under ``no_grad``; the
        grid tables are rebuilt afterwards)."""

    # ------------------------------------------------------------------ logit terms (each head of the kind)
    def bias(self, layer: Any) -> list[tuple[Any, Tensor]]:
        """The kind's additive bias on the logits: ``(heads, b)`` parts, ``b`` float ``(len(heads), N_p, N_p)`` on the
        patch-patch block (prefix tokens get none) or ``(len(heads), N, N)`` over every token, ``heads`` the layer's
        head indices as a list or a long tensor on ``b``'s device (a registered buffer: no index tensor per
        forward).  The layer adds every kind's parts into its ``(H, N, N)`` ``position_bias`` (built once per forward,
        cached in eval mode).  Default: none."""
        return []

    def zero_pairs(self, layer: Any) -> Tensor | None:
        """Bool ``(H, N, N)``: pairs whose logit becomes 0 (MaiT's hard mask), or None.  Explicit logits only."""
        return None

    def logit_scale(self, layer: Any, dtype: Any) -> Tensor | None:
        """``(H, N, N)`` in ``dtype``: a multiplier of each logit (1 where the kind has none), or None."""
        return None

    def blocked_pairs(self, layer: Any) -> Tensor | None:
        """Bool ``(H, N, N)``: pairs whose logit becomes ``-inf`` (allowed pairs' complement), or None.  SDPA takes
        it as ``-inf`` in the additive mask."""
        return None

    def mix_probs(self, layer: Any, probs: Tensor, heads: list[int]) -> Tensor:
        """The probabilities ``(B, len(heads), N, N)`` of the dense reference (after the softmax) with the kind's
        heads among ``heads`` (the layer's indices of ``probs``' heads) replaced, e.g. GPSA's gated positional
        attention.  Default: unchanged."""
        return probs

    def gating(self, layer: Any) -> Tensor | None:
        """The weight of positional attention per head of the kind ``(n,)`` (GPSA's gate), or None: what
        ``Attention.gating()`` reports for the diagnostics."""
        return None

    # ------------------------------------------------------------------ fast paths
    def token_roll(self, layer: Any, key: tuple) -> tuple[int, int] | None:
        """Where every head of the layer takes the kind's path ``key``: a cyclic roll ``(rows, cols)`` of the token
        grid that the layer applies to its input before its projections, and undoes on its output (``torch.roll``
        by ``-roll``, then ``+roll``), in place of the kind rolling q, k and v in ``path_forward`` (which then finds
        ``layer.token_roll`` set).  Exact where the roll commutes with the per-token projections: Swin's cyclic
        shift, one roll of ``x`` as timm does instead of three.  Default None (no roll)."""
        return None

    def path_forward(self, layer: Any, key: tuple, heads: list[int], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Output ``(B, len(heads), N, v_dim)`` of the heads ``heads`` on the kind's path ``key`` (one of the
        ``HeadKind.paths`` its rule chose at construction); q, k, v hold those heads only.

        Raises:
            NotImplementedError: the kind owns no path.
        """
        raise NotImplementedError(f"{type(self).__name__} owns no path, but {key!r} was planned for heads {heads}")
