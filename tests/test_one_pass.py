"""One pass per candidate (issue 34, item 5; issue 58): the IR keeps the graph of a validated spec by the spec's
content (never in the spec), and the later steps -- analysis, compile, the search's static check, its proxy --
reuse it; a changed spec never gets a stale graph."""

from __future__ import annotations

import copy
import json
import pickle

import optuna
import pytest
from search_fixtures import TINY_SPACE

import archspec.ir.plan as plan_module
import archspec.search._evaluation.proxy as proxy_module
from archspec import analyze, load_spec
from archspec._util.memo import ContentMemo
from archspec.ir.graph import build_graph
from archspec.search._evaluation.budget import Budgets, static_check
from archspec.search._evaluation.proxy import ProxyProtocol, proxy_geometry, proxy_spec, train_proxy
from archspec.search._space.language import load_space
from archspec.spec import ArchSpec

PROTOCOL = ProxyProtocol(steps=2, eval_every=2, batch_size=8, warmup_steps=1, image_size=32, threads=1)


@pytest.fixture
def walks(monkeypatch):
    """The specs walked by ``archspec.ir.walk.walk`` (each entry one build of a plan, and so of its graph), in
    order; ``clear()`` also forgets the plans and proxies kept so far (as if no spec had been seen)."""

    class Walks(list):
        def clear(self):
            super().clear()
            plan_module._PLANS.clear()
            proxy_module._PROXIES.clear()

    seen: list[ArchSpec] = Walks()
    real = plan_module.walk

    def counted(spec):
        seen.append(spec)
        return real(spec)

    monkeypatch.setattr(plan_module, "walk", counted)
    monkeypatch.setattr(plan_module, "_PLANS", ContentMemo(128))  # nothing kept from earlier tests
    monkeypatch.setattr(proxy_module, "_PROXIES", ContentMemo(256))
    return seen


@pytest.fixture(scope="module")
def digits():
    from archspec.io.datasets import load_data

    return load_data(None, PROTOCOL.image_size, seed=0, max_images=40)


def test_a_proxy_trained_candidate_builds_two_graphs(walks, digits, one_thread):
    """The engine's steps for one candidate, by hand: 2 graphs, each built once.

    1. ``space.sample`` validates the point with ``load_spec``: the candidate's graph (walk 1), kept by the spec;
    2. ``static_check`` (MACs, params, memory) reuses it; its proxy-training memory check adapts the candidate to
       the data: the proxy spec is validated, its graph built (walk 2), and kept with the candidate;
    3. the latency measurement compiles the candidate: its graph again (no walk);
    4. ``train_proxy`` takes the kept proxy (same seed as the candidate's) and compiles it (no walk);
    5. ``analyze`` of the candidate (the summary's figures) reuses the graph too.
    Before the change this was 18 walks (bench/graph_builds.py).
    """
    from archspec.nn.compiler import compile as compile_spec

    space = load_space(TINY_SPACE)  # (checks the space on a point or two)
    walks.clear()
    spec = space.sample(optuna.trial.FixedTrial({"stages.0.depth": 2, "stages.0.dim": 32}))
    assert walks == [spec] and spec.stages[0].depth == 2
    check = static_check(spec, Budgets(macs=1e8), digits, PROTOCOL)
    assert check.feasible and len(walks) == 2 and walks[1].name == f"{spec.name}_proxy"
    compile_spec(spec)
    result = train_proxy(spec, digits, PROTOCOL, seed=spec.seed)
    assert analyze(spec).macs == check.macs
    assert len(walks) == 2
    assert result.model.spec == walks[1]  # the proxy trained is the one the static check validated


def test_another_training_seed_builds_one_more_graph(walks, digits, one_thread):
    space = load_space(TINY_SPACE)
    walks.clear()
    spec = space.sample(optuna.trial.FixedTrial({"stages.0.depth": 1, "stages.0.dim": 16}))
    static_check(spec, Budgets(), digits, PROTOCOL)
    assert len(walks) == 2
    result = train_proxy(spec, digits, PROTOCOL, seed=3)
    assert len(walks) == 3 and result.model.spec.seed == 3 and walks[2] == result.model.spec
    train_proxy(spec, digits, PROTOCOL, seed=3)  # the seeded proxy is kept too
    assert len(walks) == 3


