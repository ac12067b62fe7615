"""bench/search_room.py (where the room above random draws is) against hand-computed cases: its O(n log n) front
is bench/search_works.py's ``pareto``, and every rule scores a front on the seed that no rule read, so a design that
reaches the front on a lucky seed adds nothing."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest


@pytest.fixture(scope="module")
def room(bench_module):
    return bench_module("search_room")


def test_the_front_is_search_works_pareto(room):
    """Hand cases (ties in value and in cost kept as ``pareto`` keeps them), then random sets against ``pareto``."""
    points = [(0.9, 5.0, "a"), (0.8, 2.0, "b"), (0.85, 6.0, "c"), (0.9, 5.0, "d"), (0.7, 2.0, "e"), (0.8, 1.0, "f")]
    assert sorted(room.front(points)) == ["a", "d", "f"]  # b ties f's value at a higher cost: dominated
    assert sorted(room.front([(0.5, 1.0, "x"), (0.5, 1.0, "y")])) == ["x", "y"]
    rng = random.Random(0)
    for _ in range(200):
        points = [(rng.choice([0.1, 0.2, 0.3, 0.4]), rng.choice([1.0, 2.0, 3.0]), i) for i in range(rng.randint(1, 9))]
        assert sorted(room.front(points)) == sorted(room.WORKS.pareto(points))


def _table():
    """Four designs, seeds 0-2.  A (1 ms, 10 M MACs) and D (3 ms, 30 M) reach 0.6 at every seed, B (2 ms, 20 M)
    0.8, C (2.5 ms, 25 M) 0.95 at seed 0 and 0.65 at seeds 1-2.  Every proxy (val top-1 and TSE at step 120, the
    final top-1) follows the final top-1 of its own seed.  Means: A 0.6, B 0.8, C 0.75, D 0.6, so accuracy spans
    0.6-0.8; latency 1-3 ms and MACs 10-30 M.  Normalised, B is (0, 0.5) in both planes and A (1, 0): the front
    {A, B} has hypervolume 1 x 0.5 = 0.5.  C, scored on seed 0 (0.95 -> -0.75) at 0.75, would add 0.75 x 0.25."""
    finals = {"A": [0.6] * 3, "B": [0.8] * 3, "C": [0.95, 0.65, 0.65], "D": [0.6] * 3}
    cost = {"A": 1.0, "B": 2.0, "C": 2.5, "D": 3.0}
    rows = {key: {seed: {"final_accuracy": acc, "macs": int(10e6 * cost[key]),
                         "curve": [[120, acc, 1.0], [938, acc, 0.5]],
                         "tse": [[120, 120 * (1 - acc), 1.0], [938, 938 * (1 - acc), 8.0]]}
                  for seed, acc in enumerate(accs)} for key, accs in finals.items()}
    return SimpleNamespace(seeds=[0, 1, 2], tabulated=set(finals), rows=rows, latency_ms=cost, curve_steps=[120, 938])


def test_every_rule_scores_its_front_on_the_seed_no_rule_read_by_hand(room):
    """Over 60 draws of all four designs: C reaches the single-seed rules' fronts whenever seed 0 is read first
    (a third of the draws), and is then scored on another seed (0.65, dominated by B), so every rule's hypervolume
    stays 0.5 in both planes -- never 0.6875, the leak.  The CPU is the designs' seconds to the step their proxy
    reads (here the step itself) times the seeds read: 4 x 120, 4 x 938, 4 x 938 x 2."""
    truth = room.WORKS.Truth(_table())
    keys, rng, lucky = sorted(truth.accuracy), np.random.default_rng(0), 0
    for _ in range(60):
        got = room.one_draw(truth, keys, 4, rng, lambda key, step: float(step))
        for rule, values in got.items():
            assert values["hv_latency"] == pytest.approx(0.5) and values["hv_macs"] == pytest.approx(0.5), rule
        lucky += got["random designs, one seed's final top-1"]["size"] == 3
        assert got["random designs, mean final top-1 of two seeds"]["size"] == 2  # 0.8 at best: B's value, dearer
        assert got["random designs, val top-1 at 120 steps"]["cpu_s"] == 4 * 120
        assert got["random designs, one seed's final top-1"]["cpu_s"] == 4 * 938
        assert got["knows every design's mean final top-1 of two seeds"]["cpu_s"] == 4 * 938 * 2
    assert 10 <= lucky <= 30  # about a third of 60


def test_the_sampler_that_knows_trains_the_front_first(room):
    """Two of the four designs: the sampler that knows the final top-1 trains the front it gives over the whole
    table ({A, B}, or {A, B, C} on C's lucky seed, cut to 2), so its front always holds A or B and scores 0.5 when
    it holds B; random draws of two hold B in half the draws (3 of the 6 pairs)."""
    truth = room.WORKS.Truth(_table())
    keys, rng = sorted(truth.accuracy), np.random.default_rng(1)
    knows, drawn = [], []
    for _ in range(300):
        got = room.one_draw(truth, keys, 2, rng, lambda key, step: float(step))
        knows.append(got["knows every design's final top-1 at one seed"]["hv_latency"])
        drawn.append(got["random designs, one seed's final top-1"]["hv_latency"])
    assert np.mean(np.isclose(knows, 0.5)) > 0.6 and 0.35 < np.mean(np.isclose(drawn, 0.5)) < 0.65


def test_a_table_without_latency_or_a_bad_name_is_exit_2(room, capsys):
    """The fronts are chosen by latency: a table without a latency pass (the shipped mask table) is refused, as is a
    table that does not exist -- exit 2 and the reason, no traceback."""
    assert room.main(["--table", "mait_small", "--trials", "2", "--draws", "1"]) == 2
    assert "no latency pass" in capsys.readouterr().err
    assert room.main(["--table", "no_such_table", "--draws", "1"]) == 2
    assert "no such table" in capsys.readouterr().err
