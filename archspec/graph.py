"""The IR: a networkx DiGraph of the architecture with static shapes, parameter and MAC counts.

Step 2 of 3 (spec -> **graph** -> compile).  :func:`build_graph` walks the spec once, infers the
token grid and width after every node, checks everything that needs those shapes, and counts
parameters and MACs in closed form -- no tensor is allocated, so a search can reject a candidate
in microseconds.

Node order is execution order; edges link consecutive nodes (the data path).  Every node carries:

``kind``      one of ``input, stem, embed, insert, shrink, block, class_attn, head``
``name``      module path in the compiled model (``stages.1.blocks.0``)
``label``     what the block is (``attn``, ``levit``, ``conv3``, ``shrink``...)
``heads``     head kinds as letters, ``"M M A"`` (see :attr:`archspec.heads.HeadSpec.letter`)
``tokens``    tokens N after the node; ``grid`` its patch grid ``(rows, cols)``; ``dim`` width C
``params``    parameters (trainable and frozen, not buffers)
``macs``      multiply-accumulates for ONE image
``act_bytes``, ``saved_bytes``, ``buffer_bytes``  memory estimates (below; :mod:`archspec.memory`)

MAC convention (the papers' "FLOPs"): every matmul, linear and convolution counts
``output elements x reduction length``; attention counts ``Q K^T`` and ``A V``; GPSA counts its
positional projection ``N^2 * 3 * n_gpsa`` once per forward; softmax, norms, activations, biases
and additions count 0.  ``torch.utils.flop_counter.FlopCounterMode`` reports 2 x this.

Memory rule (bytes, batch 1, float32; :mod:`archspec.memory` has the per-node formulas).  Inference
memory of a forward = the input image + the largest per-node activation peak + 4 bytes per parameter +
every node's buffers.  A node's activation peak is the sum of the tensors alive at its worst moment:
its input (the caller holds it until the node returns), plus what its forward creates and still
references -- e.g. in an attention block the norm output, q, k and v, then the largest of: the
``(H, N, N)`` logits twice over (a product and its scaled copy; plus one more per additive bias,
soft-mask multiplier or strict mask), the contiguous q/k copies of ``Q K^T``, and ``A V`` with its
contiguous copy of v; in the MLP the input, the residual sum, the norm output and two copies of the
hidden layer.  Buffers are the index and mask tables and the eval-mode bias / mask caches that
scale with ``N^2``.  Conservative choices: the SDPA kernel is assumed to materialise the logits
when a mask or bias is passed (PyTorch's CPU kernel then does) and one copy even without; every
phase's count takes the larger of the kernels' possibilities; BatchNorm running statistics are the
only tensors left out.  On the shipped specs the estimate is 1.0-1.5x the bytes a
``TorchDispatchMode`` sees alive at once (tests/test_memory.py).

Training keeps activations for the backward pass, so its figure *sums* what every node creates
(``saved_bytes``) instead of taking the largest peak: ``saved_activation_bytes`` per image;
:func:`archspec.search.budget.training_memory` multiplies it by the batch and adds weights,
gradients and AdamW's two moments (4 x the weight bytes).

:func:`check_memory` refuses a spec whose inference estimate exceeds a limit
(:data:`DEFAULT_MAX_MEMORY`, 8 GiB, unless ``max_memory`` says otherwise); :func:`archspec.load_spec`,
:func:`archspec.compile` and ``archspec build/validate --max-memory`` pass the limit through.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import networkx as nx

from archspec.errors import Problem, SpecError
from archspec.executed_macs import attention_macs_change
from archspec.families import family
from archspec.heads import HeadSpec
from archspec.memory import (F32, NodeMemory, attention_memory, concat_memory, format_bytes,
                             head_memory, mlp_memory, stem_memory)
from archspec.spec import ArchSpec, LayerPlan, StageSpec

MAX_TOKENS = 4096  # attention memory grows with N^2; 4096 tokens is a 64x64 grid
MAX_PARAMS = 1_000_000_000  # 4 GB of float32 weights
DEFAULT_MAX_MEMORY = 8 * 2**30  # bytes; well under a 24 GB machine, so a refused spec never reaches the allocator


@dataclass(frozen=True)
class AttnDims:
    """Per-head dims of a stage's attention: q/k dim, value dim, and scale ``qk_dim ** -0.5``."""

    qk_dim: int
    v_dim: int


def attn_dims(stage: StageSpec) -> AttnDims:
    """Resolve head dim, key dim and attn ratio of a stage into per-head q/k and value dims.

    q/k dim = ``key_dim`` or ``head_dim`` or ``dim / heads``; value dim = ``attn_ratio * q/k dim`` when
    ``attn_ratio`` is given (LeViT), else ``head_dim`` or ``dim / heads``.
    """
    base = stage.head_dim if stage.head_dim is not None else stage.dim // stage.heads
    qk = stage.key_dim if stage.key_dim is not None else base
    v = int(stage.attn_ratio * qk) if stage.attn_ratio is not None else base
    return AttnDims(qk_dim=qk, v_dim=v)


