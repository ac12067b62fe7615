"""Four `archspec search` worker processes on one study in a real PostgreSQL server.

The server is Debian's ``postgresql`` (``tests/pg_server.py``: a temporary data directory, 127.0.0.1, a
free port, stopped at the end); the test is skipped, saying why, only where it cannot start or the
driver (``psycopg``) is missing.  Checked against the storage itself: every trial number appears once,
no architecture key is trained twice, and after a worker is killed with SIGKILL mid-study a new worker
marks its trial FAIL and carries the study on.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pg_server
import pytest
import yaml
from search_fixtures import TINY_SPACE

COMPLETE, FAIL, RUNNING = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL,
                           optuna.trial.TrialState.RUNNING)
FAST = ["--proxy-size", "32", "--proxy-batch", "8", "--max-images", "60", "--latency-repeats", "2",
        "--proxy-steps", "2", "--no-progress", "--study-name", "pg", "--fidelity", "none"]  # every candidate trains


@pytest.fixture(scope="module")
def postgres():
    pytest.importorskip("psycopg",
                        reason="the PostgreSQL driver psycopg is not installed (pip install 'psycopg[binary]')")
    server = pg_server.start()
    if isinstance(server, str):
        pytest.skip(server)
    yield server.url
    server.stop()


@pytest.fixture()
def space_file(tmp_path: Path) -> Path:
    space = copy.deepcopy(TINY_SPACE)  # 18 architectures: room for 4 workers x 2 trials and a resume
    space["spec"]["stages"][0].update({"depth": {"int": [1, 3]}, "dim": {"choice": [16, 24, 32]},
                                       "key_dim": {"choice": [8, 16]}})
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space), encoding="utf-8")
    return path


def _worker(space_file: Path, out: Path, url: str, trials: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "archspec", "search", "--space", str(space_file), "--storage", url,
                             "--out", str(out), "--trials", str(trials), *FAST, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def _trained_keys(study: optuna.Study) -> list[str]:
    return [t.user_attrs["arch_key"] for t in study.get_trials()
            if t.state == COMPLETE and "reused_from" not in t.user_attrs]


@pytest.mark.slow
def test_four_workers_share_a_postgres_study(postgres, space_file, tmp_path):
    workers = [_worker(space_file, tmp_path / f"w{k}", postgres, 2) for k in range(4)]
    outputs = [w.communicate(timeout=400)[0] for w in workers]
    assert [w.returncode for w in workers] == [0] * 4, "\n".join(o[-2000:] for o in outputs)
    storage = optuna.storages.RDBStorage(postgres)  # one engine for every look (each load by URL opens a pool)
    study = optuna.load_study(study_name="pg", storage=storage)
    trials = study.get_trials()
    assert sorted(t.number for t in trials) == list(range(len(trials)))  # every trial counted once
    keys = _trained_keys(study)
    assert len(keys) == 8 and len(set(keys)) == 8  # 4 workers x 2 trials, no architecture trained twice
    assert not [t for t in trials if t.state == RUNNING]

    # kill -9 a worker while it trains, then resume the study with a new worker
    # still training when killed:
    victim = _worker(space_file, tmp_path / "victim", postgres, 6, "--proxy-steps", "100000")
    deadline = time.monotonic() + 300  # a loaded 1-core CI run took over 120 s to reach its first trial
    # wait for a trial that is training, not merely RUNNING: Optuna creates the trial before archspec records its
    # worker, and a worker killed in between leaves a trial only the heartbeat (40 s) can fail (a loaded CI run)
    while time.monotonic() < deadline and not any(
            t.state == RUNNING and t.user_attrs.get("status") == "training" and "worker" in t.user_attrs
            for t in study.get_trials()):
        time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    orphan = [t.number for t in study.get_trials() if t.state == RUNNING]
    assert orphan, "the killed worker left no running trial"
    from archspec.cli import main  # the resuming worker runs in this process: one interpreter start less

    assert main(["search", "--space", str(space_file), "--storage", postgres, "--out", str(tmp_path / "resumed"),
                 "--trials", "2", *FAST]) == 0
    states = {t.number: t for t in study.get_trials()}
    assert all(states[n].state == FAIL and "died" in states[n].user_attrs.get("fail_reason", "") for n in orphan)
    keys = _trained_keys(study)
    assert len(keys) >= 10 and len(set(keys)) == len(keys)
