"""BoTNet's question (Srinivas et al. 2021) as a search: the shipped botnet_family space draws attention mixers in
the last two stages' bottlenecks (none / last block / all, of four head kinds); every point is valid and its counts
are the header's; botnet26t is a point; a 2-trial zero-cost search runs on it at a small proxy size."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import optuna
import pytest

from archspec import analyze, load_spec
from archspec.cli import main
from archspec.search._space.language import load_space

KINDS = ["botnet_rel", "mhsa", "levit_bias", "gpsa"]


def _alternatives(stage: int):
    yield {f"stages.{stage}.mixer": "conv"}
    for label in ("last", "all"):
        for kind in KINDS:
            yield {f"stages.{stage}.mixer": label, f"stages.{stage}.mixer.{label}.attention": kind}


def test_every_point_is_valid_and_the_header_counts_hold():
    space = load_space("botnet_family")
    assert space.smallest_params() == {"stages.2.mixer": "conv", "stages.3.mixer": "conv"}
    points = [{**a, **b} for a in _alternatives(2) for b in _alternatives(3)]
    assert len(points) == 81
    macs, params = [], []
    for point in points:
        spec = space.sample(optuna.trial.FixedTrial(point))  # validated: a bad point raises here
        for i in (2, 3):
            mixer, label = spec.stages[i].mixer, point[f"stages.{i}.mixer"]
            assert (mixer is None) == (label == "conv")
            if mixer is not None:
                assert mixer.layers == ([1] if label == "last" else None)
                assert mixer.attention.letter == {"botnet_rel": "B", "mhsa": "A", "levit_bias": "L", "gpsa": "P"}[
                    point[f"stages.{i}.mixer.{label}.attention"]]
        a = analyze(spec)
        macs.append(a.macs)
        params.append(a.params)
    # archspec/search/spaces/botnet_family.yaml's header
    assert min(macs) == pytest.approx(3.17e9, rel=0.005) and max(macs) == pytest.approx(4.05e9, rel=0.005)
    assert statistics.median(macs) == pytest.approx(3.39e9, rel=0.005) and sum(m <= 3.3e9 for m in macs) == 25
    assert min(params) == pytest.approx(12.1e6, rel=0.005) and max(params) == pytest.approx(16.0e6, rel=0.005)
    assert analyze(space.smallest()).macs == analyze(load_spec("resnet26t").model_copy(
        update={"input": space.smallest().input})).macs


def test_botnet26t_is_a_point_of_the_space():
    point = load_space("botnet_family").sample(optuna.trial.FixedTrial({
        "stages.2.mixer": "last", "stages.2.mixer.last.attention": "botnet_rel",
        "stages.3.mixer": "all", "stages.3.mixer.all.attention": "botnet_rel"}))
    shipped = load_spec("botnet26t")
    assert point.stages == shipped.stages and point.stem == shipped.stem
    assert analyze(point).macs == analyze(shipped).macs


@pytest.mark.slow
def test_a_zero_cost_search_runs_on_the_botnet_space(tmp_path: Path, capsys, one_thread):
    out = tmp_path / "run"
    rc = main(["search", "--space", "botnet_family", "--out", str(out), "--trials", "2", "--fidelity", "zc",
               "--proxy-steps", "2", "--proxy-batch", "4", "--max-images", "40", "--latency-repeats", "1",
               "--proxy-size", "64", "--budget-flops", "5G", "--no-progress", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pareto"]
    best = load_spec(out / "best.yaml")
    assert best.is_convnet and best.input.resolution == (256, 256)  # the real spec, not the proxy's
    assert len((out / "trials.csv").read_text().splitlines()) >= 3
