"""Conv stages of ResNet residual blocks: torch-free rules -- the stage's spec model, the block's shape, the
checks that need the map's size, parameters, MACs, memory and the table label.

A conv stage is ``depth`` residual blocks of timm ``resnet.BasicBlock`` (two 3x3 convs, He et al. 2016 fig. 5
left) or ``resnet.Bottleneck`` (1x1 -> 3x3 -> 1x1 with expansion 4, fig. 5 right), as timm's ``make_blocks``
stacks them: the first block strides (in its first 3x3 conv) and, when the stride or the width changes,
has a downsample shortcut -- a 1x1 strided conv + BatchNorm (``conv``, timm ``downsample_conv``) or
ResNet-D's 2x2 average pool then a 1x1 conv + BatchNorm (``avg``, timm ``downsample_avg``, He et al. 2019
fig. 2c).  Optional squeeze-excitation after the last conv (timm ``SEModule``, ResNet-RS: ``rd_ratio`` 0.25).
Every conv is bias-free and followed by a BatchNorm; activations are ReLU.

ResNeXt (Xie et al. 2017, "Aggregated Residual Transformations", sec. 3.3, fig. 3c): ``groups`` (timm's
``cardinality``) splits the bottleneck's 3x3 conv into that many groups and ``base_width`` sets the width of each
group per 64 planes, as timm ``resnet.Bottleneck``: inner width ``floor(planes x base_width / 64) x groups`` with
``planes = channels / expansion`` (ResNeXt-50 32x4d: planes 64, base_width 4, groups 32 -> 128 inner channels).
The defaults (1, 64) are ResNet's.

``mixer: {kind: gpsa}`` replaces every bottleneck's 3x3 conv by T-CNN's 9-head gated positional self-attention
on the map's pixels (d'Ascoli et al. 2021, "Transformed CNNs", sec. 2, eq. 4-7, footnote 1; the torch side is
:class:`archspec.families.conv_block.module.ConvGPSA`): head ``h`` = kernel tap ``h``, ``W_val = I`` shared by the
heads, ``W_out^h`` = the tap's ``D_in x D_out`` filter, new ``W_qry`` / ``W_key`` (``D_in -> 9 d``,
``d = max(D_in // 9, 1)``), explicit zero padding (the ``(H + 2)(W + 2)`` padded pixels are the keys, every
``stride``-th inner pixel a query), locality ``alpha_h = softplus_5(alpha~_h)`` and gating ``lambda_h`` (eq. 7).
The paper's BoTNet move ("the first stride-2 convolution replaced by a stride-1 convolution", sec. 2) is the
stage's own ``stride: 1``: the 3x3 (now GPSA) and the shortcut of the first block both run at stride 1 (a
ResNet-D ``avg`` shortcut loses its pool, a ``conv`` one its stride), so the stage keeps its input map -- at 224
px a transformed last stage of ResNet-50 runs on 14 x 14 instead of 7 x 7, and every later stage (if any) sees
a map twice as large a side as the CNN's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from archspec._util.memory import F32, NodeMemory
from archspec._util.pydantic_base import HINT, DropPathRate, StrictModel
from archspec._util.units import make_divisible
from archspec.families.attention.heads import KINDS, HeadSpec
from archspec.families.attention.kinds import halo, head_kind, hosted_by, rel_logits
from archspec.families.attention.rules import AttentionShape, attention_macs_change, head_dims
from archspec.families.attention.rules import counts as attention_counts

__all__ = ["ConvStageBase", "SESpec", "GPSAMixerSpec", "AttentionMixerSpec", "ConvStageSpec", "BotShape", "bot_counts",
           "make_divisible", "GPSA_HEADS", "gpsa_head_dim", "gpsa_counts", "gpsa_memory",
           "ConvBlockShape", "se_channels", "plan", "counts", "memory", "out_grid", "batchnorm_channels",
           "batchnorm_channels_into_bias", "label",
           "head_letters", "strided_grid", "executed_macs", "NO_WEIGHT_DECAY", "EXPANSION", "inner_width",
           "TIMM_KINDS"]

# ConvGPSA's locality alpha~_h, gating lambda_h and centres Delta_h: positions and mixing weights, decayed by
# neither ConViT (timm convit's gating_param) nor T-CNN's fine-tuning groups (archspec.transfer.gating_param_groups)
NO_WEIGHT_DECAY: frozenset[str] = frozenset({"locality", "gating", "centers"})
GPSA_HEADS = 9  # T-CNN: one head per tap of the 3x3 kernel (sec. 2)
MAX_DIM = 4096
MAX_DEPTH = 64
EXPANSION = {"basic": 1, "bottleneck": 4}  # timm BasicBlock.expansion, Bottleneck.expansion


class SESpec(StrictModel):
    """Squeeze-excitation after the block's last conv (Hu et al. 2018; timm ``SEModule``): global average pool,
    1x1 conv to ``rd`` channels with bias, ReLU, 1x1 conv back with bias, sigmoid gate."""

    rd_ratio: float = Field(0.0625, gt=0, le=1, description="Reduction: rd = channels x rd_ratio rounded to a "
                            "multiple of rd_divisor (timm make_divisible); 0.25 in ResNet-RS, timm's default 1/16.")
    rd_divisor: int = Field(8, ge=1, le=64, description="rd is a multiple of this (at least this).")


class GPSAMixerSpec(StrictModel):
    """T-CNN's GPSA in place of a bottleneck's 3x3 conv (d'Ascoli et al. 2021, sec. 2, eq. 4-7, footnote 1):
    9 heads (one per kernel tap), ``W_val = I`` shared, ``W_out^h`` the tap's filter, explicit zero padding,
    locality ``alpha = softplus_5(alpha~)``, gating ``lambda`` (eq. 7).  Initialised "on the verge of locality"
    (alpha = lambda = 1); loading a CNN's 3x3 weights into ``W_out`` (archspec.timm_bridge.convert.load_timm_weights)
    makes the layer the CNN's conv as alpha and lambda grow."""

    kind: Literal["gpsa"] = Field(..., description="'gpsa': T-CNN's 9-head gated positional self-attention on the "
                                  "map's pixels (the only kind a conv stage takes so far).")
    locality_strength: float = Field(1.0, gt=0, le=1e4, allow_inf_nan=False, description="Initial locality alpha "
                                     "of every head (paper: 1); off-centre attention weights ~exp(-alpha).")
    gating_init: float = Field(1.0, ge=-1e4, le=1e4, allow_inf_nan=False, description="Initial gating lambda of "
                               "every head (paper: 1); sigmoid(lambda) weighs positional against content attention.")


class AttentionMixerSpec(StrictModel):
    """Self-attention on the map's pixels in place of a bottleneck's 3x3 conv (BoTNet, Srinivas et al. 2021, fig. 4
    and sec. 3; timm ``byobnet.SelfAttnBlock`` with ``BottleneckAttn``): the 1x1 reduction, then ``heads``-head
    attention over every pixel of the ``H x W`` map, BatchNorm + ReLU, the 1x1 expansion.  Where the block strides,
    attention runs at stride 1 and a 2x2 average pool follows (BoTNet sec. 4 / timm ``BottleneckAttn.pool``).

    Heads are the token stages' kinds, composed per head (MHSA, GPSA, LeViT bias, CMHSA signed bias, hard / soft /
    strict masks), plus BoTNet's relative logits (``botnet_rel``, the default) and HaloNet's blocked local attention
    (``halo``, Vaswani et al. 2021).  A layer whose heads are all ``botnet_rel`` is timm's ``BottleneckAttn`` (one
    1x1 ``qkv`` conv, no output projection); one whose heads are all the same ``halo`` is timm's ``HaloAttn`` (``q``
    and ``kv`` 1x1 convs, no output projection; it strides its own queries); any other layer is archspec's
    :class:`~archspec.families.attention.module.Attention` on the pixels (``qk``, ``v``, ``proj``), with
    ``d = inner width / heads`` per head."""

    kind: Literal["attention"] = Field(..., description="'attention': multi-head self-attention on the map's pixels "
                                       "(BoTNet); 'gpsa': T-CNN's GPSA.")
    heads: int = Field(4, ge=1, le=64, description="Attention heads (BoTNet / timm BottleneckAttn: 4; HaloNet: "
                       "8); the inner width must be divisible by it.")
    attention: HeadSpec = Field(default_factory=lambda: HeadSpec(rel_logits={}),
                                description="Head kind of every head (default botnet_rel: BoTNet's relative logits; "
                                "{halo: {block_size: 8, halo_size: 2}}: HaloNet's).")
    head_kinds: list[HeadSpec] | None = Field(
        None, description="One head kind per head (overrides 'attention'), e.g. [mhsa, levit_bias, mask:3x3, gpsa].")
    layers: list[int] | None = Field(
        None, description="Stage-local indices of the blocks that get attention (the others keep their 3x3 conv), "
        "e.g. [1] for timm botnet26t's third stage; default every block.")
    qkv_bias: bool = Field(False, description="Bias on the q/k/v projection (BoTNet / timm: none).")

    @field_validator("layers")
    @classmethod
    def _layers(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(k < 0 for k in value) or len(set(value)) != len(value)):
            raise ValueError("layers lists distinct stage-local block indices (0 = the first block), at least one")
        return value

    @model_validator(mode="after")
    def _one_per_head(self) -> AttentionMixerSpec:
        if self.head_kinds is not None and len(self.head_kinds) != self.heads:
            raise ValueError(f"{len(self.head_kinds)} head kinds for {self.heads} heads: give one per head")
        return self

    def kinds(self) -> tuple[HeadSpec, ...]:
        """Every head's kind: ``head_kinds``, else ``attention`` for each head."""
        return tuple(self.head_kinds) if self.head_kinds is not None else (self.attention,) * self.heads


def _mixer_kind(value) -> str | None:
    """Which mixer model a conv stage's ``mixer`` is (tags distinct from field names, so error paths stay clean)."""
    kind = value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)
    return {"gpsa": "gpsa_mixer", "attention": "attention_mixer"}.get(kind) if isinstance(kind, str) else None


