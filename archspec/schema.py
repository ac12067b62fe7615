"""The JSON Schema (Draft 2020-12) of a spec: what ``archspec schema`` prints, for editors and validators.

pydantic's ``ArchSpec.model_json_schema()`` describes the *validated* models; the loader also accepts
YAML shorthands that its ``mode='before'`` validators expand (``resolution: 224``, ``range: 0-7``,
``window: 3x5``, head kinds such as ``mhsa`` or ``mask:3x5``, ``mixer: conv5``, ``cls_token: true``)
and top-level ``x-...`` keys for YAML anchors (as Compose files).  :func:`spec_schema` adds exactly
those alternatives, so a spec the loader accepts validates against the schema; checks that need shapes
(mask windows against the grid, head arithmetic) remain ``archspec validate``'s.

Editors: start a spec with ``# yaml-language-server: $schema=<path or URL of the printed schema>``
(the YAML language server of VS Code, Neovim, Helix...); the shipped specs point at
``specs/archspec.schema.json``, which a test keeps equal to ``archspec schema``.
"""

from __future__ import annotations

import copy
from typing import Any

from archspec.heads import HEAD_SHORTHANDS

__all__ = ["SCHEMA_DIALECT", "SCHEMA_ID", "spec_schema", "X_KEY_PATTERN", "SCHEMA_FILE_NAME"]

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID = "urn:archspec:schema:spec"
SCHEMA_FILE_NAME = "archspec.schema.json"
# Top-level keys the loader ignores: user anchors, ``x-common: &common {...}`` (Compose's convention).
X_KEY_PATTERN = "^x-"

_MASK_KINDS = sorted(k for k, v in HEAD_SHORTHANDS.items() if "mask" in v)
_PLAIN_KINDS = sorted(k for k, v in HEAD_SHORTHANDS.items() if "mask" not in v)
_WINDOW = r"\s*\d+\s*[xX]\s*\d+\s*"
HEAD_SHORTHAND_PATTERN = (rf"^\s*(?:(?:{'|'.join(_PLAIN_KINDS)})|(?:{'|'.join(_MASK_KINDS)})(?::{_WINDOW})?)\s*$")


def _pair_or(prop: dict[str, Any], *alternatives: dict[str, Any]) -> dict[str, Any]:
    """``prop`` (a ``[a, b]`` array schema) also accepting ``alternatives``; keeps its description and default."""
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
    from archspec.spec import ArchSpec

    schema = copy.deepcopy(ArchSpec.model_json_schema())
    defs = schema["$defs"]
    _pair_or(defs["InputSpec"]["properties"]["resolution"],
             {"type": "integer", "description": "square images: H = W"})
    _pair_or(defs["LayerOverride"]["properties"]["range"], {"type": "integer", "minimum": 0},
             {"type": "string", "pattern": r"^\s*\d+\s*(?:-\s*\d+\s*)?$", "description": "'0-7' or '8'"})
    _pair_or(defs["MaskSpec"]["properties"]["window"], {"type": "integer", "description": "square window"},
             {"type": "string", "pattern": f"^{_WINDOW}$", "description": "'rows x cols', e.g. '3x5'"})
    defs["TokensSpec"]["properties"]["cls_token"]["anyOf"] += [
        {"type": "boolean", "description": "true = 'input', false = 'none'"}, {"type": "null"}]
    _shorthand_or_mapping(defs, "HeadSpec", HEAD_SHORTHAND_PATTERN,
                          f"{', '.join(_PLAIN_KINDS + _MASK_KINDS)}; a mask kind may name a window: 'mask:3x5'")
    _shorthand_or_mapping(defs, "MixerSpec", r"^\s*(?:attention|conv\d*)\s*$", "'attention', 'conv' or 'conv<K>'")
    for stem in ("PatchStemSpec", "ConvStemSpec", "IdentityStemSpec"):
        defs[stem]["required"] = ["kind"]  # the loader needs the tag to choose the stem
    schema["patternProperties"] = {X_KEY_PATTERN: {"description": "ignored: a place for YAML anchors"}}
    return {"$schema": SCHEMA_DIALECT, "$id": SCHEMA_ID, **schema}
