"""Search spaces: an architecture spec in which any value may be a choice or a range.

A space is a YAML document with these top-level keys::

    name: levit_family          # letters, digits, '_', '.', '-'
    kind: design                # 'design' (architecture search) or 'masks' (MaiT mask placement)
    description: free text      # optional
    protocol: {steps: 1876}     # optional: fields of the table protocol its ground truth is trained under
                                # (``archspec table``; the rest are the reference protocol's), not read by search
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
    trials and did not beat random sampling; see ``research/search-works-history.md``.
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

import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from archspec.errors import Locator, Problem, SpecError
from archspec.families.attention.heads import MaskSpec
from archspec.ir.checked import load_spec
from archspec.ir.graph import build_graph
from archspec.search._space.checks import MARKERS, SPACE_KEYS, SPACE_NAME_RE, Checker, is_marker
from archspec.search._space.sampling import EnumTrial, MinTrial, Sampler, next_prefix
from archspec.spec import ArchSpec, ConvStageBase
from archspec.spec.yaml_source import is_yaml_text, load_yaml, read_text_file

__all__ = ["SearchSpace", "load_space", "mask_placement_space", "MARKERS", "SPACES_DIR", "DEFAULT_SPACE"]

# the shipped search spaces (package data beside the code) and the one a bare `archspec search` searches
SPACES_DIR = Path(__file__).resolve().parents[1] / "spaces"
DEFAULT_SPACE = SPACES_DIR / "levit_family.yaml"


class SearchSpace:
    """A declarative search space (see the module docstring for the language).

    Attributes:
        name: the space's name.
        kind: ``"design"`` (architecture search) or ``"masks"`` (MaiT mask placement).
        description: free text or ``None``.
        protocol: the space's table-protocol fields (``{}`` when it names none); checked and applied by
            :func:`archspec.search.table_protocol`, which locates a bad field in the space file.
        file: where it was read from (``None`` for a dict).
        document: the validated space document (``spec`` holds the markers).
    """

    def __init__(self, name: str, kind: Literal["design", "masks"], document: dict, locator: Locator | None = None,
                 file: str | None = None, description: str | None = None, protocol: dict | None = None):
        self.name = name
        self.kind = kind
        self.document = document
        self.description = description
        self.protocol = dict(protocol or {})
        self.file = file
        self._locator = locator

    def __repr__(self) -> str:
        return f"SearchSpace(name={self.name!r}, kind={self.kind!r}, file={self.file!r})"

    def locate(self, exc: SpecError) -> SpecError:
        """``exc`` with each problem that has no file placed in the space file (line and column of its path).
        Raises nothing."""
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
        sampler = Sampler(trial)
        try:
            doc = sampler.document(self.document["spec"])
        except SpecError as exc:
            raise self.locate(exc) from None
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
            raise self.locate(SpecError(problems)) from None

    def smallest(self) -> ArchSpec:
        """The point with the smallest value of every numeric choice and range (first of non-numeric choices).

        Used to report the smallest achievable MACs when a budget is infeasible.  Its MACs are <= those of
        every point when MACs grow with every numeric choice and the cheapest labelled alternative is listed
        first (true of the shipped spaces).
        """
        return self.sample(MinTrial())

    def smallest_params(self) -> dict[str, Any]:
        """The Optuna parameters of :meth:`smallest` (e.g. to enqueue it as the first trial)."""
        trial = MinTrial()
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
            trial = EnumTrial(prefix)
            try:
                spec = self.sample(trial)
            except SpecError as exc:
                if any("continuous float range" in p.message for p in exc.problems):
                    raise
                spec = None
            if spec is not None:
                count += 1
                yield dict(trial.params), spec
            prefix = next_prefix(trial)
            if prefix is None:
                return

    def _count_leaves(self, stop: int) -> int:
        """How many parameter combinations the space has, counted by resolving the document only (no spec is
        validated: fast), stopping once past ``stop``."""
        prefix: list[int] = []
        count = 0
        while count <= stop:
            trial = EnumTrial(prefix)
            try:
                Sampler(trial).document(self.document["spec"])
            except SpecError as exc:
                if any("continuous float range" in p.message for p in exc.problems):
                    raise self.locate(exc) from None
            count += 1
            prefix = next_prefix(trial)
            if prefix is None:
                break
        return count

    def describe(self) -> dict:
        """JSON-ready summary."""
        return {"name": self.name, "kind": self.kind, "description": self.description, "file": self.file}


def _from_document(data: Any, locator: Locator | None, file: str | None) -> SearchSpace:
    checker = Checker()
    if not isinstance(data, dict):
        raise SpecError.single((), f"a search space must be a mapping, got {type(data).__name__}",
                               "top-level keys: name, kind, description, protocol, spec", file)
    for key in data:
        # top-level x-... keys hold YAML anchors (x-common: &common ...), as in spec files and Compose files
        if key not in SPACE_KEYS and not (isinstance(key, str) and key.startswith("x-")):
            checker.unknown((), key, SPACE_KEYS)
    name = data.get("name", Path(file).stem if file and file[0] != "<" else "space")
    if not isinstance(name, str) or not SPACE_NAME_RE.match(name):
        checker.add(("name",), f"name must use only letters, digits, '_', '.' and '-', got {name!r}")
    kind = data.get("kind", "design")
    if kind not in ("design", "masks"):
        checker.add(("kind",), f"kind must be 'design' or 'masks', got {kind!r}")
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        checker.add(("description",), "description must be text")
    protocol = data.get("protocol")
    if protocol is not None and not (isinstance(protocol, dict) and all(isinstance(k, str) for k in protocol)):
        checker.add(("protocol",), "protocol must be a mapping of table-protocol fields",
                    "e.g. protocol: {steps: 1876, warmup_steps: 94, curve_steps: [25, 100, 400, 1600, 1876]}")
    spec = data.get("spec")
    if spec is None:
        checker.add(("spec",) if "spec" in data else (), "missing required key 'spec'",
                    "spec: the architecture, with {choice: ...} / {int: ...} markers where it varies")
    elif not isinstance(spec, dict) or is_marker(spec):
        checker.add(("spec",), "spec must be a mapping (an architecture spec)")
    else:
        checker.value(spec, ("spec",), ArchSpec)
        if "stages" not in spec:
            checker.add(("spec",), "missing required key 'stages'")
    if checker.problems:
        err = SpecError(checker.problems)
        err = err.located(locator) if locator is not None else err
        raise SpecError([Problem(p.path, p.message, p.hint, p.file or file, p.line, p.column) for p in err.problems])
    space = SearchSpace(name, kind, data, locator, file, description, protocol)
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
        if isinstance(stage, ConvStageBase) or stage.mixer.kind == "conv" or i not in grids:
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
