"""Atomic writes: a file or a whole directory appears complete or not at all.

Every file archspec writes outside a build directory (search runs, training runs, tables) goes through here: a
temporary sibling (its name from :func:`archspec.io.builddir.staging_prefix`, so an interrupted write is
recognisably archspec's), ``fsync``, then :func:`os.replace`.
"""

from __future__ import annotations

import io
import os
import shutil
import tempfile
from pathlib import Path

from archspec.io.builddir import normal_mode, staging_prefix

__all__ = ["atomic_savefig", "atomic_write_bytes", "atomic_write_text", "replace_dir"]


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file in the same directory + ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=staging_prefix(path.name, "", ".tmp"), suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, normal_mode(directory=False))  # mkstemp makes 0o600; files follow the umask as open()'s do
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def atomic_write_text(path: Path, text: str) -> Path:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_savefig(fig, path: Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return atomic_write_bytes(path, buf.getvalue())


def replace_dir(final: Path, files: dict[str, str]) -> Path:
    """Replace directory ``final`` by one holding exactly ``files`` (name -> text), as atomically as
    a directory swap allows: build a temporary sibling, move the old one aside, move the new one in."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=staging_prefix(final.name), dir=final.parent))
    old = None
    try:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        if final.exists():
            old = final.with_name(f"{staging_prefix(final.name, 'old.', extra=10)}{os.getpid()}")
            if old.exists():
                shutil.rmtree(old)
            os.replace(final, old)
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists():
            shutil.rmtree(old, ignore_errors=True)
    return final
