"""Search spaces: an architecture spec in which any value may be a choice or a range.

A space is a YAML document with four top-level keys::

    name: levit_family          # letters, digits, '_', '.', '-'
    kind: design                # 'design' (architecture search) or 'masks' (MaiT mask placement)
    description: free text      # optional
    spec:                       # an archspec spec (see archspec.spec) whose values may be markers

Markers -- a mapping with exactly one of these keys replaces any value of the spec:

``{choice: [a, b, c]}``
    Categorical over scalars (numbers, strings, booleans, null).
``{choice: {label_a: value_a, label_b: value_b}}``
    Categorical over *named alternatives*; Optuna sees the label, the value (a scalar, a mapping or a
    list) may itself contain markers.  Parameters inside an alternative exist only when it is drawn
    (conditional parameters) and carry its label in their name.
``{choice: {label_a: ..., label_b: ...}, share: true}``
    The same, but the parameters inside the alternatives are named *without* the label, so alternatives
    that ask the same question share one Optuna parameter and a model-based sampler (TPE, GP) pools what it
    learns across them: ``stages.0.depth`` for both widths of a stage list, instead of
    ``stages.narrow.0.depth`` and ``stages.wide.0.depth``.  Optuna allows one distribution per name, so
    alternatives that place a marker at the same path must give it the same kind and, for a choice, the same
    options (checked when the space is loaded); the alternatives must be mappings or lists.  Why: on the
    tabulated ``levit_small`` space, multivariate TPE split by the width label fitted each half on half the
    trials and did not beat random sampling; see ``docs/search-works.md``.
``{int: [low, high], step: 1, log: false}``
    Integer range, both ends inclusive.  ``low``/``high`` may be ``{ref: ...}``.
``{float: [low, high], step: null, log: false}``
    Float range (``log: true`` needs ``low > 0``).
``{ref: path}``
    A copy of a value sampled *earlier in the document*: ``stages.0.dim`` (absolute, in the
    resulting spec) or ``stage.key_dim`` (the enclosing stage).  Used to tie derived values.

Structure that a plain spec cannot say:

``stages: {count: <int or marker>, items: [stage, stage, ...]}``
    Only the first ``count`` items are used; parameters of the other items are not drawn.
    A plain list of stages is also accepted.
``stages: {choice: {label_a: [stage, ...], label_b: {count: ..., items: [...]}}}``
    A labelled choice over *whole stage lists* (each alternative a list or ``{count, items}``): how many
    stages of which kind, e.g. LeViT's grafting -- 1, 2 or 3 ResNet-50 stages, then a DeiT stage.  Optuna
    sees the label as parameter ``stages``; the markers inside an alternative are named with its label
    (``stages.r50s2.2.depth``), so alternatives whose stage ``i`` differs never share a parameter.
``stages[i]`` of ``kind: conv``
    A conv stage (ResNet blocks after a ``resnet`` stem: ``block``, ``depth``, ``channels``, ``stride``...,
    :class:`~archspec.spec.ConvStageSpec`); its values may be markers like any other.  The first attention
    stage after conv stages takes ``from_map`` (how the map becomes tokens).  A stage's ``kind`` itself
    cannot be a marker: choose between stage lists instead.
``stages[i].heads_mix``
    How the heads of a stage are composed; expands into the stage's ``attention`` and ``layers``.
    Either a head kind (``levit_bias``) or a mapping::

        base: levit_bias          # head kind of every head (any archspec head kind, or 'keep': the heads
                                  # the stage already has, masks removed -- used by mask placement)
        masked: {int: [0, 2]}     # how many heads (heads 0..m-1) get a hard MaiT mask on top of the base
        window: {choice: [3x3, 5x5]}   # window of those masks (drawn only when masked > 0)
        group: 4                  # draw masked and window per group of this many layers (default: whole stage)
        per_layer: true           # draw masked per layer, and one window for the stage

    A ``{choice: {...}}`` over such mappings picks the kind per stage.  GPSA bases on a head count
    that is not a perfect square get the convolutional init on the first floor(sqrt(H))^2 heads only
    (ConViT / timm), so every head count is valid.

Optuna parameter names are the paths of the markers in the resulting spec: ``stages.count``,
``stages.1.dim``, ``stages.0.heads_mix`` (the drawn label), ``stages.0.heads_mix.mait.masked``,
``stages.0.heads_mix.masked.4-7`` (group of layers 4-7), ``stages`` and ``stages.r50s2.2.depth`` (a
labelled choice of stage lists and a range inside its ``r50s2`` alternative; ``stages.2.depth`` with
``share: true``).  Every sampled point is validated with
:func:`archspec.load_spec`; a point that fails raises a :class:`~archspec.errors.SpecError` located
at the offending field of the *space* file.

Example::

    name: tiny
    kind: design
    spec:
      stem: {kind: conv}
      tokens: {cls_token: none, pos_embed: none}
      stages:
        count: {choice: [1, 2]}
        items:
          - {depth: {int: [1, 3]}, dim: {choice: [64, 128]}, heads: 4, key_dim: 16, norm: batchnorm,
             heads_mix: {choice: {bias: levit_bias, mait: {base: levit_bias, masked: {int: [1, 4]}}}}}
          - {depth: 2, dim: 192, heads: 6, key_dim: 16, norm: batchnorm, attention: levit_bias,
             shrink: {key_dim: {ref: stage.key_dim}}}
      head: {pool: mean, num_classes: 10}
"""

