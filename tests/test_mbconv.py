"""MBConv conv stages (``kind: conv, block: mbconv``) and the maxxvit stem against timm's ``maxxvit`` (issue 83, item
1: the conv side of CoAtNet and MaxViT).

The reference is timm's own model configs (``timm.models.maxxvit.model_cfgs``: ``coatnet_0_rw``, ``coatnet_nano_rw``,
``maxvit_nano_rw``, ``maxvit_tiny_tf``), built by timm: the spec's spelling of each config must give the same
parameter count, the same state-dict names and, with the same weights (BatchNorm statistics drawn at random, so the
norms are not identities), the same outputs in float32 to 1e-6.  Bad input exits 2 with file:line:column, field and
hint.
"""

from __future__ import annotations

import dataclasses

import pytest
import timm
import torch
from timm.models.maxxvit import MbConvBlock, Stem, model_cfgs
from torch import nn

import archspec
from archspec.cli import main
from archspec.errors import SpecError, format_path
from archspec.families import build
from archspec.families.mbconv.rules import MBConvStageSpec, counts, out_grid, plan
from archspec.families.stem.rules import MaxxVitStemSpec
from archspec.families.stem.rules import plan as stem_plan
from archspec.ir.plan import build_plan
from archspec.search._evaluation.protocols import ProxyProtocol
from archspec.search._evaluation.proxy import proxy_geometry
from archspec.timm_bridge.convert import from_timm, maxxvit_key_from_timm, to_timm

TOL = 1e-6

# the spec's spelling of each timm conv_cfg (and its stem); timm's values are read from model_cfgs in the tests
RW_COAT = dict(expand_from="input", stride_mode="pool", act="silu", pre_norm_act=True, output_bias=False,
               se={"rd_ratio": 0.25, "act": "relu", "early": True})
RW_NANO = dict(expand_from="input", stride_mode="pool", act="silu", se={"rd_ratio": 0.25, "act": "silu"})
RW_MAX = dict(expand_from="input", act="silu", output_bias=False, se={"rd_ratio": 1 / 16, "act": "silu"})
TF_MAX = dict(act="gelu_tanh", norm_eps=1e-3, padding="same", se={"rd_ratio": 0.25, "act": "silu"})
STAGES = {"coatnet_0_rw": RW_COAT, "coatnet_nano_rw": RW_NANO, "maxvit_nano_rw": RW_MAX, "maxvit_tiny_tf": TF_MAX}
STEMS = {"coatnet_0_rw": dict(stem_width=32, channels=64, act="silu"),
         "coatnet_nano_rw": dict(stem_width=32, channels=64, act="silu"),
         "maxvit_nano_rw": dict(stem_width=32, channels=64, act="silu"),
         "maxvit_tiny_tf": dict(channels=64, bias=True, act="gelu_tanh", norm_eps=1e-3, padding="same")}


def _randomise_norms(module: nn.Module) -> nn.Module:
    """BatchNorm statistics and affine parameters drawn at random (timm's init leaves them identities), eval mode."""
    gen = torch.Generator().manual_seed(1)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
    return module.eval()


def _same_outputs(ours: nn.Module, theirs: nn.Module, x: torch.Tensor) -> None:
    """``ours`` takes ``theirs``' state dict under the same names, strictly, and computes the same to :data:`TOL`."""
    _randomise_norms(theirs)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    ours.eval()
    with torch.no_grad():
        a, b = ours(x), theirs(x)
    assert a.shape == b.shape
    assert (a - b).abs().max().item() <= TOL


def _timm_block(config: str, in_chans: int, channels: int, stride: int, **changes) -> MbConvBlock:
    cfg = dataclasses.replace(model_cfgs[config].conv_cfg, **changes)
    return MbConvBlock(in_chans, channels, stride=stride, cfg=cfg)


def _our_blocks(stage: dict, in_chans: int, grid: tuple[int, int]):
    shapes, problems = plan(MBConvStageSpec(kind="conv", block="mbconv", **stage), 0, in_chans, grid)
    assert problems == []
    return shapes


