"""Shared fixtures and the parallel run: one torch thread per pytest-xdist worker, the longest files first, and
real images for the tests."""

from __future__ import annotations

import os

import pytest

# torch (and timm, through archspec.io.images) are imported where a fixture or a worker needs them, not here: under
# pytest-xdist the controller process loads this file too and runs no test, and importing them there cost about 6 s
# before any worker started (a tenth of the quick subset's wall time, issue 53).
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist runs one worker per core (pyproject.toml's addopts: -n logical): each worker computes with one
    # torch thread, and so do the processes its tests start (OMP_NUM_THREADS is inherited).  Two workers of two
    # threads each on 2 cores spin-wait on each other's OpenMP barriers (see _one_thread).
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def bench_module():
    """``load(name)``: ``bench/<name>.py`` loaded as a module (the bench scripts are not a package), each call a
    fresh copy."""
    import importlib.util
    from pathlib import Path

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent.parent / "bench" /
                                                      f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture(scope="session")
def real_images():
    """Three real photographs (matplotlib's grace_hopper, scikit-learn's china and flower), (3, 3, 224, 224)."""
    from archspec.io.images import sample_batch

    return sample_batch((224, 224))


def _one_thread():
    # Tiny models run many times slower with 2 OpenMP threads on a shared 2-core machine (busy-waiting).
    import torch

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


# The files that take longest, longest first (their summed test times in a full run, docs/contributing.md).
# pytest-xdist hands out whole files (--dist loadfile) in collection order (--no-loadscope-reorder), so starting
# with these lets the many short files fill the other workers' time: one long file started last would leave
# every other worker idle at the end.  The other files keep pytest's order.
LONGEST_FIRST = ("test_search_table.py", "test_deploy.py", "test_cli.py", "test_train_run.py", "test_docs.py",
                 "test_onnx_export.py", "test_search_postgres.py", "test_train_safety.py", "test_timm_api.py",
                 "test_search_cli.py", "test_search_study.py", "test_search_distinct.py", "test_resnet.py",
                 "test_search_oracle.py", "test_search_storage.py", "test_search_fidelity.py", "test_compile.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run :data:`LONGEST_FIRST` first, in that order (a stable sort: each file's tests keep their order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