#: a conv stage's ``mixer``: T-CNN's GPSA or BoTNet's attention (tags distinct from field names)
ConvMixer = Annotated[
    Annotated[GPSAMixerSpec, Tag("gpsa_mixer")] | Annotated[AttentionMixerSpec, Tag("attention_mixer")],
    Discriminator(_mixer_kind, custom_error_type="mixer_kind",
                  custom_error_message="a conv stage's mixer kind must be 'gpsa' or 'attention'")]


class ConvStageBase(StrictModel):
    """What every conv stage (``kind: conv``) is, whatever its block: ``depth`` blocks on a feature map ending at
    ``channels`` channels, the first striding by ``stride``, with a ``drop_path`` rate.  The subclasses hold the
    fields (ResNet's :class:`ConvStageSpec`, MBConv's
    :class:`~archspec.families.mbconv.rules.MBConvStageSpec`); ``family`` names the block family whose rules
    plan and count their blocks (:mod:`archspec.ir.walk`).  ``isinstance(stage, ConvStageBase)`` tells a conv
    stage from an attention stage."""

    family: ClassVar[str]

    @property
    def dim(self) -> int:
        """The stage's output width, under the attention stages' name (``channels``)."""
        return self.channels

    def drop_path_of(self, layer: int) -> float:
        """The stochastic-depth rate of block ``layer`` of the stage."""
        if isinstance(self.drop_path, tuple):
            first, last = self.drop_path
            return first + (last - first) * (layer / max(self.depth - 1, 1))
        return self.drop_path


