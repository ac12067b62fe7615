"""Safe YAML loading that remembers where every value came from.

Only YAML's safe subset is accepted (``yaml.SafeLoader``'s constructor): tags such as ``!!python/object`` are
rejected, so a spec can never import or execute code.  The text is parsed by libyaml where PyYAML has it
(``yaml.CSafeLoader``: the same safe constructor and resolver, about 10x faster) and by PyYAML's pure-Python
parser where it has not; a text the fast path refuses, or one holding what libyaml reads otherwise (a tab, a
``?``, a byte-order mark), is read by the pure-Python one, so what is accepted, what it reads as, and every
message (with its line and column) are the pure-Python parser's, whichever is installed.  Duplicate keys, which
PyYAML silently collapses, are reported.  The returned :class:`~archspec.errors.Locator` maps field paths to lines.

No input makes this module raise anything but :class:`~archspec.errors.SpecError` or hang: files are
checked to be regular and at most 1 MB before they are read, bytes must be UTF-8, nesting is capped
before PyYAML's recursive composer sees the text, and recursive aliases and non-scalar keys are
refused -- each with the file, line and column where it happens.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any

import yaml

from archspec.errors import Locator, Path, Problem, SpecError

__all__ = ["load_yaml", "read_text_file", "is_yaml_text", "MAX_SPEC_BYTES", "MAX_NODES", "MAX_NESTING"]

MAX_SPEC_BYTES = 1_000_000  # a spec is a page of YAML; refuse anything that could be a data dump
MAX_NODES = 200_000  # YAML aliases can expand a small text exponentially ("billion laughs"); stop early
MAX_NESTING = 100  # specs nest ~6 levels; PyYAML's composer recurses (~3 frames a level) and dies near 330


# libyaml's parser where PyYAML was built with it; the same safe constructor and resolver either way
_FAST_LOADER = getattr(yaml, "CSafeLoader", None)
# Where libyaml accepts what PyYAML's pure-Python scanner refuses (or reads otherwise): tabs as separators
# ("a:\tb"), "?" keys inside flow collections, a byte-order mark inside the text (found by comparing the two on
# 15,000 mutations of the shipped specs; none differed on a text without these).  Such a text takes the
# pure-Python path, so what is accepted and what is read stay PyYAML's.
_PURE_ONLY = ("\t", "\ufeff")
_QUESTION = "?"  # read by libyaml only where every "?" is inside a quoted scalar or a comment (_inert_question_marks)


def _mark(node: yaml.Node | yaml.Event) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


# ----------------------------------------------------------------------------------- files
def _line_col(text: str, index: int) -> tuple[int, int]:
    """1-based (line, column) of character ``index`` in ``text``."""
    line_start = text.rfind("\n", 0, index) + 1
    return text.count("\n", 0, index) + 1, index - line_start + 1


def _check_kind(st: os.stat_result, file: str, what: str) -> None:
    """Refuse anything but a regular file of at most :data:`MAX_SPEC_BYTES` (FIFOs and devices never end)."""
    if stat.S_ISDIR(st.st_mode):
        raise SpecError.single((), f"is a directory, not a {what} file", f"give the path of a YAML {what} file", file)
    if not stat.S_ISREG(st.st_mode):
        raise SpecError.single((), "is not a regular file (a FIFO, device or socket)",
                               f"give the path of a YAML {what} file", file)
    if st.st_size > MAX_SPEC_BYTES:
        raise SpecError.single((), f"the file is {st.st_size / 1e6:,.1f} MB; a {what} is at most "
                                   f"{MAX_SPEC_BYTES / 1e6:g} MB", f"is this really a YAML {what}?", file)


def _decode(data: bytes, file: str, what: str) -> str:
    """Strict UTF-8 decoding; the first bad byte is reported with its line and column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        column = len(data[line_start:exc.start].decode("utf-8", errors="replace")) + 1
        raise SpecError.single((), f"the file is not UTF-8 text: byte 0x{data[exc.start]:02x} cannot be decoded",
                               f"save the {what} as UTF-8 (is this really a YAML {what}?)", file, line,
                               column) from None


