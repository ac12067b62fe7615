"""Weight parity with timm: the same weights give the same logits, both directions (issue: timm parity)."""

from __future__ import annotations

import pytest
import timm
import torch

import archspec
from archspec.timm_bridge.convert import TIMM_EQUIVALENTS, load_timm_weights, to_timm

PARITY = ["deit_tiny", "convit_tiny", "levit_128s"]


def _randomise_bn(model: torch.nn.Module, seed: int) -> None:
    """Give BatchNorm layers non-trivial statistics and affine parameters so eval-mode BN is really tested."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d | torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(m.weight.shape, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
        for name in ("attention_biases", "gating_param"):
            if hasattr(m, name) and isinstance(getattr(m, name), torch.nn.Parameter):
                getattr(m, name).data.normal_(0, 0.5, generator=g)


def _timm(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(TIMM_EQUIVALENTS[name], pretrained=False)
    _randomise_bn(model, 1)
    model.eval()
    return model


@pytest.mark.parametrize("name", PARITY)
@pytest.mark.slow
def test_timm_weights_give_timm_logits(name: str, real_images: torch.Tensor) -> None:
    reference = _timm(name)
    model = archspec.compile(name)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())
    load_timm_weights(model, reference)
    model.eval()
    with torch.no_grad():
        expected, got = reference(real_images), model(real_images)
    assert got.shape == expected.shape == (3, 1000)
    assert (got - expected).abs().max().item() <= 1e-5
    assert expected.std() > 1e-3  # the comparison is not between two constant outputs


@pytest.mark.parametrize("name", ["deit_tiny", "levit_128s"])
@pytest.mark.slow
def test_archspec_weights_give_same_logits_in_timm(name: str, real_images: torch.Tensor) -> None:
    model = archspec.compile(name)
    _randomise_bn(model, 2)
    model.eval()
    reference = _timm(name)
    reference.load_state_dict(to_timm(model, reference), strict=True)
    reference.eval()
    with torch.no_grad():
        assert (model(real_images) - reference(real_images)).abs().max().item() <= 1e-5


@pytest.mark.slow
def test_converter_rejects_a_deeper_timm_model() -> None:
    model = archspec.compile({"stages": [{"depth": 2, "dim": 192, "heads": 3}]})
    with pytest.raises(ValueError, match="no counterpart"):
        load_timm_weights(model, timm.create_model("deit_tiny_patch16_224"))
