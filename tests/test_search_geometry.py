"""The proxy keeps the candidate's token geometry (archspec.search._evaluation.proxy.proxy_geometry).

The reference is the candidate itself: its stage grids at its own input size, from the graph.  A proxy
that trained LeViT-family candidates on 4x4 -> 2x2 -> 1x1 grids could not tell a 5x5-masked head from an
unmasked one; these tests fail if that comes back.
"""

from __future__ import annotations

import optuna
import pytest
import torch

from archspec import compile, load_spec
from archspec.families.attention.module import Attention
from archspec.io.datasets import load_data
from archspec.search._evaluation.proxy import ProxyProtocol, proxy_geometry, proxy_spec, stage_grids
from archspec.search._space.language import load_space, mask_placement_space

N_SAMPLES = 200


@pytest.fixture(scope="module")
def digits():
    return load_data(None, 64, seed=0, max_images=100)


def _samples(space, n: int, seed: int = 0):
    """``n`` specs drawn by Optuna's RandomSampler (the space's own ``sample``)."""
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    return [space.sample(study.ask()) for _ in range(n)]


def _largest_windows(spec) -> list[tuple[int, int]]:
    """The largest mask window of each stage, read from the spec's per-layer head plans."""
    out = []
    for i, _ in enumerate(spec.stages):
        windows = [(0, 0)] + [tuple(h.mask.window) for plan in spec.layer_plans(i) for h in plan.heads if h.mask]
        out.append((max(w[0] for w in windows), max(w[1] for w in windows)))
    return out


@pytest.mark.slow  # 1.5-3.4 s in the quick subset (docs/contributing.md: over a second is slow)
def test_default_space_proxies_keep_every_stage_grid(digits):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    protocol = ProxyProtocol()
    for spec in _samples(load_space(None), N_SAMPLES):
        geometry, _ = proxy_geometry(spec, digits, protocol)
        proxy = proxy_spec(spec, digits, protocol)
        assert geometry.grids == geometry.real_grids == stage_grids(spec) == stage_grids(proxy), spec.name
        assert max(geometry.image_size) <= protocol.image_size
        # the stages are the candidate's own: only the stem, input and classifier change
        assert proxy.stages == spec.stages


@pytest.mark.slow  # every point of the default space: seconds
def test_default_space_min_grid_is_at_least_the_minimum_and_the_windows(digits):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    protocol = ProxyProtocol(min_grid=7)
    for spec in _samples(load_space(None), N_SAMPLES, seed=1):
        geometry, _ = proxy_geometry(spec, digits, protocol)
        real = stage_grids(spec)
        first = geometry.grids[0]
        assert first == real[0] or min(first) >= 7, (first, real)
        for grid, real_grid, window in zip(geometry.grids, real, _largest_windows(spec)):
            assert grid[0] <= real_grid[0] and grid[1] <= real_grid[1]
            assert grid[0] >= window[0] and grid[1] >= window[1], (geometry.grids, _largest_windows(spec))
        assert proxy_spec(spec, digits, protocol).stages == spec.stages


def test_mask_placement_space_keeps_its_minimum_grid(digits):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    protocol = ProxyProtocol(min_grid=8)  # mode 2's default (archspec.search._engine.config.MASKS_PROXY_DEFAULTS)
    base = load_spec("mait_tiny_sch2")
    for spec in _samples(mask_placement_space(base), 50):
        geometry, _ = proxy_geometry(spec, digits, protocol)
        assert geometry.grids == ((8, 8),) and geometry.image_size == (64, 64)
        assert geometry.stem["patch_size"] == 8 and geometry.real_grids == ((14, 14),)


@pytest.mark.parametrize("name, size, stem, grids", [
    ("levit_128s", (56, 56), {"channels": [64, 128]}, ((14, 14), (7, 7), (4, 4))),  # 2 of 4 stride-2 convs
    ("mait_tiny_sch2", (56, 56), {"patch_size": 4}, ((14, 14),)),                  # 16 px patch -> 4 px
])
def test_real_geometry_by_hand(digits, name, size, stem, grids):
    geometry, _ = proxy_geometry(load_spec(name), digits, ProxyProtocol())
    assert geometry.image_size == size and geometry.grids == grids
    assert all(geometry.stem[k] == v for k, v in stem.items())


def test_hard_masked_head_is_local_in_the_proxy(digits):
    """A 5x5 hard mask on the proxy's 14x14 grid leaves most key patches out (it was all ones on 4x4)."""
    spec = load_spec("levit_128s").model_dump(mode="json")
    spec["stages"][0]["attention"] = {"rel_bias": {}, "mask": {"window": "5x5"}}
    model = compile(proxy_spec(load_spec(spec), digits, ProxyProtocol()))
    masked = [m for m in model.modules() if isinstance(m, Attention) and m.hard_heads]
    assert masked
    for module in masked:
        masks = module.attn_masks
        assert masks.shape[-1] == 14 * 14
        assert not bool(masks.all()), "a hard mask of all ones is no mask"
        assert masks[0].sum(-1).max().item() == 25  # a patch away from the border sees its 5x5 window
    assert torch.isfinite(model(torch.randn(2, 3, 56, 56))).all()