# every stride mode, SE early / late / none, expansion from the input and the output width, biases on and off, the
# tf ports' SAME padding on an odd map; (config, timm overrides, spec overrides, in, out, grid)
BLOCK_CASES = [
    ("coatnet_0_rw", {}, {}, 64, 96, (16, 16)),
    ("coatnet_nano_rw", {}, {}, 64, 64, (14, 14)),  # stride 2 without a width change: the shortcut only pools
    ("maxvit_nano_rw", {}, {}, 64, 128, (16, 12)),
    ("maxvit_tiny_tf", {}, {}, 64, 128, (15, 13)),  # SAME pads the strided conv and the 2x2 pool bottom / right
    ("maxvit_tiny_tf", {"stride_mode": "1x1", "attn_layer": ""}, {"stride_mode": "1x1", "se": None}, 32, 64, (14, 14)),
    ("coatnet_0_rw", {"stride_mode": "dw", "expand_ratio": 6.0, "kernel_size": 5},
     {"stride_mode": "dw", "expansion": 6.0, "kernel": 5}, 24, 40, (12, 12)),
    ("maxvit_nano_rw", {"pool_type": "max", "downsample_pool_type": "max", "stride_mode": "pool"},
     {"pool": "max", "stride_mode": "pool"}, 16, 32, (9, 7)),  # a 3x3 pool rounds an odd side up, as the conv
]


@pytest.mark.parametrize("config, timm_changes, spec_changes, in_chans, channels, grid", BLOCK_CASES)
def test_mbconv_blocks_are_timms(config, timm_changes, spec_changes, in_chans, channels, grid, one_thread):
    """A strided first block and a second one of each case: the rules count timm's parameters, the block takes
    timm's weights under timm's names and computes what timm's ``MbConvBlock`` does (fp32, 1e-6)."""
    stage = {**STAGES[config], **spec_changes, "depth": 2, "channels": channels, "stride": 2}
    first, second = _our_blocks(stage, in_chans, grid)
    torch.manual_seed(0)
    for shape, c_in, stride in ((first, in_chans, 2), (second, channels, 1)):
        theirs = _timm_block(config, c_in, channels, stride, **timm_changes)
        ours = build("mbconv", shape)
        assert counts(shape)[0] == sum(p.numel() for p in theirs.parameters())
        x = torch.randn(2, c_in, *shape.grid)
        _same_outputs(ours, theirs, x)
        with torch.no_grad():
            assert tuple(ours(x).shape[2:]) == out_grid(shape)


@pytest.mark.parametrize("config", sorted(STEMS))
def test_the_maxxvit_stem_is_timms(config, one_thread):
    """The stem of each config: timm's ``maxxvit.Stem`` as ``MaxxVit`` builds it from ``stem_width``, ``stem_bias``
    and the conv_cfg's activation, BatchNorm epsilon and padding; odd input sides included."""
    cfg = model_cfgs[config]
    theirs = Stem(3, cfg.stem_width, padding=cfg.conv_cfg.padding, bias=cfg.stem_bias,
                  act_layer=cfg.conv_cfg.act_layer, norm_layer=cfg.conv_cfg.norm_layer, norm_eps=cfg.conv_cfg.norm_eps)
    shape, problems = stem_plan(MaxxVitStemSpec(**STEMS[config]), 3, (33, 30), 64)
    assert problems == []
    ours = build("stem", shape)
    torch.manual_seed(0)
    _same_outputs(ours, theirs, torch.randn(2, 3, 33, 30))


def _conv_spec(config: str, depths: tuple[int, int], widths: tuple[int, int], resolution: int) -> str:
    """The conv side of a timm MaxxVit config as spec YAML: its stem, then two MBConv stages of stride 2 (timm
    strides every stage), features only (no classifier)."""
    stages = "\n".join(f"  - {{kind: conv, block: mbconv, depth: {d}, channels: {c}, stride: 2, "
                       + ", ".join(f"{k}: {v}" for k, v in STAGES[config].items()) + "}"
                       for d, c in zip(depths, widths))
    stem = ", ".join(f"{k}: {v}" for k, v in STEMS[config].items())
    return (f"name: {config}_conv\ninput: {{resolution: {resolution}}}\nstem: {{kind: maxxvit, {stem}}}\n"
            f"stages:\n{stages}\nhead: {{num_classes: 0}}\n")


