"""The head kinds of the attention family, one module each, and their registry (torch-free to import).

Each module here is one kind, both halves (:mod:`.registry` states the contract, :mod:`.layer_terms` the torch
half's hooks): :mod:`.gpsa` (ConViT's gated positional self-attention), :mod:`.rel_bias` (LeViT's and CMHSA's
relative-position biases), :mod:`.mask` (MaiT's masks), :mod:`.gauss_mask` (GMM-Mask's Gaussian bias),
:mod:`.rel_logits` (BoTNet's relative logits), :mod:`.halo` (HaloNet's), :mod:`.neighborhood` (NAT's and
DiNAT's neighbourhood attention), :mod:`.window` (Swin's windows), :mod:`.grid` (MobileViT's pixels of equal
offset).  A module registers its kind when it is imported, so the import line below is the list of built-in
kinds, in the order their letters compose; a new kind is a module here and its name on that line
(``docs/contributing.md``, "Adding a head kind").
"""

from __future__ import annotations

from .layer_terms import KindTerms
from .registry import (
    GENERIC_PATHS,
    HEAD_KINDS,
    HOSTS,
    SDPA_TERMS,
    TERMS,
    HeadKind,
    PathContext,
    ShorthandArgument,
    head_kind,
    hosted_by,
    path_owner,
    register_head_kind,
    seal_head_kinds,
)

# The built-in kinds: each registers itself on import, so this line is their list, in the order their letters
# compose (a new kind adds its module's name here).
# isort: off
from . import gpsa, rel_bias, mask, gauss_mask, rel_logits, halo, neighborhood, window, grid  # noqa: F401
# isort: on

__all__ = ["HeadKind", "ShorthandArgument", "PathContext", "KindTerms", "HEAD_KINDS", "register_head_kind", "head_kind",
           "seal_head_kinds", "hosted_by", "path_owner", "TERMS", "SDPA_TERMS", "GENERIC_PATHS", "HOSTS"]
