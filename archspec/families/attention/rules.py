"""The attention family's torch-free rules: shape, checks, parameters, MACs (papers' and executed), memory.

:class:`~archspec.families.attention.module.Attention` -- the per-head composable attention of every
ViT/DeiT/ConViT/MaiT/LeViT/CMHSA block -- is described by an :class:`AttentionShape`, the typed shape an IR
node carries and :func:`archspec.families.attention.module.build` turns into the module.  What each head
kind adds (parameters, MACs, buffers, checks) is in its own file (:mod:`.gpsa`, :mod:`.rel_bias`,
:mod:`.mask`, :mod:`.gauss_mask`); this module composes them with the projections, the attention products and the
kernel-dependent parts: which path each head takes under ``attn_impl='auto'`` (:func:`head_path`), what that
path executes (:func:`executed_macs`), and the activation memory of the logit phase (:func:`memory`).

MAC convention (the papers' "FLOPs"): every linear counts ``tokens x d_in x d_out``; attention counts
``Q K^T`` and ``A V`` as ``N^2 (qk_dim + v_dim)`` per head; softmax, norms, biases and masks count 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from archspec._util.memory import BOOL, F32, NodeMemory
from archspec._util.pydantic_base import HINT

from . import rel_bias
from .heads import KINDS, HeadSpec

__all__ = ["AttentionShape", "AttnDims", "head_dims", "check_value_dim", "counts", "memory", "executed_macs",
           "problems", "has_bias",
           "head_problems", "batchnorm_channels", "label", "window_path_pays", "hard_head_on_window_path",
           "gpsa_head_on_sdpa_path", "window_attention_macs", "attention_macs_change", "head_path", "buffers", "caches",
           "NO_WEIGHT_DECAY",
           "RESAMPLED_TABLES"]

#: parameter leaf names an optimizer must not decay (every head kind's)
NO_WEIGHT_DECAY = frozenset().union(*(kind.NO_WEIGHT_DECAY for kind in KINDS))
#: learned tables resampled on a grid change: leaf name -> table kind (:func:`.rel_bias.table_grid`)
RESAMPLED_TABLES = rel_bias.RESAMPLED_TABLES


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


# ----------------------------------------------------------------------------------- counts
def _linear(n_tokens: int, d_in: int, d_out: int, bias: bool, bn: bool = False) -> tuple[int, int]:
    """(params, MACs) of a linear (optionally followed by BatchNorm: 2 d_out params) over N tokens."""
    params = d_in * d_out + (d_out if bias else 0) + (2 * d_out if bn else 0)
    return params, n_tokens * d_in * d_out


def counts(shape: AttentionShape) -> tuple[int, int]:
    """(params, MACs per image) of one :class:`~.module.Attention` on ``N = n_prefix + rows * cols`` tokens.

    Projections: layernorm family ``qk`` + ``v`` (bias if ``qkv_bias``) and ``proj`` (bias); batchnorm family one
    ``qkv`` and one ``proj`` ``LinearNorm`` (no bias, 2 BatchNorm parameters per channel).  Products
    ``N^2 H (qk_dim + v_dim)``.  Plus what each head kind adds (:mod:`.gpsa`, :mod:`.rel_bias`, :mod:`.mask`,
    :mod:`.gauss_mask`).
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
        p_proj, m_proj = _linear(n, v_out, dim, bias=True)
    grid = shape.attention_grid
    params = p_qkv + p_proj + sum(kind.params(heads, grid) for kind in KINDS)
    macs = (m_qkv + m_proj + n * n * len(heads) * (dims.qk_dim + dims.v_dim)
            + sum(kind.macs(heads, grid) for kind in KINDS))
    return params, macs


def batchnorm_channels(shape: AttentionShape) -> int:
    """BatchNorm channels ``model.fuse()`` folds away (LeViT ``LinearNorm``: qkv and proj); 0 for layernorm."""
    if shape.norm != "batchnorm":
        return 0
    return len(shape.heads) * (2 * shape.dims.qk_dim + shape.dims.v_dim) + shape.dim


# ----------------------------------------------------------------------------------- paths and executed MACs
# Crossover measured with timings like bench/speed.py --part kernel (2 heads of 64, batch 1, one CPU thread,
# torch 2.14): the eager window path overtakes the dense path at about 250 patches for a 3x3 window, 350 for 5x5.
_CROSSOVER_BASE_PATCHES = 200
_CROSSOVER_PATCHES_PER_WINDOW_CELL = 6


def window_path_pays(num_patches: int, window: tuple[int, int]) -> bool:
    """Whether the linear-time hard-mask path is expected to beat the dense path on CPU (``attn_impl='auto'``).

    Rule (our measurement): ``num_patches >= 200 + 6 * rows * cols`` (3x3: 254 patches, a 16x16 grid and up;
    5x5: 350).  Below it the window path's ~30 small ops cost more than the ``N^2`` work they save.
    """
    rows, cols = window
    return num_patches >= _CROSSOVER_BASE_PATCHES + _CROSSOVER_PATCHES_PER_WINDOW_CELL * rows * cols


