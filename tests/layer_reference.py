"""What the attention tests' hand-written references share: an archspec ``Attention`` layer's q, k, v recomputed in
float64 from its projection weights (ConViT's layout: ``qk`` ``(2, H, qk_dim)`` rows, ``v`` ``(H, v_dim)``)."""

from __future__ import annotations

import torch


def float64_qkv(layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k ``(B, N, H, qk_dim)`` and v ``(B, N, H, v_dim)`` of ``layer`` (a layernorm-family ``Attention`` with a
    qkv bias) on ``x`` ``(B, N, C)``, in float64."""
    B, N, _ = x.shape
    H, d = layer.num_heads, layer.qk_dim
    x = x.double()
    qk = x @ layer.qk.weight.double().T + layer.qk.bias.double()
    q, k = qk[..., :H * d].view(B, N, H, d), qk[..., H * d:].view(B, N, H, d)
    v = (x @ layer.v.weight.double().T + layer.v.bias.double()).view(B, N, H, layer.v_dim)
    return q, k, v
