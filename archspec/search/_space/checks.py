"""The search-space language's markers and the structural check of a space document (at load time): what a
marker is (``choice``, ``int``, ``float``, ``ref``), where the markers sit, and :class:`Checker`, which collects
every located problem of the document's structure against the spec models.

The language itself is described in :mod:`archspec.search._space.language`.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import BaseModel

from archspec.errors import Problem
from archspec.spec import (
    ArchSpec,
    ConvBNActStageSpec,
    ConvStageSpec,
    MBConvStageSpec,
    MobileViTStageSpec,
    MV2StageSpec,
    StageSpec,
)

MARKERS = ("choice", "int", "float", "ref")
#: a conv stage's ``block`` -> its stage model where it is not ResNet's
CONV_STAGE_MODELS = {"mbconv": MBConvStageSpec, "mv2": MV2StageSpec, "mobilevit": MobileViTStageSpec,
                     "conv_bn_act": ConvBNActStageSpec}
_MARKER_OPTIONS = {"choice": {"share"}, "ref": set(), "int": {"step", "log"}, "float": {"step", "log"}}
SPACE_KEYS = ("name", "kind", "description", "protocol", "spec")
_HEADS_MIX_KEYS = ("base", "masked", "window", "group", "per_layer")
SPACE_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_Scalar = (str, int, float, bool, type(None))


def is_marker(node: Any) -> bool:
    return isinstance(node, dict) and any(k in node for k in MARKERS)


def marker_kind(node: dict) -> str:
    return next(k for k in MARKERS if k in node)


def alternative_name(node: dict, pname: str, label: str) -> str:
    """The Optuna name prefix inside alternative ``label`` of the labelled choice ``node`` named ``pname``: the
    label appended, or with ``share: true`` the choice's own name (shared across alternatives)."""
    return pname if node.get("share") is True else f"{pname}.{label}"


def _marker_paths(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, tuple, dict]]:
    """``(name path, document path, marker)`` of every marker below ``node`` (not inside ranges): the name path is
    the document path without ``choice`` / ``items`` steps -- the part of an Optuna name the document decides."""
    if is_marker(node):
        yield path, path, node
        kind = marker_kind(node)
        if kind == "choice" and isinstance(node["choice"], dict):
            for label, option in node["choice"].items():
                shared = node.get("share") is True
                for name, where, inner in _marker_paths(option, ()):
                    yield (path + name if shared else path + (label,) + name), path + ("choice", label) + where, inner
    elif isinstance(node, dict):
        for key, item in node.items():
            step = () if key == "items" else (key,)
            for name, where, inner in _marker_paths(item, ()):
                yield path + step + name, path + (key,) + where, inner
    elif isinstance(node, list):
        for i, item in enumerate(node):
            for name, where, inner in _marker_paths(item, ()):
                yield path + (i,) + name, path + (i,) + where, inner


def _distribution_of(marker: dict) -> str:
    """What Optuna requires to be equal for one parameter name across trials, in words: the kind, a choice's
    options, and a range's ``log``."""
    kind = marker_kind(marker)
    if kind == "choice":
        options = marker["choice"]
        return f"a choice of {', '.join(map(str, options)) if isinstance(options, dict) else options!r}"
    if kind in ("int", "float"):
        return f"{'a log' if marker.get('log') else 'an' if kind == 'int' else 'a'} {kind} range"
    return f"a {kind}"


# ---------------------------------------------------------------------------------------------
# Structural validation (load time)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """Pydantic model classes inside a field annotation (through Optional, list, Annotated, Union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out.extend(_models_in(arg))
    return out


def _field_model(model: type[BaseModel], key: str, node: Any) -> type[BaseModel] | None:
    models = _models_in(model.model_fields[key].annotation)
    if len(models) == 1:
        return models[0]
    if models and isinstance(node, dict) and isinstance(node.get("kind"), str):  # discriminated union (stem)
        for m in models:
            if "kind" in m.model_fields and m.model_fields["kind"].default == node["kind"]:
                return m
    return None


