"""MkDocs hook: the site's home page is the repository's README.md, with its links into docs/ made relative
to the site, so the README stays the one front page (GitHub shows it, the site serves it)."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File, Files


def on_files(files: Files, config) -> Files:
    readme = Path(config["config_file_path"]).parent / "README.md"
    text = re.sub(r"\]\(docs/", "](", readme.read_text(encoding="utf-8"))
    files.append(File.generated(config, "index.md", content=text))
    return files
