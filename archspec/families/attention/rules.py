"""The attention family's torch-free rules: shape, checks, parameters, MACs (papers' and executed), memory.

:class:`~archspec.families.attention.module.Attention` -- the per-head composable attention of every
ViT/DeiT/ConViT/MaiT/LeViT/CMHSA block -- is described by an :class:`AttentionShape`, the typed shape an IR
node carries and :func:`archspec.families.attention.module.build` turns into the module.  What each head
kind adds (parameters, MACs, buffers, checks, its paths) is in its own module of :mod:`.kinds`, reached only
through the registry (:data:`~archspec.families.attention.kinds.HEAD_KINDS`); this module composes the kinds with
the projections, the attention products and the kernel-dependent parts: which path each head takes under
``attn_impl='auto'`` (:func:`head_path`), what that path executes (:func:`executed_macs`), and the activation
memory of the logit phase (:func:`memory`), read from the logit terms each head carries (:func:`head_terms`).

MAC convention (the papers' "FLOPs"): every linear counts ``tokens x d_in x d_out``; attention counts
``Q K^T`` and ``A V`` as ``N^2 (qk_dim + v_dim)`` per head, or the fewer (query, key) pairs a head's kind states
(:func:`head_pairs`: NAT's ``H W k^2``) times ``qk_dim + v_dim``; softmax, norms, biases and masks count 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from archspec._util.memory import F32, NodeMemory
from archspec._util.pydantic_base import HINT

from .heads import KINDS, HeadSpec
from .kinds import SDPA_TERMS, PathContext, path_owner

__all__ = ["AttentionShape", "AttnDims", "head_dims", "check_value_dim", "counts", "memory", "executed_macs",
           "problems", "head_problems", "batchnorm_channels", "label", "head_terms", "head_pairs",
           "attention_macs_change", "head_path", "buffers", "caches", "NO_WEIGHT_DECAY", "RESAMPLED_TABLES",
           "logit_elements"]

#: parameter leaf names an optimizer must not decay (every head kind's)
NO_WEIGHT_DECAY = frozenset().union(*(kind.no_weight_decay for kind in KINDS))
#: learned tables resampled on a grid change: leaf name -> table kind (every head kind's)
RESAMPLED_TABLES = {leaf: table for kind in KINDS for leaf, table in kind.resampled_tables.items()}


@dataclass(frozen=True)
class AttnDims:
    """Per-head dims of a stage's attention: q/k dim and value dim."""

    qk_dim: int
    v_dim: int


def head_dims(dim: int, heads: int, head_dim: int | None = None, key_dim: int | None = None,
              attn_ratio: float | None = None) -> AttnDims:
    """Resolve head dim, key dim and attn ratio into per-head q/k and value dims.

    q/k dim = ``key_dim`` or ``head_dim`` or ``dim / heads``; value dim = ``attn_ratio * q/k dim`` when
    ``attn_ratio`` is given (LeViT), else ``head_dim`` or ``dim / heads``.  Raises nothing.
    """
    base = head_dim if head_dim is not None else dim // heads
    qk = key_dim if key_dim is not None else base
    v = int(attn_ratio * qk) if attn_ratio is not None else base
    return AttnDims(qk_dim=qk, v_dim=v)


def check_value_dim(attn_ratio: float, key_dim: int, what: str, hint_tail: str = "") -> float:
    """LeViT's value dim ``int(attn_ratio * key_dim)`` must be at least 1 (0 would build an empty tensor); a
    pydantic validator's check (its message carries a hint after :data:`archspec._util.pydantic_base.HINT`).

    Raises:
        ValueError: the value dim rounds to 0.
    """
    if int(attn_ratio * key_dim) < 1:
        raise ValueError(f"{what} attn_ratio * key_dim = {attn_ratio:g} * {key_dim} rounds to 0"
                         f"{HINT}use attn_ratio >= {1 / key_dim:g}{hint_tail}")
    return attn_ratio


