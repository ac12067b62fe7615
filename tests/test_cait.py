"""CaiT and Masked CaiT (MaiT Tab. 4): timm parity of specs/cait_xxs24.yaml, the two block families
(talking heads, class attention) against timm's modules and their own count rules, where the mask sits,
the spec checks, the memory estimate, and the import order spec -> graph -> checked."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import timm
import torch
from macs_reference import reference_macs
from timm.models.cait import LayerScaleBlockClassAttn
from timm.models.cait import TalkingHeadAttn as TimmTalkingHeadAttn

import archspec
from archspec import analyze, load_spec
from archspec.errors import SpecError, format_path
from archspec.families.attention.heads import HeadSpec
from archspec.families.attention.mask_terms import window_mask
from archspec.families.class_attention import rules as class_attention_rules
from archspec.families.class_attention.module import ClassAttentionBlock
from archspec.families.talking_heads import rules as talking_heads_rules
from archspec.families.talking_heads.module import TalkingHeadAttn
from archspec.ir.graph import build_graph
from archspec.timm_bridge.convert import from_timm, load_timm_weights, to_timm

CAIT_XXS24_PARAMS = 11_956_264  # timm cait_xxs24_224, pretrained=False (the figure)
ROOT = Path(__file__).resolve().parent.parent

# A tiny CaiT: 32 px, 8 px patches (a 4x4 grid), 2 talking-heads blocks with masked heads, 1 class-attention block.
TINY_CAIT = {
    "name": "tiny_cait", "input": {"channels": 3, "resolution": 32}, "stem": {"kind": "patch", "patch_size": 8},
    "tokens": {"cls_token": 2, "pos_embed": "learned"},
    "stages": [{"depth": 2, "dim": 32, "heads": 4, "layer_scale": 1e-5, "talking_heads": True, "attention": "mhsa",
                "layers": [{"range": "0-1", "heads": ["mask:3x3", "mhsa", "soft_mask", "strict_mask"]}]}],
    "class_attention": {"depth": 1},
    "head": {"num_classes": 10},
}


def _randomise_gammas(model: torch.nn.Module, seed: int) -> None:
    """LayerScale starts at 1e-5: give it O(0.1) values so every block really shapes the logits."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "gamma" in name:
            p.data.copy_(torch.rand(p.shape, generator=g) * 0.5 + 0.1)


@pytest.fixture(scope="module")
def timm_cait() -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("cait_xxs24_224", pretrained=False)
    _randomise_gammas(model, 1)
    return model.eval()


@pytest.mark.slow
def test_cait_xxs24_parameter_count_equals_timm(timm_cait):
    assert sum(p.numel() for p in timm_cait.parameters()) == CAIT_XXS24_PARAMS
    assert build_graph(load_spec("cait_xxs24")).graph["params"] == CAIT_XXS24_PARAMS
    # a hard mask has no parameter: Masked CaiT has the same count (MaiT Tab. 4: 12M for both)
    assert build_graph(load_spec("masked_cait_xxs24")).graph["params"] == CAIT_XXS24_PARAMS


@pytest.mark.slow
def test_cait_xxs24_macs_equal_timm_flop_counter(timm_cait, one_thread):
    """Static MACs of both specs = the FLOP counter on timm's model / 2 (2.52 G; MaiT Tab. 4: 2.5 GFLOPs).

    timm's Cait trips torch's FlopCounterMode module tracker ("Expected gradient function to be set")
    while its parameters require grad, so they are frozen for the count.
    """
    reference = timm.create_model("cait_xxs24_224", pretrained=False).eval().requires_grad_(False)
    timm_macs = reference_macs(reference, torch.randn(1, 3, 224, 224))
    assert build_graph(load_spec("cait_xxs24")).graph["macs"] == timm_macs == 2_523_475_200
    assert build_graph(load_spec("masked_cait_xxs24")).graph["macs"] == timm_macs  # masks cost no MACs


@pytest.mark.parametrize("name", ["cait_xxs24", "masked_cait_xxs24"])
def test_cait_specs_match_mait_table4(name):
    """MaiT Tab. 4: CaiT-T and Masked CaiT, 26 layers, 12M params, 2.5 GFLOPs (= MACs)."""
    graph = build_graph(load_spec(name))
    layers = [n for n in graph.graph["order"] if graph.nodes[n]["kind"] in ("block", "class_attn")]
    assert len(layers) == 26
    assert round(graph.graph["params"] / 1e6) == 12 and round(graph.graph["macs"] / 1e9, 1) == 2.5