class ConvStageSpec(ConvStageBase):
    """A conv stage (``kind: conv``): ``depth`` ResNet residual blocks of ``block`` with ``channels`` output
    channels; the first block strides by ``stride`` and gets a ``downsample`` shortcut when the stride or the
    width changes (timm ``resnet.make_blocks``)."""

    family: ClassVar[str] = "conv_block"

    kind: Literal["conv"] = Field("conv", description="'conv': ResNet residual blocks on a feature map "
                                  "(stages without 'kind' are attention stages).  After attention stages (a conv "
                                  "tail) the map is the last attention stage's tokens on its grid, row-major, the "
                                  "class and distillation tokens dropped.")
    block: Literal["basic", "bottleneck"] = Field(..., description="'basic': two 3x3 convs (ResNet-18/34); "
                                                  "'bottleneck': 1x1, 3x3, 1x1 (ResNet-50 and up); 'mbconv': "
                                                  "MBConv (stages[] (kind: conv, block: mbconv)).")
    depth: int = Field(..., ge=1, le=MAX_DEPTH, description="Number of blocks.")
    channels: int = Field(..., ge=1, le=MAX_DIM, description="Output channels of every block (timm: planes x "
                          "expansion, e.g. 256 for ResNet-50's first stage).")
    # 1 or 2: timm's 1x1 strided shortcut pads from stride 3 on (a map one pixel off the 3x3's), GPSA runs at 1 or 2
    stride: int = Field(1, ge=1, le=2, description="Stride of the stage's first block (timm: 1 for the first stage, "
                        "2 after).")
    expansion: int | None = Field(None, ge=1, le=8, description="Bottleneck ratio: the inner width (timm's planes) "
                                  "is channels / expansion; default 4 for bottleneck, 1 for basic (timm).")
    downsample: Literal["conv", "avg"] = Field("conv", description="Shortcut when the stride or width changes: "
                                               "'conv' a 1x1 strided conv + BN; 'avg' ResNet-D's 2x2 avg-pool, "
                                               "then a 1x1 conv + BN.")
    se: SESpec | None = Field(None, description="Squeeze-excitation after the last conv (ResNet-RS: rd_ratio 0.25).")
    zero_init_last: bool = Field(True, description="Initialise each block's last BatchNorm weight to 0 (timm's "
                                 "default, Goyal et al. 2017).")
    drop_path: DropPathRate = Field(
        0.0, description="Stochastic depth: one rate for every block, or [first, last] linearly spaced over the stage.")
    groups: int = Field(1, ge=1, le=MAX_DIM, description="Groups of the bottleneck's 3x3 conv (ResNeXt's "
                        "cardinality, timm cardinality; 32 for resnext50_32x4d); bottleneck blocks only.")
    base_width: int = Field(64, ge=1, le=MAX_DIM, description="Width of each group per 64 planes (timm base_width; "
                            "4 for resnext50_32x4d): inner width = floor(planes x base_width / 64) x groups, planes "
                            "= channels / expansion; bottleneck blocks only.")
    mixer: ConvMixer | None = Field(
        None, description="Replace the bottleneck's 3x3 conv: {kind: gpsa} T-CNN's 9-head "
        "GPSA in every block (T-CNN also moves the stage's stride out, BoTNet's move: write stride: 1); "
        "{kind: attention} BoTNet's multi-head self-attention on the map, any head kinds, in every block or the "
        "blocks of 'layers' (attention at stride 1, then a 2x2 average pool where the block strides).")

    @field_validator("block", mode="before")
    @classmethod
    def _block_kind(cls, value: Any) -> Any:
        # the stage models of mbconv and MobileViT's blocks are others (the stage discriminator's); name every block
        if value not in ("basic", "bottleneck"):
            raise ValueError(f"unknown conv block {value!r}; a conv stage's block is 'basic', 'bottleneck' "
                             "(ResNet), 'mbconv' (MBConv: CoAtNet, MaxViT), 'mv2', 'mobilevit' or 'conv_bn_act' "
                             f"(MobileViT){HINT}use block: basic, bottleneck, mbconv, mv2, mobilevit or conv_bn_act")
        return value

    @field_validator("downsample", mode="before")
    @classmethod
    def _shortcut_only(cls, value: Any) -> Any:
        # an attention stage's downsample (Swin's patch merging, NAT's conv) copied onto a conv stage: say why not
        if isinstance(value, dict) or value == "patch_merging":
            raise ValueError("a conv stage's downsample is its first block's shortcut, 'conv' or 'avg'; Swin's "
                             "patch merging and NAT's conv downsampler enter attention stages"
                             f"{HINT}a conv stage downsamples by its stride (stride: 2); move this downsample to an "
                             "attention stage")
        return value

    @property
    def ratio(self) -> int:
        """The bottleneck ratio in force: ``expansion``, else timm's (4 bottleneck, 1 basic)."""
        return self.expansion if self.expansion is not None else EXPANSION[self.block]


