"""Hybrids: conv stages, then attention stages (LeViT sec. 3.2 grafting, Tab. 1).

Independent references: LeViT Tab. 1's parameter and MAC counts (the shipped grafting specs); the module's own
parameter count and torch's FlopCounterMode on the math backend (the analysis must equal both); a hand-written
interface (average pool, 1x1 conv, row-major flattening) for the map -> token numerics; timm's ResNet-50 for the
conv part's weights; located errors for specs that do not join.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from macs_reference import reference_macs
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from archspec import analyze, compile, load_spec
from archspec.errors import SpecError
from archspec.nn.blocks import attention_impl
from archspec.spec import SPEC_DIR

# LeViT Tab. 1: (ResNet-50 stages, DeiT-S layers) -> (params in M, conv MACs in M, transformer MACs in M)
TAB1 = {(0, 12): (22.0, 57, 4519), (1, 9): (17.1, 820, 3389), (2, 6): (13.1, 1876, 2260), (3, 3): (15.1, 3385, 1130),
        (4, 0): (25.5, 4119, 0)}
PATCH_EMBED_S = 3 * 16 * 16 * 384 + 384  # DeiT-S's patch embedding, which Tab. 1 appears to count in rows 2-4


def _small(**interface) -> dict:
    """A 64 px hybrid: ResNet stem (16 channels), one basic conv stage to 32 channels at stride 2 (8x8 map), two
    attention blocks at width 48 whose first stage takes the map through ``from_map``."""
    stage = {"depth": 2, "dim": 48, "heads": 2, "attention": "mhsa"}
    if interface:
        stage["from_map"] = interface
    return {"name": "tiny_hybrid", "input": {"channels": 3, "resolution": 64},
            "stem": {"kind": "resnet", "channels": 16},
            "tokens": {"cls_token": "input", "pos_embed": "learned"},
            "stages": [{"kind": "conv", "block": "basic", "depth": 1, "channels": 32, "stride": 2}, stage],
            "head": {"pool": "cls", "num_classes": 10}}


@pytest.mark.parametrize(("conv", "layers"), sorted(TAB1))
def test_grafting_specs_reproduce_levit_table_1(conv: int, layers: int):
    params, conv_macs, token_macs = TAB1[(conv, layers)]
    a = analyze(SPEC_DIR / f"levit_graft_r50s{conv}_deit{layers}.yaml")
    assert a.conv_macs + a.token_macs == a.macs
    assert a.conv_macs / 1e6 == pytest.approx(conv_macs, rel=0.02)
    assert a.token_macs / 1e6 == pytest.approx(token_macs, rel=0.02, abs=1e-9)
    if conv in (0, 4):  # DeiT-S and ResNet-50 themselves
        assert a.params / 1e6 == pytest.approx(params, rel=0.02)
    else:  # the attributed gap (spec headers): Tab. 1 counts DeiT-S's unused patch embedding
        assert 0.3e6 < params * 1e6 - a.params < 0.4e6
        assert (a.params + PATCH_EMBED_S) / 1e6 == pytest.approx(params, rel=0.01)


def test_hybrid_counts_equal_the_module_and_the_flop_counter():
    spec = load_spec(_small(pool="avg", grid=4))
    a = analyze(spec)
    model = compile(spec).eval()
    assert sum(p.numel() for p in model.parameters()) == a.params
    with FlopCounterMode(display=False) as counter, torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        out = model(torch.randn(1, 3, 64, 64))
    assert out.shape == (1, 10)
    assert counter.get_total_flops() // 2 == a.macs
    rows = {r.layer: r for r in a.rows}
    assert rows["interface"].grid == (4, 4) and rows["interface"].params == 32 * 48 + 48
    assert rows["embed"].tokens == 17  # 4x4 pooled tokens + the class token


def test_interface_is_avg_pool_then_1x1_conv_then_row_major_tokens():
    model = compile(_small(pool="avg", grid=4)).eval()
    x = torch.randn(2, 32, 8, 8)
    conv = model.interface.proj
    pooled = F.avg_pool2d(x, 2)  # 8x8 -> 4x4: the adaptive pool with an exact factor
    expected = torch.einsum("bchw,dc->bhwd", pooled, conv.weight[:, :, 0, 0]) + conv.bias
    torch.testing.assert_close(model.interface(x), expected.reshape(2, 16, 48), rtol=1e-5, atol=1e-6)


def test_without_pooling_every_pixel_is_a_token_and_equal_widths_need_no_projection():
    doc = _small()
    doc["stages"][1]["dim"] = 32
    model = compile(doc).eval()
    assert isinstance(model.interface.proj, torch.nn.Identity)
    x = torch.randn(1, 3, 64, 64)
    assert model.forward_features(x).shape == (1, 1 + 8 * 8, 32)


def test_hybrid_backbone_api_and_input_size():
    model = compile(_small(pool="avg", grid=4)).eval()
    assert [f["num_chs"] for f in model.feature_info] == [32, 48]
    assert [f["reduction"] for f in model.feature_info] == [8, 16]
    maps = model.forward_intermediates(torch.randn(2, 3, 64, 64), intermediates_only=True)
    assert [tuple(m.shape) for m in maps] == [(2, 32, 8, 8), (2, 48, 4, 4)]
    model.set_input_size(96)  # the pooled grid is fixed: the position embedding needs no resampling
    assert model(torch.randn(1, 3, 96, 96)).shape == (1, 10)


def test_resnet50_weights_carry_into_the_grafted_model():
    """The grafted model's conv part has the ResNet-50 spec's module names (timm's, through the converters of
    tests/test_resnet.py): its first two stages' weights load as they are and compute the same stage-2 map."""
    resnet = compile("resnet50").eval()
    graft = compile("levit_graft_r50s2_deit6").eval()
    shared = {k: v for k, v in resnet.state_dict().items() if k.startswith(("stem.", "stages.0.", "stages.1."))}
    missing, unexpected = graft.load_state_dict(shared, strict=False)
    assert not unexpected and not any(k.startswith(("stem.", "stages.0.", "stages.1.")) for k in missing)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        a = resnet.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
        b = graft.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
    assert a.shape == (1, 512, 28, 28)
    torch.testing.assert_close(a, b)