class Checker:
    """Collects located problems of a space document's structure."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, path: tuple, message: str, hint: str | None = None) -> None:
        self.problems.append(Problem(path, message, hint))

    def unknown(self, path: tuple, key: Any, allowed: Sequence[str]) -> None:
        close = difflib.get_close_matches(str(key), list(allowed) + list(MARKERS), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"allowed here: {', '.join(sorted(allowed))}"
        self.add(path + (key,), f"unknown key {key!r}", hint)

    # markers -------------------------------------------------------------------------------
    def marker(self, node: dict, path: tuple, model: type[BaseModel] | None, alt: Any = None) -> None:
        present = [k for k in MARKERS if k in node]
        if len(present) > 1:
            self.add(path, f"a marker has exactly one of {', '.join(MARKERS)}; got {', '.join(present)}")
            return
        kind = present[0]
        for key in node:
            if key != kind and key not in _MARKER_OPTIONS[kind]:
                opts = _MARKER_OPTIONS[kind]
                self.add(path + (key,), f"unknown option {key!r} of a {kind!r} marker",
                         f"{kind} takes {', '.join(sorted(opts))}" if opts else f"a {kind!r} marker takes no options")
        value = node[kind]
        where = path + (kind,)
        if kind == "choice" and "share" in node:
            self.shared_choice(node, path)
        if kind == "choice":
            if isinstance(value, list):
                if not value:
                    self.add(where, "empty choice", "list at least one value")
                for i, option in enumerate(value):
                    if not isinstance(option, _Scalar):
                        self.add(where + (i,), "list choices must be scalars (numbers, strings, booleans, null)",
                                 "for structured alternatives use a mapping: {choice: {label: value, ...}}")
                seen = [repr(v) for v in value]
                if len(set(seen)) != len(seen):
                    self.add(where, "duplicate values in a choice")
            elif isinstance(value, dict):
                if not value:
                    self.add(where, "empty choice", "list at least one alternative")
                for label, option in value.items():
                    if not isinstance(label, str) or not SPACE_NAME_RE.match(label):
                        self.add(where + (label,),
                                 f"alternative label {label!r} must be a word (letters, digits, _ . -)")
                    if alt is not None:
                        alt(option, where + (label,))
                    else:
                        self.value(option, where + (label,), model)
            else:
                self.add(where, f"choice takes a list of values or a mapping of labelled alternatives, got {value!r}")
        elif kind in ("int", "float"):
            if not isinstance(value, list) or len(value) != 2:
                self.add(where, f"{kind} takes [low, high], got {value!r}", f"e.g. {{{kind}: [1, 4]}}")
                return
            numbers = []
            for i, end in enumerate(value):
                if is_marker(end):
                    if marker_kind(end) != "ref":
                        self.add(where + (i,), "range ends may be numbers or {ref: path}")
                    else:
                        self.marker(end, where + (i,), None)
                elif (isinstance(end, bool) or not isinstance(end, (int, float))
                      or (kind == "int" and not isinstance(end, int))):
                    self.add(where + (i,),
                             f"range end must be {'an integer' if kind == 'int' else 'a number'}, got {end!r}")
                else:
                    numbers.append(end)
            if len(numbers) == 2 and numbers[0] > numbers[1]:
                self.add(where, f"empty range: low {numbers[0]} > high {numbers[1]}")
            step, log = node.get("step"), node.get("log", False)
            if not isinstance(log, bool):
                self.add(path + ("log",), f"log must be true or false, got {log!r}")
            if step is not None:
                if (isinstance(step, bool) or not isinstance(step, (int, float)) or step <= 0
                        or (kind == "int" and not isinstance(step, int))):
                    self.add(path + ("step",),
                             f"step must be a positive {'integer' if kind == 'int' else 'number'}, got {step!r}")
                elif log is True and not (kind == "int" and step == 1):
                    self.add(path + ("step",), "log ranges take no step")
            if log is True and numbers and min(numbers) <= 0:
                self.add(where, "a log range needs low > 0")
        else:  # ref
            if not isinstance(value, str) or not value.strip():
                self.add(where, f"ref takes a dotted path such as stages.0.dim or stage.key_dim, got {value!r}")

    def shared_choice(self, node: dict, path: tuple) -> None:
        """``share: true`` on a labelled choice: alternatives that are mappings or lists, and one distribution per
        shared parameter name (Optuna's rule), checked across the alternatives."""
        share, options = node["share"], node["choice"]
        if not isinstance(share, bool):
            self.add(path + ("share",), f"share must be true or false, got {share!r}")
            return
        if not share:
            return
        if not isinstance(options, dict):
            self.add(path + ("share",), "share needs labelled alternatives: {choice: {label: value, ...}, share: true}")
            return
        seen: dict[tuple, tuple[str, str]] = {}
        for label, option in options.items():
            if not isinstance(option, (dict, list)) or is_marker(option):
                self.add(path + ("choice", label), "the alternatives of a shared choice must be mappings or lists",
                         "their markers are the shared parameters; drop 'share' to choose between bare values")
                continue
            for name, where, marker in _marker_paths(option):
                got = _distribution_of(marker)
                first = seen.setdefault(name, (label, got))
                if first[1] != got:
                    self.add(path + ("choice", label) + where,
                             f"shared parameter {'.'.join(map(str, name))!r} differs between alternatives "
                             f"{first[0]!r} and {label!r}: {first[1]} against {got}",
                             "give it the same kind and options in every alternative, or drop 'share'")

    # spec values ---------------------------------------------------------------------------
    def value(self, node: Any, path: tuple, model: type[BaseModel] | None) -> None:
        if is_marker(node):
            self.marker(node, path, model)
        elif isinstance(node, dict):
            if model is None:
                for key, item in node.items():
                    self.value(item, path + (key,), None)
                return
            extra = ("heads_mix", "kind") if model is StageSpec else ()
            for key, item in node.items():
                if key == "kind" and model is StageSpec:
                    continue  # 'kind: attention' names the default; stage() has checked it
                if key in extra:
                    self.heads_mix(item, path + (key,))
                elif key not in model.model_fields:
                    self.unknown(path, key, list(model.model_fields) + list(extra))
                elif model is ArchSpec and key == "stages":
                    self.stages(item, path + (key,))
                else:
                    self.value(item, path + (key,), _field_model(model, key, item))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                self.value(item, path + (i,), model)

    def stages(self, node: Any, path: tuple) -> None:
        if is_marker(node):
            if marker_kind(node) != "choice" or not isinstance(node["choice"], dict):
                self.add(path, "stages may be a list, {count: ..., items: [...]} or a labelled choice of those",
                         "stages: {choice: {two: [{...}, {...}], three: [{...}, {...}, {...}]}}")
                return
            self.marker(node, path, None, alt=self.stages)
        elif isinstance(node, dict):
            for key in node:
                if key not in ("count", "items"):
                    self.unknown(path, key, ["count", "items"])
            items = node.get("items")
            if not isinstance(items, list) or not items:
                self.add(path + ("items",), "stages.items must be a non-empty list of stages",
                         "stages: {count: {choice: [2, 3]}, items: [{...}, {...}, {...}]}")
                items = []
            if "count" not in node:
                self.add(path, "missing required key 'count'",
                         "add 'count: {choice: [...]}' or use a plain list of stages")
            else:
                count = node["count"]
                if is_marker(count):
                    self.marker(count, path + ("count",), None)
                elif isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= max(len(items), 1):
                    self.add(path + ("count",), f"count must be an integer between 1 and {len(items)}, got {count!r}")
            for i, item in enumerate(items):
                self.stage(item, path + ("items", i))
        elif isinstance(node, list):
            if not node:
                self.add(path, "stages must be a non-empty list of stages")
            for i, item in enumerate(node):
                self.stage(item, path + (i,))
        else:
            self.add(path, "stages must be a list of stages, {count: ..., items: [...]} or a labelled choice of those")

    def stage(self, node: Any, path: tuple) -> None:
        """One stage: its ``kind`` (absent or ``attention``, or ``conv``) picks the model its keys are checked
        against."""
        if not isinstance(node, dict) or is_marker(node):
            self.add(path, "a stage must be a mapping of its fields",
                     "to choose between stages, choose between whole stage lists: stages: {choice: {label: [...]}}")
            return
        kind = node.get("kind", "attention")
        if kind not in ("attention", "conv"):
            hint = ("a stage's kind cannot be searched; choose between whole stage lists instead"
                    if is_marker(kind) else "'attention' (the default) or 'conv'")
            self.add(path + ("kind",), f"a stage's kind must be 'attention' or 'conv', got {kind!r}", hint)
            return
        self.value(node, path, StageSpec if kind != "conv" else CONV_STAGE_MODELS.get(node.get("block"), ConvStageSpec))

    def heads_mix(self, node: Any, path: tuple) -> None:
        if isinstance(node, str):
            return
        if is_marker(node):
            self.marker(node, path, None, alt=self.heads_mix_body)
            return
        self.heads_mix_body(node, path)

    def heads_mix_body(self, node: Any, path: tuple) -> None:
        if isinstance(node, str):
            return
        if not isinstance(node, dict):
            self.add(path, f"heads_mix must be a head kind or a mapping with 'base', got {node!r}")
            return
        for key, item in node.items():
            if key not in _HEADS_MIX_KEYS:
                self.unknown(path, key, _HEADS_MIX_KEYS)
            elif is_marker(item):
                self.marker(item, path + (key,), None)
        if "base" not in node:
            self.add(path, "missing required key 'base'", "the head kind of the unmasked heads, e.g. base: levit_bias")