def test_proxy_results_match_a_fresh_computation(digits):
    """The kept proxy is what the adaptation gives from scratch; the dicts handed out are copies."""
    spec = load_spec("levit_128s")
    first = proxy_spec(spec, digits, PROTOCOL)
    geometry, doc = proxy_geometry(spec, digits, PROTOCOL)
    doc["name"] = "changed"
    geometry.stem["kind"] = "changed"
    again = proxy_geometry(spec, digits, PROTOCOL)
    assert again[1]["name"] == "levit_128s_proxy" and again[0].stem["kind"] == "conv"
    fresh_candidate = load_spec("levit_128s")
    assert proxy_spec(fresh_candidate, digits, PROTOCOL) == first
    assert proxy_geometry(fresh_candidate, digits, PROTOCOL) == again
    # a different protocol is another proxy
    assert proxy_spec(spec, digits, ProxyProtocol(image_size=64)).input.resolution != first.input.resolution


def test_the_graph_is_built_once_and_reused(walks):
    spec = load_spec("deit_tiny")
    assert len(walks) == 1
    graph = build_graph(spec)
    assert build_graph(spec) is graph and graph.graph["spec"] == spec and graph.graph["spec"] is not spec
    assert len(walks) == 1
    assert load_spec(spec) is spec and len(walks) == 1  # re-checking a spec reuses its graph
    analyze(spec)
    assert len(walks) == 1


def test_a_changed_spec_never_reuses_a_stale_graph_and_an_equal_one_shares_it(walks):
    spec = load_spec("levit_128s")
    graph = build_graph(spec)
    deeper = spec.model_copy(update={"stages": [spec.stages[0].model_copy(update={"depth": 1}), *spec.stages[1:]]})
    assert build_graph(deeper) is not graph
    assert build_graph(deeper).graph["params"] < graph.graph["params"]
    assert build_graph(deeper).graph["spec"] == deeper
    reseeded = spec.model_copy(update={"seed": 7})
    assert build_graph(reseeded) is not graph and build_graph(reseeded).graph["spec"] == reseeded
    same = spec.model_copy(deep=True)  # a copy: equal content, so the same graph
    assert build_graph(same) is graph
    assert build_graph(spec) is graph  # the copies left the original's graph alone
    # changed in place: assignment validates and mutates, nested too
    spec.seed = 3
    regraph = build_graph(spec)
    assert regraph is not graph
    spec.stages[0].depth = 1
    assert build_graph(spec) is not regraph
    assert build_graph(spec).graph["params"] == build_graph(deeper).graph["params"]
    assert graph.graph["spec"].seed == 0 and graph.graph["spec"].stages[0].depth != 1  # its own copy: not stale
    assert build_graph(same) is graph  # the unchanged copy still finds the first graph
    assert analyze(spec).params == build_graph(deeper).graph["params"]


def test_the_graph_is_not_part_of_the_spec():
    checked, bare = load_spec("mait_tiny_sch2"), load_spec("mait_tiny_sch2", check=False)
    assert not checked.__pydantic_private__ and not bare.__pydantic_private__  # a spec holds its fields only
    assert set(vars(checked)) == set(ArchSpec.model_fields)
    assert checked == bare and checked.model_dump() == bare.model_dump()
    assert checked.to_yaml() == bare.to_yaml() and checked.model_dump_json() == bare.model_dump_json()
    assert "graph" not in json.dumps(ArchSpec.model_json_schema())
    assert pickle.dumps(checked) == pickle.dumps(bare)  # a graph never crosses processes
    for twin in (pickle.loads(pickle.dumps(checked)), copy.deepcopy(checked)):
        assert twin == checked and build_graph(twin) is build_graph(checked)  # equal content: one graph
