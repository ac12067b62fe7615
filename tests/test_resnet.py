"""Conv nets in the spec language (ResNet stem, conv stages of timm's BasicBlock / Bottleneck, average-pool head):
parameter counts equal timm's, logits equal timm's on a real photograph in both conversion directions with every
parameter and BatchNorm statistic randomised, the static MACs equal the independent counter, the timm model API,
and a located error for every shape the slice refuses."""

from __future__ import annotations

from functools import cache

import pytest
import timm
import torch
from macs_reference import reference_macs

import archspec
from archspec.errors import SpecError, format_path
from archspec.nn.model import ArchModel, symbolic_trace
from archspec.timm_bridge.convert import TIMM_EQUIVALENTS, from_timm, load_timm_weights, to_timm

RESNETS = ["resnet18", "resnet50", "resnet50d", "resnetrs50", "resnext50_32x4d", "resnet26t", "seresnext26d_32x4d"]
FAST = ["resnet18"]  # the others are ~2-4 s each for the parity test on 2 cores: slow


@cache
def _timm_params(name: str) -> int:
    return sum(p.numel() for p in timm.create_model(TIMM_EQUIVALENTS[name], pretrained=False).parameters())


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter (weights at a fan-in scale that keeps activations finite over 50 layers, BatchNorm and SE
    affine terms) and every BatchNorm running statistic from ``seed``: zero-initialised and unit BatchNorms
    would hide a mismatch."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
            elif name.endswith("weight"):
                p.copy_(torch.rand(p.shape, generator=g) * 0.5 + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


def _images(name: str) -> torch.Tensor:
    """Three real photographs (grace_hopper first) at the spec's resolution."""
    from archspec.io.images import sample_batch

    return sample_batch(tuple(archspec.load_spec(name).input.resolution))


@pytest.mark.parametrize("name", RESNETS)
def test_params_equal_timm(name: str) -> None:
    analysis = archspec.analyze(name)
    assert analysis.params == _timm_params(name)


def _parity(name: str) -> tuple[float, float]:
    """Max |logit difference| timm -> archspec and archspec -> timm, each with randomised weights."""
    x = _images(name)
    reference = timm.create_model(TIMM_EQUIVALENTS[name], pretrained=False)
    randomise(reference, 1)
    reference.eval()
    ours = load_timm_weights(archspec.compile(name), reference).eval()
    with torch.no_grad():
        expected, got = reference(x), ours(x)
    assert expected.shape == got.shape == (3, 1000) and expected.std() > 1e-2
    forward = (got - expected).abs().max().item()
    mine = archspec.compile(name)
    randomise(mine, 2)
    mine.eval()
    reference.load_state_dict(to_timm(mine, reference), strict=True)
    with torch.no_grad():
        backward = (mine(x) - reference(x)).abs().max().item()
    return forward, backward


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in FAST else [pytest.mark.slow]) for n in RESNETS])
def test_logits_equal_timm_both_directions(name: str) -> None:
    forward, backward = _parity(name)
    assert forward <= 1e-5 and backward <= 1e-5, (forward, backward)


def logit_parity(ours: torch.nn.Module, reference: torch.nn.Module, size: int) -> tuple[float, float]:
    """Max |logit difference| timm -> archspec and archspec -> timm at ``size`` px, each with randomised weights."""
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    randomise(reference, 1)
    load_timm_weights(ours, reference)
    ours.eval(), reference.eval()
    with torch.no_grad():
        forward = (ours(x) - reference(x)).abs().max().item()
        assert reference(x).std() > 1e-2
    randomise(ours, 2)
    reference.load_state_dict(to_timm(ours, reference), strict=True)
    with torch.no_grad():
        backward = (ours(x) - reference(x)).abs().max().item()
    return forward, backward


@pytest.mark.parametrize("name", [pytest.param("resnext50_32x4d", marks=pytest.mark.slow), "resnet26t",
                                  "seresnext26d_32x4d"])
