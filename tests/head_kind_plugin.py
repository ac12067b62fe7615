"""A head kind registered from outside archspec, for tests/test_head_kinds.py: ``self_bias``, a learned additive bias
on each patch query's own key, ``b_h[i, j] = beta_h`` when ``i == j`` (patches only), else 0 -- one parameter per
head, 0 MACs.  Importing this module registers it; do so before archspec builds its spec models (before
``archspec.families.attention.heads`` is imported).  Nothing of archspec is edited for it: this file is the kind.
"""

from __future__ import annotations

from pydantic import Field

from archspec._util.lazy import lazy_module
from archspec._util.pydantic_base import StrictModel
from archspec.families.attention.kinds import HeadKind, KindTerms, register_head_kind

torch = lazy_module("torch")
nn = lazy_module("torch.nn")

FIELD = "self_bias"


class SelfBiasSpec(StrictModel):
    """A learned bias ``beta`` on each patch query's own key (a test plug-in)."""

    init: float = Field(1.0, ge=-10, le=10, description="Initial beta, in logit units.")


def params(heads, grid) -> int:
    """One ``beta`` per head of the kind."""
    return sum(getattr(h, FIELD) is not None for h in heads)


class SelfBiasTerms(KindTerms):
    """``self_bias`` ``(n,)`` on the layer; its bias part ``beta_h I`` ``(n, N_p, N_p)``."""

    def __init__(self, layer, heads) -> None:
        super().__init__(layer, heads)
        if self.heads:
            layer.self_bias = nn.Parameter(torch.zeros(len(self.heads)))

    def reset_parameters(self, layer) -> None:
        layer.self_bias.copy_(torch.tensor([getattr(layer.head_specs[i], FIELD).init for i in self.heads]))

    def bias(self, layer):
        eye = torch.eye(layer.num_patches, dtype=layer.self_bias.dtype, device=layer.self_bias.device)
        return [(self.heads, layer.self_bias.view(-1, 1, 1) * eye)]


KIND = register_head_kind(HeadKind(
    field=FIELD, spec=SelfBiasSpec, description="A learned bias on each query's own key (test plug-in).",
    shorthands={"self_bias": {FIELD: {}}}, legend={"Z": "self bias (test plug-in)"}, letter=lambda spec: "Z",
    terms=lambda spec: frozenset({"bias"}), params=params, no_weight_decay=frozenset({FIELD}),
    layer_terms=SelfBiasTerms))
