"""Property: every spec that validates compiles, runs forward and backward, and has ``analyze()``'s parameter count.

A Hypothesis strategy draws valid spec dicts across every option of the spec language: stems
(patch, conv, identity), tokens (class token at the input / none / inserted before a later block,
distillation token, position embedding), stages (layernorm / batchnorm, shrinking attention,
head_dim / key_dim / attn_ratio, mlp_ratio, layer scale, drop path, per-layer overrides with
per-head lists, conv mixers) and every head kind (MHSA, GPSA with its options, LeViT and signed
biases, hard / soft / strict masks with windows, and their compositions).  The strategy tracks the
token grid and the tokens present, so that draws are valid except for deliberate edge values
(widths that round to 0, mixed GPSA gating) that validation must refuse; refused draws are
``assume``-d away (measured: about 10% of 400 draws, all from those edges).  Small dims, at most 4
blocks, grids up to 6x6, batch 2: each example takes tens of milliseconds, 200 examples ~10 s.  A second
strategy draws conv nets and hybrids (ResNet stems, conv stages with SE and T-CNN's GPSA, then an attention
stage taking the map through ``from_map``) and holds their MACs to torch's FlopCounterMode exactly.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from archspec import analyze, compile, load_spec
from archspec.errors import SpecError

WINDOW_MODES = ("hard", "soft", "strict")
# Edge values validation must refuse (widths that round to 0, mixed GPSA gating), drawn now and then:
# a spec that draws one must fail validation or build correctly -- never crash.
EDGE = st.sampled_from([False] * 15 + [True])
MLP_RATIOS = st.sampled_from([0.5, 1.0, 2.0, 4.0] * 5 + [0.01])
SHRINK_RATIOS = st.sampled_from([0.5, 1.0, 2.0] * 7 + [0.01])


@st.composite
def head_kinds(draw, grid: tuple[int, int], gpsa_ok: bool) -> dict | str:
    """One head: a shorthand or a mapping composing GPSA, a relative bias and a mask that fits ``grid``."""
    shorthands = ["mhsa", "levit_bias", "signed_bias"] + (["mask", "soft_mask", "strict_mask", {"mask": {"depth": 1}}]
                                                          if min(grid) >= 3 else [])
    if draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(shorthands))
    head: dict = {}
    if gpsa_ok and draw(st.booleans()):
        head["gpsa"] = {"gating_init": draw(st.sampled_from([-1.0, 0.0, 1.0])),
                        "locality_strength": draw(st.sampled_from([0.5, 1.0, 3.0])),
                        "conv_init": draw(st.booleans()), "gating_trainable": draw(st.booleans())}
    if draw(st.booleans()):
        head["rel_bias"] = {"table": draw(st.sampled_from(["absolute", "signed"]))}
    if draw(st.booleans()):
        rows = draw(st.sampled_from([s for s in (1, 3, 5) if s <= grid[0]]))
        cols = draw(st.sampled_from([s for s in (1, 3, 5) if s <= grid[1]]))
        head["mask"] = {"window": f"{rows}x{cols}", "mode": draw(st.sampled_from(WINDOW_MODES)),
                        "alpha_init": draw(st.sampled_from([0.1, 0.5, 0.9]))}
    if not head:
        return draw(st.sampled_from(["mhsa", {}]))
    return head


def _fix_uniform(head: dict | str, n_heads: int) -> dict | str:
    """A head kind given to all ``n_heads`` heads of a layer: conv init only for a square number of heads."""
    if isinstance(head, dict) and "gpsa" in head and math.isqrt(n_heads) ** 2 != n_heads:
        head["gpsa"]["conv_init"] = False
    return head


def _fix_gpsa_layer(heads: list, mixed_gating: bool = False) -> list:
    """ConViT's constraints on one layer: conv-initialised GPSA heads form a square; one gating mode
    (unless ``mixed_gating``: an edge case validation must refuse)."""
    gpsa = [h for h in heads if isinstance(h, dict) and "gpsa" in h]
    conv = [h for h in gpsa if h["gpsa"]["conv_init"]]
    keep = math.isqrt(len(conv)) ** 2
    for h in conv[keep:]:
        h["gpsa"]["conv_init"] = False
    for h in gpsa if not mixed_gating else []:
        h["gpsa"]["gating_trainable"] = gpsa[0]["gpsa"]["gating_trainable"]
    return heads


@st.composite
def stems(draw) -> tuple[dict, dict, tuple[int, int], int | None]:
    """(input, stem, token grid, forced stage-0 dim or None)."""
    kind = draw(st.sampled_from(["patch", "conv", "identity"]))
    channels = draw(st.sampled_from([1, 3]))
    # grid sides 2-6, and at least 8 px (InputSpec's minimum) per side
    p = (draw(st.sampled_from([2, 4, 8] if kind == "patch" else [2, 4])) if kind != "conv"
         else 2 ** draw(st.integers(1, 3)))
    rows, cols = (draw(st.integers(max(2, -(-9 // p)), 6)) for _ in range(2))
    if kind == "patch":
        return ({"channels": channels, "resolution": [rows * p, cols * p]}, {"kind": "patch", "patch_size": p},
                (rows, cols), None)
    if kind == "identity":  # token width C P^2 must reach 8
        p = 4 if channels == 1 else p
        rows, cols = max(rows, -(-9 // p)), max(cols, -(-9 // p))
        return ({"channels": channels, "resolution": [rows * p, cols * p]}, {"kind": "identity", "patch_size": p},
                (rows, cols), channels * p * p)
    n_conv = p.bit_length() - 1
    grid = (rows, cols)
    res = [rows * p - draw(st.integers(0, 1)), cols * p]  # an odd side rounds up, as a stride-2 conv does
    return ({"channels": channels, "resolution": res},
            {"kind": "conv",
             "channels": draw(st.lists(st.sampled_from([4, 8]), min_size=n_conv - 1, max_size=n_conv - 1)),
             "activation": draw(st.sampled_from(["hardswish", "gelu", "relu"]))}, grid, None)


@st.composite
def specs(draw) -> dict:
    """A spec dict that should validate (see the module docstring)."""
    inp, stem, grid, forced_dim = draw(stems())
    n_stages = draw(st.integers(1, 3))
    depths = [draw(st.integers(1, 4 - n_stages + 1 if i == 0 else 1)) for i in range(n_stages)]
    total = sum(depths)
    starts = [sum(depths[:i]) for i in range(n_stages)]
    shrinks = [i > 0 and draw(st.booleans()) for i in range(n_stages)]
    # the class token may enter only where no later shrink or conv mixer sees it; GPSA only before it
    last_shrink_start = max([starts[i] for i in range(n_stages) if shrinks[i]], default=0)
    cls = draw(st.sampled_from(["none", "input", "later"]))
    if cls == "input" and last_shrink_start > 0:
        cls = "none"
    cls_at = {"none": None, "input": 0}.get(cls, None)
    if cls == "later":
        cls_at = draw(st.integers(max(1, last_shrink_start), total))
    dist = cls_at is not None and draw(st.booleans())
    pool = "cls" if cls_at is not None and draw(st.booleans()) else "mean"
    tokens = {"cls_token": "none" if cls_at is None else ("input" if cls_at == 0 else cls_at), "dist_token": dist,
              "pos_embed": draw(st.sampled_from(["learned", "none"]))}
    head = {"pool": pool, "num_classes": draw(st.sampled_from([0, 5])), "distillation": dist or draw(st.booleans())}
    if head["distillation"] and pool == "cls" and not dist:
        head["pool"] = "mean"

    stages, dim = [], forced_dim
    for i in range(n_stages):
        stage: dict = {"depth": depths[i]}
        if shrinks[i]:
            key_dim = draw(st.sampled_from([4, 8]))
            stage["shrink"] = {"key_dim": key_dim, "attn_ratio": draw(SHRINK_RATIOS), "mlp_ratio": draw(SHRINK_RATIOS),
                               **draw(st.sampled_from([{}, {"heads": 3}]))}
            grid = ((grid[0] - 1) // 2 + 1, (grid[1] - 1) // 2 + 1)
            dim = None
        stage.update(draw(_stage_body(dim, grid, starts[i], cls_at)))
        if i == 0 and stem["kind"] == "conv":
            stem["channels"] = stem["channels"] + [stage["dim"]]
        dim = stage["dim"]
        stages.append(stage)
    return {"name": "prop", "seed": draw(st.integers(0, 3)), "input": inp, "stem": stem, "tokens": tokens,
            "stages": stages, "head": head}


@st.composite
def _stage_body(draw, dim: int | None, grid: tuple[int, int], start: int, cls_at: int | None) -> dict:
    heads = draw(st.integers(1, 4))
    body: dict = {"heads": heads, "norm": draw(st.sampled_from(["layernorm", "batchnorm"])),
                  "act": draw(st.sampled_from(["gelu", "hardswish", "relu"])), "qkv_bias": draw(st.booleans()),
                  "mlp_ratio": draw(MLP_RATIOS)}
    if dim is None:  # dim >= 8 (StageSpec's minimum)
        dim = heads * draw(st.sampled_from([w for w in (2, 4, 8) if heads * w >= 8]))
    body["dim"] = dim
    dims = draw(st.sampled_from(["default", "head_dim", "key_dim"]))
    if dims == "head_dim" or (dims == "default" and dim % heads):
        body["head_dim"] = draw(st.sampled_from([2, 4, 8, dim]))
    elif dims == "key_dim":
        body["key_dim"] = draw(st.sampled_from([2, 4, 8]))
        body["attn_ratio"] = draw(SHRINK_RATIOS)
        if dim % heads:
            body["head_dim"] = 4
    if body["norm"] == "layernorm":
        body["layer_scale"] = draw(st.sampled_from([None, 0.1]))
        body["norm_eps"] = draw(st.sampled_from([1e-6, 1e-5]))
    body["drop_path"] = draw(st.sampled_from([0.0, 0.1, [0.0, 0.2]]))
    def gpsa_ok(layer: int) -> bool:
        return cls_at is None or start + layer < cls_at

    def prefix(layer: int) -> bool:
        return cls_at is not None and start + layer >= cls_at

    body["attention"] = draw(head_kinds(grid, gpsa_ok(0) and gpsa_ok(3)))  # default for layers not overridden
    layers = []
    if draw(st.booleans()):
        layer = draw(st.integers(0, 3))
        kind = draw(st.sampled_from(["heads", "attention", "mixer"]))
        if kind == "heads":
            layers.append({"range": layer, "heads": _fix_gpsa_layer(
                [draw(head_kinds(grid, gpsa_ok(layer))) for _ in range(heads)], mixed_gating=draw(EDGE))})
        elif kind == "attention":
            layers.append({"range": f"{layer}-{layer}",
                           "attention": _fix_uniform(draw(head_kinds(grid, gpsa_ok(layer))), heads)})
        elif not prefix(layer):
            kernel = draw(st.sampled_from([k for k in (1, 3, 5) if k <= 2 * max(grid) + 1]))
            layers.append({"range": [layer, layer], "mixer": f"token_conv{kernel}"})
    body["layers"] = layers
    if cls_at is None and draw(EDGE):  # a whole stage of conv mixers (CMHSA phase 1)
        body["mixer"] = draw(st.sampled_from([f"token_conv{k}" for k in (1, 3, 5) if k <= 2 * max(grid) + 1]))
    body["attention"] = _fix_uniform(body["attention"], heads)
    return body


def _clip_layers(doc: dict) -> dict:
    """Drop overrides past a stage's depth (the strategy draws layer indices before depths are final)."""
    for stage in doc["stages"]:
        stage["layers"] = [o for o in stage["layers"] if _first(o["range"]) < stage["depth"]]
    return doc


