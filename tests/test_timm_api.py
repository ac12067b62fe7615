"""timm integration: registry (timm.create_model), backbone API, input size, layer decay, FX.

Every check is against timm itself (its ViT / LeViT with the same weights, its layer-decay groups,
its resampling helpers) or against the model's own plain forward.  Models are tiny (depth 2-4, 32-64 px).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from timm.layers import resample_abs_pos_embed, resize_rel_pos_bias_table_levit
from timm.optim import create_optimizer_v2

import archspec
from archspec.errors import SpecError
from archspec.ir.checked import load_spec
from archspec.nn.compiler import compile
from archspec.nn.model import FX_LEAF_MODULES, symbolic_trace
from archspec.spec import shipped_specs
from archspec.timm_bridge.convert import from_timm

ROOT = Path(__file__).resolve().parent.parent


def _spec(name: str, resolution: int, **stage0) -> dict:
    data = load_spec(name, check=False).model_dump()
    data["input"]["resolution"] = (resolution, resolution)
    data["stages"][0].update(stage0)
    return data


def _tiny_deit(resolution: int = 32, depth: int = 2):
    """Our deit_tiny at ``depth`` / ``resolution`` and timm's deit_tiny with the same weights, both eval."""
    ours = compile(_spec("deit_tiny", resolution, depth=depth)).eval()
    theirs = timm.create_model("deit_tiny_patch16_224", pretrained=False, depth=depth, img_size=resolution).eval()
    ours.load_state_dict(from_timm(theirs.state_dict(), ours))
    return ours, theirs


def _tiny_convit():
    data = _spec("convit_tiny", 32, depth=3)
    data["stages"][0]["layers"][0]["range"] = (0, 1)
    data["tokens"]["cls_token"] = 2
    return compile(data).eval()


def _levit(resolution: int = 64):
    ours = compile("levit_128s", img_size=resolution).eval()
    theirs = timm.create_model("levit_128s", pretrained=False, img_size=resolution).eval()
    ours.load_state_dict(from_timm(theirs.state_dict(), ours))
    return ours, theirs


# ------------------------------------------------------------------------------------------- registry
def test_registered_names_do_not_clobber_timm() -> None:
    names = timm.list_models("archspec_*")
    assert names == sorted(f"archspec_{n}" for n in shipped_specs())
    assert timm.models.get_arch_name("levit_128s") == "levit_128s"
    assert type(timm.create_model("levit_128s", pretrained=False)).__module__ == "timm.models.levit"