@pytest.mark.slow
def test_coatnet_0_rw_conv_stages_are_timms(one_thread):
    """timm ``coatnet_0_rw_224``'s stem and its two MBConv stages (``C-C`` of ``C-C-T-T``): the spec's parameters are
    timm's, timm's state dict (those parts) converts and loads strictly, and the map after ``stages[1]`` is timm's."""
    theirs = _randomise_norms(timm.create_model("coatnet_0_rw_224", pretrained=False))
    model = archspec.compile(_conv_spec("coatnet_0_rw", (2, 3), (96, 192), 224)).eval()
    parts = (theirs.stem, theirs.stages[0], theirs.stages[1])
    assert model.analysis.graph["params"] == sum(p.numel() for part in parts for p in part.parameters())
    state = {k: v for k, v in theirs.state_dict().items() if k.startswith(("stem.", "stages.0.", "stages.1."))}
    model.load_state_dict(from_timm(state, model), strict=True)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert (model.forward_features(x) - theirs.stages[1](theirs.stages[0](theirs.stem(x)))).abs().max() <= TOL


@pytest.mark.slow
def test_maxvit_tiny_tf_conv_side_is_timms(one_thread):
    """timm ``maxvit_tiny_tf_224``'s stem and the MBConv of each ``M`` block of its first two stages (MaxViT's block
    is MBConv, then block and grid attention: the attention halves wait on their head kinds), chained: the
    ``stages.{i}.blocks.{j}.conv.*`` weights convert (:func:`maxxvit_key_from_timm`) and the map is timm's."""
    theirs = _randomise_norms(timm.create_model("maxvit_tiny_tf_224", pretrained=False))
    model = archspec.compile(_conv_spec("maxvit_tiny_tf", (2, 2), (64, 128), 224)).eval()
    convs = [block.conv for stage in theirs.stages[:2] for block in stage.blocks]
    assert model.analysis.graph["params"] == sum(p.numel() for m in (theirs.stem, *convs) for p in m.parameters())
    state = {k: v for k, v in theirs.state_dict().items()
             if k.startswith("stem.") or (k.startswith(("stages.0.", "stages.1.")) and ".conv." in k)}
    model.load_state_dict(from_timm(state, model), strict=True)
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        ref = theirs.stem(x)
        for conv in convs:
            ref = conv(ref)
        assert (model.forward_features(x) - ref).abs().max() <= TOL


def test_maxxvit_names_convert_both_ways(one_thread):
    """A MaxViT ``M`` block's MBConv keys lose their ``conv.``; a ``C`` block's (``conv1_1x1``, ...) and the stem's keep
    theirs; :func:`to_timm` gives back a timm module's own state dict."""
    assert maxxvit_key_from_timm("stages.0.blocks.1.conv.conv2_kxk.weight") == "stages.0.blocks.1.conv2_kxk.weight"
    assert maxxvit_key_from_timm("stages.2.blocks.0.conv1_1x1.weight") == "stages.2.blocks.0.conv1_1x1.weight"
    assert maxxvit_key_from_timm("stem.norm1.running_var") == "stem.norm1.running_var"
    spec = _conv_spec("coatnet_nano_rw", (1, 1), (16, 24), 32).replace("channels: 64", "channels: 8")
    model = archspec.compile(spec.replace("stem_width: 32", "stem_width: 8"))
    cfg = model_cfgs["coatnet_nano_rw"]
    theirs = nn.Module()
    theirs.stem = Stem(3, (8, 8), act_layer="silu")
    theirs.stages = nn.ModuleList([nn.Module(), nn.Module()])
    theirs.stages[0].blocks = nn.Sequential(MbConvBlock(8, 16, 2, cfg=cfg.conv_cfg))
    theirs.stages[1].blocks = nn.Sequential(MbConvBlock(16, 24, 2, cfg=cfg.conv_cfg))
    back = to_timm(model, theirs)
    theirs.load_state_dict(back, strict=True)
    ours = model.state_dict()
    assert all(torch.equal(ours[k], v) for k, v in from_timm(back, model).items()) and len(back) == len(ours)


