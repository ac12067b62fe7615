"""Mask placement on a spec (torch-free): find the attention layers, put MaiT masks on their heads, label them.

The spec side of :mod:`archspec.search._modes.masks`: a placement
(:data:`~archspec.families.attention.placement.Placement`,
``(stage, layer)`` -> masked flag per head) becomes a spec with :func:`placement_heads` and
:func:`apply_placement`; the rule that decides a placement is :mod:`archspec.families.attention.placement`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import ValidationError

from archspec.errors import SpecError, format_path
from archspec.families.attention.heads import HeadSpec, MaskSpec
from archspec.families.attention.placement import DEFAULT_ALS_HIGH, DEFAULT_ALS_LOW, Placement
from archspec.ir.checked import load_spec
from archspec.spec import ArchSpec, ConvStageBase, spec_to_yaml

__all__ = ["attention_layers", "token_stages", "strip_mask", "with_mask", "apply_placement", "placement_heads",
           "head0_placement", "soft_heads", "first_spec", "parse_window", "rule_thresholds", "layer_label",
           "als_table", "placement_json", "provenance_free_yaml"]


def attention_layers(spec: ArchSpec) -> list[tuple[int, int, list[HeadSpec]]]:
    """``(stage, layer, heads)`` of every token-stage block whose token mixer is attention, in order (a hybrid's conv
    stages, attention inside bottlenecks included, take no MaiT mask: they are skipped)."""
    out = []
    for s in token_stages(spec):
        for l, plan in enumerate(spec.layer_plans(s)):
            if plan.mixer.kind == "attention":
                out.append((s, l, list(plan.heads)))
    return out


def token_stages(spec: ArchSpec) -> list[int]:
    """Indices of the spec's attention (token) stages; a hybrid's conv stages are not among them."""
    return [i for i, stage in enumerate(spec.stages) if not isinstance(stage, ConvStageBase)]


def strip_mask(head: HeadSpec) -> HeadSpec:
    """``head`` without its mask."""
    return head.model_copy(update={"mask": None}) if head.mask is not None else head


def with_mask(head: HeadSpec, window: tuple[int, int], mode: str = "hard", alpha_init: float = 0.5) -> HeadSpec:
    """``head`` with a ``mode`` mask of ``window`` (rows, cols patches); ``alpha_init`` for a soft mask (eq. 4)."""
    mask = MaskSpec(window=window, mode=mode, alpha_init=alpha_init)
    return HeadSpec.model_validate({**head.model_dump(exclude={"mask"}), "mask": mask.model_dump()})


def apply_placement(spec: ArchSpec, heads_of: dict[tuple[int, int], list[HeadSpec]]) -> ArchSpec:
    """``spec`` with the heads of the given (stage, layer) replaced; consecutive equal layers share a range.

    Every attention layer of a touched stage gets an explicit override, so the result does not depend
    on the stage's ``attention`` default (which is set to that default with its mask removed).
    """
    doc = spec.model_dump(mode="json")
    for s, stage in enumerate(spec.stages):
        if not any(key[0] == s for key in heads_of):
            continue
        plans = spec.layer_plans(s)
        rows = []
        for l, plan in enumerate(plans):
            heads = heads_of.get((s, l), plan.heads) if plan.mixer.kind == "attention" else plan.heads
            rows.append((tuple(h.model_dump_json() for h in heads), plan.mixer.model_dump_json(), heads, plan.mixer))
        overrides = []
        start = 0
        for l in range(1, len(rows) + 1):
            if l == len(rows) or rows[l][:2] != rows[start][:2]:
                _, _, heads, mixer = rows[start]
                entry: dict[str, Any] = {"range": [start, l - 1], "heads": [h.model_dump(mode="json") for h in heads]}
                if mixer != stage.mixer:
                    entry["mixer"] = mixer.model_dump(mode="json")
                overrides.append(entry)
                start = l
        default = stage.attention if stage.attention is not None else HeadSpec()
        doc["stages"][s]["attention"] = strip_mask(default).model_dump(mode="json")
        doc["stages"][s]["layers"] = overrides
    return load_spec(doc)


def placement_heads(spec: ArchSpec, placement: Placement,
                    window: tuple[int, int]) -> dict[tuple[int, int], list[HeadSpec]]:
    """Heads per layer for a boolean placement: masks removed, then a hard ``window`` mask where flagged."""
    out = {}
    for s, l, heads in attention_layers(spec):
        flags = placement.get((s, l), [False] * len(heads))
        out[(s, l)] = [with_mask(h, window) if flag else strip_mask(h) for h, flag in zip(heads, flags)]
    return out


def head0_placement(spec: ArchSpec) -> Placement:
    """MaiT sec. 4.2 step 1: head 0 masked in every attention layer."""
    return {(s, l): [h == 0 for h in range(len(heads))] for s, l, heads in attention_layers(spec)}


def layer_label(spec: ArchSpec, key: tuple[int, int]) -> str:
    """``s1.l3`` (several stages) or ``layer 3``: how reports name attention layer ``key`` = (stage, layer)."""
    s, l = key
    return f"s{s}.l{l}" if len(spec.stages) > 1 else f"layer {l}"


def als_table(spec: ArchSpec, als: dict, placement: Placement | None) -> tuple[dict, dict]:
    """``(ALS per labelled layer, masked flags per labelled layer or None)`` for the layers ``als`` scores."""
    keys = [(s, l) for s, l, _ in attention_layers(spec) if (s, l) in als]
    scores = {layer_label(spec, k): als[k] for k in keys}
    masked = {layer_label(spec, k): placement[k] for k in keys} if placement else None
    return scores, masked


def placement_json(spec: ArchSpec, placement: Placement) -> dict:
    """``placement`` as JSON: labelled layer -> 0/1 per head."""
    return {layer_label(spec, k): [int(f) for f in v] for k, v in placement.items()}


def parse_window(text: str, option: str) -> tuple[int, int]:
    """``"3x5"`` -> ``(3, 5)`` (rows, cols patches).

    Raises:
        SpecError: at ``option`` (the field ``window`` or ``windows`` of :class:`~archspec.search.MaskConfig`):
            not ``RxC`` with odd sides.
    """
    try:
        return MaskSpec(window=text).window
    except ValidationError as exc:
        raise SpecError.single((option,),
                               f"invalid window {text!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}",
                               "e.g. 3x3, 3x5, 5x5 (odd sides)") from None



def rule_thresholds(als_high: float | None, als_low: float | None, alpha_threshold: float) -> tuple[float, float]:
    """``(high, low)``: MaiT's ALS thresholds (sec. 4.2; ``None`` -> :data:`~archspec.families.attention.placement.
    DEFAULT_ALS_HIGH` / ``DEFAULT_ALS_LOW``), checked with the soft strategy's ``alpha_threshold`` (sec. 4.3): what
    live placement and its replay on a table both accept.

    Raises:
        SpecError: at ``als_low``: not ``0 <= low < high <= 1`` (ALS is a fraction of attention); at
            ``alpha_threshold``: not in (0, 1) (a sigmoid's range).
    """
    high = DEFAULT_ALS_HIGH if als_high is None else als_high
    low = DEFAULT_ALS_LOW if als_low is None else als_low
    if not 0.0 <= low < high <= 1.0:
        raise SpecError.single(("als_low",), f"need 0 <= `als_low` < `als_high` <= 1, got {low:g} and {high:g}")
    if not 0.0 < alpha_threshold < 1.0:
        raise SpecError.single(("alpha_threshold",), f"alpha lies in (0, 1); got {alpha_threshold:g}")
    return high, low


def first_spec(spec: ArchSpec, strategy: str, window: tuple[int, int]) -> ArchSpec:
    """The spec the first training round of ``als`` / ``soft`` trains.

    Raises:
        SpecError: the masks do not fit ``spec`` (e.g. ``window="99x99"`` on a 14 x 14 token grid).
    """
    try:
        if strategy == "soft":
            return apply_placement(spec, soft_heads(spec, window))
        return apply_placement(spec, placement_heads(spec, head0_placement(spec), window))
    except SpecError as exc:
        raise SpecError([dataclasses.replace(p, path=("window",), file=None, line=None, column=None,
                                             message=f"{window[0]}x{window[1]} masks do not fit {spec.name!r}: "
                                                     f"{format_path(p.path)}: {p.message}")
                         for p in exc.problems]) from None


def soft_heads(spec: ArchSpec, window: tuple[int, int]) -> dict[tuple[int, int], list[HeadSpec]]:
    """MaiT sec. 4.3: a soft ``window`` mask on every head of every attention layer."""
    return {(s, l): [with_mask(strip_mask(h), window, "soft") for h in heads]
            for s, l, heads in attention_layers(spec)}



def provenance_free_yaml(spec: ArchSpec) -> str:
    """The plain YAML of a spec (round specs are diagnostics, not results)."""
    return "# a mask-placement round of `archspec search masks` (diagnostic; see best.yaml)\n" + spec_to_yaml(spec)