def _conv_out(side: int, kernel: int = 3, stride: int = 2, pad: int = 1) -> int:
    return (side + 2 * pad - kernel) // stride + 1


def _linear(n_tokens: int, d_in: int, d_out: int, bias: bool, bn: bool = False) -> tuple[int, int]:
    """(params, MACs) of a linear (optionally followed by BatchNorm: 2 d_out params) over N tokens."""
    params = d_in * d_out + (d_out if bias else 0) + (2 * d_out if bn else 0)
    return params, n_tokens * d_in * d_out


def attention_counts(dim: int, heads: list[HeadSpec], dims: AttnDims, grid: tuple[int, int], n_prefix: int,
                     qkv_bias: bool, batchnorm: bool) -> tuple[int, int]:
    """(params, MACs) of one :class:`archspec.blocks.attention.Attention` on ``N = n_prefix + rows*cols`` tokens."""
    n_heads = len(heads)
    rows, cols = grid
    n = n_prefix + rows * cols
    qk_out, v_out = 2 * n_heads * dims.qk_dim, n_heads * dims.v_dim
    if batchnorm:  # LeViT: one qkv LinearNorm, no bias; proj LinearNorm
        p_qkv, m_qkv = _linear(n, dim, qk_out + v_out, bias=False, bn=True)
        p_proj, m_proj = _linear(n, v_out, dim, bias=False, bn=True)
    else:
        p_qk, m_qk = _linear(n, dim, qk_out, qkv_bias)
        p_v, m_v = _linear(n, dim, v_out, qkv_bias)
        p_qkv, m_qkv = p_qk + p_v, m_qk + m_v
        p_proj, m_proj = _linear(n, v_out, dim, bias=True)
    params = p_qkv + p_proj
    macs = m_qkv + m_proj + n * n * n_heads * (dims.qk_dim + dims.v_dim)
    n_gpsa = sum(h.gpsa is not None for h in heads)
    if n_gpsa:
        params += 3 * n_gpsa + n_gpsa + n_gpsa  # pos_proj weight + bias, gating parameter
        macs += (rows * cols) ** 2 * 3 * n_gpsa
    n_abs = sum(h.rel_bias is not None and h.rel_bias.table == "absolute" for h in heads)
    n_signed = sum(h.rel_bias is not None and h.rel_bias.table == "signed" for h in heads)
    params += n_abs * rows * cols + n_signed * (2 * rows - 1) * (2 * cols - 1)
    params += sum(h.mask is not None and h.mask.mode == "soft" for h in heads)
    return params, macs


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def _report_layer(problems: list[Problem], path: tuple, layer: int, text: str, hint: str | None = None) -> None:
    """Report ``layer N: text``; a problem already reported at ``path`` for other layers gets ``N`` added
    (``layers 0-11: text``), so a stage-wide mistake is one problem, not one per block."""
    for k, p in enumerate(problems):
        head, _, rest = p.message.partition(": ")
        if p.path == path and p.hint == hint and rest == text and re.fullmatch(r"layers? [0-9, -]+", head):
            layers = {layer}
            for part in head.split(" ", 1)[1].split(", "):
                a, _, b = part.partition("-")
                layers.update(range(int(a), int(b or a) + 1))
            problems[k] = Problem(path, f"layers {_ranges(sorted(layers))}: {text}", hint)
            return
    problems.append(Problem(path, f"layer {layer}: {text}", hint))