def test_grouped_and_tiered_logits_equal_timm_at_64px(name: str, one_thread) -> None:
    """ResNeXt's grouped 3x3 (groups 32, base_width 4) and timm's tiered stem (3 -> 24 -> 32 -> 64): the shipped
    specs, written from the papers / timm's constructor arguments, against timm's own modules."""
    reference = timm.create_model(TIMM_EQUIVALENTS[name], pretrained=False)
    ours = archspec.compile(name, img_size=64)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters())
    forward, backward = logit_parity(ours, reference, 64)
    assert forward <= 1e-5 and backward <= 1e-5, (forward, backward)


@pytest.mark.parametrize("name", ["resnet10t", pytest.param("resnext50d_32x4d", marks=pytest.mark.slow)])
def test_held_out_timm_resnets_read_and_match(name: str, one_thread) -> None:
    """Held out: timm ResNets no shipped spec names (resnet10t's tiered stem with basic blocks, a ResNeXt-D) read by
    :func:`resnet_spec_from_timm` into a spec; equal parameter count and logits with randomised weights."""
    from archspec.timm_bridge.convert import resnet_spec_from_timm

    reference = timm.create_model(name, pretrained=False)
    spec = resnet_spec_from_timm(reference, resolution=64, name=name)
    ours = archspec.compile(spec)
    assert archspec.analyze(spec).params == sum(p.numel() for p in reference.parameters())
    forward, backward = logit_parity(ours, reference, 64)
    assert forward <= 1e-5 and backward <= 1e-5, (forward, backward)


@pytest.mark.slow  # ResNet-50 at 224 px through the reference counter: seconds
def test_conversion_keys_round_trip() -> None:
    """Every timm key has one archspec key and back (deep stem, conv pool, avg shortcut and SE included)."""
    ours = archspec.compile("resnetrs50", img_size=32)
    theirs = timm.create_model("resnetrs50", pretrained=False)
    converted = from_timm(theirs.state_dict(), ours)
    assert set(converted) == set(ours.state_dict())
    assert set(to_timm(ours, theirs)) == set(theirs.state_dict())


@pytest.mark.parametrize("name, size", [("resnet18", 224), ("resnet50d", 64), ("resnetrs50", 96),
                                        ("resnext50_32x4d", 64), ("resnet26t", 64), ("seresnext26d_32x4d", 64)])
def test_analysis_equals_module_and_reference_counter(name: str, size: int, one_thread) -> None:
    model = archspec.compile(name, img_size=size).eval()
    analysis = model.analysis.graph
    assert analysis["params"] == sum(p.numel() for p in model.parameters())
    assert analysis["macs"] == reference_macs(model, torch.randn(1, 3, size, size))
    assert analysis["macs_executed"] == analysis["macs"]


@pytest.mark.slow
def test_resnet50_macs_at_224_equal_the_reference_counter() -> None:
    model = archspec.compile("resnet50").eval()
    assert model.analysis.graph["macs"] == reference_macs(model, torch.randn(1, 3, 224, 224))  # 4.09 GMACs


@pytest.mark.slow  # timm ResNets built and run: seconds
def test_timm_model_api(one_thread) -> None:
    model = archspec.compile("resnet50d", img_size=64).eval()
    reference = timm.create_model("resnet50d", pretrained=False).eval()
    load_timm_weights(model, reference)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        features = model.forward_features(x)
        torch.testing.assert_close(features, reference.forward_features(x))
        torch.testing.assert_close(model.forward_head(features, pre_logits=True),
                                   reference.forward_head(features, pre_logits=True))
    cfg = model.pretrained_cfg
    assert cfg["classifier"] == "head" and isinstance(model.get_submodule(cfg["classifier"]), torch.nn.Linear)
    assert cfg["first_conv"] == "stem.conv1.0" and isinstance(model.get_submodule(cfg["first_conv"]), torch.nn.Conv2d)
    assert archspec.compile("resnet18", img_size=32).pretrained_cfg["first_conv"] == "stem.conv1"
    assert model.num_features == 2048 and model.get_classifier() is model.head
    model.reset_classifier(7)
    assert model(x).shape == (2, 7) and model.spec.head.num_classes == 7
    model.reset_classifier(0)
    assert model(x).shape == (2, 2048)
    with pytest.raises(ValueError, match="'avg' or ''"):
        model.reset_classifier(3, "token")
    feats = model.forward_intermediates(x, intermediates_only=True)
    assert [f.shape[1:] for f in feats] == [(256, 16, 16), (512, 8, 8), (1024, 4, 4), (2048, 2, 2)]
    assert [i["reduction"] for i in model.feature_info] == [4, 8, 16, 32]
    timm_model = timm.create_model("archspec_resnet18", pretrained=False, num_classes=5, img_size=64)
    assert timm_model(torch.randn(1, 3, 64, 64)).shape == (1, 5)
    assert timm.data.resolve_data_config({}, model=timm_model)["input_size"] == (3, 64, 64)


