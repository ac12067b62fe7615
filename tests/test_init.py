"""Fresh models are initialised as timm initialises the same architecture (DeiT/ViT, ConViT, LeViT, CaiT).

For every shipped spec with a timm twin (``TIMM_EQUIVALENTS``), archspec's fresh state dict is renamed to
timm's keys (:func:`archspec.timm_bridge.convert.to_timm`) and compared tensor by tensor with timm's fresh model:

* the deterministic tensors -- the same under two seeds: zero biases, LayerNorm and BatchNorm constants,
  LayerScale, gating, ConViT's local init of ``v`` and ``pos_proj`` -- are the same set, with equal values;
* every random tensor has timm's mean and standard deviation within sampling error (5 standard errors).

Logit parity after a weight transfer cannot see any of this; a model trained from ``compile(spec)`` can.
"""

from __future__ import annotations

import math

import pytest
import timm
import torch

import archspec
from archspec.ir.checked import load_spec
from archspec.timm_bridge.convert import TIMM_EQUIVALENTS, to_timm


def _timm_state(name: str, seed: int) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    torch.manual_seed(seed)
    model = timm.create_model(TIMM_EQUIVALENTS[name], pretrained=False)
    return model, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _archspec_state(name: str, seed: int, timm_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    spec = load_spec(name)
    model = archspec.compile(spec.model_copy(update={"seed": seed}))
    return {k: v.detach().clone() for k, v in to_timm(model, timm_model).items()}


def _deterministic(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> set[str]:
    return {k for k in a if torch.equal(a[k], b[k])}


def init_problems(theirs: dict[str, torch.Tensor], theirs_again: dict[str, torch.Tensor],
                  ours: dict[str, torch.Tensor], ours_again: dict[str, torch.Tensor]) -> list[str]:
    """How two fresh state dicts under timm's names (seeds 0 and 1 each) break timm's init: another key set,
    other seed-independent tensors or values, a random tensor's mean or std beyond 5 standard errors of timm's."""
    assert set(ours) == set(theirs)
    fixed = _deterministic(theirs, theirs_again)
    assert _deterministic(ours, ours_again) == fixed, "tensors that do not depend on the seed differ from timm's"
    problems = []
    for key in sorted(theirs):
        t, o = theirs[key], ours[key]
        if key in fixed:
            if not torch.equal(t, o):
                problems.append(f"{key}: constant {o.flatten()[:4].tolist()}..., timm {t.flatten()[:4].tolist()}...")
            continue
        t, o = t.double(), o.double()
        n = t.numel()
        std = t.std().item()
        if abs(o.mean().item() - t.mean().item()) > 5 * std / math.sqrt(n) + 1e-9:
            problems.append(f"{key}: mean {o.mean().item():.3g}, timm {t.mean().item():.3g}")
        if abs(o.std().item() / std - 1) > 5 / math.sqrt(2 * (n - 1)) + 0.01:
            problems.append(f"{key}: std {o.std().item():.3g}, timm {std:.3g} ({n} values)")
    return problems


@pytest.mark.parametrize("name", sorted(TIMM_EQUIVALENTS))
@pytest.mark.slow
def test_fresh_weights_follow_timms_init(name: str) -> None:
    timm_model, theirs = _timm_state(name, 0)
    _, theirs_again = _timm_state(name, 1)
    ours = _archspec_state(name, 0, timm_model)
    ours_again = _archspec_state(name, 1, timm_model)
    problems = init_problems(theirs, theirs_again, ours, ours_again)
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_class_token_rule_follows_its_placement() -> None:
    """A class token at the input is ViT's ``normal(1e-6)``; one inserted later is ConViT/CaiT's trunc-normal .02."""
    at_input = archspec.compile("deit_tiny").cls_token
    later = archspec.compile("convit_tiny").cls_token
    assert at_input.abs().max().item() < 1e-4 and 0.01 < later.std().item() < 0.03
