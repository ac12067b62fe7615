"""archspec.diagnostics.metrics: attention maps, MaiT ALS (eq. 3) and ConViT nonlocality (eq. 8) on hand cases and
models."""

from __future__ import annotations

import pytest
import torch

from archspec import compile
from archspec.diagnostics.metrics import (
    attention_locality_score,
    attention_maps,
    layer_als,
    nonlocality,
    patch_window_mask,
)
from archspec.families.attention.mask_terms import window_mask

TINY = {
    "name": "tiny_metrics", "input": {"channels": 3, "resolution": 32}, "stem": {"kind": "patch", "patch_size": 8},
    "tokens": {"cls_token": "input"},
    "stages": [{"depth": 2, "dim": 32, "heads": 2, "attention": "mhsa",
                "layers": [{"range": "0-1", "heads": ["strict_mask:3x3", "mhsa"]}]}],
    "head": {"num_classes": 10},
}


def test_als_all_inside_window_is_one():
    grid, window = (4, 4), (3, 3)
    mask = patch_window_mask(grid, window)
    attn = mask.float() / mask.float().sum(-1, keepdim=True)  # all weight inside the window
    als = attention_locality_score(attn.expand(2, 3, -1, -1), mask)
    assert als.shape == (3,)
    assert torch.allclose(als, torch.ones(3))


def test_als_uniform_is_window_over_n():
    n = 16
    attn = torch.full((1, 2, n, n), 1.0 / n)
    one = patch_window_mask((4, 4), (1, 1))  # the query itself: |window| = 1 for every row
    assert torch.allclose(attention_locality_score(attn, one), torch.full((2,), 1.0 / n))
    mask = patch_window_mask((4, 4), (3, 3))  # border rows have smaller windows: mean |window_n| / N
    expected = mask.float().sum(-1).mean() / n
    assert torch.allclose(attention_locality_score(attn, mask), expected.expand(2))
    assert abs(expected.item() - (4 * 9 + 8 * 6 + 4 * 4) / 16 / 16) < 1e-6


def test_als_skips_prefix_rows():
    grid, p = (3, 3), 1
    mask = patch_window_mask(grid, (1, 1), p)
    n = p + 9
    attn = torch.zeros(1, 1, n, n)
    attn[0, 0, 0, 0] = 1.0          # class row: outside any window, must not count
    attn[0, 0, 1:, 1:] = torch.eye(9)  # every patch attends to itself
    assert torch.allclose(attention_locality_score(attn, mask, p), torch.ones(1))
    with pytest.raises(ValueError):
        attention_locality_score(attn, mask[:-1, :-1], p)


def test_nonlocality_hand_case():
    # 1x3 grid; every query puts all weight on patch 0 -> distances 0, 1, 2 -> mean 1
    attn = torch.zeros(1, 2, 3, 3)
    attn[:, 0, :, 0] = 1.0
    attn[:, 1] = torch.eye(3)  # head 1 attends to itself: 0
    d = nonlocality(attn, (1, 3))
    assert torch.allclose(d, torch.tensor([1.0, 0.0]))
    # 2x2 grid, uniform attention: each query sees distances {0, 1, 1, sqrt 2} -> (2 + sqrt 2) / 4
    uni = torch.full((1, 1, 5, 5), 0.2)  # one prefix token, its column ignored
    expected = 0.2 * (2 + 2 ** 0.5)
    assert torch.allclose(nonlocality(uni, (2, 2), num_prefix_tokens=1), torch.tensor([expected]))


@pytest.mark.slow
def test_attention_maps_and_layer_als_on_a_model():
    model = compile(TINY)
    model.train()
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    maps = attention_maps(model, x)
    assert list(maps) == ["stages.0.blocks.0.attn", "stages.0.blocks.1.attn"]
    for attn in maps.values():
        assert attn.shape == (2, 2, 17, 17)
        assert torch.allclose(attn.sum(-1), torch.ones(2, 2, 17), atol=1e-5)
    assert model.training  # mode restored
    als = layer_als(model, x, window=(3, 3))
    for scores in als.values():
        assert scores.shape == (2,)
        # head 0 is strictly masked to its 3x3 window plus the class column; class weight is not local
        own = attention_locality_score(maps["stages.0.blocks.0.attn"], window_mask((4, 4), (3, 3), 1), 1)
        assert own[0] == pytest.approx(1.0, abs=1e-5)
        assert 0.0 < scores[0] <= 1.0 and 0.0 < scores[1] < scores[0]


