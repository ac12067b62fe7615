"""CoAtNet (Dai et al. 2021) end to end against timm 1.0's ``maxxvit.MaxxVit``: the ``C-C-T-T`` plan of MBConv stages
then relative-attention stages whose first block pools (``downsample: pool``, timm ``TransformerBlock2d(stride=2)``)
over the whole grid (``window: {size: full}``, timm ``RelPosBias`` / ``RelPosBiasTf`` / ``RelPosMlp``).

The reference is timm's own model: the shipped ``coatnet_nano_rw_224`` and ``coatnet_0_rw_224``, and small
``MaxxVit``s built from timm's own ``coatnet_nano_rw`` config (scaled down, with each relative-position term,
expand_first and shortcut_bias) have timm's parameter count and, with every weight randomised, timm's logits within
1e-5 in fp32, converted both ways by ``archspec.timm_bridge``; a fresh model follows timm's init (``vit_eff``:
xavier-uniform).  Bad input exits 2 with file:line:column, field and hint; validate / build / inspect, train and
resume, ONNX, int8 and torch.compile run on a small CoAtNet.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import timm
import torch
from test_init import init_problems
from test_resnet import randomise
from timm.models.maxxvit import MaxxVit, model_cfgs

import archspec
from archspec.cli import main
from archspec.io.images import sample_batch
from archspec.timm_bridge.convert import load_timm_weights, maxxvit_key_from_timm, to_timm

TOL = 1e-5
NAME = "coatnet_nano_rw_224"

# A small CoAtNet: the maxxvit stem 3 -> 8 -> 16, one MBConv stage, two pooling transformer stages of 8-channel
# heads (C-T-T); {res} the input side, {window} the window mapping, {pool} the downsample mapping.
SMALL = ("name: small_coat\ninput: {{resolution: {res}}}\nstem: {{kind: maxxvit, stem_width: 8, channels: 16, "
         "act: silu}}\ntokens: {{cls_token: none, pos_embed: none}}\nstages:\n"
         "  - {{kind: conv, block: mbconv, depth: 1, channels: 16, stride: 2, expand_from: input, stride_mode: pool, "
         "act: silu, se: {{rd_ratio: 0.25, act: silu}}}}\n"
         "  - {{depth: 2, dim: 24, heads: 3, head_dim: 8, norm_eps: 1.0e-6, init: xavier, attention: {{window: "
         "{window}}}, downsample: {pool}}}\n"
         "  - {{depth: 2, dim: 32, heads: 4, head_dim: 8, norm_eps: 1.0e-6, init: xavier, attention: {{window: "
         "{window}}}, downsample: {pool}}}\n"
         "head: {{pool: mean, norm: before_pool, num_classes: 10}}\n")

# (relative-position term, attention width of the pooling block, shortcut bias, input side)
CASES = [("bias", "input", True, 64), ("mlp", "input", True, 64), ("bias_tf", "input", True, 64),
         ("bias", "output", True, 64), ("bias", "input", False, 64), ("bias", "input", True, 96)]


def _small(rel_pos: str = "bias", attention: str = "input", shortcut_bias: bool = True, res: int = 64) -> str:
    term = "" if rel_pos == "bias" else f", rel_pos: {rel_pos}, rel_pos_dim: 16"
    return SMALL.format(res=res, window=f"{{size: full, shift: 0{term}}}",
                        pool=f"{{kind: pool, attention: {attention}, shortcut_bias: {str(shortcut_bias).lower()}}}")


def _timm_small(rel_pos: str = "bias", attention: str = "input", shortcut_bias: bool = True,
                res: int = 64) -> MaxxVit:
    """The same network from timm's own config language: ``coatnet_nano_rw`` scaled down to C-T-T (the ``_tf``
    term with its ``head_first=False`` qkv layout, as timm's tf configs pair them)."""
    base = model_cfgs["coatnet_nano_rw"]
    transformer = dataclasses.replace(base.transformer_cfg, dim_head=8, rel_pos_type=rel_pos, rel_pos_dim=16,
                                      expand_first=attention == "output", shortcut_bias=shortcut_bias,
                                      head_first=rel_pos != "bias_tf")
    cfg = dataclasses.replace(base, embed_dim=(16, 24, 32), depths=(1, 2, 2), block_type=("C", "T", "T"),
                              stem_width=(8, 16), transformer_cfg=transformer)
    return MaxxVit(cfg, img_size=res, num_classes=10)


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _both_ways(spec, reference: torch.nn.Module, size: int, **compile_kwargs) -> tuple[float, float]:
    """Max |logit difference| with timm's randomised weights converted to archspec, and with archspec's (a fresh
    model, randomised) converted to timm.  (A fresh model each way: eval-mode attention caches its fused qkv weights,
    which in-place edits of a model already run would not refresh.)"""
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    randomise(reference, 1)
    ours = load_timm_weights(archspec.compile(spec, **compile_kwargs), reference).eval()
    reference.eval()
    with torch.no_grad():
        expected = reference(x)
        forward = (ours(x) - expected).abs().max().item()
        assert expected.std() > 1e-2
    ours = archspec.compile(spec, **compile_kwargs).eval()
    randomise(ours, 2)
    reference.load_state_dict(to_timm(ours, reference), strict=True)
    with torch.no_grad():
        backward = (ours(x) - reference(x)).abs().max().item()
    return forward, backward


