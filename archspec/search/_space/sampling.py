"""Sampling a space document: :class:`Sampler` resolves it into a concrete spec dict for one trial (in document
order); :class:`MinTrial` (the smallest point) and :class:`EnumTrial` (every point, in order) are the duck-typed
trials the space uses to check and enumerate itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from archspec.errors import SpecError
from archspec.families.attention.heads import HeadSpec, MaskSpec
from archspec.search._space.checks import alternative_name, is_marker, marker_kind
from archspec.spec import ArchSpec, StageSpec


class MinTrial:
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


class Sampler:
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
        if is_marker(node):
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
        kind = marker_kind(node)
        self._ypath_for_name = ypath
        if kind == "ref":
            return self.lookup(node["ref"], ypath + ("ref",), stage)
        if kind == "choice":
            options = node["choice"]
            if isinstance(options, list):
                return self.suggest("categorical", pname, list(options))
            label = self.suggest("categorical", pname, list(options))
            return self.resolve(options[label], ypath + ("choice", label), cpath,
                                alternative_name(node, pname, label), stage)
        ends = []
        for i, end in enumerate(node[kind]):
            ends.append(self.lookup(end["ref"], ypath + (kind, i, "ref"), stage) if is_marker(end) else end)
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
        if is_marker(node):  # a labelled choice of stage lists (the checker allows no other marker here)
            self._ypath_for_name = base
            label = self.suggest("categorical", prefix, list(node["choice"]))
            return self.stages(node["choice"][label], base + ("choice", label), alternative_name(node, prefix, label))
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
        if is_marker(node) and marker_kind(node) == "choice":
            options = node["choice"]
            self._ypath_for_name = ypath
            label = self.suggest("categorical", pname, list(options))
            if isinstance(options, dict):
                return options[label], ypath + ("choice", label), alternative_name(node, pname, label)
            return label, ypath, pname
        if is_marker(node):
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


class EnumTrial:
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


def next_prefix(trial: EnumTrial) -> list[int] | None:
    """The choice indices of the next point after ``trial``'s, depth first (an odometer over the options each
    parameter had on this path: later parameters may not exist on the next one); ``None`` after the last."""
    path, counts = trial.path, trial.counts
    i = len(path) - 1
    while i >= 0 and path[i] + 1 >= counts[i]:
        i -= 1
    return None if i < 0 else path[:i] + [path[i] + 1]