# --------------------------------------------------------------------------- MaiT App. A.3 eq. 5
def test_cross_layer_similarity_hand_case():
    """Two layers, one head, two tokens: row 0 is orthogonal across layers, row 1 identical.

    Layer 0: token 0 attends [1, 0], token 1 [0.6, 0.4]; layer 1: token 0 [0, 1], token 1 [0.6, 0.4].
    eq. 5: M^{0,1}_{0} = 0, M^{0,1}_{1} = 1; M^{i,i}_t = 1; the per-head L x L map averages tokens: 0.5.
    A third layer with token 0 at [0.6, 0.8] gives cos([1, 0], [0.6, 0.8]) = 0.6 against layer 0.
    """
    from archspec.diagnostics.metrics import cross_layer_similarity

    a0 = torch.tensor([[1.0, 0.0], [0.6, 0.4]]).view(1, 1, 2, 2)
    a1 = torch.tensor([[0.0, 1.0], [0.6, 0.4]]).view(1, 1, 2, 2)
    a2 = torch.tensor([[0.6, 0.8], [0.6, 0.4]]).view(1, 1, 2, 2)
    m = cross_layer_similarity([a0, a1, a2])
    assert m.shape == (1, 1, 3, 3, 2)
    assert torch.allclose(m[0, 0, 0, 1], torch.tensor([0.0, 1.0]))
    assert torch.allclose(m[0, 0, 0, 2], torch.tensor([0.6, 1.0]))
    assert torch.allclose(m[0, 0, 1, 2], torch.tensor([0.8, 1.0]))
    assert torch.allclose(m[0, 0].diagonal(dim1=0, dim2=1), torch.ones(2, 3))
    assert torch.allclose(m.mean(dim=(0, 4))[0], torch.tensor([[1.0, 0.5, 0.8], [0.5, 1.0, 0.9], [0.8, 0.9, 1.0]]))


def test_cross_layer_similarity_rejects_mixed_shapes():
    from archspec.diagnostics.metrics import cross_layer_similarity

    with pytest.raises(ValueError):
        cross_layer_similarity([torch.rand(1, 2, 4, 4), torch.rand(1, 3, 4, 4)])
    with pytest.raises(ValueError):
        cross_layer_similarity([])


def test_layer_cross_similarity_of_a_model_is_symmetric_with_unit_diagonal(one_thread):
    from archspec.diagnostics.metrics import layer_cross_similarity

    model = compile(TINY)
    names, sim = layer_cross_similarity(model, torch.randn(2, 3, 32, 32))
    assert names == ["stages.0.blocks.0.attn", "stages.0.blocks.1.attn"] and sim.shape == (2, 2, 2)
    assert torch.allclose(sim, sim.transpose(1, 2), atol=1e-6)
    assert torch.allclose(sim.diagonal(dim1=1, dim2=2), torch.ones(2, 2), atol=1e-5)
    assert (sim <= 1 + 1e-6).all() and (sim >= 0).all()  # probabilities: non-negative rows


def test_layer_cross_similarity_compares_patches_when_the_class_token_comes_late(one_thread):
    """ConViT-like: block 0 has no class token, block 1 has it; the maps are cut to the patch block."""
    from archspec.diagnostics.metrics import layer_cross_similarity

    doc = {**TINY, "tokens": {"cls_token": 1}, "stages": [{"depth": 2, "dim": 32, "heads": 2, "attention": "mhsa"}]}
    _, sim = layer_cross_similarity(compile(doc), torch.randn(1, 3, 32, 32))
    assert sim.shape == (2, 2, 2)
