"""MobileViT's conv stages: torch-free rules -- the stage models, the block shapes, the checks that need the map's
size, parameters, MACs, memory and the table labels.

Mehta & Rastegari 2022, "MobileViT: Light-weight, General-purpose, and Mobile-friendly Vision Transformer" (ICLR;
sec. 3.1, fig. 1b and the appendix's architecture table), as timm writes it (``byobnet.py``'s ``ByobNet`` with
``mobilevit.py``'s ``model_cfgs``).  Three stage kinds, all ``kind: conv`` (blocks on a feature map), all built from
timm's own modules (:mod:`.module`):

``block: mv2``         ``depth`` MobileNetV2 inverted residuals (the paper's "MV2"; timm ``BottleneckBlock`` with
                       ``bottle_in``, ``linear_out`` and a depthwise ``k x k``): 1x1 ``C_in -> M`` + BN + act,
                       depthwise ``k x k`` (the first block strides) + BN + act, 1x1 ``M -> C`` + BN, the input added
                       only where the width and the map stay (timm's ``downsample=''``: no projected shortcut).
                       ``M = make_divisible(C_in x expansion, 8)``.
``block: mobilevit``   ``depth`` MV2 blocks, then one MobileViT block (timm ``MobileVitBlock``): local ``k x k`` conv
                       + BN + act, 1x1 to the transformer width ``D``; unfold into ``p_h x p_w`` patches (the map
                       bilinearly resized to whole patches first where ``p`` does not divide it, and back after the
                       fold: timm's reading); ``L`` pre-norm transformer layers (timm ViT ``Block``: LayerNorm, MHSA
                       with ``qkv`` bias, LayerNorm, MLP ``D -> int(r D) -> D`` with the stage's activation) over the
                       ``p_h p_w`` sequences of the pixels of equal offset -- the ``grid`` head kind
                       (:mod:`archspec.families.attention.kinds.grid`) -- a final LayerNorm, fold, 1x1 ``D -> C`` + BN
                       + act, and the fusion ``k x k`` conv + BN + act over ``concat(input, x)``.
``block: conv_bn_act`` ``depth`` plain ``k x k`` convs + BN + act (timm ``ConvNormAct``), the first strided: timm
                       ByobNet's ``final_conv`` (MobileViT's "Conv-1x1" before the pool, ``kernel: 1``).

Every BatchNorm is timm's ``BatchNormAct2d`` (eps 1e-5), every LayerNorm torch's (eps 1e-5); counts follow the
reference counter's convention (convs and linears ``fan_in x outputs``, ``Q K^T`` and ``A V`` as the attention
family's, norms, activations, pools and the resize 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import singledispatch
from typing import ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from archspec._util.memory import F32, NodeMemory
from archspec._util.pydantic_base import HINT, DropPathRate, StrictModel
from archspec.families.attention.heads import HeadSpec
from archspec.families.attention.kinds import grid as grid_kind
from archspec.families.attention.kinds import hosted_by
from archspec.families.block.rules import check_mlp_ratio
from archspec.families.conv_block.rules import MAX_DEPTH, MAX_DIM, ConvStageBase, make_divisible, strided_grid
from archspec.families.mbconv.rules import ActName

__all__ = ["MV2StageSpec", "MobileViTStageSpec", "MobileViTTransformerSpec", "ConvBNActStageSpec", "MV2Shape",
           "MobileViTShape", "ConvBNActShape", "BLOCKS", "plan", "counts", "memory", "out_grid", "label",
           "head_letters", "batchnorm_channels", "batchnorm_channels_into_bias", "patch_grid", "NO_WEIGHT_DECAY"]

NO_WEIGHT_DECAY: frozenset[str] = frozenset()
#: the stage kinds of this family, by ``block``
BLOCKS = ("mv2", "mobilevit", "conv_bn_act")
_MAX_LAYERS = 24


class _OddKernelStage(ConvStageBase):
    """A conv stage whose ``kernel`` (a field of each subclass) must be odd."""

    @field_validator("kernel", check_fields=False)
    @classmethod
    def _odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError(f"the kernel {value} is even: its padding cannot centre it, and the map would shift by "
                             f"half a pixel{HINT}use an odd kernel, e.g. {value + 1} or {value - 1}")
        return value


class MV2StageSpec(_OddKernelStage):
    """A conv stage of MobileNetV2 inverted residuals (``kind: conv, block: mv2``; MobileViT's "MV2", timm
    ``BottleneckBlock(bottle_in=True, linear_out=True)`` with a depthwise ``k x k``): ``depth`` blocks to ``channels``
    channels, the first striding by ``stride``; a block adds its input only where its width and map stay."""

    family: ClassVar[str] = "mobilevit"

    kind: Literal["conv"] = Field("conv", description="'conv': blocks on a feature map.")
    block: Literal["mv2"] = Field(..., description="'mv2': MobileNetV2's inverted residual (MobileViT's MV2; timm "
                                  "BottleneckBlock with bottle_in, linear_out, depthwise kxk).")
    depth: int = Field(..., ge=1, le=MAX_DEPTH, description="Number of blocks.")
    channels: int = Field(..., ge=1, le=MAX_DIM, description="Output channels of every block.")
    stride: int = Field(1, ge=1, le=2, description="Stride of the first block's depthwise conv.")
    expansion: float = Field(4.0, gt=0, le=8, description="Inner width M = make_divisible(C_in x expansion, 8), "
                             "from the block's input width (timm bottle_ratio with bottle_in; MobileViT: 4, "
                             "mobilevit_xxs 2).")
    kernel: int = Field(3, ge=1, le=15, description="Side of the depthwise conv (odd; timm 3).")
    act: ActName = Field("silu", description="Activation after the inner BatchNorms (MobileViT: Swish, timm silu).")
    drop_path: DropPathRate = Field(
        0.0, description="Stochastic depth: one rate for every block, or [first, last] linearly spaced over the stage.")


class MobileViTTransformerSpec(StrictModel):
    """The transformer of a MobileViT block (timm ``MobileVitBlock``'s ``transformer_dim``, ``transformer_depth``,
    ``num_heads``, ``mlp_ratio``, ``patch_size``): ``depth`` pre-norm ViT layers of width ``dim`` over the unfolded
    patches, then a LayerNorm.  ``attention`` is every head's kind: a ``grid`` whose stride is the patch (the pixels
    of equal offset attend each other; MobileViT sec. 3.1)."""

    dim: int = Field(..., ge=1, le=MAX_DIM, description="Transformer width D (timm transformer_dim; mobilevit_xxs: "
                     "64, 80, 96).")
    depth: int = Field(..., ge=1, le=_MAX_LAYERS, description="Transformer layers L (timm transformer_depth; "
                       "MobileViT: 2, 4, 3).")
    heads: int = Field(4, ge=1, le=64, description="Attention heads (timm MobileVitBlock num_heads: 4); D must be "
                       "divisible by them.")
    mlp_ratio: float = Field(2.0, gt=0, le=16, description="MLP hidden = int(mlp_ratio x D) (timm 2.0).")
    attention: HeadSpec = Field(default_factory=lambda: HeadSpec(grid={}), description="Every head's kind: a grid "
                                "whose stride is the patch [p_h, p_w] (default grid 2x2, MobileViT's patch).")

    @field_validator("mlp_ratio")
    @classmethod
    def _hidden(cls, value: float, info: ValidationInfo) -> float:
        return check_mlp_ratio(info.data.get("dim"), value)


class MobileViTStageSpec(_OddKernelStage):
    """A MobileViT stage (``kind: conv, block: mobilevit``; timm ``_mobilevit_block``): ``depth`` MV2 blocks to
    ``channels`` channels (the first strides), then one MobileViT block (timm ``MobileVitBlock``): local conv, 1x1 to
    the transformer, unfold -> ``transformer`` -> fold, 1x1 back, fusion conv over the concatenation with its input."""

    family: ClassVar[str] = "mobilevit"

    kind: Literal["conv"] = Field("conv", description="'conv': blocks on a feature map.")
    block: Literal["mobilevit"] = Field(..., description="'mobilevit': MV2 blocks, then a MobileViT block (timm "
                                        "MobileVitBlock).")
    depth: int = Field(1, ge=1, le=MAX_DEPTH, description="MV2 blocks before the MobileViT block (timm's d: 1); the "
                       "stage has depth + 1 blocks.")
    channels: int = Field(..., ge=1, le=MAX_DIM, description="Output channels of every block.")
    stride: int = Field(1, ge=1, le=2, description="Stride of the first MV2 block (MobileViT: 2).")
    expansion: float = Field(4.0, gt=0, le=8, description="The MV2 blocks' expansion (make_divisible(C_in x "
                             "expansion, 8) inner channels).")
    kernel: int = Field(3, ge=1, le=15, description="Side of the MV2 depthwise convs and of the MobileViT block's "
                        "local and fusion convs (odd; timm 3).")
    act: ActName = Field("silu", description="Activation of every conv's BatchNorm and of the transformer's MLP "
                         "(timm act_layer silu).")
    transformer: MobileViTTransformerSpec = Field(..., description="The MobileViT block's transformer.")
    fusion: bool = Field(True, description="The fusion conv over concat(input, x) (timm no_fusion=False); false: "
                         "the block ends on its 1x1 projection.")
    drop_path: DropPathRate = Field(
        0.0, description="Stochastic depth: one rate for every block (the MobileViT block's transformer layers "
        "take its own), or [first, last] linearly spaced over the stage's depth + 1 blocks.")

    def drop_path_of(self, layer: int) -> float:
        """The stochastic-depth rate of block ``layer`` (0 .. depth; ``depth`` is the MobileViT block)."""
        if isinstance(self.drop_path, tuple):
            first, last = self.drop_path
            return first + (last - first) * (layer / max(self.depth, 1))
        return self.drop_path


class ConvBNActStageSpec(_OddKernelStage):
    """A stage of plain convs (``kind: conv, block: conv_bn_act``; timm ``ConvNormAct``): ``depth`` ``k x k`` convs
    + BatchNorm + activation to ``channels`` channels, the first striding; no residual.  timm ByobNet's
    ``final_conv`` (MobileViT's "Conv-1x1", ``kernel: 1``)."""

    family: ClassVar[str] = "mobilevit"

    kind: Literal["conv"] = Field("conv", description="'conv': blocks on a feature map.")
    block: Literal["conv_bn_act"] = Field(..., description="'conv_bn_act': conv + BatchNorm + activation (timm "
                                          "ConvNormAct; ByobNet's final_conv).")
    depth: int = Field(1, ge=1, le=MAX_DEPTH, description="Number of convs.")
    channels: int = Field(..., ge=1, le=MAX_DIM, description="Output channels of every conv.")
    stride: int = Field(1, ge=1, le=2, description="Stride of the first conv.")
    kernel: int = Field(1, ge=1, le=15, description="Conv side (odd; ByobNet's final_conv: 1).")
    act: ActName = Field("silu", description="Activation after each BatchNorm.")
    drop_path: DropPathRate = Field(0.0, description="Accepted for a model-wide rate (timm's drop_path_rate); a conv "
                                    "without a residual branch drops nothing.")


# ----------------------------------------------------------------------------------- shapes
@dataclass(frozen=True)
class MV2Shape:
    """One MV2 block from ``in_chans`` to ``channels`` on a ``grid`` input map: ``stride``, ``expansion`` (of the
    input width), depthwise ``kernel``, ``act``, ``drop_path`` (timm ``BottleneckBlock``)."""

    in_chans: int
    channels: int
    stride: int
    grid: tuple[int, int]
    expansion: float = 4.0
    kernel: int = 3
    act: str = "silu"
    drop_path: float = 0.0

    @property
    def mid(self) -> int:
        """The inner width: timm ``make_divisible(in_chs x bottle_ratio)`` (divisor 8)."""
        return make_divisible(self.in_chans * self.expansion)

    @property
    def residual(self) -> bool:
        """Whether the block adds its input (timm ``create_shortcut('')``: the identity where width and map stay,
        no shortcut otherwise)."""
        return self.stride == 1 and self.in_chans == self.channels


@dataclass(frozen=True)
class MobileViTShape:
    """One MobileViT block of ``channels`` channels on a ``grid`` map (timm ``MobileVitBlock(C, C)``): transformer
    width ``dim``, ``depth`` layers, ``heads`` (their kinds: one grid, the patch), ``mlp_ratio``, ``kernel`` of the
    local and fusion convs, ``act``, ``fusion``, ``drop_path`` of its transformer layers."""

    channels: int
    grid: tuple[int, int]
    dim: int
    depth: int
    heads: tuple[HeadSpec, ...]
    mlp_ratio: float = 2.0
    kernel: int = 3
    act: str = "silu"
    fusion: bool = True
    drop_path: float = 0.0
    stride: ClassVar[int] = 1

    @property
    def in_chans(self) -> int:
        return self.channels

    @property
    def patch(self) -> tuple[int, int]:
        """The patch ``(p_h, p_w)``: the heads' grid stride."""
        return tuple(self.heads[0].grid.stride)

    @property
    def hidden(self) -> int:
        """The MLP's hidden width, timm ``Mlp``'s ``int(dim x mlp_ratio)``."""
        return int(self.dim * self.mlp_ratio)


@dataclass(frozen=True)
class ConvBNActShape:
    """One ``kernel x kernel`` conv + BatchNorm + ``act`` from ``in_chans`` to ``channels`` on a ``grid`` map
    (timm ``ConvNormAct``, padding ``kernel // 2``)."""

    in_chans: int
    channels: int
    stride: int
    grid: tuple[int, int]
    kernel: int = 1
    act: str = "silu"


def patch_grid(shape: MobileViTShape) -> tuple[int, int]:
    """The map the transformer attends on: each side rounded up to whole patches (timm's
    ``ceil(H / p_h) p_h``; the map is bilinearly resized there when it differs)."""
    (h, w), (ph, pw) = shape.grid, shape.patch
    return -(-h // ph) * ph, -(-w // pw) * pw


# ----------------------------------------------------------------------------------- plan
@singledispatch
def plan(stage: ConvStageBase, index: int, in_chans: int, grid: tuple[int, int]
         ) -> tuple[list, list[tuple[tuple, str, str]]]:
    """The shapes of ``stages[index]``'s blocks entering at ``in_chans`` channels on a ``grid`` map, and the
    problems ``(path, message, hint)`` (a stride that would shrink the map below 1x1; for a MobileViT stage, a
    transformer width its heads do not divide, heads that are not one grid).

    Raises:
        TypeError: a stage of another family.
    """
    raise TypeError(f"not a stage of the mobilevit family: {type(stage).__name__}")


def _stride_problems(stage: ConvStageBase, index: int, grid: tuple[int, int]) -> list[tuple[tuple, str, str]]:
    if stage.stride > 1 and min(grid) < stage.stride:
        return [(("stages", index, "stride"), f"stride {stage.stride} on a {grid[0]}x{grid[1]} map would shrink it "
                 "below 1x1", "use stride: 1 here, fewer strided stages, or a larger input resolution")]
    return []


def _mv2_shapes(stage: MV2StageSpec | MobileViTStageSpec, in_chans: int, grid: tuple[int, int]) -> list[MV2Shape]:
    shapes, c = [], in_chans
    for layer in range(stage.depth):
        stride = stage.stride if layer == 0 else 1
        shapes.append(MV2Shape(c, stage.channels, stride, tuple(grid), stage.expansion, stage.kernel, stage.act,
                               stage.drop_path_of(layer)))
        grid, c = strided_grid(grid, stride), stage.channels
    return shapes


@plan.register
def _plan_mv2(stage: MV2StageSpec, index: int, in_chans: int, grid: tuple[int, int]):
    problems = _stride_problems(stage, index, grid)
    return ([] if problems else _mv2_shapes(stage, in_chans, grid)), problems


@plan.register
def _plan_mobilevit(stage: MobileViTStageSpec, index: int, in_chans: int, grid: tuple[int, int]):
    problems = _stride_problems(stage, index, grid) + _transformer_problems(stage.transformer, index)
    if problems:
        return [], problems
    shapes: list = _mv2_shapes(stage, in_chans, grid)
    t = stage.transformer
    shapes.append(MobileViTShape(stage.channels, out_grid(shapes[-1]), t.dim, t.depth, (t.attention,) * t.heads,
                                 t.mlp_ratio, stage.kernel, stage.act, stage.fusion, stage.drop_path_of(stage.depth)))
    return shapes, []


@plan.register
def _plan_conv(stage: ConvBNActStageSpec, index: int, in_chans: int, grid: tuple[int, int]):
    problems = _stride_problems(stage, index, grid)
    shapes, c = [], in_chans
    for layer in range(stage.depth):
        stride = stage.stride if layer == 0 else 1
        shapes.append(ConvBNActShape(c, stage.channels, stride, tuple(grid), stage.kernel, stage.act))
        grid, c = strided_grid(grid, stride), stage.channels
    return ([] if problems else shapes), problems


def _transformer_problems(t: MobileViTTransformerSpec, index: int) -> list[tuple[tuple, str, str]]:
    """A width the heads do not divide; heads that are not one grid (timm's MobileVitBlock unfolds one patch size
    for every head and layer, and runs plain MHSA over the patches)."""
    at = ("stages", index, "transformer")
    out = []
    if t.dim % t.heads:
        out.append((at + ("heads",), f"the transformer width {t.dim} is not divisible by {t.heads} heads",
                    "use a head count that divides transformer.dim (timm: 4 heads)"))
    kinds = t.attention.kinds
    if kinds != hosted_by(grid_kind.HOST):
        has = ", ".join(sorted(kinds)) or "plain MHSA"
        out.append((at + ("attention",), f"a MobileViT block's heads are one grid (its unfold into patches: the pixels "
                    f"of equal offset attend each other, timm MobileVitBlock); {has} is not",
                    "write attention: grid:2x2 (MobileViT's patch), or grid:1x1 for attention over every pixel"))
    return out


# ----------------------------------------------------------------------------------- shape rules
@singledispatch
def out_grid(shape) -> tuple[int, int]:
    """The map's size after the block: ``ceil(H / stride) x ceil(W / stride)`` (a MobileViT block keeps it)."""
    return strided_grid(shape.grid, shape.stride)


@singledispatch
def counts(shape) -> tuple[int, int]:
    """(params, MACs per image) of one block (per shape kind below).

    Raises:
        TypeError: a shape of another family.
    """
    raise TypeError(f"not a mobilevit-family shape: {type(shape).__name__}")


@counts.register
def _counts_mv2(shape: MV2Shape) -> tuple[int, int]:
    """MV2: 1x1 ``C_in M`` on the input map, depthwise ``k^2 M`` and 1x1 ``M C`` on the output map, no biases; 2
    BatchNorm parameters per channel of ``M``, ``M`` and ``C``."""
    (h, w), (ho, wo) = shape.grid, out_grid(shape)
    c, m, out, k2 = shape.in_chans, shape.mid, shape.channels, shape.kernel ** 2
    params = c * m + k2 * m + m * out + 2 * (2 * m + out)
    return params, h * w * c * m + ho * wo * (k2 * m + m * out)


def _convs(shape: MobileViTShape) -> list[tuple[int, int]]:
    """The block's convs on its map ``(fan_in, c_out)``: local ``k x k``, 1x1 to ``D``, 1x1 back, the fusion."""
    c, d, k2 = shape.channels, shape.dim, shape.kernel ** 2
    return [(k2 * c, c), (c, d), (d, c)] + ([(k2 * 2 * c, c)] if shape.fusion else [])


@counts.register
def _counts_mobilevit(shape: MobileViTShape) -> tuple[int, int]:
    """MobileViT block: its convs (``k^2 C^2``, ``C D``, ``D C``, fusion ``k^2 2C C``, no biases; BatchNorms after
    all but the 1x1 to ``D``) on the ``H W`` map; per transformer layer on the ``T = H' W'`` resized pixels, ``P =
    p_h p_w`` sequences of ``N = T / P``: ``qkv`` ``3 D^2 + 3 D`` and ``proj`` ``D^2 + D`` (``T`` times the weights
    in MACs), ``Q K^T`` and ``A V`` ``2 T N D`` (each pixel against the ``N`` of its offset, the grid kind's pairs),
    the MLP ``2 D M + M + D`` (``2 T D M``), two LayerNorms ``4 D``; the final LayerNorm ``2 D``."""
    (h, w), (hp, wp) = shape.grid, patch_grid(shape)
    d, m = shape.dim, shape.hidden
    convs = _convs(shape)
    params = sum(f * o for f, o in convs) + 2 * shape.channels * (len(convs) - 1)
    macs = h * w * sum(f * o for f, o in convs)
    tokens = hp * wp
    pairs = grid_kind.partitioned_pairs((hp, wp), shape.patch)
    params += shape.depth * (4 * d * d + 4 * d + 2 * d * m + m + d + 4 * d) + 2 * d
    macs += shape.depth * (tokens * (4 * d * d + 2 * d * m) + 2 * pairs * d)
    return params, macs


@counts.register
def _counts_conv(shape: ConvBNActShape) -> tuple[int, int]:
    """A conv + BatchNorm: ``k^2 C_in C`` weights + ``2 C``, ``H_out W_out`` times the weights in MACs."""
    ho, wo = out_grid(shape)
    weights = shape.kernel ** 2 * shape.in_chans * shape.channels
    return weights + 2 * shape.channels, ho * wo * weights


@singledispatch
def memory(shape) -> NodeMemory:
    """Bytes (batch 1, float32) of one block, an estimate (per shape kind below).

    Raises:
        TypeError: a shape of another family.
    """
    raise TypeError(f"not a mobilevit-family shape: {type(shape).__name__}")


@memory.register
def _memory_mv2(shape: MV2Shape) -> NodeMemory:
    """MV2: the input lives through the block; at the widest step a conv's input and output with its BatchNorm's
    (the activations in place); training keeps every conv's and BatchNorm's output."""
    (h, w), (ho, wo) = shape.grid, out_grid(shape)
    x_in, e1, e2, out = shape.in_chans * h * w, shape.mid * h * w, shape.mid * ho * wo, shape.channels * ho * wo
    widest = max(x_in + 2 * e1, e1 + 2 * e2, e2 + 2 * out + (out if shape.residual else 0))
    return NodeMemory(act=F32 * (x_in + widest), saved=F32 * (x_in + 2 * (e1 + e2 + out)))


@memory.register
def _memory_mobilevit(shape: MobileViTShape) -> NodeMemory:
    """MobileViT block: the input lives through the block; the local convs (two copies each), the unfolded and
    folded ``D T`` copies, and per transformer layer its input, LayerNorm, ``qkv``, the ``P`` sequences' q, k, v,
    their ``h T N`` logits and probabilities, the output and the MLP's ``2 M T``; then the projection, the
    concatenation and the fusion.  Training keeps every layer's."""
    (h, w), (hp, wp) = shape.grid, patch_grid(shape)
    c, d, m = shape.channels, shape.dim, shape.hidden
    x_in, pixels, tokens = c * h * w, h * w, hp * wp
    logits = len(shape.heads) * grid_kind.partitioned_pairs((hp, wp), shape.patch)
    layer = 2 * d * tokens + 6 * d * tokens + 2 * logits + d * tokens
    mlp = d * tokens + 2 * m * tokens
    phases = [2 * c * pixels + d * pixels, 2 * d * tokens + max(layer, mlp), 2 * d * tokens + 2 * c * pixels,
              2 * c * pixels + 2 * c * pixels]
    saved = 2 * c * pixels + d * pixels + 2 * d * tokens + shape.depth * (layer + mlp) + 6 * c * pixels
    return NodeMemory(act=F32 * (x_in + max(phases)), saved=F32 * saved)


@memory.register
def _memory_conv(shape: ConvBNActShape) -> NodeMemory:
    """A conv + BatchNorm (activation in place): its input and two copies of its output."""
    (h, w), (ho, wo) = shape.grid, out_grid(shape)
    x_in, out = shape.in_chans * h * w, shape.channels * ho * wo
    return NodeMemory(act=F32 * (x_in + 2 * out), saved=F32 * 2 * out)


def batchnorm_channels(shape) -> int:
    """BatchNorm channels ``model.fuse()`` folds into a layer before them: none (timm's ``BatchNormAct2d`` after
    ``ConvNormAct``'s conv, which :func:`archspec.nn.fuse.fold_conv_batchnorms` leaves, as for MBConv)."""
    return 0


def batchnorm_channels_into_bias(shape) -> int:
    """BatchNorm channels folded into a layer with a bias: none (:func:`batchnorm_channels`)."""
    return 0


@singledispatch
def label(shape) -> str:
    """The analysis table's kind: ``mv2`` (``/2`` strided, ``k5`` for another kernel), ``mobilevit`` with its
    layers and patch (``mobilevit-L2/p2``), ``conv1x1`` / ``conv3x3/2``."""
    raise TypeError(f"not a mobilevit-family shape: {type(shape).__name__}")


@label.register
def _label_mv2(shape: MV2Shape) -> str:
    return "mv2" + (f"k{shape.kernel}" if shape.kernel != 3 else "") + (f"/{shape.stride}" if shape.stride > 1 else "")


@label.register
def _label_mobilevit(shape: MobileViTShape) -> str:
    ph, pw = shape.patch
    return f"mobilevit-L{shape.depth}/p{ph}" + (f"x{pw}" if pw != ph else "")


@label.register
def _label_conv(shape: ConvBNActShape) -> str:
    return f"conv{shape.kernel}x{shape.kernel}" + (f"/{shape.stride}" if shape.stride > 1 else "")


def head_letters(shape) -> str:
    """The analysis table's heads: a MobileViT block's (``O O O O``: its grid heads), none for a conv block."""
    return " ".join(h.letter for h in shape.heads) if isinstance(shape, MobileViTShape) else ""
