"""The IR: a networkx DiGraph of the architecture with static shapes, parameter and MAC counts.

Step 2 of 3 (spec -> **graph** -> compile).  :func:`build_graph` walks the spec once, infers the
token grid and width after every node, checks everything that needs those shapes, and counts
parameters and MACs in closed form -- no tensor is allocated, so a search can reject a candidate
in microseconds.

Node order is execution order; edges link consecutive nodes (the data path).  Every node carries:

``kind``      one of ``input, stem, embed, shrink, block, head``
``name``      module path in the compiled model (``stages.1.blocks.0``)
``label``     what the block is (``attn``, ``levit``, ``conv3``, ``shrink``...)
``heads``     head kinds as letters, ``"M M G"`` (see :attr:`archspec.heads.HeadSpec.letter`)
``tokens``    tokens N after the node; ``grid`` its patch grid ``(rows, cols)``; ``dim`` width C
``params``    parameters (trainable and frozen, not buffers)
``macs``      multiply-accumulates for ONE image

MAC convention (the papers' "FLOPs"): every matmul, linear and convolution counts
``output elements x reduction length``; attention counts ``Q K^T`` and ``A V``; GPSA counts its
positional projection ``N^2 * 3 * n_gpsa`` once per forward; softmax, norms, activations, biases
and additions count 0.  ``torch.utils.flop_counter.FlopCounterMode`` reports 2 x this.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import networkx as nx

from archspec.errors import Problem, SpecError
from archspec.heads import HeadSpec
from archspec.spec import ArchSpec, LayerPlan, StageSpec

MAX_TOKENS = 4096  # attention memory grows with N^2; 4096 tokens is a 64x64 grid
MAX_PARAMS = 1_000_000_000  # 4 GB of float32 weights


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


def shrink_counts(in_dim: int, out_dim: int, heads: int, key_dim: int, attn_ratio: float, mlp_ratio: float,
                  grid: tuple[int, int], stride: int) -> tuple[int, int, tuple[int, int]]:
    """(params, MACs, output grid) of LeViT shrinking attention + its residual MLP (timm ``LevitDownsample``)."""
    rows, cols = grid
    out_grid = ((rows - 1) // stride + 1, (cols - 1) // stride + 1)
    n, nq = rows * cols, out_grid[0] * out_grid[1]
    v_dim = int(attn_ratio * key_dim)
    p_kv, m_kv = _linear(n, in_dim, heads * (key_dim + v_dim), bias=False, bn=True)
    p_q, m_q = _linear(nq, in_dim, heads * key_dim, bias=False, bn=True)
    p_proj, m_proj = _linear(nq, heads * v_dim, out_dim, bias=False, bn=True)
    hidden = int(out_dim * mlp_ratio)
    p_fc1, m_fc1 = _linear(nq, out_dim, hidden, bias=False, bn=True)
    p_fc2, m_fc2 = _linear(nq, hidden, out_dim, bias=False, bn=True)
    params = p_kv + p_q + p_proj + heads * n + p_fc1 + p_fc2
    macs = m_kv + m_q + m_proj + nq * n * heads * (key_dim + v_dim) + m_fc1 + m_fc2
    return params, macs, out_grid


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
        if plan.mixer.kernel > 2 * max(grid) + 1:
            _report_layer(problems, mixer_at + ("kernel",), layer,
                          f"conv kernel {plan.mixer.kernel} is larger than the {grid[0]}x{grid[1]} token grid allows",
                          f"use a kernel of at most {2 * max(grid) + 1}")
        return
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


def build_graph(spec: ArchSpec) -> nx.DiGraph:
    """Build the IR of ``spec``: shapes, parameter and MAC counts of every node.

    Returns:
        A ``networkx.DiGraph`` whose nodes, in execution order, carry the attributes listed in the
        module docstring; ``graph.graph`` holds totals (``params``, ``macs``, ``output``).

    Raises:
        SpecError: every shape problem found (empty grids, non-dividing resolutions, windows larger
            than the grid, GPSA with a class token, head arithmetic, caps), with field paths.
    """
    problems: list[Problem] = []
    g = nx.DiGraph(name=spec.name)
    order: list[str] = []

    def add(node_id: str, **attrs: Any) -> None:
        attrs.setdefault("params", 0)
        attrs.setdefault("macs", 0)
        attrs.setdefault("heads", "")
        g.add_node(node_id, name=node_id, **attrs)
        if order:
            g.add_edge(order[-1], node_id)
        order.append(node_id)

    in_ch = spec.input.channels
    height, width = spec.input.resolution
    first = spec.stages[0]
    add("input", kind="input", label="image", tokens=0, grid=(height, width), dim=in_ch)

    # --- stem -----------------------------------------------------------------------------------
    stem = spec.stem
    if stem.kind in ("patch", "identity"):
        p = stem.patch_size
        if height % p or width % p:
            problems.append(Problem(("stem", "patch_size"),
                                    f"patch size {p} does not divide the input resolution {height}x{width}",
                                    f"use a resolution that is a multiple of {p}, e.g. {max(p, height // p * p)}"))
        grid = (height // p, width // p)
        if stem.kind == "patch":
            params = in_ch * p * p * first.dim + first.dim
            macs = grid[0] * grid[1] * in_ch * p * p * first.dim
            stem_dim = first.dim
        else:
            params, macs, stem_dim = 0, 0, in_ch * p * p
            if first.dim != stem_dim:
                problems.append(Problem(("stages", 0, "dim"),
                                        f"an identity stem makes tokens of P^2 C = {p}*{p}*{in_ch} = {stem_dim} values, "
                                        f"but stages[0].dim is {first.dim}", f"set stages[0].dim: {stem_dim}"))
        add("stem", kind="stem", label=f"{stem.kind}{p}", tokens=grid[0] * grid[1], grid=grid, dim=stem_dim,
            params=params, macs=macs, config={"stem": stem})
    else:
        channels = stem.channels
        if channels is None:
            if first.dim % 8:
                problems.append(Problem(("stem", "channels"),
                                        f"default conv stem channels [C/8, C/4, C/2, C] need stages[0].dim divisible by 8, got {first.dim}",
                                        "give stem.channels explicitly"))
            channels = [max(first.dim // 8, 1), max(first.dim // 4, 1), max(first.dim // 2, 1), first.dim]
        elif channels[-1] != first.dim:
            problems.append(Problem(("stem", "channels"),
                                    f"the conv stem ends with {channels[-1]} channels but stages[0].dim is {first.dim}",
                                    f"make the last entry {first.dim}"))
        params = macs = 0
        h, w, c = height, width, in_ch
        for c_out in channels:
            h, w = _conv_out(h), _conv_out(w)
            params += 9 * c * c_out + 2 * c_out
            macs += h * w * 9 * c * c_out
            c = c_out
        grid = (h, w)
        if h < 1 or w < 1:
            problems.append(Problem(("stem",), f"{len(channels)} stride-2 convs leave an empty grid from {height}x{width}"))
        add("stem", kind="stem", label=f"conv{len(channels)}", tokens=max(h * w, 0), grid=grid, dim=c,
            params=params, macs=macs, config={"stem": stem, "channels": channels})
    if grid[0] < 1 or grid[1] < 1:
        problems.append(Problem(("stem",), f"the stem's output grid {grid[0]}x{grid[1]} is empty",
                                "use a larger input resolution or a smaller patch size"))
        raise SpecError(problems)
    if grid[0] * grid[1] + 2 > MAX_TOKENS:
        problems.append(Problem(("input", "resolution"),
                                f"{grid[0]}x{grid[1]} = {grid[0] * grid[1]} tokens exceeds the cap of {MAX_TOKENS}",
                                "use a larger patch size or a smaller resolution"))
        raise SpecError(problems)

    # --- tokens ---------------------------------------------------------------------------------
    tok = spec.tokens
    depth = spec.depth
    n_extra = (tok.cls_token != "none") + tok.dist_token
    cls_at = 0 if tok.cls_token == "input" else (None if tok.cls_token == "none" else tok.cls_token)
    if cls_at is not None and cls_at > depth:
        problems.append(Problem(("tokens", "cls_token"),
                                f"class token inserted before block {cls_at}, but the model has {depth} blocks (0-{depth - 1})"))
    if tok.dist_token and cls_at is None:
        problems.append(Problem(("tokens", "dist_token"), "a distillation token needs a class token",
                                "set tokens.cls_token: input"))
    if tok.dist_token and not spec.head.distillation:
        problems.append(Problem(("tokens", "dist_token"), "a distillation token without a distillation head is unused",
                                "set head.distillation: true"))
    if spec.head.pool == "cls" and cls_at is None:
        problems.append(Problem(("head", "pool"), "pool: cls needs a class token", "set tokens.cls_token, or head.pool: mean"))
    if spec.head.distillation and spec.head.pool == "cls" and not tok.dist_token:
        problems.append(Problem(("head", "distillation"), "a distillation head with pool: cls reads the distillation token",
                                "set tokens.dist_token: true (DeiT), or head.pool: mean (LeViT)"))
    dim = first.dim
    n_prefix = n_extra if cls_at == 0 else 0
    embed_len = grid[0] * grid[1] + n_prefix
    embed_params = n_extra * dim + (embed_len * dim if tok.pos_embed == "learned" else 0)
    add("embed", kind="embed", label="tokens", tokens=embed_len, grid=grid, dim=dim, params=embed_params,
        config={"n_extra": n_extra, "cls_at": cls_at, "pos_embed_len": embed_len if tok.pos_embed == "learned" else 0})

    # --- stages ---------------------------------------------------------------------------------
    block_index = 0
    for i, stage in enumerate(spec.stages):
        if stage.shrink is not None:
            if i == 0:
                problems.append(Problem(("stages", 0, "shrink"), "the first stage cannot start with shrinking attention",
                                        "put shrink on a later stage"))
            else:
                sh = stage.shrink
                heads = sh.heads if sh.heads is not None else max(dim // sh.key_dim, 1)
                if n_prefix:
                    problems.append(Problem(("stages", i, "shrink"), "shrinking attention needs a pure token grid, "
                                            "but a class/distillation token is present", "use tokens.cls_token: none"))
                params, macs, out_grid = shrink_counts(dim, stage.dim, heads, sh.key_dim, sh.attn_ratio,
                                                       sh.mlp_ratio, grid, sh.stride)
                add(f"stages.{i}.downsample", kind="shrink", label=f"shrink/{sh.stride}", stage=i,
                    heads=" ".join(["L"] * heads), tokens=out_grid[0] * out_grid[1], grid=out_grid, dim=stage.dim,
                    params=params, macs=macs,
                    config={"in_dim": dim, "out_dim": stage.dim, "heads": heads, "key_dim": sh.key_dim,
                            "attn_ratio": sh.attn_ratio, "mlp_ratio": sh.mlp_ratio, "grid": grid,
                            "stride": sh.stride, "act": stage.act})
                grid, dim = out_grid, stage.dim
        elif i > 0 and stage.dim != dim:
            problems.append(Problem(("stages", i, "dim"), f"width changes from {dim} to {stage.dim} without a transition",
                                    "add 'shrink:' (LeViT shrinking attention) to this stage, or keep the width"))
            dim = stage.dim
        if stage.head_dim is None and stage.key_dim is None and stage.dim % stage.heads:
            problems.append(Problem(("stages", i, "heads"),
                                    f"dim {stage.dim} is not divisible by {stage.heads} heads (head dim is dim / heads)",
                                    "change dim or heads, or set head_dim explicitly"))
            continue
        check_stage_overrides(spec, i, problems)
        dims = attn_dims(stage)
        if dims.v_dim < 1:
            problems.append(Problem(("stages", i, "attn_ratio"), "value dim attn_ratio * key_dim rounds to 0"))
            continue
        plans = spec.layer_plans(i)
        batchnorm = stage.norm == "batchnorm"
        for layer, plan in enumerate(plans):
            if cls_at is not None and cls_at == block_index and cls_at > 0:
                n_prefix = n_extra
                add(f"insert_tokens.{block_index}", kind="insert", label="+cls" + ("+dist" if tok.dist_token else ""),
                    tokens=n_prefix + grid[0] * grid[1], grid=grid, dim=dim, config={"n_extra": n_extra})
            n_tokens = n_prefix + grid[0] * grid[1]
            _check_layer(spec, i, layer, plan, grid, n_prefix, problems)
            if plan.mixer.kind == "conv":
                k = plan.mixer.kernel
                p_mix, m_mix = k * k * dim * dim + dim, grid[0] * grid[1] * k * k * dim * dim
                label, heads_str = f"conv{k}", f"conv{k}x{k}"
            else:
                p_mix, m_mix = attention_counts(dim, plan.heads, dims, grid, n_prefix, stage.qkv_bias, batchnorm)
                label, heads_str = ("levit" if batchnorm else "attn"), " ".join(h.letter for h in plan.heads)
            hidden = int(dim * stage.mlp_ratio)
            if batchnorm:
                p_fc1, m_fc1 = _linear(n_tokens, dim, hidden, bias=False, bn=True)
                p_fc2, m_fc2 = _linear(n_tokens, hidden, dim, bias=False, bn=True)
                p_norm = 0
            else:
                p_fc1, m_fc1 = _linear(n_tokens, dim, hidden, bias=True)
                p_fc2, m_fc2 = _linear(n_tokens, hidden, dim, bias=True)
                p_norm = 4 * dim + (2 * dim if stage.layer_scale is not None else 0)
            add(f"stages.{i}.blocks.{layer}", kind="block", label=label, stage=i, layer=block_index, heads=heads_str,
                tokens=n_tokens, grid=grid, dim=dim, params=p_mix + p_fc1 + p_fc2 + p_norm, macs=m_mix + m_fc1 + m_fc2,
                config={"stage": i, "layer": layer, "plan": plan, "grid": grid, "n_prefix": n_prefix, "dims": dims})
            block_index += 1
    if cls_at is not None and cls_at == depth and depth > 0:
        n_prefix = n_extra
        add(f"insert_tokens.{depth}", kind="insert", label="+cls", tokens=n_prefix + grid[0] * grid[1], grid=grid,
            dim=dim, config={"n_extra": n_extra})

    # --- head -----------------------------------------------------------------------------------
    head = spec.head
    batchnorm = spec.stages[-1].norm == "batchnorm"
    n_cls = head.num_classes
    # layernorm family: one LayerNorm (before cls pooling, or after mean pooling as timm's fc_norm) + Linear
    # heads; batchnorm family: timm NormLinear (BatchNorm1d + Linear) per head; num_classes 0 = no head.
    n_heads_out = 2 if head.distillation else 1
    if n_cls == 0:
        params = 0 if batchnorm else 2 * dim
    else:
        params = n_heads_out * (dim * n_cls + n_cls + (2 * dim if batchnorm else 0)) + (0 if batchnorm else 2 * dim)
    macs = dim * n_cls * (2 if head.distillation else 1)
    add("head", kind="head", label=f"{head.pool}-pool", tokens=1, grid=(1, 1), dim=n_cls or dim, params=params, macs=macs,
        heads="", config={"batchnorm": batchnorm})

    total_params = sum(d["params"] for _, d in g.nodes(data=True))
    if total_params > MAX_PARAMS:
        problems.append(Problem(("stages",), f"{total_params / 1e9:.1f}B parameters exceeds the cap of {MAX_PARAMS / 1e9:.0f}B"))
    if problems:
        raise SpecError(problems)
    g.graph.update(params=total_params, macs=sum(d["macs"] for _, d in g.nodes(data=True)),
                   output=(n_cls or dim,), order=order, spec=spec)
    return g


def check_spec(spec: ArchSpec) -> list[Problem]:
    """Every shape problem of ``spec`` (empty when it compiles)."""
    try:
        build_graph(spec)
    except SpecError as exc:
        return exc.problems
    return []


def nodes_in_order(graph: nx.DiGraph) -> list[dict]:
    """Node attribute dicts in execution order."""
    return [graph.nodes[n] for n in graph.graph["order"]]