@pytest.mark.slow
def test_import_archspec_registers_without_importing_torch() -> None:
    code = ("import sys, archspec; assert 'torch' not in sys.modules; import timm; "
            "print(len(timm.list_models('archspec_*')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert int(out.stdout) == len(shipped_specs())


@pytest.mark.slow
@pytest.mark.parametrize("first", ["archspec.timm_bridge.registry", "timm", "archspec"])
def test_the_specs_are_registered_whichever_module_is_imported_first(first: str) -> None:
    """Importing the registry before timm fired the post-import hook while the registry was half-initialised: a
    RuntimeWarning and no archspec_* model at all (issue 58's rename found it).  ``-W error`` turns a warning into a
    failure."""
    code = (f"import {first}, archspec.timm_bridge.registry, timm; "
            "print(len(timm.list_models('archspec_*')))")
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert int(out.stdout) == len(shipped_specs())


NATIVE = {"nat_mini", "dinat_mini", "halonet26t"}


def _clamp_windows(node) -> None:
    """Every window head of a dumped spec with ``clamp: true`` (what timm's ``img_size=`` gives a Swin spec; a
    ``full`` window, CoAtNet's, is the whole grid at any size and stays as written)."""
    if isinstance(node, dict):
        if isinstance(node.get("window"), dict) and node["window"].get("size") != "full":
            node["window"]["clamp"] = True
        for value in node.values():
            _clamp_windows(value)
    elif isinstance(node, list):
        for value in node:
            _clamp_windows(value)


@pytest.mark.parametrize("name", shipped_specs())
@pytest.mark.slow
def test_create_model_builds_every_shipped_spec(name: str, one_thread) -> None:
    """Every shipped spec through timm.create_model, kwargs honoured: the spec it carries is the shipped one
    with those kwargs, its parameter count is the graph's (computed without torch) and it runs."""
    # a 2-stage graft pools a 1/8 map to 14x14 tokens: it needs 112 px (at 64 px the map is 8x8, refused); NAT's
    # 7x7 neighbourhoods (DiNAT's dilated up to 8) and HaloNet's 8x8 blocks fit only their own input's grids
    size = 112 if name == "levit_graft_r50s2_deit6" else load_spec(name).input.resolution[0] if name in NATIVE else 64
    model = timm.create_model(f"archspec_{name}", pretrained=False, num_classes=7, img_size=size).eval()
    data = load_spec(name).model_dump()
    data["head"]["num_classes"] = 7
    data["input"]["resolution"] = (size, size)
    _clamp_windows(data)  # timm's rule at another size: a Swin window larger than its grid is clamped to it
    expected = load_spec(data)
    assert model.spec == expected
    assert sum(p.numel() for p in model.parameters()) == archspec.analyze(expected).params
    assert model.pretrained_cfg["input_size"] == (expected.input.channels, size, size)
    with torch.no_grad():
        assert model(torch.randn(1, expected.input.channels, size, size)).shape == (1, 7)


@pytest.mark.slow
def test_create_model_equals_compile(one_thread) -> None:
    model = timm.create_model("archspec_mait_tiny_sch2", pretrained=False, img_size=64)
    reference = compile("mait_tiny_sch2", img_size=64)
    assert model.state_dict().keys() == reference.state_dict().keys()
    assert all(torch.equal(v, reference.state_dict()[k]) for k, v in model.state_dict().items())


def test_create_model_kwargs_match_timm_vit(one_thread) -> None:
    model = timm.create_model("archspec_deit_tiny", in_chans=1, drop_rate=0.25, drop_path_rate=0.1,
                              global_pool="avg", img_size=32)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, drop_path_rate=0.1, img_size=32)
    ours = [b.drop_path1.drop_prob if hasattr(b.drop_path1, "drop_prob") else 0.0 for b in model.stages[0].blocks]
    theirs = [b.drop_path1.drop_prob if hasattr(b.drop_path1, "drop_prob") else 0.0 for b in vit.blocks]
    assert ours == pytest.approx(theirs)
    assert model.stem.proj.in_channels == 1 and model.head_drop.p == 0.25 and model.global_pool == "avg"
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 1000)
    assert timm.data.resolve_data_config({}, model=model)["input_size"] == (1, 32, 32)  # what train.py feeds it


def test_pretrained_is_refused_unless_a_file_is_given(tmp_path, one_thread) -> None:
    with pytest.raises(ValueError, match="no pretrained weights are published"):
        timm.create_model("archspec_deit_tiny", pretrained=True)
    saved = compile(_spec("deit_tiny", 32, depth=2))
    archspec.save(saved, tmp_path)
    name = archspec.register(saved.spec, "my_tiny_deit")
    weights = {"file": str(tmp_path / "model.safetensors")}
    loaded = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=weights)
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in saved.state_dict().items())
    with pytest.raises(SpecError):
        timm.create_model(name, img_size=40)  # not a multiple of the patch size


# ------------------------------------------------------------------------------------------- backbone
def test_forward_intermediates_match_timm_vit(one_thread) -> None:
    ours, theirs = _tiny_deit()
    x = torch.randn(2, 3, 32, 32)
    final, feats = ours.forward_intermediates(x)
    ref_final, ref_feats = theirs.forward_intermediates(x)
    torch.testing.assert_close(final, ref_final)
    assert [f.shape for f in feats] == [(2, 192, 2, 2)] * 2
    for a, b in zip(feats, ref_feats):
        torch.testing.assert_close(a, b)
    nlc = ours.forward_intermediates(x, indices=[-1], output_fmt="NLC", norm=True, intermediates_only=True)
    torch.testing.assert_close(nlc[0], ref_final[:, 1:])
    assert [i["reduction"] for i in ours.feature_info] == [16, 16]


def test_forward_intermediates_match_timm_levit(one_thread) -> None:
    ours, theirs = _levit()
    x = torch.randn(2, 3, 64, 64)
    feats = ours.forward_intermediates(x, intermediates_only=True)
    ref = theirs.forward_intermediates(x, intermediates_only=True)
    assert [tuple(f.shape) for f in feats] == [(2, 128, 4, 4), (2, 256, 2, 2), (2, 384, 1, 1)]
    for a, b in zip(feats, ref):
        torch.testing.assert_close(a, b)
    assert ours.feature_info == [dict(num_chs=c, reduction=r, module=f"stages.{i}")
                                 for i, (c, r) in enumerate(zip((128, 256, 384), (16, 32, 64)))]


