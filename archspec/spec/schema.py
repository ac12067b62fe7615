"""The JSON Schema (Draft 2020-12) of a spec: what ``archspec schema`` prints, for editors and validators.

pydantic's ``ArchSpec.model_json_schema()`` describes the *validated* models; the loader also accepts
YAML shorthands that its ``mode='before'`` validators expand (``resolution: 224``, ``range: 0-7``,
``window: 3x5``, head kinds such as ``mhsa`` or ``mask:3x5``, ``mixer: conv5``, ``downsample: patch_merging``,
``cls_token: true``)
and top-level ``x-...`` keys for YAML anchors (as Compose files).  :func:`spec_schema` adds exactly
those alternatives, so a spec the loader accepts validates against the schema; checks that need shapes
(mask windows against the grid, head arithmetic) remain ``archspec validate``'s.

Editors: start a spec with ``# yaml-language-server: $schema=<path or URL of the printed schema>``
(the YAML language server of VS Code, Neovim, Helix...); the shipped specs point at
``specs/archspec.schema.json``, which a test keeps equal to ``archspec schema``.  Search spaces
(:mod:`archspec.search._space.language`) have theirs, :func:`space_schema` (``archspec schema --space``).
"""

from __future__ import annotations

import copy
from typing import Any

from archspec.families.attention.heads import HEAD_SHORTHANDS, KINDS
from archspec.families.downsample.rules import KINDS as DOWNSAMPLE_KINDS
from archspec.spec import ArchSpec

__all__ = ["SCHEMA_DIALECT", "SCHEMA_ID", "SPACE_SCHEMA_ID", "SCHEMA_FILE_NAME", "SPACE_SCHEMA_FILE_NAME",
           "X_KEY_PATTERN", "spec_schema", "space_schema"]

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID = "urn:archspec:schema:spec"
SPACE_SCHEMA_ID = "urn:archspec:schema:search-space"
SCHEMA_FILE_NAME = "archspec.schema.json"
SPACE_SCHEMA_FILE_NAME = "archspec-space.schema.json"
# Top-level keys the loader ignores: user anchors, ``x-common: &common {...}`` (Compose's convention).
X_KEY_PATTERN = "^x-"

# A head shorthand: a plain name, or the name of a kind that takes an argument (``mask``) with its ``:text``.
_ARGUMENT_KINDS = [kind for kind in KINDS if kind.shorthand_argument is not None]
_TAKERS = {kind.field: sorted(k for k, v in HEAD_SHORTHANDS.items() if kind.field in v) for kind in _ARGUMENT_KINDS}
_PLAIN_KINDS = sorted(set(HEAD_SHORTHANDS).difference(*_TAKERS.values()))
_SHORTHAND_ALTERNATIVES = [f"(?:{'|'.join(_PLAIN_KINDS)})"] + [
    f"(?:{'|'.join(_TAKERS[kind.field])})(?::{kind.shorthand_argument.pattern.replace('(', '').replace(')', '')})?"
    for kind in _ARGUMENT_KINDS]  # each argument's pattern without its groups
HEAD_SHORTHAND_PATTERN = rf"^\s*(?:{'|'.join(_SHORTHAND_ALTERNATIVES)})\s*$"
_SHORTHAND_TEXT = ", ".join(_PLAIN_KINDS + [name for kind in _ARGUMENT_KINDS for name in _TAKERS[kind.field]])
_SHORTHAND_TEXT += "".join(f"; a {kind.field} kind may name {kind.shorthand_argument.noun}: "
                           f"'{kind.shorthand_argument.example}'" for kind in _ARGUMENT_KINDS)


def _pair_or(prop: dict[str, Any], *alternatives: dict[str, Any]) -> dict[str, Any]:
    """``prop`` (a ``[a, b]`` array schema, or an ``anyOf`` holding one: a window's ``[a, b] | 'full'``) also accepting
    ``alternatives``; keeps its description and default."""
    if "anyOf" in prop:
        prop["anyOf"] = [*alternatives, *prop["anyOf"]]
        return prop
    pair = {k: prop.pop(k) for k in ("maxItems", "minItems", "prefixItems", "type")}
    prop["anyOf"] = [*alternatives, pair]
    return prop


