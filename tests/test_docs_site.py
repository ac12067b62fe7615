"""The documentation site builds: ``mkdocs build --strict`` fails on a broken link or anchor, a page left out
of the nav, or a ``:::`` API entry that names nothing (mkdocs.yml, docs/)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.slow,  # a whole site build: several seconds
    pytest.mark.skipif(
        importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
        reason="mkdocs and mkdocstrings are not installed (they come with the test extra: pip install '.[test]')",
    ),
]


def test_site_builds_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    home = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")
    assert "pip install" in home, "the home page is the README"
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("load_spec", "compile", "ArchModel", "SpecError", "conv_to_mhsa"):
        assert name in api, f"the API page documents {name}"