def has_bias(head: HeadSpec) -> bool:
    """Whether a head adds a position bias to its logits: a relative bias table (:mod:`.rel_bias`) or a Gaussian
    bias (:mod:`.gauss_mask`).  Both join the layer's ``(H, N, N)`` position bias."""
    return head.rel_bias is not None or head.gauss_mask is not None


def hard_head_on_window_path(head: HeadSpec, num_patches: int) -> bool:
    """Whether a head runs linear-time under ``attn_impl='auto'``: a hard mask without GPSA or a position bias
    (:func:`has_bias`), on a grid past :func:`window_path_pays`."""
    head_mask = head.mask
    return (head_mask is not None and head_mask.mode == "hard" and head.gpsa is None and not has_bias(head)
            and window_path_pays(num_patches, tuple(head_mask.window)))


def gpsa_head_on_sdpa_path(head: HeadSpec) -> bool:
    """Whether a GPSA head runs as ``(1 - g) SDPA(q, k, v) + g (P @ v)`` (no hard/soft mask on its content)."""
    return head.gpsa is not None and (head.mask is None or head.mask.mode == "strict")


def head_path(head: HeadSpec, num_patches: int, attn_impl: str = "auto", compiled: bool = False) -> tuple:
    """The path one head takes in :class:`~.module.Attention` under ``attn_impl`` (not ``'dense'``), as a
    hashable group key: ``("gpsa",)`` ``(1 - g) SDPA + g P V``; ``("sdpa",)`` plain, biased or strict heads in
    one SDPA call; ``("flex",)``; ``("window", (rows, cols))`` the linear-time hard-mask kernel; ``("hard",)``
    hard masks on explicit ``N x N`` logits; ``("dense",)`` the explicit reference formula.

    ``compiled``: the plan while ``torch.compile`` traces the layer.  Inductor fuses the window path's ~30 small
    ops, after which it beats SDPA on every grid (the kernel alone, compiled: 14x14 grid + class token, 2 heads of
    64, one CPU thread, torch 2.14, 0.26-0.36 ms vs SDPA's 0.38-0.49 ms; the model-level ratio is
    ``bench/speed.py --compile``), so plain hard heads take it regardless of size.
    """
    mode = head.mask.mode if head.mask is not None else None
    if gpsa_head_on_sdpa_path(head):
        return ("gpsa",)
    if mode in (None, "strict"):
        return ("sdpa",)
    if attn_impl == "flex" and head.gpsa is None:
        return ("flex",)
    plain_hard = mode == "hard" and head.gpsa is None and not has_bias(head)
    if plain_hard and (attn_impl == "fast" or compiled or hard_head_on_window_path(head, num_patches)):
        return ("window", tuple(head.mask.window))
    return ("hard",) if plain_hard else ("dense",)


def window_attention_macs(grid: tuple[int, int], window: tuple[int, int], num_prefix_tokens: int,
                          qk_dim: int, v_dim: int) -> int:
    """MACs of one hard-masked head as the linear-time path executes it, per image.

    Patch queries: ``(prefix + rows * cols) * (qk_dim + v_dim)`` each (border windows counted full: the padded
    cells are computed, then discarded); prefix queries attend to all ``N`` tokens: ``N (qk_dim + v_dim)``
    each; plus ``v_dim`` per token for the global value sum.
    """
    n_patches = grid[0] * grid[1]
    n = num_prefix_tokens + n_patches
    per_patch_query = (num_prefix_tokens + window[0] * window[1]) * (qk_dim + v_dim)
    return n_patches * per_patch_query + num_prefix_tokens * n * (qk_dim + v_dim) + n * v_dim


def attention_macs_change(heads: Sequence[HeadSpec], qk_dim: int, v_dim: int, grid: tuple[int, int],
                          n_prefix: int) -> int:
    """Executed minus papers' MACs per image of one attention layer under ``attn_impl='auto'``.

    Each linear-time hard head: ``window_attention_macs - N^2 (qk_dim + v_dim)`` (negative); each GPSA head on the
    SDPA path: ``+ N^2 v_dim`` (its ``P @ v``).
    """
    n_patches = grid[0] * grid[1]
    n = n_prefix + n_patches
    change = 0
    for head in heads:
        if hard_head_on_window_path(head, n_patches):
            change += window_attention_macs(grid, tuple(head.mask.window), n_prefix, qk_dim, v_dim)
            change -= n * n * (qk_dim + v_dim)
        elif gpsa_head_on_sdpa_path(head):
            change += n * n * v_dim
    return change


def executed_macs(shape: AttentionShape) -> int:
    """MACs per image as the module executes them under ``attn_impl='auto'`` (:func:`attention_macs_change`)."""
    return counts(shape)[1] + attention_macs_change(shape.heads, shape.dims.qk_dim, shape.dims.v_dim,
                                                    shape.attention_grid, shape.n_prefix)


