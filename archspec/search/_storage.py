"""Optuna storages for a search and a table: resolution, checks, opening or resuming a study, workers and zombie trials.

Everything here is Optuna's own machinery; archspec only chooses it and checks the user's input.  Shared by the
search engine (:mod:`archspec.search._engine`) and the tabulation (:mod:`archspec.search._tabulation`), it imports
nothing else of the search:

* :func:`resolve_storage` turns ``storage`` into an Optuna storage: ``None`` -> SQLite in the run
  directory (``sqlite:///runs/<study>/study.db``); any SQLAlchemy URL (``postgresql://``,
  ``mysql+pymysql://``, ``sqlite:///path``) -> :class:`optuna.storages.RDBStorage` with Optuna's
  heartbeat; ``journal:PATH`` -> :class:`optuna.storages.JournalStorage` on a
  :class:`~optuna.storages.journal.JournalFileBackend` (a lock-protected append-only file, good for
  several processes on one machine or an NFS share); ``memory`` -> in-memory (no resume).  An
  unreachable server, a missing driver, a SQLite/journal path in a missing directory, or an existing
  file that is not an SQLite database / Optuna journal (never turned into one) is a
  :class:`~archspec.errors.SpecError` naming ``storage``.  :func:`check_storage` makes every check
  that needs no connection, so a search can refuse bad input before it writes anything.
* :func:`open_study` creates the study or resumes it (``load_if_exists``), refusing to resume a study
  whose objectives differ from the ones asked for.
* :func:`fail_zombie_trials` marks RUNNING trials of dead workers FAIL (``fail_reason`` user attr):
  trials of this host whose worker process is gone (pid + process start time recorded by
  :func:`mark_worker`), and, for RDB storages, trials whose Optuna heartbeat went stale
  (:func:`optuna.storages.fail_stale_trials`, public API).  Run it before a worker starts optimising.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import socket
import sqlite3
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.trial import FrozenTrial, TrialState

from archspec._util.urls import hide_password
from archspec.errors import SpecError

__all__ = [
    "StorageInfo", "check_storage", "resolve_storage", "open_study", "fail_zombie_trials", "fail_trial",
    "mark_worker", "worker_identity", "validate_study_name", "HEARTBEAT_INTERVAL_S",
]

STUDY_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,80}$")
HEARTBEAT_INTERVAL_S = 20  # Optuna heartbeat for RDB storages; a trial is stale after 2x this without one


def validate_study_name(name: str) -> str:
    """Study names double as directory names: letters, digits, ``_ . -``, at most 80 characters."""
    if not STUDY_NAME_RE.match(name or "") or name in (".", ".."):
        raise SpecError.single(("study_name",), f"invalid study name {name!r}",
                               "use letters, digits, '_', '.' and '-' (at most 80 characters)")
    return name


@dataclass
class StorageInfo:
    """A resolved storage: the Optuna object, a display URL and its kind."""

    storage: BaseStorage
    url: str
    kind: str  # "sqlite", "rdb", "journal" or "memory"
    path: Path | None = None  # file of a sqlite / journal storage


def _storage_error(url: str, message: str, hint: str | None = None) -> SpecError:
    return SpecError.single(("storage",), f"cannot open storage {hide_password(url)!r}: {hide_password(message)}",
                            hint)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


_SQLITE_MAGIC = b"SQLite format 3\x00"  # the 16-byte header of every SQLite 3 database file
_JOURNAL_MAGIC = b'{"op_code":'  # Optuna's file journal: one JSON log per line, each starting so


def _check_writable(url: str, path: Path) -> None:
    """Refuse a storage file archspec could read but not write: an existing file without write
    permission, or a directory where the file (or the lock and rollback-journal files Optuna and SQLite
    create beside it) cannot be made.  ``os.access`` also answers for read-only mounts (``EROFS``)."""
    if os.path.lexists(path) and not os.access(path, os.W_OK):
        raise _storage_error(url, f"{str(path)!r} is read-only (no write permission, or a read-only file system)",
                             "make it writable (chmod u+w), or copy it somewhere writable and give that path")
    parent = path.parent if str(path.parent) else Path(".")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise _storage_error(url, f"directory {str(parent)!r} is read-only; the storage needs to create its lock "
                                  "and journal files beside the database", "give a path in a writable directory")


def _check_existing_file(url: str, path: Path, magic: bytes, what: str) -> None:
    """Refuse to let Optuna turn a user's file into a database: an existing ``path`` must be a regular
    file that is empty (a database a concurrent worker has just created) or starts with ``magic``."""
    if not os.path.lexists(path):
        return
    if not path.is_file():
        raise _storage_error(url, f"{str(path)!r} exists and is not a file")
    try:
        with open(path, "rb") as f:
            head = f.read(len(magic))
    except OSError as exc:
        raise _storage_error(url, f"cannot read {str(path)!r}: {exc.strerror}") from None
    if head and not magic.startswith(head) and not head.startswith(magic):
        raise _storage_error(url, f"{str(path)!r} exists and is not {what}; archspec will not write into it",
                             "give a new file name, or the file of an earlier archspec search")


_CUT_OFF_CHECKS = 3  # a record another worker is appending this instant is whole within milliseconds


def _journal_damage(data: bytes) -> tuple[int, str] | None:
    """The first damaged line of an Optuna file journal's bytes as ``(line number, what is wrong)``, or None.

    Every line must be one JSON object with an integer ``op_code`` ending in a newline: the format
    :class:`optuna.storages.journal.JournalFileBackend` appends.  Optuna's reader stops quietly at a
    bad *last* line (it may be another worker's write in progress), so a study with a cut-off record
    still loads -- and a record appended after it fuses with it into a line no reader gets past.
    """
    start, number = 0, 0
    while start < len(data):
        number += 1
        end = data.find(b"\n", start)
        if end < 0:
            return number, "is cut off (the last record has no newline: a write that never finished)"
        line, start = data[start:end], end + 1
        try:
            record = json.loads(line)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            return number, "is not a JSON record"
        if not isinstance(record, dict) or not isinstance(record.get("op_code"), int):
            return number, "is not an Optuna journal record (no integer op_code)"
    return None


def _verify_journal(url: str, path: Path) -> None:
    """Read an existing journal end to end and refuse it, saying how to recover, if any line is damaged."""
    if not path.is_file():
        return
    for check in range(_CUT_OFF_CHECKS):
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise _storage_error(url, f"cannot read {str(path)!r}: {exc.strerror}") from None
        damage = _journal_damage(data)
        if damage is None:
            return
        if "cut off" not in damage[1] or check + 1 == _CUT_OFF_CHECKS:
            break
        time.sleep(0.5)  # perhaps a concurrent worker's append: look again
    line, what = damage
    total = data.count(b"\n") + (not data.endswith(b"\n"))
    repaired = path.with_name(f"{path.stem}.repaired{path.suffix}")
    lost = f"; the {total - line} line(s) after it are dropped too" if total > line else ""
    raise SpecError.single(
        ("storage",),
        f"the Optuna journal is damaged: line {line} of {total} {what}. archspec will not append to it "
        "(a record written after a damaged line makes the study unreadable to archspec and to optuna.load_study)",
        f"keep the {line - 1} good records before it in a new file{lost}, and resume from that: "
        f"head -n {line - 1} {shlex.quote(str(path))} > {shlex.quote(str(repaired))}  then  "
        f"`storage` journal:{repaired}", file=str(path), line=line)


def _verify_sqlite(url: str, path: Path) -> None:
    """Run SQLite's ``PRAGMA quick_check`` on an existing database through a read-only connection."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=120)) as db:
            rows = db.execute("PRAGMA quick_check").fetchall()
    except sqlite3.Error as exc:
        rows = [(str(exc),)]
    if rows != [("ok",)]:
        detail = "; ".join(str(r[0]) for r in rows[:3])
        raise _storage_error(url, f"{str(path)!r} is a damaged SQLite database ({detail}); archspec will not write "
                                  "into it", "restore it from a backup, or give a new file name")


@dataclass
class _Target:
    """A checked ``storage``: what :func:`resolve_storage` will open, nothing opened yet."""

    url: str
    kind: str  # "sqlite", "rdb", "journal" or "memory"
    path: Path | None = None


def _journal_target(url: str) -> _Target:
    raw = url[len("journal:"):]
    if raw.startswith("//"):  # tolerate journal:///abs/path and journal://rel
        raw = raw[2:]
    if not raw:
        raise _storage_error(url, "no file path after 'journal:'", "e.g. `storage` journal:runs/shared.log")
    return _file_target(url, Path(raw).expanduser(), "journal", _JOURNAL_MAGIC, "an Optuna journal", _verify_journal)


def _file_target(url: str, path: Path, kind: str, magic: bytes, what: str, verify) -> _Target:
    """The storage file ``path`` checked before anything opens it: its directory exists, the file is absent, empty
    or ``what`` (it starts with ``magic``), ``verify(url, path)`` finds it whole, and it can be written.

    Raises:
        SpecError: at ``storage``, saying which of these fails.
    """
    if not path.parent.is_dir():
        raise _storage_error(url, f"directory {str(path.parent)!r} does not exist", "create it first")
    _check_existing_file(url, path, magic, what)
    verify(url, path)
    _check_writable(url, path)
    return _Target(url, kind, path)


def _make_url(url: str):
    """SQLAlchemy's parsed ``URL`` of a storage URL (SQLAlchemy, Optuna's RDB dependency, loads only when a database
    URL is named: journal and in-memory studies never import it).  Raises what ``make_url`` raises."""
    from sqlalchemy.engine import make_url  # noqa: PLC0415 - optional storage back ends load when named

    return make_url(url)


def _sqlalchemy_target(url: str) -> _Target:
    if "://" not in url:
        raise _storage_error(url, "not a storage URL",
                             "use sqlite:///PATH, postgresql://USER@HOST/DB, mysql+pymysql://..., "
                             "journal:PATH or memory")
    try:
        parsed = _make_url(url)
    except Exception as exc:  # noqa: BLE001
        raise _storage_error(url, f"malformed URL ({_first_line(exc)})") from None
    if parsed.get_backend_name() != "sqlite":
        return _Target(url, "rdb")
    database = parsed.database
    if not database or database == ":memory:":
        raise _storage_error(url, "an in-memory SQLite database cannot be shared or resumed",
                             "give a file: sqlite:///runs/name/study.db, or use `storage` memory")
    return _file_target(url, Path(database).expanduser(), "sqlite", _SQLITE_MAGIC, "an SQLite database", _verify_sqlite)


def check_storage(url: str | None, run_dir: Path | None = None) -> None:
    """Check ``storage`` without connecting or creating anything (run it before any file is written).

    Args:
        url: as for :func:`resolve_storage`; ``None`` checks ``study.db`` in ``run_dir`` when the
            run directory already exists (a new one is created by archspec and holds nothing).

    Raises:
        SpecError: what :func:`resolve_storage` refuses before connecting: an unknown scheme, a
            malformed URL, a path in a missing directory, a path that is a directory, or an existing
            file that is not an SQLite database (16-byte header ``SQLite format 3\\0``) or an Optuna
            journal (lines ``{"op_code": ...}``) -- archspec never turns a user's file into a database.
    """
    _target(url, run_dir)


def _target(url: str | None, run_dir: Path | None) -> _Target:
    if url is None:
        if run_dir is None:
            raise ValueError("run_dir is needed for the default storage")
        url = f"sqlite:///{(Path(run_dir) / 'study.db').resolve()}"
    url = url.strip()
    if url == "memory":
        return _Target("memory", "memory")
    if url.startswith("journal:"):
        return _journal_target(url)
    return _sqlalchemy_target(url)


def resolve_storage(url: str | None, run_dir: Path | None = None,
                    heartbeat: int | None = HEARTBEAT_INTERVAL_S) -> StorageInfo:
    """Resolve ``storage`` into an Optuna storage, connecting (and creating tables) now.

    Args:
        url: ``None`` (SQLite ``study.db`` in ``run_dir``), an SQLAlchemy URL, ``journal:PATH`` or ``memory``.
        run_dir: the run directory (must exist when ``url`` is ``None``).
        heartbeat: Optuna heartbeat interval in seconds for RDB storages (``None`` disables it).

    Raises:
        SpecError: everything :func:`check_storage` refuses, a missing driver, an unreachable server.
    """
    target = _target(url, run_dir)
    url = target.url
    if target.kind == "memory":
        return StorageInfo(optuna.storages.InMemoryStorage(), "memory", "memory")
    if target.kind == "journal":
        path = str(target.path)
        try:
            storage = optuna.storages.JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
        except Exception as exc:  # noqa: BLE001 - any failure to open is a user-facing storage problem
            raise _storage_error(url, _first_line(exc)) from None
        return StorageInfo(storage, f"journal:{target.path}", "journal", target.path)
    engine_kwargs: dict[str, Any] = {}
    if target.kind == "sqlite":
        # Several worker processes write one file: wait for the lock instead of failing at once.
        engine_kwargs["connect_args"] = {"timeout": 120}
    else:
        engine_kwargs["pool_pre_ping"] = True
        if _make_url(url).get_backend_name() in ("postgresql", "mysql", "mariadb"):
            engine_kwargs["connect_args"] = {"connect_timeout": 10}
    try:
        storage = _rdb_storage(url, engine_kwargs, heartbeat)
    except ModuleNotFoundError as exc:
        raise _storage_error(url, f"the database driver {exc.name!r} is not installed",
                             f"pip install {exc.name}, or use sqlite:///PATH or journal:PATH") from None
    except ImportError as exc:
        raise _storage_error(url, f"a database driver is missing ({_first_line(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - OperationalError, ArgumentError...: all user-facing
        raise _storage_error(url, _first_line(exc), "is the server running and the URL right?") from None
    return StorageInfo(storage, _make_url(url).render_as_string(hide_password=True), target.kind, target.path)


def _rdb_storage(url: str, engine_kwargs: dict, heartbeat: int | None, attempts: int = 4) -> BaseStorage:
    """``RDBStorage``, retried a few times: workers starting together on a fresh database race to create
    its tables (one gets "table already exists" or "database is locked"); the retry finds them made."""

    for attempt in range(attempts):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat)
        except (ImportError, ModuleNotFoundError):
            raise
        except Exception as exc:  # noqa: BLE001
            text = str(exc).lower()
            if attempt + 1 < attempts and ("already exists" in text or "locked" in text or "unique constraint" in text):
                time.sleep(0.5 + attempt)
                continue
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def _direction_names(directions: Sequence[optuna.study.StudyDirection]) -> list[str]:
    return [d.name.lower() for d in directions]


def open_study(name: str, info: StorageInfo, directions: Sequence[str], sampler: optuna.samplers.BaseSampler,
               pruner: optuna.pruners.BasePruner | None = None, metric_names: Sequence[str] | None = None,
               attrs: dict[str, Any] | None = None) -> optuna.Study:
    """Create study ``name`` in the storage, or resume it when it exists (Optuna ``load_if_exists``).

    ``attrs`` are set as study user attributes when the study is new (the run's settings).

    Raises:
        SpecError: the storage fails, or an existing study of that name has other objectives or ranks by another
            proxy score (``attrs["proxy"]["score"]``).
    """
    validate_study_name(name)
    try:
        existing = {s.study_name: s for s in optuna.get_all_study_summaries(info.storage, include_best_trial=False)}
    except Exception as exc:  # noqa: BLE001
        raise _storage_error(info.url, _first_line(exc)) from None
    if name in existing:
        old = _direction_names(existing[name].directions)
        if old != list(directions):
            raise SpecError.single(
                ("study_name",),
                f"study {name!r} already exists in {info.url} with objectives {old}, not {list(directions)}",
                "use another `study_name` (or `out`), or the same `objective` as before")
        _check_same_score(name, info.url, existing[name].user_attrs, attrs or {})
    try:
        study = optuna.create_study(study_name=name, storage=info.storage, sampler=sampler, pruner=pruner,
                                    directions=list(directions), load_if_exists=True)
    except Exception as exc:  # noqa: BLE001
        raise _storage_error(info.url, _first_line(exc)) from None
    if name not in existing:
        try:
            if metric_names:
                study.set_metric_names(list(metric_names))
            for key, value in (attrs or {}).items():
                study.set_user_attr(key, value)
        except Exception:  # noqa: BLE001 - another worker created it at the same moment: fine
            pass
    return study


def _check_same_score(name: str, url: str, old_attrs: dict, attrs: dict) -> None:
    """Refuse to resume a study whose trials are ranked by another proxy score (val top-1 against TSE: their
    values are not comparable).  A study that records no score ranked by val top-1, the only score then."""
    if "proxy" not in old_attrs or "proxy" not in attrs:
        return
    old, new = (a["proxy"].get("score", "accuracy") for a in (old_attrs, attrs))
    if old != new:
        raise SpecError.single(("protocol", "score"),
                               f"study {name!r} in {url} ranks its candidates by {old}, this run by {new}: their "
                               "values are not comparable", f"resume it with `protocol.score` {old}, or use another "
                               "`study_name` (or `out`)")


# ----------------------------------------------------------------------------------- workers / zombies
def _process_start(pid: int) -> str | None:
    """Start time of process ``pid`` in clock ticks since boot (Linux ``/proc``), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    if start is not None:
        now = _process_start(pid)
        if now is not None and now != start:
            return False  # the pid was reused by another process
        try:  # an unreaped child of ours that was killed is a zombie process: dead
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().decode("ascii", "replace").rsplit(")", 1)[1].split()[0] == "Z":
                    return False
        except (OSError, IndexError):
            pass
    return True


def worker_identity() -> dict[str, Any]:
    """``{"host", "pid", "start"}`` of this process (recorded on each trial it runs)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": _process_start(os.getpid())}


def mark_worker(trial: optuna.trial.Trial) -> None:
    """Record which process runs ``trial`` (user attr ``worker``), so a later run can tell it died."""
    trial.set_user_attr("worker", worker_identity())


def fail_trial(study: optuna.Study, trial: FrozenTrial, reason: str) -> bool:
    """Mark a RUNNING trial FAIL with user attr ``fail_reason``; False if another process finished it first."""
    storage = study._storage
    try:
        storage.set_trial_user_attr(trial._trial_id, "fail_reason", reason)
        return storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
    except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError):
        return False