def test_fresh_weights_are_seeded_and_zero_init_last() -> None:
    a, b = archspec.compile("resnet18", img_size=32), archspec.compile("resnet18", img_size=32)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert torch.count_nonzero(a.stages[0].blocks[0].bn2.weight) == 0  # timm zero_init_last
    doc = archspec.load_spec("resnet18").model_dump(mode="json")
    doc["stages"][0]["zero_init_last"] = False
    assert torch.all(archspec.compile(doc, img_size=32).stages[0].blocks[0].bn2.weight == 1)


# ------------------------------------------------------------------------------------------- located errors
HEAD = "name: t\n"
CONV = "{kind: conv, block: basic, depth: 1, channels: 8}"
ATTN = "{depth: 1, dim: 8, heads: 1}"
NO_TOKENS = "tokens: {cls_token: none, pos_embed: none}\n"


@pytest.mark.parametrize("body, path, line, text", [
    # a conv tail (conv stages after attention stages) is valid; an attention stage after it, and what needs the
    # class token it drops, are not (tests/test_hybrid.py builds the sandwiches)
    (f"stem: {{kind: patch}}\n{NO_TOKENS}stages:\n  - {ATTN}\n  - {CONV}\n  - {ATTN}\nhead: {{pool: mean}}\n",
     "stages[2].kind", 8, "would need a second interface"),
    (f"stem: {{kind: resnet}}\nstages:\n  - {CONV}\n  - {ATTN}\n  - {CONV}\nhead: {{pool: cls}}\n",
     "head.pool", 8, "class and distillation tokens dropped"),
    (f"stem: {{kind: patch}}\n{NO_TOKENS}stages:\n  - {CONV}\nhead: {{pool: mean}}\n",
     "stem.kind", 3, "conv stages need the feature map of a resnet, maxxvit or mobilevit stem"),
    (f"stem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {ATTN}\nhead: {{pool: mean}}\n",
     "stem.kind", 3, "an attention stage takes only after a conv stage"),
    (f"stem: {{kind: resnet}}\ntokens: {{cls_token: input}}\nstages:\n  - {CONV}\nhead: {{pool: mean}}\n",
     "tokens.cls_token", None, "no tokens to prepend a class token"),
    (f"stem: {{kind: resnet}}\ntokens: {{pos_embed: learned}}\nstages:\n  - {CONV}\nhead: {{pool: mean}}\n",
     "tokens.pos_embed", None, "no tokens to add a position embedding"),
    (f"stem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {CONV}\nhead: {{pool: cls}}\n",
     "head.pool", 7, "averages the final map"),
    (f"stem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {CONV}\nhead: {{pool: mean, distillation: true}}\n",
     "head.distillation", 7, "distillation head is not supported"),
    (f"stem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {CONV}\nclass_attention: {{depth: 1}}\n"
     "head: {pool: mean}\n", "class_attention", 7, "class attention needs tokens"),
    (f"stem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {{kind: conv, block: bottleneck, depth: 1, channels: 30}}\n"
     "head: {pool: mean}\n", "stages[0].channels", 6, "not divisible by the bottleneck ratio 4"),
    (f"input: {{resolution: 8}}\nstem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {CONV}\n"
     "  - {kind: conv, block: basic, depth: 1, channels: 8, stride: 2}\n"
     "  - {kind: conv, block: basic, depth: 1, channels: 8, stride: 2}\nhead: {pool: mean}\n",
     "stages[2].stride", 8, "stride 2 on a 1x1 map would shrink it below 1x1"),
    (f"stem: {{kind: resnet, stem_width: 16}}\n{NO_TOKENS}stages:\n  - {CONV}\nhead: {{pool: mean}}\n",
     "stem.stem_width", 3, "applies to the deep stem only"),
    (f"stem: {{kind: resnet, widths: [24, 32]}}\n{NO_TOKENS}stages:\n  - {CONV}\nhead: {{pool: mean}}\n",
     "stem.widths", 3, "applies to the deep stem only"),
    (f"stem: {{kind: resnet, deep: true, stem_width: 32, widths: [24, 32]}}\n{NO_TOKENS}stages:\n  - {CONV}\n"
     "head: {pool: mean}\n", "stem.widths", 3, "not both"),
    (f"stem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {{kind: conv, block: basic, depth: 1, channels: 8, groups: 2}}\n"
     "head: {pool: mean}\n", "stages[0].groups", 6, "a basic block has none"),
    (f"stem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {{kind: conv, block: bottleneck, depth: 1, channels: 64, "
     "groups: 4, mixer: {kind: gpsa}}\nhead: {pool: mean}\n", "stages[0].groups", 6, "no grouped conv left"),
    (f"stem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {{kind: conv, block: bottleneck, depth: 1, channels: 64, "
     "groups: 4, base_width: 2}\nhead: {pool: mean}\n", "stages[0].base_width", 6, "0 channels per group"),
    (f"stem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {{kind: cnn, depth: 1}}\nhead: {{pool: mean}}\n",
     "stages[0].kind", 6, "must be 'attention' (the default) or 'conv'"),
    (f"stem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {{kind: conv, block: basic, depth: 1, channels: 8, dim: 8}}\n"
     "head: {pool: mean}\n", "stages[0].dim", 6, "unknown key 'dim'"),
])
def test_located_errors(body: str, path: str, line: int | None, text: str, tmp_path) -> None:
    source = tmp_path / "t.yaml"
    source.write_text(HEAD + ("" if body.startswith("input") else "input: {resolution: 64}\n") + body,
                      encoding="utf-8")
    with pytest.raises(SpecError) as info:
        archspec.load_spec(source)
    problems = [p for p in info.value.problems if text in p.message]
    assert problems, [str(p) for p in info.value.problems]
    problem = problems[0]
    assert problem.file == str(source) and problem.line is not None
    assert format_path(problem.path) == path
    if line is not None:
        assert problem.line == line


