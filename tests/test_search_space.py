"""archspec.search._space.language and .budget: the space language, the default LeViT-family space, mask placement,
budgets and the static check."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import FixedTrial

from archspec import SpecError, analyze, load_spec
from archspec.search._evaluation.budget import Budgets, parse_quantity, static_check
from archspec.search._evaluation.check_rate import static_check_rate
from archspec.search._evaluation.latency import architecture_key
from archspec.search._space.language import load_space, mask_placement_space

optuna.logging.set_verbosity(optuna.logging.WARNING)


# --------------------------------------------------------------------------------------- budgets
@pytest.mark.parametrize("text, value", [
    ("1G", 1e9), ("500M", 5e8), ("1.5e9", 1.5e9), ("2.5k", 2500.0), ("2.5K", 2500.0), ("300", 300.0),
    ("1GMACs", 1e9), ("1 GFLOPs", 1e9), ("20ms", 20.0), ("0.5T", 5e11), (" 7M ", 7e6), (3, 3.0), (2.5, 2.5),
])
def test_parse_quantity(text, value):
    assert parse_quantity(text, "--budget-flops") == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "G", "abc", "1X", "1GG", "0", "-1G", "0M", "nan", "inf", "1e999", True, None])
def test_parse_quantity_rejects(text):
    with pytest.raises(SpecError) as info:
        parse_quantity(text, "--budget-flops")
    problem = info.value.problems[0]
    assert problem.path == ("--budget-flops",) and problem.hint


def test_static_check_matches_analyze_and_budget():
    spec = load_spec("levit_128s")
    a = analyze(spec)
    check = static_check(spec, Budgets())
    assert (check.feasible, check.macs, check.params, check.reason) == (True, a.macs, a.params, None)
    assert static_check(spec, Budgets(macs=a.macs)).feasible  # budgets are inclusive
    over = static_check(spec, Budgets(macs=a.macs - 1))
    assert not over.feasible and "MACs" in over.reason
    assert not static_check(spec, Budgets(macs=1e9, params=a.params - 1)).feasible
    # hand case: LeViT-128S is 305M MACs (paper) -- inside 1G, outside 300M
    assert static_check(spec, Budgets(macs=parse_quantity("1G", "b"))).feasible
    assert not static_check(spec, Budgets(macs=parse_quantity("300M", "b"))).feasible


# --------------------------------------------------------------------------------------- default space
@pytest.fixture(scope="module")
def default_points():
    space = load_space()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    points = []
    for _ in range(40):
        trial = study.ask()
        spec = space.sample(trial)
        points.append((trial.params, spec))
        study.tell(trial, 0.0)
    return space, points


@pytest.mark.slow
def test_default_space_points_are_valid_and_varied(default_points):
    space, points = default_points
    assert space.name == "levit_family" and space.kind == "design"
    keys = set()
    for params, spec in points:
        again = load_spec(spec.to_yaml())  # a concrete spec that the core validator accepts
        assert again == spec
        assert spec.input.resolution == (224, 224) and spec.head.num_classes == 1000
        assert spec.stem.kind == "conv" and len(spec.stages) in (2, 3)
        assert all(s.norm == "batchnorm" for s in spec.stages)
        assert all(s.shrink is not None for s in spec.stages[1:])
        keys.add(architecture_key(spec))
        assert "stages.0.dim" in params and "stages.count" in params
    assert len(keys) >= 0.9 * len(points)
    letters = {h.letter for _, spec in points for i in range(len(spec.stages)) for p in spec.layer_plans(i)
               for h in p.heads}
    assert {"L", "P", "LM"} <= letters  # LeViT bias, GPSA, masked biased heads all occur


def test_default_space_cuts_a_1g_budget(default_points):
    _, points = default_points
    macs = [analyze(spec).macs for _, spec in points]
    assert min(macs) < 1e9 < max(macs)
    assert 0.5 < sum(m < 1e9 for m in macs) / len(macs) < 0.95


def test_smallest_is_smallest(default_points):
    space, points = default_points
    smallest = analyze(space.smallest()).macs
    assert all(smallest <= analyze(spec).macs for _, spec in points)
    assert space.sample(FixedTrial(space.smallest_params())) == space.smallest()


def test_static_check_rate(default_points):
    space, _ = default_points
    assert static_check_rate(space, Budgets(macs=1e9), n=10) > 1.0


# --------------------------------------------------------------------------------------- mask placement
def _plans(spec):
    return [[h for h in p.heads] for i in range(len(spec.stages)) for p in spec.layer_plans(i)]


def test_mait_schemes_are_points_of_the_mask_space():
    sch1, sch2 = load_spec("mait_tiny_sch1"), load_spec("mait_tiny_sch2")
    space = mask_placement_space(sch1)
    assert space.kind == "masks"
    groups = ["0-3", "4-7", "8-11", "12-15", "16-19", "20-23"]
    p1 = {f"stages.0.heads_mix.masked.{g}": 1 for g in groups}
    p1.update({f"stages.0.heads_mix.window.{g}": "3x3" for g in groups})
    point1 = space.sample(FixedTrial(p1))
    assert _plans(point1) == _plans(sch1)
    assert architecture_key(point1) == architecture_key(sch1)
    p2 = dict(p1)
    p2.update({"stages.0.heads_mix.masked.0-3": 2, "stages.0.heads_mix.masked.4-7": 2,
               "stages.0.heads_mix.masked.20-23": 0})
    point2 = space.sample(FixedTrial(p2))
    assert _plans(point2) == _plans(sch2)
    # the space is the same whichever scheme it starts from (existing masks are removed first)
    assert architecture_key(mask_placement_space(sch2).sample(FixedTrial(p1))) == architecture_key(sch1)
    assert architecture_key(point2) == architecture_key(sch2)
    smallest = space.smallest()  # no masks at all: plain DeiT-style heads
    assert all(h.mask is None for heads in _plans(smallest) for h in heads)


def test_mask_space_on_levit_keeps_biases_and_fits_windows():
    space = mask_placement_space(load_spec("levit_128s"), windows=("3x3", "5x5"), max_masked=2)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    for _ in range(5):
        spec = space.sample(study.ask())
        for heads in _plans(spec):
            assert all(h.rel_bias is not None for h in heads)
            assert sum(h.mask is not None for h in heads) <= 2
    with pytest.raises(SpecError):
        mask_placement_space(load_spec("levit_128s"), windows=("4x4",))


# --------------------------------------------------------------------------------------- malformed spaces
BASE = """\
name: tiny
kind: design
spec:
  stem: {kind: conv}
  tokens: {cls_token: none, pos_embed: none}
  stages:
    count: {choice: [1, 2]}
    items:
      - depth: {int: [1, 2]}
        dim: {choice: [64, 128]}
        heads: 4
        key_dim: 16
        norm: batchnorm
        heads_mix: {choice: {bias: levit_bias, mait: {base: levit_bias, masked: {int: [1, {ref: stage.heads}]}, window: {choice: ["3x3", "5x5"]}}}}
      - depth: 1
        dim: 192
        heads: 6
        key_dim: 16
        norm: batchnorm
        attention: levit_bias
        shrink: {key_dim: {ref: stage.key_dim}}
  head: {pool: mean, num_classes: 10}
