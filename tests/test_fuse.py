"""LeViT BatchNorm folding (LeViT sec. 5.3): the folded model equals the unfolded one in eval mode."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import archspec
from archspec.cli import main
from archspec.fuse import count_batchnorms
from archspec.loader import load_spec


def _small_levit() -> nn.Module:
    spec = load_spec("levit_128s").model_dump(mode="json", exclude_none=True)
    spec["input"]["resolution"] = 64  # 4x4 grid after the stem: a tiny but complete LeViT (shrinks, NormLinear head)
    torch.manual_seed(0)
    model = archspec.compile(spec)
    for module in model.modules():  # non-trivial running statistics and affine parameters
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.normal_(0, 0.2)
            module.running_var.uniform_(0.5, 2.0)
            module.weight.data.normal_(1.0, 0.2)
            module.bias.data.normal_(0.0, 0.2)
    return model.eval()


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
    from archspec.analysis import analyze

    model = _small_levit()
    spec = load_spec("levit_128s").model_dump(mode="json", exclude_none=True)
    spec["input"]["resolution"] = 64
    analysis = analyze(spec)
    assert analysis.params == sum(p.numel() for p in model.parameters())
    assert analysis.params_folded == sum(p.numel() for p in model.fuse().parameters())
    assert analysis.macs_executed == analysis.macs  # no masked heads: BatchNorm is 0 MACs either way