@dataclass(frozen=True)
class AttentionShape:
    """One attention token mixer: what the IR knows and :func:`~.module.build` needs.

    ``grid`` is the token grid of the block; with ``pad_tokens`` (CMHSA App. A.2) the attention runs on the
    grid padded by that many rings of zero tokens (:attr:`attention_grid`).  ``norm``: ``'layernorm'`` (plain
    linears, ViT family) or ``'batchnorm'`` (LeViT ``LinearNorm``, ``act`` before the projection).
    """

    dim: int
    heads: tuple[HeadSpec, ...]
    grid: tuple[int, int]
    n_prefix: int
    dims: AttnDims
    qkv_bias: bool
    norm: str = "layernorm"
    act: str | None = None
    pad_tokens: int = 0
    out_dim: int | None = None
    init: str = "trunc_normal"

    @property
    def width_out(self) -> int:
        """The output projection's width: ``out_dim`` (CoAtNet's downsampling block), else ``dim``."""
        return self.dim if self.out_dim is None else self.out_dim

    @property
    def attention_grid(self) -> tuple[int, int]:
        """The grid the attention runs on: ``grid`` padded by ``pad_tokens`` rings."""
        return (self.grid[0] + 2 * self.pad_tokens, self.grid[1] + 2 * self.pad_tokens)

    @property
    def n_tokens(self) -> int:
        """Tokens ``N`` the attention sees: prefix plus the (padded) grid."""
        rows, cols = self.attention_grid
        return self.n_prefix + rows * cols


def label(shape: AttentionShape) -> tuple[str, str]:
    """``(kind, heads)`` of the analysis table: ``levit`` or ``attn``, and the head letters (``"M M A"``)."""
    return ("levit" if shape.norm == "batchnorm" else "attn"), " ".join(h.letter for h in shape.heads)


# ----------------------------------------------------------------------------------- checks
def problems(shape: AttentionShape, where: tuple) -> list[tuple[tuple, str, str]]:
    """``(path, message, hint)`` of every shape problem of one layer (:func:`head_problems`).  ``where`` is the
    spec path the heads came from."""
    return head_problems(shape.heads, shape.grid, shape.n_prefix, shape.pad_tokens, where)


def head_problems(heads: Sequence[HeadSpec], grid: tuple[int, int], n_prefix: int, pad_tokens: int,
                  where: tuple) -> list[tuple[tuple, str, str]]:
    """Each head kind's checks of a layer's heads on ``grid`` with ``n_prefix`` prefix tokens (also for CaiT's
    talking heads, whose heads are the same kinds), plus zero-padding tokens next to a class token."""
    out = []
    if pad_tokens and n_prefix:
        out.append((where, "zero-padding tokens (mixer.pad_tokens) need a pure token grid, but a class/distillation "
                    "token is present", "use tokens.cls_token: none with head.pool: mean"))
    for kind in KINDS:
        out += kind.problems(heads, grid, n_prefix, where)
    return out


def head_terms(head: HeadSpec) -> frozenset[str]:
    """The logit terms a head carries, every kind's (:data:`~archspec.families.attention.kinds.TERMS`: ``bias``,
    ``block``, ``zero``, ``scale``, ``positional``); empty for plain MHSA.  Raises nothing."""
    return frozenset().union(*(kind.terms(getattr(head, kind.field)) for kind in KINDS
                               if getattr(head, kind.field) is not None))


def head_pairs(head: HeadSpec, grid: tuple[int, int], n_prefix: int = 0) -> int:
    """(query, key) pairs the papers count for one head on ``grid`` with ``n_prefix`` prefix tokens: the fewest any
    of its kinds states (``HeadKind.pairs``: a neighbourhood head's ``H W k^2``), else every pair, ``N^2``.  Raises
    nothing."""
    n = n_prefix + grid[0] * grid[1]
    stated = [kind.pairs(getattr(head, kind.field), tuple(grid), n_prefix) for kind in KINDS
              if getattr(head, kind.field) is not None]
    return min([n * n] + [p for p in stated if p is not None])


# ----------------------------------------------------------------------------------- counts
def _linear(n_tokens: int, d_in: int, d_out: int, bias: bool, bn: bool = False) -> tuple[int, int]:
    """(params, MACs) of a linear (optionally followed by BatchNorm: 2 d_out params) over N tokens."""
    params = d_in * d_out + (d_out if bias else 0) + (2 * d_out if bn else 0)
    return params, n_tokens * d_in * d_out