@pytest.mark.slow
def test_cait_xxs24_timm_weights_give_timm_logits_and_convert_back(timm_cait, real_images, one_thread):
    """timm -> archspec: logits to 1e-5 on real photos; archspec -> timm: the exact state dict back."""
    model = archspec.compile("cait_xxs24")
    load_timm_weights(model, timm_cait)
    model.eval()
    with torch.no_grad():
        expected, got = timm_cait(real_images), model(real_images)
    assert got.shape == expected.shape == (3, 1000)
    assert (got - expected).abs().max().item() <= 1e-5
    assert expected.std() > 1e-3
    back = to_timm(model, timm_cait)
    original = timm_cait.state_dict()
    assert back.keys() == original.keys()
    assert all(torch.equal(back[k], original[k]) for k in original)


def test_archspec_cait_weights_give_same_logits_in_timm(one_thread):
    """archspec -> timm on a tiny CaiT (no masks: timm has none), logits to 1e-5; and back again."""
    doc = {**TINY_CAIT, "stages": [{**TINY_CAIT["stages"][0], "layers": []}]}
    model = archspec.compile(doc)
    _randomise_gammas(model, 2)
    model.eval()
    reference = timm.create_model("cait_xxs24_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32,
                                  depth=2, num_heads=4, depth_token_only=1, num_classes=10).eval()
    reference.load_state_dict(to_timm(model, reference), strict=True)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (model(x) - reference(x)).abs().max().item() <= 1e-5
    again = archspec.compile(doc)
    again.load_state_dict(from_timm(reference.state_dict(), again), strict=True)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))


def test_talking_heads_module_equals_timm():
    torch.manual_seed(0)
    ours = TalkingHeadAttn(24, ["mhsa"] * 3, (3, 4), num_prefix_tokens=1)
    ref = TimmTalkingHeadAttn(24, num_heads=3, qkv_bias=True)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 13, 24)
    assert torch.allclose(ours(x), ref(x), atol=1e-6)


def test_class_attention_block_equals_timm():
    torch.manual_seed(0)
    ours = ClassAttentionBlock(24, 3, layer_scale=0.3)
    ref = LayerScaleBlockClassAttn(24, 3, qkv_bias=True, norm_layer=partial(torch.nn.LayerNorm, eps=1e-6),
                                   init_values=0.3)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(2, 1 + 12, 24)
    out = ours(x)
    assert torch.equal(out[:, 1:], x[:, 1:])  # patches pass through unchanged
    assert torch.allclose(out[:, :1], ref(x[:, 1:], x[:, :1]), atol=1e-6)


@pytest.mark.parametrize("heads, qkv_bias", [(["mhsa"] * 4, True), (["mask", "soft_mask", "mhsa", "soft_mask"], False)])
def test_talking_heads_count_rule_matches_module(heads, qkv_bias):
    module = TalkingHeadAttn(32, heads, (3, 5), num_prefix_tokens=1, qkv_bias=qkv_bias)
    specs = [HeadSpec.model_validate(h) for h in heads]
    params, macs = talking_heads_rules.counts(talking_heads_rules.TalkingHeadsShape(32, tuple(specs), (3, 5), 1,
                                                                                    qkv_bias))
    assert params == sum(p.numel() for p in module.parameters())
    assert macs == reference_macs(module, torch.randn(1, 16, 32))


@pytest.mark.parametrize("layer_scale", [1e-5, None])
def test_class_attention_count_rule_matches_module(layer_scale):
    module = ClassAttentionBlock(32, 4, mlp_ratio=3.0, layer_scale=layer_scale)
    params, macs = class_attention_rules.counts(
        class_attention_rules.ClassAttentionShape(32, 4, 17, 3.0, True, layer_scale))
    assert params == sum(p.numel() for p in module.parameters())
    assert macs == reference_macs(module, torch.randn(1, 17, 32))


