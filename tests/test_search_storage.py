"""A search never writes into a storage it has not verified: damaged or read-only journals and databases.

Optuna's journal reader stops quietly at a bad last line, so before this check a search appended its
records after a cut-off one and made the study unreadable to archspec and to ``optuna.load_study``.
Every case here is refused with exit 2 before anything is written (the storage keeps its bytes, no run
directory appears), and the recovery the message prints gives a journal that resumes.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from search_fixtures import TINY_SPACE

from archspec.cli import main
from archspec.search._storage import _journal_damage, check_storage, resolve_storage

FAST = ["--proxy-steps", "1", "--proxy-size", "32", "--max-images", "40", "--latency-repeats", "1", "--no-progress",
        "--study-name", "t", "--trials", "1"]


@pytest.fixture()
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("space.yaml").write_text(yaml.safe_dump(TINY_SPACE))
    return tmp_path


def _search(storage: str, out: str = "run") -> list[str]:
    return ["search", "--space", "space.yaml", "--out", out, "--storage", storage, *FAST]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def searched(tmp_path_factory) -> dict[str, bytes]:
    """The bytes of a journal and an SQLite study that a real 1-trial search wrote (made once)."""
    root = tmp_path_factory.mktemp("searched")
    cwd = os.getcwd()
    os.chdir(root)
    try:
        Path("space.yaml").write_text(yaml.safe_dump(TINY_SPACE))
        assert main(_search("journal:j.log", "run_j")) == 0
        assert main(_search("sqlite:///s.db", "run_s")) == 0
    finally:
        os.chdir(cwd)
    return {"journal": (root / "j.log").read_bytes(), "sqlite": (root / "s.db").read_bytes()}


# ----------------------------------------------------------------------------------- the damage detector
@pytest.mark.parametrize("data, expected", [
    (b"", None),
    (b'{"op_code":0}\n{"op_code":4,"trial_id":0}\n', None),
    (b'{"op_code":0}\n{"op_code":4,"tri', (2, "cut off")),
    (b'{"op_code":0}\nthis is not json\n', (2, "not a JSON record")),
    (b'{"op_code":0}\n[1, 2]\n{"op_code":0}\n', (2, "no integer op_code")),
    (b'{"op_code":0}\n\n', (2, "not a JSON record")),  # an empty line stops Optuna's reader too
    (b'{"op_code":0}\n\xff\xfe\n', (2, "not a JSON record")),
])
def test_journal_damage_is_located(data, expected):
    found = _journal_damage(data)
    if expected is None:
        assert found is None
    else:
        assert found is not None and found[0] == expected[0] and expected[1] in found[1]


# ----------------------------------------------------------------------------------- damaged journal: refused
@pytest.mark.parametrize("damage", ["truncate", "stray_line", "stray_line_inside"])
@pytest.mark.slow
def test_damaged_journal_is_refused_unwritten_and_recoverable(work, searched, capsys, damage):
    journal = work / "j.log"
    lines = searched["journal"].splitlines(keepends=True)
    if damage == "truncate":
        journal.write_bytes(b"".join(lines)[:-7])  # the last record loses its end: a full disk, a crash
        bad_line = len(lines)
    elif damage == "stray_line":
        journal.write_bytes(b"".join(lines) + b"this is not json\n")
        bad_line = len(lines) + 1
    else:
        journal.write_bytes(b"".join(lines[:3]) + b"this is not json\n" + b"".join(lines[3:]))
        bad_line = 4
    before = _digest(journal)
    assert main(_search(f"journal:{journal}")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "damaged" in err and f"j.log:{bad_line}:" in err, err
    assert _digest(journal) == before and not (work / "run").exists()  # nothing appended, no run directory
    # The printed recovery keeps the good records; the copy resumes and Optuna reads it.
    command = re.search(r"head -n \d+ \S+ > \S+", err).group(0)
    subprocess.run(command, shell=True, check=True, cwd=work)
    repaired = re.search(r"--storage journal:(\S+)", err).group(1)
    assert (work / repaired).read_bytes() == b"".join(lines[:bad_line - 1])
    assert main(_search(f"journal:{repaired}")) == 0, capsys.readouterr().err
    study = optuna.load_study(study_name="t", storage=resolve_storage(f"journal:{work / repaired}").storage)
    kept = sum(b'"op_code":4,' in line for line in lines[:bad_line - 1])  # create_trial records kept
    assert len(study.trials) == kept + 1 and _digest(journal) == before  # the damaged original is left as it was


@pytest.mark.slow
def test_damaged_sqlite_is_refused_unwritten(work, searched, capsys):
    db = work / "s.db"
    data = searched["sqlite"]
    db.write_bytes(data[:100] + b"\x00" * 4000 + data[4100:])  # pages overwritten behind an intact header
    before = _digest(db)
    assert main(_search(f"sqlite:///{db}")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "damaged SQLite database" in err, err
    assert _digest(db) == before and not (work / "run").exists()


@pytest.mark.slow
def test_concurrent_append_in_progress_is_waited_for(tmp_path, searched):
    """A last line that completes while archspec looks (another worker's append) is not damage."""
    journal = tmp_path / "j.log"
    whole = searched["journal"]
    journal.write_bytes(whole[:-7])
    finisher = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(0.3); "
                                 "open(sys.argv[1], 'ab').write(sys.argv[2].encode('latin-1'))",
                                 str(journal), whole[-7:].decode("latin-1")])
    try:
        check_storage(f"journal:{journal}")
    finally:
        finisher.wait()
    assert journal.read_bytes() == whole