"""  # noqa: E501  (a long YAML line: the tests assert line numbers in this text)


def _error(text):
    with pytest.raises(SpecError) as info:
        load_space(text)
    return info.value.problems


def test_small_space_language():
    space = load_space(BASE)
    params = {"stages.count": 2, "stages.0.depth": 2, "stages.0.dim": 128, "stages.0.heads_mix": "mait",
              "stages.0.heads_mix.mait.masked": 3, "stages.0.heads_mix.mait.window": "5x5"}
    spec = space.sample(FixedTrial(params))
    assert [h.letter for h in spec.layer_plans(0)[0].heads] == ["LM", "LM", "LM", "L"]
    assert spec.layer_plans(0)[1].heads[0].mask.window == (5, 5)
    assert spec.stages[1].shrink.key_dim == 16 and spec.stages[0].dim == 128


@pytest.mark.parametrize("old, new, path, words", [
    ("        dim: {choice: [64, 128]}", "        dimm: {choice: [64, 128]}", ("spec", "stages", "items", 0, "dimm"),
     "unknown key"),
    ("depth: {int: [1, 2]}", "depth: {int: [1]}", ("spec", "stages", "items", 0, "depth", "int"), "[low, high]"),
    ("depth: {int: [1, 2]}", "depth: {int: [1, 2], stepp: 1}", ("spec", "stages", "items", 0, "depth", "stepp"),
     "unknown option"),
    ("depth: {int: [1, 2]}", "depth: {int: [3, 2]}", ("spec", "stages", "items", 0, "depth", "int"), "empty range"),
    ("dim: {choice: [64, 128]}", "dim: {choice: []}", ("spec", "stages", "items", 0, "dim", "choice"), "empty choice"),
    ("dim: {choice: [64, 128]}", "dim: {choice: 64}", ("spec", "stages", "items", 0, "dim", "choice"), "choice takes"),
    ("count: {choice: [1, 2]}", "count: 3", ("spec", "stages", "count"), "between 1 and 2"),
    ("kind: design", "kind: designs", ("kind",), "design"),
    ("name: tiny", "nam: tiny", ("nam",), "unknown key"),
    ("{ref: stage.key_dim}", "{ref: stage.nothing}", ("spec", "stages", "items", 1, "shrink", "key_dim", "ref"),
     "names no value"),
    ("window: {choice", "windw: {choice", ("spec", "stages", "items", 0, "heads_mix", "choice", "mait", "windw"),
     "unknown key"),
])
def test_malformed_space_is_located(old, new, path, words):
    assert old in BASE
    text = BASE.replace(old, new, 1)
    if "nothing" in new:  # a ref to a missing field fails when a point is drawn (the smallest, at load)
        text = text.replace("count: {choice: [1, 2]}", "count: 2")
    problems = _error(text)
    match = [p for p in problems if p.path == path]
    assert match, [(p.path, p.message) for p in problems]
    assert words in match[0].message or words in (match[0].hint or "")
    assert match[0].line is not None and match[0].file == "<string>"


SHARED = """\
name: widths
kind: design
spec:
  stem: {kind: conv}
  tokens: {cls_token: none, pos_embed: none}
  stages:
    share: true
    choice:
      narrow:
        - {depth: {int: [1, 2]}, dim: 64, heads: 4, key_dim: 16, norm: batchnorm,
           heads_mix: {choice: {bias: levit_bias, mait: {base: levit_bias, masked: {int: [1, 2]}, window: "3x3"}}}}
      wide:
        - {depth: {int: [1, 3]}, dim: 128, heads: 4, key_dim: 16, norm: batchnorm,
           heads_mix: {choice: {bias: levit_bias, mait: {base: levit_bias, masked: {int: [1, 2]}, window: "3x3"}}}}
  head: {pool: mean, num_classes: 10}