# ----------------------------------------------------------------------------------- memory
def _logit_terms(heads: Sequence[HeadSpec], n: int, n_patches: int) -> tuple[int, int, int]:
    """(extra ``(H, N, N)`` copies alive in the logit phase, copies saved, GPSA elements ``n_gpsa N_p^2``)."""
    n_heads = len(heads)
    n_gpsa = sum(h.gpsa is not None for h in heads)
    modes = {h.mask.mode for h in heads if h.mask is not None}
    soft, hard, strict = "soft" in modes, "hard" in modes, "strict" in modes
    bias = any(has_bias(h) for h in heads)
    logits = n_heads * n * n
    if n_gpsa or hard or soft:  # explicit softmax path: matmul, scale, bias, mask product, softmax
        alive = 2 * logits + (logits if soft else 0) + (logits if bias else 0) + (logits // 4 if strict else 0)
        saved = (3 + bias + hard + soft + strict) * logits
    elif bias or strict:  # SDPA with a float mask: the mask (built twice for strict) and the kernel's logits
        alive = logits * (1 + bias) + ((2 * logits + logits // 4) if strict else 0)
        saved = 2 * logits + alive
    else:  # SDPA without a mask: the flash kernel keeps no (N, N) tensor; count one to stay conservative
        alive, saved = logits, 2 * logits
    g = n_gpsa * n_patches * n_patches
    if n_gpsa:  # positional scores, their softmax, the gated mix and its normalisation (ConViT eq. 5-7)
        alive = max(alive, logits + 6 * g + (logits if n_gpsa < n_heads else 0))
        saved += 6 * g + (logits if n_gpsa < n_heads else 0)
    return alive, saved, g


def buffers(shape: AttentionShape) -> int:
    """Bytes of a layer's non-parameter tensors after its first eval forward under ``attn_impl='auto'``: each head
    kind's tables (:func:`.gpsa.tables`, :func:`.rel_bias.tables`, :func:`.mask.tables`,
    :func:`.gauss_mask.tables`) and the eval-mode caches of :class:`~.module.Attention` (:func:`caches`)."""
    n = shape.n_tokens
    return sum(kind.tables(shape.heads, n, n - shape.n_prefix) for kind in KINDS) + caches(shape)


def caches(shape: AttentionShape) -> int:
    """Bytes of the constants :class:`~.module.Attention` caches in its first eval forward (``attn_impl='auto'``),
    from the paths its heads take (:func:`head_path`): the ``(H, N, N)`` float32 position bias (any head with a
    relative or Gaussian bias, :func:`has_bias`), the bool ``(H, N, N)`` hard-mask term (hard heads on an explicit
    path), the float32 ``(H, N, N)`` additive mask of the SDPA paths (biased or strict heads there), GPSA's
    ``(n_gpsa, N_p, N_p)`` positional attention, and the stacked ``qk`` + ``v`` weights of the layernorm family's
    single projection GEMM."""
    heads, n, dims = shape.heads, shape.n_tokens, shape.dims
    n_patches, h = n - shape.n_prefix, len(heads)
    paths = {head_path(head, n_patches)[0] for head in heads}
    modes = {head.mask.mode for head in heads if head.mask is not None}
    bias = any(has_bias(head) for head in heads)
    n_gpsa = sum(head.gpsa is not None for head in heads)
    total = F32 * h * n * n if bias else 0
    total += BOOL * h * n * n if "hard" in modes and paths & {"dense", "hard"} else 0
    total += F32 * h * n * n if (bias or "strict" in modes) and paths & {"sdpa", "gpsa"} else 0
    total += F32 * n_gpsa * n_patches * n_patches
    if shape.norm == "layernorm":
        total += F32 * h * (2 * dims.qk_dim + dims.v_dim) * (shape.dim + (1 if shape.qkv_bias else 0))
    return total


def memory(shape: AttentionShape) -> NodeMemory:
    """Bytes (batch 1, float32) of the attention half of a block on ``N`` tokens, width ``dim``.

    Alive throughout: the block input, the norm output (layernorm family), q/k/v; then the largest of
    the q/k copies of the ``Q K^T`` matmul, the logit phase (see :func:`_logit_terms`), ``A V`` with
    its contiguous copy of v, and the output projection.  Rule: :mod:`archspec.ir.graph`.
    """
    heads, n, dim = shape.heads, shape.n_tokens, shape.dim
    n_patches = n - shape.n_prefix
    batchnorm = shape.norm == "batchnorm"
    n_heads = len(heads)
    x = n * dim
    qk, v, out = n * 2 * n_heads * shape.dims.qk_dim, n * n_heads * shape.dims.v_dim, n * n_heads * shape.dims.v_dim
    logits = n_heads * n * n
    alive_logits, saved_logits, _ = _logit_terms(heads, n, n_patches)
    base = x + (0 if batchnorm else x) + qk + v
    phases = [
        qk + v if batchnorm else 0,  # LinearNorm: linear output and its BatchNorm output at once
        logits + qk,                 # Q K^T: contiguous copies of q and k
        alive_logits,
        logits + v + out,            # A V: probabilities, contiguous v, output
        3 * out + 2 * x,             # transpose copy, activation, projection (+ its BatchNorm)
    ]
    act = base + max(phases) + x     # + the residual sum
    saved = base - x + (qk + v if batchnorm else 0) + saved_logits + 3 * out + 3 * x
    return NodeMemory(act=F32 * act, saved=F32 * saved, buffers=buffers(shape))