def test_mask_acts_after_proj_l_before_the_softmax():
    """A hard-masked head's off-window logits are exactly 0 *after* proj_l mixes the heads, so its
    off-window probabilities are equal within a row (they would differ if the mask came before proj_l)."""
    torch.manual_seed(0)
    attn = TalkingHeadAttn(16, ["mask:3x3", "mhsa"], (4, 4))
    torch.nn.init.normal_(attn.qkv.weight, std=1.0)
    torch.nn.init.normal_(attn.proj_l.weight, std=1.0)
    torch.nn.init.normal_(attn.proj_l.bias, std=1.0)
    probs = attn.get_attention(torch.randn(1, 16, 16))[0, 0]  # (N, N) of the masked head
    off = ~window_mask((4, 4), (3, 3))
    for row in range(16):
        values = probs[row][off[row]]
        assert torch.allclose(values, values[0].expand_as(values))
    assert probs.sum(-1).allclose(torch.ones(16))
    # strict: the masked head puts no weight outside its window
    strict = TalkingHeadAttn(16, ["strict_mask:3x3", "mhsa"], (4, 4))
    probs = strict.get_attention(torch.randn(1, 16, 16))[0, 0]
    assert probs[off].abs().max() == 0


def test_masked_cait_builds_with_one_masked_head_in_every_self_attention_layer(one_thread):
    graph = build_graph(load_spec("masked_cait_xxs24"))
    blocks = [graph.nodes[n] for n in graph.graph["order"] if graph.nodes[n]["kind"] == "block"]
    assert len(blocks) == 24 and all(b["heads"] == "M A A A" and b["label"] == "talking" for b in blocks)
    class_blocks = [graph.nodes[n] for n in graph.graph["order"] if graph.nodes[n]["kind"] == "class_attn"]
    assert [b["name"] for b in class_blocks] == ["stages.1.blocks.0", "stages.1.blocks.1"]
    model = archspec.compile(TINY_CAIT).eval()
    assert sum(p.numel() for p in model.parameters()) == analyze(load_spec(TINY_CAIT)).params
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


@pytest.mark.parametrize("change, where, text", [
    ({"tokens": {"cls_token": "input"}}, "class_attention", "tokens.cls_token: 2"),
    ({"stages": [{**TINY_CAIT["stages"][0], "layers": [{"range": "0-1", "attention": "gpsa"}]}]},
     "stages[0].talking_heads", "mhsa, mask"),
    ({"stages": [{**TINY_CAIT["stages"][0], "head_dim": 16}]}, "stages[0].talking_heads", "head_dim"),
    ({"class_attention": {"heads": 3}}, "class_attention.heads", "divisible"),
])
def test_spec_mistakes_are_located_problems(change, where, text):
    with pytest.raises(SpecError) as info:
        load_spec({**TINY_CAIT, **change})
    assert any(format_path(p.path) == where and text in f"{p.message} {p.hint}" for p in info.value.problems), \
        [(format_path(p.path), p.message, p.hint) for p in info.value.problems]


@pytest.mark.parametrize("head, kinds", [
    ("mhsa", set()), ("mask", {"mask"}), ("soft_mask", {"mask"}), ("gpsa", {"gpsa"}), ("levit_bias", {"rel_bias"}),
    ("gauss_mask", {"gauss_mask"}), ("botnet_rel", {"rel_logits"}),
    ({"gauss_mask": {}, "mask": {}}, {"gauss_mask", "mask"}),
])
def test_talking_heads_take_plain_and_masked_heads_by_their_kinds(head, kinds):
    """HeadSpec.kinds names a head's kinds; talking heads take those in HEAD_KINDS (masks) only, every other kind
    refused by the stage rule and by the module with their messages (a kind added later is refused until taken)."""
    spec = HeadSpec.model_validate(head)
    assert spec.kinds == kinds and spec.is_plain == (not kinds)
    problems = talking_heads_rules.stage_problems("layernorm", None, None, None, [HeadSpec(), spec], ("at",))
    if kinds <= {"mask"}:
        assert problems == []
        TalkingHeadAttn(32, ["mhsa", spec], (2, 2))
        return
    assert problems == [(("at",), "talking-heads attention takes plain (mhsa) and masked heads only, got head kinds "
                         f"{spec.letter}", "use mhsa, mask, soft_mask or strict_mask heads in this stage")]
    with pytest.raises(ValueError, match=f"supports plain and masked heads only; head 1 is '{spec.letter}'"):
        TalkingHeadAttn(32, ["mhsa", spec], (2, 2))


