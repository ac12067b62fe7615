"""The IR's one walk over a spec: node records in execution order, each counted by its block family.

:func:`walk` infers the token grid and width after every node, checks everything that needs those shapes, and
counts parameters, MACs and memory in closed form -- no tensor is allocated, so a search rejects a candidate in
microseconds.  What a record holds, the MAC convention and the memory rule: :mod:`archspec.ir.plan`, which keeps
the walk's result as an immutable :class:`~archspec.ir.plan.Plan`.  Torch-free and networkx-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from archspec._util.memory import F32, NodeMemory
from archspec.errors import Problem, SpecError
from archspec.families import rules as family_rules
from archspec.families.attention.rules import AttentionShape, head_dims
from archspec.families.block.rules import BlockEntry, BlockShape
from archspec.families.conv_mixer.rules import ConvMixerShape
from archspec.families.head.rules import HeadShape
from archspec.families.talking_heads.rules import TalkingHeadsShape
from archspec.families.tokens.rules import TokensPlan
from archspec.spec import ArchSpec, LayerPlan

__all__ = ["walk", "check_stage_overrides", "MAX_TOKENS", "MAX_PARAMS"]

#: the stem grid's cap: a 128x128 grid (Swin at 512 px; windowed heads attend N w^2 pairs, global heads N^2, which
#: the memory limit, archspec.ir.plan.check_memory, bounds first: 4096 tokens, a 64x64 grid, until Swin at 384 px)
MAX_TOKENS = 16384
MAX_PARAMS = 1_000_000_000  # 4 GB of float32 weights
_NO_MEMORY = NodeMemory()  # nodes that hold nothing (the input)

STEM, TOKENS, ATTENTION, TALKING_HEADS, CONV_MIXER, CONV_BLOCK = (family_rules(n) for n in (
    "stem", "tokens", "attention", "talking_heads", "conv_mixer", "conv_block"))
BLOCK, SHRINK, DOWNSAMPLE, CLASS_ATTENTION, HEAD, INTERFACE = (family_rules(n) for n in (
    "block", "shrink", "downsample", "class_attention", "head", "interface"))


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


def check_stage_overrides(spec: ArchSpec, i: int, problems: list[Problem]) -> None:
    """Range, overlap, gap and per-head-length checks of ``stages[i].layers``."""
    stage = spec.stages[i]
    covered: dict[int, int] = {}
    for j, override in enumerate(stage.layers):
        start, end = override.range
        if end >= stage.depth:
            problems.append(Problem(("stages", i, "layers", j, "range"),
                                    f"layer range {start}-{end} exceeds the stage depth {stage.depth} "
                                    f"(layers 0-{stage.depth - 1})"))
        if override.heads is not None and len(override.heads) != stage.heads:
            problems.append(Problem(("stages", i, "layers", j, "heads"),
                                    f"{len(override.heads)} head entries for a stage of {stage.heads} heads",
                                    "give exactly one entry per head, or 'attention:' for all heads"))
        for layer in range(start, min(end, stage.depth - 1) + 1):
            if layer in covered and (override.heads is not None or override.attention is not None):
                other = stage.layers[covered[layer]]
                if other.heads is not None or other.attention is not None:
                    problems.append(Problem(("stages", i, "layers", j, "range"),
                                            f"layer range {start}-{end} overlaps range "
                                            f"{other.range[0]}-{other.range[1]} "
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
                                    f"layers {_ranges(gaps)} are not covered by any range "
                                    "and the stage has no default 'attention'",
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


class _Builder:
    """Collects the node records in execution order and the problems found."""

    def __init__(self, spec: ArchSpec):
        self.spec = spec
        self.nodes: list[dict[str, Any]] = []
        self.problems: list[Problem] = []

    def add(self, node_id: str, memory: NodeMemory = _NO_MEMORY, **attrs: Any) -> None:
        attrs.setdefault("params", 0)
        attrs.setdefault("macs", 0)
        attrs.setdefault("macs_executed", attrs["macs"])
        attrs.setdefault("heads", "")
        self.nodes.append(dict(name=node_id, act_bytes=memory.act, saved_bytes=memory.saved,
                               buffer_bytes=memory.buffers, **attrs))

    def add_family(self, node_id: str, family: str, shape: Any, **attrs: Any) -> None:
        """A node counted by ``family``'s rules for ``shape`` (params, MACs, executed MACs, memory)."""
        rules = family_rules(family)
        params, macs = rules.counts(shape)
        executed = rules.executed_macs(shape) if hasattr(rules, "executed_macs") else macs
        self.add(node_id, rules.memory(shape), family=family, shape=shape, params=params, macs=macs,
                 macs_executed=executed, **attrs)

    def problem(self, path: tuple, message: str, hint: str | None = None) -> None:
        self.problems.append(Problem(path, message, hint))

    def problems_of(self, found: list[tuple[tuple, str, str]]) -> None:
        """Record a family's ``(path, message, hint)`` problems."""
        for path, message, hint in found:
            self.problem(path, message, hint)


