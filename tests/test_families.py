"""Every registered block family (archspec/families.py): the module it builds has the parameters its count rule
states, the MACs the independent reference counts (tests/macs_reference.py), and the output grid its shape rule
states.  A new family must add a sample shape here (the first test fails until it does)."""

from __future__ import annotations

import pytest
import torch

from archspec.blocks.attention import coerce_heads
from archspec.families import FAMILY_MODULES, family

from macs_reference import reference_macs

# family -> (shape kwargs, build-only kwargs, count/memory-only kwargs, input (B, N, C), expected output tokens)
SAMPLES = {
    "talking_heads": (dict(dim=32, heads=coerce_heads(["mhsa", "mask:3x3", "soft_mask", "mhsa"]), grid=(3, 5),
                           n_prefix=1, qkv_bias=True), {}, {}, (1, 16, 32), 16),
    # LayerScale: a float to build (its init), a bool to count (2C parameters when present)
    "class_attention": (dict(dim=32, heads=4, n_tokens=17, mlp_ratio=3.0, qkv_bias=True), {"layer_scale": 1e-5},
                        {"layer_scale": True}, (1, 17, 32), 17),
    # odd grid: the subsampled grid is ceil(7 / 2) x ceil(5 / 2) = 4 x 3 (LeViT sec. 4.2, timm LevitDownsample)
    "shrink": (dict(in_dim=32, out_dim=48, heads=2, key_dim=8, attn_ratio=4.0, mlp_ratio=2.0, grid=(7, 5), stride=2),
               {}, {}, (1, 35, 32), 12),
    # pixel view: 48 = 2^2 * 12 channels, a 5x5 conv on the 8x6 pixel image (CMHSA Thm. 1)
    "conv_mixer": (dict(dim=48, kernel=5, grid=(4, 3), patch=2), {}, {}, (1, 12, 48), 12),
}


def test_every_registered_family_has_a_sample():
    assert set(SAMPLES) == set(FAMILY_MODULES)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_family_rules_match_its_module(name, one_thread):
    rule = family(name)
    shape, build_only, rule_only, x_shape, n_out = SAMPLES[name]
    torch.manual_seed(0)
    module = rule.build(**shape, **build_only).eval()
    params, macs = rule.counts(**shape, **rule_only)
    assert params == sum(p.numel() for p in module.parameters())
    x = torch.randn(*x_shape)
    assert macs == reference_macs(module, x)
    with torch.no_grad():
        out = module(x)
    assert out.shape[1] == n_out
    if rule.out_grid is not None:
        rows, cols = rule.out_grid(**shape)
        assert rows * cols == n_out
    memory = rule.memory(**shape, **rule_only)
    assert memory.act > 0 and memory.saved > 0
    # the largest single tensor of the forward (its output) fits inside the stated inference peak
    assert memory.act >= 4 * out.numel()