def test_yaml_mistake_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    text = (ROOT / "specs" / "cait_xxs24.yaml").read_text().replace("cls_token: 24", "cls_token: 23")
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(str(path))
    (problem,) = info.value.problems
    assert problem.file == str(path) and problem.line == text.splitlines().index(
        next(line for line in text.splitlines() if line.startswith("class_attention"))) + 1


@pytest.mark.parametrize("name", ["cait_xxs24", "masked_cait_xxs24"])
def test_memory_estimate_is_conservative_and_close(name, one_thread):
    """4 self-attention blocks at 224 px (the masked one with hard, soft and strict heads) + 2 class-attention."""
    from test_memory import measured_inference_peak

    doc = load_spec(name).model_dump(mode="json")
    doc["stages"][0]["depth"], doc["tokens"]["cls_token"] = 4, 4
    if doc["stages"][0]["layers"]:
        doc["stages"][0]["layers"] = [{"range": "0-1", "heads": ["mask:3x3", "mhsa", "mhsa", "mhsa"]},
                                      {"range": "2-3", "heads": ["soft_mask", "strict_mask", "mhsa", "mhsa"]}]
    spec = load_spec(doc)
    estimate, measured = analyze(spec).peak_activation_bytes, measured_inference_peak(spec)
    assert measured <= estimate <= 3 * measured, (estimate, measured)


@pytest.mark.parametrize("n, dim, heads", [(197, 192, 4), (1025, 64, 2)])
def test_class_attention_memory_rule_is_conservative_and_close(n, dim, heads, one_thread):
    """The class-attention block's own rule against the bytes a TorchDispatchMode sees alive at once."""
    from test_memory import LiveBytes


    block = ClassAttentionBlock(dim, heads).eval()
    x = torch.randn(1, n, dim)
    with torch.inference_mode():
        with LiveBytes() as live:
            live.count(x.nbytes)
            block(x)
    shape = class_attention_rules.ClassAttentionShape(dim, heads, n, 4.0, True, 1e-5)
    estimate = class_attention_rules.memory(shape).act
    assert live.peak <= estimate <= 3 * live.peak, (estimate, live.peak)


# ------------------------------------------------------------------- timm backbone API on a class-attention model
@pytest.mark.slow
def test_layer_decay_matches_timm_cait(timm_cait, one_thread):
    """timm's layer decay gives every parameter of specs/cait_xxs24 the scale it gives timm's own Cait."""
    from timm.optim import create_optimizer_v2

    ours, theirs = archspec.compile("cait_xxs24"), timm_cait

    def scales(model):
        opt = create_optimizer_v2(model, "sgd", lr=1.0, weight_decay=0.0, layer_decay=0.75)
        by_id = {id(p): g["lr_scale"] for g in opt.param_groups for p in g["params"]}
        return {name: by_id[id(p)] for name, p in model.named_parameters()}

    ours_by_name, theirs_by_name = scales(ours), scales(theirs)
    params = dict(theirs.named_parameters())
    converted = from_timm({k: params[k] for k in params}, ours)  # our name -> the same timm tensor
    timm_name = {id(v): k for k, v in params.items()}
    mapped = {ours_name: timm_name[id(t)] for ours_name, t in converted.items() if id(t) in timm_name}
    assert len(mapped) == len(ours_by_name)
    assert {n: ours_by_name[n] for n in mapped} == pytest.approx({n: theirs_by_name[mapped[n]] for n in mapped})


def test_masked_cait_backbone_and_new_input_size(one_thread):
    model = archspec.compile(TINY_CAIT).eval()
    x = torch.randn(2, 3, 32, 32)
    features = model.forward_intermediates(x, intermediates_only=True)
    assert len(features) == len(model.feature_info) == 2  # the self-attention blocks, not the class attention
    assert all(f.shape == (2, 32, 4, 4) for f in features)
    model.set_input_size(img_size=48)  # 6x6 grid: the masks follow
    assert model(torch.randn(2, 3, 48, 48)).shape == (2, 10)
    fresh = archspec.compile(model.spec)
    assert torch.equal(fresh.stages[0].blocks[0].attn.attn_masks, model.stages[0].blocks[0].attn.attn_masks)