from __future__ import annotations

import difflib
import math
import os
import re
import typing
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from archspec.errors import Locator, Problem, SpecError
from archspec.families.attention.heads import HeadSpec, MaskSpec
from archspec.ir.graph import build_graph
from archspec.ir.loader import load_spec
from archspec.search import DEFAULT_SPACE, SPACES_DIR
from archspec.spec import ArchSpec, ConvStageSpec, StageSpec
from archspec.spec.yaml_source import is_yaml_text, load_yaml, read_text_file

__all__ = ["SearchSpace", "load_space", "mask_placement_space", "MARKERS"]

MARKERS = ("choice", "int", "float", "ref")
_MARKER_OPTIONS = {"choice": {"share"}, "ref": set(), "int": {"step", "log"}, "float": {"step", "log"}}
_SPACE_KEYS = ("name", "kind", "description", "spec")
_HEADS_MIX_KEYS = ("base", "masked", "window", "group", "per_layer")
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_Scalar = (str, int, float, bool, type(None))


def _is_marker(node: Any) -> bool:
    return isinstance(node, dict) and any(k in node for k in MARKERS)


def _marker_kind(node: dict) -> str:
    return next(k for k in MARKERS if k in node)


def _alternative_name(node: dict, pname: str, label: str) -> str:
    """The Optuna name prefix inside alternative ``label`` of the labelled choice ``node`` named ``pname``: the
    label appended, or with ``share: true`` the choice's own name (shared across alternatives)."""
    return pname if node.get("share") is True else f"{pname}.{label}"


def _marker_paths(node: Any, path: tuple = ()) -> Iterator[tuple[tuple, tuple, dict]]:
    """``(name path, document path, marker)`` of every marker below ``node`` (not inside ranges): the name path is
    the document path without ``choice`` / ``items`` steps -- the part of an Optuna name the document decides."""
    if _is_marker(node):
        yield path, path, node
        kind = _marker_kind(node)
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
    kind = _marker_kind(marker)
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


class _Checker:
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
                    if not isinstance(label, str) or not _NAME_RE.match(label):
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
                if _is_marker(end):
                    if _marker_kind(end) != "ref":
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
            if not isinstance(option, (dict, list)) or _is_marker(option):
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
        if _is_marker(node):
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
        if _is_marker(node):
            if _marker_kind(node) != "choice" or not isinstance(node["choice"], dict):
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
                if _is_marker(count):
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
        if not isinstance(node, dict) or _is_marker(node):
            self.add(path, "a stage must be a mapping of its fields",
                     "to choose between stages, choose between whole stage lists: stages: {choice: {label: [...]}}")
            return
        kind = node.get("kind", "attention")
        if kind not in ("attention", "conv"):
            hint = ("a stage's kind cannot be searched; choose between whole stage lists instead"
                    if _is_marker(kind) else "'attention' (the default) or 'conv'")
            self.add(path + ("kind",), f"a stage's kind must be 'attention' or 'conv', got {kind!r}", hint)
            return
        self.value(node, path, ConvStageSpec if kind == "conv" else StageSpec)

    def heads_mix(self, node: Any, path: tuple) -> None:
        if isinstance(node, str):
            return
        if _is_marker(node):
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
            elif _is_marker(item):
                self.marker(item, path + (key,), None)
        if "base" not in node:
            self.add(path, "missing required key 'base'", "the head kind of the unmasked heads, e.g. base: levit_bias")


# ---------------------------------------------------------------------------------------------
# Sampling