def fail_zombie_trials(study: optuna.Study) -> list[int]:
    """Mark RUNNING trials of dead workers FAIL; returns their numbers.

    A RUNNING trial is a zombie when its worker (user attr ``worker``) ran on this host and that
    process no longer exists, or when the storage's Optuna heartbeat says it is stale (RDB storages,
    other hosts included; :func:`optuna.storages.fail_stale_trials`, which records no reason, so those
    trials are only listed in the returned numbers).  Trials of live workers are left alone.

    Raises:
        Whatever the storage raises when it cannot be read (the caller has just opened it).
    """
    me = worker_identity()
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = trial.user_attrs.get("worker")
        if not isinstance(worker, dict) or worker.get("host") != me["host"]:
            continue
        pid = worker.get("pid")
        if not isinstance(pid, int) or pid == me["pid"]:
            continue
        if not _alive(pid, worker.get("start")):
            if fail_trial(study, trial, f"worker process {pid} died while running this trial (killed or interrupted); "
                                        "marked failed on resume"):
                failed.append(trial.number)
    # Other hosts' workers: Optuna's heartbeat (RDB storages; a no-op for storages without one).
    running = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning
        optuna.storages.fail_stale_trials(study)
    stale = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)) if t.number in running]
    return sorted(set(failed) | set(stale))
