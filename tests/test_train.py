"""archspec.train: the package's one training loop (used by the search's proxy and the two-phase pipeline)."""

from __future__ import annotations

import pytest
import torch

import archspec
from archspec.io.datasets import load_data
from archspec.search._evaluation import proxy
from archspec.train import TrainConfig, TrainingFailure, resolve_device, train

TINY = """
name: t
input: {resolution: 16}
stem: {kind: patch, patch_size: 4}
tokens: {cls_token: none, pos_embed: learned}
stages:
  - {depth: 1, dim: 16, heads: 2, mlp_ratio: 2}
head: {pool: mean, num_classes: 10}
"""


@pytest.fixture(scope="module")
def digits():
    return load_data(None, 16, seed=0, max_images=200)


def _run(data, seed=0, **kw):
    torch.manual_seed(0)
    model = archspec.compile(TINY)
    # 300 steps (under a second): a one-block, 16-wide model from timm's init needs ~100 to leave chance.
    config = TrainConfig(steps=300, batch_size=16, lr=3e-3, warmup_steps=3, eval_every=100, **kw)
    return model, train(model, data, config, seed=seed)


@pytest.mark.slow
def test_loss_falls_and_runs_are_reproducible(one_thread, digits):
    model, first = _run(digits)
    _, again = _run(digits)
    losses = [loss for _, _, loss in first.history]
    assert losses[-1] < losses[0] - 0.2 and first.accuracy > 0.15  # chance is 0.1 (ln 10 = 2.30)
    assert first.history == again.history and first.val_loss == again.val_loss
    assert not model.training and [s for s, _, _ in first.history] == [100, 200, 300]
    _, other = _run(digits, seed=1)
    assert other.history != first.history


def test_the_search_trains_with_this_loop(one_thread, digits, monkeypatch):
    calls = []
    monkeypatch.setattr(proxy, "train", lambda *a, **k: calls.append(a) or train(*a, **k))
    result = proxy.train_proxy(archspec.load_spec(TINY), digits,
                               proxy.ProxyProtocol(image_size=16, steps=2, eval_every=2, min_grid=2), seed=0)
    assert len(calls) == 1 and result.steps == 2


def test_devices_and_failures(one_thread, digits):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="device"):
        resolve_device("mps:0" if not torch.cuda.is_available() else "meta")
    model = archspec.compile(TINY)
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    with pytest.raises(TrainingFailure, match="loss became nan at step 1"):
        train(model, digits, TrainConfig(steps=2, eval_every=1))


def test_torch_compile_is_written_and_read_under_its_persisted_key_compile():
    """Issue 58 renamed ``TrainConfig.compile`` (torch.compile) to ``torch_compile``: ``describe()`` -- run
    directories, study attributes (the proxy protocol), reports -- still writes ``compile`` in the same place,
    ``from_dict`` reads either key, and ``archspec train --torch-compile`` (or its alias ``--compile``) sets it."""
    from archspec.cli.app import make_parser
    from archspec.cli.train import config_from_args
    from archspec.search import ProxyProtocol

    config = TrainConfig(torch_compile=True)
    described = config.describe()
    assert "torch_compile" not in described and described["compile"] is True
    assert list(described).index("compile") == list(described).index("clip_grad") + 1  # where the field was
    assert TrainConfig.from_dict(described) == config == TrainConfig.from_dict({"torch_compile": True})
    proxy_protocol = ProxyProtocol(torch_compile=True)
    assert proxy_protocol.describe()["compile"] is True
    assert ProxyProtocol.from_dict(proxy_protocol.describe()) == proxy_protocol
    for flag in ("--torch-compile", "--compile"):  # the flag says which compile; the old one stays an alias
        args = make_parser().parse_args(["train", "x", flag, "--steps", "20"])
        assert config_from_args(args).torch_compile is True


def test_progress_prints_by_steps_and_after_log_seconds_without_a_line(monkeypatch):
    """A line every ``log_every`` steps and at the last; with ``log_seconds`` also when that long passed since the
    last line (a search's slow first proxy shows its pace before step 50).  The clock is driven by hand."""
    import io

    from archspec.train import progress as progress_module

    # one second a call: the constructor reads 0; each step reads once to test for an overdue line, and a line once
    for log_seconds, expected in ((None, [5, 7]), (3.0, [3, 5, 7]), (1.0, [1, 2, 3, 4, 5, 6, 7])):
        clock = iter(float(t) for t in range(1000))
        monkeypatch.setattr(progress_module.time, "perf_counter", lambda c=clock: next(c))
        stream = io.StringIO()
        shown = progress_module.Progress(7, 0, 8, log_every=5, bar=False, stream=stream, label="trial 0",
                                         log_seconds=log_seconds)
        for step in range(1, 8):
            shown.on_step(step, 1.0, 1e-3)
        lines = stream.getvalue().splitlines()
        assert [int(line.split()[3].split("/")[0]) for line in lines] == expected, lines
        assert all(line.startswith("trial 0: step ") for line in lines)