def _shorthand_or_mapping(defs: dict[str, Any], name: str, pattern: str, what: str) -> None:
    """Rename ``$defs[name]`` to ``<name>Mapping`` and make ``name`` 'a shorthand string or that mapping'."""
    defs[f"{name}Mapping"] = defs.pop(name)
    defs[name] = {"description": defs[f"{name}Mapping"].get("description", ""),
                  "anyOf": [{"type": "string", "pattern": pattern, "description": what},
                            {"$ref": f"#/$defs/{name}Mapping"}]}


def spec_schema() -> dict[str, Any]:
    """The spec's JSON Schema with the loader's shorthands, ``$schema``, ``$id`` and ``x-`` keys. Raises nothing."""

    schema = copy.deepcopy(ArchSpec.model_json_schema())
    defs = schema["$defs"]
    _pair_or(defs["InputSpec"]["properties"]["resolution"],
             {"type": "integer", "description": "square images: H = W"})
    _pair_or(defs["LayerOverride"]["properties"]["range"], {"type": "integer", "minimum": 0},
             {"type": "string", "pattern": r"^\s*\d+\s*(?:-\s*\d+\s*)?$", "description": "'0-7' or '8'"})
    for kind in KINDS:  # a head kind's pair fields the loader also takes in shorthand (a mask's window: 3, '3x5')
        for name, alternatives in kind.schema_alternatives.items():
            _pair_or(defs[kind.spec.__name__]["properties"][name], *copy.deepcopy(alternatives))
    defs["MapToTokensSpec"]["properties"]["grid"]["anyOf"].insert(
        0, {"type": "integer", "minimum": 1, "description": "square grid: H = W"})
    defs["TokensSpec"]["properties"]["cls_token"]["anyOf"] += [
        {"type": "boolean", "description": "true = 'input', false = 'none'"}, {"type": "null"}]
    _shorthand_or_mapping(defs, "HeadSpec", HEAD_SHORTHAND_PATTERN, _SHORTHAND_TEXT)
    _shorthand_or_mapping(defs, "MixerSpec", r"^\s*(?:attention|(?:token_)?conv\d*)\s*$",
                          "'attention', 'conv<K>' (pixel view) or 'token_conv<K>' (token grid)")
    _shorthand_or_mapping(defs, "DownsampleSpec", rf"^\s*(?:{'|'.join(DOWNSAMPLE_KINDS)})\s*$",
                          "the kind alone: " + " or ".join(DOWNSAMPLE_KINDS))
    _shorthand_or_mapping(defs, "BlockPoolSpec", r"^\s*pool\s*$", "the kind alone: pool")
    for stem in ("PatchStemSpec", "ConvStemSpec", "ConvTokenizerStemSpec", "IdentityStemSpec", "ResNetStemSpec",
                 "MaxxVitStemSpec", "MobileViTStemSpec"):
        defs[stem]["required"] = ["kind"]  # the loader needs the tag to choose the stem
    # an attention stage may name its kind (the default); the loader drops it, so the model has no such field
    defs["StageSpec"]["properties"]["kind"] = {"const": "attention", "description": "'attention' (the default): "
                                               "token stages; 'conv' is a conv stage"}
    schema["patternProperties"] = {X_KEY_PATTERN: {"description": "ignored: a place for YAML anchors"}}
    return {"$schema": SCHEMA_DIALECT, "$id": SCHEMA_ID, **schema}