"""


def test_shared_choice_names_its_alternatives_parameters_alike():
    """``share: true``: both widths ask ``stages.0.depth`` and ``stages.0.heads_mix`` (the label is not in the
    name), the drawn width still decides the spec; a depth range per width (1-2, 1-3) times the heads (bias, or
    mait with 1 or 2 masked heads): 2 x 3 + 3 x 3 = 15 points; an Optuna study samples it."""
    space = load_space(SHARED)
    points = list(space.points())
    assert len(points) == 2 * 3 + 3 * 3 and {frozenset(p) for p, _ in points} == {
        frozenset({"stages", "stages.0.depth", "stages.0.heads_mix"}),
        frozenset({"stages", "stages.0.depth", "stages.0.heads_mix", "stages.0.heads_mix.mait.masked"})}
    spec = space.sample(FixedTrial({"stages": "wide", "stages.0.depth": 3, "stages.0.heads_mix": "bias"}))
    assert spec.stages[0].dim == 128 and spec.stages[0].depth == 3
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(12):
        trial = study.ask()
        space.sample(trial)
        assert "stages.wide.0.depth" not in trial.params and "stages.0.depth" in trial.params
        study.tell(trial, 0.0)


@pytest.mark.parametrize("old, new, path, words", [
    ("wide:\n        - {depth: {int: [1, 3]}", "wide:\n        - {depth: {choice: [1, 3]}",
     ("spec", "stages", "choice", "wide", 0, "depth"), "differs between alternatives 'narrow' and 'wide'"),
    ("wide:\n        - {depth: {int: [1, 3]}", "wide:\n        - {depth: {int: [1, 3], log: true}",
     ("spec", "stages", "choice", "wide", 0, "depth"), "an int range against a log int range"),
    ("    share: true", "    share: yes please", ("spec", "stages", "share"), "true or false"),
])
def test_shared_choice_errors_are_located(old, new, path, words):
    assert old in SHARED
    problems = _error(SHARED.replace(old, new, 1))
    match = [p for p in problems if p.path == path]
    assert match, [(p.path, p.message) for p in problems]
    assert words in match[0].message and match[0].line is not None


def test_shared_choice_needs_labelled_structured_alternatives():
    problems = _error(BASE.replace("dim: {choice: [64, 128]}", "dim: {choice: [64, 128], share: true}", 1))
    assert any("labelled alternatives" in p.message for p in problems)
    bare = BASE.replace("heads_mix: {choice: {", "heads_mix: {share: true, choice: {", 1)
    assert bare != BASE
    problems = _error(bare)
    assert any("mappings or lists" in p.message for p in problems), [p.message for p in problems]


def test_invalid_point_names_the_space_field():
    space = load_space(BASE.replace("count: {choice: [1, 2]}", "count: 2"))
    params = {"stages.count": 2, "stages.0.depth": 1, "stages.0.dim": 64, "stages.0.heads_mix": "bias"}
    assert space.sample(FixedTrial(params)).stages[0].dim == 64
    # 5x5 window on the 14x14 grid is fine; stage 0 of a 32 px space would not take it
    small = load_space(BASE.replace("stem: {kind: conv}", "input: {resolution: 48}\n  stem: {kind: conv}"))
    bad = dict(params, **{"stages.0.heads_mix": "mait", "stages.0.heads_mix.mait.masked": 1,
                          "stages.0.heads_mix.mait.window": "5x5"})
    with pytest.raises(SpecError) as info:
        small.sample(FixedTrial(bad))
    problem = info.value.problems[0]
    assert problem.path == ("spec", "stages", "items", 0, "heads_mix", "choice", "mait", "window")
    assert "larger than" in problem.message and problem.line == 15 and "drawn:" in problem.hint


def test_load_space_sources(tmp_path):
    assert load_space("levit_family").name == "levit_family"
    path = tmp_path / "s.yaml"
    path.write_text(BASE)
    assert load_space(path).file == str(path)
    with pytest.raises(SpecError) as info:
        load_space(tmp_path / "missing.yaml")
    assert "no such" in info.value.problems[0].message
