"""MBConv conv stages (``kind: conv, block: mbconv``): torch-free rules -- the stage's spec model, the block's shape,
the checks that need the map's size, parameters, MACs, memory and the table label.

MBConv is MobileNetV2's inverted bottleneck (Sandler et al. 2018) with squeeze-excitation (EfficientNet, Tan & Le
2019) as CoAtNet (Dai et al. 2021, sec. 2.1 and 3.1: "we employ the MBConv block ... for the convolution stages")
and MaxViT (Tu et al. 2022, sec. 3.3: "MBConv ... with squeeze-excitation", pre-norm, before block and grid
attention) use it.  The numerics are timm's ``maxxvit.MbConvBlock`` (the module is timm's own,
:mod:`.module`), one pre-norm residual block::

    shortcut = x                                   stride 1 (the width must stay)
             = Downsample2d(x): pool, 1x1 conv     stride 2 (the 1x1 conv only when the width changes)
    x = BN(x) [+ act]                              pre_norm (pre_norm_act: timm's rw CoAtNets)
    x = pool(x)                                    stride_mode 'pool' only
    x = act(BN(conv1x1(x)))                        C_in -> M; strided in stride_mode '1x1'
    x = dwconv_kxk(x)                              M -> M depthwise; strided in stride_mode 'dw'
    x = SE(x) before or after act(BN(x))           se.early: timm's attn_early
    x = conv1x1(x) + shortcut                      M -> C (bias: output_bias)

``M = make_divisible(base x expansion, 8)`` with ``base`` the output width (``expand_from: output``, the paper's
and timm's tf configs) or the input width (``input``, timm's ``_rw`` configs); the SE's reduced width is
``int(rd_ratio x base')`` with ``base'`` the output width (``output``) or ``M`` (``input``), as timm's
``MaxxVitConvCfg.expand_output`` ties them.  Every BatchNorm is timm's ``BatchNormAct2d`` with the stage's
``norm_eps`` (timm: 1e-5; the tf ports: 1e-3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator

from archspec._util.memory import F32, NodeMemory
from archspec._util.pydantic_base import HINT, DropPathRate, StrictModel
from archspec.families.conv_block.rules import MAX_DEPTH, MAX_DIM, ConvStageBase, make_divisible

__all__ = ["MBConvSESpec", "MBConvStageSpec", "MBConvShape", "STRIDE_MODES", "POOLS", "ACTS", "PADDINGS", "plan",
           "counts", "memory", "out_grid", "pooled_side", "label", "head_letters", "batchnorm_channels",
           "batchnorm_channels_into_bias", "NO_WEIGHT_DECAY"]

NO_WEIGHT_DECAY: frozenset[str] = frozenset()
#: where the first block strides (timm ``MaxxVitConvCfg.stride_mode``)
STRIDE_MODES = {"dw": "the depthwise kxk conv strides (timm's default, MaxViT)",
                "1x1": "the 1x1 expansion conv strides (the CoAtNet paper's reading)",
                "pool": "a pool before the 1x1 expansion conv (timm's CoAtNet rw configs)"}
#: the shortcut's (and stride_mode 'pool''s) pooling: timm ``maxxvit.Downsample2d``'s pool types
POOLS = ("avg2", "avg", "max2", "max")
#: activations by timm's names (``timm.layers.get_act_layer``)
ACTS = ("gelu", "gelu_tanh", "silu", "relu")
#: 'symmetric': timm padding '' (k // 2 each side); 'same': TensorFlow's SAME (timm padding 'same', the tf ports)
PADDINGS = ("symmetric", "same")
ActName = Literal["gelu", "gelu_tanh", "silu", "relu"]


class MBConvSESpec(StrictModel):
    """Squeeze-excitation on the depthwise conv's output (timm ``SEModule`` as ``MbConvBlock`` makes it): global
    average pool, 1x1 conv to ``rd`` channels with bias, ``act``, 1x1 conv back with bias, sigmoid gate."""

    rd_ratio: float = Field(0.25, gt=0, le=1, description="Reduction: rd = int(rd_ratio x base), base the output "
                            "width (expand_from: output) or the inner width (input) -- timm attn_ratio (0.25; "
                            "1/16 in timm's maxvit_*_rw).")
    act: ActName = Field("silu", description="The SE's activation (timm attn_act_layer: silu; relu in the CoAtNet "
                         "rw configs).")
    early: bool = Field(False, description="SE before the depthwise conv's BatchNorm + activation instead of after "
                        "(timm attn_early: coatnet_0_rw, coatnet_1_rw).")


class MBConvStageSpec(ConvStageBase):
    """A conv stage of MBConv blocks (``kind: conv, block: mbconv``): ``depth`` pre-norm inverted bottlenecks with
    ``channels`` output channels (timm ``maxxvit.MbConvBlock``); the first block strides by ``stride`` and, at
    stride 2, takes a pooled shortcut (a 1x1 conv after the pool when the width changes)."""

    family: ClassVar[str] = "mbconv"

    kind: Literal["conv"] = Field("conv", description="'conv': blocks on a feature map.")
    block: Literal["mbconv"] = Field(..., description="'mbconv': MBConv (CoAtNet, MaxViT; timm MbConvBlock).")
    depth: int = Field(..., ge=1, le=MAX_DEPTH, description="Number of blocks.")
    channels: int = Field(..., ge=1, le=MAX_DIM, description="Output channels of every block (timm embed_dim).")
    stride: int = Field(1, ge=1, le=2, description="Stride of the stage's first block (timm MaxxVit: 2 in every "
                        "stage).")
    expansion: float = Field(4.0, gt=0, le=8, description="Inverted-bottleneck ratio: inner width "
                             "M = make_divisible(base x expansion, 8) (timm expand_ratio).")
    expand_from: Literal["output", "input"] = Field(
        "output", description="The base of the inner width and of the SE's reduction: the output width ('output': "
        "the papers, timm's tf configs) or the block's input width ('input': timm's rw configs, expand_output=False).")
    kernel: int = Field(3, ge=1, le=15, description="Side of the depthwise conv (odd; timm kernel_size 3).")
    stride_mode: Literal["dw", "1x1", "pool"] = Field(
        "dw", description="Where the first block strides: 'dw' the depthwise conv (timm's default, MaxViT), '1x1' "
        "the expansion conv (the CoAtNet paper), 'pool' a pool before it (timm's CoAtNet rw configs).")
    pool: Literal["avg2", "avg", "max2", "max"] = Field(
        "avg2", description="Pooling of the stride-2 shortcut and of stride_mode 'pool' (timm pool_type): 'avg2' / "
        "'max2' 2x2 stride 2, 'avg' / 'max' 3x3 stride 2 padding 1.")
    se: MBConvSESpec | None = Field(None, description="Squeeze-excitation after the depthwise conv (CoAtNet, "
                                    "MaxViT: rd_ratio 0.25).")
    act: ActName = Field("gelu", description="Activation after each BatchNorm (timm act_layer: gelu; silu in the rw "
                         "configs, gelu_tanh in the tf ports).")
    norm_eps: float = Field(1e-5, gt=0, le=0.1, description="BatchNorm epsilon (timm 1e-5; the tf ports 1e-3).")
    pre_norm_act: bool = Field(False, description="Activation after the pre-norm (timm pre_norm_act: the CoAtNet rw "
                               "configs).")
    output_bias: bool = Field(True, description="Bias on the last 1x1 conv and the shortcut's 1x1 conv (timm "
                              "output_bias; False in coatnet_0_rw and maxvit_*_rw).")
    padding: Literal["symmetric", "same"] = Field(
        "symmetric", description="'symmetric': k // 2 on every side (timm padding ''); 'same': TensorFlow's SAME, "
        "extra padding bottom / right where a strided conv or pool needs it (timm padding 'same': maxvit_*_tf).")
    drop_path: DropPathRate = Field(
        0.0, description="Stochastic depth: one rate for every block, or [first, last] linearly spaced over the stage.")

    @field_validator("stride_mode", mode="before")
    @classmethod
    def _stride_mode(cls, value: Any) -> Any:
        if not isinstance(value, str) or value not in STRIDE_MODES:
            modes = "; ".join(f"'{k}': {v}" for k, v in STRIDE_MODES.items())
            raise ValueError(f"unknown stride mode {value!r}; an MBConv block strides in one of: {modes}"
                             f"{HINT}use stride_mode: dw, 1x1 or pool")
        return value

    @field_validator("kernel")
    @classmethod
    def _odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError(f"the depthwise kernel {value} is even: its padding cannot centre it, and the map would "
                             f"shift by half a pixel{HINT}use an odd kernel, e.g. {value + 1} or {value - 1}")
        return value


@dataclass(frozen=True)
class MBConvShape:
    """One MBConv block from ``in_chans`` to ``channels`` channels on an ``grid`` input map: ``stride``, where it
    strides (``stride_mode``), the ``pool`` of its shortcut, the depthwise ``kernel`` and ``padding``, the
    ``expansion`` and whether it counts from the output width (``expand_output``), the SE's ``se_ratio`` (0: no
    SE), ``se_act`` and ``se_early``, the ``act``, the BatchNorms' ``norm_eps``, ``pre_norm_act``,
    ``output_bias`` and the block's ``drop_path`` rate (timm ``MbConvBlock`` with that ``MaxxVitConvCfg``)."""

    in_chans: int
    channels: int
    stride: int
    grid: tuple[int, int]
    stride_mode: str = "dw"
    pool: str = "avg2"
    kernel: int = 3
    padding: str = "symmetric"
    expansion: float = 4.0
    expand_output: bool = True
    se_ratio: float = 0.0
    se_act: str = "silu"
    se_early: bool = False
    act: str = "gelu"
    norm_eps: float = 1e-5
    pre_norm_act: bool = False
    output_bias: bool = True
    drop_path: float = 0.0

    @property
    def mid(self) -> int:
        """The inner width: timm ``make_divisible((out if expand_output else in) x expand_ratio)`` (divisor 8)."""
        return make_divisible((self.channels if self.expand_output else self.in_chans) * self.expansion)

    @property
    def se_channels(self) -> int:
        """The SE's reduced width (0: no SE): timm's ``int(attn_ratio x (out if expand_output else mid))``."""
        if not self.se_ratio:
            return 0
        return int(self.se_ratio * (self.channels if self.expand_output else self.mid))

    @property
    def expands_shortcut(self) -> bool:
        """Whether the stride-2 shortcut has its 1x1 conv (timm ``Downsample2d.expand``: the width changes)."""
        return self.stride == 2 and self.in_chans != self.channels