@dataclass(frozen=True)
class ConvBlockShape:
    """One residual block: ``block`` (basic / bottleneck) from ``in_chans`` to ``channels`` channels on an
    ``grid`` input map, inner width ``width`` (timm's planes; ``channels = width x expansion``), ``stride``,
    shortcut ``downsample`` (None: identity; ``conv`` or ``avg``), ``se_channels`` (0: no SE), the SE's
    ``rd_ratio`` and ``rd_divisor``, ``zero_init_last``, the block's ``drop_path`` rate, and ``mixer``
    (``gpsa``: the bottleneck's 3x3 conv is T-CNN's GPSA, initialised at ``locality_strength`` and ``gating_init``;
    None: the conv), and ResNeXt's ``groups`` / ``base_width`` of the 3x3 conv (inner width :attr:`mid`)."""

    block: str
    in_chans: int
    channels: int
    width: int
    stride: int
    grid: tuple[int, int]
    downsample: str | None = None
    se_channels: int = 0
    rd_ratio: float = 0.0625
    rd_divisor: int = 8
    zero_init_last: bool = True
    drop_path: float = 0.0
    mixer: str | None = None
    locality_strength: float = 1.0
    gating_init: float = 1.0
    groups: int = 1
    base_width: int = 64
    bot: BotShape | None = None

    @property
    def expansion(self) -> int:
        return self.channels // self.width

    @property
    def mid(self) -> int:
        """The inner width of the 3x3 conv: timm Bottleneck's ``floor(planes x base_width / 64) x cardinality``
        (``width`` = planes; a basic block's is ``width``)."""
        return inner_width(self.width, self.base_width, self.groups)


#: the registry's hosts that are timm layers: ``BottleneckAttn`` (BoTNet's relative logits), ``HaloAttn`` (HaloNet)
TIMM_HOSTS = ("bottleneck_attn", halo.HOST)
#: the head kinds timm's layers run, read from the registry
TIMM_KINDS = frozenset().union(*(hosted_by(host) for host in TIMM_HOSTS))


def timm_host(heads: tuple[HeadSpec, ...]) -> str | None:
    """The timm layer (one of :data:`TIMM_HOSTS`) that runs every head of a layer -- each head has kinds, all hosted
    by it -- or None (archspec's ``Attention``, or a mix no layer runs)."""
    return next((host for host in TIMM_HOSTS
                 if all(h.kinds and h.kinds <= hosted_by(host) for h in heads)), None)


@dataclass(frozen=True)
class BotShape:
    """An attention mixer in a bottleneck: ``dim`` inner channels on a ``grid`` map (the block's input grid: BoTNet
    attends at stride 1; HaloNet's layer strides itself), ``heads`` head kinds, ``qkv_bias``; ``stride`` 2 adds
    the 2x2 average pool (BoTNet) or strides the queries (HaloNet).  ``timm``: every head ``botnet_rel`` (timm's
    ``BottleneckAttn``) or every head one ``halo`` (timm's ``HaloAttn``); else archspec's ``Attention`` on the
    pixels."""

    dim: int
    grid: tuple[int, int]
    heads: tuple[HeadSpec, ...]
    stride: int = 1
    qkv_bias: bool = False

    @property
    def host(self) -> str | None:
        """The timm layer that runs the heads (:func:`timm_host`: ``bottleneck_attn``, ``halo_attn``), or None."""
        return timm_host(self.heads)

    @property
    def timm(self) -> bool:
        """The layer is timm's (``BottleneckAttn`` or ``HaloAttn``): every head's kinds are one timm host's."""
        return self.host is not None

    @property
    def halo(self) -> halo.HaloSpec | None:
        """The layer's halo (every head's) where it is timm's ``HaloAttn``, else None."""
        return self.heads[0].halo if self.host == halo.HOST else None

    @property
    def qk_dim(self) -> int:
        """Per-head q/k width: timm ``make_divisible(dim, 8) // heads`` for BottleneckAttn, ``HaloAttn``'s
        (:func:`~archspec.families.attention.kinds.halo.layer_dims`), else ``dim // heads``."""
        if self.halo is not None:
            return halo.layer_dims(self.halo, self.dim, len(self.heads))[0]
        return make_divisible(self.dim) // len(self.heads) if self.timm else self.dim // len(self.heads)

    @property
    def v_dim(self) -> int:
        return self.dim // len(self.heads)


def attention_shape(bot: BotShape):
    """The :class:`~archspec.families.attention.rules.AttentionShape` of a non-timm attention mixer (no prefix
    tokens, layernorm-family linears)."""

    dims = head_dims(bot.dim, len(bot.heads), bot.qk_dim)
    return AttentionShape(bot.dim, bot.heads, bot.grid, 0, dims, bot.qkv_bias)


