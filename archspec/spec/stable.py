"""A spec's dump for stored hashes (torch-free): what a field added to the language after a hash was stored leaves
out while the spec does not use it.

Build directories (``spec_digest``) and tabulated search rows (``architecture_key``) are keyed by hashes of a
spec's JSON dump; every field of the language, defaults included, is in that dump.  A field added later -- a head
kind, Swin's stem norm, a stage's ``downsample`` or ``init``, the head's final-norm placement -- would change every
stored hash although no stored spec uses it, and a shipped table's rows would no longer be found (the levit_small
and mait_small tables, every saved build).  :func:`stable_dump` drops such a field where it holds the value that
means "not used"; a spec that uses it hashes with it.  A new field of the spec language with a "not used" value goes in
:data:`ADDED_FIELDS` (``tests/test_gauss_mask.py::test_the_new_kind_keeps_stored_digests_and_keys`` fails until it
does).
"""

from __future__ import annotations

from typing import Any

from archspec.families.attention.heads import without_unused_new_kinds

__all__ = ["ADDED_FIELDS", "stable_dump", "without_unused_added_fields"]

#: ``part -> {field: the value that means the field is not used}`` for fields added after hashes were stored;
#: ``part`` is where the dict sits in a spec's dump: ``stem``, ``head``, or ``token_stage`` (an attention stage: a
#: conv stage's dump has ``kind: conv``, and its own ``downsample`` -- the shortcut -- is older than the hashes)
ADDED_FIELDS: dict[str, dict[str, Any]] = {
    "stem": {"norm": "none"},                # Swin's patch-embedding LayerNorm (issue 81)
    "head": {"norm": None},                  # the final norm before or after the mean pool (issue 81)
    "token_stage": {"downsample": None,      # Swin's patch merging / NAT's conv downsampler entering a stage (issue 81)
                    "init": "trunc_normal"},  # CoAtNet's xavier init of a token stage (issue 83)
}


def _pruned(part: dict, unused: dict[str, Any]) -> dict:
    return {k: v for k, v in part.items() if not (k in unused and v == unused[k])}


def without_unused_added_fields(data: dict) -> dict:
    """``data`` (a spec's JSON dump, or a dump with some keys excluded) without the :data:`ADDED_FIELDS` and head kinds
    (:func:`~archspec.families.attention.heads.without_unused_new_kinds`) it does not use.  Raises nothing."""
    data = without_unused_new_kinds(data)
    out = dict(data)
    for part in ("stem", "head"):
        if isinstance(out.get(part), dict):
            out[part] = _pruned(out[part], ADDED_FIELDS[part])
    if isinstance(out.get("stages"), list):
        out["stages"] = [_pruned(stage, ADDED_FIELDS["token_stage"])
                         if isinstance(stage, dict) and stage.get("kind") != "conv" else stage
                         for stage in out["stages"]]
    return out


def stable_dump(spec, **dump_options: Any) -> dict:
    """``spec.model_dump(mode="json", **dump_options)`` without the added fields and head kinds it does not use: what
    stored hashes are computed over.  Raises nothing."""
    return without_unused_added_fields(spec.model_dump(mode="json", **dump_options))
