"""Attention inside bottlenecks (BoTNet, Srinivas et al. 2021): timm's ``botnet26t_256`` written as a spec
(specs/botnet26t.yaml) has timm's parameter count and, with every weight and BatchNorm statistic randomised, timm's
logits in both conversion directions; ``analyze`` equals the module's parameters and the independent MAC counter
for BoTNet's relative logits and for the token stages' head kinds composed per head inside a bottleneck; located
errors for what the mixer refuses."""

from __future__ import annotations

import pytest
import timm
import torch
from macs_reference import reference_macs
from test_resnet import randomise

import archspec
from archspec.errors import SpecError, format_path
from archspec.timm_bridge.convert import load_timm_weights, to_timm


def _botnet(size: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    return archspec.compile("botnet26t", img_size=size), timm.create_model("botnet26t_256", img_size=size,
                                                                           pretrained=False)


def test_params_equal_timm_at_256() -> None:
    reference = timm.create_model("botnet26t_256", pretrained=False)
    assert archspec.analyze("botnet26t").params == sum(p.numel() for p in reference.parameters()) == 12_488_672


@pytest.mark.parametrize("size", [64, pytest.param(256, marks=pytest.mark.slow)])
def test_logits_equal_timm_both_directions(size: int, one_thread) -> None:
    ours, reference = _botnet(size)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters())
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    randomise(reference, 1)
    reference.eval()
    load_timm_weights(ours, reference).eval()
    with torch.no_grad():
        expected = reference(x)
        forward = (ours(x) - expected).abs().max().item()
    assert expected.std() > 1e-2
    randomise(ours, 2)
    reference.load_state_dict(to_timm(ours, reference), strict=True)
    with torch.no_grad():
        backward = (ours(x) - reference(x)).abs().max().item()
    assert forward <= 1e-5 and backward <= 1e-5, (forward, backward)


BOT = ("name: t\ninput: {{resolution: 64}}\nstem: {{kind: resnet}}\ntokens: {{cls_token: none, pos_embed: none}}\n"
       "stages:\n  - {{kind: conv, block: bottleneck, depth: 1, channels: 64}}\n"
       "  - {{kind: conv, block: bottleneck, depth: 2, channels: 128, stride: 2, mixer: {mixer}}}\n"
       "head: {{pool: mean, num_classes: 10}}\n")


@pytest.mark.parametrize("mixer", [
    "{kind: attention}",
    "{kind: attention, heads: 2, attention: mhsa}",
    "{kind: attention, heads: 4, head_kinds: [mhsa, levit_bias, signed_bias, gpsa]}",
    "{kind: attention, heads: 4, head_kinds: [soft_mask, strict_mask:5x5, gpsa, mhsa]}",
    # on the 8x8 map: a hard mask on a 16x16 one takes the linear-time path, which the counter sees differently
    "{kind: attention, heads: 4, head_kinds: [mask:3x3, soft_mask, strict_mask:5x5, gpsa], layers: [1]}",
    "{kind: attention, heads: 2, attention: mhsa, layers: [1]}",
])
def test_analysis_equals_module_and_reference_counter(mixer: str, one_thread) -> None:
    spec = archspec.load_spec(BOT.format(mixer=mixer))
    model = archspec.compile(spec).eval()
    graph = model.analysis.graph
    assert graph["params"] == sum(p.numel() for p in model.parameters())
    # executed: a GPSA head's P V on the SDPA path is the one term beyond the papers' count (as in token stages)
    assert graph["macs_executed"] == reference_macs(model, torch.randn(1, 3, 64, 64))
    assert (graph["macs_executed"] == graph["macs"]) == ("gpsa" not in mixer)
    with torch.no_grad():
        assert model(torch.randn(2, 3, 64, 64)).shape == (2, 10)


def test_strided_attention_block_attends_at_stride_one_then_pools() -> None:
    """BoTNet's stride handling: the first block of a strided stage attends on its input map, then pools 2x2."""
    model = archspec.compile(BOT.format(mixer="{kind: attention, heads: 2, attention: mhsa}")).eval()
    mixer = model.stages[1].blocks[0].conv2
    assert isinstance(mixer.pool, torch.nn.AvgPool2d) and mixer.attn.grid == (16, 16)
    assert model.stages[1].blocks[1].conv2.attn.grid == (8, 8)
    x = torch.randn(1, 32, 16, 16)
    with torch.no_grad():
        full = mixer.attn(x.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(1, 32, 16, 16)
        torch.testing.assert_close(mixer(x), torch.nn.functional.avg_pool2d(full, 2))


@pytest.mark.parametrize("mixer, path, text", [
    ("{kind: attention, heads: 3}", "stages[1].mixer.heads", "not divisible by 3 heads"),
    ("{kind: attention, layers: [2]}", "stages[1].mixer.layers", "beyond the stage's 2 blocks"),
    ("{kind: attention, heads: 2, head_kinds: [botnet_rel, mhsa]}", "stages[1].mixer.head_kinds",
     "every head of a layer is botnet_rel"),
    ("{kind: attention, heads: 2, head_kinds: [mhsa]}", "stages[1].mixer", "1 head kinds for 2 heads"),
    ("{kind: attentoin}", "stages[1].mixer.kind", "mixer kind must be 'gpsa' or 'attention'"),
    ("{kind: attention, heads: 2, attention: mask:31x31}", "stages[1].mixer.attention", "31"),
])
def test_located_errors(mixer: str, path: str, text: str, tmp_path) -> None:
    source = tmp_path / "t.yaml"
    source.write_text(BOT.format(mixer=mixer), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        archspec.load_spec(source)
    problems = [p for p in info.value.problems if text in p.message]
    assert problems, [str(p) for p in info.value.problems]
    assert format_path(problems[0].path).startswith(path) and problems[0].file == str(source)
    assert problems[0].line == 7


def test_odd_map_under_a_strided_attention_block_is_refused() -> None:
    with pytest.raises(SpecError, match="odd sides"):
        archspec.load_spec(BOT.format(mixer="{kind: attention}").replace("resolution: 64", "resolution: 36"))


def test_botnet_rel_in_a_token_stage_is_refused() -> None:
    with pytest.raises(SpecError, match="inside a bottleneck's attention mixer only"):
        archspec.load_spec({"input": {"resolution": 32}, "stem": {"kind": "patch", "patch_size": 8},
                            "stages": [{"depth": 1, "dim": 16, "heads": 2, "attention": "botnet_rel"}]})


@pytest.mark.slow  # two ResNet-50-sized models converted both ways: seconds
def test_tcnn_to_timm_round_trips_the_resnet_weights(one_thread) -> None:
    """to_timm of a T-CNN (GPSA in bottlenecks) gives its timm ResNet back: W_out -> the 3x3 conv (T-CNN eq. 6
    inverted); before, a KeyError."""
    reference = timm.create_model("resnet50d", pretrained=False)
    randomise(reference, 3)
    tcnn = load_timm_weights(archspec.compile("t_resnet50d", img_size=64), reference)
    back = to_timm(tcnn, reference)
    assert set(back) == set(reference.state_dict())
    assert all(torch.equal(back[k], v) for k, v in reference.state_dict().items())