def _check_layer(spec: ArchSpec, stage_index: int, layer: int, plan: LayerPlan, grid: tuple[int, int],
                 n_prefix: int, problems: list[Problem]) -> None:
    stage = spec.stages[stage_index]
    where = plan.origin
    if plan.mixer.kind == "conv":
        mixer_at: tuple = ("stages", stage_index, "mixer")  # where the conv mixer of this layer was written
        for j, override in enumerate(stage.layers):
            if override.mixer is not None and override.range[0] <= layer <= override.range[1]:
                mixer_at = ("stages", stage_index, "layers", j, "mixer")
        if n_prefix:
            _report_layer(problems, mixer_at, layer,
                          "a conv token mixer needs a pure token grid, but a class/distillation token is present",
                          "use tokens.cls_token: none with head.pool: mean (CMHSA phase 1)")
        patch = spec.pixel_patch(plan.mixer)
        if patch is None:
            _report_layer(problems, mixer_at, layer, "a conv mixer's pixel view needs a patch size, and a conv "
                          "stem has none", "set mixer: {kind: conv, patch: P} (1 = conv on the token grid)")
        elif stage.dim % (patch * patch):
            _report_layer(problems, mixer_at, layer, f"the conv mixer's pixel view needs dim {stage.dim} to be a "
                          f"multiple of patch**2 = {patch * patch} (a token is a PxPxc block of pixels)",
                          "use a patch that fits, or token_conv3 for a conv on the token grid")
        elif plan.mixer.kernel > 2 * max(grid) * patch + 1:
            _report_layer(problems, mixer_at + ("kernel",), layer,
                          f"conv kernel {plan.mixer.kernel} is larger than the {grid[0] * patch}x{grid[1] * patch} "
                          f"{'token' if patch == 1 else 'pixel'} grid allows",
                          f"use a kernel of at most {2 * max(grid) * patch + 1}")
        return
    if plan.mixer.pad_tokens and n_prefix:
        _report_layer(problems, where, layer, "zero-padding tokens (mixer.pad_tokens) need a pure token grid, but "
                      "a class/distillation token is present", "use tokens.cls_token: none with head.pool: mean")
    gpsa_heads = [h for h in plan.heads if h.gpsa is not None]
    if gpsa_heads and n_prefix:
        _report_layer(problems, where, layer, "GPSA heads, but the class token is already present",
                      "GPSA sees patch tokens only: insert the class token after the last GPSA layer "
                      "(tokens.cls_token: <index of the first non-GPSA block>, as ConViT)")
    conv_init = sum(h.gpsa.conv_init for h in gpsa_heads)
    if conv_init and not _is_square(conv_init):
        k = math.isqrt(conv_init)
        _report_layer(problems, where, layer,
                      f"{conv_init} GPSA heads have conv_init, which cannot form a square kernel",
                      f"ConViT places conv-initialised heads on a sqrt(H) x sqrt(H) grid; use {k * k} or "
                      f"{(k + 1) ** 2} such heads, or set conv_init: false on {conv_init - k * k} of them")
    for h_index, head in enumerate(plan.heads):
        if head.mask is not None:
            rows, cols = head.mask.window
            if rows > grid[0] or cols > grid[1]:
                path = where + (h_index, "mask", "window") if where[-1] == "heads" else where + ("mask", "window")
                _report_layer(problems, path, layer, f"mask window {rows}x{cols} is larger than the "
                              f"{grid[0]}x{grid[1]} token grid",
                              f"use at most a {grid[0] - 1 + grid[0] % 2}x{grid[1] - 1 + grid[1] % 2} window, or a "
                              "larger token grid (larger input or smaller patches)")
                break


def check_stage_overrides(spec: ArchSpec, i: int, problems: list[Problem]) -> None:
    """Range, overlap, gap and per-head-length checks of ``stages[i].layers``."""
    stage = spec.stages[i]
    covered: dict[int, int] = {}
    for j, override in enumerate(stage.layers):
        start, end = override.range
        if end >= stage.depth:
            problems.append(Problem(("stages", i, "layers", j, "range"),
                                    f"layer range {start}-{end} exceeds the stage depth {stage.depth} (layers 0-{stage.depth - 1})"))
        if override.heads is not None and len(override.heads) != stage.heads:
            problems.append(Problem(("stages", i, "layers", j, "heads"),
                                    f"{len(override.heads)} head entries for a stage of {stage.heads} heads",
                                    "give exactly one entry per head, or 'attention:' for all heads"))
        for layer in range(start, min(end, stage.depth - 1) + 1):
            if layer in covered and (override.heads is not None or override.attention is not None):
                other = stage.layers[covered[layer]]
                if other.heads is not None or other.attention is not None:
                    problems.append(Problem(("stages", i, "layers", j, "range"),
                                            f"layer range {start}-{end} overlaps range {other.range[0]}-{other.range[1]} "
                                            f"(layers[{covered[layer]}]) at layer {layer}"))
                    break
            if override.heads is not None or override.attention is not None:
                covered[layer] = j
    if stage.layers and stage.attention is None:
        conv_layers = set(range(stage.depth)) if stage.mixer.kind == "conv" else set()
        for override in stage.layers:  # layers whose token mixer is a conv have no heads to cover
            if override.mixer is not None:
                span = set(range(override.range[0], override.range[1] + 1))
                conv_layers = conv_layers | span if override.mixer.kind == "conv" else conv_layers - span
        gaps = [layer for layer in range(stage.depth) if layer not in covered and layer not in conv_layers]
        if gaps:
            problems.append(Problem(("stages", i, "layers"),
                                    f"layers {_ranges(gaps)} are not covered by any range and the stage has no default 'attention'",
                                    "add a range for them, or set stages[].attention (e.g. mhsa) as the default"))


def _ranges(layers: list[int]) -> str:
    out, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


@dataclass
class _Flow:
    """What flows along the data path between nodes: token grid, width, prefix tokens present, blocks so far."""

    grid: tuple[int, int]
    dim: int
    n_prefix: int = 0
    block_index: int = 0


@dataclass(frozen=True)
class _Tokens:
    """Resolved ``tokens:`` section: extra tokens, where the class token enters (None: never), their width."""

    n_extra: int
    cls_at: int | None
    width: int


class _Builder:
    """Collects nodes in execution order (each linked to the previous one) and the problems found."""

    def __init__(self, spec: ArchSpec):
        self.spec = spec
        self.graph = nx.DiGraph(name=spec.name)
        self.order: list[str] = []
        self.problems: list[Problem] = []

    def add(self, node_id: str, memory: NodeMemory = NodeMemory(), **attrs: Any) -> None:
        attrs.setdefault("params", 0)
        attrs.setdefault("macs", 0)
        attrs.setdefault("macs_executed", attrs["macs"])
        attrs.setdefault("heads", "")
        self.graph.add_node(node_id, name=node_id, act_bytes=memory.act, saved_bytes=memory.saved,
                            buffer_bytes=memory.buffers, **attrs)
        if self.order:
            self.graph.add_edge(self.order[-1], node_id)
        self.order.append(node_id)

    def problem(self, path: tuple, message: str, hint: str | None = None) -> None:
        self.problems.append(Problem(path, message, hint))


