"""Reading a spec: a path, a shipped spec's name, YAML text or a dict -> a schema-validated
:class:`~archspec.spec.models.ArchSpec`, every pydantic error turned into a located problem.

:func:`parse_spec` is the schema step only (types, ranges, unknown keys); the shape checks need the IR and run in
:func:`archspec.ir.checked.load_spec`, which calls it first.  The shipped specs (:data:`SPEC_DIR`,
:func:`shipped_specs`) are found here too.  Torch-free.
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path as FsPath
from typing import Any

from pydantic import ValidationError

from archspec._util.pydantic_base import HINT as _HINT
from archspec._util.pydantic_base import StrictModel
from archspec.errors import Locator, Problem, SpecError
from archspec.spec.models import (
    NAME_MAX,
    ArchSpec,
    ConvBNActStageSpec,
    ConvStageSpec,
    MBConvStageSpec,
    MobileViTStageSpec,
    MV2StageSpec,
    StageSpec,
)
from archspec.spec.yaml_source import is_yaml_text, load_yaml, read_text_file

__all__ = ["parse_spec", "shipped_specs", "SPEC_DIR"]

# A non-editable install maps the repository's top-level specs/ into the package as archspec/specs
# (see pyproject.toml); in a source checkout the package sits next to specs/.
_PACKAGE_ROOT = FsPath(__file__).resolve().parent.parent  # archspec/ (this file is archspec/spec/parsing.py)
_PACKAGE_SPECS = _PACKAGE_ROOT / "specs"
SPEC_DIR = _PACKAGE_SPECS if _PACKAGE_SPECS.is_dir() else _PACKAGE_ROOT.parent / "specs"


def _models_of(annotation: Any) -> list[type[StrictModel]]:
    """The spec models an annotation can hold (``StageSpec | None`` -> [StageSpec]; the stem union -> its three)."""
    if isinstance(annotation, type) and issubclass(annotation, StrictModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) for m in _models_of(arg)]


def _fields_at(path: tuple) -> list[str]:
    """The keys valid in the mapping at ``path`` (list indices skipped), for 'did you mean' hints."""
    models: list[type[StrictModel]] = [ArchSpec]
    for part in path:
        if isinstance(part, int):
            continue
        models = [m for model in models if part in model.model_fields
                  for m in _models_of(model.model_fields[part].annotation)]
    return sorted({name for model in models for name in model.model_fields})


_HINTS = {
    "int_parsing": "use a whole number",
    "int_from_float": "use a whole number",
    "float_parsing": "use a number",
    "bool_parsing": "use true or false",
    "int_type": "use a whole number (no quotes, not true/false)",
    "float_type": "use a number (no quotes)",
    "bool_type": "use true or false",
    "string_type": "use text",
    "list_type": "use a list: [a, b] or '- a' lines",
    "missing": "this field is required",
    "literal_error": None,
    "union_tag_invalid": "stem kinds: patch, conv, conv_tokenizer, identity, resnet, maxxvit, mobilevit",
    "union_tag_not_found": "stem kinds: patch, conv, conv_tokenizer, identity, resnet, maxxvit, mobilevit",
    "stage_kind": "stage kinds: attention (the default), conv",
    "mixer_kind": "conv-stage mixer kinds: gpsa (T-CNN), attention (BoTNet)",
    "model_type": "write it as indented 'key: value' lines, or {key: value}",
    "model_attributes_type": "write it as indented 'key: value' lines, or {key: value}",
    "string_pattern_mismatch": "use only letters, digits, '_', '.' and '-'",
}

_STAGE_TAGS = {"attention_stage": StageSpec, "conv_stage": ConvStageSpec, "mbconv_stage": MBConvStageSpec,
               "mv2_stage": MV2StageSpec, "mobilevit_stage": MobileViTStageSpec,
               "conv_bn_act_stage": ConvBNActStageSpec}
# what each stage model is called in a hint about a key that belongs to another kind of stage
_STAGE_NAMES = {"attention_stage": "attention stages", "conv_stage": "ResNet conv stages (kind: conv, block: basic "
                "or bottleneck)", "mbconv_stage": "MBConv stages (kind: conv, block: mbconv)",
                "mv2_stage": "MV2 stages (kind: conv, block: mv2)",
                "mobilevit_stage": "MobileViT stages (kind: conv, block: mobilevit)",
                "conv_bn_act_stage": "conv + BN + act stages (kind: conv, block: conv_bn_act)"}

# Markers pydantic puts in an error location for validator wrappers and the branches of a union
# (``tokens.cls_token.int``); they are not spec keys.
_LOC_MARKERS = frozenset({
    "function-after", "function-before", "function-wrap", "function-plain", "tagged-union", "nullable",
    "default", "lax-or-strict", "json-or-python", "chain", "is-instance", "int", "float", "str", "bool",
    "none", "list", "tuple", "dict", "attention_stage", "conv_stage", "mbconv_stage", "mv2_stage", "mobilevit_stage",
    "conv_bn_act_stage", "gpsa_mixer", "attention_mixer", "downsample_node", "block_pool",
})


# the stem union's branch names (pydantic's tags), dropped after "stem" in a location
_STEM_BRANCHES = frozenset({"patch", "conv", "conv_tokenizer", "identity", "resnet", "maxxvit", "mobilevit"})


def _other_stage_hint(key: str, tag: str) -> str | None:
    """The hint for a key of another kind of stage (``stride_mode`` on an attention stage): which stages have it
    and how a stage of this kind does the same; None when no other stage kind has the key."""
    owners = [name for other, name in _STAGE_NAMES.items() if other != tag and key in _STAGE_TAGS[other].model_fields]
    if not owners:
        return None
    how = ("write kind: conv (and its block) for a conv stage; an attention stage downsamples with 'downsample:' "
           "(Swin, NAT) or 'shrink:' (LeViT)" if tag == "attention_stage"
           else f"keys of this stage: {', '.join(sorted(_STAGE_TAGS[tag].model_fields))}")
    return f"{key!r} is a key of {' and '.join(owners)}; {how}"


def _clean_loc(loc: tuple, keep_last: bool = False) -> tuple:
    """Drop pydantic's union/validator markers from an error location, keep field names and indices.

    ``keep_last`` keeps the last part whatever it is (the user's own key of an unknown-key error).
    """
    out = []
    for k, part in enumerate(loc):
        if isinstance(part, int) or (keep_last and k == len(loc) - 1):
            out.append(part)
        elif isinstance(part, str) and ("[" in part or part in _LOC_MARKERS):
            continue
        elif isinstance(part, str) and part in _STEM_BRANCHES and out and out[-1] == "stem":
            continue  # discriminated-union branch name
        else:
            out.append(part)
    return tuple(out)


def _problems_from_validation(exc: ValidationError) -> list[Problem]:
    errors = exc.errors(include_url=False)
    missing: dict[tuple, list[str]] = {}  # mapping path -> its missing required keys
    for err in errors:
        if err["type"] == "missing":
            loc = _clean_loc(err["loc"])
            if loc and isinstance(loc[-1], str):
                missing.setdefault(loc[:-1], []).append(loc[-1])
    problems: list[tuple[str, Problem]] = []
    explained: set[tuple] = set()  # missing keys explained by a misspelt key next to them
    for err in errors:
        kind = err["type"]
        path = _clean_loc(err["loc"], keep_last=kind == "extra_forbidden")
        message = err["msg"]
        hint = _HINTS.get(kind)
        ctx = err.get("ctx") or {}
        if kind == "extra_forbidden":
            key = str(path[-1]) if path else ""
            siblings = missing.get(path[:-1], [])
            close = difflib.get_close_matches(key, siblings, n=1, cutoff=0.5)
            if close:
                explained.add(path[:-1] + (close[0],))
                hint = f"did you mean {close[0]!r}? (a required key)"
            else:  # suggest only keys valid at this place (a mask has no 'stride')
                allowed = _fields_at(path[:-1])
                tag = next((part for part in err["loc"] if part in _STAGE_TAGS), None)
                if tag is not None and len(path) == 3 and path[0] == "stages":  # this kind of stage's own keys
                    allowed = sorted(_STAGE_TAGS[tag].model_fields)
                close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                hint = (f"did you mean {close[0]!r}?" if close else
                        f"keys allowed here: {', '.join(allowed)}" if allowed else "see `archspec schema`")
                if tag is not None and len(path) == 3 and path[0] == "stages" and not close:
                    hint = _other_stage_hint(key, tag) or hint
                if not close and len(path) == 1:
                    hint += "; top-level keys starting with 'x-' are ignored (for YAML anchors)"
            message = f"unknown key {key!r}"
        elif kind == "missing":
            key = path[-1] if path else ""
            if isinstance(key, int):
                message, hint = f"too few values: item [{key}] is missing", None
            else:
                message, hint = f"missing required key {key!r}", f"add '{key}: ...' here"
        elif kind in ("union_tag_invalid", "union_tag_not_found"):
            disc = str(ctx.get("discriminator", "kind")).strip("'")
            owner = str(path[-1]) if path else "value"
            path = path + (disc,)
            if kind == "union_tag_invalid":
                message = f"unknown {owner} {disc} {ctx.get('tag')!r}; expected one of {ctx.get('expected_tags')}"
            else:
                message = f"{owner} needs a '{disc}' key"
        elif kind in ("stage_kind", "mixer_kind"):
            path = path + ("kind",)
        elif kind in ("model_type", "model_attributes_type"):
            got = err.get("input")
            message = "expected a mapping of keys to values" + (f", got {got!r}" if not isinstance(got, list)
                                                                else ", got a list")
        elif kind.startswith("value_error"):
            message, _, hint_text = message.removeprefix("Value error, ").partition(_HINT)
            hint = hint_text or hint
        elif "input" in err:
            message = f"{message} (got {err['input']!r})" if not isinstance(err["input"], (dict, list)) else message
        problems.append((kind, Problem(path, message, hint)))
    return [p for kind, p in problems if not (kind == "missing" and p.path in explained)]


def _read_source(source: Any) -> tuple[Any, Locator | None, str | None]:
    """Return (data, locator, default name) for a path, YAML text, shipped spec name or dict.

    Which a ``str`` is follows :func:`archspec.spec.yaml_source.is_yaml_text`; an ``os.PathLike`` is always a path.
    """
    if isinstance(source, dict):
        return source, None, None
    if isinstance(source, str) and is_yaml_text(source):
        data, locator = load_yaml(source, "<string>")
        return data, locator, None
    if isinstance(source, (str, os.PathLike)):
        path = resolve_spec_path(os.fspath(source))
        text = read_text_file(path, os.fspath(source), "spec")
        data, locator = load_yaml(text, os.fspath(source))
        return data, locator, path.stem
    raise TypeError(f"load_spec takes a path, YAML text, a shipped spec name or a dict, not {type(source).__name__}")


def resolve_spec_path(name: str | os.PathLike) -> FsPath:
    """A spec file path, or the name of a shipped spec (``mait_tiny_sch2``) -> an existing path.

    An existing entry is returned whatever it is (:func:`archspec.spec.yaml_source.read_text_file` then
    refuses directories, FIFOs and devices); a missing one is looked up among the shipped specs.

    Raises:
        SpecError: no such file and no shipped spec of that name (lists the close names).
    """
    path = FsPath(name).expanduser()
    try:
        os.stat(path)
        return path
    except (OSError, ValueError):  # ValueError: a NUL byte in the name
        pass
    shipped = SPEC_DIR / (path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml")
    if shipped.is_file() and (path.parent == FsPath(".") or path.parent.name == "specs"):
        return shipped
    names = shipped_specs()
    close = difflib.get_close_matches(path.stem, names, n=3)
    hint = f"did you mean {', '.join(close)}?" if close else "`archspec list` shows the shipped specs"
    raise SpecError.single((), "no such file, and no shipped spec of that name", hint, os.fspath(name))


def shipped_specs() -> list[str]:
    """Names of the specs shipped in the package (``archspec list``)."""
    return sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))


def default_spec_name(stem: str) -> str:
    """The name of a spec file without a ``name:`` key, from its file stem (``my model.yaml`` -> ``my_model``).

    Other characters become ``_``, leading dots go (``...yaml`` has the stem ``..``) and an empty
    result falls back to ``model``, so the name always matches ``NAME_PATTERN``.  Raises nothing.
    """
    name = re.sub(r"[^A-Za-z0-9_.\-]", "_", stem).lstrip(".")[:NAME_MAX]
    return name or "model"


def parse_spec(source: str | os.PathLike | dict | ArchSpec) -> tuple[ArchSpec, Locator | None]:
    """Read and schema-validate a spec (types, ranges, unknown keys); no shape checks.

    The shape checks need the graph (step 2), so they run in :func:`archspec.ir.checked.load_spec`, which
    calls this first; that keeps the import order spec -> graph -> checked free of circles.

    Args:
        source: a path to a YAML file, the name of a shipped spec (``"mait_tiny_sch2"``), YAML text,
            a dict, or an :class:`ArchSpec` (returned as is).  An ``os.PathLike`` is always a path.  A
            ``str`` is YAML text when it contains a newline, is blank, or -- unless it names an existing
            file or ends in ``.yaml`` / ``.yml`` -- starts with ``{``, ``[`` or ``---`` or holds
            ``key: value`` (:func:`archspec.spec.yaml_source.is_yaml_text`); otherwise a path or a shipped name.

    Returns:
        ``(spec, locator)``: the spec and the YAML locator of its file or text (None for a dict or spec).

    Raises:
        SpecError: every schema problem, each with file, line, column and field path; for a file also
            a missing file, a directory, FIFO or device, a file over 1 MB, bytes that are not UTF-8.
        TypeError: ``source`` is none of the types above.
    """
    if isinstance(source, ArchSpec):
        return source, None
    data, locator, default_name = _read_source(source)
    if not isinstance(data, dict):
        raise SpecError.single((), f"a spec must be a mapping of keys to values, got a {type(data).__name__}",
                               "start from one of `archspec list`").located(locator)
    # Top-level x-... keys hold the user's YAML anchors (x-common: &common ...), as in Compose files.
    data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))}
    if default_name is not None and "name" not in data:
        data = {"name": default_spec_name(default_name), **data}
    try:
        return ArchSpec.model_validate(data), locator
    except ValidationError as exc:
        raise SpecError(_problems_from_validation(exc)).located(locator) from None