def test_hybrid_saves_and_loads(tmp_path):
    from archspec import load, save

    model = compile(_small(pool="avg", grid=4)).eval()
    save(model, tmp_path / "m")
    again = load(tmp_path / "m").eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), again(x))


@pytest.mark.parametrize(("edit", "path", "words"), [
    (lambda d: d["stages"].extend([{"kind": "conv", "block": "basic", "depth": 1, "channels": 48},
                                   {"depth": 1, "dim": 48, "heads": 2}]),
     ("stages", 3, "kind"), "second interface"),
    (lambda d: d["stages"].append({"kind": "conv", "block": "basic", "depth": 1, "channels": 48}),
     ("head", "pool"), "class and distillation tokens dropped"),
    (lambda d: d["stages"][1].update(from_map={"pool": "avg", "grid": 9}), ("stages", 1, "from_map", "grid"),
     "enlarge"),
    (lambda d: d["stages"][1].update(from_map={"proj": False}), ("stages", 1, "from_map", "proj"), "32 channels"),
    (lambda d: d["stages"][1].update(shrink={}), ("stages", 1, "shrink"), "interface"),
    (lambda d: d["stages"].pop(0), ("stem", "kind"), "after a conv stage"),
    (lambda d: d["stages"].append({"depth": 1, "dim": 48, "heads": 2, "from_map": {}}), ("stages", 2, "from_map"),
     "only to the first attention stage"),
])
def test_specs_that_do_not_join_are_refused_where_written(edit, path, words):
    doc = _small()
    edit(doc)
    with pytest.raises(SpecError) as info:
        analyze(load_spec(doc, check=False))
    problems = info.value.problems
    assert any(p.path == path and words in p.message for p in problems), [(p.path, p.message) for p in problems]


def test_pool_without_grid_is_a_schema_error_exit_2(tmp_path):
    import yaml

    doc = _small(pool="avg")
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc), encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "archspec", "validate", str(f)], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "from_map" in run.stderr + run.stdout and "grid" in run.stderr + run.stdout


# ------------------------------------------------------------------------------ conv tails (conv, attention, conv)
def _sandwich(**tail) -> dict:
    """``_small`` with a conv tail: a bottleneck stage (stride 2, 64 channels; ``tail`` adds e.g. BoTNet's
    attention mixer) after the attention stage, mean-pooled head (the class token is dropped at the map)."""
    doc = _small(pool="avg", grid=4)
    doc["stages"].append({"kind": "conv", "block": "bottleneck", "depth": 2, "channels": 64, "stride": 2, **tail})
    doc["head"]["pool"] = "mean"
    return doc


