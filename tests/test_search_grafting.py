"""LeViT's grafting (sec. 3.2, Tab. 1) as a search: the shipped levit_grafting space, and a small variant of it
through the real `archspec search` (conv stages under a ResNet stem, then a DeiT stage, all searched)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import optuna
import pytest
import yaml

from archspec import analyze, load_spec
from archspec.cli import main
from archspec.search._space.language import load_space
from archspec.spec import ConvStageSpec, StageSpec

# The header of archspec/search/spaces/levit_grafting.yaml states these (its 36 points' ends).
HEADER_MACS = (1.18e9, 7.90e9)


def _deit(depth, grid):
    return {"depth": depth, "dim": 32, "heads": 2, "mlp_ratio": 4, "qkv_bias": True, "norm": "layernorm",
            "act": "gelu", "attention": "mhsa", "from_map": {"pool": "avg", "grid": grid}}


# The shipped space's shape, small: 64 px, a 16-channel ResNet stem, 1 or 2 small bottleneck stages, then a
# 32-wide DeiT stage of 1-3 layers on a 4x4 token grid.
SMALL_GRAFTING = {
    "name": "small_grafting", "kind": "design",
    "spec": {
        "input": {"channels": 3, "resolution": 64},
        "stem": {"kind": "resnet", "channels": 16},
        "tokens": {"cls_token": "input", "pos_embed": "learned"},
        "stages": {"choice": {
            "c1": [{"kind": "conv", "block": "bottleneck", "depth": 1, "channels": 32, "stride": 1},
                   _deit({"int": [1, 3]}, 4)],
            "c2": [{"kind": "conv", "block": "bottleneck", "depth": 1, "channels": 32, "stride": 1},
                   {"kind": "conv", "block": "bottleneck", "depth": {"int": [1, 2]}, "channels": 64, "stride": 2},
                   _deit({"int": [1, 3]}, 4)],
        }},
        "head": {"pool": "cls", "num_classes": 10},
    },
}


def _samples(space, n: int, seed: int = 0):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask()
        spec = space.sample(trial)
        out.append((trial.params, spec))
    return out


def test_shipped_grafting_space_points_are_the_grafts_in_the_stated_range():
    space = load_space("levit_grafting")
    smallest = space.smallest()
    assert space.smallest_params() == {"stages": "r50s1", "stages.r50s1.1.depth": 1}
    assert analyze(smallest).macs == pytest.approx(HEADER_MACS[0], rel=0.01)
    macs = []
    for params, spec in _samples(space, 50):
        k = spec.n_conv_stages
        assert params["stages"] == f"r50s{k}" and spec.is_hybrid and len(spec.stages) == k + 1
        assert [s.channels for s in spec.stages[:k]] == [256, 512, 1024][:k]
        deit = spec.stages[k]
        assert isinstance(deit, StageSpec) and (deit.dim, deit.heads, deit.depth) == (384, 6,
                                                                                     params[f"stages.r50s{k}.{k}.depth"])
        macs.append(analyze(spec).macs)
    assert HEADER_MACS[0] * 0.99 <= min(macs) and max(macs) <= HEADER_MACS[1] * 1.01
    assert 2e9 < statistics.median(macs) < 6e9


def test_tab1_middle_rows_are_points_of_the_space():
    """Tab. 1 rows 2-4 (1/2/3 ResNet-50 stages under 9/6/3 DeiT-S layers) are the shipped specs' architectures."""
    space = load_space("levit_grafting")
    for k, layers in ((1, 9), (2, 6), (3, 3)):
        point = space.sample(optuna.trial.FixedTrial({"stages": f"r50s{k}", f"stages.r50s{k}.{k}.depth": layers}))
        shipped = load_spec(f"levit_graft_r50s{k}_deit{layers}")
        assert point.stages == shipped.stages and point.stem == shipped.stem and point.tokens == shipped.tokens
        assert analyze(point).macs == analyze(shipped).macs


