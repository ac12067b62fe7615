"""``ruff check .`` passes with the configuration in pyproject.toml ([tool.ruff])."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> str:
    try:  # the PyPI package ships the binary and says where it is
        from ruff.__main__ import find_ruff_bin
    except ImportError:
        path = shutil.which("ruff")
        if path is None:
            pytest.skip("ruff is not installed (it comes with the test extra: pip install '.[test]')")
        return path
    return str(find_ruff_bin())


def test_ruff_check():
    proc = subprocess.run([_ruff(), "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"ruff check . found problems:\n{proc.stdout[-8000:]}{proc.stderr[-2000:]}"


def test_every_package_is_in_pyproject():
    """A non-editable install ships only the packages pyproject.toml lists: a new family folder left out installs
    nothing and breaks every import of it (caught by CI's clean install, not by an editable checkout)."""
    tomllib = pytest.importorskip("tomllib")
    root = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "archspec").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