# ------------------------------------------------------------------------------------------------ timm parity
@pytest.mark.parametrize("rel_pos, attention, shortcut_bias, res", CASES, ids=lambda v: str(v))
def test_small_coatnets_equal_timm_maxxvit(rel_pos, attention, shortcut_bias, res, one_thread) -> None:
    case = dict(rel_pos=rel_pos, attention=attention, shortcut_bias=shortcut_bias, res=res)
    spec, reference = _small(**case), _timm_small(**case)
    assert archspec.analyze(spec).params == _params(reference)
    forward, backward = _both_ways(spec, reference, res)
    assert forward <= TOL and backward <= TOL, (forward, backward)


@pytest.mark.parametrize("name, params", [(NAME, 15_141_244), ("coatnet_0_rw_224", 27_435_562)])
def test_shipped_coatnet_params_equal_timm(name: str, params: int) -> None:
    reference = timm.create_model(name, pretrained=False)
    assert archspec.analyze(name).params == _params(reference) == params


@pytest.mark.slow  # two 15-27 M-parameter models, each direction: seconds
@pytest.mark.parametrize("name, size", [(NAME, 224), (NAME, 256), ("coatnet_0_rw_224", 224)])
def test_shipped_coatnet_logits_equal_timm_both_directions(name: str, size: int, one_thread) -> None:
    """At the spec's 224 px and at 256 px (the full-window tables 31x31 and 15x15: timm built at ``img_size=256``,
    archspec's model moved there by ``img_size``), through timm's registry of the shipped specs."""
    reference = timm.create_model(name, pretrained=False, img_size=size)
    assert _params(timm.create_model(f"archspec_{name}", pretrained=False, img_size=size)) == _params(reference)
    forward, backward = _both_ways(name, reference, size, img_size=size)
    assert forward <= TOL and backward <= TOL, (forward, backward)


@pytest.mark.slow  # four fresh small models and their statistics
def test_fresh_small_coatnet_follows_timms_init() -> None:
    """tests/test_init.py's rule (constants equal, random tensors' mean and std within 5 standard errors of timm's)
    on every tensor: the MBConv side as timm's ``_init_conv``, the transformer blocks as ``vit_eff`` (xavier-uniform,
    zero biases but the MLPs' ``normal(1e-6)``), the classifier torch's default (timm's ``ClassifierHead`` has no init
    of its own); tests/test_init.py holds the shipped spec to the same rule."""
    states = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        reference = _timm_small(res=64)
        ours = archspec.compile(archspec.load_spec(_small()).model_copy(update={"seed": seed}))
        states.append((reference.state_dict(), to_timm(ours, reference)))
    (theirs, ours), (theirs_again, ours_again) = states
    problems = init_problems(theirs, theirs_again, ours, ours_again)
    assert not problems, "\n".join(problems)