def walk(spec: ArchSpec) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One walk over ``spec``: its node records in execution order and the totals (:mod:`archspec.ir.plan` lists
    both), computed from each node's block family -- no tensor, no graph.  Reads ``spec`` without keeping it
    (:func:`archspec.ir.plan.build_plan` hands in its own copy and keeps that).

    Raises:
        SpecError: every shape problem found (empty grids, non-dividing resolutions, windows larger
            than the grid, GPSA with a class token, head arithmetic, the token and parameter caps), with field
            paths.
    """
    b = _Builder(spec)
    height, width = spec.input.resolution
    b.add("input", kind="input", label="image", tokens=0, grid=(height, width), dim=spec.input.channels)
    if _check_stage_kinds(b):
        return _build_convnet(b)
    grid, dim = _add_stem(b)
    if spec.is_hybrid:
        grid, dim = _add_interface(b, *_add_conv_stages(b, grid, dim))
    _check_grid(b, grid)
    tokens = _resolve_tokens(b)
    flow = _add_embed(b, tokens, grid, dim)
    for i in range(spec.n_conv_stages, spec.tail_start):
        _add_stage(b, i, flow, tokens)
    if spec.has_conv_tail:  # conv, attention, conv: the tokens become a map again; ResNet's head
        grid, channels = _add_conv_stages(b, *_add_tokens_to_map(b, flow), range(spec.tail_start, len(spec.stages)),
                                          flow.block_index)
        _add_map_head(b, grid, channels)
        return _finish(b)
    if tokens.cls_at is not None and tokens.cls_at == spec.depth and spec.depth > 0:
        _add_insert(b, flow, tokens)
    if spec.class_attention is not None:
        _add_class_attention(b, flow, tokens)
    _add_head(b, flow)
    return _finish(b)


def _check_stage_kinds(b: _Builder) -> bool:
    """Whether the spec is a conv net (a map stem -- ResNet's or MaxxViT's -- and conv stages only); raises every
    problem of a spec whose stage kinds do not join: an attention stage after a conv tail (conv stages after
    attention stages), leading conv stages after a token stem, a map stem before attention stages with no conv
    stage between, a conv tail
    with what needs the class token (:func:`_check_conv_tail`), and a conv net with class or distillation tokens,
    a position embedding, class-token pooling or CaiT's class attention.  A hybrid (conv stages, then attention
    stages) is checked by :func:`_add_interface`."""
    spec = b.spec
    conv = [isinstance(s, CONV_BLOCK.ConvStageBase) for s in spec.stages]
    map_stem = spec.stem.kind in STEM.MAP_STEMS
    if not any(conv) and not map_stem:
        return False
    # A conv stage after attention stages (a sandwich) takes the tokens back as a map: every stage after it must
    # be a conv stage, and the model ends on the ResNet head (see _add_tokens_to_map).
    n_conv, tail = spec.n_conv_stages, spec.tail_start
    for i in range(tail, len(conv)):
        if not conv[i]:
            b.problem(("stages", i, "kind"), f"an attention stage after the conv stages that follow attention stages "
                      f"(from stages[{tail}]) is not supported: the map would need a second interface",
                      "end the model on its conv stages (conv, attention, conv), or move this stage before "
                      f"stages[{tail}]")
    if n_conv and not map_stem:
        b.problem(("stem", "kind"), f"conv stages need the feature map of a resnet, maxxvit or mobilevit stem, not "
                  f"the tokens of a {spec.stem.kind} stem",
                  "set stem: {kind: resnet} (ResNet's), {kind: maxxvit} (CoAtNet's, MaxViT's) or {kind: mobilevit}")
    if spec.has_conv_tail:
        _check_conv_tail(b)
    if map_stem and n_conv == 0:
        b.problem(("stem", "kind"), f"the {spec.stem.kind} stem makes a feature map, which an attention stage takes "
                  "only after a conv stage", "add a kind: conv stage first, or use a patch, conv or identity stem")
    if b.problems:
        raise SpecError(b.problems)
    if not spec.is_convnet:
        return False
    if spec.tokens.cls_token != "none":
        b.problem(("tokens", "cls_token"), "a conv net has no tokens to prepend a class token to",
                  "set tokens: {cls_token: none, pos_embed: none}")
    if spec.tokens.dist_token:
        b.problem(("tokens", "dist_token"), "a conv net has no distillation token", "remove tokens.dist_token")
    if spec.tokens.pos_embed != "none":
        b.problem(("tokens", "pos_embed"), "a conv net has no tokens to add a position embedding to",
                  "set tokens: {cls_token: none, pos_embed: none}")
    if spec.head.pool != "mean":
        b.problem(("head", "pool"), "a conv net's head averages the final map (there is no class token)",
                  "set head.pool: mean")
    if spec.head.distillation:
        b.problem(("head", "distillation"), "a distillation head is not supported for conv nets",
                  "remove head.distillation")
    if spec.class_attention is not None:
        b.problem(("class_attention",), "CaiT's class attention needs tokens; a conv net has a feature map",
                  "remove class_attention")
    if b.problems:
        raise SpecError(b.problems)
    return True


def _check_conv_tail(b: _Builder) -> None:
    """What a model ending on conv stages after attention stages cannot have: the class token is dropped where
    the tokens become a map, so class-token pooling, a distillation head, CaiT's class attention and a class
    token inserted after the last attention block (dropped at once) are refused where they are written."""
    spec, tail = b.spec, b.spec.tail_start
    at = f"the tokens become a map at stages[{tail}] (class and distillation tokens dropped)"
    if spec.head.pool != "mean":
        b.problem(("head", "pool"), f"{at}; the head averages the final map", "set head.pool: mean")
    if spec.head.distillation:
        b.problem(("head", "distillation"), f"{at}; a distillation head has no token to read",
                  "remove head.distillation")
    if spec.class_attention is not None:
        b.problem(("class_attention",), f"{at}; CaiT's class attention needs tokens after the last stage",
                  "remove class_attention")
    depth = spec.depth
    if isinstance(spec.tokens.cls_token, int) and not isinstance(spec.tokens.cls_token, bool) \
            and spec.tokens.cls_token == depth and depth > 0:
        b.problem(("tokens", "cls_token"), f"a class token inserted after the last attention block (block {depth}) "
                  f"is dropped at once: {at}", "use an earlier block, or cls_token: none")


def _add_tokens_to_map(b: _Builder, flow: _Flow) -> tuple[tuple[int, int], int]:
    """The tokens ``(B, n_prefix + gh gw, C)`` after the last attention stage -> the map ``(B, C, gh, gw)`` the conv
    tail takes (family ``interface``, :class:`~archspec.families.interface.rules.TokensToMapShape`): the class and
    distillation tokens are dropped (as BoTNet-style hybrids after ViT backbones and timm's
    ``forward_intermediates`` do), the patch tokens laid out row-major on the stage's token grid.  No parameters,
    no MACs.  Returns the map's grid and channels."""
    i = b.spec.tail_start
    shape = INTERFACE.TokensToMapShape(flow.dim, tuple(flow.grid), flow.n_prefix)
    b.add_family("to_map", "interface", shape, kind="to_map", label=INTERFACE.label(shape), stage=i,
                 tokens=flow.grid[0] * flow.grid[1], grid=tuple(flow.grid), dim=flow.dim)
    return tuple(flow.grid), flow.dim