class _MinTrial:
    """Duck-typed trial: the smallest value of every numeric choice, the first of any other."""

    number = -1

    def __init__(self) -> None:
        self.params: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        numeric = [c for c in choices if isinstance(c, (int, float)) and not isinstance(c, bool)]
        value = min(numeric) if len(numeric) == len(choices) else choices[0]
        self.params[name] = value
        return value

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        self.params[name] = low
        return low

    def suggest_float(self, name: str, low: float, high: float, step: float | None = None, log: bool = False) -> float:
        self.params[name] = low
        return low


class _Sampler:
    """Resolves a space document into a concrete spec dict for one trial (in document order)."""

    def __init__(self, trial: Any):
        self.trial = trial
        self.done: dict[tuple, Any] = {}      # concrete spec path -> resolved value
        self.origin: dict[tuple, tuple] = {}  # concrete spec path -> space document path
        self.drawn: dict[str, Any] = {}
        self._ypath_for_name: tuple = ()
        self.generated: dict[tuple, tuple[tuple, tuple]] = {}  # fields written by heads_mix -> (its path, window path)
        self.prefix = "stages"  # Optuna names of stage parameters: stages.<i>..., or stages.<label>.<i>...

    def fail(self, path: tuple, message: str, hint: str | None = None) -> SpecError:
        return SpecError.single(path, message, hint)

    # helpers -------------------------------------------------------------------------------
    def lookup(self, ref: str, ypath: tuple, stage: int | None) -> Any:
        parts: list[str | int] = [int(p) if p.isdigit() else p for p in ref.strip().split(".")]
        if parts and parts[0] == "stage":
            if stage is None:
                raise self.fail(ypath, f"ref {ref!r}: 'stage.' refs are only allowed inside a stage")
            parts = ["stages", stage] + parts[1:]
        key = tuple(parts)
        if key not in self.done:
            raise self.fail(ypath, f"ref {ref!r} names no value sampled before it",
                            "refs may only name fields that come earlier in the document and exist in this "
                            "point (not a stage that was not drawn)")
        return self.done[key]

    def suggest(self, kind: str, name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            value = getattr(self.trial, f"suggest_{kind}")(name, *args, **kwargs)
        except ValueError as exc:  # optuna's own checks (incompatible distributions, bad ranges)
            raise self.fail(self._ypath_for_name, f"cannot draw parameter {name!r}: {exc}") from None
        self.drawn[name] = value
        return value

    def resolve(self, node: Any, ypath: tuple, cpath: tuple, pname: str, stage: int | None) -> Any:
        if _is_marker(node):
            value = self.marker(node, ypath, cpath, pname, stage)
        elif isinstance(node, dict):
            value = {}
            for key, item in node.items():
                value[key] = self.resolve(item, ypath + (key,), cpath + (key,),
                                          f"{pname}.{key}" if pname else str(key), stage)
        elif isinstance(node, list):
            value = [self.resolve(item, ypath + (i,), cpath + (i,), f"{pname}.{i}", stage)
                     for i, item in enumerate(node)]
        else:
            value = node
        self.done[cpath] = value
        self.origin[cpath] = ypath
        return value

    def marker(self, node: dict, ypath: tuple, cpath: tuple, pname: str, stage: int | None) -> Any:
        kind = _marker_kind(node)
        self._ypath_for_name = ypath
        if kind == "ref":
            return self.lookup(node["ref"], ypath + ("ref",), stage)
        if kind == "choice":
            options = node["choice"]
            if isinstance(options, list):
                return self.suggest("categorical", pname, list(options))
            label = self.suggest("categorical", pname, list(options))
            return self.resolve(options[label], ypath + ("choice", label), cpath,
                                _alternative_name(node, pname, label), stage)
        ends = []
        for i, end in enumerate(node[kind]):
            ends.append(self.lookup(end["ref"], ypath + (kind, i, "ref"), stage) if _is_marker(end) else end)
        low, high = ends
        if kind == "int":
            if not all(isinstance(e, int) and not isinstance(e, bool) for e in ends):
                raise self.fail(ypath + (kind,), f"integer range ends resolved to {ends}")
            if low > high:
                raise self.fail(ypath + (kind,), f"empty range: low {low} > high {high} in this point")
            return self.suggest("int", pname, low, high, step=node.get("step") or 1, log=bool(node.get("log", False)))
        if low > high:
            raise self.fail(ypath + (kind,), f"empty range: low {low} > high {high} in this point")
        return self.suggest("float", pname, float(low), float(high), step=node.get("step"),
                            log=bool(node.get("log", False)))

    # document ------------------------------------------------------------------------------
    def document(self, spec_node: dict) -> dict:
        out: dict[str, Any] = {}
        for key, item in spec_node.items():
            if key == "stages":
                out[key] = self.stages(item)
            else:
                out[key] = self.resolve(item, ("spec", key), (key,), key, None)
        return out

    def stages(self, node: Any, base: tuple = ("spec", "stages"), prefix: str = "stages") -> list:
        """The drawn stage list of ``node`` (at space path ``base``; Optuna names start with ``prefix``)."""
        if _is_marker(node):  # a labelled choice of stage lists (the checker allows no other marker here)
            self._ypath_for_name = base
            label = self.suggest("categorical", prefix, list(node["choice"]))
            return self.stages(node["choice"][label], base + ("choice", label), _alternative_name(node, prefix, label))
        self.prefix = prefix
        if isinstance(node, dict):
            items = node["items"]
            count = self.resolve(node["count"], base + ("count",), ("stages", "count"), f"{prefix}.count", None)
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= len(items):
                raise self.fail(base + ("count",), f"count {count!r} is not between 1 and {len(items)}")
            indexed = [(base + ("items", i), item) for i, item in enumerate(items[:count])]
        else:
            indexed = [(base + (i,), item) for i, item in enumerate(node)]
        out = []
        for i, (ypath, item) in enumerate(indexed):
            self.origin[("stages", i)] = ypath
            stage: dict[str, Any] = {}
            mix = None
            for key, value in item.items():
                if key == "heads_mix":
                    mix = value
                    continue
                stage[key] = self.resolve(value, ypath + (key,), ("stages", i, key), f"{prefix}.{i}.{key}", i)
            if mix is not None:
                self.heads_mix(stage, mix, ypath + ("heads_mix",), i)
            out.append(stage)
        return out

    def heads_mix(self, stage: dict, node: Any, ypath: tuple, i: int) -> None:
        """Resolve stage ``i``'s ``heads_mix`` (a base head kind and how many heads per layer group get a mask) into
        the stage's ``attention`` and per-layer ``layers`` overrides, in place; same Optuna names, same order."""
        node, ypath, pname = self._mix_choice(node, ypath, f"{self.prefix}.{i}.heads_mix")
        body = {"base": node} if isinstance(node, str) else dict(node)
        base = self.resolve(body["base"], ypath + ("base",), ("stages", i, "heads_mix", "base"), f"{pname}.base", i)
        if not isinstance(stage.get("heads"), int) or not isinstance(stage.get("depth"), int):
            raise self.fail(ypath, "heads_mix needs the stage's 'heads' and 'depth' as integers")
        keep = base == "keep"
        if not keep and ("attention" in stage or "layers" in stage):
            raise self.fail(ypath, "heads_mix sets the stage's attention and layers; remove them from the stage",
                            "or use base: keep to mask the heads the stage already has")
        layer_heads, default = self._mix_base_heads(stage, base, keep, ypath)
        self._mix_masks(layer_heads, body, stage["heads"], ypath, pname, i)
        if keep:  # the stage's default head stays; only layers that differ from it get an override
            default = HeadSpec.model_validate(stage["attention"]) if stage.get("attention") is not None else HeadSpec()
        stage["attention"] = default.model_dump(mode="json", exclude_none=True)
        overrides = _layer_overrides(layer_heads, default)
        if overrides:
            stage["layers"] = overrides
        else:
            stage.pop("layers", None)
        target = ypath + ("window",) if isinstance(node, dict) and "window" in node else ypath
        self.generated[("stages", i, "attention")] = (ypath, target)
        self.generated[("stages", i, "layers")] = (ypath, target)

    def _mix_choice(self, node: Any, ypath: tuple, pname: str) -> tuple[Any, tuple, str]:
        """A ``{choice: ...}`` heads_mix picks one option (a categorical named ``pname``): ``(node, ypath, pname)``
        of the option."""
        if _is_marker(node) and _marker_kind(node) == "choice":
            options = node["choice"]
            self._ypath_for_name = ypath
            label = self.suggest("categorical", pname, list(options))
            if isinstance(options, dict):
                return options[label], ypath + ("choice", label), _alternative_name(node, pname, label)
            return label, ypath, pname
        if _is_marker(node):
            raise self.fail(ypath, "heads_mix takes a head kind, a mapping or a {choice: ...} of those")
        return node, ypath, pname

    def _mix_base_heads(self, stage: dict, base: Any, keep: bool,
                        ypath: tuple) -> tuple[list[list[HeadSpec]], HeadSpec | None]:
        """Every layer's heads before masking, and the base head (``None`` for ``base: keep``: the stage's own heads,
        masks removed).  ConViT / timm give the conv init to only ``floor(sqrt(H))^2`` GPSA heads."""
        n_heads, depth = stage["heads"], stage["depth"]
        if keep:
            try:
                layer_heads = [list(p.heads) for p in ArchSpec(stages=[StageSpec.model_validate(stage)]).layer_plans(0)]
            except ValidationError as exc:
                raise self.fail(ypath,
                                f"cannot resolve the stage's heads for base: keep: {exc.errors()[0]['msg']}") from None
            return [[h.model_copy(update={"mask": None}) for h in heads] for heads in layer_heads], None
        try:
            head = HeadSpec.model_validate(base)
        except ValidationError as exc:
            raise self.fail(ypath + ("base",), f"invalid head kind {base!r}: {exc.errors()[0]['msg']}") from None
        heads = [head] * n_heads
        if head.gpsa is not None and head.gpsa.conv_init and math.isqrt(n_heads) ** 2 != n_heads:
            square = math.isqrt(n_heads) ** 2
            plain = head.model_copy(update={"gpsa": head.gpsa.model_copy(update={"conv_init": False})})
            heads = [head] * square + [plain] * (n_heads - square)
        return [list(heads) for _ in range(depth)], head

    def _mix_masks(self, layer_heads: list[list[HeadSpec]], body: dict, n_heads: int, ypath: tuple, pname: str,
                   i: int) -> None:
        """Mask the first ``masked`` heads of each layer group (``group`` layers; ``per_layer: true``: one layer each
        with one window for the stage), in place."""
        depth = len(layer_heads)
        window_once = body.get("per_layer") is True
        stage_window: Any = None
        group = 1 if window_once else body.get("group") or depth
        if isinstance(group, bool) or not isinstance(group, int) or group < 1:
            raise self.fail(ypath + ("group",), f"group must be a positive integer, got {group!r}")
        for start in range(0, depth, group):
            end = min(start + group, depth) - 1
            suffix = "" if group >= depth else (f".{start}" if start == end else f".{start}-{end}")
            cp = ("stages", i, "heads_mix", f"masked{suffix}")
            masked = self.resolve(body.get("masked", 0), ypath + ("masked",), cp, f"{pname}.masked{suffix}", i)
            if isinstance(masked, bool) or not isinstance(masked, int) or not 0 <= masked <= n_heads:
                raise self.fail(ypath + ("masked",), f"masked heads must be an integer between 0 and the stage's "
                                f"{n_heads} heads, got {masked!r}", "bound it with {int: [0, {ref: stage.heads}]}")
            if masked == 0:
                continue
            if not (window_once and stage_window is not None):
                wsuffix = "" if window_once else suffix
                stage_window = self.resolve(body.get("window", "3x3"), ypath + ("window",),
                                            ("stages", i, "heads_mix", f"window{wsuffix}"), f"{pname}.window{wsuffix}",
                                            i)
            try:
                mask = MaskSpec(window=stage_window)
            except ValidationError as exc:
                raise self.fail(ypath + ("window",),
                                f"invalid window {stage_window!r}: {exc.errors()[0]['msg']}") from None
            for layer in range(start, end + 1):
                for h in range(masked):
                    layer_heads[layer][h] = layer_heads[layer][h].model_copy(update={"mask": mask})


def _layer_overrides(layer_heads: list[list[HeadSpec]], default: HeadSpec) -> list[dict]:
    """``layers:`` overrides for runs of equal consecutive layers whose heads differ from ``default``."""
    overrides = []
    layer, depth = 0, len(layer_heads)
    while layer < depth:
        end = layer
        while end + 1 < depth and layer_heads[end + 1] == layer_heads[layer]:
            end += 1
        if any(h != default for h in layer_heads[layer]):
            overrides.append({"range": [layer, end],
                              "heads": [h.model_dump(mode="json", exclude_none=True) for h in layer_heads[layer]]})
        layer = end + 1
    return overrides


class _EnumTrial:
    """A trial that replays a prefix of choice indices and takes the first option of every later parameter,
    recording how many options each parameter had (:meth:`SearchSpace.points` walks the tree of points)."""

    def __init__(self, prefix: Sequence[int]):
        self.prefix = list(prefix)
        self.path: list[int] = []
        self.counts: list[int] = []
        self.params: dict[str, Any] = {}

    def _pick(self, name: str, options: list) -> Any:
        index = self.prefix[len(self.path)] if len(self.path) < len(self.prefix) else 0
        self.path.append(index)
        self.counts.append(len(options))
        self.params[name] = options[index]
        return options[index]

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._pick(name, list(choices))

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        return self._pick(name, list(range(low, high + 1, step)))

    def suggest_float(self, name: str, low: float, high: float, step: float | None = None, log: bool = False) -> float:
        if step is None or log:
            raise SpecError.single((), f"parameter {name!r} is a continuous float range: the space has no finite "
                                   "list of points", "give the range a step, or use a {choice: [...]}")
        count = int(round((high - low) / step)) + 1
        return self._pick(name, [low + i * step for i in range(count)])


def _next_prefix(trial: _EnumTrial) -> list[int] | None:
    """The choice indices of the next point after ``trial``'s, depth first (an odometer over the options each
    parameter had on this path: later parameters may not exist on the next one); ``None`` after the last."""
    path, counts = trial.path, trial.counts
    i = len(path) - 1
    while i >= 0 and path[i] + 1 >= counts[i]:
        i -= 1
    return None if i < 0 else path[:i] + [path[i] + 1]


class SearchSpace:
    """A declarative search space (see the module docstring for the language).

    Attributes:
        name: the space's name.
        kind: ``"design"`` (architecture search) or ``"masks"`` (MaiT mask placement).
        description: free text or ``None``.
        file: where it was read from (``None`` for a dict).
        document: the validated space document (``spec`` holds the markers).
    """

    def __init__(self, name: str, kind: Literal["design", "masks"], document: dict, locator: Locator | None = None,
                 file: str | None = None, description: str | None = None):
        self.name = name
        self.kind = kind
        self.document = document
        self.description = description
        self.file = file
        self._locator = locator

    def __repr__(self) -> str:
        return f"SearchSpace(name={self.name!r}, kind={self.kind!r}, file={self.file!r})"

    def _located(self, exc: SpecError) -> SpecError:
        err = exc.located(self._locator) if self._locator is not None else exc
        return SpecError([p if p.file else Problem(p.path, p.message, p.hint, self.file or "<space>", p.line, p.column)
                          for p in err.problems])

    def sample(self, trial: Any) -> ArchSpec:
        """Draw one point: a concrete, validated :class:`ArchSpec`.

        Args:
            trial: an ``optuna.trial.BaseTrial`` (``Trial``, ``FixedTrial``...) or anything with
                ``suggest_categorical`` / ``suggest_int`` / ``suggest_float``.

        Raises:
            SpecError: the point is not a valid spec; problems are located at the space field that
                produced the offending value, with the drawn parameters in the hint.
        """
        sampler = _Sampler(trial)
        try:
            doc = sampler.document(self.document["spec"])
        except SpecError as exc:
            raise self._located(exc) from None
        try:
            return load_spec(doc)
        except SpecError as exc:
            drawn = ", ".join(f"{k}={v}" for k, v in sampler.drawn.items())
            problems = []
            for p in exc.problems:
                path = tuple(p.path)
                ypath = ("spec",) + path
                for cut in range(len(path), 0, -1):
                    if path[:cut] in sampler.generated:  # written by heads_mix: point at it (or its window)
                        mix_path, window_path = sampler.generated[path[:cut]]
                        ypath = window_path if "mask" in path[cut:] else mix_path
                        break
                    if path[:cut] in sampler.origin:
                        ypath = sampler.origin[path[:cut]] + path[cut:]
                        break
                hint = (p.hint + "; " if p.hint else "") + f"drawn: {drawn}" if drawn else p.hint
                problems.append(Problem(ypath, f"sampled point is invalid: {p.message} "
                                               f"(at spec {'.'.join(map(str, path))})", hint))
            raise self._located(SpecError(problems)) from None

    def smallest(self) -> ArchSpec:
        """The point with the smallest value of every numeric choice and range (first of non-numeric choices).

        Used to report the smallest achievable MACs when a budget is infeasible.  Its MACs are <= those of
        every point when MACs grow with every numeric choice and the cheapest labelled alternative is listed
        first (true of the shipped spaces).
        """
        return self.sample(_MinTrial())

    def smallest_params(self) -> dict[str, Any]:
        """The Optuna parameters of :meth:`smallest` (e.g. to enqueue it as the first trial)."""
        trial = _MinTrial()
        self.sample(trial)
        return dict(trial.params)

    def points(self, limit: int | None = None) -> Iterator[tuple[dict[str, Any], ArchSpec]]:
        """Every point of a finite space, depth first in the order of each parameter's options:
        ``(params, spec)``, ``params`` being the Optuna parameters that :meth:`sample` would draw for it
        (``optuna.trial.FixedTrial(params)`` gives the same spec).  Conditional parameters (a stage count,
        a labelled alternative) are enumerated only where they exist.  Points whose spec is invalid are
        skipped (:meth:`sample` would refuse them too).

        Args:
            limit: stop with an error after this many points (a guard for spaces too large to list).

        Raises:
            SpecError: a continuous float range (no finite list), or more than ``limit`` points.
        """
        if limit is not None:
            size = self._count_leaves(limit)
            if size > limit:
                raise SpecError.single((), f"the space has more than {limit} points",
                                       "listing and tabulating are for finite spaces of a few hundred points "
                                       "(e.g. levit_small); sample larger ones with archspec search", self.file)
        prefix: list[int] = []
        count = 0
        while True:
            trial = _EnumTrial(prefix)
            try:
                spec = self.sample(trial)
            except SpecError as exc:
                if any("continuous float range" in p.message for p in exc.problems):
                    raise
                spec = None
            if spec is not None:
                count += 1
                yield dict(trial.params), spec
            prefix = _next_prefix(trial)
            if prefix is None:
                return

    def _count_leaves(self, stop: int) -> int:
        """How many parameter combinations the space has, counted by resolving the document only (no spec is
        validated: fast), stopping once past ``stop``."""
        prefix: list[int] = []
        count = 0
        while count <= stop:
            trial = _EnumTrial(prefix)
            try:
                _Sampler(trial).document(self.document["spec"])
            except SpecError as exc:
                if any("continuous float range" in p.message for p in exc.problems):
                    raise self._located(exc) from None
            count += 1
            prefix = _next_prefix(trial)
            if prefix is None:
                break
        return count

    def describe(self) -> dict:
        """JSON-ready summary."""
        return {"name": self.name, "kind": self.kind, "description": self.description, "file": self.file}


def _from_document(data: Any, locator: Locator | None, file: str | None) -> SearchSpace:
    checker = _Checker()
    if not isinstance(data, dict):
        raise SpecError.single((), f"a search space must be a mapping, got {type(data).__name__}",
                               "top-level keys: name, kind, description, spec", file)
    for key in data:
        if key not in _SPACE_KEYS:
            checker.unknown((), key, _SPACE_KEYS)
    name = data.get("name", Path(file).stem if file and file[0] != "<" else "space")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        checker.add(("name",), f"name must use only letters, digits, '_', '.' and '-', got {name!r}")
    kind = data.get("kind", "design")
    if kind not in ("design", "masks"):
        checker.add(("kind",), f"kind must be 'design' or 'masks', got {kind!r}")
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        checker.add(("description",), "description must be text")
    spec = data.get("spec")
    if spec is None:
        checker.add(("spec",) if "spec" in data else (), "missing required key 'spec'",
                    "spec: the architecture, with {choice: ...} / {int: ...} markers where it varies")
    elif not isinstance(spec, dict) or _is_marker(spec):
        checker.add(("spec",), "spec must be a mapping (an architecture spec)")
    else:
        checker.value(spec, ("spec",), ArchSpec)
        if "stages" not in spec:
            checker.add(("spec",), "missing required key 'stages'")
    if checker.problems:
        err = SpecError(checker.problems)
        err = err.located(locator) if locator is not None else err
        raise SpecError([Problem(p.path, p.message, p.hint, p.file or file, p.line, p.column) for p in err.problems])
    space = SearchSpace(name, kind, data, locator, file, description)
    space.smallest()  # every space has at least one valid point; errors come back located
    return space


def load_space(source: str | os.PathLike | dict | None = None) -> SearchSpace:
    """Load and validate a search space.

    Args:
        source: ``None`` (the embedded LeViT-family design space), a path to a YAML file, the name of
            a shipped space (``levit_family``), YAML text or a dict.  A ``str`` is YAML text or a path
            by the rule of :func:`archspec.spec.yaml_source.is_yaml_text` (as for :func:`archspec.load_spec`).

    Raises:
        SpecError: unknown keys, malformed markers, empty choices, refs to nothing, a space whose
            smallest point is not a valid spec -- each with file, line and field path; a file that is
            missing, a directory, FIFO or device, over 1 MB or not UTF-8; YAML nested too deeply, with
            recursive aliases or non-scalar keys.
    """

    if source is None:
        source = DEFAULT_SPACE
    if isinstance(source, dict):
        return _from_document(source, None, "<dict>")
    if isinstance(source, str) and is_yaml_text(source):
        data, locator = load_yaml(source, "<string>")
        return _from_document(data, locator, "<string>")
    path = Path(source).expanduser()
    if not os.path.lexists(path):
        shipped = SPACES_DIR / (path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml")
        if shipped.is_file() and path.parent == Path("."):
            path = shipped
        else:
            names = sorted(p.stem for p in SPACES_DIR.glob("*.yaml"))
            raise SpecError.single((), "no such search space file", f"shipped spaces: {', '.join(names)}", str(source))
    # Same checks as a spec file: regular file, at most 1 MB (from stat, before reading), UTF-8.
    text = read_text_file(path, str(source), "search space")
    data, locator = load_yaml(text, str(source))
    return _from_document(data, locator, str(source))


def _stage_grids(spec: ArchSpec) -> dict[int, tuple[int, int]]:
    graph = build_graph(spec)
    grids: dict[int, tuple[int, int]] = {}
    for node in graph.graph["order"]:
        data = graph.nodes[node]
        if data["kind"] == "block":
            grids.setdefault(data["stage"], tuple(data["grid"]))
    return grids


def mask_placement_space(spec: ArchSpec, windows: Sequence[str] = ("3x3", "3x5", "5x5"), max_masked: int | None = None,
                         group_size: int | None = None) -> SearchSpace:
    """MaiT mode-2 space (mask placement) over any spec with attention layers.

    The architecture is fixed; per stage and per group of ``group_size`` consecutive layers the space
    draws how many heads carry a hard MaiT mask (heads ``0..m-1``, ``m`` in ``0..min(H, max_masked)``)
    and, when ``m > 0``, the mask window among ``windows`` (those that fit the stage's token grid).
    The masked heads keep what they were (MHSA, LeViT bias, GPSA), a mask is added on top; existing
    masks of the spec are removed first.  Parameters: ``stages.{i}.heads_mix.masked.{a}-{b}`` and
    ``stages.{i}.heads_mix.window.{a}-{b}``.

    ``group_size`` defaults to ``ceil(depth / 6)`` per stage (4 for MaiT's 24 layers, so Sch.1 -- one
    masked head everywhere -- and Sch.2 -- H-1 masked heads in layers 0-7, one in 8-19, none in 20-23 --
    are points of the space: 6 groups x (H+1) counts x windows instead of 24 layers).  Stages whose
    token mixer is a convolution are left alone.

    Raises:
        SpecError: a malformed window, ``max_masked < 0``, or a spec with no token stage that can take a mask (a
            conv net; a hybrid's conv stages are left alone).
    """
    parsed = []
    for k, window in enumerate(windows):
        try:
            parsed.append((window, MaskSpec(window=window).window))
        except ValidationError as exc:
            raise SpecError.single(("windows", k), f"invalid window {window!r}: {exc.errors()[0]['msg']}") from None
    if not parsed:
        raise SpecError.single(("windows",), "no mask windows given", "e.g. windows=('3x3', '5x5')")
    if max_masked is not None and max_masked < 0:
        raise SpecError.single(("max_masked",), f"max_masked must be >= 0, got {max_masked}")
    spec = load_spec(spec)
    grids = _stage_grids(spec)
    doc_spec = spec.model_dump(mode="json")
    doc_spec["name"] = spec.name
    any_stage = False
    for i, stage in enumerate(spec.stages):
        if isinstance(stage, ConvStageSpec) or stage.mixer.kind == "conv" or i not in grids:
            continue  # a hybrid's conv stages (attention inside bottlenecks too) take no MaiT mask
        rows, cols = grids[i]
        fitting = [name for name, (r, c) in parsed if r <= rows and c <= cols]
        cap = stage.heads if max_masked is None else min(stage.heads, max_masked)
        if not fitting or cap == 0:
            continue
        group = group_size if group_size is not None else max(1, math.ceil(stage.depth / 6))
        doc_spec["stages"][i]["heads_mix"] = {
            "base": "keep", "masked": {"int": [0, cap]},
            "window": {"choice": fitting} if len(fitting) > 1 else fitting[0], "group": group,
        }
        any_stage = True
    if not any_stage:
        raise SpecError.single(("stages",), "no attention stage can take a mask window of "
                               f"{', '.join(windows)} (token grids {sorted(set(grids.values()))})")
    document = {"name": f"{spec.name}_masks", "kind": "masks",
                "description": f"MaiT mask placement over {spec.name}", "spec": doc_spec}
    return _from_document(document, None, f"<mask_placement_space {spec.name}>")