def test_transformer_block_names_convert() -> None:
    """timm's T-block names as archspec's (the MBConv ``conv.`` prefix of an M block, the stem, the head)."""
    assert maxxvit_key_from_timm("stages.2.blocks.0.norm1.norm.weight") == "stages.2.blocks.0.norm1.weight"
    assert maxxvit_key_from_timm("stages.3.blocks.1.attn.rel_pos.relative_position_bias_table") == \
        "stages.3.blocks.1.attn.relative_position_bias_table"
    assert maxxvit_key_from_timm("stages.2.blocks.1.attn.rel_pos.mlp.fc1.bias") == \
        "stages.2.blocks.1.attn.rel_pos_mlp.fc1.bias"
    expand = "stages.2.blocks.0.shortcut.expand.weight"
    assert maxxvit_key_from_timm(expand) == expand
    assert maxxvit_key_from_timm("head.fc.weight") == "head.weight"
    assert maxxvit_key_from_timm("stages.0.blocks.1.conv.conv2_kxk.weight") == "stages.0.blocks.1.conv2_kxk.weight"


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("change, line, where, text", [
    (("resolution: 64", "resolution: 40"), 8, "stages[2].downsample",
     "needs even sides, but this stage enters on a 5x5"),
    (("{depth: 2, dim: 24,", "{depth: 2, dim: 24, stride: 2,"), 7, "stages[1].stride", "unknown key 'stride'"),
    (("{size: full, shift: 0}", "{size: 3, shift: 0, pad: false}"), 7, "stages[1].attention.window.size",
     "window 3x3 does not divide the 8x8 token grid"),
    (("{size: full, shift: 0}", "{size: full, shift: 1}"), 7, "stages[1].attention.window.shift",
     "a full window covers the grid"),
    (("head_dim: 8, norm_eps", "head_dim: 12, norm_eps"), 7, "stages[1].downsample.attention",
     "heads of 12 channels, which do not divide it"),
    (("cls_token: none", "cls_token: input"), 7, "stages[1].downsample", "needs a pure token grid"),
])
def test_bad_input_exits_2_with_file_line_field_and_hint(change, line, where, text, tmp_path, capsys) -> None:
    """A grid the pooling block cannot halve, an MBConv stride on a token stage, a window that does not divide the
    map (``pad: false``, MaxViT's partition), a shifted full window, heads that do not split the input width, a class
    token: exit 2, file:line:column, field and hint, nothing written."""
    source = tmp_path / "bad.yaml"
    source.write_text(_small().replace(*change), encoding="utf-8")
    out = tmp_path / "build"
    for argv in (["validate", str(source)], ["build", str(source), "--out", str(out)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{source}:{line}:" in err and where in err and text in err and "hint:" in err, err
        assert "Traceback" not in err
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ every verb
@pytest.mark.slow  # a build and an inspect: seconds
def test_validate_build_and_inspect_a_small_coatnet(tmp_path, capsys, one_thread) -> None:
    source = tmp_path / "small_coat.yaml"
    source.write_text(_small(), encoding="utf-8")
    assert main(["validate", str(source)]) == 0
    assert "W window" in capsys.readouterr().out
    assert main(["build", str(source), "--out", str(tmp_path / "b"), "--repeats", "1", "--json"]) == 0
    capsys.readouterr()
    model = archspec.load(tmp_path / "b")
    assert _params(model) == archspec.analyze(source).params == _params(_timm_small())
    assert main(["inspect", str(tmp_path / "b"), "--out", str(tmp_path / "i"), "--json"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    assert [layer["heads"] for layer in layers] == ["W W", "W W W", "W W W", "W W W W"]
    assert all(0 < als <= 1 for layer in layers for als in layer["als"])


@pytest.mark.slow  # PT2E quantisation and the dynamo ONNX exporter: seconds
def test_int8_and_onnx_of_a_small_coatnet_agree_with_eager(tmp_path, one_thread) -> None:
    """ONNX Runtime within 1e-4 of eager; int8 (PT2E) within test_deploy's tolerance on the three photographs."""
    pytest.importorskip("onnxruntime")
    from archspec.deploy.int8 import quantize
    from archspec.deploy.onnx_export import export_onnx, ort_session, run_onnx

    torch.manual_seed(0)
    model, photos = archspec.compile(_small()).eval(), sample_batch((64, 64))
    export_onnx(model, tmp_path / "c.onnx", photos[:2], {"test": True})
    with torch.no_grad():
        expected = model(photos)
    assert (run_onnx(ort_session(tmp_path / "c.onnx", threads=1), photos) - expected).abs().max().item() <= 1e-4
    quantized = quantize(model, [photos], torch_compile=False)
    with torch.no_grad():
        got = quantized(photos)
    cosine = torch.nn.functional.cosine_similarity(got, expected, dim=1)
    assert (cosine >= 0.98).all(), cosine


@pytest.mark.slow  # Dynamo's trace of the whole model
def test_torch_compile_traces_a_small_coatnet_in_one_graph(one_thread) -> None:
    """torch.compile (Dynamo, fullgraph: no graph break in the pooling blocks or the full-window bias) gives the eager
    logits; the ``eager`` backend checks the trace without a C++ toolchain (``archspec build --torch-compile`` runs
    Inductor on it)."""
    torch.manual_seed(0)
    model = archspec.compile(_small("mlp")).eval()
    x = torch.randn(2, 3, 64, 64)
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # two short training runs
def test_train_and_resume_a_small_coatnet(tmp_path, one_thread) -> None:
    from train_fixtures import train_then_resume

    source = tmp_path / "small_coat.yaml"
    source.write_text(_small(), encoding="utf-8")
    assert train_then_resume(source, tmp_path)["steps"] == 4