_NUMBER_OR_REF = {"anyOf": [{"type": "number"}, {"$ref": "#/$defs/RefMarker"}]}
_MARKER_DEFS: dict[str, Any] = {
    "ChoiceMarker": {"type": "object", "required": ["choice"], "additionalProperties": False,
                     "description": "{choice: [a, b]} over scalars, or {choice: {label: value}} over alternatives",
                     "properties": {"choice": {"anyOf": [
                         {"type": "array", "minItems": 1, "items": {"type": ["string", "number", "boolean", "null"]}},
                         {"type": "object", "minProperties": 1}]},
                                    "share": {"type": "boolean", "description": "labelled alternatives only: name "
                                              "the parameters inside them without the label, one parameter for all"}}},
    "IntMarker": {"type": "object", "required": ["int"], "additionalProperties": False,
                  "description": "{int: [low, high], step: 1, log: false}: an inclusive integer range",
                  "properties": {"int": {"type": "array", "minItems": 2, "maxItems": 2,
                                         "items": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/RefMarker"}]}},
                                 "step": {"type": ["integer", "null"], "exclusiveMinimum": 0},
                                 "log": {"type": "boolean"}}},
    "FloatMarker": {"type": "object", "required": ["float"], "additionalProperties": False,
                    "description": "{float: [low, high], step: null, log: false}: a float range",
                    "properties": {"float": {"type": "array", "minItems": 2, "maxItems": 2, "items": _NUMBER_OR_REF},
                                   "step": {"type": ["number", "null"], "exclusiveMinimum": 0},
                                   "log": {"type": "boolean"}}},
    "RefMarker": {"type": "object", "required": ["ref"], "additionalProperties": False,
                  "description": "{ref: stages.0.dim} or {ref: stage.key_dim}: a value drawn earlier",
                  "properties": {"ref": {"type": "string", "minLength": 1}}},
    "Marker": {"anyOf": [{"$ref": f"#/$defs/{name}"} for name in ("ChoiceMarker", "IntMarker", "FloatMarker",
                                                                    "RefMarker")]},
}
_META_KEYS = ("description", "default", "title")


def _or_marker(prop: dict[str, Any]) -> dict[str, Any]:
    """A property schema that also accepts a search marker (its description and default kept outside)."""
    meta = {k: prop[k] for k in _META_KEYS if k in prop}
    body = {k: v for k, v in prop.items() if k not in _META_KEYS}
    if "items" in body and isinstance(body["items"], dict):
        body["items"] = _or_marker(body["items"])
    if "anyOf" in body:  # an optional list (``list[int] | None``): its items may be markers too
        body["anyOf"] = [{**o, "items": _or_marker(o["items"])} if isinstance(o.get("items"), dict) else o
                         for o in body["anyOf"]]
    return {**meta, "anyOf": [body, {"$ref": "#/$defs/Marker"}]}


def space_schema() -> dict[str, Any]:
    """JSON Schema of a search-space file: ``name``, ``kind``, ``description``, ``protocol``, top-level ``x-...``
    keys for YAML anchors, and a ``spec`` in which any value may be a marker (``choice``, ``int``, ``float``,
    ``ref``), ``stages`` may be ``{count, items}`` or a labelled choice of stage lists, and a stage is an attention
    stage (which may have ``heads_mix``) or a conv stage (see :mod:`archspec.search._space.language`).
    Labelled-choice alternatives are not checked (their place's schema cannot be tied to them); ``archspec search``
    checks them.  Raises nothing.
    """
    spec = spec_schema()
    defs = spec.pop("$defs")
    for key in ("$schema", "$id", "patternProperties"):  # the space checker takes no x- keys inside spec
        spec.pop(key, None)
    defs["ArchSpec"] = spec
    for model in defs.values():
        for name, prop in model.get("properties", {}).items():
            model["properties"][name] = _or_marker(prop)
    defs["StageSpec"]["properties"]["heads_mix"] = {
        "description": "How the stage's heads are composed: a head kind, or {base, masked, window, group | per_layer}",
        "anyOf": [{"type": "string"}, {"$ref": "#/$defs/Marker"},
                  {"type": "object", "required": ["base"], "additionalProperties": False,
                   "properties": {key: {} for key in ("base", "masked", "window", "group", "per_layer")}}]}
    stages = defs["ArchSpec"]["properties"]["stages"]
    stage_list = next(option for option in stages["anyOf"] if option.get("type") == "array")
    stage_list["items"] = stage_list["items"]["anyOf"][0]  # an attention or conv stage; a stage is no marker
    stages["anyOf"].insert(0, {"type": "object", "required": ["count", "items"], "additionalProperties": False,
                               "properties": {"count": {"anyOf": [{"type": "integer", "minimum": 1},
                                                                  {"$ref": "#/$defs/Marker"}]},
                                              "items": {"type": "array", "minItems": 1,
                                                        "items": stage_list["items"]}}})
    return {"$schema": SCHEMA_DIALECT, "$id": SPACE_SCHEMA_ID, "title": "archspec search space", "type": "object",
            "required": ["spec"], "additionalProperties": False,
            "patternProperties": {X_KEY_PATTERN: {"description": "ignored: a place for YAML anchors"}},
            "properties": {"name": {"type": "string", "pattern": r"^[A-Za-z0-9_.\-]+$"},
                           "kind": {"enum": ["design", "masks"]}, "description": {"type": "string"},
                           "protocol": {"type": "object", "description": "fields of the table protocol this "
                                        "space's ground truth is trained under (archspec table): steps, "
                                        "warmup_steps, curve_steps, ...; the others are the reference protocol's"},
                           "spec": {"$ref": "#/$defs/ArchSpec"}},
            "$defs": {**defs, **_MARKER_DEFS}}