def test_an_mbconv_stage_takes_attention_stages_after_it(one_thread):
    """CoAtNet's plan, conv stages first: MBConv stages on the stem's map, then an attention stage on its tokens
    through the hybrid interface (``from_map``, LeViT's grafting), counted by the plan and run by the model."""
    spec = ("name: coat_like\ninput: {resolution: 64}\nstem: {kind: maxxvit, stem_width: 8, channels: 16, act: silu}\n"
            "tokens: {cls_token: none, pos_embed: none}\nstages:\n"
            "  - {kind: conv, block: mbconv, depth: 2, channels: 24, stride: 2, stride_mode: pool, se: {}}\n"
            "  - {kind: conv, block: mbconv, depth: 1, channels: 32, stride: 2}\n"
            "  - {depth: 2, dim: 48, heads: 2, from_map: {pool: avg, grid: 4}}\n"
            "head: {pool: mean, num_classes: 10}\n")
    model = archspec.compile(spec).eval()
    assert model.n_conv_stages == 2 and model.analysis.graph["params"] == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        assert model(torch.randn(2, 3, 64, 64)).shape == (2, 10)
    kinds = [(n["name"], n["family"]) for n in build_plan(archspec.load_spec(spec)).nodes
             if n["name"].startswith(("stages.1", "interface", "stages.2.blocks.0"))]
    assert kinds == [("stages.1.blocks.0", "mbconv"), ("interface", "interface"), ("stages.2.blocks.0", "block")]


@pytest.mark.parametrize("body", [
    # ResNet's stem and blocks, then an MBConv stage (its strided shortcut projects 16 -> 32)
    "stem: {kind: resnet, channels: 16}\nstages:\n  - {kind: conv, block: basic, depth: 1, channels: 16}\n"
    "  - {kind: conv, block: mbconv, depth: 1, channels: 32, stride: 2, se: {}}\nhead: {num_classes: 5}\n",
    # a conv tail: a ViT stage's tokens become a map for MBConv stages
    "stem: {kind: patch, patch_size: 8}\ntokens: {cls_token: none, pos_embed: learned}\nstages:\n"
    "  - {depth: 1, dim: 32, heads: 2}\n  - {kind: conv, block: mbconv, depth: 2, channels: 48, stride: 2, "
    "stride_mode: pool}\nhead: {pool: mean, num_classes: 5}\n",
])
def test_mbconv_stages_sit_wherever_conv_stages_do(body, one_thread):
    """MBConv stages beside ResNet's blocks and as a conv tail: the plan's parameters are the model's, and it runs."""
    model = archspec.compile("name: t\ninput: {resolution: 64}\n" + body).eval()
    assert model.analysis.graph["params"] == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        assert model(torch.randn(2, 3, 64, 64)).shape == (2, 5)


HEAD = "name: t\ninput: {resolution: 64}\nstem: {kind: maxxvit, channels: 32}\nstages:\n"
MB = "kind: conv, block: mbconv, depth: 1"


@pytest.mark.parametrize("stages, path, line, text, hint", [
    (f"  - {{{MB}, channels: 64, stride: 2, stride_mode: avg}}\n", "stages[0].stride_mode", 5,
     "unknown stride mode 'avg'", "stride_mode: dw, 1x1 or pool"),
    (f"  - {{{MB}, channels: 64, stride: 2, stride_mode: [dw]}}\n", "stages[0].stride_mode", 5,
     "unknown stride mode ['dw']", "stride_mode: dw, 1x1 or pool"),  # a list or a mapping: not a TypeError
    (f"  - {{{MB}, channels: 64, stride: 2, kernel: 4}}\n", "stages[0].kernel", 5, "kernel 4 is even", "odd kernel"),
    (f"  - {{{MB}, channels: 32}}\n  - {{depth: 1, dim: 32, heads: 2, stride_mode: pool}}\n", "stages[1].stride_mode",
     6, "unknown key 'stride_mode'", "MBConv stages (kind: conv, block: mbconv)"),
    (f"  - {{{MB}, channels: 32}}\n  - {{depth: 1, dim: 32, heads: 2, stride: 2}}\n", "stages[1].stride",
     6, "unknown key 'stride'", "an attention stage downsamples with 'downsample:'"),
    (f"  - {{{MB}, channels: 48}}\n", "stages[0].channels", 5, "changes the width from 32 to 48 at stride 1",
     "use stride: 2"),
    ("  - {kind: conv, block: mbconvv, depth: 1, channels: 32}\n", "stages[0].block", 5, "unknown conv block",
     "block: basic, bottleneck, mbconv, mv2, mobilevit or conv_bn_act"),
    (f"  - {{{MB}, channels: 32, se: {{rd_ratio: 0.001}}}}\n", "stages[0].se.rd_ratio", 5, "is 0 channels",
     "raise se.rd_ratio"),
    # expand_from input: block 0's inner width int(0.005 x 128) = 0, block 1's int(0.005 x 256) = 1 (the fuzzer's find)
    ("  - {kind: conv, block: mbconv, depth: 2, channels: 64, stride: 2, expand_from: input, se: {rd_ratio: 0.005}}\n",
     "stages[0].se.rd_ratio", 5, "is 0 channels", "raise se.rd_ratio"),
    # a 36 px input: 18 x 18 after the stem, 9 x 9 after the first stage; the second stage's 2x2 shortcut pool floors
    # that to 4 x 4 where its strided depthwise conv gives 5 x 5
    (f"  - {{{MB}, channels: 48, stride: 2}}\n  - {{{MB}, channels: 64, stride: 2}}\n", "stages[1].pool", 6,
     "the shortcut's avg2 pool gives 4x4", "stride_mode: pool"),
])
def test_bad_mbconv_input_exits_2_located(stages, path, line, text, hint, tmp_path, capsys):
    """Each mistake: ``archspec validate`` exits 2 naming file:line:column, the field and a hint, and
    ``load_spec`` raises the same located problem."""
    head = HEAD.replace("resolution: 64", "resolution: 36") if "pool gives" in text else HEAD
    source = tmp_path / "t.yaml"
    source.write_text(head + stages, encoding="utf-8")
    assert main(["validate", str(source)]) == 2
    err = capsys.readouterr().err
    with pytest.raises(SpecError) as info:
        archspec.load_spec(source)
    problem = next(p for p in info.value.problems if text in p.message)
    assert format_path(problem.path) == path and problem.line == line and hint in (problem.hint or "")
    assert f"{source}:{line}:{problem.column}: {path}: " in " ".join(err.split())


