"""LeViT BatchNorm folding (LeViT sec. 5.3): the folded model equals the unfolded one in eval mode."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import archspec
from archspec.cli import main
from archspec.ir.checked import load_spec
from archspec.nn.fuse import count_batchnorms


def _small_levit() -> nn.Module:
    spec = load_spec("levit_128s").model_dump(mode="json", exclude_none=True)
    spec["input"]["resolution"] = 64  # 4x4 grid after the stem: a tiny but complete LeViT (shrinks, NormLinear head)
    torch.manual_seed(0)
    return _randomise_batchnorms(archspec.compile(spec))


def test_fused_levit_equals_unfolded(one_thread):
    model = _small_levit()
    folded = model.fuse()
    assert count_batchnorms(model) > 0 and count_batchnorms(folded) == 0
    # a BN of C channels after a linear/conv: weight + bias (2C) become the linear's bias (C), so C fewer;
    # the head's BN before its linear (timm NormLinear) folds into the existing bias: 2C fewer
    bn_channels = sum(m.num_features for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    head_bn = sum(m.bn.num_features for m in model.modules() if type(m).__name__ == "NormLinear")
    params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert params(model) - params(folded) == (bn_channels - head_bn) + 2 * head_bn
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), atol=1e-5, rtol=1e-5)
    assert model.training is False and any(isinstance(m, nn.BatchNorm1d) for m in model.modules())  # copy by default


@pytest.mark.slow
def test_build_fuse_reports_the_folded_model(tmp_path, capsys, one_thread):
    out = tmp_path / "levit"
    assert main(["build", "levit_128s", "--resolution", "64", "--out", str(out), "--repeats", "1", "--fuse",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fused"]["batchnorms_folded"] > 0 and report["fused"]["max_abs_logit_diff"] < 1e-5
    assert report["fused"]["params"] < report["params"]
    assert any(key.endswith(".bn.running_var") for key in archspec.load(out).state_dict())  # saved unfolded


def test_analyze_counts_the_folded_model(one_thread):
    from archspec.ir.analysis import analyze

    model = _small_levit()
    spec = load_spec("levit_128s").model_dump(mode="json", exclude_none=True)
    spec["input"]["resolution"] = 64
    analysis = analyze(spec)
    assert analysis.params == sum(p.numel() for p in model.parameters())
    assert analysis.params_folded == sum(p.numel() for p in model.fuse().parameters())
    assert analysis.macs_executed == analysis.macs  # no masked heads: BatchNorm is 0 MACs either way


def _randomise_batchnorms(model: nn.Module) -> nn.Module:
    for module in model.modules():  # non-trivial running statistics and affine parameters
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.normal_(0, 0.2)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.normal_(1.0, 0.2)
            module.bias.data.normal_(0.0, 0.2)
    return model.eval()


# A small hybrid: tiered deep stem with a conv pool, a ResNeXt stage with an avg shortcut, a T-CNN GPSA stage, an
# attention stage, then a conv tail whose second block holds BoTNet attention (timm's BottleneckAttn: its bn2 stays,
# no output projection before it) and a third block holding archspec's attention (LeViT bias and MaiT masks) at
# stride 2 (its bn2 folds into the output projection, through the average pool).
HYBRID = {
    "name": "fuse_hybrid", "input": {"channels": 3, "resolution": 64},
    "stem": {"kind": "resnet", "deep": True, "widths": [8, 12], "channels": 16, "pool": "conv"},
    "tokens": {"cls_token": "input", "pos_embed": "learned"},
    "stages": [{"kind": "conv", "block": "bottleneck", "depth": 1, "channels": 64, "groups": 2, "base_width": 32,
                "downsample": "avg"},
               {"kind": "conv", "block": "bottleneck", "depth": 1, "channels": 64, "mixer": {"kind": "gpsa"}},
               {"depth": 1, "dim": 32, "heads": 2, "from_map": {"pool": "avg", "grid": 8}},
               {"kind": "conv", "block": "basic", "depth": 1, "channels": 32},
               {"kind": "conv", "block": "bottleneck", "depth": 2, "channels": 64, "stride": 2,
                "mixer": {"kind": "attention", "heads": 2, "layers": [1]}},
               {"kind": "conv", "block": "bottleneck", "depth": 1, "channels": 64, "stride": 2,
                "mixer": {"kind": "attention", "heads": 2, "head_kinds": ["levit_bias", "mask:3x3"]}}],
    "head": {"pool": "mean", "num_classes": 10},
}


@pytest.mark.parametrize("doc", [HYBRID, "resnet26t"], ids=["hybrid", "resnet26t"])
def test_fused_conv_stages_equal_unfolded_and_the_analysis_counts_them(doc, one_thread):
    """Every conv -> BatchNorm pair of the stem and the conv stages folds, and a bottleneck's bn2 into T-CNN's GPSA
    and into archspec's attention (only timm BottleneckAttn's stays); logits within 1e-5 of the unfolded model;
    ``analyze``'s folded parameters equal the folded module's."""
    from archspec.ir.analysis import analyze

    spec = load_spec(doc).model_dump(mode="json") if isinstance(doc, str) else doc
    spec["input"]["resolution"] = 64
    torch.manual_seed(0)
    model = _randomise_batchnorms(archspec.compile(spec))
    folded = model.fuse()
    kept = [n for n, m in folded.named_modules() if isinstance(m, nn.BatchNorm2d)]
    if doc == "resnet26t":
        assert kept == []
    else:  # timm BottleneckAttn's bn2 only
        assert kept == ["stages.4.blocks.1.bn2"]
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(folded(x), model(x), atol=1e-5, rtol=1e-5)
    params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert analyze(spec).params_folded == params(folded) < params(model)


def test_the_hybrid_traces_with_fx_and_extracts_its_tail_features(one_thread):
    """torch.fx traces a hybrid whose conv stages hold T-CNN's GPSA and attention, and a conv tail after the
    attention stage (those mixers are FX leaves; the tail's map size is read only for a feature level): the traced
    module's logits equal the model's, and torchvision's feature extractor returns the tail's last map."""
    from torchvision.models.feature_extraction import create_feature_extractor

    from archspec.nn.model import FX_LEAF_MODULES, symbolic_trace

    torch.manual_seed(0)
    model = _randomise_batchnorms(archspec.compile(HYBRID))
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(symbolic_trace(model)(x), model(x))
        extractor = create_feature_extractor(model, {"stages.5.blocks.0": "tail"},
                                             tracer_kwargs={"leaf_modules": list(FX_LEAF_MODULES)})
        torch.testing.assert_close(extractor(x)["tail"], model.forward_features(x))