@pytest.mark.slow
def test_small_grafting_space_runs_through_archspec_search(tmp_path: Path, capsys, one_thread):
    space = tmp_path / "small_grafting.yaml"
    space.write_text(yaml.safe_dump(SMALL_GRAFTING, sort_keys=False), encoding="utf-8")
    out = tmp_path / "run"
    rc = main(["search", "--space", str(space), "--out", str(out), "--trials", "3", "--fidelity", "zc",
               "--proxy-steps", "3", "--proxy-batch", "8", "--max-images", "60", "--latency-repeats", "2",
               "--budget-flops", "50M", "--no-progress", "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["pareto"]
    specs = [load_spec(path) for path in sorted((out / "pareto").glob("*.yaml"))] + [load_spec(out / "best.yaml")]
    for spec in specs:  # hybrids: 1-2 conv stages, then the DeiT stage on the pooled 4x4 grid
        assert spec.stem.kind == "resnet" and spec.is_hybrid
        kinds = [type(s) for s in spec.stages]
        assert kinds in ([ConvStageSpec, StageSpec], [ConvStageSpec, ConvStageSpec, StageSpec])
        assert spec.stages[-1].from_map.grid == (4, 4)
    for point in summary["pareto"]:  # the proxy kept the token grid (the conv maps may shrink)
        assert point["proxy_grids"][-1] == point["real_grids"][-1] == [4, 4]
    rows = (out / "trials.csv").read_text().splitlines()
    assert len(rows) >= 4 and "stages" in rows[0]


def test_a_bad_grafting_space_is_a_located_error_exit_2(tmp_path: Path, capsys):
    bad = yaml.safe_dump(SMALL_GRAFTING, sort_keys=False).replace("channels: 64", "chanels: 64")
    path = tmp_path / "bad.yaml"
    path.write_text(bad, encoding="utf-8")
    assert main(["search", "--space", str(path), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "spec.stages.choice.c2[1].chanels: unknown key 'chanels'" in err and "did you mean 'channels'" in err
    assert "Traceback" not in err and not (tmp_path / "r").exists()


def test_mask_placement_refuses_a_conv_net_exit_2(tmp_path: Path, capsys):
    rc = main(["search", "masks", "resnet18", "--out", str(tmp_path / "m"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "has no attention stage" in err and "Traceback" not in err and not (tmp_path / "m").exists()


@pytest.mark.slow
def test_mask_placement_on_a_hybrid_places_masks_in_its_token_stages(tmp_path: Path, capsys, one_thread):
    """A graft (a ResNet stem and bottleneck stage under a DeiT stage): MaiT's ALS rounds read and place masks on
    the token stage's heads only; the conv stage is left as it was and the placed spec builds."""
    spec = {"name": "tiny_graft", "input": {"channels": 3, "resolution": 64},
            "stem": {"kind": "resnet", "channels": 16}, "tokens": {"cls_token": "input", "pos_embed": "learned"},
            "stages": [{"kind": "conv", "block": "bottleneck", "depth": 1, "channels": 32, "stride": 1},
                       _deit(2, 8)],
            "head": {"pool": "cls", "num_classes": 10}}
    path = tmp_path / "tiny_graft.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    out = tmp_path / "m"
    rc = main(["search", "masks", str(path), "--strategy", "als", "--rounds", "1", "--window", "3x3", "--out", str(out),
               "--proxy-steps", "3", "--proxy-batch", "8", "--max-images", "60", "--latency-repeats", "2",
               "--no-progress", "--json"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out)
    assert set(summary["rounds"][0]["als"]) == {"s1.l0", "s1.l1"}  # token stage 1 only
    placed = load_spec(out / "best.yaml")
    assert placed.stages[0] == load_spec(path).stages[0]  # the conv stage untouched
    assert main(["build", str(out / "best.yaml"), "--out", str(tmp_path / "b"), "--repeats", "1"]) == 0


def test_space_schema_takes_conv_stages_in_every_stage_form():
    import jsonschema

    from archspec.errors import SpecError
    from archspec.spec.schema import space_schema

    validator = jsonschema.Draft202012Validator(space_schema())
    conv = {"kind": "conv", "block": "bottleneck", "depth": {"int": [1, 2]}, "channels": 32, "stride": 1}
    spec = {**SMALL_GRAFTING["spec"], "input": {"channels": 3, "resolution": 64}}
    forms = [SMALL_GRAFTING,
             {"spec": {**spec, "stages": [conv, _deit(1, 4)]}},
             {"spec": {**spec, "stages": {"count": 2, "items": [conv, _deit(1, 4)]}}}]
    for document in forms:
        assert list(validator.iter_errors(document)) == [], document
        load_space(document)
    typo = {"spec": {**spec, "stages": {"count": 2, "items": [{**conv, "chanels": 8}, _deit(1, 4)]}}}
    assert list(validator.iter_errors(typo))
    with pytest.raises(SpecError):
        load_space(typo)


def test_an_invalid_point_inside_an_alternative_is_located_there():
    from archspec.errors import SpecError

    stages = SMALL_GRAFTING["spec"]["stages"]["choice"]
    too_fine = {**stages, "c2": [*stages["c2"][:2], _deit(1, 16)]}  # a 16x16 grid from an 8x8 map
    document = {"spec": {**SMALL_GRAFTING["spec"], "stages": {"choice": too_fine}}}
    space = load_space(document)  # its smallest point (c1) is valid
    with pytest.raises(SpecError) as info:
        space.sample(optuna.trial.FixedTrial({"stages": "c2", "stages.c2.1.depth": 1}))
    problem = info.value.problems[0]
    assert problem.path == ("spec", "stages", "choice", "c2", 2, "from_map", "grid")
    assert "drawn: stages=c2" in problem.hint
    with pytest.raises(SpecError) as info:  # a stage's kind is no marker: choose between stage lists
        load_space({"spec": {**SMALL_GRAFTING["spec"], "stages": [{**stages["c1"][0], "kind": {"choice": ["conv"]}}]}})
    assert info.value.problems[0].path == ("spec", "stages", 0, "kind")


def test_mask_placement_space_of_a_hybrid_draws_only_its_token_stages():
    from archspec.search._space.language import mask_placement_space

    space = mask_placement_space(load_spec("levit_graft_r50s1_deit9"), windows=("3x3",))
    params = space.smallest_params()
    assert params and all(k.startswith("stages.1.") for k in params)  # stage 0 is ResNet-50's conv stage
