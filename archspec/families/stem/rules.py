"""Stems turning images ``(B, C_in, H, W)`` into tokens: torch-free rules -- spec models, shape, the one
grid rule, checks, parameters, MACs, memory and the name of the first convolution.

Six kinds: ViT's patch embedding (timm ``PatchEmbed``; with ``norm: layernorm`` Swin's, timm
``swin_transformer.SwinTransformer``'s ``PatchEmbed(norm_layer=LayerNorm)``), LeViT's convolutional stem (sec.
4.2: 3x3 stride-2 convs with BatchNorm, timm ``levit.Stem16``), NAT's overlapping convolutional tokenizer
(Hassani et al. 2022, sec. 3.2: two 3x3 stride-2 convs ``C_in -> C/2 -> C`` with bias and no activation between,
then LayerNorm; the authors' ``ConvTokenizer``, Hugging Face ``NatEmbeddings``), CMHSA's identity patch stem
(App. B: a token is its raw ``P x P x C`` pixels) and ResNet's stem (He et al. 2016, Tab. 1: 7x7 stride-2 conv,
BatchNorm, ReLU, 3x3 stride-2 max-pool; or the deep stem of ResNet-C/D, He et al. 2019 "Bag of Tricks" fig. 2,
and ResNet-RS's strided-conv pool, Bello et al. 2021 -- timm ``resnet.ResNet``'s stem) and CoAtNet's / MaxViT's
conv stem (timm ``maxxvit.Stem``: a 3x3 stride-2 conv, BatchNorm + activation, a 3x3 conv; Dai et al. 2021's
"S0", Tu et al. 2022 fig. 2's "Stem") and MobileViT's (Mehta & Rastegari 2022: a strided 3x3 conv; timm
ByobNet's ``stem_type='3x3'``, one ``ConvNormAct``: a 3x3 stride-2 conv, BatchNorm + activation).  The first four
make tokens; the ResNet, MaxxViT and MobileViT stems make a feature map ``(B, C, H, W)`` for conv stages
(:data:`MAP_STEMS`).  A stem's LayerNorm takes the first
stage's ``norm_eps`` (Swin and NAT use one epsilon, torch's 1e-5, throughout).  The modules are in
:mod:`archspec.families.stem.module`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, field_validator

from archspec._util.memory import F32, NodeMemory
from archspec._util.pydantic_base import StrictModel

__all__ = ["PatchStemSpec", "ConvStemSpec", "ConvTokenizerStemSpec", "IdentityStemSpec", "ResNetStemSpec",
           "MaxxVitStemSpec", "MobileViTStemSpec", "StemSpec", "MAP_STEMS",
           "StemShape", "plan", "grid", "reduction", "counts", "memory", "batchnorm_channels", "first_conv_name",
           "NO_WEIGHT_DECAY", "MAX_DIM", "TOKENIZER_LAYERS"]

MAX_DIM = 4096
NO_WEIGHT_DECAY: frozenset[str] = frozenset()
DEFAULT_CONV_LAYERS = 4  # LeViT's stem: C/8, C/4, C/2, C
TOKENIZER_LAYERS = 2  # NAT's tokenizer: C/2, C
#: the stems that make a feature map for conv stages (the others make tokens)
MAP_STEMS = ("resnet", "maxxvit", "mobilevit")


class PatchStemSpec(StrictModel):
    """ViT patchify stem: a ``patch_size`` x ``patch_size`` stride-``patch_size`` convolution (timm ``PatchEmbed``),
    optionally followed by a LayerNorm (Swin)."""

    kind: Literal["patch"] = "patch"
    patch_size: int = Field(16, ge=1, le=64, description="Patch side P in pixels; tokens = (H/P) (W/P).")
    norm: Literal["none", "layernorm"] = Field(
        "none", description="'layernorm': a LayerNorm on the tokens after the projection (Swin: timm PatchEmbed's "
        "norm_layer), with the first stage's norm_eps; 'none': ViT's.")


class ConvStemSpec(StrictModel):
    """LeViT conv stem: 3x3 stride-2 conv + BatchNorm layers with an activation between (LeViT sec. 4.2)."""

    kind: Literal["conv"] = "conv"
    channels: list[int] | None = Field(
        None, min_length=1, max_length=6,
        description="Output channels of each 3x3 stride-2 conv; default [C/8, C/4, C/2, C] for the first stage's C. "
        "The last must equal the first stage's dim.",
    )
    activation: Literal["hardswish", "gelu", "relu"] = Field("hardswish", description="Activation between conv layers.")

    @field_validator("channels")
    @classmethod
    def _positive(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(not 1 <= c <= MAX_DIM for c in value):
            raise ValueError(f"stem channels must be between 1 and {MAX_DIM}")
        return value


class ConvTokenizerStemSpec(StrictModel):
    """NAT's overlapping convolutional tokenizer (Hassani et al. 2022, sec. 3.2): two 3x3 stride-2 convs with bias,
    ``C_in -> C/2 -> C`` (``C`` the first stage's dim, ``C/2`` floored), no activation between, then a LayerNorm
    (the first stage's norm_eps); 4x fewer tokens a side (the authors' ``ConvTokenizer``, Hugging Face
    ``NatEmbeddings``)."""

    kind: Literal["conv_tokenizer"] = "conv_tokenizer"


class IdentityStemSpec(StrictModel):
    """Identity patch projection (CMHSA phase 1): a token is the raw flattened P x P patch, dim = P^2 C_in."""

    kind: Literal["identity"] = "identity"
    patch_size: int = Field(16, ge=1, le=64, description="Patch side P in pixels.")


class ResNetStemSpec(StrictModel):
    """ResNet stem (timm ``resnet.ResNet``): a 7x7 stride-2 conv + BatchNorm + ReLU, then a 3x3 stride-2 max-pool
    (ResNet-18/50); ``deep: true`` replaces the 7x7 conv by three 3x3 convs ``stem_width -> stem_width -> channels``
    (ResNet-C/D, ResNet-RS: timm ``stem_type='deep'``); ``pool: conv`` replaces the max-pool by a 3x3 stride-2
    conv + BatchNorm + ReLU (ResNet-RS: timm ``replace_stem_pool=True``).  Output: a map of ``channels`` channels
    at 1/4 of the input resolution, for conv stages."""

    kind: Literal["resnet"] = "resnet"
    channels: int = Field(64, ge=1, le=MAX_DIM, description="Output channels (timm's inplanes: 64; 2 x stem_width "
                          "for the deep stem).")
    deep: bool = Field(False, description="Three 3x3 convs instead of the 7x7 one (timm stem_type='deep').")
    stem_width: int | None = Field(None, ge=1, le=MAX_DIM, description="Deep stem: width of its first two convs; "
                                   "default channels / 2 (timm's stem_width, 32 for ResNet-D/RS).")
    widths: list[int] | None = Field(
        None, min_length=2, max_length=2, description="Deep stem: the widths of its first two convs when they "
        "differ, [first, second] (timm stem_type='deep_tiered', resnet10t/26t: [24, 32], i.e. "
        "[3 * (stem_width // 4), stem_width]); replaces stem_width.")
    pool: Literal["max", "conv"] = Field("max", description="'max': 3x3 stride-2 max-pool; 'conv': 3x3 stride-2 conv "
                                         "+ BatchNorm + ReLU (ResNet-RS, timm replace_stem_pool).")

    @field_validator("stem_width")
    @classmethod
    def _deep_only(cls, value: int | None, info) -> int | None:
        if value is not None and not info.data.get("deep", False):
            raise ValueError("stem_width applies to the deep stem only (deep: true)")
        return value

    @field_validator("widths")
    @classmethod
    def _tiered(cls, value: list[int] | None, info) -> list[int] | None:
        if value is None:
            return value
        if not info.data.get("deep", False):
            raise ValueError("widths applies to the deep stem only (deep: true)")
        if info.data.get("stem_width") is not None:
            raise ValueError("give either stem_width (two equal widths) or widths (a list of two), not both")
        if any(not 1 <= c <= MAX_DIM for c in value):
            raise ValueError(f"stem widths must be between 1 and {MAX_DIM}")
        return value


class MaxxVitStemSpec(StrictModel):
    """CoAtNet's and MaxViT's conv stem (timm ``maxxvit.Stem``): a 3x3 stride-2 conv ``C_in -> stem_width``,
    BatchNorm + ``act``, a 3x3 conv ``stem_width -> channels`` (no norm after it: each MBConv block pre-norms
    its input).  Output: a map of ``channels`` channels at 1/2 of the input resolution, for conv stages.  timm
    takes its activation, BatchNorm epsilon and padding from the model's ``conv_cfg``: write the first MBConv
    stage's here."""

    kind: Literal["maxxvit"] = "maxxvit"
    channels: int = Field(64, ge=1, le=MAX_DIM, description="Output channels (timm stem_width, its last entry when "
                          "a pair: 64 in coatnet_0_rw and maxvit_tiny_tf).")
    stem_width: int | None = Field(None, ge=1, le=MAX_DIM, description="Width of the first conv (timm stem_width's "
                                   "first entry: 32 in the rw configs); default channels.")
    bias: bool = Field(False, description="Bias on both convs (timm stem_bias: maxvit_*_tf).")
    act: Literal["gelu", "gelu_tanh", "silu", "relu"] = Field(
        "gelu", description="Activation after the BatchNorm (timm conv_cfg.act_layer: silu in the rw configs, "
        "gelu_tanh in the tf ports).")
    norm_eps: float = Field(1e-5, gt=0, le=0.1, description="BatchNorm epsilon (timm conv_cfg.norm_eps: 1e-5; the tf "
                            "ports 1e-3).")
    padding: Literal["symmetric", "same"] = Field(
        "symmetric", description="'symmetric': 1 pixel every side (timm padding ''); 'same': TensorFlow's SAME, the "
        "strided conv pads bottom / right only (timm padding 'same': maxvit_*_tf).")


class MobileViTStemSpec(StrictModel):
    """MobileViT's stem (Mehta & Rastegari 2022: a 3x3 stride-2 conv first; timm ByobNet ``stem_type='3x3'``
    without a pool, as ``mobilevit_*`` configure it): one ``ConvNormAct``, a 3x3 stride-2 conv ``C_in -> channels``
    without bias, BatchNorm + ``act``.  Output: a map of ``channels`` channels at 1/2 of the input resolution, for
    conv stages."""

    kind: Literal["mobilevit"] = "mobilevit"
    channels: int = Field(16, ge=1, le=MAX_DIM, description="Output channels (timm stem_chs: 16 in mobilevit_xxs).")
    act: Literal["silu", "relu", "gelu", "gelu_tanh"] = Field("silu", description="Activation after the BatchNorm "
                                                              "(timm act_layer: silu, the paper's Swish).")


StemSpec = Annotated[PatchStemSpec | ConvStemSpec | ConvTokenizerStemSpec | IdentityStemSpec | ResNetStemSpec
                     | MaxxVitStemSpec | MobileViTStemSpec, Field(discriminator="kind")]


@dataclass(frozen=True)
class StemShape:
    """A stem of ``kind`` from ``in_chans`` channels at ``img_size`` to tokens of width ``dim``: a patch side
    ``patch_size`` (patch, identity) or the conv layers' ``channels`` and ``act`` (conv); for the ResNet stem a
    map of ``dim`` channels, ``stem_width`` the deep stem's first conv width (0: the 7x7 stem), ``stem_mid`` its
    second conv's (0: ``stem_width``; timm's tiered stem: 32 after 24) and ``pool``; NAT's tokenizer
    (``conv_tokenizer``) its two convs' ``channels`` ``(C/2, C)``.  ``norm_eps``: the epsilon of a LayerNorm on the
    tokens after it (Swin's patch stem, NAT's tokenizer); None: no norm.  The MaxxViT stem: ``stem_width`` its
    first conv's width, ``act``, ``bias`` on its convs, ``bn_eps`` its BatchNorm's epsilon, ``padding``
    (``symmetric`` or ``same``).  The MobileViT stem: ``act``."""

    kind: str
    in_chans: int
    img_size: tuple[int, int]
    dim: int
    patch_size: int | None = None
    channels: tuple[int, ...] = ()
    act: str = "hardswish"
    stem_width: int = 0
    pool: str = "max"
    stem_mid: int = 0
    norm_eps: float | None = None
    bias: bool = False
    bn_eps: float = 1e-5
    padding: str = "symmetric"


def grid(kind: str, img_size: Sequence[int], patch_size: int | None = None, conv_layers: int = DEFAULT_CONV_LAYERS
         ) -> tuple[int, int]:
    """Token grid ``(H, W)`` a stem makes of an image of ``img_size`` pixels: ``(H / P, W / P)`` for patch and
    identity stems (floor), ``conv_layers`` times ``s -> (s - 1) // 2 + 1`` for the conv stem (3x3, stride 2,
    padding 1), twice for NAT's tokenizer, once for the MaxxViT stem (3x3 stride 2, padding 1 or SAME: ``ceil(s /
    2)``).  Raises nothing."""
    h, w = int(img_size[0]), int(img_size[1])
    if kind in ("maxxvit", "mobilevit"):
        return (h - 1) // 2 + 1, (w - 1) // 2 + 1
    if kind == "resnet":  # stride-2 conv (7x7 pad 3 or 3x3 pad 1), then the stride-2 pool (3x3 pad 1)
        return (h - 1) // 4 + 1, (w - 1) // 4 + 1
    if kind in ("conv", "conv_tokenizer"):
        conv_layers = TOKENIZER_LAYERS if kind == "conv_tokenizer" else conv_layers
        for _ in range(conv_layers):
            h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        return h, w
    return h // patch_size, w // patch_size


def reduction(kind: str, patch_size: int | None = None, conv_layers: int = DEFAULT_CONV_LAYERS) -> int:
    """Pixels per token side after the stem: the patch size, or ``2 ** layers`` for the conv stem, 4 for ResNet's and
    NAT's tokenizer, 2 for the MaxxViT and MobileViT stems."""
    if kind in ("maxxvit", "mobilevit"):
        return 2
    if kind in ("resnet", "conv_tokenizer"):
        return 2 ** TOKENIZER_LAYERS
    return 2 ** conv_layers if kind == "conv" else patch_size


def first_conv_name(kind: str, deep: bool = False) -> str | None:
    """The stem's first convolution, as timm's cfgs name it: ``stem.proj`` for the patch stem (timm ViT's
    ``patch_embed.proj``), ``stem.conv1.linear`` for LeViT's conv stem (timm LeViT's); None for the identity
    stem, which has no weights (its token width is ``channels x patch^2``: another ``in_chans`` is another
    architecture); ``stem.conv1`` for ResNet's (timm's ``conv1``), ``stem.conv1.0`` for its deep stem;
    ``stem.proj.0`` for NAT's tokenizer (the authors' ``patch_embed.proj.0``); ``stem.conv1`` for the MaxxViT stem
    (timm's), ``stem.conv`` for the MobileViT stem (timm ByobNet's)."""
    if kind == "maxxvit":
        return "stem.conv1"
    if kind == "mobilevit":
        return "stem.conv"
    if kind == "resnet":
        return "stem.conv1.0" if deep else "stem.conv1"
    return {"patch": "stem.proj", "conv": "stem.conv1.linear", "conv_tokenizer": "stem.proj.0"}.get(kind)


def plan(stem: PatchStemSpec | ConvStemSpec | ConvTokenizerStemSpec | IdentityStemSpec | ResNetStemSpec
         | MaxxVitStemSpec | MobileViTStemSpec, in_chans: int, img_size: tuple[int, int], first_dim: int,
         norm_eps: float = 1e-6) -> tuple[StemShape, list[tuple[tuple, str, str]]]:
    """The stem's shape and its problems ``(path, message, hint)``: a patch that does not divide the input, an
    identity stem whose token width is not the first stage's, conv channels that do not end at it.  ``norm_eps``:
    the first stage's, for the stem's LayerNorm (a patch stem with ``norm: layernorm``, NAT's tokenizer)."""
    if stem.kind == "conv":
        return _plan_conv(stem, in_chans, img_size, first_dim)
    if stem.kind == "maxxvit":
        return StemShape("maxxvit", in_chans, tuple(img_size), stem.channels,
                         stem_width=stem.stem_width or stem.channels, act=stem.act, bias=stem.bias,
                         bn_eps=stem.norm_eps, padding=stem.padding), []
    if stem.kind == "mobilevit":
        return StemShape("mobilevit", in_chans, tuple(img_size), stem.channels, act=stem.act), []
    if stem.kind == "conv_tokenizer":  # NAT: C_in -> C/2 -> C (the authors' embed_dim // 2)
        return StemShape("conv_tokenizer", in_chans, tuple(img_size), first_dim,
                         channels=(max(first_dim // 2, 1), first_dim), norm_eps=norm_eps), []
    if stem.kind == "resnet":
        width = (stem.stem_width or max(stem.channels // 2, 1)) if stem.deep else 0
        mid = 0
        if stem.deep and stem.widths is not None:
            width, mid = stem.widths
        return StemShape("resnet", in_chans, tuple(img_size), stem.channels, stem_width=width, pool=stem.pool,
                         stem_mid=mid), []
    p, (height, width) = stem.patch_size, img_size
    out = []
    if height % p or width % p:
        out.append((("stem", "patch_size"), f"patch size {p} does not divide the input resolution {height}x{width}",
                    f"use a resolution that is a multiple of {p}, e.g. {max(p, height // p * p)}"))
    dim = first_dim if stem.kind == "patch" else in_chans * p * p
    if stem.kind == "identity" and first_dim != dim:
        out.append((("stages", 0, "dim"), f"an identity stem makes tokens of P^2 C = {p}*{p}*{in_chans} = {dim} "
                    f"values, but stages[0].dim is {first_dim}", f"set stages[0].dim: {dim}"))
    norm = norm_eps if stem.kind == "patch" and stem.norm == "layernorm" else None
    return StemShape(stem.kind, in_chans, tuple(img_size), dim, patch_size=p, norm_eps=norm), out


def _plan_conv(stem: ConvStemSpec, in_chans: int, img_size: tuple[int, int], first_dim: int
               ) -> tuple[StemShape, list[tuple[tuple, str, str]]]:
    channels, out = stem.channels, []
    if channels is None:
        if first_dim % 8:
            out.append((("stem", "channels"), "default conv stem channels [C/8, C/4, C/2, C] need stages[0].dim "
                        f"divisible by 8, got {first_dim}", "give stem.channels explicitly"))
        channels = [max(first_dim // 8, 1), max(first_dim // 4, 1), max(first_dim // 2, 1), first_dim]
    elif channels[-1] != first_dim:
        out.append((("stem", "channels"), f"the conv stem ends with {channels[-1]} channels but stages[0].dim is "
                    f"{first_dim}", f"make the last entry {first_dim}"))
    shape = StemShape("conv", in_chans, tuple(img_size), channels[-1], channels=tuple(channels), act=stem.activation)
    return shape, out


def out_grid(shape: StemShape) -> tuple[int, int]:
    """The token grid after the stem (:func:`grid`)."""
    return grid(shape.kind, shape.img_size, shape.patch_size, len(shape.channels))


def _conv_layers(shape: StemShape) -> list[tuple[int, int, int, int]]:
    """Per conv layer ``(c_in, c_out, h_out, w_out)``."""
    layers, (h, w), c = [], shape.img_size, shape.in_chans
    for c_out in shape.channels:
        h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        layers.append((c, c_out, h, w))
        c = c_out
    return layers


def _resnet_convs(shape: StemShape) -> list[tuple[int, int, int, int, int]]:
    """The ResNet stem's convs ``(k, c_in, c_out, h_out, w_out)``, each followed by a BatchNorm of ``c_out``."""
    (h, w), c, out = shape.img_size, shape.in_chans, shape.dim
    h1, w1 = (h - 1) // 2 + 1, (w - 1) // 2 + 1
    h2, w2 = (h1 - 1) // 2 + 1, (w1 - 1) // 2 + 1
    if shape.stem_width:
        sw, mid = shape.stem_width, shape.stem_mid or shape.stem_width
        convs = [(3, c, sw, h1, w1), (3, sw, mid, h1, w1), (3, mid, out, h1, w1)]
    else:
        convs = [(7, c, out, h1, w1)]
    if shape.pool == "conv":
        convs.append((3, out, out, h2, w2))
    return convs


def counts(shape: StemShape) -> tuple[int, int]:
    """(params, MACs per image): patch ``C_in P^2 C + C`` and ``N C_in P^2 C``; conv, per layer, ``9 c_in c_out``
    weights + 2 BatchNorm parameters per channel and ``H_out W_out 9 c_in c_out`` MACs; NAT's tokenizer, per layer,
    ``9 c_in c_out + c_out`` (weights, bias) and ``H_out W_out 9 c_in c_out`` MACs; identity 0 and 0; ResNet, per
    conv ``k^2 c_in c_out`` weights (no bias) + 2 BatchNorm parameters per channel and ``H_out W_out k^2 c_in
    c_out`` MACs (the max-pool counts none); MaxxViT, ``9 c_in w + 9 w C`` weights (+ ``w + C`` biases), 2
    BatchNorm parameters per channel of ``w``, and ``H_out W_out`` times the weights in MACs; MobileViT, ``9 c_in C``
    weights + 2 BatchNorm parameters per channel and ``H_out W_out 9 c_in C`` MACs.  A LayerNorm on the
    tokens (``norm_eps`` set) adds ``2 C`` parameters and no MACs."""
    params, macs = _counts_before_norm(shape)
    return params + (2 * shape.dim if shape.norm_eps is not None else 0), macs


def _counts_before_norm(shape: StemShape) -> tuple[int, int]:
    if shape.kind == "mobilevit":
        (h, w), weights = out_grid(shape), 9 * shape.in_chans * shape.dim
        return weights + 2 * shape.dim, h * w * weights
    if shape.kind == "maxxvit":
        (h, w), width = out_grid(shape), shape.stem_width
        weights = 9 * shape.in_chans * width + 9 * width * shape.dim
        return weights + (width + shape.dim if shape.bias else 0) + 2 * width, h * w * weights
    if shape.kind == "conv_tokenizer":
        layers = _conv_layers(shape)
        return (sum(9 * c * c_out + c_out for c, c_out, _, _ in layers),
                sum(h * w * 9 * c * c_out for c, c_out, h, w in layers))
    if shape.kind == "resnet":
        convs = _resnet_convs(shape)
        return (sum(k * k * c * o + 2 * o for k, c, o, _, _ in convs),
                sum(h * w * k * k * c * o for k, c, o, h, w in convs))
    if shape.kind == "conv":
        layers = _conv_layers(shape)
        return (sum(9 * c * c_out + 2 * c_out for c, c_out, _, _ in layers),
                sum(h * w * 9 * c * c_out for c, c_out, h, w in layers))
    if shape.kind == "identity":
        return 0, 0
    rows, cols = out_grid(shape)
    k = shape.in_chans * shape.patch_size ** 2
    return k * shape.dim + shape.dim, rows * cols * k * shape.dim


def memory(shape: StemShape) -> NodeMemory:
    """Bytes (batch 1, float32): a conv + BatchNorm layer holds its input, the conv output and the BN output at
    once; the activation between layers makes a third copy (``saved``); NAT's tokenizer's convs one copy each; a
    LayerNorm on the tokens one more copy of them.  The image itself is counted by the graph (it stays alive for
    the whole forward)."""
    rows, cols = out_grid(shape)
    if shape.kind == "maxxvit":  # conv1, BatchNorm (activation in place), conv2
        outputs, copies = [rows * cols * shape.stem_width, rows * cols * shape.dim], 2
    elif shape.kind == "mobilevit":  # conv, BatchNorm (activation in place)
        outputs, copies = [rows * cols * shape.dim], 2
    elif shape.kind == "conv":
        outputs, copies = [h * w * c_out for _, c_out, h, w in _conv_layers(shape)], 2
    elif shape.kind == "conv_tokenizer":
        outputs, copies = [h * w * c_out for _, c_out, h, w in _conv_layers(shape)], 1
    else:
        outputs, copies = [rows * cols * shape.dim], 1
    if shape.norm_eps is not None:
        outputs.append(rows * cols * shape.dim)
    inputs = [0] + outputs[:-1]
    act = max(i + copies * o for i, o in zip(inputs, outputs))
    saved = sum((copies + (1 if shape.kind == "conv" else 0)) * o for o in outputs)
    return NodeMemory(act=F32 * act, saved=F32 * saved)


def batchnorm_channels(shape: StemShape) -> int:
    """BatchNorm channels ``model.fuse()`` folds away: every conv layer's (conv stem); ResNet's stem: ``bn1``, the deep
    stem's two inner BatchNorms and the conv pool's (:func:`archspec.nn.fuse.fold_conv_batchnorms`); NAT's
    tokenizer, the MaxxViT and MobileViT stems (timm's ``BatchNormAct2d``, which ``fuse()`` leaves) have none."""
    if shape.kind in ("conv_tokenizer", "maxxvit", "mobilevit"):
        return 0
    if shape.kind != "resnet":
        return sum(shape.channels)
    deep = shape.stem_width + (shape.stem_mid or shape.stem_width) if shape.stem_width else 0
    return shape.dim + deep + (shape.dim if shape.pool == "conv" else 0)


def label(shape: StemShape) -> str:
    """The analysis table's kind: ``patch16`` (``patch4+ln`` with a LayerNorm), ``identity16``, ``conv4``,
    ``tokenizer2`` (NAT's), ``resnet``, ``resnet-deep`` or ``resnet-tiered`` (``+convpool``), ``maxxvit``,
    ``mobilevit``."""
    if shape.kind in ("maxxvit", "mobilevit"):
        return shape.kind
    if shape.kind == "resnet":
        deep = "-tiered" if shape.stem_mid and shape.stem_mid != shape.stem_width else "-deep"
        return "resnet" + (deep if shape.stem_width else "") + ("+convpool" if shape.pool == "conv" else "")
    if shape.kind == "conv_tokenizer":
        return f"tokenizer{len(shape.channels)}"
    if shape.kind == "conv":
        return f"conv{len(shape.channels)}"
    return f"{shape.kind}{shape.patch_size}" + ("+ln" if shape.norm_eps is not None else "")
