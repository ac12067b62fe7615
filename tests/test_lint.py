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