def pooled_side(side: int, pool: str, padding: str) -> int:
    """A side after timm ``Downsample2d``'s pool: 2x2 stride 2 (``avg2`` / ``max2``) floors, unless padded
    TensorFlow's way (``same``); 3x3 stride 2 padding 1 (``avg`` / ``max``) rounds up."""
    if pool.endswith("2") and padding == "symmetric":
        return side // 2
    return (side - 1) // 2 + 1


def _conv_side(side: int, stride: int) -> int:
    """A side after a conv of ``stride`` (1x1, or an odd kernel padded symmetrically or SAME): ``ceil(side / s)``."""
    return (side - 1) // stride + 1


def _grids(shape: MBConvShape) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """The map sizes of the residual branch: where the 1x1 expansion conv writes, where the depthwise conv
    writes (the block's output), and the shortcut's output."""
    s, (h, w), mode = shape.stride, shape.grid, shape.stride_mode
    if s == 1:
        return shape.grid, shape.grid, shape.grid
    pooled = (pooled_side(h, shape.pool, shape.padding), pooled_side(w, shape.pool, shape.padding))
    if mode == "pool":
        return pooled, pooled, pooled
    if mode == "1x1":
        strided = (_conv_side(h, s), _conv_side(w, s))
        return strided, strided, pooled
    return shape.grid, (_conv_side(h, s), _conv_side(w, s)), pooled