def counts(shape: AttentionShape) -> tuple[int, int]:
    """(params, MACs per image) of one :class:`~.module.Attention` on ``N = n_prefix + rows * cols`` tokens.

    Projections: layernorm family ``qk`` + ``v`` (bias if ``qkv_bias``) and ``proj`` (bias); batchnorm family one
    ``qkv`` and one ``proj`` ``LinearNorm`` (no bias, 2 BatchNorm parameters per channel).  Products
    ``N^2 (qk_dim + v_dim)`` per head, or the head's pairs (:func:`head_pairs`) times ``qk_dim + v_dim``.  Plus
    what each head kind adds (``HeadKind.params`` / ``HeadKind.macs``).
    """
    heads, dims, dim, n = shape.heads, shape.dims, shape.dim, shape.n_tokens
    qk_out, v_out = 2 * len(heads) * dims.qk_dim, len(heads) * dims.v_dim
    if shape.norm == "batchnorm":  # LeViT: one qkv LinearNorm, no bias; proj LinearNorm
        p_qkv, m_qkv = _linear(n, dim, qk_out + v_out, bias=False, bn=True)
        p_proj, m_proj = _linear(n, v_out, dim, bias=False, bn=True)
    else:
        p_qk, m_qk = _linear(n, dim, qk_out, shape.qkv_bias)
        p_v, m_v = _linear(n, dim, v_out, shape.qkv_bias)
        p_qkv, m_qkv = p_qk + p_v, m_qk + m_v
        p_proj, m_proj = _linear(n, v_out, shape.width_out, bias=True)
    grid = shape.attention_grid
    params = p_qkv + p_proj + sum(kind.params(heads, grid) for kind in KINDS)
    pairs = sum(head_pairs(head, grid, shape.n_prefix) for head in heads)
    macs = m_qkv + m_proj + pairs * (dims.qk_dim + dims.v_dim) + sum(kind.macs(heads, grid) for kind in KINDS)
    return params, macs


def batchnorm_channels(shape: AttentionShape) -> int:
    """BatchNorm channels ``model.fuse()`` folds away (LeViT ``LinearNorm``: qkv and proj); 0 for layernorm."""
    if shape.norm != "batchnorm":
        return 0
    return len(shape.heads) * (2 * shape.dims.qk_dim + shape.dims.v_dim) + shape.dim


# ----------------------------------------------------------------------------------- paths and executed MACs
def head_path(head: HeadSpec, grid: tuple[int, int], attn_impl: str = "auto", compiled: bool = False,
              n_prefix: int = 0) -> tuple:
    """The path one head takes in :class:`~.module.Attention` under ``attn_impl`` (not ``'dense'``), as a
    hashable group key: the first of the head's kinds (registry order) whose rule claims it (``("gpsa",)``
    ``(1 - g) SDPA + g P V``; ``("window", (rows, cols))`` the linear-time hard-mask kernel; ``("hard",)`` hard
    masks on explicit ``N x N`` logits; ``("flex",)``), else ``("sdpa",)`` when every logit term it carries is one
    SDPA takes (plain, biased or strict heads, in one SDPA call), else ``("dense",)``, the explicit reference
    formula.

    ``grid``: the layer's (attention) token grid, ``n_prefix`` its prefix tokens; ``compiled``: the plan while
    ``torch.compile`` traces the layer (a kind may choose another path then: MaiT's linear-time kernel, which
    Inductor fuses).  Under ``attn_impl='dense'`` a head takes ``("dense",)``, the layer's reference, unless one of
    its kinds ``owns_reference`` (Swin's windows, whose padding keys the ``N x N`` formula has no room for): then
    that kind's path, where it runs its own reference.  Raises nothing.
    """
    context = PathContext(head_terms(head), head.kinds, tuple(grid), n_prefix, attn_impl, compiled)
    dense = attn_impl == "dense"
    for kind in KINDS:
        spec = getattr(head, kind.field)
        if spec is not None and kind.path is not None and (kind.owns_reference or not dense):
            key = kind.path(spec, context)
            if key is not None:
                return key
    if dense:
        return ("dense",)
    return ("sdpa",) if context.terms <= SDPA_TERMS else ("dense",)


def attention_macs_change(heads: Sequence[HeadSpec], qk_dim: int, v_dim: int, grid: tuple[int, int],
                          n_prefix: int) -> int:
    """Executed minus papers' MACs per image of one attention layer under ``attn_impl='auto'``, summed over its
    heads: the dense products ``N^2 (qk_dim + v_dim)`` minus the papers' (:func:`head_pairs`; 0 unless a kind states
    fewer pairs), plus what the kind owning the head's path states it executes beyond the dense products
    (:func:`head_path`, ``HeadKind.path_macs``: MaiT's linear-time heads save ``N^2 (qk_dim + v_dim) -
    window_attention_macs``, GPSA's path adds its ``P @ v``, ``N^2 v_dim``, the neighbourhood kernel runs its tiles'
    pairs)."""
    n = n_prefix + grid[0] * grid[1]
    change = 0
    for head in heads:
        change += (n * n - head_pairs(head, grid, n_prefix)) * (qk_dim + v_dim)
        key = head_path(head, grid, n_prefix=n_prefix)
        owner = path_owner(key[0])
        if owner is not None:
            change += owner.path_macs(key, grid, n_prefix, qk_dim, v_dim)
    return change