def read_text_file(path: str | os.PathLike, file: str | None = None, what: str = "spec") -> str:
    """Read a small UTF-8 text file (a spec or a search space) without ever blocking or reading much.

    Args:
        path: the file.
        file: the name to report in errors (default ``str(path)``).
        what: "spec" or "search space", for the messages.

    Returns:
        The text (at most :data:`MAX_SPEC_BYTES` bytes of UTF-8).

    Raises:
        SpecError: missing or unreadable file, a directory, a FIFO / device / socket, a file over
            1 MB (checked from ``stat`` before reading, and again while reading: a file can grow),
            bytes that are not UTF-8 (with line and column).
    """
    file = file if file is not None else str(path)
    try:
        st = os.stat(path)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        raise SpecError.single((), f"cannot read the file: {getattr(exc, 'strerror', None) or exc}", None,
                               file) from None
    _check_kind(st, file, what)
    try:
        # O_NONBLOCK: if the path was swapped for a FIFO after the stat, open returns at once and the
        # fstat below refuses it, instead of waiting forever for a writer.
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_BINARY", 0)
        fd = os.open(path, flags)
    except OSError as exc:
        raise SpecError.single((), f"cannot read the file: {exc.strerror or exc}", None, file) from None
    try:
        _check_kind(os.fstat(fd), file, what)
        chunks, size = [], 0
        while size <= MAX_SPEC_BYTES:
            chunk = os.read(fd, MAX_SPEC_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise SpecError.single((), f"cannot read the file: {exc.strerror or exc}", None, file) from None
    finally:
        os.close(fd)
    if size > MAX_SPEC_BYTES:
        raise SpecError.single((), f"the file is larger than {MAX_SPEC_BYTES / 1e6:g} MB",
                               f"a {what} is a page of YAML", file)
    return _decode(b"".join(chunks), file, what)


_YAML_START = ("{", "[", "---")
_MAPPING_COLON = re.compile(r":(\s|$)")


def is_yaml_text(source: str) -> bool:
    """Whether a string argument is YAML text rather than a path or a shipped name.

    The rule, in order: text containing a newline, or blank, is YAML; a string naming an existing
    file-system entry is a path; a string ending in ``.yaml`` / ``.yml`` is a path; a string starting
    with ``{``, ``[`` or ``---``, or holding ``key: value`` (a colon followed by a space or the end),
    is YAML; anything else is a path or a shipped name (``mait_tiny_sch2``, ``C:\\specs\\x.yaml``).
    """
    if "\n" in source or not source.strip():
        return True
    if os.path.lexists(os.path.expanduser(source)):  # False (not an error) for NUL bytes or too-long names
        return False
    if source.lower().endswith((".yaml", ".yml")):
        return False
    return source.lstrip().startswith(_YAML_START) or bool(_MAPPING_COLON.search(source))


# ----------------------------------------------------------------------------------- YAML
def _check_nesting(text: str, loader: type = yaml.SafeLoader) -> None:
    """Refuse nesting deeper than :data:`MAX_NESTING` from PyYAML's event stream.

    PyYAML's parser is a state machine (no recursion), its composer recurses per level: scanning the
    events first turns a 2 kB file of 1,000 nested brackets into a located error, not a RecursionError.
    """
    depth = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_NESTING:
                raise SpecError.single((), f"the document nests more than {MAX_NESTING} levels deep",
                                       "a spec nests a few levels; flatten it", None, *_mark(event))
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _too_big(path: Path, node: yaml.Node, key_positions: dict, message: str, hint: str) -> SpecError:
    top = path[:1]  # the top-level entry at fault; the deep path inside an alias expansion says nothing
    return SpecError.single(top, message, hint, None, *key_positions.get(top, _mark(node)))


def _walk(node: yaml.Node, path: Path, positions: dict, key_positions: dict, problems: list[Problem],
          ancestors: frozenset = frozenset()) -> None:
    """Record the position of every value; collect duplicate and non-scalar keys.

    Raises:
        SpecError: a recursive alias (a value containing itself), nesting through aliases deeper than
            :data:`MAX_NESTING`, or more than :data:`MAX_NODES` values.
    """
    if id(node) in ancestors:
        line, col = _mark(node)
        raise SpecError.single(path, f"recursive alias: the value anchored at line {line} contains itself",
                               "an alias (*name) may only refer to a value defined before it, not to its own "
                               "container", None, line, col)
    if len(path) > MAX_NESTING:
        raise _too_big(path, node, key_positions, f"the document nests more than {MAX_NESTING} levels deep "
                                                  "(through aliases)", "avoid chains of nested YAML aliases")
    if len(positions) > MAX_NODES:
        raise _too_big(path, node, key_positions, f"the document expands to more than {MAX_NODES} values",
                       "avoid deeply nested YAML aliases")
    positions[path] = _mark(node)
    if not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        return
    ancestors = ancestors | {id(node)}
    if isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, path + (i,), positions, key_positions, problems, ancestors)
        return
    seen: dict[Any, yaml.Node] = {}
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):  # `[1, 2]: 3` or `? {a: 1}`: unhashable in Python
            kind = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
            problems.append(Problem(path, f"keys must be plain names, not a {kind}",
                                    "write 'name: value'; a '[...]', '{...}' or '?' key is not allowed", None,
                                    *_mark(key_node)))
            continue
        key = key_node.value
        if key in seen:
            line, col = _mark(key_node)
            problems.append(Problem(path + (key,), f"duplicate key {key!r} (first given on line {_mark(seen[key])[0]})",
                                    "remove one of the two entries", None, line, col))
        seen[key] = key_node
        key_positions[path + (key,)] = _mark(key_node)
        _walk(value_node, path + (key,), positions, key_positions, problems, ancestors)