@pytest.mark.parametrize("tokens, head", [("", "head: {num_classes: 10}\n"), ("", ""),
                                          ("tokens: {cls_token: none}\n", "head: {pool: mean}\n")])
def test_a_conv_net_without_tokens_defaults_to_none(tokens: str, head: str, tmp_path, capsys) -> None:
    """Issue 57: a spec of conv stages only that leaves out ``tokens:`` (or ``head.pool``) was refused ("a conv net
    has no tokens to prepend a class token to"); the only sensible default is no tokens and an average pool, and the
    spec is then the same model as one that states them."""
    from archspec.cli import main

    body = f"input: {{resolution: 64}}\nstem: {{kind: resnet}}\n{tokens}stages:\n  - {CONV}\n{head}"
    (tmp_path / "implicit.yaml").write_text(HEAD + body, encoding="utf-8")
    classes = ", num_classes: 10" if "num_classes" in head else ""
    stated = (f"input: {{resolution: 64}}\nstem: {{kind: resnet}}\n{NO_TOKENS}stages:\n  - {CONV}\n"
              f"head: {{pool: mean{classes}}}\n")
    (tmp_path / "stated.yaml").write_text(HEAD + stated, encoding="utf-8")
    implicit, explicit = (archspec.load_spec(tmp_path / f"{n}.yaml") for n in ("implicit", "stated"))
    assert implicit.tokens.cls_token == "none" and implicit.tokens.pos_embed == "none" and implicit.head.pool == "mean"
    assert implicit == explicit
    assert main(["validate", str(tmp_path / "implicit.yaml")]) == 0


