"""archspec.io.datasets, archspec.search._evaluation.proxy and .latency: datasets, proxy adaptation and training,
latency and
its cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import archspec.nn.compiler as COMPILE_MODULE
from archspec import SpecError, analyze, load_spec
from archspec.io.datasets import load_data
from archspec.search._evaluation.latency import LatencyCache, LatencyProtocol, architecture_key, measure_latency
from archspec.search._evaluation.proxy import ProxyProtocol, TrainingFailure, proxy_spec, train_proxy

TINY = load_spec({
    "name": "tiny_proxy", "input": {"channels": 3, "resolution": 224},
    "stem": {"kind": "conv", "channels": [8, 16, 32, 32]}, "tokens": {"cls_token": "none", "pos_embed": "none"},
    "stages": [
        {"depth": 1, "dim": 32, "heads": 2, "key_dim": 8, "attn_ratio": 2, "mlp_ratio": 2, "norm": "batchnorm",
         "act": "hardswish", "qkv_bias": False, "attention": "levit_bias",
         "layers": [{"range": 0, "heads": [{"rel_bias": {}, "mask": {"window": "5x5"}}, "levit_bias"]}]},
        {"depth": 1, "dim": 48, "heads": 2, "key_dim": 8, "attn_ratio": 2, "mlp_ratio": 2, "norm": "batchnorm",
         "act": "hardswish", "qkv_bias": False, "attention": {"rel_bias": {}, "mask": {"window": "3x3"}},
         "shrink": {"key_dim": 8}},
    ],
    "head": {"pool": "mean", "num_classes": 1000},
})
FAST = ProxyProtocol(image_size=32, steps=12, batch_size=16, warmup_steps=2, eval_every=6, lr=3e-3, threads=1)


@pytest.fixture(scope="module")
def digits():
    return load_data(None, 32, seed=0, max_images=300)


# --------------------------------------------------------------------------------------- data
@pytest.mark.slow
def test_digits_default():
    data = load_data(None, 16)
    assert data.name == "digits" and data.num_classes == 10 and data.channels == 3 and data.image_size == 16
    x, y = data.train.tensors
    xv, yv = data.val.tensors
    assert x.shape == (1437, 3, 16, 16) and xv.shape == (360, 3, 16, 16) and x.dtype == torch.float32
    assert y.dtype == torch.long and set(y.tolist()) == set(range(10))
    ratio = np.bincount(yv.numpy(), minlength=10) / np.bincount(y.numpy(), minlength=10)  # stratified
    assert np.all(np.abs(ratio - 0.25) < 0.03)
    again = load_data(None, 16)
    assert torch.equal(again.train.tensors[0], x) and torch.equal(again.val.tensors[1], yv)
    other = load_data(None, 16, seed=1)
    assert not torch.equal(other.val.tensors[1], yv)
    assert abs(x.mean().item()) < 1e-3  # normalised with the train statistics


def test_digits_max_images(digits):
    assert len(digits.train) + len(digits.val) == 300 and len(digits.val) == 60
    assert set(digits.val.tensors[1].tolist()) == set(range(10))


def test_image_folder(tmp_path):
    from PIL import Image

    for c, colour in (("cat", (255, 0, 0)), ("dog", (0, 0, 255))):
        (tmp_path / c).mkdir()
        for k in range(5):
            Image.new("RGB", (10 + k, 12), colour).save(tmp_path / c / f"{k}.png")
    data = load_data(tmp_path, 8)
    assert data.num_classes == 2 and len(data.train) == 8 and len(data.val) == 2
    assert sorted(data.val.tensors[1].tolist()) == [0, 1]
    assert data.train.tensors[0].shape[1:] == (3, 8, 8)


@pytest.mark.parametrize("make", ["missing", "file", "empty"])
def test_bad_data_paths(tmp_path, make):
    path = tmp_path / "data"
    if make == "file":
        path.write_text("x")
    elif make == "empty":
        path.mkdir()
    with pytest.raises(SpecError) as info:
        load_data(path, 16)
    problem = info.value.problems[0]
    assert problem.path == ("data",) and problem.file == str(path)


# --------------------------------------------------------------------------------------- proxy
def test_proxy_spec_keeps_the_grids_and_adapts_stem_input_and_classes(digits):
    ps = proxy_spec(TINY, digits, FAST)
    # 224 px through 4 stride-2 convs is 14x14; at most 32 px, one conv keeps it: 28 px -> 14x14
    assert ps.input.resolution == (28, 28) and ps.input.channels == 3 and ps.head.num_classes == 10
    assert ps.stem.channels == [32]
    rows = {r.layer: r for r in analyze(ps).rows}
    assert rows["stages.0.blocks.0"].grid == (14, 14) and rows["stages.1.blocks.0"].grid == (7, 7)
    plan0, plan1 = ps.layer_plans(0)[0], ps.layer_plans(1)[0]
    assert plan0.heads[0].mask.window == (5, 5) and all(h.mask.window == (3, 3) for h in plan1.heads)
    assert ps.stages == TINY.stages  # the candidate's own stages, heads, masks and biases
    small = proxy_spec(TINY, digits, ProxyProtocol(image_size=32, min_grid=4))
    # the smallest first grid from 4 up that holds stage 0's 5x5 window and stage 1's 3x3: 5x5 -> 3x3, at
    # 5 * 2**2 = 20 px with the last two stride-2 convs (5 * 2**3 = 40 px would exceed 32)
    assert [r.grid for r in analyze(small).rows if r.layer.endswith("blocks.0")] == [(5, 5), (3, 3)]
    assert small.stem.channels == [32, 32] and small.input.resolution == (20, 20)
    big = proxy_spec(load_spec("levit_128s"), digits, ProxyProtocol(image_size=64))
    assert big.stem.channels == [64, 128] and big.input.resolution == (56, 56)  # 14x14, as at 224 px
    deit = proxy_spec(load_spec("mait_tiny_sch2"), digits, ProxyProtocol(image_size=32))
    assert deit.stem.patch_size == 2 and deit.input.resolution == (28, 28)
    assert deit.layer_plans(0)[0].heads[0].mask.window == (3, 3)


@pytest.mark.slow
def test_train_proxy_runs_and_is_deterministic(digits):
    calls = []
    result = train_proxy(TINY, digits, FAST, seed=0, report=lambda step, acc: calls.append((step, acc)))
    assert [s for s, _ in calls] == [6, 12] and result.steps == 12 and result.history == calls
    assert 0.0 <= result.accuracy <= 1.0 and np.isfinite(result.val_loss) and np.isfinite(result.train_loss)
    assert result.train_loss < 2.45 and result.seconds > 0  # below chance cross-entropy ln(10) = 2.30 + slack
    again = train_proxy(TINY, digits, FAST, seed=0)
    assert (again.accuracy, again.train_loss, again.val_loss) == (result.accuracy, result.train_loss, result.val_loss)
    threads = torch.get_num_threads()
    train_proxy(TINY, digits, ProxyProtocol.from_dict({**FAST.describe(), "steps": 2, "threads": threads + 1}))
    assert torch.get_num_threads() == threads


@pytest.mark.slow
def test_train_proxy_improves_over_chance(digits):
    protocol = ProxyProtocol(image_size=32, steps=60, batch_size=32, warmup_steps=5, eval_every=60, lr=3e-3, threads=1)
    assert train_proxy(TINY, digits, protocol, seed=0).accuracy > 0.3  # chance is 0.1


def test_report_may_prune(digits):
    import optuna

    def prune(step, acc):
        raise optuna.TrialPruned()

    with pytest.raises(optuna.TrialPruned):
        train_proxy(TINY, digits, FAST, report=prune)


@pytest.mark.parametrize("kind", ["nan", "error"])
def test_training_failures(digits, kind):
    def break_model(model):
        if kind == "nan":
            model.register_forward_hook(lambda mod, inp, out: out * float("nan"))
        else:
            def boom(mod, inp, out):
                raise RuntimeError("kaboom inside the model")
            model.stem.register_forward_hook(boom)

    with pytest.raises(TrainingFailure) as info:
        train_proxy(TINY, digits, FAST, on_model=break_model)
    assert ("nan" in info.value.reason) if kind == "nan" else ("kaboom" in info.value.reason)


def test_tse_score_is_minus_the_mean_of_every_steps_loss(digits, monkeypatch):
    """--proxy-score tse: the score is -(sum of every step's training loss) / steps, reported at each eval point
    with the losses so far; checked against the losses Trainer.step returned, recorded here."""
    from dataclasses import replace

    from archspec.train import loop

    losses, step = [], loop.Trainer.step

    def recorded(self, *args):
        loss = step(self, *args)
        losses.append(float(loss))
        return loss

    monkeypatch.setattr(loop.Trainer, "step", recorded)
    calls = []
    result = train_proxy(TINY, digits, replace(FAST, score="tse"), seed=0, report=lambda s, v: calls.append((s, v)))
    assert len(losses) == 12 and result.loss_sum == pytest.approx(sum(losses), rel=1e-6)
    assert result.score == pytest.approx(-sum(losses) / 12, rel=1e-6)
    assert [s for s, _ in calls] == [6, 12] and calls == result.history
    assert calls[0][1] == pytest.approx(-sum(losses[:6]) / 6, rel=1e-6)
    assert calls[1][1] == pytest.approx(result.score) and 0 <= result.accuracy <= 1


def test_protocol_validation():
    assert ProxyProtocol().describe()["image_size"] == 64
    assert ProxyProtocol().score == "accuracy"  # the default since issue 82 (TSE from the finished table until then)
    assert "score" not in ProxyProtocol().describe()  # studies from before the score resume
    assert ProxyProtocol(score="tse").describe()["score"] == "tse"  # and those written while TSE was the default
    with pytest.raises(SpecError):
        ProxyProtocol(augmentation="mixup")
    with pytest.raises(SpecError, match="invalid score"):
        ProxyProtocol(score="val_loss")


# --------------------------------------------------------------------------------------- latency
def test_architecture_key_ignores_name_and_seed():
    spec = load_spec("levit_128s")
    key = architecture_key(spec)
    assert key == architecture_key(spec.model_copy(update={"name": "other", "seed": 7, "description": "x"}))
    wider = load_spec({**spec.model_dump(mode="json"),
                       "head": {"pool": "mean", "num_classes": 10, "distillation": True}})
    assert architecture_key(wider) != key and len(key) == 64


def test_latency_cache_round_trip(tmp_path, monkeypatch):
    path = tmp_path / "latency.json"
    cache = LatencyCache(path)
    protocol = LatencyProtocol(warmup=1, repeats=3)
    assert cache.get("k", protocol) is None
    cache.put("k", protocol, 12.5)
    assert LatencyCache(path).get("k", protocol) == 12.5  # another process sees it
    assert LatencyCache(path).get("k", LatencyProtocol(threads=2)) is None
    path.write_text("{ not json")  # a corrupt file reads as empty and is replaced on the next put
    assert LatencyCache(path).get("k", protocol) is None
    LatencyCache(path).put("j", protocol, 1.0)
    assert set(json.loads(path.read_text())) == {"j"}

    tiny = TINY.model_copy(update={"input": TINY.input.model_copy(update={"resolution": (96, 96)})})
    threads = torch.get_num_threads()
    ms = measure_latency(tiny, protocol, cache)
    assert ms > 0 and torch.get_num_threads() == threads
    monkeypatch.setattr(COMPILE_MODULE, "compile", lambda spec: (_ for _ in ()).throw(AssertionError("measured again")))
    assert measure_latency(tiny.model_copy(update={"name": "renamed", "seed": 3}), protocol, cache) == ms
    assert LatencyCache(None).get("x", protocol) is None