def build_graph(spec: ArchSpec) -> nx.DiGraph:
    """Build the IR of ``spec``: shapes, parameter and MAC counts and memory estimates of every node.

    Returns:
        A ``networkx.DiGraph`` whose nodes, in execution order, carry the attributes listed in the
        module docstring; ``graph.graph`` holds totals (``params``, ``macs``, ``output``, and the
        memory totals ``peak_activation_bytes``, ``weight_bytes``, ``buffer_bytes``,
        ``peak_memory_bytes``, ``peak_node``, ``saved_activation_bytes``).  No memory limit is
        applied here: see :func:`check_memory`.

    Raises:
        SpecError: every shape problem found (empty grids, non-dividing resolutions, windows larger
            than the grid, GPSA with a class token, head arithmetic, caps), with field paths.
    """
    b = _Builder(spec)
    height, width = spec.input.resolution
    b.add("input", kind="input", label="image", tokens=0, grid=(height, width), dim=spec.input.channels)
    grid, dim = _add_stem(b)
    _check_grid(b, grid)
    tokens = _resolve_tokens(b)
    flow = _add_embed(b, tokens, grid, dim)
    for i in range(len(spec.stages)):
        _add_stage(b, i, flow, tokens)
    if tokens.cls_at is not None and tokens.cls_at == spec.depth and spec.depth > 0:
        _add_insert(b, flow, tokens)
    if spec.class_attention is not None:
        _add_class_attention(b, flow, tokens)
    _add_head(b, flow)
    return _finish(b)


