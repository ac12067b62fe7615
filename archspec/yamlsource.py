"""Safe YAML loading that remembers where every value came from.

Only YAML's safe subset is accepted (``yaml.SafeLoader``): tags such as ``!!python/object`` are
rejected, so a spec can never import or execute code.  Duplicate keys, which PyYAML silently
collapses, are reported.  The returned :class:`~archspec.errors.Locator` maps field paths to lines.
"""

from __future__ import annotations

from typing import Any

import yaml

from archspec.errors import Locator, Path, Problem, SpecError

MAX_SPEC_BYTES = 1_000_000  # a spec is a page of YAML; refuse anything that could be a data dump
MAX_NODES = 200_000  # YAML aliases can expand a small text exponentially ("billion laughs"); stop early


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _walk(node: yaml.Node, path: Path, positions: dict, key_positions: dict, problems: list[Problem]) -> None:
    if len(positions) > MAX_NODES:
        top = path[:1]  # the top-level entry that explodes; the deep path inside the expansion says nothing
        raise SpecError.single(top, f"the document expands to more than {MAX_NODES} values",
                               "avoid deeply nested YAML aliases", None, *key_positions.get(top, _mark(node)))
    positions[path] = _mark(node)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                line, col = _mark(key_node)
                problems.append(Problem(path + (key,), f"duplicate key {key!r} (first given on line {_mark(seen[key])[0]})",
                                        "remove one of the two entries", None, line, col))
            seen[key] = key_node
            key_positions[path + (key,)] = _mark(key_node)
            _walk(value_node, path + (key,), positions, key_positions, problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, path + (i,), positions, key_positions, problems)


def _yaml_error(exc: yaml.YAMLError, file: str | None) -> SpecError:
    """Turn a PyYAML error into a located :class:`SpecError`."""
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


def load_yaml(text: str, file: str | None = None) -> tuple[Any, Locator]:
    """Parse YAML ``text`` safely; return ``(data, locator)``.

    Raises:
        SpecError: syntax errors, unsafe tags, duplicate keys, an oversized document, or an empty one
            -- each with file, line and column.
    """
    if len(text.encode("utf-8", errors="replace")) > MAX_SPEC_BYTES:
        raise SpecError.single((), f"spec is larger than {MAX_SPEC_BYTES // 1000} kB", "a spec is a page of YAML", file)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file) from None

    if node is None:
        raise SpecError.single((), "the spec is empty", "start from one of `archspec list`", file, 1, 1)
    positions: dict[Path, tuple[int, int]] = {}
    key_positions: dict[Path, tuple[int, int]] = {}
    problems: list[Problem] = []
    try:
        _walk(node, (), positions, key_positions, problems)
    except SpecError as exc:
        raise SpecError([Problem(p.path, p.message, p.hint, file, p.line, p.column) for p in exc.problems]) from None
    # The node tree is now known to be small, so constructing Python objects from it is safe.
    try:
        data = yaml.SafeLoader(text).get_single_data()
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, file) from None
    locator = Locator(file, positions, key_positions)
    if problems:
        raise SpecError(problems).located(locator)
    return data, locator