def test_convit_intermediates_follow_the_class_token(one_thread) -> None:
    """Before the class token enters (GPSA blocks) there is no prefix; the maps are the patch tokens."""
    model = _tiny_convit()
    outputs = []
    hooks = [b.register_forward_hook(lambda m, i, o: outputs.append(o)) for b in model.stages[0].blocks]
    x = torch.randn(2, 3, 32, 32)
    feats = model.forward_intermediates(x, return_prefix_tokens=True, intermediates_only=True)
    for hook in hooks:
        hook.remove()
    assert [p.shape[1] for _, p in feats] == [0, 0, 1]
    for (fmap, _), raw in zip(feats, outputs):
        patches = raw[:, raw.shape[1] - 4:]  # 2x2 grid after the prefix
        torch.testing.assert_close(fmap, patches.reshape(2, 2, 2, 192).permute(0, 3, 1, 2))


@pytest.mark.parametrize("name", ["deit_tiny", "convit_tiny", "levit_128s"])
def test_features_only(name: str, one_thread) -> None:
    net = timm.create_model(f"archspec_{name}", features_only=True, out_indices=(-2, -1), img_size=64).eval()
    maps = net(torch.randn(2, 3, 64, 64))
    assert [m.shape[1] for m in maps] == net.feature_info.channels()
    assert [64 // m.shape[-1] for m in maps] == net.feature_info.reduction()
    if name == "levit_128s":
        assert net.feature_info.channels() == [256, 384]


def test_prune_intermediate_layers_keeps_the_features(one_thread) -> None:
    model = compile(_spec("deit_tiny", 32, depth=4)).eval()
    x = torch.randn(1, 3, 32, 32)
    full = model.forward_intermediates(x, indices=[1], intermediates_only=True)
    pruned = copy.deepcopy(model)
    assert pruned.prune_intermediate_layers([1]) == [1]
    assert len(pruned.stages[0].blocks) == 2 and pruned.num_classes == 0
    torch.testing.assert_close(pruned.forward_intermediates(x, indices=[1], intermediates_only=True)[0], full[0])


@pytest.mark.parametrize("make", [lambda: _tiny_deit()[0], _tiny_convit, lambda: _levit()[0]])
def test_fx_feature_extraction(make, one_thread) -> None:
    from torchvision.models.feature_extraction import create_feature_extractor

    model = make()
    size = 64 if len(model.stages) > 1 else 32
    x = torch.randn(2, 3, size, size)
    extractor = create_feature_extractor(model, {"stages.0.blocks.0": "first", "norm": "last"},
                                         tracer_kwargs={"leaf_modules": list(FX_LEAF_MODULES)})
    torch.testing.assert_close(extractor(x)["last"], model.forward_features(x))
    traced = timm.layers._fx.create_feature_extractor(model, ["norm"])  # timm's registry knows the leaves
    torch.testing.assert_close(traced(x)["norm"], model.forward_features(x))
    torch.testing.assert_close(symbolic_trace(model)(x), model(x))


# ------------------------------------------------------------------------------------------- input size
def test_set_input_size_matches_timm_vit(one_thread) -> None:
    ours, theirs = _tiny_deit()
    ours.set_input_size(img_size=48)
    theirs.set_input_size(img_size=48)
    x = torch.randn(2, 3, 48, 48)
    torch.testing.assert_close(ours(x), theirs(x))
    assert ours.spec.input.resolution == (48, 48)


def test_dynamic_img_size_matches_timm_vit(one_thread) -> None:
    ours, _ = _tiny_deit()
    theirs = timm.create_model("deit_tiny_patch16_224", pretrained=False, depth=2, img_size=32,
                               dynamic_img_size=True).eval()
    ours.load_state_dict(from_timm(theirs.state_dict(), ours))
    ours.set_dynamic_img_size(True)
    for side in (48, 32, 64):
        x = torch.randn(1, 3, side, side)
        torch.testing.assert_close(ours(x), theirs(x))
    with pytest.raises(ValueError, match="relative-position tables"):
        _levit()[0].set_dynamic_img_size(True)


def test_load_at_another_size_rebuilds_tables_and_masks(tmp_path, one_thread) -> None:
    """Weights saved at 48 px load at 64 px: pos embed and bias tables resampled as timm does,
    index tables, GPSA r_ij and MaiT masks identical to a model compiled at 64 px."""
    data = _spec("deit_tiny", 48, depth=2, heads=4, attention=None,
                 layers=[{"range": "0", "heads": ["gpsa", "gpsa", "gpsa", "gpsa"]},
                         {"range": "1", "heads": ["mask:3x3", "levit_bias", "signed_bias", "mhsa"]}])
    data["tokens"]["cls_token"] = 1
    small = compile(data)
    with torch.no_grad():
        for p in small.parameters():
            p.normal_()
    archspec.save(small, tmp_path)
    big = archspec.load(tmp_path, img_size=64)
    fresh = compile(data, img_size=64)
    assert big.state_dict().keys() == fresh.state_dict().keys()
    for key, value in fresh.named_buffers():
        assert torch.equal(dict(big.named_buffers())[key], value), key
    torch.testing.assert_close(big.pos_embed, resample_abs_pos_embed(small.pos_embed, [4, 4], [3, 3], 0))
    table = small.stages[0].blocks[1].attn.attention_biases
    torch.testing.assert_close(big.stages[0].blocks[1].attn.attention_biases,
                               resize_rel_pos_bias_table_levit(table.T, (16, 1)).T)
    assert small.stages[0].blocks[1].attn.signed_biases.shape == (1, 25)
    assert big.stages[0].blocks[1].attn.signed_biases.shape == (1, 49)
    assert big(torch.randn(1, 3, 64, 64)).shape == (1, 1000)
    with pytest.raises(SpecError, match="img_size 40x40"):
        archspec.load(tmp_path, img_size=40)
    # the same weights through timm's loader at another size: resampled by the pretrained filter
    name = archspec.register(small.spec, "tiny_mixed_heads")
    via_timm = timm.create_model(name, img_size=64, pretrained=True,
                                 pretrained_cfg_overlay={"file": str(tmp_path / "model.safetensors")})
    assert all(torch.equal(v, via_timm.state_dict()[k]) for k, v in big.state_dict().items())


@pytest.mark.slow
def test_levit_shrink_moves_to_the_new_grid(one_thread) -> None:
    model, _ = _levit(64)
    model.set_input_size(img_size=96)
    fresh = compile("levit_128s", img_size=96)
    assert model.stages[1].downsample.attn_downsample.attention_biases.shape == (8, 36)
    for key, value in fresh.named_buffers():
        assert torch.equal(dict(model.named_buffers())[key], value), key
    assert model.forward_intermediates(torch.randn(2, 3, 96, 96), intermediates_only=True)[-1].shape == (2, 384, 2, 2)


# ------------------------------------------------------------------------------------------- layer decay
def _scales(model: torch.nn.Module, rename) -> dict[str, float]:
    optimizer = create_optimizer_v2(model, "adamw", lr=1.0, weight_decay=0.05, layer_decay=0.75)
    names = {id(p): n for n, p in model.named_parameters()}
    return {rename(names[id(p)]): group["lr_scale"] for group in optimizer.param_groups for p in group["params"]}


def _vit_role(name: str) -> str:
    name = name.replace("stages.0.blocks.", "blocks.").replace("stem.", "patch_embed.")
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]