def _conv_part(model: nn.Module, stages: int = 2) -> nn.Module:
    """A timm MaxxVit's stem and first ``stages`` stages, under their own names."""
    part = nn.Module()
    part.stem, part.stages = model.stem, model.stages[:stages]
    return part


@pytest.mark.slow
def test_fresh_mbconv_weights_follow_timms_init():
    """A fresh coatnet_0_rw conv side is initialised as timm's ``coatnet_0_rw_224`` (``MaxxVit`` with
    ``weight_init='vit_eff'``: every conv normal with std ``sqrt(2 / fan_out)``, zero biases, BatchNorms 1 and 0):
    the seed-independent tensors equal, every random one with timm's mean and std (tests/test_init.py's rule)."""
    from test_init import init_problems  # noqa: PLC0415 - a test module's helper, on the tests' path

    def theirs(seed: int) -> tuple[nn.Module, dict[str, torch.Tensor]]:
        torch.manual_seed(seed)
        part = _conv_part(timm.create_model("coatnet_0_rw_224", pretrained=False))
        return part, {k: v.clone() for k, v in part.state_dict().items()}

    def ours(seed: int, part: nn.Module) -> dict[str, torch.Tensor]:
        spec = archspec.load_spec(_conv_spec("coatnet_0_rw", (2, 3), (96, 192), 224))
        return to_timm(archspec.compile(spec.model_copy(update={"seed": seed})), part)

    part, state = theirs(0)
    problems = init_problems(state, theirs(1)[1], ours(0, part), ours(1, part))
    assert not problems, "\n".join(problems)


def test_a_search_proxy_of_an_mbconv_hybrid_keeps_its_stem():
    """The search's proxy of a maxxvit-stem hybrid (it raised AttributeError: no patch_size): the stem unchanged, the
    input the smallest that gives the first attention stage its pooled 4 x 4 grid -- 4 x (2 (stem) x 2 x 2) = 32 px."""
    class Data:  # the two fields the proxy's geometry reads
        channels, num_classes = 3, 10

    spec = archspec.load_spec(
        "name: c\ninput: {resolution: 224}\nstem: {kind: maxxvit, channels: 16}\n"
        "tokens: {cls_token: none, pos_embed: none}\nstages:\n"
        "  - {kind: conv, block: mbconv, depth: 1, channels: 16, stride: 2}\n"
        "  - {kind: conv, block: mbconv, depth: 1, channels: 32, stride: 2}\n"
        "  - {depth: 1, dim: 32, heads: 2, from_map: {pool: avg, grid: 4}}\nhead: {pool: mean, num_classes: 5}\n")
    geometry, doc = proxy_geometry(spec, Data(), ProxyProtocol(image_size=64))
    assert geometry.image_size == (32, 32) and geometry.grids[2] == (4, 4) and doc["stem"] == spec.stem.model_dump()