def _yaml_error(exc: yaml.YAMLError, file: str | None, text: str) -> SpecError:
    """Turn a PyYAML error into a located :class:`SpecError`."""
    if isinstance(exc, yaml.reader.ReaderError):  # a control character; PyYAML gives its index, not a line
        line, col = _line_col(text, exc.position) if isinstance(exc.position, int) else (None, None)
        char = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "?")
        return SpecError.single((), f"control character U+{char:04X} is not allowed in YAML text",
                                "remove it (is this really a YAML file?)", file, line, col)
    if not isinstance(exc, yaml.MarkedYAMLError):
        return SpecError.single((), f"invalid YAML: {exc}", None, file)
    mark = exc.problem_mark or exc.context_mark
    line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
    message = f"invalid YAML: {exc.problem or exc}"
    hint = "check indentation and that every 'key: value' has a space after the colon"
    if "could not determine a constructor" in str(exc):
        message = f"YAML tag not allowed: {exc.problem}"
        hint = "specs are plain data; tags such as !!python/object are refused"
    return SpecError.single((), message, hint, file, line, col)


def _with_file(exc: SpecError, file: str | None) -> SpecError:
    return SpecError([Problem(p.path, p.message, p.hint, p.file or file, p.line, p.column) for p in exc.problems])


def _compose(text: str, file: str | None) -> yaml.Node | None:
    """Nesting check, then PyYAML's composer; every failure becomes a located :class:`SpecError`."""
    try:
        _check_nesting(text)
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file, text) from None
    except SpecError as exc:
        raise _with_file(exc, file) from None
    except RecursionError:  # last resort: the nesting check should have stopped it
        raise SpecError.single((), "the document nests too deeply", "flatten it", file) from None


def _inert_question_marks(text: str) -> bool:
    """Whether every ``?`` in ``text`` is inside a quoted scalar or a comment, as libyaml's scanner reads it.

    Only a ``?`` that YAML may read as a key indicator (or inside a plain scalar, in flow context) is read
    otherwise by libyaml; one inside ``'...'`` / ``"..."`` or after a comment's ``#`` is a character of text to both
    scanners, whose token streams agree up to the first ``?`` that is not (the paper title "Can Vision
    Transformers Perform Convolution?" in the CMHSA specs; 5 of 33 shipped specs took the slow path for it).
    Raises ``yaml.YAMLError`` where libyaml cannot scan the text."""
    quoted, covered = [], []
    for token in yaml.scan(text, Loader=_FAST_LOADER):
        span = (token.start_mark.index, token.end_mark.index)
        covered.append(span)
        if isinstance(token, yaml.ScalarToken) and token.style in ("'", '"'):
            quoted.append(span)
    for index in (i for i, char in enumerate(text) if char == _QUESTION):
        if any(start <= index < end for start, end in quoted):
            continue
        if not _in_comment(text, index, covered):
            return False
    return True