def _vit_then_conv() -> dict:
    """A patch-stem ConViT (a GPSA layer, then the class token enters before an MHSA layer) followed by a conv
    stage: no leading conv stage; the class token inserted late is dropped at the map too."""
    return {"name": "vit_conv", "input": {"channels": 3, "resolution": 32},
            "stem": {"kind": "patch", "patch_size": 4}, "tokens": {"cls_token": 1, "pos_embed": "learned"},
            "stages": [{"depth": 2, "dim": 32, "heads": 4, "attention": "mhsa", "qkv_bias": False,
                        "layers": [{"range": [0, 0], "attention": "gpsa"}]},
                       {"kind": "conv", "block": "basic", "depth": 1, "channels": 48, "stride": 2}],
            "head": {"pool": "mean", "num_classes": 10}}


@pytest.mark.parametrize("doc", [_sandwich(), _sandwich(mixer={"kind": "attention", "heads": 2}), _vit_then_conv()],
                         ids=["conv-attn-conv", "conv-attn-botnet", "vit-conv"])
def test_sandwich_counts_equal_the_module_and_the_flop_counter(doc):
    spec = load_spec(doc)
    a = analyze(spec)
    model = compile(spec).eval()
    assert sum(p.numel() for p in model.parameters()) == a.params
    x = torch.randn(1, 3, *spec.input.resolution)
    with attention_impl(model, "dense"):  # the papers' count is the dense formula's (GPSA's fast path differs)
        assert reference_macs(model, x) == a.macs
        with torch.no_grad():
            assert model(x).shape == (1, 10)
    rows = {r.layer: r for r in a.rows}
    assert rows["to_map"].params == rows["to_map"].macs == 0
    tail = spec.tail_start
    assert rows[f"stages.{tail}.blocks.0"].dim == spec.stages[tail].channels
    # LeViT Tab. 1's split: the tail's conv stages and ResNet head are conv MACs
    assert a.conv_macs == sum(r.macs for r in a.rows if not r.layer.startswith(("embed", f"stages.{tail - 1}.")))


def test_tokens_become_the_map_row_major_without_the_class_token():
    """The sandwich's forward equals a hand composition: the tokens after the attention stage, class token
    dropped, reshaped row-major to (B, C, 4, 4), then the tail's blocks, the mean and the classifier."""
    model = compile(_sandwich()).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        tokens = model.stages[0].blocks[0](model.stem(x))
        tokens = model._prefix(model.interface(tokens)) + model.pos_embed
        for block in model.stages[1].blocks:
            tokens = block(tokens)
        assert tokens.shape == (2, 1 + 16, 48)
        fmap = torch.stack([tokens[:, 1 + r * 4:1 + (r + 1) * 4].transpose(1, 2) for r in range(4)], dim=2)
        torch.testing.assert_close(model.to_map(tokens, (4, 4)), fmap)
        for block in model.stages[2].blocks:
            fmap = block(fmap)
        assert model.forward_features(x).shape == (2, 64, 2, 2)
        torch.testing.assert_close(model(x), model.head(fmap.mean(dim=(2, 3))), rtol=1e-5, atol=1e-6)


def test_sandwich_backbone_api_input_size_and_save(tmp_path):
    from archspec import load, save

    model = compile(_sandwich()).eval()
    assert [f["num_chs"] for f in model.feature_info] == [32, 48, 64]
    assert [f["reduction"] for f in model.feature_info] == [8, 16, 32]
    maps = model.forward_intermediates(torch.randn(2, 3, 64, 64), intermediates_only=True)
    assert [tuple(m.shape) for m in maps] == [(2, 32, 8, 8), (2, 48, 4, 4), (2, 64, 2, 2)]
    with pytest.raises(ValueError, match="conv tail drops it"):
        model.reset_classifier(10, "token")
    save(model, tmp_path / "m")
    again = load(tmp_path / "m").eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), again(x))
    vit = compile(_vit_then_conv()).eval()  # the to_map grid follows the input size (8x8 -> 12x12 tokens)
    vit.set_input_size(48)
    assert vit.forward_features(torch.randn(1, 3, 48, 48)).shape == (1, 48, 6, 6)


@pytest.mark.parametrize(("edit", "path", "words"), [
    (lambda d: d["head"].update(distillation=True), ("head", "distillation"), "no token to read"),
    (lambda d: d.update(class_attention={"depth": 1}), ("class_attention",), "needs tokens after the last stage"),
    (lambda d: d["tokens"].update(cls_token=2), ("tokens", "cls_token"), "dropped at once"),
    (lambda d: d["stages"].append({"depth": 1, "dim": 64, "heads": 2}), ("stages", 3, "kind"),
     "second interface"),
])
def test_conv_tail_refusals_are_located(edit, path, words):
    doc = _sandwich()
    edit(doc)
    with pytest.raises(SpecError) as info:
        analyze(load_spec(doc, check=False))
    problems = info.value.problems
    assert any(p.path == path and words in p.message for p in problems), [(p.path, p.message) for p in problems]
