"""Studies shared by worker processes: concurrency, resume after a killed worker, storages, zombies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from search_fixtures import TINY_SPACE

from archspec.errors import SpecError
from archspec.search._engine.study import make_sampler
from archspec.search._storage import (
    fail_zombie_trials,
    open_study,
    resolve_storage,
    validate_study_name,
    worker_identity,
)

FAST = ["--proxy-size", "32", "--proxy-batch", "8", "--max-images", "60", "--latency-repeats", "2", "--no-progress"]
COMPLETE, RUNNING, FAIL = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING,
                           optuna.trial.TrialState.FAIL)


@pytest.fixture()
def space_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_space.yaml"
    path.write_text(yaml.safe_dump(TINY_SPACE), encoding="utf-8")
    return path


def _worker(space: Path, out: Path, storage: str, name: str, trials: int, steps: int, seed: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "archspec", "search", "--space", str(space), "--out", str(out), "--storage", storage,
           "--study-name", name, "--trials", str(trials), "--proxy-steps", str(steps), "--seed", str(seed), "--json",
           "--fidelity", "none", *FAST]  # every candidate trains: the test counts trained architectures
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=str(Path(__file__).resolve().parents[1]))


@pytest.mark.slow
def test_two_worker_processes_share_one_study(space_file, tmp_path):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    out = tmp_path / "run"
    procs = [_worker(space_file, out, storage, "shared", trials=2, steps=3, seed=1) for _ in range(2)]  # one --seed
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr[-3000:]
    trials = optuna.load_study(study_name="shared", storage=storage).get_trials()
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)) and sorted(numbers) == list(range(len(trials)))  # none lost, none twice
    trained = [t for t in trials if t.state == COMPLETE and "reused_from" not in t.user_attrs]
    keys = [t.user_attrs["arch_key"] for t in trained]
    assert len(keys) == len(set(keys)) == 4  # 2 each, never the same architecture twice (the space has 4)
    assert all(t.state == COMPLETE or t.user_attrs.get("status") == "duplicate" for t in trials)
    assert len({t.user_attrs["worker"]["pid"] for t in trained}) == 2  # both processes trained
    assert (out / "best.yaml").is_file()
    rows = (out / "trials.csv").read_text().splitlines()
    assert len(rows) == 1 + len(trials)


@pytest.mark.slow
def test_killed_worker_is_resumed_and_its_trial_failed(space_file, tmp_path):
    from archspec.cli import main

    storage = f"sqlite:///{tmp_path / 'k.db'}"
    out = tmp_path / "run"
    proc = _worker(space_file, out, storage, "killed", trials=1, steps=100_000, seed=0)  # a trial that never ends
    deadline = time.time() + 120
    running = []
    try:
        while time.time() < deadline and not running:
            time.sleep(0.5)
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            try:
                study = optuna.load_study(study_name="killed", storage=storage)
                running = [t for t in study.get_trials() if t.state == RUNNING and "latency_ms" in t.user_attrs]
            except Exception:  # noqa: BLE001 - the worker has not created the study yet
                pass
        assert running, "the worker never started training"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    assert main(["search", "--space", str(space_file), "--out", str(out), "--storage", storage,
                 "--study-name", "killed", "--trials", "1", "--proxy-steps", "3", *FAST]) == 0
    trials = optuna.load_study(study_name="killed", storage=storage).get_trials()
    zombie = trials[running[0].number]
    assert zombie.state == FAIL and "died" in zombie.user_attrs["fail_reason"]
    assert sum(t.state == COMPLETE for t in trials) == 1 and not any(t.state == RUNNING for t in trials)
    assert (out / "best.yaml").is_file()


@pytest.mark.slow
def test_journal_storage_resume(space_file, tmp_path, capsys):
    from archspec.cli import main

    journal = tmp_path / "journal.log"
    args = ["search", "--space", str(space_file), "--out", str(tmp_path / "run"), "--storage", f"journal:{journal}",
            "--study-name", "j", "--proxy-steps", "2", "--trials", "1", *FAST]
    assert main(args) == 0 and main(args) == 0
    info = resolve_storage(f"journal:{journal}")
    study = optuna.load_study(study_name="j", storage=info.storage)
    trials = study.get_trials()
    assert all(t.state == COMPLETE for t in trials)  # the resumed run trained one more (copies reuse a result)
    trained = [t.user_attrs["arch_key"] for t in trials if "reused_from" not in t.user_attrs]
    assert len(trained) == len(set(trained)) == 2


# ----------------------------------------------------------------------------------- units
@pytest.mark.slow
def test_resolve_storage_errors(tmp_path):
    for url, needle in [("postgresql://nohost/db", "cannot open storage"),
                        (f"sqlite:///{tmp_path}/no/such/dir/x.db", "does not exist"),
                        (f"journal:{tmp_path}/nodir/j.log", "does not exist"),
                        ("ftp://example/x", "cannot open storage"),
                        ("just-a-name", "not a storage URL"),
                        ("sqlite://", "in-memory")]:
        with pytest.raises(SpecError) as err:
            resolve_storage(url)
        # the library names its parameter; `archspec search` prints --storage (archspec.cli.options)
        assert needle in str(err.value) and err.value.problems[0].path[0] == "storage", url
    assert resolve_storage("memory").kind == "memory"
    assert resolve_storage(None, tmp_path).url.endswith("study.db")
    with pytest.raises(SpecError):
        validate_study_name("../evil")


@pytest.mark.slow
def test_open_study_refuses_other_objectives(tmp_path):
    info = resolve_storage(None, tmp_path)
    open_study("s", info, ["maximize", "minimize"], make_sampler("tpe", 0, 2))
    with pytest.raises(SpecError) as err:
        open_study("s", info, ["maximize"], make_sampler("tpe", 0, 1))
    assert "objectives" in str(err.value)


def test_open_study_refuses_another_proxy_score(tmp_path):
    """A study whose candidates are ranked by val top-1 (no recorded score: the only one before TSE, and the default
    again since issue 82) is not resumed by a run ranking by TSE -- the default in between -- nor the other way
    round."""
    info = resolve_storage(None, tmp_path)
    open_study("old", info, ["maximize"], make_sampler("random", 0, 1), attrs={"proxy": {"steps": 120}})
    with pytest.raises(SpecError) as err:
        open_study("old", info, ["maximize"], make_sampler("random", 0, 1), attrs={"proxy": {"score": "tse"}})
    assert "`protocol.score` accuracy" in str(err.value) and "ranks its candidates by accuracy" in str(err.value)
    assert open_study("old", info, ["maximize"], make_sampler("random", 0, 1), attrs={"proxy": {}})  # accuracy
    open_study("new", info, ["maximize"], make_sampler("random", 0, 1), attrs={"proxy": {"score": "tse"}})
    with pytest.raises(SpecError, match="`protocol.score` tse"):
        open_study("new", info, ["maximize"], make_sampler("random", 0, 1), attrs={"proxy": {}})


@pytest.mark.slow
def test_fail_zombie_trials_only_dead_workers(tmp_path):
    info = resolve_storage(None, tmp_path, heartbeat=None)
    study = open_study("z", info, ["maximize"], make_sampler("random", 0, 1))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = worker_identity()
    zombie = study.ask()
    zombie.set_user_attr("worker", {**me, "pid": dead.pid, "start": None})
    alive = study.ask()
    alive.set_user_attr("worker", {**me, "pid": os.getppid(), "start": None})  # a live process (pytest's parent)
    assert fail_zombie_trials(study) == [zombie.number]
    states = {t.number: t.state for t in study.get_trials()}
    assert states[zombie.number] == FAIL and states[alive.number] == RUNNING
    assert "died" in study.get_trials()[zombie.number].user_attrs["fail_reason"]
