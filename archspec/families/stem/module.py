"""Stems turning images ``(B, C_in, H_img, W_img)`` into tokens ``(B, N, C)``, row-major on the patch grid.

Their torch-free rules (spec models, the one grid rule, counts, memory) are :mod:`.rules`.
"""

from __future__ import annotations

from functools import partial

from timm.layers import PatchEmbed
from timm.models.levit import ConvNorm
from timm.models.maxxvit import Stem as TimmMaxxVitStem
from torch import Tensor, nn

from ..activations import activation
from ..mobilevit.module import byob_layers, init_as_byobnet
from .rules import StemShape, grid

__all__ = ["PatchStem", "ConvStem", "ConvTokenizer", "IdentityStem", "ResNetStem", "maxxvit_stem", "mobilevit_stem",
           "build"]


def _pair(v: int | tuple[int, int]) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


class PatchStem(PatchEmbed):
    """ViT / ConViT / MaiT patch embedding: timm ``PatchEmbed`` (``proj`` = ``Conv2d(in, dim, P, stride=P)``); with
    ``norm_eps`` Swin's, a LayerNorm ``norm`` on the tokens after it (timm ``SwinTransformer``'s
    ``PatchEmbed(norm_layer=LayerNorm)``).

    Shapes: ``(B, in_chans, H_img, W_img) -> (B, N, dim)``, ``N = (H_img/P)(W_img/P)``;
    ``grid`` = ``(H_img/P, W_img/P)``.
    MACs: ``N * dim * in_chans * P * P``.

    Raises:
        ValueError: if the image size is not divisible by the patch size.
    """

    def __init__(self, in_chans: int, dim: int, patch_size: int, img_size: int | tuple[int, int],
                 norm_eps: float | None = None) -> None:
        img = _pair(img_size)
        if img[0] % patch_size or img[1] % patch_size:
            raise ValueError(f"image size {img} is not divisible by patch size {patch_size}")
        norm = partial(nn.LayerNorm, eps=norm_eps) if norm_eps is not None else None
        super().__init__(img_size=img, patch_size=patch_size, in_chans=in_chans, embed_dim=dim, norm_layer=norm)
        self.grid = tuple(self.grid_size)


class ConvStem(nn.Sequential):
    """LeViT convolutional stem: 3x3 stride-2 timm ``ConvNorm`` layers (conv + BatchNorm), activation between
    layers but not after the last, names ``conv1, act1, conv2, ..., convL`` as timm ``levit.Stem16``
    (LeViT sec. 4.2; four layers ``3 -> C/8 -> C/4 -> C/2 -> C``).

    Shapes: ``(B, in_chans, H, W) -> (B, N, channels[-1])`` flattened row-major; each layer maps a side
    ``s`` to ``(s - 1) // 2 + 1``.  MACs per layer: ``H_out W_out C_out C_in 9``.

    Raises:
        ValueError: for an empty channel list.
    """

    def __init__(self, in_chans: int, channels: list[int], act_layer: type[nn.Module] = nn.Hardswish) -> None:
        super().__init__()
        if not channels:
            raise ValueError("ConvStem needs at least one layer")
        prev = in_chans
        for i, ch in enumerate(channels, start=1):
            if i > 1:
                self.add_module(f"act{i - 1}", act_layer())
            self.add_module(f"conv{i}", ConvNorm(prev, ch, 3, stride=2, padding=1))
            prev = ch
        self.channels = list(channels)
        self.stride = 2 ** len(channels)

    def output_grid(self, img_size: int | tuple[int, int]) -> tuple[int, int]:
        """Token grid ``(H, W)`` produced for an image of ``img_size`` (:func:`~.rules.grid`)."""
        return grid("conv", _pair(img_size), conv_layers=len(self.channels))

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C_in, H, W) -> (B, N, C)``."""
        return super().forward(x).flatten(2).transpose(1, 2)


class ConvTokenizer(nn.Module):
    """NAT's overlapping convolutional tokenizer (Hassani et al. 2022, sec. 3.2; the authors' ``ConvTokenizer``,
    Hugging Face ``NatEmbeddings`` / ``NatPatchEmbeddings``): ``proj`` = two 3x3 stride-2 convs with padding 1 and
    bias, ``C_in -> channels[0] -> channels[1]`` with no activation between, then ``norm`` = LayerNorm on the
    tokens.  PyTorch's default conv init (NAT initialises only its Linears).

    Shapes: ``(B, C_in, H, W) -> (B, N, C)`` row-major, each conv mapping a side ``s`` to ``(s - 1) // 2 + 1``.
    MACs per conv: ``H_out W_out 9 c_in c_out``.
    """

    def __init__(self, in_chans: int, channels: tuple[int, int], norm_eps: float = 1e-5) -> None:
        super().__init__()
        mid, dim = channels
        self.proj = nn.Sequential(nn.Conv2d(in_chans, mid, kernel_size=3, stride=2, padding=1),
                                  nn.Conv2d(mid, dim, kernel_size=3, stride=2, padding=1))
        self.norm = nn.LayerNorm(dim, eps=norm_eps)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C_in, H, W) -> (B, N, C)``."""
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


