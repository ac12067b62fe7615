"""Distinct candidates: per-worker sampler seeds, reuse of trained architectures, duplicates, progress lines."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import optuna
import pytest
import yaml
from search_fixtures import TINY_SPACE

from archspec.search._engine.config import DEFAULT_SAMPLER
from archspec.search._engine.study import make_sampler, same_architecture, worker_seed
from archspec.search._evaluation.latency import architecture_key
from archspec.search._space.language import load_space
from archspec.search._storage import resolve_storage

# --fidelity none: these tests count trained architectures, so every candidate must train
FAST = ["--proxy-size", "32", "--proxy-batch", "8", "--max-images", "60", "--latency-repeats", "2",
        "--fidelity", "none"]
COMPLETE, PRUNED = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED


@pytest.fixture()
def space_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_space.yaml"
    path.write_text(yaml.safe_dump(TINY_SPACE), encoding="utf-8")
    return path


def _search(space_file: Path, out: Path, storage: str, trials: int, *extra: str) -> dict:
    from archspec.cli import main

    assert main(["search", "--space", str(space_file), "--out", str(out), "--storage", storage, "--study-name", "d",
                 "--trials", str(trials), "--proxy-steps", "2", "--seed", "0", *FAST, *extra]) == 0
    return json.loads((out / "summary.json").read_text())


def _study(storage: str) -> optuna.Study:
    return optuna.load_study(study_name="d", storage=resolve_storage(storage).storage)


def _trained(study: optuna.Study) -> list:
    return [t for t in study.get_trials() if t.state == COMPLETE and "reused_from" not in t.user_attrs]


def test_worker_seed_rule():
    assert worker_seed(7, 0) == 7  # the study's first worker samples with --seed itself
    derived = [worker_seed(7, n) for n in range(1, 200)]
    assert len(set(derived)) == len(derived) and 7 not in derived
    assert derived == [worker_seed(7, n) for n in range(1, 200)]  # reproducible
    assert worker_seed(8, 5) != worker_seed(7, 5)


@pytest.mark.slow
def test_fresh_run_samples_what_plain_optuna_samples(space_file, tmp_path):
    """Reproducible: a fresh single worker with --seed 3 proposes what Optuna's own sampler (the default one)
    seeded 3 does."""
    storage = f"journal:{tmp_path / 'a.log'}"
    _search(space_file, tmp_path / "a", storage, 3, "--no-progress", "--seed", "3")
    run_keys = [t.user_attrs["arch_key"] for t in _study(storage).get_trials()]
    space = load_space(TINY_SPACE)
    plain = optuna.create_study(directions=["maximize", "minimize"], sampler=make_sampler(DEFAULT_SAMPLER, 3, 2))
    expected = []
    for _ in run_keys:  # random, or fewer than TPE's startup trials: sampling ignores the values told
        trial = plain.ask()
        expected.append(architecture_key(space.sample(trial)))
        plain.tell(trial, (0.5, 1.0))
    assert run_keys == expected
    storage_b = f"journal:{tmp_path / 'b.log'}"
    _search(space_file, tmp_path / "b", storage_b, 3, "--no-progress", "--seed", "3")
    assert [t.user_attrs["arch_key"] for t in _study(storage_b).get_trials()] == run_keys


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
@pytest.mark.slow
def test_second_worker_trains_only_new_architectures(space_file, tmp_path, kind, capsys):
    storage = f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite" else f"journal:{tmp_path / 's.log'}"
    out = tmp_path / "run"
    _search(space_file, out, storage, 2, "--no-progress")
    first = _study(storage).get_trials()[0]
    _study(storage).enqueue_trial(first.params)  # the resumed worker's first candidate: already trained
    capsys.readouterr()
    summary = _search(space_file, out, storage, 2, "--no-progress")  # same --seed
    err = capsys.readouterr().err
    assert "resuming study d in " in err and "3 trials already there (2 trained, 1 waiting)" in err  # said first
    study = _study(storage)
    keys = [t.user_attrs["arch_key"] for t in _trained(study)]
    assert len(keys) == len(set(keys)) == 4  # the tiny space has 4 architectures: all trained, none twice
    reused = [t for t in study.get_trials() if t.state == COMPLETE and "reused_from" in t.user_attrs]
    copy = next(t for t in reused if t.number == 2)
    assert copy.user_attrs["reused_from"] == first.number and copy.values == first.values
    assert copy.user_attrs["arch_key"] == first.user_attrs["arch_key"] and "train_seconds" not in copy.user_attrs
    assert summary["trained_total"] == 4 and summary["trained_this_run"] == 2 and summary["reused_this_run"] >= 1
    assert summary["counts"]["reused"] == len(reused)
    assert summary["sampler_seed"] == worker_seed(0, 2) != 0  # this worker began at trial 2: its own seed
    rows = (out / "trials.csv").read_text().splitlines()
    assert any(",reused," in row for row in rows) and "reused_from" in rows[0]
    assert all("trial2." not in p["file"] for p in summary["pareto"])  # a copy is never ranked
    if kind == "sqlite":  # every architecture is trained now: the next worker says so and trains nothing
        summary = _search(space_file, out, storage, 1, "--no-progress")
        assert summary["trained_this_run"] == 0 and len(_trained(_study(storage))) == 4
        assert any("no untried architectures left" in n for n in summary["notes"])


@pytest.mark.slow
def test_architecture_in_training_elsewhere_is_skipped(space_file, tmp_path):
    """A key that a live worker is training (RUNNING, claimed) is not trained again: the trial steps back."""
    import os

    from archspec.search._storage import worker_identity

    storage = f"journal:{tmp_path / 'r.log'}"
    _search(space_file, tmp_path / "run", storage, 1, "--no-progress")
    study = _study(storage)
    done = study.get_trials()[0]
    busy = study.ask()  # another worker, alive (pytest's parent process), training another architecture
    space = load_space(TINY_SPACE)
    grid = [{"stages.0.depth": d, "stages.0.dim": w} for d in (1, 2) for w in (16, 32)]  # the whole tiny space
    params = next(p for p in grid if p != done.params)
    key = architecture_key(space.sample(optuna.trial.FixedTrial(params)))
    for name, value in {"worker": {**worker_identity(), "pid": os.getppid(), "start": None}, "arch_key": key,
                        "status": "training"}.items():
        busy.set_user_attr(name, value)
    study.enqueue_trial(params)
    _search(space_file, tmp_path / "run", storage, 1, "--no-progress")
    trials = _study(storage).get_trials()
    step_back = trials[busy.number + 1]
    assert step_back.state == PRUNED and step_back.user_attrs["duplicate_of"] == busy.number
    assert [t.user_attrs["arch_key"] for t in _trained(_study(storage))].count(key) == 0
    assert same_architecture(_study(storage), key, -1).number == busy.number


@pytest.mark.slow
def test_progress_lines_when_stdout_is_not_a_terminal(space_file, tmp_path, capsys):
    _search(space_file, tmp_path / "run", f"journal:{tmp_path / 'p.log'}", 2)
    lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("trial ")]
    pattern = re.compile(r"^trial (\d+) (COMPLETE|REUSED \(trial \d+\)) acc=(\d\.\d{3}) ms=(\d+\.\d\d) "
                         r"macs=\S+ \d+s eta (\d+s|-) trained (\d)/2$")
    matches = [pattern.match(line) for line in lines]
    assert lines and all(matches), lines
    trained = [int(m.group(6)) for m in matches]
    assert trained == sorted(trained) and trained[-1] == 2  # one line per finished trial, in order
    study = _study(f"journal:{tmp_path / 'p.log'}")
    assert [int(m.group(1)) for m in matches] == [t.number for t in study.get_trials()]
    assert [float(m.group(3)) for m in matches] == [round(t.user_attrs["accuracy"], 3) for t in study.get_trials()]


def test_progress_line_states_and_eta():
    from archspec.search._report.progress import progress_line

    failed = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={"fail_reason": "boom"})
    failed.number = 7
    assert progress_line(failed, 30.0, 3, 5, 100.0) == (
        "trial 7 FAIL (boom) acc=- ms=- macs=- 30s eta 20s trained 3/5")  # 10 s/trained x 2 left
    assert progress_line(failed, 95.0, 3, 5, 100.0).endswith("eta 5s trained 3/5")  # capped by --timeout
    assert " eta - " in progress_line(failed, 1.0, 0, 5, None)
    dup = optuna.trial.create_trial(state=PRUNED, user_attrs={"status": "duplicate", "duplicate_of": 4})
    dup.number = 5
    assert progress_line(dup, 1.0, 0, 5, 60.0).startswith("trial 5 PRUNED (duplicate of trial 4) ")
    long_reason = optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={"fail_reason": "x" * 300})
    long_reason.number, long_reason.user_attrs["macs"] = 123, 987_654_321
    line = progress_line(long_reason, 12345.0, 1234, 5000, None)
    assert len(line) <= 80 and line.endswith("trained 1234/5000") and "…" in line  # an 80-column terminal


def test_progress_bar_fits_80_columns():
    """The rich bar on an 80-column terminal: one line per refresh, nothing wrapped (the status is cut)."""
    from rich.console import Console

    from archspec.search._report.progress import _rich_bar

    console = Console(width=80, record=True, file=io.StringIO(), force_terminal=True)
    progress, task = _rich_bar(16, "best acc 0.912 | fastest 12.8 ms | 3 infeasible | 1 failed | trial 12: "
                                   "zero-cost scores", console=console)
    progress.update(task, completed=5)
    console.print(progress.get_renderable())
    lines = console.export_text().rstrip("\n").splitlines()
    assert len(lines) == 1 and len(lines[0]) <= 80 and "5/16" in lines[0], lines


@pytest.mark.parametrize("status", ["training", "trained", "stopped"])
@pytest.mark.slow
def test_running_trial_holds_its_claim_until_optuna_records_it(tmp_path, status):
    """A RUNNING trial whose worker has set ``trained`` (or ``stopped``) but not yet told Optuna still holds
    the architecture: a worker looking in that window must step back, not train it again (the race seen
    with four workers on PostgreSQL).  Duplicates and reused copies never hold a claim."""
    study = optuna.create_study(study_name="d", storage=f"sqlite:///{tmp_path / 'c.db'}")
    holder, duplicate, reused = study.ask(), study.ask(), study.ask()
    for trial, trial_status in ((holder, status), (duplicate, "duplicate"), (reused, "reused")):
        trial.set_user_attr("arch_key", "k")
        trial.set_user_attr("status", trial_status)
    assert same_architecture(study, "k", -1).number == holder.number
    assert same_architecture(study, "k", holder.number) is None  # neither a duplicate nor a reused copy claims
    assert same_architecture(study, "other", -1) is None
