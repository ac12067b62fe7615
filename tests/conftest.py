"""Shared fixtures: keep torch to the machine's 2 cores and give tests real images."""

from __future__ import annotations

import pytest
import torch

from archspec.io.images import sample_batch


@pytest.fixture(scope="session")
def real_images() -> torch.Tensor:
    """Three real photographs (matplotlib's grace_hopper, scikit-learn's china and flower), (3, 3, 224, 224)."""
    return sample_batch((224, 224))


def _one_thread():
    # Tiny models run many times slower with 2 OpenMP threads on a shared 2-core machine (busy-waiting).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_thread():
    """Run the test with one torch thread (tiny models)."""
    yield from _one_thread()


@pytest.fixture(scope="module")
def one_thread_module():
    """One torch thread for a whole module of tiny-model tests."""
    yield from _one_thread()