def out_grid(shape: MBConvShape) -> tuple[int, int]:
    """The map's size after the block (the residual branch's; :func:`plan` refuses a shortcut that differs)."""
    return _grids(shape)[1]


def plan(stage: MBConvStageSpec, index: int, in_chans: int, grid: tuple[int, int]
         ) -> tuple[list[MBConvShape], list[tuple[tuple, str, str]]]:
    """The shapes of ``stages[index]``'s blocks entering at ``in_chans`` channels on a ``grid`` map, and the
    problems ``(path, message, hint)``: a width change at stride 1 (timm's shortcut is then the identity), a stride
    that would shrink the map below 1x1, a shortcut pool whose map differs from the residual branch's (a 2x2 pool
    floors an odd side that a strided conv rounds up), an SE reduced to 0 channels."""
    at = ("stages", index)
    problems: list[tuple[tuple, str, str]] = []
    if stage.stride == 1 and in_chans != stage.channels:
        problems.append((at + ("channels",), f"the first block changes the width from {in_chans} to "
                         f"{stage.channels} at stride 1, where MBConv's shortcut is the identity (timm MbConvBlock)",
                         f"use stride: 2 (the shortcut then pools and projects), or channels: {in_chans}"))
    if stage.stride > 1 and min(grid) < stage.stride:
        problems.append((at + ("stride",), f"stride {stage.stride} on a {grid[0]}x{grid[1]} map would shrink it "
                         "below 1x1", "use stride: 1 here, fewer strided stages, or a larger input resolution"))
    shapes, c = [], in_chans
    se = stage.se
    for layer in range(stage.depth):
        stride = stage.stride if layer == 0 else 1
        shapes.append(MBConvShape(c, stage.channels, stride, tuple(grid), stage.stride_mode, stage.pool, stage.kernel,
                                  stage.padding, stage.expansion, stage.expand_from == "output",
                                  se.rd_ratio if se else 0.0, se.act if se else "silu", se.early if se else False,
                                  stage.act, stage.norm_eps, stage.pre_norm_act, stage.output_bias,
                                  stage.drop_path_of(layer)))
        grid, c = out_grid(shapes[-1]), stage.channels
    first = shapes[0]
    if not problems:
        problems += _first_block_problems(first, at)
    # every block's: with expand_from input the first block's inner width is the narrower (timm would silently
    # fall back to its SE default, 1/16 rounded to 8 channels, for a 0)
    if se is not None and any(shape.se_channels < 1 for shape in shapes):
        base = "output" if stage.expand_from == "output" else "inner"
        problems.append((at + ("se", "rd_ratio"), f"the SE's reduced width int({se.rd_ratio:g} x the {base} width) "
                         "is 0 channels", "raise se.rd_ratio, or remove se"))
    return ([] if problems else shapes), problems


