"""Build directories: archspec writes, replaces and removes only directories it wrote itself.

``archspec build`` writes OUT (default ``build/<name>/``) holding exactly :data:`BUILD_FILES` (and
:data:`INT8_FILE` with ``--int8``); its ``report.json`` carries the marker key ``"archspec_build"`` (the
archspec version).  A directory is an archspec build (:func:`is_build`) when it is a real directory (not a
link) holding nothing but those names, each a regular file, and its report.json has the marker.  What
happens to OUT (:func:`check_out`):

- missing: the files are written into a staging sibling ``.<name>.archspec-tmp-XXXXXXXX`` which is then
  renamed to OUT, so OUT never holds a partial build (for a name too long to leave room for that, the
  ``<name>`` part is shortened: :func:`staging_prefix`);
- an empty directory: the files are written into it, report.json (the marker) last, so an interrupted
  write never looks like a complete build (the next build refuses that OUT and names what is in it);
- an archspec build: a staging sibling is filled and exchanged with OUT in one atomic step, then the
  old build is removed after checking again that it is nothing but an archspec build; at every instant
  OUT holds either the old or the new complete build (see :func:`swap_in` for systems without the
  atomic exchange);
- anything else (a file, a link, a directory holding anything else): refused, nothing touched.

Staging directories left by a killed build -- named as above, holding nothing but build files (or
nothing), not locked by a running build -- are removed by the next build of the same OUT.
Directories get mode ``0o777 & ~umask`` and files ``0o666 & ~umask``, as ``mkdir`` and ``open`` give.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

try:  # POSIX only: the lock that tells a running build's staging directory from a leftover
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

import hashlib

from archspec._version import __version__
from archspec.errors import SpecError

REPORT = "report.json"
BUILD_FILES = frozenset({"spec.yaml", "model.safetensors", REPORT})
INT8_FILE = "int8.safetensors"  # only in an `archspec build --int8`: the calibrated observers (archspec.deploy.int8)


@dataclass(frozen=True)
class Layout:
    """What an archspec output directory holds: exactly ``files``, one of which, ``report``, is the JSON
    carrying :data:`MARKER`.  :data:`BUILD` is ``archspec build``'s; ``archspec inspect`` has its own
    (:data:`archspec.diagnostics.inspection.INSPECT`), under the same rules."""

    files: frozenset
    report: str


BUILD = Layout(BUILD_FILES | {INT8_FILE}, REPORT)
MARKER = "archspec_build"
# archspec 0.1.0 wrote report.json without the marker; its report always held these keys together, so
# a directory of nothing but BUILD_FILES with such a report is a build archspec wrote (replaced, not refused).
LEGACY_REPORT_KEYS = frozenset({"latency_ms", "latency_protocol", "rows", "seed", "out", "image"})
MAX_REPORT_BYTES = 10_000_000  # a report is a table of layers; anything bigger is not ours
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2  # linux/fs.h
_AT_FDCWD = -100
NAME_MAX = 255  # bytes in one path component on Linux (ext4, xfs, btrfs, tmpfs) and macOS
_RANDOM_CHARS = 8  # what tempfile.mkstemp / mkdtemp put between prefix and suffix


def staging_prefix(name: str, tag: str = "", suffix: str = "", extra: int = _RANDOM_CHARS) -> str:
    """The prefix of a hidden sibling of ``name`` that fits one path component: ``.<name>.<tag>``.

    When that prefix, ``extra`` more characters (tempfile's random part) and ``suffix`` would pass
    :data:`NAME_MAX` bytes, the ``<name>`` part is ``name`` cut to fit (at a character boundary) plus ``~``
    and 8 hex digits of its SHA-1, so the sibling still tells which ``name`` it belongs to: a 240-character
    ``out`` gets a staging sibling as a short one does.  Raises nothing.
    """
    full = f".{name}.{tag}"
    room = NAME_MAX - extra - len(suffix.encode("utf-8", "surrogateescape"))
    if len(full.encode("utf-8", "surrogateescape")) <= room:
        return full

    raw = name.encode("utf-8", "surrogateescape")
    digest = hashlib.sha1(raw).hexdigest()[:8]
    keep = max(room - len(f"..{tag}~{digest}".encode("utf-8", "surrogateescape")), 0)
    visible = raw[:keep].decode("utf-8", "ignore")  # drops a character cut in half
    return f".{visible}~{digest}.{tag}"


def normal_mode(directory: bool) -> int:
    """The mode ``mkdir`` / ``open`` would give under the current umask: ``0o777`` or ``0o666`` minus the umask.

    Reads the umask by setting and restoring it (the only portable way); a file another thread creates
    in that instant is masked with 0o022.  Raises nothing.
    """
    mask = os.umask(0o022)
    os.umask(mask)
    return (0o777 if directory else 0o666) & ~mask


def writable_dir(directory: Path) -> bool:
    """Whether this process may create entries in ``directory``: ``access(2)`` with W_OK and X_OK, which also
    answers no for an immutable (``chattr +i``) directory or a read-only file system, even to root."""
    return os.access(directory, os.W_OK | os.X_OK)


def uncreatable(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be created, or ``None``: its nearest existing ancestor is not a directory
    (``"runs is not a directory"``), or (``path`` missing) is a directory this process may not write (checked by
    :func:`writable_dir`, before anything is made: an ``mkdir`` there is a NotADirectoryError or PermissionError
    half-way through a command).  Raises nothing."""
    path = Path(path)
    parent = path
    while True:
        parent = parent.parent
        if os.path.lexists(parent) or parent == parent.parent:
            break
    if parent.exists() and not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.path.lexists(path) and parent.is_dir() and not writable_dir(parent):
        return f"{parent} is not writable (permissions, a read-only or immutable directory)"
    return None


def _out_error(out: Path, message: str, hint: str | None = None) -> SpecError:
    return SpecError.single(("out",), message, hint, str(out))


def _has_marker(report: Path) -> bool:
    """True when ``report`` is a small JSON object with the :data:`MARKER` key; never blocks on a FIFO."""
    try:
        fd = os.open(report, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return False
            text = fh.read(MAX_REPORT_BYTES + 1)
        data = json.loads(text) if len(text) <= MAX_REPORT_BYTES else None
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and (MARKER in data or LEGACY_REPORT_KEYS <= data.keys())


def only_build_files(path: Path, layout: Layout = BUILD) -> bool:
    """True when ``path`` is a real directory whose entries are all ``layout.files``, as regular files."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
        with os.scandir(path) as entries:
            return all(e.name in layout.files and e.is_file(follow_symlinks=False) for e in entries)
    except OSError:
        return False


def is_build(path: str | os.PathLike, layout: Layout = BUILD) -> bool:
    """True when ``path`` is a directory archspec built: nothing but ``layout.files`` and the marker.

    Raises nothing (an unreadable directory is not a build).
    """
    path = Path(path)
    return only_build_files(path, layout) and _has_marker(path / layout.report)


def check_out(out: str | os.PathLike, layout: Layout = BUILD) -> str:
    """Classify the output directory before anything is computed or written.

    Returns ``"new"`` (missing), ``"empty"`` (an empty directory: written into) or ``"build"`` (an
    archspec output of this ``layout``: replaced).

    Raises:
        SpecError: on ``out``, naming the path, when OUT is a link, not a directory, unreadable, or a
            directory holding anything that is not an archspec build.
    """
    out = Path(out)
    names = _entries(out)
    if names is None:
        return "new"
    if not names:
        return "empty"
    if is_build(out, layout):
        return "build"
    raise _not_ours(out, names, layout)


def _entries(out: Path) -> list[str] | None:
    """The sorted names in the real directory ``out``; None when it is missing.

    Raises:
        SpecError: ``out`` is a link, not a directory, or cannot be read.
    """
    try:
        mode = os.lstat(out).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _out_error(out, f"cannot inspect it: {exc.strerror or exc}") from None
    if stat.S_ISLNK(mode):
        raise _out_error(out, "is a symbolic link; archspec replaces build directories whole and will not follow one",
                         "give the real directory with `out`")
    if not stat.S_ISDIR(mode):
        raise _out_error(out, "exists and is not a directory", "choose another `out`")
    try:
        return sorted(os.listdir(out))
    except OSError as exc:
        raise _out_error(out, f"cannot list it: {exc.strerror or exc}", "choose another `out`") from None


def check_group_out(out: str | os.PathLike, members: tuple[str, ...] | list[str], layout: Layout = BUILD) -> None:
    """Check an output directory whose builds are named subdirectories (``two-phase``: ``phase1/``, ...).

    OUT follows build's rule one level up: it may be missing, empty, or a real directory holding nothing
    but subdirectories named in ``members``, each of which :func:`check_out` accepts (missing, empty or
    an archspec build).  Nothing is written.

    Raises:
        SpecError: on ``out``, naming the path: OUT is a link, not a directory, unreadable, or holds
            anything else (a user's file, another directory, a member that is not an archspec build).
    """
    out = Path(out)
    names = _entries(out) or []
    foreign = [n for n in names if n not in members or not stat.S_ISDIR(os.lstat(out / n).st_mode)]
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise _out_error(out, f"holds {shown}, which archspec did not write here (it writes only "
                              f"{', '.join(m + '/' for m in members)})",
                         "choose another `out`, or move its contents away yourself; archspec never deletes what "
                         "it did not write")
    for name in names:
        check_out(out / name, layout)


def _not_ours(out: Path, names: list[str], layout: Layout = BUILD) -> SpecError:
    hint = "choose another `out`, or move its contents away yourself; archspec never deletes what it did not write"
    if set(names) <= layout.files and only_build_files(out, layout):
        return _out_error(out, f"holds {', '.join(names)} but is not marked as an archspec build "
                               f"(its {layout.report} has "
                               f"no {MARKER!r} key: an older archspec or an interrupted build wrote it)", hint)
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return _out_error(out, f"is not an empty directory or an archspec build: it holds {shown}", hint)


def _renameat2(src: Path, dst: Path, flags: int) -> bool:
    """Linux ``renameat2(2)`` through libc; False where the C library or the filesystem lacks it.

    Raises:
        OSError: any other failure (missing source, permissions, ``EEXIST`` for RENAME_NOREPLACE, ...).
    """
    func = _libc_renameat2()
    if func is None:
        return False
    if func(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # old kernel, or a filesystem without the flag
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


@functools.lru_cache(maxsize=1)
def _libc_renameat2():
    """The C library's ``renameat2`` (glibc >= 2.28 has the wrapper), or None off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        func = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


def move_in(staging: Path, out: Path) -> None:
    """Rename the complete ``staging`` directory to the missing ``out``; never replaces anything there.

    Raises:
        OSError: ``out`` appeared meanwhile (``EEXIST``/``ENOTEMPTY``), or the rename failed.
    """
    if _renameat2(staging, out, _RENAME_NOREPLACE):
        return
    if os.path.lexists(out):  # without RENAME_NOREPLACE: a check, then the rename (a narrow race)
        raise FileExistsError(errno.EEXIST, "appeared while building", str(out))
    os.rename(staging, out)


def swap_in(staging: Path, out: Path) -> Path:
    """Put the complete build ``staging`` at ``out`` (an existing build); return where the old build now is.

    On Linux this is one atomic ``renameat2(RENAME_EXCHANGE)``: the old build ends up at ``staging``.
    Elsewhere (or on a filesystem without the exchange) it is two renames, OUT -> ``.<name>.archspec-old-*``
    then staging -> OUT; between the two, OUT does not exist while the old build is complete under the
    ``-old-`` name, which the next build of OUT removes.

    Raises:
        OSError: a rename failed (then OUT still holds the old build).
    """
    if _renameat2(staging, out, _RENAME_EXCHANGE):
        return staging
    tmp_prefix = staging_prefix(out.name, "archspec-tmp-")
    tail = staging.name[len(tmp_prefix):] if staging.name.startswith(tmp_prefix) else staging.name[-_RANDOM_CHARS:]
    aside = staging.with_name(staging_prefix(out.name, "archspec-old-") + tail)
    os.rename(out, aside)
    try:
        os.rename(staging, out)
    except OSError:
        os.rename(aside, out)  # put the old build back
        raise
    return aside


def _lock(directory: Path, blocking: bool) -> int | None:
    """Open ``directory`` and take an exclusive flock on it; None where it is held elsewhere or flock is missing."""
    if fcntl is None:
        return None
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        return None
    return fd


def _leftover_pattern(out: Path) -> re.Pattern:
    prefixes = (staging_prefix(out.name, "archspec-tmp-"), staging_prefix(out.name, "archspec-old-"))
    return re.compile(rf"(?:{'|'.join(re.escape(p) for p in prefixes)})[A-Za-z0-9_]+")


def clean_leftovers(out: Path, layout: Layout = BUILD) -> list[Path]:
    """Remove staging directories a killed build of ``out`` left next to it; return those removed.

    Only directories named ``.<name>.archspec-tmp-*`` / ``-old-*`` holding nothing but build files,
    and not locked by a running build, are removed; anything else is left alone.  Raises nothing.
    """
    removed = []
    pattern = _leftover_pattern(out)
    try:
        candidates = [out.parent / n for n in os.listdir(out.parent) if pattern.fullmatch(n)]
    except OSError:
        return removed
    for path in candidates:
        if fcntl is None or not only_build_files(path, layout):
            continue
        fd = _lock(path, blocking=False)
        if fd is None:  # a build is writing it right now
            continue
        try:
            if only_build_files(path, layout):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        finally:
            os.close(fd)
    return removed


def write_report(path: Path, report: dict) -> dict:
    """Write ``report`` with the marker as its first key to ``path``; return what was written."""
    marked = {MARKER: __version__, **report}
    path.write_text(json.dumps(marked, indent=2) + "\n", encoding="utf-8")
    return marked


def write_build(out: str | os.PathLike, fill: Callable[[Path], None], report: dict,
                layout: Layout = BUILD) -> tuple[dict, str | None]:
    """Write a build to ``out`` by the rules in the module docstring.

    Args:
        out: the output directory (``--out`` on the command line).
        fill: writes ``spec.yaml`` and ``model.safetensors`` into the directory it is given.
        report: the report; written as ``report.json`` (``layout.report``) with the marker added.
        layout: the files the directory holds (default: ``archspec build``'s).

    Returns:
        ``(report as written, warning)``: the warning (or None) says where an old build was left when
        it no longer looked like an archspec build after the swap.

    Raises:
        SpecError: ``out`` is not archspec's to write (see :func:`check_out`).
        OSError: writing failed; nothing is left behind but what was there before.
    """
    state = check_out(out, layout)  # again: OUT may have changed while the model was built
    out = Path(os.path.abspath(out))  # staging names need a real last component (not '.')
    if state == "empty":
        return _write_into_empty(out, fill, report, layout), None
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_leftovers(out, layout)
    staging = Path(tempfile.mkdtemp(prefix=staging_prefix(out.name, "archspec-tmp-"), dir=out.parent))
    lock = _lock(staging, blocking=True)
    try:
        os.chmod(staging, normal_mode(directory=True))  # mkdtemp makes it 0o700
        marked = write_report(staging / layout.report, report)  # first: a leftover is recognisably ours
        fill(staging)
        if state == "new":
            move_in(staging, out)
            return marked, None
        old = swap_in(staging, out)
        return marked, _remove_old(old, layout)
    finally:
        if lock is not None:
            os.close(lock)
        if only_build_files(staging, layout):  # a failure before the move: our own staging directory
            shutil.rmtree(staging, ignore_errors=True)


def _remove_old(old: Path, layout: Layout = BUILD) -> str | None:
    """Remove the swapped-out old build if it is still nothing but an archspec build; else say where it is."""
    if is_build(old, layout):
        shutil.rmtree(old, ignore_errors=True)
        return None
    if not os.path.lexists(old):
        return None
    return f"the previous build held files archspec did not write by the time it was replaced; it is kept at {old}"


def _write_into_empty(out: Path, fill: Callable[[Path], None], report: dict, layout: Layout = BUILD) -> dict:
    """Write the build files into the empty directory ``out``, the marker last; on failure remove them again."""
    try:
        fill(out)
        return write_report(out / layout.report, report)
    except BaseException:
        for name in layout.files:  # the directory was empty: these are ours
            try:
                os.unlink(out / name)
            except OSError:
                pass
        raise