def _in_comment(text: str, index: int, covered: list[tuple[int, int]]) -> bool:
    """Whether ``text[index]`` follows a ``#`` on its line that starts a comment: at the line's start or after a
    space or tab, and outside every token's span (a ``#`` inside a scalar is text)."""
    line_start = text.rfind("\n", 0, index) + 1
    for hash_index in (i for i in range(line_start, index) if text[i] == "#"):
        starts_comment = hash_index == line_start or text[hash_index - 1] in " \t"
        if starts_comment and not any(start <= hash_index < end for start, end in covered):
            return True
    return False


def _load_fast(text: str, file: str | None) -> tuple[Any, Locator] | None:
    """:func:`load_yaml` through libyaml: ``(data, locator)`` for a text it reads without a problem, ``None`` when
    libyaml is missing, the text holds what libyaml reads otherwise (:data:`_PURE_ONLY`, a ``?`` outside quotes
    and comments) or anything is wrong (the
    pure-Python path then reads the text again and says what).  The
    same checks in the same order: nesting from the event stream before composing, then the walk over the nodes
    (aliases, size, keys), then the safe constructor on the composed nodes."""
    if _FAST_LOADER is None or any(char in text for char in _PURE_ONLY):
        return None
    try:
        if _QUESTION in text and not _inert_question_marks(text):
            return None
        _check_nesting(text, _FAST_LOADER)
        node = yaml.compose(text, Loader=_FAST_LOADER)
        if node is None:
            return None
        positions: dict[Path, tuple[int, int]] = {}
        key_positions: dict[Path, tuple[int, int]] = {}
        problems: list[Problem] = []
        _walk(node, (), positions, key_positions, problems)
        if problems:
            return None
        return yaml.constructor.SafeConstructor().construct_document(node), Locator(file, positions, key_positions)
    except (yaml.YAMLError, SpecError, RecursionError):
        return None


def load_yaml(text: str, file: str | None = None) -> tuple[Any, Locator]:
    """Parse YAML ``text`` safely; return ``(data, locator)``.

    Raises:
        SpecError: syntax errors, control characters, unsafe tags, duplicate or non-scalar keys,
            nesting deeper than :data:`MAX_NESTING`, recursive aliases, an oversized document, or an
            empty one -- each with file, line and column where there is one.
    """
    if len(text) > MAX_SPEC_BYTES or len(text.encode("utf-8", errors="replace")) > MAX_SPEC_BYTES:
        raise SpecError.single((), f"spec is larger than {MAX_SPEC_BYTES // 1000} kB", "a spec is a page of YAML", file)
    fast = _load_fast(text, file)
    if fast is not None:
        return fast
    node = _compose(text, file)
    if node is None:
        raise SpecError.single((), "the spec is empty", "start from one of `archspec list`", file, 1, 1)
    positions: dict[Path, tuple[int, int]] = {}
    key_positions: dict[Path, tuple[int, int]] = {}
    problems: list[Problem] = []
    try:
        _walk(node, (), positions, key_positions, problems)
    except SpecError as exc:
        raise _with_file(exc, file) from None
    locator = Locator(file, positions, key_positions)
    if problems:  # before constructing: a non-scalar key cannot become a Python dict key
        raise SpecError(problems).located(locator)
    # The node tree is now known to be small, acyclic and shallow, so constructing Python objects is safe.
    try:
        data = yaml.SafeLoader(text).get_single_data()
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file, text) from None
    except RecursionError:
        raise SpecError.single((), "the document nests too deeply", "flatten it", file) from None
    return data, locator
