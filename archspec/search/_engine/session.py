"""The run directory of a search: where it lives, its first writes, its lock, and what resuming it says.

A run directory (``--out``, default ``runs/<study name>``) holds the study's storage (``study.db`` unless
``--storage``), the latency cache and every result file (:mod:`archspec.search._report.run_files` writes them).
:func:`check_outputs` checks it without creating anything; :func:`open_run` is the first write of a run;
:func:`run_lock` serialises the final writes of workers sharing it; :func:`zombie_notes` and
:func:`settings_notes` are the notes a resumed run starts with.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from pathlib import Path

import optuna
from optuna.trial import TrialState

from archspec._util.imports import try_import
from archspec.search._engine.config import SearchConfig
from archspec.search._report import run_files
from archspec.search._storage import (
    HEARTBEAT_INTERVAL_S,
    StorageInfo,
    check_storage,
    fail_zombie_trials,
    open_study,
    resolve_storage,
)

with try_import() as _fcntl:  # POSIX only: no lock where it does not exist
    import fcntl

__all__ = ["quiet_optuna", "run_dir_of", "check_outputs", "open_run", "resume_message", "announce_resume", "run_lock",
           "zombie_notes", "settings_notes"]


def quiet_optuna() -> None:
    """Silence Optuna's per-trial log and its experimental-feature warnings (for this process).

    Failed trials are reported by the summary (with their ``fail_reason``); Optuna's per-trial warnings
    with tracebacks would bury the progress bar."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def run_dir_of(cfg: SearchConfig, name: str) -> Path:
    """The run directory: ``--out``, or ``runs/<study name>``."""
    return Path(cfg.out).expanduser() if cfg.out else Path("runs") / name


def check_outputs(cfg: SearchConfig, name: str) -> None:
    """Check ``--out`` and ``--storage`` without creating or connecting to anything.

    Raises:
        SpecError: ``--out`` is not a usable run directory (:func:`run_files.check_run_dir`), or ``--storage``
            is refused by :func:`~archspec.search._storage.check_storage` (a non-SQLite ``study.db`` in an
            existing run directory included).
    """
    out = run_dir_of(cfg, name)
    run_files.check_run_dir(out)
    if cfg.storage is not None:
        check_storage(cfg.storage)
    elif out.is_dir():  # a new run directory is archspec's own and empty
        check_storage(None, out)


def open_run(cfg: SearchConfig, name: str, directions: list[str], metric_names: list[str], attrs: dict,
             sampler: optuna.samplers.BaseSampler, pruner: optuna.pruners.BasePruner | None = None,
             heartbeat: int | None = HEARTBEAT_INTERVAL_S) -> tuple[Path, StorageInfo, optuna.Study]:
    """Create the run directory, open the storage and the study: the first writes of a run.

    Call only after every input is checked (:func:`check_outputs` among them).  An explicit
    ``--storage`` is connected to before the run directory is created.  ``heartbeat`` (seconds, or
    ``None`` for ask/tell runs whose zombies are found by pid) is Optuna's trial heartbeat.

    Returns ``(run_dir, storage info, study)``.

    Raises:
        SpecError: the storage cannot be reached, or the study exists with other objectives.
    """
    out = run_dir_of(cfg, name)
    if cfg.storage is not None:
        info = resolve_storage(cfg.storage, heartbeat=heartbeat)
        run_dir = run_files.prepare_run_dir(out)
    else:
        run_dir = run_files.prepare_run_dir(out)
        info = resolve_storage(None, run_dir, heartbeat=heartbeat)
    study = open_study(name, info, directions, sampler, pruner, metric_names, attrs)
    announce_resume(study, info.url)
    return run_dir, info, study


def resume_message(study: optuna.Study, url: str) -> str | None:
    """``resuming study NAME in URL: 12 trials already there (5 trained, 7 pruned)``, or ``None`` for a new study."""
    trials = study.get_trials(deepcopy=False)
    if not trials:
        return None
    counts: dict[str, int] = {}
    for t in trials:
        label = "trained" if t.state == TrialState.COMPLETE else t.state.name.lower()
        counts[label] = counts.get(label, 0) + 1
    parts = ", ".join(f"{v} {k}" for k, v in counts.items())
    return f"resuming study {study.study_name} in {url}: {len(trials)} trials already there ({parts})"


def announce_resume(study: optuna.Study, url: str) -> None:
    """Say on stderr, before any trial runs, that this run continues an existing study (and how far it got)."""
    message = resume_message(study, url)
    if message is not None:
        print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def run_lock(run_dir: Path):
    """Serialise the final writes of concurrent workers sharing a run directory (``fcntl.flock`` on
    ``.finalize.lock``; no lock where ``fcntl`` does not exist)."""
    if not _fcntl.is_successful():  # pragma: no cover - not POSIX
        yield
        return
    with open(run_dir / ".finalize.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def zombie_notes(study: optuna.Study) -> list[str]:
    """Fail the RUNNING trials of dead workers (:func:`~archspec.search._storage.fail_zombie_trials`); the note
    saying so, if there were any."""
    zombies = fail_zombie_trials(study)
    return [f"marked {len(zombies)} stale RUNNING trial(s) of dead workers as FAIL: {zombies}"] if zombies else []


def settings_notes(study: optuna.Study, attrs: dict) -> list[str]:
    """Notes on a resumed study created with other settings (``attrs``: this run's study attributes): old and new
    objective values may not compare."""
    notes = []
    old = study.user_attrs
    for key in ("budgets", "proxy", "data", "latency_protocol", "space"):
        if key in old and key in attrs and run_files.jsonable(old[key]) != run_files.jsonable(attrs[key]):
            notes.append(f"resumed study was created with a different {key} ({old[key]}); "
                         "objective values of old and new trials may not be comparable")
    return notes