def _add_conv_stages(b: _Builder, grid: tuple[int, int], channels: int, stages: range | None = None,
                     index: int = 0) -> tuple[tuple[int, int], int]:
    """Each conv stage's blocks (the stage's family: ``conv_block`` for ResNet's, ``mbconv``, ``mobilevit``), the
    leading ones unless ``stages`` says which (a conv tail's); returns the map's size and channels after them.
    ``tokens`` of a node is the map's pixel count ``H x W``, ``dim`` its channels; ``layer`` counts blocks from
    ``index``."""
    for i in (range(b.spec.n_conv_stages) if stages is None else stages):
        stage = b.spec.stages[i]
        rules = family_rules(stage.family)
        shapes, found = rules.plan(stage, i, channels, grid)
        b.problems_of(found)
        for layer, block in enumerate(shapes):
            grid = rules.out_grid(block)
            b.add_family(f"stages.{i}.blocks.{layer}", stage.family, block, kind="block", label=rules.label(block),
                         stage=i, layer=index + layer, tokens=grid[0] * grid[1], grid=grid, dim=block.channels,
                         heads=rules.head_letters(block), bn_channels=rules.batchnorm_channels(block),
                         bn_channels_into_bias=rules.batchnorm_channels_into_bias(block))
        if not shapes:  # refused: carry on with the map the stage would have made, to find later problems
            grid = (max((grid[0] - 1) // stage.stride + 1, 1), max((grid[1] - 1) // stage.stride + 1, 1))
        channels, index = stage.channels, index + (len(shapes) or stage.depth)  # a MobileViT stage: depth + 1
    return grid, channels


def _build_convnet(b: _Builder) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The IR of a conv net: the map stem, each conv stage's blocks (family ``conv_block`` or ``mbconv``), the
    average-pool + classifier head."""
    _add_map_head(b, *_add_conv_stages(b, *_add_stem(b)))
    return _finish(b)


def _add_map_head(b: _Builder, grid: tuple[int, int], channels: int) -> None:
    """timm ResNet's head on the last map (a conv net's, or a conv tail's): average pool + classifier, no norm."""
    head = b.spec.head
    if head.norm is not None:
        b.problem(("head", "norm"), "a head on a feature map (timm ResNet's) has no final LayerNorm to place",
                  "remove head.norm")
    shape = HeadShape(channels, grid[0] * grid[1], head.num_classes, False, False, head.pool, final_norm=False)
    b.add_family("head", "head", shape, kind="head", label="avg-pool", tokens=1, grid=(1, 1),
                 dim=head.num_classes or channels, heads="", bn_channels_into_bias=0)


def _add_interface(b: _Builder, grid: tuple[int, int], channels: int) -> tuple[tuple[int, int], int]:
    """A hybrid's map -> tokens node (family ``interface``) entering the first attention stage; returns the token
    grid and width.  That stage cannot also open with a shrinking attention or a downsample (its input is the
    interface's)."""
    i = b.spec.n_conv_stages
    stage = b.spec.stages[i]
    for field, what in (("shrink", "a shrinking attention"), ("downsample", "a downsample")):
        if getattr(stage, field) is not None and not _pools_in_block(stage):
            b.problem(("stages", i, field), "the first attention stage after conv stages takes the map through its "
                      f"interface (from_map); {what} cannot open it", f"remove {field} here; pool the map "
                      "with from_map: {pool: avg, grid: N} instead, or let its first block pool (downsample: pool, "
                      "CoAtNet's)")
    # a stage whose first block pools takes the map's pixels at the map's width (the block changes it)
    width = channels if _pools_in_block(stage) else stage.dim
    shape, found = INTERFACE.plan(stage.from_map, channels, grid, width, ("stages", i))
    b.problems_of(found)
    out = INTERFACE.out_grid(shape)
    b.add_family("interface", "interface", shape, kind="interface", label=INTERFACE.label(shape), stage=i,
                 tokens=out[0] * out[1], grid=out, dim=width)
    return out, width


def _add_stem(b: _Builder) -> tuple[tuple[int, int], int]:
    """The stem node (family ``stem``); returns the token grid and width after it."""
    spec = b.spec
    shape, found = STEM.plan(spec.stem, spec.input.channels, spec.input.resolution, spec.stages[0].dim,
                             getattr(spec.stages[0], "norm_eps", 1e-6))
    b.problems_of(found)
    grid = STEM.out_grid(shape)
    b.add_family("stem", "stem", shape, kind="stem", label=STEM.label(shape), tokens=grid[0] * grid[1], grid=grid,
                 dim=shape.dim, bn_channels=STEM.batchnorm_channels(shape))
    return grid, shape.dim


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
    """Token width entering global token block ``index`` (the last stage's width after the last block)."""
    for stage in spec.stages[spec.n_conv_stages:spec.tail_start]:
        if index < stage.depth:
            return stage.dim
        index -= stage.depth
    return spec.stages[spec.tail_start - 1].dim


def _resolve_tokens(b: _Builder) -> TokensPlan:
    """Check the ``tokens`` and ``head`` options against each other; where the class token enters."""
    spec = b.spec
    tokens, found = TOKENS.plan(spec.tokens, spec.head.pool, spec.head.distillation, spec.depth,
                                lambda index: _width_before_block(spec, index), spec.stages[spec.n_conv_stages].dim)
    b.problems_of(found)
    return tokens


def _add_embed(b: _Builder, tokens: TokensPlan, grid: tuple[int, int], dim: int) -> _Flow:
    """Class/distillation tokens present from the start and the position embedding (params of every extra token)."""
    pos = b.spec.tokens.pos_embed == "learned"
    n_prefix = tokens.n_extra if tokens.cls_at == 0 else 0
    embed_len = grid[0] * grid[1] + n_prefix
    memory = TOKENS.concat_memory(grid[0] * grid[1], embed_len, dim, pos) if (n_prefix or pos) else NodeMemory()
    b.add("embed", memory, kind="embed", family="tokens", label="tokens", tokens=embed_len, grid=grid, dim=dim,
          params=TOKENS.embed_params(tokens, embed_len, dim, pos), tokens_plan=tokens,
          pos_embed_len=embed_len if pos else 0)
    return _Flow(grid=grid, dim=dim, n_prefix=n_prefix)


def _add_insert(b: _Builder, flow: _Flow, tokens: TokensPlan) -> None:
    """Class (and distillation) token concatenated before block ``flow.block_index`` (ConViT)."""
    n_patches = flow.grid[0] * flow.grid[1]
    flow.n_prefix = tokens.n_extra
    label = "+cls" + ("+dist" if b.spec.tokens.dist_token else "")
    b.add(f"insert_tokens.{flow.block_index}",
          TOKENS.concat_memory(n_patches, n_patches + flow.n_prefix, flow.dim, False),
          kind="insert", family="tokens", label=label, tokens=n_patches + flow.n_prefix, grid=flow.grid, dim=flow.dim)


def _add_stage(b: _Builder, i: int, flow: _Flow, tokens: TokensPlan) -> None:
    """Shrinking attention (if any) and the blocks of ``stages[i]``; advances ``flow``."""
    stage = b.spec.stages[i]
    if stage.from_map is not None and (i != b.spec.n_conv_stages or i == 0):
        b.problem(("stages", i, "from_map"), "from_map applies only to the first attention stage after conv stages "
                  "(where a feature map becomes tokens); this stage receives tokens",
                  "remove from_map here, or put kind: conv stages before this stage")
    opens_hybrid = i == b.spec.n_conv_stages and i > 0  # its transitions are refused by _add_interface
    entry = None
    if stage.shrink is not None and stage.downsample is not None:
        b.problem(("stages", i, "downsample"), "a stage opens with one transition, but this one has both shrink "
                  "and downsample", "keep one: shrink (LeViT) or downsample (Swin, NAT, CoAtNet's pool)")
    elif stage.shrink is not None and not opens_hybrid:
        _add_shrink(b, i, flow)
    elif _pools_in_block(stage):
        entry = _block_entry(b, i, flow)
    elif stage.downsample is not None and not opens_hybrid:
        _add_downsample(b, i, flow)
    elif i > b.spec.n_conv_stages and stage.dim != flow.dim:
        b.problem(("stages", i, "dim"), f"width changes from {flow.dim} to {stage.dim} without a transition",
                  "add 'shrink:' (LeViT shrinking attention) or 'downsample:' (Swin's patch_merging, NAT's conv) "
                  "to this stage, or keep the width")
        flow.dim = stage.dim
    if stage.head_dim is None and stage.key_dim is None and stage.dim % stage.heads:
        b.problem(("stages", i, "heads"), f"dim {stage.dim} is not divisible by {stage.heads} heads (head dim is "
                  "dim / heads)", "change dim or heads, or set head_dim explicitly")
        flow.block_index += stage.depth
        return
    check_stage_overrides(b.spec, i, b.problems)
    plans = b.spec.layer_plans(i)
    if stage.talking_heads:
        heads = [h for plan in plans if plan.mixer.kind != "conv" for h in plan.heads]
        b.problems_of(TALKING_HEADS.stage_problems(stage.norm, stage.head_dim, stage.key_dim, stage.attn_ratio, heads,
                                                   ("stages", i, "talking_heads")))
    dims = head_dims(stage.dim, stage.heads, stage.head_dim, stage.key_dim, stage.attn_ratio)
    if dims.qk_dim < 1 or dims.v_dim < 1:  # normally refused by StageSpec already; kept for specs built unchecked
        b.problem(("stages", i, "attn_ratio"), f"per-head dims q/k {dims.qk_dim}, value {dims.v_dim}: one rounds to 0",
                  "raise attn_ratio, key_dim or head_dim")
        flow.block_index += stage.depth
        return
    for layer, plan in enumerate(plans):
        if tokens.cls_at is not None and tokens.cls_at == flow.block_index and tokens.cls_at > 0:
            _add_insert(b, flow, tokens)
        _add_block(b, i, layer, plan, dims, flow, entry if layer == 0 else None)
        flow.block_index += 1


def _pools_in_block(stage: Any) -> bool:
    """Whether ``stage``'s first block downsamples inside itself (``downsample: pool``, CoAtNet's)."""
    return getattr(getattr(stage, "downsample", None), "kind", None) == "pool"


def _block_entry(b: _Builder, i: int, flow: _Flow) -> BlockEntry | None:
    """CoAtNet's downsampling first block of ``stages[i]`` (``downsample: pool``): its entry (input width and grid,
    pool, shortcut bias) and its problems -- prefix tokens, an odd grid side (timm's 2x2 pool would floor it), a
    first block that is not an attention block of the layernorm family, an input width the heads cannot split
    (``attention: input``); advances ``flow`` to the pooled grid and the stage's width.  None when refused."""
    stage, at = b.spec.stages[i], ("stages", i, "downsample")
    spec, (rows, cols) = stage.downsample, flow.grid
    found = len(b.problems)
    if flow.n_prefix:
        b.problem(at, "a block that pools its input needs a pure token grid, but a class/distillation token is "
                  "present", "use tokens: {cls_token: none} (CoAtNet has none), or insert it after this stage")
    if rows % 2 or cols % 2:
        b.problem(at, f"the first block's 2x2 pool needs even sides, but this stage enters on a {rows}x{cols} grid "
                  "(timm's pool would floor an odd side, which its stage's grid rounds up)",
                  f"use an input size whose grid here has even sides ({rows + rows % 2}x{cols + cols % 2}), or "
                  "downsample: patch_merging (which pads)")
    if stage.norm != "layernorm" or stage.talking_heads or stage.layers and any(
            o.mixer is not None and o.mixer.kind == "conv" and o.range[0] == 0 for o in stage.layers) \
            or stage.mixer.kind == "conv":
        b.problem(at, "a block that pools its input is a pre-norm attention block (timm TransformerBlock2d)",
                  "use norm: layernorm, no talking_heads and an attention mixer in the stage's first layer")
    dims = head_dims(stage.dim, stage.heads, stage.head_dim, stage.key_dim, stage.attn_ratio)
    if spec.attention == "input" and (flow.dim % dims.qk_dim or dims.qk_dim != dims.v_dim):
        b.problem(("stages", i, "downsample", "attention"), f"attention at the input width {flow.dim} splits it into "
                  f"heads of {dims.qk_dim} channels, which do not divide it (or the value width "
                  f"{dims.v_dim} differs)", f"use attention: output, or a head_dim dividing {flow.dim}")
    entry = BlockEntry(flow.dim, tuple(flow.grid), spec.pool, spec.shortcut_bias)
    flow.grid, flow.dim = (max(rows // 2, 1), max(cols // 2, 1)), stage.dim
    return entry if len(b.problems) == found else None


def _add_shrink(b: _Builder, i: int, flow: _Flow) -> None:
    """LeViT shrinking attention entering ``stages[i]`` (family ``shrink``): subsamples the grid, changes the width."""
    stage = b.spec.stages[i]
    shape, found = SHRINK.plan(stage.shrink, flow.dim, stage.dim, flow.grid, flow.n_prefix, i, stage.act)
    b.problems_of(found)
    if shape is None:
        return
    out_grid = SHRINK.out_grid(shape)
    b.add_family(f"stages.{i}.downsample", "shrink", shape, kind="shrink", label=f"shrink/{shape.stride}", stage=i,
                 heads=" ".join(["L"] * shape.heads), tokens=out_grid[0] * out_grid[1], grid=out_grid, dim=stage.dim,
                 bn_channels=SHRINK.batchnorm_channels(shape))
    flow.grid, flow.dim = out_grid, stage.dim


def _add_downsample(b: _Builder, i: int, flow: _Flow) -> None:
    """Swin's patch merging or NAT's conv downsampler entering ``stages[i]`` (family ``downsample``): halves the
    grid (ceil), changes the width to the stage's; refused on the first stage and with a class token."""
    stage = b.spec.stages[i]
    shape, found = DOWNSAMPLE.plan(stage.downsample, flow.dim, stage.dim, flow.grid, flow.n_prefix, i,
                                   stage.norm_eps)
    b.problems_of(found)
    if shape is None:
        flow.dim = stage.dim  # carry on at the stage's width, to find later problems
        return
    out_grid = DOWNSAMPLE.out_grid(shape)
    b.add_family(f"stages.{i}.downsample", "downsample", shape, kind="downsample", label=DOWNSAMPLE.label(shape),
                 stage=i, tokens=out_grid[0] * out_grid[1], grid=out_grid, dim=stage.dim)
    flow.grid, flow.dim = out_grid, stage.dim


def _mixer(b: _Builder, i: int, layer: int, plan: LayerPlan, dims, flow: _Flow,
           entry: BlockEntry | None = None) -> tuple[str, Any]:
    """The block's token mixer: its family, its shape, and (recorded) the problems its rules find.  A block that
    pools its input (``entry``) attends from its input width: with ``attention: input`` at that width
    (``in_dim / head_dim`` of the layer's heads), else at the stage's, projecting to the stage's width."""
    spec, stage = b.spec, b.spec.stages[i]
    if plan.mixer.kind == "conv":  # CMHSA phase 1: K x K conv on the pixel view, c = d / P^2 channels
        at: tuple = ("stages", i, "mixer")  # where the conv mixer of this layer was written
        for j, override in enumerate(stage.layers):
            if override.mixer is not None and override.range[0] <= layer <= override.range[1]:
                at = ("stages", i, "layers", j, "mixer")
        patch = spec.pixel_patch(plan.mixer)
        for path, text, hint in CONV_MIXER.problems(flow.dim, plan.mixer.kernel, flow.grid, patch, flow.n_prefix, at):
            _report_layer(b.problems, path, layer, text, hint)
        return "conv_mixer", ConvMixerShape(flow.dim, plan.mixer.kernel, flow.grid, patch or 1)
    for path, text, hint in ATTENTION.head_problems(plan.heads, flow.grid, flow.n_prefix, plan.mixer.pad_tokens,
                                                    plan.origin):
        _report_layer(b.problems, path, layer, text, hint)
    if stage.talking_heads:  # CaiT
        return "talking_heads", TalkingHeadsShape(flow.dim, tuple(plan.heads), flow.grid, flow.n_prefix, stage.qkv_bias)
    heads, dim, out_dim = tuple(plan.heads), flow.dim, None
    if entry is not None:
        dim, out_dim = entry.in_dim, flow.dim
        if stage.downsample.attention == "input":
            heads = heads[:max(entry.in_dim // dims.qk_dim, 1)]
    return "attention", AttentionShape(dim, heads, flow.grid, flow.n_prefix, dims, stage.qkv_bias, stage.norm,
                                       stage.act, plan.mixer.pad_tokens, out_dim=out_dim, init=stage.init)


def _add_block(b: _Builder, i: int, layer: int, plan: LayerPlan, dims, flow: _Flow,
               entry: BlockEntry | None = None) -> None:
    """One block of ``stages[i]`` (family ``block``): token mixer (attention, talking heads or conv) + MLP; with
    ``entry``, a block that pools its input first (CoAtNet's)."""
    stage = b.spec.stages[i]
    mixer_family, mixer = _mixer(b, i, layer, plan, dims, flow, entry)
    n_tokens = flow.n_prefix + flow.grid[0] * flow.grid[1]
    shape = BlockShape(flow.dim, n_tokens, stage.mlp_ratio, stage.norm, stage.norm_eps, stage.act, stage.layer_scale,
                       plan.drop_path, mixer_family, mixer, entry=entry, init=stage.init)
    label, heads = BLOCK.label(shape)
    b.add_family(f"stages.{i}.blocks.{layer}", "block", shape, kind="block", label=label, stage=i,
                 layer=flow.block_index, heads=heads, tokens=n_tokens, grid=flow.grid, dim=flow.dim,
                 bn_channels=BLOCK.batchnorm_channels(shape))


def _add_class_attention(b: _Builder, flow: _Flow, tokens: TokensPlan) -> None:
    """CaiT's class-attention blocks after the last stage (family ``class_attention``)."""
    spec = b.spec
    last = spec.stages[-1]
    n = flow.n_prefix + flow.grid[0] * flow.grid[1]
    shape, found = CLASS_ATTENTION.plan(spec.class_attention, flow.dim, n, tokens.cls_at, spec.depth,
                                        spec.tokens.dist_token, last.heads, last.act, last.norm_eps)
    b.problems_of(found)
    if shape is None:
        return
    for j in range(spec.class_attention.depth):
        b.add_family(f"stages.{len(spec.stages)}.blocks.{j}", "class_attention", shape, kind="class_attn",
                     label="class-attn", heads=" ".join(["C"] * shape.heads), tokens=n, grid=flow.grid, dim=flow.dim,
                     layer=flow.block_index + j)


def _add_head(b: _Builder, flow: _Flow) -> None:
    """Final norm, pooling and classifier(s) (family ``head``)."""
    head = b.spec.head
    n_tokens = flow.n_prefix + flow.grid[0] * flow.grid[1]
    batchnorm = b.spec.stages[-1].norm == "batchnorm"
    if batchnorm and head.norm is not None:
        b.problem(("head", "norm"), "a batchnorm model's head (LeViT's BatchNorm + Linear) has no final LayerNorm "
                  "to place", "remove head.norm")
    shape = HeadShape(flow.dim, n_tokens, head.num_classes, head.distillation, batchnorm, head.pool,
                      norm_before_pool=head.pool == "mean" and head.norm == "before_pool")
    b.add_family("head", "head", shape, kind="head", label=f"{head.pool}-pool", tokens=1, grid=(1, 1),
                 dim=head.num_classes or flow.dim, heads="",
                 bn_channels_into_bias=HEAD.batchnorm_channels_before_linear(shape))


def _finish(b: _Builder) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Totals, the parameter cap, and raising the problems found: ``(records, totals)``."""
    nodes = b.nodes
    total_params = sum(d["params"] for d in nodes)
    if total_params > MAX_PARAMS:
        b.problem(("stages",), f"{total_params / 1e9:.1f}B parameters exceeds the cap of {MAX_PARAMS / 1e9:.0f}B")
    if b.problems:
        raise SpecError(b.problems)
    image = F32 * b.spec.input.channels * b.spec.input.resolution[0] * b.spec.input.resolution[1]
    peak = max(nodes, key=lambda d: d["act_bytes"])
    weights, buffers = F32 * total_params, sum(d["buffer_bytes"] for d in nodes)
    # LeViT Tab. 1's split: the conv part is every node before the tokens exist (stem, conv stages, interface)
    # and, after a conv tail's tokens -> map, every node from there on (its conv stages and ResNet head)
    embed = next((k for k, d in enumerate(nodes) if d["kind"] == "embed"), len(nodes))
    to_map = next((k for k, d in enumerate(nodes) if d["kind"] == "to_map"), len(nodes))
    conv_macs = sum(d["macs"] for d in nodes[:embed] + nodes[to_map:])
    totals = dict(params=total_params, macs=sum(d["macs"] for d in nodes), conv_macs=conv_macs,
                   token_macs=sum(d["macs"] for d in nodes) - conv_macs,
                   macs_executed=sum(d["macs_executed"] for d in nodes), output=(nodes[-1]["dim"],),
                   peak_activation_bytes=image + peak["act_bytes"], peak_node=peak["name"], weight_bytes=weights,
                   buffer_bytes=buffers, peak_memory_bytes=image + peak["act_bytes"] + weights + buffers,
                   saved_activation_bytes=image + sum(d["saved_bytes"] for d in nodes))
    return nodes, totals
