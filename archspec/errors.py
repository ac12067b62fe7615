"""User-facing errors: every problem in a spec names its file, line, column and field path.

A :class:`SpecError` carries one or more :class:`Problem` s.  The CLI prints them and exits with
status 2; library callers catch :class:`SpecError` (a ``ValueError``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

Path = tuple[str | int, ...]


def format_path(path: Path) -> str:
    """``('stages', 0, 'layers', 1, 'heads')`` -> ``stages[0].layers[1].heads``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<root>"


@dataclass
class Problem:
    """One located problem in a spec.

    ``path`` is the field path inside the spec; ``line`` and ``column`` are 1-based positions in
    ``file`` when the spec came from YAML text (``None`` for specs built from Python objects).
    """

    path: Path
    message: str
    hint: str | None = None
    file: str | None = None
    line: int | None = None
    column: int | None = None

    def format(self) -> str:
        """Render as ``file:line:col: field: message`` (no field for a whole-file problem) plus an indented
        hint line."""
        is_option = bool(self.path) and str(self.path[0]).startswith("--")
        if self.file is None and is_option:  # a command-line option, not a place in a spec
            text = f"{format_path(self.path)}: {self.message}"
        else:
            where = self.file or "<spec>"
            if self.line is not None:
                where += f":{self.line}:{self.column or 1}"
            # A problem of the whole file (its size, its bytes, its YAML syntax) has no field to name.
            text = f"{where}: {format_path(self.path)}: {self.message}" if self.path else f"{where}: {self.message}"
        if self.hint:
            text += f"\n    hint: {self.hint}"
        return text


@dataclass
class SpecError(ValueError):
    """A spec (or a search space, or a CLI argument) is invalid.  Holds every problem found."""

    problems: list[Problem] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return "\n".join(p.format() for p in self.problems)

    @classmethod
    def single(cls, path: Path, message: str, hint: str | None = None, file: str | None = None,
               line: int | None = None, column: int | None = None) -> SpecError:
        """One-problem error."""
        return cls([Problem(tuple(path), message, hint, file, line, column)])

    def renamed(self, old: str, new: str) -> SpecError:
        """A copy that names the field ``new`` where this one names ``old``: the first part of a path, and the
        code-quoted name (`` `old` ``) in message and hint.  For a helper whose callers call one value by two names
        (:func:`archspec.search.load_table` reads the search's ``oracle``, ``import_table`` its ``table``)."""
        def rename(text: str | None) -> str | None:
            return None if text is None else text.replace(f"`{old}`", f"`{new}`")

        return SpecError([Problem((new, *p.path[1:]) if p.path and p.path[0] == old else p.path, rename(p.message),
                                  rename(p.hint), p.file, p.line, p.column) for p in self.problems])

    def with_options(self, options: Mapping[Path, str]) -> SpecError:
        """A copy for the command line: where a problem's path starts with a field path of ``options``
        (``("budgets", "macs")``), the option it maps to (``"--budget-flops"``) takes that part's place, and the
        field's name in the message and hint becomes the option, so the library names its fields and parameters
        and ``archspec.cli`` its flags.  Raises nothing.

        In the text a field is renamed where it is code-quoted only (`` `out` `` or `` `budgets.macs` ``, the
        quotes dropped): a bare name is left alone, as it may be an English word (``out``, ``data``) or a field
        of a file (a table sidecar's ``protocol.image_size``).  A problem of a YAML file (a place in a spec or a
        space) is left as it is: its path is a field of that document (a spec's ``seed``), not a parameter of the
        call; one of another file (a journal, a table's rows) is renamed."""
        def rename(text: str | None) -> str | None:
            if text is None:
                return None
            for known, option in options.items():
                name = re.escape(format_path(known))
                text = re.sub(rf"`{name}`", option, text)
            return text

        problems = []
        for p in self.problems:
            if (p.file or "").endswith((".yaml", ".yml")):
                problems.append(p)
                continue
            path = p.path
            for known, option in options.items():
                if tuple(path[:len(known)]) == tuple(known):
                    path = (option, *path[len(known):])
                    break
            problems.append(Problem(path, rename(p.message), rename(p.hint), p.file, p.line, p.column))
        return SpecError(problems)

    def located(self, locate: Locator | None) -> SpecError:
        """Return a copy whose problems have file/line/column filled from ``locate``."""
        if locate is None:
            return self
        return SpecError([locate.fill(p) for p in self.problems])


class TransferError(ValueError):
    """A model or spec that a weight transfer cannot carry out (CMHSA's construction, T-CNN's GPSA); the message
    says which layer and why.  Defined here, torch-free, so the families' modules and :mod:`archspec.transfer`
    raise the same class."""


class Locator:
    """Maps field paths of a parsed YAML document to (line, column), 1-based.

    Built by :func:`archspec.spec.yaml_source.load_yaml`.  A path that is not in the document (a default,
    or a derived value) is located at its deepest ancestor that is.
    """

    def __init__(self, file: str | None, positions: dict[Path, tuple[int, int]],
                 key_positions: dict[Path, tuple[int, int]]):
        self.file = file
        self.positions = positions
        self.key_positions = key_positions

    def position(self, path: Iterable[str | int], key: bool = False) -> tuple[int, int] | None:
        """Line and column of the value at ``path`` (of its key when ``key``), or of its closest ancestor."""
        path = tuple(path)
        if key and path in self.key_positions:
            return self.key_positions[path]
        while True:
            if path in self.positions:
                return self.positions[path]
            if not path:
                return None
            path = path[:-1]

    def fill(self, problem: Problem) -> Problem:
        """Fill file/line/column of ``problem`` from its path."""
        pos = self.position(problem.path, key=True)
        line, col = pos if pos else (None, None)
        return Problem(problem.path, problem.message, problem.hint,
                       problem.file or self.file, problem.line or line, problem.column or col)