def _first(rng) -> int:
    return rng[0] if isinstance(rng, list) else int(str(rng).split("-")[0])


@pytest.fixture(scope="module", autouse=True)
def _tiny_models_on_one_thread(one_thread_module):
    yield


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
@pytest.mark.slow
def test_every_valid_spec_compiles_runs_and_counts(doc):
    doc = _clip_layers(doc)
    try:
        spec = load_spec(doc)
    except SpecError:
        assume(False)
    analysis = analyze(spec)
    model = compile(spec)
    assert sum(p.numel() for p in model.parameters()) == analysis.params
    h, w = spec.input.resolution
    x = torch.randn(2, spec.input.channels, h, w)
    out = model.train()(x)
    out = out[0] if isinstance(out, tuple) else out
    assert out.shape == (2, spec.head.num_classes or spec.stages[-1].dim)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    with torch.inference_mode():
        assert torch.isfinite(model.eval()(x)).all()


@st.composite
def conv_and_hybrid_specs(draw) -> dict:
    """A conv net or a hybrid that should validate: a ResNet stem (7x7, deep or tiered, max-pool or strided conv),
    1-2 conv stages (:func:`_conv_stage`: SE, T-CNN's GPSA, BoTNet attention or ResNeXt groups in bottlenecks),
    then, for a hybrid, an attention stage taking the map through ``from_map`` (pooled to a grid no larger than
    the map, or every pixel a token; projected when the widths differ) with or without a class token, and
    possibly a conv tail (conv, attention, conv)."""
    side = draw(st.sampled_from([24, 32, 33, 40]))
    grid = ((side - 1) // 4 + 1,) * 2  # the ResNet stem divides by 4 (rounding up)
    stem = {"kind": "resnet", "channels": draw(st.sampled_from([4, 8])), "deep": draw(st.booleans()),
            "pool": draw(st.sampled_from(["max", "conv"]))}
    if stem["deep"] and draw(st.booleans()):  # timm's tiered stem: two different first widths
        stem["widths"] = draw(st.sampled_from([[4, 6], [6, 4], [3, 8]]))
    stages = []
    for _ in range(draw(st.integers(1, 2))):
        stages.append(draw(_conv_stage(grid)))
        grid = ((grid[0] - 1) // stages[-1]["stride"] + 1, (grid[1] - 1) // stages[-1]["stride"] + 1)
    if not draw(st.booleans()):
        return {"name": "prop_conv", "input": {"channels": 3, "resolution": side}, "stem": stem,
                "tokens": {"cls_token": "none", "pos_embed": "none"}, "stages": stages,
                "head": {"pool": "mean", "num_classes": draw(st.sampled_from([0, 5]))}}
    heads = draw(st.integers(1, 2))
    attention = {"depth": draw(st.integers(1, 2)), "dim": draw(st.sampled_from([8, 16])) * heads, "heads": heads,
                 "attention": draw(st.sampled_from(["mhsa", "levit_bias", "mask:3x3"])) if min(grid) >= 3 else "mhsa"}
    if draw(st.booleans()) and min(grid) >= 2:
        attention["from_map"] = {"pool": "avg", "grid": draw(st.integers(1, min(grid)))}
        if min(attention["from_map"]["grid"], 3) < 3:
            attention["attention"] = "mhsa"  # a 3x3 mask needs a grid of at least 3x3
    cls, pos = draw(st.booleans()), draw(st.sampled_from(["learned", "none"]))
    tail = []
    if draw(st.booleans()):  # a conv tail: the tokens (class token dropped) become a map again
        token_grid = (attention["from_map"]["grid"],) * 2 if "from_map" in attention else grid
        tail = [draw(_conv_stage(token_grid))]
    return {"name": "prop_hybrid", "input": {"channels": 3, "resolution": side}, "stem": stem,
            "tokens": {"cls_token": "input" if cls else "none", "pos_embed": pos},
            "stages": stages + [attention] + tail,
            "head": {"pool": "cls" if cls and not tail else "mean", "num_classes": 5}}


@st.composite
def _conv_stage(draw, grid: tuple[int, int]) -> dict:
    """A conv stage on a ``grid`` map: basic / bottleneck, stride 1 / 2, conv or avg shortcut, SE, and in bottlenecks
    T-CNN's GPSA, BoTNet's attention (any head kind on the pixels; strided only on even maps) or ResNeXt groups."""
    block = draw(st.sampled_from(["basic", "bottleneck"]))
    stride = draw(st.sampled_from([1, 2])) if min(grid) >= 2 else 1
    stage = {"kind": "conv", "block": block, "depth": draw(st.integers(1, 2)),
             "channels": draw(st.sampled_from([8, 12, 16])), "stride": stride,
             "downsample": draw(st.sampled_from(["conv", "avg"]))}
    if draw(st.booleans()):
        stage["se"] = {"rd_ratio": 0.25, "rd_divisor": 4}
    if block == "bottleneck":
        extra = draw(st.sampled_from(["none", "gpsa", "attention", "groups"]))
        if extra == "gpsa":
            stage["mixer"] = {"kind": "gpsa", "locality_strength": draw(st.sampled_from([0.5, 1.0, 3.0]))}
        elif extra == "attention" and (stride == 1 or (grid[0] % 2 == 0 and grid[1] % 2 == 0)):
            planes = stage["channels"] // 4
            heads = draw(st.sampled_from([h for h in (1, 2) if planes % h == 0]))
            kinds = ["botnet_rel", "mhsa", "levit_bias"] + (["mask:3x3"] if min(grid) >= 3 else [])
            stage["mixer"] = {"kind": "attention", "heads": heads, "attention": draw(st.sampled_from(kinds))}
            if stage["depth"] == 2 and draw(st.booleans()):
                stage["mixer"]["layers"] = [1]  # attention in the last block only (botnet26t's c4)
        elif extra == "groups":
            stage["groups"], stage["base_width"] = draw(st.sampled_from([(2, 64), (2, 32), (4, 16)]))
    return stage


@settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_and_hybrid_specs())
@pytest.mark.slow
def test_every_conv_net_and_hybrid_counts_what_runs(doc):
    """Conv nets and hybrids: they validate, their parameters are the module's, their MACs are what torch's
    FlopCounterMode counts (tests/macs_reference.py), and forward / backward are finite."""
    from macs_reference import reference_macs

    spec = load_spec(doc)
    analysis = analyze(spec)
    model = compile(spec).eval()
    assert sum(p.numel() for p in model.parameters()) == analysis.params
    h, w = spec.input.resolution
    assert reference_macs(model, torch.randn(1, 3, h, w)) == analysis.macs
    x = torch.randn(2, 3, h, w)
    out = model.train()(x)
    assert out.shape == (2, spec.head.num_classes or spec.stages[-1].dim) and torch.isfinite(out).all()
    out.square().mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