def bot_counts(bot: BotShape) -> tuple[int, int]:
    """(params, MACs per image) of an attention mixer.  timm's ``BottleneckAttn``: the 1x1 ``qkv`` conv
    ``C (2 h d + h d_v)`` weights (+ bias) and ``N`` times that in MACs, the tables
    (:func:`archspec.families.attention.kinds.rel_logits.table_params`) and their MACs, ``Q K^T`` and ``A V``
    ``h N^2 (d + d_v)``; the average pool 0.  timm's ``HaloAttn``:
    :func:`archspec.families.attention.kinds.halo.layer_counts`.  Other layers: the attention family's
    :func:`~archspec.families.attention.rules.counts` on the ``N = H W`` pixels."""

    if not bot.timm:
        return attention_counts(attention_shape(bot))
    if bot.halo is not None:
        return halo.layer_counts(bot.halo, bot.dim, len(bot.heads), bot.grid, bot.stride, bot.qkv_bias)
    h, d, dv = len(bot.heads), bot.qk_dim, bot.v_dim
    n = bot.grid[0] * bot.grid[1]
    out = h * (2 * d + dv)
    params = bot.dim * out + (out if bot.qkv_bias else 0) + rel_logits.table_params(bot.grid, d)
    macs = n * bot.dim * out + rel_logits.table_macs(bot.grid, d, h) + h * n * n * (d + dv)
    return params, macs


