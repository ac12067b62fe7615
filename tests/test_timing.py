"""archspec.diagnostics.timing: one latency implementation (torch.utils.benchmark.Timer) for build and search."""

from __future__ import annotations

import time

import pytest
import torch

from archspec import SpecError
from archspec.diagnostics.timing import measure_forward, parse_device, resolve_device


class Sleeper(torch.nn.Module):
    """A forward pass of known length: 20 ms of sleep, whatever the batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.02)
        return x.mean()


def test_measures_a_known_duration_with_the_cpu_protocol():
    before = torch.get_num_threads()
    result = measure_forward(Sleeper(), (3, 8, 8), "cpu", threads=1, warmup=1, repeats=5)
    assert 19.5 <= result.ms <= 100  # sleep(0.02) never returns early; a loaded machine may add some
    assert result.batch == 1 and result.threads == 1 and result.amp is None and result.device == "cpu"
    assert result.images_per_s == pytest.approx(1e3 / result.ms)
    assert torch.get_num_threads() == before  # the Timer restores the thread count


def test_threads_are_set_while_timing():
    seen = []

    class Probe(torch.nn.Module):
        def forward(self, x):
            seen.append(torch.get_num_threads())
            return x

    measure_forward(Probe(), (1, 2, 2), threads=2, warmup=0, repeats=2)
    assert seen == [2] * 6  # each timed run follows the Timer's own two untimed warm-up runs


def test_batch_and_model_mode():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(12, 2)).train()
    result = measure_forward(model, (3, 2, 2), batch=4, warmup=0, repeats=2)
    assert result.batch == 4 and not model.training
    assert result.images_per_s == pytest.approx(4e3 / result.ms)
    with pytest.raises(ValueError):
        measure_forward(model, (3, 2, 2), repeats=0)


def test_device_names():
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert parse_device("auto").type == resolve_device("auto")
    for bad, text in (("tpu", "unknown device"), ("cuda:7" if torch.cuda.is_available() else "cuda", "")):
        with pytest.raises(SpecError) as info:
            parse_device(bad, "--device")
        assert info.value.problems[0].path == ("--device",) and text in info.value.problems[0].message