@pytest.mark.parametrize("stride", [3, 4])
@pytest.mark.parametrize("stage", ["block: basic", "block: bottleneck", "block: bottleneck, mixer: {kind: gpsa}"])
def test_a_stride_that_would_not_build_is_refused_at_validation(stage: str, stride: int, tmp_path) -> None:
    """Every spec that validates builds: timm's 1x1 strided shortcut pads from stride 3 on (a 56 px input gives
    maps of 5 and 6 pixels) and GPSA runs at stride 1 or 2, so a conv stage's stride is 1 or 2, refused with its
    line; stride 2 of the same stage builds and runs."""
    body = (f"input: {{resolution: 56}}\nstem: {{kind: resnet}}\n{NO_TOKENS}stages:\n"
            f"  - {{kind: conv, {stage}, depth: 1, channels: 32, stride: STRIDE}}\nhead: {{pool: mean}}\n")
    source = tmp_path / "t.yaml"
    source.write_text(HEAD + body.replace("STRIDE", str(stride)), encoding="utf-8")
    with pytest.raises(SpecError) as info:
        archspec.load_spec(source)
    problem = info.value.problems[0]
    assert format_path(problem.path) == "stages[0].stride" and problem.file == str(source) and problem.line == 6
    model = archspec.compile(HEAD + body.replace("STRIDE", "2")).eval()
    assert model(torch.randn(1, 3, 56, 56)).shape[-1] == 1000


def test_unknown_key_hint_lists_the_conv_stage_keys() -> None:
    with pytest.raises(SpecError) as info:
        archspec.load_spec({"stem": {"kind": "resnet"}, "stages": [{"kind": "conv", "block": "basic", "depth": 1,
                                                                    "channels": 8, "heads": 2}]})
    hint = info.value.problems[0].hint
    assert "channels" in hint and "mlp_ratio" not in hint


# ------------------------------------------------------------------------------------------- one model class
def test_a_conv_net_is_the_one_model_class_without_token_parts(one_thread) -> None:
    """A conv net compiles to :class:`ArchModel` itself, a hybrid with no token stages: no interface, tokens,
    position embedding or norm; timm ResNet's head; FX traces it; the timm API answers as for the other models."""
    model = archspec.compile("resnet18", img_size=32).eval()
    assert type(model) is ArchModel and model.ends_on_map and model.n_conv_stages == 4
    assert model.interface is None and model.to_map is None and model.cls_token is None and model.pos_embed is None
    assert not any(k.startswith(("norm", "fc_norm", "interface")) for k in model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(symbolic_trace(model)(x), model(x))
        feats = model.forward_intermediates(x, indices=[1, 3], output_fmt="NLC", return_prefix_tokens=True,
                                            intermediates_only=True)
    # (B, H*W, C) features; the prefix (B, 0, C) as for token models' levels before the class token enters
    assert [(tuple(f.shape), tuple(p.shape)) for f, p in feats] == [((2, 16, 128), (2, 0, 128)),
                                                                   ((2, 1, 512), (2, 0, 512))]
    with pytest.raises(ValueError, match="token pooling needs a class token"):
        model.reset_classifier(3, "token")
    with pytest.raises(ValueError, match="a resnet stem has no patch size"):
        model.set_input_size(64, patch_size=16)


def test_a_one_stage_conv_net_prunes_by_stage(one_thread) -> None:
    """A one-stage conv net's feature level is its stage (timm ResNet), not each block (a one-stage ViT's)."""
    doc = {"name": "c1", "input": {"resolution": 32}, "stem": {"kind": "resnet"},
           "tokens": {"cls_token": "none", "pos_embed": "none"}, "head": {"pool": "mean", "num_classes": 10},
           "stages": [{"kind": "conv", "block": "basic", "depth": 2, "channels": 32}]}
    model = archspec.compile(doc).eval()
    assert [i["module"] for i in model.feature_info] == ["stages.0"]
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        full = model.forward_features(x)
        assert model.prune_intermediate_layers([0]) == [0]
        assert len(model.stages[0].blocks) == 2
        torch.testing.assert_close(model.forward_intermediates(x, intermediates_only=True)[0], full)