class IdentityStem(nn.Module):
    """CMHSA phase-1 stem: the token of a patch is its raw pixels (patch projection fixed to identity,
    CMHSA App. B), via ``nn.Unfold``; channel-major order ``(c, i, j)`` within a token.  No parameters.

    Shapes: ``(B, C, H_img, W_img) -> (B, N, C * P * P)``, ``N = (H_img / P)(W_img / P)`` row-major.  MACs: 0.

    Raises:
        ValueError: (in ``forward``) when the image sides are not divisible by ``patch_size`` or channels differ.
    """

    def __init__(self, in_chans: int, patch_size: int) -> None:
        super().__init__()
        self.in_chans = in_chans
        self.patch_size = patch_size
        self.out_dim = in_chans * patch_size * patch_size
        self.unfold = nn.Unfold(kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C, H_img, W_img) -> (B, N, C * P * P)``."""
        P = self.patch_size
        if x.dim() != 4 or x.shape[1] != self.in_chans or x.shape[2] % P or x.shape[3] % P:
            raise ValueError(
                f"IdentityStem expects (B, {self.in_chans}, H, W) with H, W divisible by {P}, got {tuple(x.shape)}")
        return self.unfold(x).transpose(1, 2)


class ResNetStem(nn.Module):
    """ResNet's stem with timm ``resnet.ResNet``'s layers and names: ``conv1`` (a 7x7 stride-2 conv, or the deep
    stem's ``Sequential`` of three 3x3 convs ``in -> w -> w -> C`` with BatchNorm + ReLU between them), ``bn1``,
    ``act1``, ``maxpool`` (3x3 stride-2 max-pool, or ResNet-RS's 3x3 stride-2 conv + BatchNorm + ReLU).  A tiered
    deep stem (timm ``stem_type='deep_tiered'``) has widths ``in -> w -> w2 -> C`` (``stem_mid = w2``).

    Shapes: ``(B, in_chans, H, W) -> (B, C, ceil(H / 4), ceil(W / 4))`` (a map, not tokens).
    MACs: per conv ``H_out W_out k^2 c_in c_out``.  Initialisation as timm ``ResNet.init_weights``: every conv
    ``kaiming_normal_(mode='fan_out', nonlinearity='relu')``.
    """

    def __init__(self, in_chans: int, channels: int, stem_width: int = 0, pool: str = "max", stem_mid: int = 0
                 ) -> None:
        super().__init__()
        if stem_width:
            mid = stem_mid or stem_width
            self.conv1 = nn.Sequential(
                nn.Conv2d(in_chans, stem_width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(stem_width),
                nn.ReLU(inplace=True),
                nn.Conv2d(stem_width, mid, 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(mid),
                nn.ReLU(inplace=True),
                nn.Conv2d(mid, channels, 3, stride=1, padding=1, bias=False))
        else:
            self.conv1 = nn.Conv2d(in_chans, channels, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.act1 = nn.ReLU(inplace=True)
        if pool == "conv":
            self.maxpool = nn.Sequential(nn.Conv2d(channels, channels, 3, stride=2, padding=1, bias=False),
                                         nn.BatchNorm2d(channels), nn.ReLU(inplace=True))
        else:
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        """``(B, C_in, H, W) -> (B, C, H / 4, W / 4)``."""
        return self.maxpool(self.act1(self.bn1(self.conv1(x))))


def maxxvit_stem(shape: StemShape) -> nn.Module:
    """CoAtNet's / MaxViT's stem, timm's own ``maxxvit.Stem`` (names ``conv1``, ``norm1``, ``conv2``): a 3x3
    stride-2 conv ``in_chans -> stem_width``, ``BatchNormAct2d`` (``bn_eps``, ``act``), a 3x3 conv
    ``stem_width -> dim``, both convs with ``bias`` and timm's ``padding`` ('' or 'same'); initialised by its
    ``init_weights()`` (timm ``_init_conv``: ``normal(0, sqrt(2 / fan_out))``, biases 0).

    Shapes: ``(B, in_chans, H, W) -> (B, dim, ceil(H / 2), ceil(W / 2))`` (a map).  MACs: ``H_out W_out 9
    (in_chans w + w dim)``."""
    stem = TimmMaxxVitStem(shape.in_chans, (shape.stem_width, shape.dim), padding="same" if shape.padding == "same"
                           else "", bias=shape.bias, act_layer=shape.act, norm_layer="batchnorm2d",
                           norm_eps=shape.bn_eps)
    stem.init_weights()
    return stem


def mobilevit_stem(shape: StemShape) -> nn.Module:
    """MobileViT's stem, timm ByobNet's ``stem_type='3x3'`` (``create_byob_stem`` without a pool): one
    ``ConvNormAct`` (names ``conv``, ``bn``), a 3x3 stride-2 conv ``in_chans -> dim`` without bias, BatchNorm +
    ``act``; initialised as timm ``ByobNet`` (``normal(0, sqrt(2 / fan_out))``, BatchNorm 1 and 0).

    Shapes: ``(B, in_chans, H, W) -> (B, dim, ceil(H / 2), ceil(W / 2))`` (a map).  MACs: ``H_out W_out 9 in_chans
    dim``."""
    return init_as_byobnet(byob_layers(shape.act).conv_norm_act(shape.in_chans, shape.dim, 3, stride=2))


def build(shape: StemShape) -> nn.Module:
    """The module of a :class:`~.rules.StemShape` (raises as the stem classes)."""
    if shape.kind == "patch":
        return PatchStem(shape.in_chans, shape.dim, shape.patch_size, shape.img_size, shape.norm_eps)
    if shape.kind == "conv_tokenizer":
        return ConvTokenizer(shape.in_chans, shape.channels, shape.norm_eps)
    if shape.kind == "identity":
        return IdentityStem(shape.in_chans, shape.patch_size)
    if shape.kind == "maxxvit":
        return maxxvit_stem(shape)
    if shape.kind == "mobilevit":
        return mobilevit_stem(shape)
    if shape.kind == "resnet":
        return ResNetStem(shape.in_chans, shape.dim, shape.stem_width, shape.pool, shape.stem_mid)
    return ConvStem(shape.in_chans, list(shape.channels), activation(shape.act))
