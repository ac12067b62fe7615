"""The head-kind contract (:class:`HeadKind`) and the one registry of head kinds (torch-free).

A *head kind* is what a head of an attention layer may add to plain MHSA: ConViT's GPSA, a relative-position
bias, a MaiT mask, a Gaussian bias, BoTNet's relative logits.  Each kind is one module of this package holding
both halves: the torch-free rules (its spec model, shorthands, letter, parameters and MACs, tables, checks, the
path its heads take) and the torch side (the parameters and buffers it adds to a layer, the logit terms it
contributes, the fast kernel it lowers to), reached only when a layer is built
(:class:`~archspec.families.attention.kinds.layer_terms.KindTerms`).  A module describes its kind with one
:class:`HeadKind` and registers it on import (:func:`register_head_kind`), as timm's ``byobnet`` reaches its
blocks only through ``register_block``.

:data:`HEAD_KINDS` is the only list of kinds: :class:`~archspec.families.attention.heads.HeadSpec`'s fields, the
shorthands and table letters, the JSON Schema, the spec reference, the attention rules' counts and paths,
:class:`~archspec.families.attention.module.Attention`, and the kinds talking heads and BoTNet take
(:func:`hosted_by`) all read it.  The spec models are built from it once, when
:mod:`archspec.families.attention.heads` is first imported (:func:`seal_head_kinds`); a kind registered later
is refused, so register a plug-in kind before building or loading a spec.

The logit terms a head may carry (:attr:`HeadKind.terms`), with ``S = Q K^T * scale`` ``(B, H, N, N)``:

``bias``        an additive float per pair, ``S + b``                       SDPA takes it (float ``attn_mask``)
``block``       pairs whose logit is ``-inf``                               SDPA takes it (``-inf`` in the mask)
``zero``        pairs whose logit becomes ``0`` (MaiT's hard mask)           explicit logits
``scale``       a multiplier per pair (MaiT's soft mask)                     explicit logits
``positional``  the probabilities mixed with a positional attention (GPSA)  explicit, or the kind's own path

applied in that order (bias, then zero, scale, block; softmax; then the positional mix).
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["HeadKind", "ShorthandArgument", "PathContext", "HEAD_KINDS", "register_head_kind", "head_kind",
           "seal_head_kinds", "hosted_by", "path_owner", "TERMS", "SDPA_TERMS", "GENERIC_PATHS", "HOSTS",
           "RESERVED_SHORTHANDS", "RESERVED_LETTERS"]

#: the logit terms a head kind may contribute (module docstring)
TERMS = frozenset({"bias", "block", "zero", "scale", "positional"})
#: terms one SDPA call takes (a float ``attn_mask``): a head with only these runs on the generic ``sdpa`` path
SDPA_TERMS = frozenset({"bias", "block"})
#: the paths every layer has: ``sdpa`` (one SDPA call) and ``dense`` (the explicit-logits reference formula)
GENERIC_PATHS = frozenset({"sdpa", "dense"})
#: the layers that run head kinds: archspec's ``Attention`` in token stages (``attention``) and on a bottleneck's
#: pixel map in a conv stage (``pixel_attention``), CaiT's talking heads, timm's ``BottleneckAttn`` (BoTNet's
#: relative logits), ``HaloAttn`` (HaloNet's halo) and ``MobileVitBlock`` (MobileViT's grid)
HOSTS = frozenset({"attention", "pixel_attention", "talking_heads", "bottleneck_attn", "halo_attn",
                   "mobilevit_block"})
#: shorthands and letters no kind may take: plain MHSA, and CaiT's class attention in the tables
RESERVED_SHORTHANDS = frozenset({"mhsa", "global"})
RESERVED_LETTERS = frozenset({"A", "C"})
#: names of HeadSpec itself a kind's field may not shadow
_HEADSPEC_NAMES = frozenset({"letter", "kinds", "is_plain"})


def _no_count(heads: Sequence, grid: tuple[int, int]) -> int:
    return 0


def _no_bytes(heads: Sequence, n_tokens: int, n_patches: int) -> int:
    return 0


def _no_problems(heads: Sequence, grid: tuple[int, int], n_prefix: int, where: tuple) -> list:
    return []


def _no_macs_change(key: tuple, grid: tuple[int, int], n_prefix: int, qk_dim: int, v_dim: int) -> int:
    return 0


def _no_caches(heads: Sequence, paths: frozenset[str], n_tokens: int, n_patches: int) -> int:
    return 0


def _every_pair(spec: Any, grid: tuple[int, int], n_prefix: int) -> int | None:
    return None


@dataclass(frozen=True)
class PathContext:
    """What a kind's path rule sees of a head and its layer: ``terms``, the logit terms of the whole head (every kind
    it composes: :data:`TERMS`), and ``kinds``, those kinds' fields (a kind's own kernel usually takes a head only when
    it is the head's one kind); the layer's token ``grid`` ``(rows, cols)`` and ``n_prefix`` tokens; ``attn_impl``
    (``auto``, ``fast``, ``flex``; ``dense`` only for a kind that ``owns_reference``: the others take no path
    there); ``compiled``, whether ``torch.compile`` is tracing the layer (the plan fixed into the graph)."""

    terms: frozenset[str]
    kinds: frozenset[str]
    grid: tuple[int, int]
    n_prefix: int = 0
    attn_impl: str = "auto"
    compiled: bool = False

    @property
    def num_patches(self) -> int:
        """``rows * cols``."""
        return self.grid[0] * self.grid[1]


@dataclass(frozen=True)
class ShorthandArgument:
    """The text a kind's YAML shorthand may carry after a colon, ``mask:3x5``: it sets the spec field ``field``.

    ``pattern``: a regular expression of that text (the JSON Schema's, capture groups dropped there); ``noun``,
    ``example`` and ``meaning`` word the messages and the reference (``"a window"``, ``"mask:3x5"``, ``"a hard mask
    with a 3x5 window"``).
    """

    field: str
    pattern: str
    noun: str
    example: str
    meaning: str


@dataclass(frozen=True)
class HeadKind:
    """One head kind: everything archspec knows of it, the torch side included (built on first use).

    Rules (torch-free), with ``heads`` a layer's :class:`~archspec.families.attention.heads.HeadSpec` list, ``grid``
    its ``(rows, cols)`` token grid, ``spec`` one head's instance of :attr:`spec`:

    * ``field``: the HeadSpec field (an identifier); ``spec``: its pydantic model (a ``StrictModel``);
      ``description``: the field's description (schema, reference).
    * ``shorthands``: YAML name -> the HeadSpec mapping it expands to; ``legend``: table letter -> its meaning;
      ``letter(spec) -> str``: a head's letters (they compose in registry order, ``PM``).
    * ``terms(spec) -> frozenset[str]``: the logit terms the head carries (:data:`TERMS`), which decide its path
      and its activation memory.
    * ``params(heads, grid)``, ``macs(heads, grid)``: what the kind adds to a layer (MACs per image);
      ``tables(heads, n_tokens, n_patches)``: bytes of its constant buffers; ``caches(heads, paths, n_tokens,
      n_patches)``: bytes of its eval-mode caches when the layer's heads take ``paths`` (path names).
    * ``problems(heads, grid, n_prefix, where)``: ``(path, message, hint)`` of each shape problem;
      ``check_heads(heads)``: a parse-time check of one layer's heads list (raises ``ValueError``), or None.
    * ``no_weight_decay``: parameter leaf names an optimizer must not decay; ``resampled_tables``: leaf name ->
      table kind of learned tables resampled when the grid changes.
    * ``hosts``: the layers that take the kind (:data:`HOSTS`; default: archspec's ``Attention`` in token stages and
      on a bottleneck's pixels).
    * ``at_layer(spec, layer) -> spec``: the head as the stage-local block ``layer`` runs it, where the kind's spec
      says something per layer (Swin's ``shift: alternate``: shifted in every odd block); applied when a stage's
      layers are resolved (:meth:`archspec.spec.ArchSpec.layer_plans`), or None.
    * ``at_other_resolution(spec) -> spec``: the head of a spec moved to another input size
      (:func:`archspec.ir.checked.with_resolution`, timm's ``img_size=``), or None (unchanged).
    * ``shorthand_argument``: what ``name:text`` sets, or None (then ``argument_hint`` helps a user who tried).
    * ``schema_alternatives``: spec field -> JSON Schema alternatives the loader also accepts for that
      ``[a, b]`` pair field (``window: 3`` or ``'3x5'``).
    * ``hashed_when_unused``: whether a head without the kind hashes its ``None`` field into stored digests; True
      only for the kinds older than the stored digests, so that a new kind leaves them unchanged.
    * ``paths``: the names of the fast paths the kind owns; ``path(spec, context) -> key | None``: the path of a head
      of this kind (a hashable key whose first item is one of ``paths``; ``context``: a :class:`PathContext`), None to
      leave it to the generic ``sdpa`` / ``dense`` paths or another kind -- a fast path chosen at construction, by
      the kind's own rule of when it pays; ``path_macs(key, grid, n_prefix, qk_dim, v_dim)``:
      the MACs one head executes on one of its paths minus the dense products ``N^2 (qk_dim + v_dim)`` (the papers'
      count unless a kind states fewer ``pairs``); ``additive_mask_paths``: its paths that read
      the layer's additive (bias + ``-inf``) mask, cached in eval mode; ``standalone_paths``: its paths that read
      none of the layer's composed terms (position bias, additive mask, logit terms: the kernel computes its heads
      from q, k, v and the kind's own parameters), so a layer whose heads all take such paths builds and caches
      none of them; ``path_memory(key, grid, n_prefix, qk_dim, v_dim) -> (alive, saved)``: the elements one head
      keeps alive at its peak and saves for backward on one of the kind's paths, in place of the ``(N, N)`` logit
      phases of the generic paths, or None; ``path_logits(key, grid, n_prefix)``: elements of one head's logit
      matrix on the kind's path where the generic phases apply to fewer logits (Swin's windows), None: ``N^2``.
    * ``pairs(spec, grid, n_prefix) -> int | None``: the (query, key) pairs the papers count for a head of the kind
      (its ``Q K^T`` and ``A V`` each cost that times the head dim: NAT's ``H W k^2``, Swin's ``H W M^2``), or None
      for every pair, ``N^2``.  A head composing several kinds counts the fewest any of them states.
    * ``owns_reference``: the kind's path rule also runs under ``attn_impl='dense'`` (and attention dropout in
      training): its exact reference is not the layer's ``N x N`` formula (Swin's padding keys), so its heads run on
      its path there too, where ``KindTerms.path_forward`` runs the reference (``layer.uses_dense_reference()``).

    Torch side: ``layer_terms``, a :class:`~archspec.families.attention.kinds.layer_terms.KindTerms` subclass
    built per layer (None: no archspec layer runs the kind), and ``layer_methods``, a mixin of public methods
    the kind adds to ``Attention`` (``mask_alpha()``), or None.
    """

    field: str
    spec: type
    description: str
    shorthands: Mapping[str, Mapping[str, Any]]
    legend: Mapping[str, str]
    letter: Callable[[Any], str]
    terms: Callable[[Any], frozenset[str]]
    params: Callable[[Sequence, tuple[int, int]], int] = _no_count
    macs: Callable[[Sequence, tuple[int, int]], int] = _no_count
    tables: Callable[[Sequence, int, int], int] = _no_bytes
    caches: Callable[[Sequence, frozenset[str], int, int], int] = _no_caches
    problems: Callable[[Sequence, tuple[int, int], int, tuple], list] = _no_problems
    check_heads: Callable[[Sequence], None] | None = None
    no_weight_decay: frozenset[str] = frozenset()
    resampled_tables: Mapping[str, str] = field(default_factory=dict)
    hosts: frozenset[str] = frozenset({"attention", "pixel_attention"})
    at_layer: Callable[[Any, int], Any] | None = None
    at_other_resolution: Callable[[Any], Any] | None = None
    shorthand_argument: ShorthandArgument | None = None
    argument_hint: str = ""
    schema_alternatives: Mapping[str, tuple[dict, ...]] = field(default_factory=dict)
    hashed_when_unused: bool = False
    paths: frozenset[str] = frozenset()
    path: Callable[[Any, PathContext], tuple | None] | None = None
    path_macs: Callable[[tuple, tuple[int, int], int, int, int], int] = _no_macs_change
    additive_mask_paths: frozenset[str] = frozenset()
    standalone_paths: frozenset[str] = frozenset()
    path_memory: Callable[[tuple, tuple[int, int], int, int, int], tuple[int, int]] | None = None
    path_logits: Callable[[tuple, tuple[int, int], int], int] | None = None
    pairs: Callable[[Any, tuple[int, int], int], int | None] = _every_pair
    owns_reference: bool = False
    layer_terms: type | None = None
    layer_methods: type | None = None


_REGISTRY: dict[str, HeadKind] = {}
#: field -> kind, in registration order: the order the letters compose in (``PM``, ``LM``) and HeadSpec's fields
HEAD_KINDS: Mapping[str, HeadKind] = MappingProxyType(_REGISTRY)
_SEALED = False  # set by seal_head_kinds, once the spec models are built from the registry


def _clashes(kind: HeadKind) -> list[str]:
    """What of ``kind`` another registered kind (or HeadSpec itself) already has."""
    out = []
    if not kind.field.isidentifier() or keyword.iskeyword(kind.field) or kind.field.startswith("_"):
        out.append(f"its field {kind.field!r} is not a public Python identifier")
    if kind.field in _REGISTRY or kind.field in _HEADSPEC_NAMES:
        out.append(f"the field {kind.field!r} is taken")
    shorthands = RESERVED_SHORTHANDS.union(*(k.shorthands for k in _REGISTRY.values()))
    letters = RESERVED_LETTERS.union(*(k.legend for k in _REGISTRY.values()))
    paths = GENERIC_PATHS.union(*(k.paths for k in _REGISTRY.values()))
    out += [f"the shorthand {name!r} is taken" for name in kind.shorthands if name in shorthands]
    out += [f"the letter {letter!r} is taken" for letter in kind.legend if letter in letters]
    out += [f"the path {name!r} is taken" for name in kind.paths if name in paths]
    out += [f"unknown host {host!r} (hosts: {', '.join(sorted(HOSTS))})" for host in kind.hosts - HOSTS]
    if kind.paths and kind.path is None:
        out.append("it names paths but has no path rule")
    if not kind.standalone_paths <= kind.paths:
        out.append(f"standalone paths {sorted(kind.standalone_paths - kind.paths)} are not among its paths")
    return out


def register_head_kind(kind: HeadKind) -> HeadKind:
    """Add ``kind`` to :data:`HEAD_KINDS` (after the kinds registered before it); returns it.

    Raises:
        TypeError: ``kind`` is not a :class:`HeadKind`.
        ValueError: its field, a shorthand, a letter or a path name is taken, or it names an unknown host.
        RuntimeError: the spec models were already built from the registry (:func:`seal_head_kinds`).
    """
    if not isinstance(kind, HeadKind):
        raise TypeError(f"register_head_kind takes a HeadKind, got {type(kind).__name__}")
    if _SEALED:
        raise RuntimeError(f"head kind {kind.field!r} registered after the spec models were built from the registry "
                           "(archspec.families.attention.heads was imported): register head kinds before building "
                           "or loading a spec")
    clashes = _clashes(kind)
    if clashes:
        raise ValueError(f"cannot register head kind {kind.field!r}: {'; '.join(clashes)}")
    _REGISTRY[kind.field] = kind
    return kind


def head_kind(name: str) -> HeadKind:
    """The registered kind whose HeadSpec field is ``name``.

    Raises:
        KeyError: no such kind (the message lists the registered ones).
    """
    if name not in _REGISTRY:
        raise KeyError(f"no head kind {name!r}; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def seal_head_kinds() -> tuple[HeadKind, ...]:
    """The registered kinds, in order, from now on fixed: :mod:`~archspec.families.attention.heads` calls this as
    it builds HeadSpec, after which :func:`register_head_kind` refuses.  Raises nothing."""
    global _SEALED
    _SEALED = True
    return tuple(_REGISTRY.values())


def hosted_by(host: str) -> frozenset[str]:
    """The fields of the kinds layer ``host`` (one of :data:`HOSTS`) takes.  Raises nothing."""
    return frozenset(k.field for k in _REGISTRY.values() if host in k.hosts)


def path_owner(name: str) -> HeadKind | None:
    """The kind that owns the path called ``name`` (``"window"``), or None for a generic path.  Raises nothing."""
    return next((k for k in _REGISTRY.values() if name in k.paths), None)
