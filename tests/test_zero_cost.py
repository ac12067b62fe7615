"""archspec.search._evaluation.zero_cost: NASWOT, SynFlow and grad-norm against hand computations and brute force."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from archspec import compile, load_spec
from archspec.search._evaluation.zero_cost import (
    ZERO_COST_SCORES,
    grad_norm,
    hamming_kernel,
    naswot,
    naswot_kernel,
    synflow,
    synflow_saliencies,
    zero_cost_scores,
)

# A LeViT-like (BatchNorm, Hardswish, conv stem, shrinking attention, distillation head) and a DeiT-like
# (LayerNorm, GELU, class token) spec at 32 px: both block families, small enough to build in well under 1 s.
LEVIT = {
    "name": "zc_levit", "input": {"channels": 3, "resolution": 32},
    "stem": {"kind": "conv", "channels": [8, 16], "activation": "hardswish"},
    "tokens": {"cls_token": "none", "pos_embed": "none"},
    "stages": [
        {"depth": 1, "dim": 16, "heads": 2, "key_dim": 8, "attn_ratio": 2, "mlp_ratio": 2, "norm": "batchnorm",
         "act": "hardswish", "qkv_bias": False, "attention": "levit_bias"},
        {"depth": 1, "dim": 24, "heads": 2, "key_dim": 8, "attn_ratio": 2, "mlp_ratio": 2, "norm": "batchnorm",
         "act": "hardswish", "qkv_bias": False, "attention": "levit_bias", "shrink": {"key_dim": 8}},
    ],
    "head": {"pool": "mean", "num_classes": 10, "distillation": True},
}
DEIT = {
    "name": "zc_deit", "input": {"channels": 3, "resolution": 32}, "stem": {"kind": "patch", "patch_size": 8},
    "tokens": {"cls_token": "input", "pos_embed": "learned"},
    "stages": [{"depth": 2, "dim": 32, "heads": 2, "mlp_ratio": 2, "qkv_bias": True, "norm": "layernorm",
                "act": "gelu", "attention": "mhsa"}],
    "head": {"pool": "cls", "num_classes": 10},
}


def _model(doc: dict, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return compile(load_spec(doc))


def _batch(n: int = 8, size: int = 32, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g), torch.randint(0, 10, (n,), generator=g)


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_untouched(model: nn.Module, before: dict[str, torch.Tensor], modes: list[bool]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)  # weights and BatchNorm statistics
    assert [m.training for m in model.modules()] == modes
    assert all(p.grad is None for p in model.parameters())


# --------------------------------------------------------------------------------------- NASWOT
def test_naswot_hand_computed():
    # Pre-activations W x with W = [[1, 0], [0, 1], [1, -1]] (no bias), codes 1[> 0]:
    #   x1 = ( 2,  1) -> ( 2,  1, 1) -> c1 = (1, 1, 1)
    #   x2 = ( 1, -1) -> ( 1, -1, 2) -> c2 = (1, 0, 1)
    #   x3 = (-1, -2) -> (-1, -2, 1) -> c3 = (0, 0, 1)
    # N_A = 3, d_H(c1, c2) = 1, d_H(c1, c3) = 2, d_H(c2, c3) = 1, so K = [[3, 2, 1], [2, 3, 2], [1, 2, 3]]
    # and |K| = 3 (9 - 4) - 2 (6 - 2) + 1 (4 - 3) = 15 - 8 + 1 = 8.
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 3, bias=False), nn.ReLU())
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]))
    images = torch.tensor([[2.0, 1.0], [1.0, -1.0], [-1.0, -2.0]]).reshape(3, 2, 1, 1)
    expected = torch.tensor([[3, 2, 1], [2, 3, 2], [1, 2, 3]], dtype=torch.float64)
    assert torch.equal(naswot_kernel(net, images), expected)
    assert naswot(net, images) == pytest.approx(math.log(8.0), abs=1e-12)


def test_naswot_hooks_every_rectifier_type_and_in_place_relu():
    # Units: 3 before GELU, 4 before Hardswish, 4 before SiLU, 2 before an in-place ReLU, as maps (B, C, H, W)
    # for the conv: the diagonal of K is N_A = 3 + 4 + 4 + 2 * 2 * 2 = 19.
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3), nn.GELU(), nn.Linear(3, 4), nn.Hardswish(), nn.SiLU(),
                        nn.Unflatten(1, (1, 2, 2)), nn.Conv2d(1, 2, 1), nn.ReLU(inplace=True), nn.Flatten())
    images = torch.randn(5, 4, 1, 1)
    kernel = naswot_kernel(net, images)
    assert torch.equal(kernel.diagonal(), torch.full((5,), 19.0, dtype=torch.float64))
    assert torch.equal(kernel, kernel.T)


def test_naswot_identical_images_are_singular():
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    images = torch.randn(1, 3, 2, 2).expand(4, -1, -1, -1)
    assert naswot(net, images) == float("-inf")
    # a duplicated image in an otherwise varied batch, through BatchNorm in train mode (archspec model)
    images, _ = _batch(6)
    images[3] = images[0]
    assert naswot(_model(LEVIT), images) == float("-inf")


def test_hamming_kernel_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    codes = torch.rand(7, 53, generator=g) > 0.5
    brute = torch.tensor([[53 - sum(int(a != b) for a, b in zip(ci.tolist(), cj.tolist())) for cj in codes]
                          for ci in codes], dtype=torch.float64)
    assert torch.equal(hamming_kernel(codes), brute)
    c = codes.double()  # the paper's form c c^T + (1 - c)(1 - c)^T
    assert torch.equal(hamming_kernel(codes), c @ c.T + (1 - c) @ (1 - c).T)


def test_naswot_rejects_models_without_rectifiers():
    with pytest.raises(ValueError, match="rectified units"):
        naswot(nn.Sequential(nn.Flatten(), nn.Linear(4, 2), nn.Tanh()), torch.randn(3, 4, 1, 1))
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        naswot(nn.ReLU(), torch.randn(3, 4))


# --------------------------------------------------------------------------------------- SynFlow
def test_synflow_hand_computed_two_layers():
    # |W1| = [[1, 2], [3, 4]], |W2| = [[5, 6]]: R = 1^T |W2| |W1| 1 = [5, 6] . [3, 7] = 57.
    # dR/dW2 = (|W1| 1)^T = [3, 7] -> sum |W2| dR/dW2 = 15 + 42 = 57;
    # dR/dW1[i, j] = |W2|[i] -> sum |W1| dR/dW1 = 5 (1 + 2) + 6 (3 + 4) = 57.  Score 114 = 2 R.
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 2, bias=False), nn.Linear(2, 1, bias=False))
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[1.0, -2.0], [3.0, -4.0]]))
        net[2].weight.copy_(torch.tensor([[-5.0, 6.0]]))
    saliency = synflow_saliencies(net, (2, 1, 1))
    assert torch.equal(saliency["2.weight"], torch.tensor([[15.0, 42.0]], dtype=torch.float64))
    assert torch.equal(saliency["1.weight"], torch.tensor([[5.0, 10.0], [18.0, 24.0]], dtype=torch.float64))
    assert synflow(net, (2, 1, 1)) == 114.0


def test_synflow_linear_chain_is_depth_times_flow():
    # Euler's theorem: R is degree-1 homogeneous in each of the L weight matrices, so sum theta dR/dtheta = L R.
    torch.manual_seed(0)
    layers = [nn.Linear(6, 5, bias=False), nn.Linear(5, 4, bias=False), nn.Linear(4, 3, bias=False)]
    net = nn.Sequential(nn.Flatten(), *layers)
    flow = torch.ones(6, dtype=torch.float64)
    for layer in layers:
        flow = layer.weight.detach().double().abs() @ flow
    assert synflow(net, (6, 1, 1)) == pytest.approx(3 * flow.sum().item(), rel=1e-12)


def test_synflow_batchnorm_uses_running_statistics():
    # Linear W = [[-2, 3]] then BatchNorm1d with gamma = -1.5, beta = 0.5, fresh statistics (mean 0, var 1),
    # in eval mode: R = 1.5 * 5 / sqrt(1 + eps) + 0.5 (a batch of one would have no variance in train mode).
    # R is degree-1 homogeneous in W and in gamma: S = 2 * 1.5 * 5 / sqrt(1 + eps) + beta * 1.
    net = nn.Sequential(nn.Flatten(), nn.Linear(2, 1, bias=False), nn.BatchNorm1d(1)).train()
    with torch.no_grad():
        net[1].weight.copy_(torch.tensor([[-2.0, 3.0]]))
        net[2].weight.fill_(-1.5)
        net[2].bias.fill_(0.5)
    before, modes = _snapshot(net), [m.training for m in net.modules()]
    assert synflow(net, (2, 1, 1)) == pytest.approx(15.0 / math.sqrt(1 + 1e-5) + 0.5, rel=1e-12)
    _assert_untouched(net, before, modes)


@pytest.mark.parametrize("train", [True, False])
def test_synflow_leaves_the_model_untouched(train):
    model = _model(LEVIT).train(train)
    model.stages[0].train(not train)  # mixed modes come back as they were
    before, modes = _snapshot(model), [m.training for m in model.modules()]
    assert math.isfinite(synflow(model, (3, 32, 32)))
    _assert_untouched(model, before, modes)
    assert next(model.parameters()).dtype == torch.float32


def test_synflow_reaches_attention_weights():
    # archspec's LayerNorm attention reads a detached stacked qk/v weight in eval mode; the score must not.
    saliency = synflow_saliencies(_model(DEIT).eval(), (3, 32, 32))
    for name in ("stages.0.blocks.0.attn.qk.weight", "stages.0.blocks.1.attn.v.weight"):
        assert saliency[name].sum() > 0


# --------------------------------------------------------------------------------------- grad-norm
def test_grad_norm_hand_computed_linear_classifier():
    # L = mean CE(x W^T + b): dL/dW = (softmax(x W^T + b) - onehot)^T x / B; only weights count (not b).
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    x, labels = torch.randn(5, 4), torch.tensor([0, 2, 1, 2, 0])
    w, b = net[1].weight.detach(), net[1].bias.detach()
    grad = (torch.softmax(x @ w.T + b, dim=1) - nn.functional.one_hot(labels, 3).float()).T @ x / 5
    assert grad_norm(net, x.reshape(5, 4, 1, 1), labels) == pytest.approx(grad.norm().item(), rel=1e-6)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("score", ["grad_norm", "naswot"])
def test_scores_leave_the_model_untouched(score, train):
    model = _model(LEVIT).train(train)
    model.head.linear.weight.requires_grad_(False)  # a frozen layer is scored and stays frozen
    before, modes = _snapshot(model), [m.training for m in model.modules()]
    images, labels = _batch()
    assert (grad_norm(model, images, labels) if score == "grad_norm" else naswot(model, images)) > 0
    _assert_untouched(model, before, modes)  # BatchNorm statistics too: train-mode forwards update them
    assert not model.head.linear.weight.requires_grad and model.stem.conv1.linear.weight.requires_grad


def test_tuple_output_is_averaged():
    # A distilled model in distilled training returns (cls, dist) in train mode; averaged, it is the
    # model's ordinary output, so every score is the same either way.
    model = _model(LEVIT)
    images, labels = _batch()
    plain = zero_cost_scores(model, images, labels).scores
    model.set_distilled_training(True)
    assert isinstance(copy.deepcopy(model).train()(images), tuple)  # a copy: train-mode forwards update BN
    assert zero_cost_scores(model, images, labels).scores == pytest.approx(plain, rel=1e-12)


# --------------------------------------------------------------------------------------- all
@pytest.mark.parametrize("doc", [LEVIT, DEIT], ids=["levit", "deit"])
def test_zero_cost_scores_on_archspec_models(doc):
    images, labels = _batch()
    result = zero_cost_scores(_model(doc), images, labels)
    assert list(result.scores) == list(ZERO_COST_SCORES) == list(result.seconds)
    assert not math.isnan(result.scores["naswot"]) and result.scores["naswot"] > 0  # 8 distinct images
    assert 0 < result.scores["synflow"] < math.inf and 0 < result.scores["grad_norm"] < math.inf
    assert all(s >= 0 for s in result.seconds.values())
    assert list(zero_cost_scores(_model(doc), images, labels, names=["grad_norm"]).scores) == ["grad_norm"]


@pytest.mark.parametrize("name", ["params", "snip"])
def test_unknown_score_name(name):
    images, labels = _batch(2)
    with pytest.raises(ValueError, match=repr(name)):
        zero_cost_scores(nn.Identity(), images, labels, names=["naswot", name])
