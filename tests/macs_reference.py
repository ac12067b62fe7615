"""The independent MAC reference the count tests use: torch's ``FlopCounterMode`` with attention forced onto
SDPA's math backend.

Why the math backend: ``FlopCounterMode`` counts an op only if it has a FLOP formula for it.  Which fused
SDPA kernel runs depends on the torch build and device, and some (e.g. torch 2.14's CPU flash kernel) have
no formula, so ``Q K^T`` and ``A V`` silently count 0.  The math backend decomposes attention into
``aten.bmm``, whose formula (2 x M x N x K per batch) the counter has had since it was introduced.  What the
reference counts is pinned down by ``test_reference_counts_linear_conv_and_attention`` (tests/test_compile.py):
if a torch release changes it, that test names the op, not a drifting model total.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode


def reference_macs(model: torch.nn.Module, x: torch.Tensor) -> float:
    """Multiply-accumulates of ``model(x)`` as counted by FlopCounterMode / 2 on SDPA's math backend."""
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops() / 2