# ------------------------------------------------------------------ ResNet stems: hybrids and conv nets


def _token_grids(spec, grids) -> tuple:
    """The grids of the attention stages (the conv stages' are feature maps, which the proxy may shrink)."""
    return tuple(grids[spec.n_conv_stages:])


def test_grafting_space_proxies_keep_every_token_grid(digits):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    protocol = ProxyProtocol()
    cuts = set()
    for spec in _samples(load_space("levit_grafting"), 40, seed=3):
        geometry, _ = proxy_geometry(spec, digits, protocol)
        proxy = proxy_spec(spec, digits, protocol)
        assert spec.is_hybrid
        assert _token_grids(spec, geometry.grids) == _token_grids(spec, stage_grids(spec)) == ((14, 14),)
        assert stage_grids(proxy) == geometry.grids and geometry.real_grids == stage_grids(spec)
        # the input is the only knob: stem, stages and interface are the candidate's own
        assert proxy.stages == spec.stages and proxy.stem == spec.stem
        cuts.add(spec.n_conv_stages)
        # the smallest multiple of 4 x the strides that keeps the 14x14 tokens (pool none after 3 stages: 224)
        assert geometry.image_size == {1: (56, 56), 2: (112, 112), 3: (224, 224)}[spec.n_conv_stages]
    assert cuts == {1, 2, 3}


@pytest.mark.parametrize("name, size, grids", [
    ("levit_graft_r50s1_deit9", (56, 56), ((14, 14), (14, 14))),    # pooled 14x14 from a 14x14 map
    ("levit_graft_r50s2_deit6", (112, 112), ((28, 28), (14, 14), (14, 14))),
    ("levit_graft_r50s4_deit0", (64, 64), ((16, 16), (8, 8), (4, 4), (2, 2))),  # a conv net: at the cap
    ("resnet50", (64, 64), ((16, 16), (8, 8), (4, 4), (2, 2))),
])
def test_resnet_stem_geometry_by_hand(digits, name, size, grids):
    spec = load_spec(name)
    geometry, _ = proxy_geometry(spec, digits, ProxyProtocol())
    assert geometry.image_size == size and geometry.grids == grids
    assert geometry.stem == spec.stem.model_dump(mode="json")


def test_resnet_stem_min_grid_shrinks_only_unpooled_tokens(digits):
    protocol = ProxyProtocol(min_grid=7)
    unpooled, _ = proxy_geometry(load_spec("levit_graft_r50s3_deit3"), digits, protocol)  # every pixel a token
    assert unpooled.image_size == (112, 112) and unpooled.grids[-1] == (7, 7)
    pooled, _ = proxy_geometry(load_spec("levit_graft_r50s2_deit6"), digits, protocol)    # pooled to 14x14
    assert pooled.image_size == (112, 112) and pooled.grids[-1] == (14, 14)


def test_pure_resnet_proxy_is_at_the_cap_and_trains(digits):
    spec = load_spec("resnet50").model_dump(mode="json")
    spec["stages"] = [{"kind": "conv", "block": "basic", "depth": 1, "channels": c, "stride": s}
                      for c, s in ((8, 1), (16, 2))]  # small, so that the forward pass is quick
    spec["stem"] = {"kind": "resnet", "channels": 8}
    spec = load_spec(spec)
    for cap in (32, 64):
        geometry, _ = proxy_geometry(spec, digits, ProxyProtocol(image_size=cap))
        assert geometry.image_size == (cap, cap) and geometry.grids == ((cap // 4,) * 2, (cap // 8,) * 2)
    proxy = proxy_spec(spec, digits, ProxyProtocol())
    assert compile(proxy)(torch.randn(2, 3, 64, 64)).shape == (2, digits.num_classes)


def test_nat_tokenizer_keeps_its_reduction(digits):
    """NAT's tokenizer (two stride-2 convs) is kept: the input is 4 x the first grid, its real 56x56 at 224 px (the
    token grids win over the cap), 7x7 from 28 px with ``min_grid=7``; the conv downsamplers halve from there."""
    stages = [{"depth": 1, "dim": c, "heads": 2, "attention": "mhsa", **({"downsample": "conv"} if i else {})}
              for i, c in enumerate((16, 32, 64, 128))]
    spec = load_spec({"name": "nat_shaped", "stem": {"kind": "conv_tokenizer"}, "stages": stages,
                      "tokens": {"cls_token": "none", "pos_embed": "none"}, "head": {"pool": "mean"}})
    geometry, _ = proxy_geometry(spec, digits, ProxyProtocol())
    assert geometry.image_size == (224, 224) and geometry.grids == ((56, 56), (28, 28), (14, 14), (7, 7))
    small, _ = proxy_geometry(spec, digits, ProxyProtocol(min_grid=7))
    assert small.image_size == (28, 28) and small.grids == ((7, 7), (4, 4), (2, 2), (1, 1))
    assert small.stem == {"kind": "conv_tokenizer"}