def inner_width(planes: int, base_width: int = 64, groups: int = 1) -> int:
    """timm ``resnet.Bottleneck``'s ``width = int(math.floor(planes * (base_width / 64)) * cardinality)``."""
    return int(planes * base_width // 64) * groups


def se_channels(channels: int, rd_ratio: float, rd_divisor: int) -> int:
    """The SE's reduced width: timm ``make_divisible(channels * rd_ratio, rd_divisor, round_limit=0.)``."""
    v = channels * rd_ratio
    return max(rd_divisor, int(v + rd_divisor / 2) // rd_divisor * rd_divisor)


def _strided(side: int, stride: int) -> int:
    """A side after a 3x3 pad-1 (or 1x1 pad-0) conv of ``stride``: ``ceil(side / stride)``; the 2x2 ceil-mode
    average pool of the ``avg`` shortcut gives the same."""
    return (side - 1) // stride + 1


def strided_grid(grid: tuple[int, int], stride: int) -> tuple[int, int]:
    """A map's size after a stage of first stride ``stride``: ``ceil(side / stride)`` a side."""
    return _strided(grid[0], stride), _strided(grid[1], stride)


def plan(stage: ConvStageSpec, index: int, in_chans: int, grid: tuple[int, int]
         ) -> tuple[list[ConvBlockShape], list[tuple[tuple, str, str]]]:
    """The shapes of ``stages[index]``'s blocks entering at ``in_chans`` channels on a ``grid`` map, and the
    problems ``(path, message, hint)``: channels that the bottleneck ratio does not divide, a stride that would
    shrink the map below 1x1 (a side smaller than the stride), a GPSA mixer in basic blocks (T-CNN re-expresses
    a bottleneck's single 3x3 conv)."""
    problems: list[tuple[tuple, str, str]] = []
    if stage.mixer is not None and stage.block != "bottleneck":
        problems.append((("stages", index, "mixer"), f"a {stage.mixer.kind} mixer replaces a bottleneck's 3x3 conv "
                         f"(T-CNN sec. 2); a {stage.block} block has two 3x3 convs and no single one to replace",
                         "use block: bottleneck, or remove mixer"))
    ratio = stage.ratio
    grouped = stage.groups != 1 or stage.base_width != 64
    if grouped and stage.block != "bottleneck":
        key = "groups" if stage.groups != 1 else "base_width"
        problems.append((("stages", index, key), f"{key} shapes a bottleneck's 3x3 conv (ResNeXt); a {stage.block} "
                         "block has none (timm's BasicBlock supports only cardinality 1, base_width 64)",
                         "use block: bottleneck, or remove groups / base_width"))
    elif grouped and stage.mixer is not None:
        problems.append((("stages", index, "groups" if stage.groups != 1 else "base_width"),
                         f"a {stage.mixer.kind} mixer replaces the plain 3x3 conv of the bottleneck; there is no "
                         "grouped conv left for groups / base_width to shape", "remove groups / base_width or mixer"))
    elif grouped and stage.channels % ratio == 0 and inner_width(stage.channels // ratio, stage.base_width, 1) < 1:
        problems.append((("stages", index, "base_width"), f"base_width {stage.base_width} leaves floor(planes x "
                         f"base_width / 64) = 0 channels per group (planes = {stage.channels // ratio})",
                         f"use base_width >= {-(-64 // (stage.channels // ratio))}"))
    if stage.channels % ratio:
        problems.append((("stages", index, "channels"), f"{stage.channels} output channels are not divisible by the "
                         f"bottleneck ratio {ratio} (inner width = channels / expansion)",
                         f"use a multiple of {ratio}, e.g. {max(ratio, stage.channels // ratio * ratio)}"))
    if stage.stride > 1 and min(grid) < stage.stride:
        problems.append((("stages", index, "stride"), f"stride {stage.stride} on a {grid[0]}x{grid[1]} map would "
                         "shrink it below 1x1 (a strided conv needs at least as many pixels a side as its stride)",
                         "use stride: 1 here, fewer strided stages, or a larger input resolution"))
    if not problems and isinstance(stage.mixer, AttentionMixerSpec):
        problems += _attention_problems(stage, index, grid)
    if problems:
        return [], problems
    width = stage.channels // ratio
    se = se_channels(stage.channels, stage.se.rd_ratio, stage.se.rd_divisor) if stage.se else 0
    gpsa = isinstance(stage.mixer, GPSAMixerSpec)
    mixer = ((stage.mixer.kind, stage.mixer.locality_strength, stage.mixer.gating_init) if gpsa else (None, 1.0, 1.0))
    attention = stage.mixer if isinstance(stage.mixer, AttentionMixerSpec) else None
    shapes, c = [], in_chans
    for layer in range(stage.depth):
        stride = stage.stride if layer == 0 else 1
        down = stage.downsample if layer == 0 and (stride != 1 or c != stage.channels) else None
        bot = None
        if attention is not None and (attention.layers is None or layer in attention.layers):
            mid = inner_width(width, stage.base_width, stage.groups)
            bot = BotShape(mid, tuple(grid), attention.kinds(), stride, attention.qkv_bias)
            mixer = ("attention", 1.0, 1.0)
        elif attention is not None:
            mixer = (None, 1.0, 1.0)
        shapes.append(ConvBlockShape(stage.block, c, stage.channels, width, stride, tuple(grid), down, se,
                                     stage.se.rd_ratio if stage.se else 0.0625, stage.se.rd_divisor if stage.se else 8,
                                     stage.zero_init_last, stage.drop_path_of(layer), *mixer, stage.groups,
                                     stage.base_width, bot))
        grid = (_strided(grid[0], stride), _strided(grid[1], stride))
        c = stage.channels
    return shapes, problems


def _unhosted(heads: tuple[HeadSpec, ...], where: tuple) -> list[tuple[tuple, str, str]]:
    """A head kind no bottleneck layer runs (neither archspec's pixel attention nor timm's ``BottleneckAttn``:
    Swin's windows belong to token stages), the first one found."""
    runs = hosted_by("pixel_attention") | TIMM_KINDS
    for head in heads:
        other = sorted(head.kinds - runs)
        if other:
            hosts = sorted(set().union(*(head_kind(name).hosts for name in other)))
            return [(where, f"head kind {', '.join(other)} does not run in a bottleneck's attention (it runs in: "
                     f"{', '.join(hosts)})", "use it in an attention stage (kind: attention), or use mhsa / "
                     "levit_bias / signed_bias / masks / gpsa / botnet_rel heads here")]
    return []


def _attention_problems(stage: ConvStageSpec, index: int, grid: tuple[int, int]) -> list[tuple[tuple, str, str]]:
    """An attention mixer's problems: block indices past the depth, an inner width the heads do not divide, a
    strided attention block on odd sides or at a stride other than 2 (BoTNet pools 2x2 after attention), BoTNet's
    relative logits or HaloNet's halo mixed with other kinds in one layer, each head kind's own checks on the
    block's map, and a halo layer's (:func:`archspec.families.attention.kinds.halo.layer_problems`)."""

    mixer, at = stage.mixer, ("stages", index, "mixer")
    out: list[tuple[tuple, str, str]] = []
    layers = mixer.layers if mixer.layers is not None else list(range(stage.depth))
    beyond = [k for k in layers if k >= stage.depth]
    if beyond:
        out.append((at + ("layers",), f"block {beyond[0]} is beyond the stage's {stage.depth} blocks "
                    f"(0-{stage.depth - 1})", "list stage-local block indices below the depth"))
    mid = inner_width(stage.channels // stage.ratio, stage.base_width, stage.groups)
    if mid % mixer.heads:
        out.append((at + ("heads",), f"the inner width {mid} is not divisible by {mixer.heads} heads",
                    "use a head count that divides channels / expansion"))
    if 0 in layers and stage.stride > 1:
        if stage.stride != 2:
            out.append((at, "an attention block strides by 2 only (BoTNet attends at stride 1, then pools 2x2; "
                        f"HaloNet subsamples its query blocks); stride {stage.stride} is neither",
                        "use stride: 2 (or 1) on this stage"))
        elif grid[0] % 2 or grid[1] % 2:
            out.append((at, f"the first block attends on a {grid[0]}x{grid[1]} map, then pools 2x2: odd sides would "
                        "floor where the shortcut's strided conv rounds up (the two maps would differ)",
                        "use an input resolution that leaves even sides here, or stride: 1"))
    kinds = mixer.kinds()
    where = at + (("head_kinds",) if mixer.head_kinds is not None else ("attention",))
    host = timm_host(kinds)
    if any(h.kinds & TIMM_KINDS for h in kinds) and host is None:
        out.append((where, "botnet_rel and halo heads run in timm's layers (BottleneckAttn, HaloAttn), which have no "
                    "room for other kinds: every head of a layer is botnet_rel, or every head is halo, or none is",
                    "make every head botnet_rel (or halo), or use mhsa / levit_bias / signed_bias / masks / gpsa"))
    out += _unhosted(kinds, where)
    g = grid
    for layer in range(stage.depth):
        if layer in layers:
            for kind in KINDS:
                if "pixel_attention" in kind.hosts:  # the kinds archspec's Attention runs on the pixels
                    out += kind.problems(kinds, g, 0, where)
            if host == halo.HOST:
                out += halo.layer_problems(kinds, g, where, layer)
        if layer == 0:
            g = strided_grid(g, stage.stride)
    return list(dict.fromkeys(out))


def out_grid(shape: ConvBlockShape) -> tuple[int, int]:
    """The map's size after the block: ``ceil(H / stride) x ceil(W / stride)``."""
    return _strided(shape.grid[0], shape.stride), _strided(shape.grid[1], shape.stride)


def _convs(shape: ConvBlockShape) -> list[tuple[int, int, int, int]]:
    """The block's convs with a BatchNorm after each ``(k, c_in, c_out, pixels_out)``, shortcut included; a grouped
    3x3 conv (ResNeXt) as ``c_in / groups`` input channels (its weights and MACs are ``1 / groups`` of a plain
    conv's)."""
    h, w = shape.grid
    ho, wo = out_grid(shape)
    c, out, mid = shape.in_chans, shape.channels, shape.mid
    if shape.block == "bottleneck":
        convs = [(1, c, mid, h * w), (3, mid // shape.groups, mid, ho * wo), (1, mid, out, ho * wo)]
    else:
        convs = [(3, c, mid, ho * wo), (3, mid, out, ho * wo)]
    if shape.downsample is not None:
        convs.append((1, c, out, ho * wo))
    return convs


def gpsa_head_dim(d_in: int) -> int:
    """Query/key width per head of T-CNN's GPSA: ``max(D_in // 9, 1)`` (timm ConViT's split of ``D_in`` over the
    heads; the paper's ``W_qry, W_key in R^{D_in x D_in}`` up to the remainder, sec. 2)."""
    return max(d_in // GPSA_HEADS, 1)


def gpsa_counts(d_in: int, d_out: int, grid: tuple[int, int], stride: int = 1, bias: bool = False
                ) -> tuple[int, int]:
    """(params, MACs) of T-CNN's GPSA in place of a 3x3 pad-1 conv ``D_in -> D_out`` on an ``(H, W)`` map.

    Params: ``W_qry, W_key`` ``2 D_in 9 d`` + ``W_val`` ``D_in^2`` + ``W_out`` ``9 D_in D_out`` (+ ``D_out``
    bias) + 9 x (2 centre coordinates, locality, gating) = 36.  MACs, with ``N = (H + 2)(W + 2)`` padded pixels
    (the keys) and ``M = ceil(H / s) ceil(W / s)`` queries: ``N D_in (2 x 9 d + D_in)`` (the q/k and v
    projections of every pixel) ``+ M N 9 (d + D_in)`` (``Q K^T`` and ``A V`` with ``D_v = D_in``)
    ``+ 9 M D_in D_out`` (each head's ``W_out``); the positional softmax, the gating and the padding are
    elementwise (0), as the reference counter (torch FlopCounterMode / 2) has them."""
    h, w = grid
    qk = GPSA_HEADS * gpsa_head_dim(d_in)
    n = (h + 2) * (w + 2)
    m = _strided(h, stride) * _strided(w, stride)
    params = 2 * d_in * qk + d_in * d_in + GPSA_HEADS * d_in * d_out + (d_out if bias else 0) + 4 * GPSA_HEADS
    macs = n * d_in * (2 * qk + d_in) + m * n * (qk + GPSA_HEADS * d_in) + GPSA_HEADS * m * d_in * d_out
    return params, macs


def gpsa_memory(d_in: int, d_out: int, grid: tuple[int, int], stride: int = 1) -> tuple[int, int]:
    """(peak, saved) float32 elements that ConvGPSA's forward creates on an ``(H, W)`` map (batch 1; its input
    not included), ``N`` padded pixels, ``M`` queries, ``9 d`` query/key width.  Held to the end of the forward:
    the padded map ``N D_in``, the q/k projection ``2 N 9 d``, the gathered queries ``M 9 d``, the key offsets
    ``2 M N``, four ``(9, M, N)`` maps (content, distance, positional, ``A``) and the pixel coordinates and
    query index (``2 N + 4 M``).  On top, at the widest
    moment, the larger of: the distances' two ``(9, M, N, 2)`` temporaries (``2 x 9 M N``); the mixture
    ``A V`` ``9 M D_in`` with the values ``N D_in``, or with its ``(M, 9 D_in)`` copy, or with the output and
    its layout copy ``2 M D_out``.  Measured against a ``TorchDispatchMode`` in tests/test_tcnn_spec.py.  Saved
    for training: everything it creates (an upper bound)."""
    h, w = grid
    qk = GPSA_HEADS * gpsa_head_dim(d_in)
    n = (h + 2) * (w + 2)
    m = _strided(h, stride) * _strided(w, stride)
    hmn = GPSA_HEADS * m * n
    mixed = GPSA_HEADS * m * d_in
    held = n * d_in + 2 * n * qk + m * qk + 2 * m * n + 4 * hmn + 2 * n + 4 * m  # + pixel coordinates, int64 index
    widest = max(2 * hmn, mixed + max(n * d_in, mixed, 2 * m * d_out))
    saved = held + 9 * hmn + n * d_in + 2 * mixed + 2 * m * d_out
    return held + widest, saved


def counts(shape: ConvBlockShape) -> tuple[int, int]:
    """(params, MACs per image): per conv ``k^2 c_in c_out`` weights + 2 BatchNorm parameters per output channel
    and ``H_out W_out k^2 c_in c_out`` MACs (the shortcut's 1x1 conv included; its average pool counts none);
    the SE adds ``2 C rd + rd + C`` parameters and ``2 C rd`` MACs (its 1x1 convs on the pooled 1x1 map).
    With ``mixer == 'gpsa'`` the bottleneck's 3x3 conv counts as :func:`gpsa_counts` instead (its BatchNorm
    stays)."""
    convs = _convs(shape)
    params = sum(k * k * c * o + 2 * o for k, c, o, _ in convs)
    macs = sum(n * k * k * c * o for k, c, o, n in convs)
    if shape.mixer == "gpsa":
        _, c, o, n = convs[1]  # the bottleneck's 3x3 conv, on the map conv1 left: the block's input grid
        gp, gm = gpsa_counts(c, o, shape.grid, shape.stride)
        params += gp - 9 * c * o
        macs += gm - n * 9 * c * o
    if shape.bot is not None:  # the 3x3 conv's slot: attention on the block's input map (+ a 2x2 pool: 0 MACs)
        _, c, o, n = convs[1]
        bp, bm = bot_counts(shape.bot)
        params += bp - 9 * c * o
        macs += bm - n * 9 * c * o
    if shape.se_channels:
        rd, out = shape.se_channels, shape.channels
        params += 2 * out * rd + rd + out
        macs += 2 * out * rd
    return params, macs


def executed_macs(shape: ConvBlockShape) -> int:
    """MACs per image as the module runs them: :func:`counts`, plus, for an attention mixer on archspec's
    ``Attention``, what its fast paths execute beyond the papers' count (a GPSA head's ``P V``, linear-time hard
    masks: :func:`archspec.families.attention.rules.attention_macs_change`)."""
    macs = counts(shape)[1]
    if shape.bot is not None and not shape.bot.timm:

        bot = shape.bot
        macs += attention_macs_change(bot.heads, bot.qk_dim, bot.v_dim, bot.grid, 0)
    return macs


def memory(shape: ConvBlockShape) -> NodeMemory:
    """Bytes (batch 1, float32): the input, and at the widest moment two copies (conv and BatchNorm outputs; the
    ReLUs are in place) of the largest inner map, then the output and the shortcut's two copies.  Training keeps
    every conv's and BatchNorm's output."""
    h, w = shape.grid
    convs = _convs(shape)
    sizes = [o * n for _, _, o, n in convs]
    x_in = shape.in_chans * h * w
    out = sizes[-1] if shape.downsample is None else sizes[-2]
    shortcut = 2 * out if shape.downsample is not None else 0
    act = x_in + max(2 * max(sizes), 2 * out + shortcut)
    saved = 2 * sum(sizes) + out
    if shape.mixer == "gpsa":  # the GPSA runs on conv1's map (two copies: conv, BatchNorm) beside the block input
        _, c, o, _ = convs[1]
        peak, kept = gpsa_memory(c, o, shape.grid, shape.stride)
        act = max(act, x_in + 2 * sizes[0] + peak)
        saved += kept
    if shape.bot is not None and shape.bot.halo is not None:
        bot = shape.bot
        peak, kept = halo.layer_memory(bot.halo, bot.dim, len(bot.heads), bot.grid, bot.stride)
        act = max(act, x_in + 2 * sizes[0] + peak)
        saved += kept
    elif shape.bot is not None:  # an estimate: q, k, v, two (h, N, N) logits (content, relative) and A, A V
        n, h = shape.grid[0] * shape.grid[1], len(shape.bot.heads)
        peak = 3 * n * shape.bot.dim + 3 * h * n * n + n * shape.bot.dim
        act = max(act, x_in + 2 * sizes[0] + peak)
        saved += peak
    return NodeMemory(act=F32 * act, saved=F32 * saved)


def batchnorm_channels(shape: ConvBlockShape) -> int:
    """BatchNorm channels ``model.fuse()`` folds into a bias-free layer before them
    (:func:`archspec.nn.fuse.fold_conv_batchnorms`; each saves ``C`` parameters: ``2C`` affine become a ``C``
    bias): basic ``bn1`` (width) and ``bn2`` (channels); bottleneck ``bn1``, ``bn2`` (the inner width; after
    T-CNN's GPSA too, into its ``W_out``; not after attention: :func:`batchnorm_channels_into_bias`) and ``bn3``
    (channels); the ``downsample`` shortcut's BatchNorm (channels)."""
    shortcut = shape.channels if shape.downsample is not None else 0
    if shape.block == "basic":
        return shape.width + shape.channels + shortcut
    conv2 = shape.mid if shape.bot is None else 0
    return shape.mid + conv2 + shape.channels + shortcut


def batchnorm_channels_into_bias(shape: ConvBlockShape) -> int:
    """BatchNorm channels ``model.fuse()`` folds into a layer that has a bias already (each saves ``2C``): a
    bottleneck's ``bn2`` after archspec's attention (its output projection, through the average pool of stride 2,
    which commutes with a per-channel affine map).  timm's ``BottleneckAttn`` has no output projection: its
    ``bn2`` stays, 0 here."""
    return shape.mid if shape.bot is not None and not shape.bot.timm else 0


def label(shape: ConvBlockShape) -> str:
    """The analysis table's kind: ``bottleneck``, ``basic``, with ``+gpsa`` (T-CNN's 3x3), ``/g32`` for ResNeXt's
    groups, ``/2`` for a stride, ``+se``."""
    return (shape.block + (f"+{shape.mixer}" if shape.mixer else "")
            + (f"/g{shape.groups}" if shape.groups > 1 else "") + (f"/{shape.stride}" if shape.stride > 1 else "")
            + ("+se" if shape.se_channels else ""))


def head_letters(shape: ConvBlockShape) -> str:
    """The analysis table's heads: nine ``P`` (GPSA, positional: :func:`archspec.families.attention.kinds.gpsa.letter`)
    for a GPSA block, none for a conv block."""
    if shape.bot is not None:
        return " ".join(h.letter for h in shape.bot.heads)
    return " ".join(["P"] * GPSA_HEADS) if shape.mixer == "gpsa" else ""