def _first_block_problems(shape: MBConvShape, at: tuple) -> list[tuple[tuple, str, str]]:
    """A strided first block whose shortcut pool makes another map than its residual branch (timm would fail
    adding them)."""
    _, residual, shortcut = _grids(shape)
    if residual == shortcut:
        return []
    h, w = shape.grid
    return [(at + ("pool",), f"on the {h}x{w} map the shortcut's {shape.pool} pool gives {shortcut[0]}x{shortcut[1]} "
             f"but the stride_mode '{shape.stride_mode}' branch {residual[0]}x{residual[1]} (a 2x2 pool floors an odd "
             "side, a strided conv rounds it up)", "use an input resolution that leaves even sides here, pool: avg "
             "(3x3, padding 1), stride_mode: pool, or padding: same")]


def _convs(shape: MBConvShape) -> list[tuple[int, int, int, bool]]:
    """The block's convs ``(fan_in, c_out, pixels_out, bias)``, ``fan_in = k^2 c_in / groups`` (1 input channel per
    group for the depthwise conv): the 1x1 expansion, the depthwise ``k x k``, the 1x1 projection, and the
    shortcut's 1x1 (when the width changes at stride 2)."""
    (h1, w1), (ho, wo), _ = _grids(shape)
    c, m, out = shape.in_chans, shape.mid, shape.channels
    convs = [(c, m, h1 * w1, False), (shape.kernel ** 2, m, ho * wo, False), (m, out, ho * wo, shape.output_bias)]
    if shape.expands_shortcut:
        convs.append((c, out, ho * wo, shape.output_bias))
    return convs