def _add_stem(b: _Builder) -> tuple[tuple[int, int], int]:
    """The stem node; returns the token grid and width after it."""
    spec, first = b.spec, b.spec.stages[0]
    in_ch = spec.input.channels
    height, width = spec.input.resolution
    stem = spec.stem
    if stem.kind == "conv":
        return _add_conv_stem(b)
    p = stem.patch_size
    if height % p or width % p:
        b.problem(("stem", "patch_size"), f"patch size {p} does not divide the input resolution {height}x{width}",
                  f"use a resolution that is a multiple of {p}, e.g. {max(p, height // p * p)}")
    grid = (height // p, width // p)
    if stem.kind == "patch":
        params = in_ch * p * p * first.dim + first.dim
        macs = grid[0] * grid[1] * in_ch * p * p * first.dim
        stem_dim = first.dim
    else:
        params, macs, stem_dim = 0, 0, in_ch * p * p
        if first.dim != stem_dim:
            b.problem(("stages", 0, "dim"), f"an identity stem makes tokens of P^2 C = {p}*{p}*{in_ch} = {stem_dim} "
                      f"values, but stages[0].dim is {first.dim}", f"set stages[0].dim: {stem_dim}")
    memory = stem_memory(in_ch * height * width, [grid[0] * grid[1] * stem_dim], norm_per_layer=False)
    b.add("stem", memory, kind="stem", label=f"{stem.kind}{p}", tokens=grid[0] * grid[1], grid=grid, dim=stem_dim,
          params=params, macs=macs, config={"stem": stem})
    return grid, stem_dim


def _add_conv_stem(b: _Builder) -> tuple[tuple[int, int], int]:
    """LeViT's conv stem: 3x3 stride-2 conv + BatchNorm layers."""
    spec, first = b.spec, b.spec.stages[0]
    channels = spec.stem.channels
    if channels is None:
        if first.dim % 8:
            b.problem(("stem", "channels"), "default conv stem channels [C/8, C/4, C/2, C] need stages[0].dim "
                      f"divisible by 8, got {first.dim}", "give stem.channels explicitly")
        channels = [max(first.dim // 8, 1), max(first.dim // 4, 1), max(first.dim // 2, 1), first.dim]
    elif channels[-1] != first.dim:
        b.problem(("stem", "channels"), f"the conv stem ends with {channels[-1]} channels but stages[0].dim is "
                  f"{first.dim}", f"make the last entry {first.dim}")
    params = macs = 0
    height, width = spec.input.resolution
    h, w, c = height, width, spec.input.channels
    outputs = []
    for c_out in channels:
        h, w = _conv_out(h), _conv_out(w)
        params += 9 * c * c_out + 2 * c_out
        macs += h * w * 9 * c * c_out
        outputs.append(h * w * c_out)
        c = c_out
    memory = stem_memory(spec.input.channels * height * width, outputs, norm_per_layer=True)
    b.add("stem", memory, kind="stem", label=f"conv{len(channels)}", tokens=h * w, grid=(h, w), dim=c,
          params=params, macs=macs, config={"stem": spec.stem, "channels": channels}, bn_channels=sum(channels))
    return (h, w), c


def _check_grid(b: _Builder, grid: tuple[int, int]) -> None:
    """Stop early (raising every problem so far) on an empty grid or one over :data:`MAX_TOKENS`."""
    if grid[0] < 1 or grid[1] < 1:
        b.problem(("stem",), f"the stem's output grid {grid[0]}x{grid[1]} is empty",
                  "use a larger input resolution or a smaller patch size")
        raise SpecError(b.problems)
    if grid[0] * grid[1] + 2 > MAX_TOKENS:
        b.problem(("input", "resolution"), f"{grid[0]}x{grid[1]} = {grid[0] * grid[1]} tokens exceeds the cap of "
                  f"{MAX_TOKENS}", "use a larger patch size or a smaller resolution")
        raise SpecError(b.problems)


def _width_before_block(spec: ArchSpec, index: int) -> int:
    """Token width entering global block ``index`` (the last stage's width after the last block)."""
    for stage in spec.stages:
        if index < stage.depth:
            return stage.dim
        index -= stage.depth
    return spec.stages[-1].dim


def _resolve_tokens(b: _Builder) -> _Tokens:
    """Check the ``tokens`` and ``head`` options against each other; where the class token enters."""
    spec, tok = b.spec, b.spec.tokens
    depth = spec.depth
    n_extra = (tok.cls_token != "none") + tok.dist_token
    cls_at = 0 if tok.cls_token == "input" else (None if tok.cls_token == "none" else tok.cls_token)
    if cls_at is not None and cls_at > depth:
        b.problem(("tokens", "cls_token"),
                  f"class token inserted before block {cls_at}, but the model has {depth} blocks (0-{depth - 1})",
                  f"use an index from 0 to {depth} ({depth}: after the last block)")
    if tok.dist_token and cls_at is None:
        b.problem(("tokens", "dist_token"), "a distillation token needs a class token", "set tokens.cls_token: input")
    if tok.dist_token and not spec.head.distillation:
        b.problem(("tokens", "dist_token"), "a distillation token without a distillation head is unused",
                  "set head.distillation: true")
    if spec.head.pool == "cls" and cls_at is None:
        b.problem(("head", "pool"), "pool: cls needs a class token", "set tokens.cls_token, or head.pool: mean")
    if spec.head.distillation and spec.head.pool == "cls" and not tok.dist_token:
        b.problem(("head", "distillation"), "a distillation head with pool: cls reads the distillation token",
                  "set tokens.dist_token: true (DeiT), or head.pool: mean (LeViT)")
    # A token inserted later has the width of the stage it enters (it is concatenated to that stage's tokens).
    width = _width_before_block(spec, min(cls_at, depth)) if cls_at is not None else spec.stages[0].dim
    return _Tokens(n_extra=n_extra, cls_at=cls_at, width=width)


def _add_embed(b: _Builder, tokens: _Tokens, grid: tuple[int, int], dim: int) -> _Flow:
    """Class/distillation tokens present from the start and the position embedding (params of every extra token)."""
    pos = b.spec.tokens.pos_embed == "learned"
    n_prefix = tokens.n_extra if tokens.cls_at == 0 else 0
    embed_len = grid[0] * grid[1] + n_prefix
    params = tokens.n_extra * tokens.width + (embed_len * dim if pos else 0)
    memory = concat_memory(grid[0] * grid[1], embed_len, dim, pos) if (n_prefix or pos) else NodeMemory()
    b.add("embed", memory, kind="embed", label="tokens", tokens=embed_len, grid=grid, dim=dim, params=params,
          config={"n_extra": tokens.n_extra, "cls_at": tokens.cls_at, "token_dim": tokens.width,
                  "pos_embed_len": embed_len if pos else 0})
    return _Flow(grid=grid, dim=dim, n_prefix=n_prefix)


def _add_insert(b: _Builder, flow: _Flow, tokens: _Tokens) -> None:
    """Class (and distillation) token concatenated before block ``flow.block_index`` (ConViT)."""
    n_patches = flow.grid[0] * flow.grid[1]
    flow.n_prefix = tokens.n_extra
    label = "+cls" + ("+dist" if b.spec.tokens.dist_token else "")
    b.add(f"insert_tokens.{flow.block_index}", concat_memory(n_patches, n_patches + flow.n_prefix, flow.dim, False),
          kind="insert", label=label, tokens=n_patches + flow.n_prefix, grid=flow.grid, dim=flow.dim,
          config={"n_extra": tokens.n_extra})


def _add_stage(b: _Builder, i: int, flow: _Flow, tokens: _Tokens) -> None:
    """Shrinking attention (if any) and the blocks of ``stages[i]``; advances ``flow``."""
    stage = b.spec.stages[i]
    if stage.shrink is not None:
        _add_shrink(b, i, flow)
    elif i > 0 and stage.dim != flow.dim:
        b.problem(("stages", i, "dim"), f"width changes from {flow.dim} to {stage.dim} without a transition",
                  "add 'shrink:' (LeViT shrinking attention) to this stage, or keep the width")
        flow.dim = stage.dim
    if stage.head_dim is None and stage.key_dim is None and stage.dim % stage.heads:
        b.problem(("stages", i, "heads"), f"dim {stage.dim} is not divisible by {stage.heads} heads (head dim is "
                  "dim / heads)", "change dim or heads, or set head_dim explicitly")
        flow.block_index += stage.depth
        return
    check_stage_overrides(b.spec, i, b.problems)
    if stage.talking_heads:
        _check_talking_heads(b, i)
    dims = attn_dims(stage)
    if dims.qk_dim < 1 or dims.v_dim < 1:  # normally refused by StageSpec already; kept for specs built unchecked
        b.problem(("stages", i, "attn_ratio"), f"per-head dims q/k {dims.qk_dim}, value {dims.v_dim}: one rounds to 0",
                  "raise attn_ratio, key_dim or head_dim")
        flow.block_index += stage.depth
        return
    for layer, plan in enumerate(b.spec.layer_plans(i)):
        if tokens.cls_at is not None and tokens.cls_at == flow.block_index and tokens.cls_at > 0:
            _add_insert(b, flow, tokens)
        _check_layer(b.spec, i, layer, plan, flow.grid, flow.n_prefix, b.problems)
        _add_block(b, i, layer, plan, dims, flow)
        flow.block_index += 1


def _add_shrink(b: _Builder, i: int, flow: _Flow) -> None:
    """LeViT shrinking attention entering ``stages[i]``: subsamples the grid, changes the width."""
    stage, sh = b.spec.stages[i], b.spec.stages[i].shrink
    if i == 0:
        b.problem(("stages", 0, "shrink"), "the first stage cannot start with shrinking attention",
                  "put shrink on a later stage")
        return
    heads = sh.heads if sh.heads is not None else max(flow.dim // sh.key_dim, 1)
    if flow.n_prefix:
        b.problem(("stages", i, "shrink"), "shrinking attention needs a pure token grid, but a class/distillation "
                  "token is present", "use tokens.cls_token: none, or insert it after this stage (an index)")
    if int(stage.dim * sh.mlp_ratio) < 1:  # timm's LevitMlp would silently widen a 0 hidden width to dim
        b.problem(("stages", i, "shrink", "mlp_ratio"), f"the MLP hidden width int(dim * mlp_ratio) = "
                  f"int({stage.dim} * {sh.mlp_ratio:g}) is 0", f"use mlp_ratio >= {1 / stage.dim:g}")
        return
    rule = family("shrink")  # LeViT shrinking attention: archspec/blocks/shrink.py
    shape = dict(in_dim=flow.dim, out_dim=stage.dim, heads=heads, key_dim=sh.key_dim, attn_ratio=sh.attn_ratio,
                 mlp_ratio=sh.mlp_ratio, grid=flow.grid, stride=sh.stride)
    params, macs = rule.counts(**shape)
    out_grid = rule.out_grid(**shape)
    nq = out_grid[0] * out_grid[1]
    b.add(f"stages.{i}.downsample", rule.memory(**shape), kind="shrink", label=f"shrink/{sh.stride}", stage=i,
          heads=" ".join(["L"] * heads), tokens=nq, grid=out_grid, dim=stage.dim, params=params, macs=macs,
          bn_channels=(heads * (2 * sh.key_dim + int(sh.attn_ratio * sh.key_dim)) + 2 * stage.dim
                       + int(stage.dim * sh.mlp_ratio)),  # kv, q, proj, fc1, fc2 (fuse() folds them)
          config={**shape, "act": stage.act})
    flow.grid, flow.dim = out_grid, stage.dim


def _add_block(b: _Builder, i: int, layer: int, plan: LayerPlan, dims: AttnDims, flow: _Flow) -> None:
    """One block of ``stages[i]``: token mixer (attention or conv) + MLP, with its counts and memory."""
    stage = b.spec.stages[i]
    grid, dim = flow.grid, flow.dim
    n_patches = grid[0] * grid[1]
    n_tokens = flow.n_prefix + n_patches
    batchnorm = stage.norm == "batchnorm"
    hidden = int(dim * stage.mlp_ratio)
    # BatchNorm channels that fuse() folds (LeViT LinearNorms): fc1, fc2, and qkv, proj of an attention mixer
    bn_channels = hidden + dim if batchnorm else 0
    if plan.mixer.kind == "conv":  # CMHSA phase 1: K x K conv on the pixel view, c = d / P^2 channels
        k, patch = plan.mixer.kernel, b.spec.pixel_patch(plan.mixer) or 1  # None: reported by _check_layer
        conv = family("conv_mixer")  # archspec/blocks/mixers.py
        p_mix, m_mix = conv.counts(dim, k, grid, patch)
        m_mix_executed = m_mix
        label, heads_str = f"conv{k}", f"conv{k}x{k}" + (f"/P{patch}" if patch > 1 else "")
        mix_memory = conv.memory(dim, k, grid, patch)
    elif stage.talking_heads:  # CaiT: the family's own rules (archspec/blocks/talking_heads.py)
        th = family("talking_heads")
        p_mix, m_mix = th.counts(dim, plan.heads, grid, flow.n_prefix, stage.qkv_bias)
        m_mix_executed = m_mix  # its own module: no linear-time paths
        label, heads_str = "talking", " ".join(h.letter for h in plan.heads)
        mix_memory = th.memory(dim, plan.heads, grid, flow.n_prefix, stage.qkv_bias)
    else:
        pad = plan.mixer.pad_tokens  # zero-padding tokens: attention runs on the padded grid
        attn_grid = (grid[0] + 2 * pad, grid[1] + 2 * pad)
        p_mix, m_mix = attention_counts(dim, plan.heads, dims, attn_grid, flow.n_prefix, stage.qkv_bias, batchnorm)
        m_mix_executed = m_mix + attention_macs_change(plan.heads, dims.qk_dim, dims.v_dim, attn_grid, flow.n_prefix)
        label, heads_str = ("levit" if batchnorm else "attn"), " ".join(h.letter for h in plan.heads)
        n_attn = flow.n_prefix + attn_grid[0] * attn_grid[1]
        mix_memory = attention_memory(n_attn, n_attn - flow.n_prefix, dim, plan.heads, dims.qk_dim, dims.v_dim, batchnorm)
        if batchnorm:
            bn_channels += len(plan.heads) * (2 * dims.qk_dim + dims.v_dim) + dim
    p_fc1, m_fc1 = _linear(n_tokens, dim, hidden, bias=not batchnorm, bn=batchnorm)
    p_fc2, m_fc2 = _linear(n_tokens, hidden, dim, bias=not batchnorm, bn=batchnorm)
    layer_scale = stage.layer_scale is not None and not batchnorm
    p_norm = 0 if batchnorm else 4 * dim + (2 * dim if layer_scale else 0)
    mlp = mlp_memory(n_tokens, dim, hidden, batchnorm, layer_scale)
    memory = NodeMemory(act=max(mix_memory.act, mlp.act), saved=mix_memory.saved + mlp.saved,
                        buffers=mix_memory.buffers)
    b.add(f"stages.{i}.blocks.{layer}", memory, kind="block", label=label, stage=i, layer=flow.block_index,
          heads=heads_str, tokens=n_tokens, grid=grid, dim=dim, params=p_mix + p_fc1 + p_fc2 + p_norm,
          macs=m_mix + m_fc1 + m_fc2, macs_executed=m_mix_executed + m_fc1 + m_fc2,
          bn_channels=bn_channels,
          config={"stage": i, "layer": layer, "plan": plan, "grid": grid, "n_prefix": flow.n_prefix, "dims": dims})


def _check_talking_heads(b: _Builder, i: int) -> None:
    """Talking-heads attention (CaiT) has plain or masked heads of dim / heads, in pre-norm blocks."""
    stage, at = b.spec.stages[i], ("stages", i, "talking_heads")
    if stage.norm == "batchnorm":
        b.problem(at, "talking-heads attention is a pre-norm (layernorm) block", "set norm: layernorm")
    if stage.head_dim is not None or stage.key_dim is not None or stage.attn_ratio is not None:
        b.problem(at, "talking-heads attention uses a head dim of dim / heads (timm CaiT)",
                  "remove head_dim, key_dim and attn_ratio from this stage")
    other = sorted({h.letter for plan in b.spec.layer_plans(i) if plan.mixer.kind != "conv" for h in plan.heads
                    if h.gpsa is not None or h.rel_bias is not None})
    if other:
        b.problem(at, f"talking-heads attention takes plain (mhsa) and masked heads only, got head kinds "
                  f"{', '.join(other)}", "use mhsa, mask, soft_mask or strict_mask heads in this stage")


def _add_class_attention(b: _Builder, flow: _Flow, tokens: _Tokens) -> None:
    """CaiT's class-attention blocks after the last stage (rules: archspec/blocks/class_attention.py)."""
    spec, ca = b.spec, b.spec.class_attention
    if tokens.cls_at != spec.depth or spec.tokens.dist_token:
        b.problem(("class_attention",), "the class-attention stage needs the class token, and only it, inserted "
                  "after the last block", f"set tokens.cls_token: {spec.depth} (CaiT) and no dist_token")
        return
    heads = ca.heads if ca.heads is not None else spec.stages[-1].heads
    if flow.dim % heads:
        b.problem(("class_attention", "heads"), f"dim {flow.dim} is not divisible by {heads} heads",
                  "choose heads dividing the last stage's dim")
        return
    if int(flow.dim * ca.mlp_ratio) < 1:
        b.problem(("class_attention", "mlp_ratio"), f"the MLP hidden width int({flow.dim} * {ca.mlp_ratio:g}) is 0",
                  f"use mlp_ratio >= {1 / flow.dim:g}")
        return
    rule = family("class_attention")
    n = flow.n_prefix + flow.grid[0] * flow.grid[1]
    shape = dict(dim=flow.dim, heads=heads, n_tokens=n, mlp_ratio=ca.mlp_ratio, qkv_bias=ca.qkv_bias)
    params, macs = rule.counts(**shape, layer_scale=ca.layer_scale is not None)
    memory = rule.memory(**shape, layer_scale=ca.layer_scale is not None)
    for j in range(ca.depth):
        b.add(f"stages.{len(spec.stages)}.blocks.{j}", memory, kind="class_attn", label="class-attn",
              heads=" ".join(["C"] * heads), tokens=n, grid=flow.grid, dim=flow.dim, params=params, macs=macs,
              layer=flow.block_index + j, config={**shape, "layer_scale": ca.layer_scale})


def _add_head(b: _Builder, flow: _Flow) -> None:
    """Final norm, pooling and classifier(s).

    layernorm family: one LayerNorm (before cls pooling, or after mean pooling as timm's fc_norm) +
    Linear heads; batchnorm family: timm NormLinear (BatchNorm1d + Linear) per head; num_classes 0 =
    no classifier.
    """
    head, dim = b.spec.head, flow.dim
    batchnorm = b.spec.stages[-1].norm == "batchnorm"
    n_cls = head.num_classes
    n_heads_out = 2 if head.distillation else 1
    if n_cls == 0:
        params = 0 if batchnorm else 2 * dim
    else:
        params = n_heads_out * (dim * n_cls + n_cls + (2 * dim if batchnorm else 0)) + (0 if batchnorm else 2 * dim)
    macs = dim * n_cls * n_heads_out
    n_tokens = flow.n_prefix + flow.grid[0] * flow.grid[1]
    b.add("head", head_memory(n_tokens, dim, n_cls), kind="head", label=f"{head.pool}-pool", tokens=1, grid=(1, 1),
          dim=n_cls or dim, params=params, macs=macs, heads="", config={"batchnorm": batchnorm},
          bn_channels_before_linear=n_heads_out * dim if batchnorm and n_cls else 0)


def _finish(b: _Builder) -> nx.DiGraph:
    """Totals, the parameter cap, and raising the problems found."""
    g = b.graph
    nodes = [g.nodes[n] for n in b.order]
    total_params = sum(d["params"] for d in nodes)
    if total_params > MAX_PARAMS:
        b.problem(("stages",), f"{total_params / 1e9:.1f}B parameters exceeds the cap of {MAX_PARAMS / 1e9:.0f}B")
    if b.problems:
        raise SpecError(b.problems)
    image = F32 * b.spec.input.channels * b.spec.input.resolution[0] * b.spec.input.resolution[1]
    peak = max(nodes, key=lambda d: d["act_bytes"])
    weights, buffers = F32 * total_params, sum(d["buffer_bytes"] for d in nodes)
    g.graph.update(params=total_params, macs=sum(d["macs"] for d in nodes),
                   macs_executed=sum(d["macs_executed"] for d in nodes), output=(nodes[-1]["dim"],), order=b.order, spec=b.spec,
                   peak_activation_bytes=image + peak["act_bytes"], peak_node=peak["name"], weight_bytes=weights,
                   buffer_bytes=buffers, peak_memory_bytes=image + peak["act_bytes"] + weights + buffers,
                   saved_activation_bytes=image + sum(d["saved_bytes"] for d in nodes))
    return g


def check_memory(graph: nx.DiGraph, max_memory: float | None = None) -> list[Problem]:
    """The memory limit: a batch-1 float32 forward must fit in ``max_memory`` bytes.

    Args:
        graph: an IR from :func:`build_graph`.
        max_memory: the limit in bytes; ``None`` takes :data:`DEFAULT_MAX_MEMORY` (read at call time,
            so a program may change the module default); ``math.inf`` disables the check.

    Returns:
        One located problem (at the stage, or the stem/input, holding the peak) when the estimate
        ``graph.graph["peak_memory_bytes"]`` exceeds the limit; else an empty list.
    """
    limit = DEFAULT_MAX_MEMORY if max_memory is None else max_memory
    total = graph.graph["peak_memory_bytes"]
    if total <= limit:
        return []
    node = graph.nodes[graph.graph["peak_node"]]
    path: tuple = ("stages", node["stage"]) if "stage" in node else (("stem",) if node["kind"] == "stem" else ("input", "resolution"))
    message = (f"a batch-1 float32 forward needs an estimated {format_bytes(total)} "
               f"(peak activations {format_bytes(graph.graph['peak_activation_bytes'])} at {node['name']}, "
               f"weights {format_bytes(graph.graph['weight_bytes'])}, buffers {format_bytes(graph.graph['buffer_bytes'])}), "
               f"over the memory limit of {format_bytes(limit)}")
    hint = (f"raise the limit (archspec build/validate --max-memory {_suggest(total)}, or max_memory= in load_spec/"
            "compile) if the machine has the memory, or reduce resolution, tokens, heads or head_dim")
    return [Problem(path, message, hint)]


def _suggest(total: float) -> str:
    return f"{math.ceil(total * 1.1 / 2**30)}G"


def check_spec(spec: ArchSpec, max_memory: float | None = None) -> list[Problem]:
    """Every shape problem of ``spec``, then the memory limit (:func:`check_memory`); empty when it compiles."""
    try:
        graph = build_graph(spec)
    except SpecError as exc:
        return exc.problems
    return check_memory(graph, max_memory)


def nodes_in_order(graph: nx.DiGraph) -> list[dict]:
    """Node attribute dicts in execution order."""
    return [graph.nodes[n] for n in graph.graph["order"]]
