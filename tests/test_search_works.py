"""The measures of bench/search_works.py against hand-computed cases: 2-D hypervolume, the Pareto filter and the
anytime look-up that the search-vs-random comparison rests on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def works():
    spec = importlib.util.spec_from_file_location("search_works", ROOT / "bench" / "search_works.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hypervolume_2d_by_hand(works):
    ref = (1.0, 1.0)
    assert works.hypervolume_2d([], ref) == 0.0
    assert works.hypervolume_2d([(0.5, 0.5)], ref) == pytest.approx(0.25)
    # two points, a staircase: [0.2,1]x[0.6,1] U [0.5,1]x[0.3,1] = 0.8*0.4 + 0.5*0.3 = 0.47
    assert works.hypervolume_2d([(0.2, 0.6), (0.5, 0.3)], ref) == pytest.approx(0.47)
    # a dominated point and one beyond the reference add nothing
    assert works.hypervolume_2d([(0.2, 0.6), (0.5, 0.3), (0.6, 0.7), (1.2, 0.0)], ref) == pytest.approx(0.47)


def test_pareto_keeps_the_undominated(works):
    points = [(0.9, 5.0, "a"), (0.8, 2.0, "b"), (0.85, 6.0, "c"), (0.9, 5.0, "d"), (0.7, 2.0, "e")]
    assert works.pareto(points) == ["a", "b", "d"]


def test_value_at_is_the_last_entry_by_then(works):
    run = [{"seconds": 1.0, "hv_macs": 0.1}, {"seconds": 3.0, "hv_macs": 0.4}]
    assert [works.value_at(run, "hv_macs", t) for t in (0.5, 1.0, 2.9, 10.0)] == [0.0, 0.1, 0.1, 0.4]