def counts(shape: MBConvShape) -> tuple[int, int]:
    """(params, MACs per image): per conv ``k^2 c_in c_out / groups`` weights (+ ``c_out`` bias: the projection's and
    the shortcut's with ``output_bias``) and ``H_out W_out`` times that in MACs (the depthwise conv ``H_out W_out
    k^2 M``); 2 BatchNorm parameters per channel of the pre-norm (``C_in``) and the two inner norms (``M`` each);
    the SE ``2 M rd + rd + M`` parameters and ``2 M rd`` MACs (its 1x1 convs on the pooled 1x1 map).  Pools,
    norms, activations and the SE's gate count no MACs (the reference counter's convention)."""
    convs = _convs(shape)
    m, rd = shape.mid, shape.se_channels
    params = sum(k * o + (o if bias else 0) for k, o, _, bias in convs) + 2 * shape.in_chans + 4 * m
    macs = sum(n * k * o for k, o, n, _ in convs)
    if rd:
        params += 2 * m * rd + rd + m
        macs += 2 * m * rd
    return params, macs


def memory(shape: MBConvShape) -> NodeMemory:
    """Bytes (batch 1, float32), an estimate: the block's input and (at stride 2) the shortcut's output live through
    the block; on top, the widest step of the residual branch, each step holding its input and output (the
    pre-norm, the pool, the expansion conv, each BatchNorm + activation (in place), the depthwise conv, the SE's
    product, the projection).  Training keeps every conv's and norm's output."""
    (h, w), ((h1, w1), (ho, wo), _) = shape.grid, _grids(shape)
    m, c_in, out = shape.mid, shape.in_chans, shape.channels * ho * wo
    x_in = c_in * h * w
    pooled = c_in * h1 * w1 if shape.stride_mode == "pool" and shape.stride > 1 else x_in
    e1, e2 = m * h1 * w1, m * ho * wo
    widest = max(2 * x_in, x_in + pooled, pooled + e1, 2 * e1, e1 + e2, 2 * e2, e2 + out, 2 * out)
    shortcut = out if shape.stride > 1 else 0
    saved = x_in + pooled + 2 * e1 + 3 * e2 + out + shortcut
    return NodeMemory(act=F32 * (x_in + shortcut + widest), saved=F32 * saved)


def batchnorm_channels(shape: MBConvShape) -> int:
    """BatchNorm channels ``model.fuse()`` folds into a layer before them: none (timm's ``BatchNormAct2d`` pre-norm
    comes before its conv, and :func:`archspec.nn.fuse.fold_conv_batchnorms` folds plain ``nn.BatchNorm2d`` only)."""
    return 0


def batchnorm_channels_into_bias(shape: MBConvShape) -> int:
    """BatchNorm channels folded into a layer with a bias: none (:func:`batchnorm_channels`)."""
    return 0


def label(shape: MBConvShape) -> str:
    """The analysis table's kind: ``mbconv`` with the kernel when not 3 (``k5``), ``/2dw`` (or ``/2pool``,
    ``/2-1x1``) for a strided block, ``+se``."""
    kernel = f"k{shape.kernel}" if shape.kernel != 3 else ""
    mode = {"dw": "dw", "pool": "pool", "1x1": "-1x1"}[shape.stride_mode]
    return ("mbconv" + kernel + (f"/{shape.stride}{mode}" if shape.stride > 1 else "")
            + ("+se" if shape.se_ratio else ""))


def head_letters(shape: MBConvShape) -> str:
    """The analysis table's heads: none (a conv block)."""
    return ""
