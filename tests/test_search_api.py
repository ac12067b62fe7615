"""The Python API of search: run_design / run_masks with keyword options, the outcome's specs, and a space
sampled inside a user's own Optuna objective."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from search_fixtures import TINY_SPACE

import archspec.search as search
import archspec.search.cli_support as cli_support
from archspec import SpecError, analyze, load_spec
from archspec.spec import ArchSpec

PROTOCOL = {"steps": 3, "eval_every": 3, "batch_size": 8, "warmup_steps": 1, "image_size": 32, "threads": 1}
LATENCY = {"repeats": 2, "warmup": 1}

TINY_MAIT = {
    "name": "tiny_mait", "input": {"channels": 3, "resolution": 32}, "stem": {"kind": "patch", "patch_size": 4},
    "tokens": {"cls_token": "input", "pos_embed": "learned"},
    "stages": [{"depth": 2, "dim": 32, "heads": 2, "attention": "mhsa",
                "layers": [{"range": 0, "heads": ["mask:3x3", "mhsa"]}]}],
    "head": {"pool": "cls", "num_classes": 10},
}


API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


@pytest.mark.parametrize("face", [search, cli_support], ids=["archspec.search", "cli_support"])
def test_public_names_are_the_documented_ones(face):
    """Each face's ``__all__`` is its export table, every name resolves, and docs/api.md documents it: an entry for
    the name where it is defined (``::: module.name``), or, for the defaults and choices of the command line's face,
    the face's own entry, whose docstring lists them (issue 82: about 20 names a face, as Optuna's are)."""
    assert sorted(face.__all__) == sorted(face._EXPORTS) and len(face.__all__) <= 24
    page = API_PAGE.read_text(encoding="utf-8")
    assert f"::: {face.__name__}\n" in page
    for name in face.__all__:
        value = getattr(face, name)
        assert value is not None
        if callable(value) and not isinstance(value, dict):
            assert f"::: {face._EXPORTS[name]}.{name}\n" in page, f"docs/api.md does not document {name}"
        else:
            assert f":data:`{name}`" in face.__doc__, f"{face.__name__}'s docstring does not list {name}"


def test_the_faces_import_neither_torch_nor_optuna():
    """The product face and the command line's face load their names on first use (PEP 562)."""
    code = ("import sys, archspec.search, archspec.search.cli_support as c; c.SAMPLERS; c.PROXY_SCORES; "
            "assert not {'torch', 'optuna'} & set(sys.modules), sorted({'torch', 'optuna'} & set(sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_run_design_from_python(tmp_path, one_thread):
    outcome = search.run_design(space=TINY_SPACE, budgets={"macs": "10M"}, trials=2, out=tmp_path / "run",
                                fidelity="zc", protocol=PROTOCOL, latency=LATENCY, max_images=60, progress=False)
    assert isinstance(outcome.study, optuna.Study) and outcome.run_dir == tmp_path / "run"
    front = outcome.pareto_specs
    assert front and all(isinstance(s, ArchSpec) for s in front)
    assert outcome.best_spec == front[0]  # the most accurate point is best.yaml
    accuracies = [p["accuracy"] for p in outcome.summary["pareto"]]
    assert accuracies == sorted(accuracies, reverse=True)
    assert all(analyze(s).macs <= 10e6 for s in front)
    # the proxy trained at the candidate's own grid (32 px through LeViT's 4 convs: 2x2), recorded per point
    assert all(p["proxy_grids"] == p["real_grids"] for p in outcome.summary["pareto"])
    assert outcome.summary["zero_cost"]["scored"] >= 2


@pytest.mark.slow
def test_the_search_loop_freezes_the_heap_it_found_and_unfreezes_it(tmp_path, one_thread, monkeypatch):
    """StopRules runs a full collection after each trained candidate; the loop freezes what lived before it
    (``gc.freeze``: a collection then walks only objects made since, milliseconds instead of ~0.3 s) and unfreezes
    it when it ends, also when Ctrl-C ends it (issue 53)."""
    import gc

    from archspec.search._engine.objective import CandidateObjective

    frozen, real_call = [], CandidateObjective.__call__

    def call(self, trial):
        frozen.append(gc.get_freeze_count())
        if getattr(self, "interrupt", False):
            raise KeyboardInterrupt
        return real_call(self, trial)

    monkeypatch.setattr(CandidateObjective, "__call__", call)
    outcome = search.run_design(space=TINY_SPACE, trials=2, out=tmp_path / "run", fidelity="none",
                                protocol=PROTOCOL, latency=LATENCY, max_images=60, progress=False)
    assert len(frozen) >= 2 and min(frozen) > 10_000  # torch alone holds far more than 10,000 objects
    assert gc.get_freeze_count() == 0 and not outcome.summary["interrupted"]
    monkeypatch.setattr(CandidateObjective, "interrupt", True, raising=False)
    outcome = search.run_design(space=TINY_SPACE, trials=2, out=tmp_path / "stopped", fidelity="none",
                                protocol=PROTOCOL, latency=LATENCY, max_images=60, progress=False)
    assert outcome.summary["interrupted"] and gc.get_freeze_count() == 0


def test_run_design_refuses_bad_options_before_writing(tmp_path):
    with pytest.raises(TypeError):
        search.run_design(no_such_option=1)
    with pytest.raises(SpecError) as info:
        search.run_design(space=TINY_SPACE, out=tmp_path / "r", zc_score="accuracy", progress=False)
    assert info.value.problems[0].path == ("zc_score",) and not (tmp_path / "r").exists()
    with pytest.raises(SpecError) as info:
        search.run_design(space=TINY_SPACE, out=tmp_path / "r", budgets={"macs": "lots"}, progress=False)
    assert info.value.problems[0].path == ("budgets", "macs") and not (tmp_path / "r").exists()


def test_a_python_caller_is_told_the_budget_field_and_the_command_line_its_flag(tmp_path):
    """Issue 58 item 5: the library names the field (``budgets.macs``), ``archspec.cli`` maps it to its flag."""
    with pytest.raises(SpecError) as info:
        search.run_design(space=TINY_SPACE, out=tmp_path / "r", budgets={"macs": "1k"}, progress=False)
    (problem,) = info.value.problems
    assert problem.path == ("budgets", "macs") and "smallest achievable" in problem.message
    assert "raise `budgets.macs`" in problem.hint and "--budget" not in str(info.value)
    flags = info.value.with_options({("budgets", k): v for k, v in cli_support.BUDGET_OPTIONS.items()})
    assert flags.problems[0].path == ("--budget-flops",) and "raise --budget-flops" in flags.problems[0].hint


def test_mode_two_defaults_apply_under_a_partial_search_dict(tmp_path):
    with pytest.raises(SpecError) as info:  # a bad strategy is refused before anything is written
        search.run_masks(spec=load_spec(TINY_MAIT), strategy="greedy", search={"out": tmp_path / "m"})
    assert info.value.problems[0].path == ("strategy",) and not (tmp_path / "m").exists()


@pytest.mark.slow
def test_run_masks_from_python(tmp_path, one_thread):
    outcome = search.run_masks(spec=load_spec(TINY_MAIT), strategy="optuna", windows=("3x3",),
                               search={"out": tmp_path / "m", "trials": 1, "protocol": PROTOCOL, "latency": LATENCY,
                                       "max_images": 60, "progress": False})
    best = outcome.best_spec
    assert isinstance(best, ArchSpec) and outcome.pareto_specs == [best]
    assert outcome.summary["proxy"]["lr"] == 1e-3 and outcome.summary["proxy"]["min_grid"] == 8  # mode 2's


def test_space_inside_a_users_own_objective():
    """``load_space(...).sample(trial)`` in an objective the user writes: Optuna drives it, specs are valid."""
    space = search.load_space(None)

    def objective(trial: optuna.Trial) -> float:
        spec = space.sample(trial)
        trial.set_user_attr("spec", spec.model_dump(mode="json"))
        return analyze(spec).macs

    study = optuna.create_study(direction="minimize", sampler=optuna.samplers.RandomSampler(seed=0))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study.optimize(objective, n_trials=5)
    for trial in study.trials:
        spec = load_spec(trial.user_attrs["spec"])
        assert analyze(spec).macs == trial.value and trial.params  # what Optuna sampled is the spec's choice