def executed_macs(shape: AttentionShape) -> int:
    """MACs per image as the module executes them under ``attn_impl='auto'`` (:func:`attention_macs_change`)."""
    return counts(shape)[1] + attention_macs_change(shape.heads, shape.dims.qk_dim, shape.dims.v_dim,
                                                    shape.attention_grid, shape.n_prefix)


# ----------------------------------------------------------------------------------- memory
def logit_elements(head: HeadSpec, grid: tuple[int, int], n_prefix: int) -> int:
    """Elements of one head's logit matrix on its path under ``attn_impl='auto'``: what the kind owning the path
    states (``HeadKind.path_logits``: Swin's windows, ``n_windows (w_h w_w)^2``), else ``N^2``.  Raises nothing."""
    key = head_path(head, grid, n_prefix=n_prefix)
    owner = path_owner(key[0])
    if owner is not None and owner.path_logits is not None:
        return owner.path_logits(key, grid, n_prefix)
    n = n_prefix + grid[0] * grid[1]
    return n * n


def _logit_terms(heads: Sequence[HeadSpec], n: int, n_patches: int, grid: tuple[int, int]) -> tuple[int, int, int]:
    """(extra copies of the logits alive in the logit phase, copies saved, in elements; positional-attention
    elements ``n_positional N_p^2``), from the logit terms the heads carry (:func:`head_terms`); the logits are
    ``N^2`` per head but on a path that keeps fewer (:func:`logit_elements`: Swin's windows)."""
    per_head = [head_terms(h) for h in heads]
    terms = frozenset().union(*per_head)
    n_positional = sum("positional" in t for t in per_head)
    soft, hard, strict = "scale" in terms, "zero" in terms, "block" in terms
    bias = "bias" in terms
    n_heads = len(heads)
    logits = sum(logit_elements(h, grid, n - n_patches) for h in heads)
    if n_positional or hard or soft:  # explicit softmax path: matmul, scale, bias, mask product, softmax
        alive = 2 * logits + (logits if soft else 0) + (logits if bias else 0) + (logits // 4 if strict else 0)
        saved = (3 + bias + hard + soft + strict) * logits
    elif bias or strict:  # SDPA with a float mask: the mask (built twice for strict) and the kernel's logits
        alive = logits * (1 + bias) + ((2 * logits + logits // 4) if strict else 0)
        saved = 2 * logits + alive
    else:  # SDPA without a mask: the flash kernel keeps no (N, N) tensor; count one to stay conservative
        alive, saved = logits, 2 * logits
    g = n_positional * n_patches * n_patches
    if n_positional:  # positional scores, their softmax, the gated mix and its normalisation (ConViT eq. 5-7)
        alive = max(alive, logits + 6 * g + (logits if n_positional < n_heads else 0))
        saved += 6 * g + (logits if n_positional < n_heads else 0)
    return alive, saved, g


def buffers(shape: AttentionShape) -> int:
    """Bytes of a layer's non-parameter tensors after its first eval forward under ``attn_impl='auto'``: each head
    kind's tables (``HeadKind.tables``) and the eval-mode caches of :class:`~.module.Attention` (:func:`caches`)."""
    n = shape.n_tokens
    return sum(kind.tables(shape.heads, n, n - shape.n_prefix) for kind in KINDS) + caches(shape)


def caches(shape: AttentionShape) -> int:
    """Bytes of the constants :class:`~.module.Attention` caches in its first eval forward (``attn_impl='auto'``),
    from the logit terms its heads carry and the paths they take (:func:`head_path`): the ``(H, N, N)`` float32
    position bias (a head with a ``bias`` term, on a path other than a kind's ``standalone_paths``), the float32
    ``(H, N, N)`` additive mask of the paths that read it (an SDPA group with a head with terms, the kinds'
    ``additive_mask_paths``, when such a head has a ``bias`` or ``block`` term), each kind's own
    caches (``HeadKind.caches``: MaiT's hard-mask term, GPSA's positional attention), and the stacked ``qk`` + ``v``
    weights of the layernorm family's single projection GEMM."""
    heads, n, dims = shape.heads, shape.n_tokens, shape.dims
    n_patches, h = n - shape.n_prefix, len(heads)
    keys = [head_path(head, shape.attention_grid, n_prefix=shape.n_prefix) for head in heads]
    paths = frozenset(key[0] for key in keys)
    standalone = set().union(*(kind.standalone_paths for kind in KINDS))
    # the terms of the heads on paths that read the layer's terms (a standalone path's heads keep theirs to
    # themselves: Swin's windows, NAT's tiles), and whether an SDPA group has a head with terms (Attention's
    # _group_forward gives an SDPA group of heads without terms no mask)
    terms = frozenset().union(*(head_terms(head) for key, head in zip(keys, heads) if key[0] not in standalone))
    sdpa_terms = any(key == ("sdpa",) and head_terms(head) for key, head in zip(keys, heads))
    reads_additive = set().union(*(kind.additive_mask_paths for kind in KINDS))
    total = F32 * h * n * n if "bias" in terms else 0
    total += F32 * h * n * n if terms & SDPA_TERMS and (sdpa_terms or paths & reads_additive) else 0
    total += sum(kind.caches(heads, paths, n, n_patches) for kind in KINDS)
    if shape.norm == "layernorm":
        total += F32 * h * (2 * dims.qk_dim + dims.v_dim) * (shape.dim + (1 if shape.qkv_bias else 0))
    return total


def _own_path_memory(shape: AttentionShape) -> tuple[list[HeadSpec], int, int]:
    """The heads whose logit phase is the generic ``(N, N)`` one, and the elements alive and saved of the others,
    those on a path whose kind states its memory (``HeadKind.path_memory``: the neighbourhood kernel's tiles)."""
    generic, alive, saved = [], 0, 0
    for head in shape.heads:
        key = head_path(head, shape.attention_grid, n_prefix=shape.n_prefix)
        owner = path_owner(key[0])
        if owner is None or owner.path_memory is None:
            generic.append(head)
            continue
        head_alive, head_saved = owner.path_memory(key, shape.attention_grid, shape.n_prefix, shape.dims.qk_dim,
                                                   shape.dims.v_dim)
        alive, saved = alive + head_alive, saved + head_saved
    return generic, alive, saved


def memory(shape: AttentionShape) -> NodeMemory:
    """Bytes (batch 1, float32) of the attention half of a block on ``N`` tokens, width ``dim``.

    Alive throughout: the block input, the norm output (layernorm family), q/k/v; then the largest of
    the q/k copies of the ``Q K^T`` matmul, the logit phase (see :func:`_logit_terms`; a head on a path whose kind
    states its memory, ``HeadKind.path_memory``, counts that instead of ``(N, N)`` logits), ``A V`` with
    its contiguous copy of v, and the output projection.  Rule: :mod:`archspec.ir.graph`.
    """
    heads, n, dim = shape.heads, shape.n_tokens, shape.dim
    n_patches = n - shape.n_prefix
    batchnorm = shape.norm == "batchnorm"
    n_heads = len(heads)
    x = n * dim
    x_out = n * shape.width_out
    qk, v, out = n * 2 * n_heads * shape.dims.qk_dim, n * n_heads * shape.dims.v_dim, n * n_heads * shape.dims.v_dim
    generic, own_alive, own_saved = _own_path_memory(shape)
    logits = sum(logit_elements(h, shape.attention_grid, shape.n_prefix) for h in generic)
    alive_logits, saved_logits, _ = _logit_terms(generic, n, n_patches, shape.attention_grid)
    alive_logits, saved_logits = alive_logits + own_alive, saved_logits + own_saved
    base = x + (0 if batchnorm else x) + qk + v
    phases = [
        qk + v if batchnorm else 0,  # LinearNorm: linear output and its BatchNorm output at once
        logits + qk,                 # Q K^T: contiguous copies of q and k
        alive_logits,
        logits + v + out,            # A V: probabilities, contiguous v, output
        3 * out + 2 * x_out,         # transpose copy, activation, projection (+ its BatchNorm)
    ]
    act = base + max(phases) + x_out  # + the residual sum
    saved = base - x + (qk + v if batchnorm else 0) + saved_logits + 3 * out + x + 2 * x_out
    return NodeMemory(act=F32 * act, saved=F32 * saved, buffers=buffers(shape))