# ----------------------------------------------------------------------------------- read-only storages
def _run_read_only(target: Path, argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run the CLI with ``target`` read-only: a read-only bind mount when root (root ignores file modes),
    the file mode otherwise."""
    cli = [sys.executable, "-m", "archspec", *argv]
    if os.geteuid() != 0:
        target.chmod(0o444)
        return subprocess.run(cli, cwd=cwd, capture_output=True, text=True)
    if shutil.which("unshare") is None:
        pytest.skip("root without unshare(1): cannot make a read-only file")
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" || exit 99; exec "$@"'
    proc = subprocess.run(["unshare", "-m", "sh", "-c", script, str(target), *cli], cwd=cwd, capture_output=True,
                          text=True)
    if proc.returncode == 99:
        pytest.skip(f"no read-only bind mount here: {proc.stderr.strip()}")
    return proc


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
@pytest.mark.slow
def test_read_only_storage_is_refused_before_the_run_directory(work, searched, kind):
    path = work / ("j.log" if kind == "journal" else "s.db")
    path.write_bytes(searched[kind])
    storage = f"journal:{path}" if kind == "journal" else f"sqlite:///{path}"
    before = _digest(path)
    proc = _run_read_only(path, _search(storage), work)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "read-only" in proc.stderr and "--storage" in proc.stderr, proc.stderr
    assert not (work / "run").exists() and _digest(path) == before


@pytest.mark.slow
def test_read_only_directory_is_refused(work):
    ro = work / "ro"
    ro.mkdir()
    proc = _run_read_only(ro, _search(f"journal:{ro / 'new.log'}"), work)
    ro.chmod(0o755)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "read-only" in proc.stderr, proc.stderr
    assert not (work / "run").exists() and not any(ro.iterdir())


# ----------------------------------------------------------------------------------- passwords (issue 80)
SECRET = "s3cr3t-pw"


@pytest.mark.parametrize("url", [
    f"postgresql+psycopg://archspec:{SECRET}@127.0.0.1:1/tables",  # nothing listens on port 1: refused at once
    f"postgresql://archspec:{SECRET}@127.0.0.1:1/tables",            # psycopg2, the default driver, is not installed
    f"postgresql://archspec:{SECRET}@127.0.0.1:notaport/tables",     # malformed: SQLAlchemy's message holds the URL
])
def test_a_storage_error_never_prints_the_password(tmp_path, monkeypatch, capsys, url):
    """Issue 80: a storage that cannot be opened printed its URL with the PostgreSQL password (in ``archspec table`` and
    ``archspec search``; the success path printed it as ``***``, SQLAlchemy's ``render_as_string(hide_password=True)``).
    Now the password is ``***`` in every message, the URL otherwise as given."""
    from archspec.errors import SpecError

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError) as info:
        resolve_storage(url)
    text = str(info.value)
    assert SECRET not in text and "archspec:***@127.0.0.1" in text, text
    for argv in (["table", "mait_small", "--storage", url, "--report"],
                 ["search", "--space", "levit_small", "--storage", url, "--trials", "1", "--out", "run"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert SECRET not in err and "archspec:***@" in err and "Traceback" not in err, err