def test_layer_decay_equals_timm_vit(one_thread) -> None:
    ours = compile(_spec("deit_tiny", 32, depth=4))
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=4, img_size=32)
    mine, theirs = _scales(ours, _vit_role), _scales(vit, _vit_role)
    assert mine == pytest.approx(theirs)
    assert mine["patch_embed"] == pytest.approx(0.75 ** 5) and mine["head"] == 1.0


def test_layer_decay_equals_timm_levit(one_thread) -> None:
    ours, theirs = _levit(64)

    def role(name: str) -> str:
        return ".".join(name.split(".")[:4 if ".blocks." in name else 3 if ".downsample" in name else 1])

    assert _scales(ours, role) == pytest.approx(_scales(theirs, role))


def test_validate_a_build_directory_at_another_resolution(tmp_path, capsys, one_thread) -> None:
    from archspec.cli import main

    archspec.save(compile(_spec("deit_tiny", 32, depth=2)), tmp_path)
    assert main(["validate", str(tmp_path), "--resolution", "64", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_shape"][-2:] == [64, 64]
    assert main(["validate", str(tmp_path), "--resolution", "40"]) == 2
    assert "img_size 40x40" in capsys.readouterr().err


def test_conv_mixer_model_moves_to_a_new_grid_exactly(one_thread) -> None:
    """No grid-dependent weights (identity stem, conv mixers): after set_input_size the logits equal a model
    compiled at the new size with the same weights."""
    data = _spec("cmhsa_k3_conv", 16, depth=2, dim=48, heads=3)
    data["stem"]["patch_size"] = 4
    model = compile(data).eval()
    model.set_input_size(img_size=24)
    fresh = compile(data, img_size=24).eval()
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 24, 24)
    torch.testing.assert_close(model(x), fresh(x))


def test_dynamic_convit_equals_set_input_size(one_thread) -> None:
    dynamic, fixed = _tiny_convit(), _tiny_convit()
    dynamic.set_dynamic_img_size(True)
    fixed.set_input_size(img_size=48)
    x = torch.randn(2, 3, 48, 48)
    torch.testing.assert_close(dynamic(x), fixed(x))
    assert dynamic(torch.randn(1, 3, 32, 32)).shape == (1, 1000)  # back to the learned grid


# ----------------------------------------------------------------------------------- fine-tuning from a file
_STAGE = {"depth": 1, "dim": 32, "heads": 2}
_HEAD_KINDS = {  # (stem, head) kinds: linear, distilled linear, LeViT NormLinear (+ distilled), class attention
    "patch_linear": {"stem": {"kind": "patch", "patch_size": 8}, "tokens": {"cls_token": "input"}},
    "patch_distilled": {"stem": {"kind": "patch", "patch_size": 8},
                        "tokens": {"cls_token": "input", "dist_token": True},
                        "head": {"num_classes": 10, "distillation": True}},
    "conv_normlinear": {"stem": {"kind": "conv", "channels": [8, 16, 32]},
                        "stages": [{**_STAGE, "norm": "batchnorm", "key_dim": 8, "attention": "levit_bias"}],
                        "tokens": {"cls_token": "none", "pos_embed": "none"},
                        "head": {"pool": "mean", "num_classes": 10}},
    "conv_normlinear_distilled": {
        "stem": {"kind": "conv", "channels": [8, 16, 32]},
        "stages": [{**_STAGE, "norm": "batchnorm", "key_dim": 8, "attention": "levit_bias"}],
        "tokens": {"cls_token": "none", "pos_embed": "none"},
        "head": {"pool": "mean", "num_classes": 10, "distillation": True}},
    "patch_class_attention": {"stem": {"kind": "patch", "patch_size": 8}, "tokens": {"cls_token": 1},
                              "class_attention": {"depth": 1}},
    "identity_linear": {"stem": {"kind": "identity", "patch_size": 4}, "stages": [{**_STAGE, "dim": 48}],
                        "tokens": {"cls_token": "none", "pos_embed": "none"},
                        "head": {"pool": "mean", "num_classes": 10}},
}


def _fine_tune_source(kind: str, tmp_path: Path) -> tuple[str, dict[str, torch.Tensor]]:
    """Register the kind's spec with timm and save randomised weights; return (timm name, saved state)."""
    spec = {"name": f"ft_{kind}", "input": {"channels": 3, "resolution": 32}, "stages": [_STAGE],
            "head": {"num_classes": 10}, **_HEAD_KINDS[kind]}
    model = compile(spec)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.uniform_(0.5, 1.5)  # every tensor recognisable, BatchNorm variances positive
    archspec.save(model, tmp_path)
    return archspec.register(spec, name=f"finetune_{kind}"), model.state_dict()


@pytest.mark.parametrize("kind", sorted(_HEAD_KINDS))
def test_fine_tuning_from_a_file_with_other_classes_and_channels(kind: str, tmp_path: Path, one_thread) -> None:
    """timm's loader drops the classifier(s) named by pretrained_cfg and adapts the first conv, as for timm's own."""
    name, saved = _fine_tune_source(kind, tmp_path)
    source = {"pretrained": True, "pretrained_cfg_overlay": {"file": str(tmp_path / "model.safetensors")}}
    tuned = timm.create_model(name, num_classes=5, **source).eval()
    classifiers = tuned.pretrained_cfg["classifier"]
    classifiers = [classifiers] if isinstance(classifiers, str) else list(classifiers)
    for key, value in tuned.state_dict().items():
        if key.rsplit(".", 1)[0] in classifiers:
            assert value.shape[0] == 5 and not torch.equal(value, torch.ones_like(value)), key  # fresh, 5 classes
        else:
            assert torch.equal(value, saved[key]), key  # everything else is the file's
    assert tuned(torch.randn(2, 3, 32, 32)).shape == (2, 5)
    if kind.startswith("identity"):  # the identity stem's token width is channels x patch^2: another architecture
        with pytest.raises(SpecError, match="identity stem"):
            timm.create_model(name, in_chans=1, **source)
        return
    grey = timm.create_model(name, in_chans=1, **source).eval()
    first = grey.pretrained_cfg["first_conv"] + ".weight"
    for key, value in grey.state_dict().items():
        expected = saved[key].sum(dim=1, keepdim=True) if key == first else saved[key]  # timm adapt_input_conv
        assert torch.allclose(value, expected), key
    assert grey(torch.randn(2, 1, 32, 32)).shape == (2, 10)
