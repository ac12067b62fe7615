"""ResNet residual blocks built on timm's own (rules: :mod:`.rules`): ``timm.models.resnet.BasicBlock`` /
``Bottleneck`` with timm's ``downsample_conv`` / ``downsample_avg`` shortcuts and timm's ``SEModule``, initialised
as timm ``ResNet.init_weights``, so weights, names and numerics are timm's.  A ``gpsa`` mixer puts T-CNN's
:class:`~.ConvGPSA` in the Bottleneck's ``conv2`` (its 3x3 conv), under the same name, so a timm
ResNet's other weights map unchanged and its ``conv2`` weights become ``conv2.out_weight``.

T-CNN's GPSA in place of a 3x3 convolution, :class:`ConvGPSA` (d'Ascoli et al. 2021, "Transformed CNNs:
recasting pre-trained convolutional layers with self-attention", sec. 2, eq. 4-7, footnote 1): the torch side
of a conv stage's ``mixer: {kind: gpsa}`` (counting: :func:`archspec.families.conv_block.rules.gpsa_counts`)
and of ``archspec tcnn`` (:mod:`archspec.transfer.tcnn`).  Per 3x3 convolution ``W_filter`` (9 taps of
``D_in x D_out``), :class:`ConvGPSA`:

* explicit zero padding of the feature map by the conv's padding (sec. 2: "explicit padding layers"), so
  the border pixels attend to zero tokens, as the conv reads zeros;
* head ``h`` = kernel tap ``h``: centre of attention ``Delta_h`` = the tap's offset (eq. 4), locality strength
  ``alpha_h = softplus_beta(alpha~_h)``, ``beta = 5`` (footnote 1), positional attention
  ``softmax_j(-alpha_h ||delta_ij - Delta_h||^2)`` (eq. 4's ``v_pos . r_ij`` up to a per-query constant that the
  softmax drops);
* eq. 7's gating ``(1 - sigmoid(lambda_h)) softmax(Q_h K_h^T / sqrt(d)) + sigmoid(lambda_h) positional``;
* ``W_val = I`` shared by all heads (``D_v = D_in``, eq. 6), ``W_out^h = W_filter^h``; new ``W_qry``,
  ``W_key`` (``D_in -> N_h d``, ``d = D_in // N_h``, timm ConViT's split; the paper's "D_in x D_in" up to the
  remainder), initialised as timm's ConViT (trunc-normal std 0.02).

Footnote 1 prints ``alpha = log(1 + exp(-beta alpha~)) / beta``; the minus sign only flips the direction of
``alpha~`` and the paper's own "alpha = 1 at init" reads the same either way, so we use the standard softplus
``log(1 + exp(beta alpha~)) / beta`` (``torch.nn.functional.softplus(alpha~, beta=5)``).

With large ``alpha`` and ``lambda`` the layer equals the convolution (off-centre weights ``exp(-alpha)``, content
weight ``1 - sigmoid(lambda)``); the paper's initialisation is ``alpha = lambda = 1`` ("on the verge of
locality").
"""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from timm.layers.bottleneck_attn import BottleneckAttn
from timm.layers.halo_attn import HaloAttn
from timm.layers.squeeze_excite import SEModule
from timm.models.resnet import BasicBlock, Bottleneck, downsample_avg, downsample_conv
from torch import Tensor, nn

from archspec.errors import TransferError
from archspec.families.attention.module import build as build_attention

from .rules import EXPANSION, GPSA_HEADS, BotShape, ConvBlockShape, attention_shape, gpsa_head_dim

__all__ = ["build", "BLOCKS", "BETA", "ConvGPSA", "MapAttention", "build_bot", "conv_to_out_weight",
           "inverse_softplus"]

BLOCKS = {"basic": BasicBlock, "bottleneck": Bottleneck}


BETA = 5.0
"""Softplus sharpness of the locality strength (footnote 1)."""


def inverse_softplus(value: float, beta: float = BETA) -> float:
    """``alpha~`` with ``softplus_beta(alpha~) = value`` (``value > 0``; T-CNN footnote 1); stable for large ``value``.

    Raises:
        ValueError: ``value <= 0`` (math domain)."""
    return value + math.log(-math.expm1(-beta * value)) / beta


def conv_to_out_weight(weight: Tensor) -> Tensor:
    """A 3x3 conv's ``(D_out, D_in, 3, 3)`` weight as ConvGPSA's ``W_out`` ``(9, D_in, D_out)``: head
    ``h = 3 (d_row + 1) + (d_col + 1)`` gets the tap at offset ``(d_row, d_col)`` (eq. 6, ``W_out^h = W_filter^h``)."""
    taps = weight.permute(2, 3, 1, 0).reshape(GPSA_HEADS, weight.shape[1], weight.shape[0])
    return taps.clone(memory_format=torch.contiguous_format)  # contiguous: forward's (9 D_in, D_out) view


class ConvGPSA(nn.Module):
    """A 3x3 convolution re-expressed as 9-head GPSA on the pixels of a feature map (T-CNN sec. 2).

    ``(B, D_in, H, W) -> (B, D_out, H_out, W_out)`` with the conv's output size (stride 1 or 2, padding 1);
    the ``(H + 2)(W + 2)`` padded pixels are the keys, every ``stride``-th inner pixel a query.
    Parameters: ``2 D_in N_h d`` (W_qry, W_key) + ``D_in^2`` (W_val) + ``9 D_in D_out`` (W_out) + ``D_out``
    (bias, if any) + 9 x 4 (centres, locality, gating); MACs: :func:`archspec.families.conv_block.rules.gpsa_counts`.

    Two ways to make one:

    * ``ConvGPSA(d_in, d_out, stride)``: a fresh layer (a conv stage's ``mixer: {kind: gpsa}``); ``W_out`` is
      initialised as timm ``ResNet.init_weights`` initialises the conv it stands for (Kaiming normal, fan-out,
      ReLU gain), ``W_val = I``, ``W_qry`` / ``W_key`` trunc-normal ``qk_init_std``;
    * ``ConvGPSA(conv)`` or :meth:`from_conv`: the re-expression of ``conv`` (``W_out`` = its taps, bias copied;
      ``stride`` defaults to the conv's).

    Args:
        d_in: input channels, or the ``nn.Conv2d`` to re-express (3x3, padding 1, no groups or dilation).
        d_out: output channels (with ``d_in`` an int; required then).
        stride: 1 or 2 (a BoTNet-moved stride is 1); default the conv's, or 1.
        bias: an output bias (ResNets' convs have none).
        alpha: initial locality strength (paper: 1).
        gating: initial gating ``lambda`` (paper: 1).
        qk_init_std: std of the new W_qry / W_key (timm ConViT: 0.02).

    Raises:
        TransferError: a conv that is not a plain 3x3 conv with padding 1; ValueError: no ``d_out`` with an int
            ``d_in``, or a stride other than 1 or 2.
    """

    def __init__(self, d_in: int | nn.Conv2d, d_out: int | None = None, stride: int | None = None,
                 bias: bool = False, *, alpha: float = 1.0, gating: float = 1.0, qk_init_std: float = 0.02) -> None:
        super().__init__()
        conv = d_in if isinstance(d_in, nn.Conv2d) else None
        if conv is not None:
            if (conv.kernel_size != (3, 3) or conv.groups != 1 or conv.dilation != (1, 1) or conv.padding != (1, 1)
                    or conv.stride[0] != conv.stride[1]):
                raise TransferError("T-CNN transforms plain 3x3 convolutions (padding 1, no groups or dilation), "
                                    f"got {conv}")
            d_in, d_out, bias = conv.in_channels, conv.out_channels, conv.bias is not None
            stride = conv.stride[0] if stride is None else stride
        elif d_out is None:
            raise ValueError("ConvGPSA(d_in, d_out): give the output channels, or a Conv2d to re-express")
        stride = 1 if stride is None else stride
        if stride not in (1, 2):
            raise ValueError(f"ConvGPSA runs at stride 1 or 2, got {stride}")
        self.num_heads, self.d_in, self.d_out = GPSA_HEADS, d_in, d_out
        self.head_dim = gpsa_head_dim(d_in)
        self.stride = stride
        self.qk = nn.Linear(d_in, 2 * self.num_heads * self.head_dim, bias=False)
        nn.init.trunc_normal_(self.qk.weight, std=qk_init_std)
        self.v = nn.Linear(d_in, d_in, bias=False)  # W_val = I, shared by the heads (eq. 6)
        with torch.no_grad():
            self.v.weight.copy_(torch.eye(d_in))
        filt = torch.empty(d_out, d_in, 3, 3)
        if conv is None:  # a re-expression loads the conv's taps below (and draws no random numbers for them)
            nn.init.kaiming_normal_(filt, mode="fan_out", nonlinearity="relu")  # as timm inits the conv it replaces
        # W_out^h = tap h of the filter, h = 3 * (d_row + 1) + (d_col + 1); stored (heads, D_in, D_out)
        self.out_weight = nn.Parameter(conv_to_out_weight(filt))
        self.out_bias = nn.Parameter(torch.zeros(d_out)) if bias else None
        offsets = torch.tensor([(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1)], dtype=torch.float32)
        self.centers = nn.Parameter(offsets)  # Delta_h (row, col), learnable (eq. 4)
        self.locality = nn.Parameter(torch.full((9,), inverse_softplus(alpha)))  # alpha~_h
        self.gating = nn.Parameter(torch.full((9,), float(gating)))  # lambda_h
        if conv is not None:
            self.load_conv(conv.weight, conv.bias)
            self.to(conv.weight.device)

    @classmethod
    def from_conv(cls, conv: nn.Conv2d, alpha: float = 1.0, gating: float = 1.0, stride: int | None = None,
                  qk_init_std: float = 0.02) -> ConvGPSA:
        """The re-expression of ``conv`` (T-CNN sec. 2): ``W_out`` its taps, its bias, ``stride`` default its own,
        on its device and in its dtype.

        Raises:
            TransferError: a conv that is not a plain 3x3 conv with padding 1.
        """
        layer = cls(conv, stride=stride, alpha=alpha, gating=gating, qk_init_std=qk_init_std)
        return layer.to(conv.weight.dtype)

    @torch.no_grad()
    def load_conv(self, weight: Tensor, bias: Tensor | None = None) -> ConvGPSA:
        """Load a 3x3 conv's ``(D_out, D_in, 3, 3)`` weight (and ``(D_out,)`` bias) into ``W_out`` (eq. 6).

        Raises:
            ValueError: a weight of another shape, or a bias the layer has no room for (or lacks).
        """
        if tuple(weight.shape) != (self.d_out, self.d_in, 3, 3):
            raise ValueError(f"a 3x3 conv weight {self.d_out}x{self.d_in}x3x3 is needed, got {tuple(weight.shape)}")
        if (bias is None) != (self.out_bias is None):
            raise ValueError("the conv's bias and the layer's must both exist or both be absent")
        self.out_weight.copy_(conv_to_out_weight(weight.detach()))
        if bias is not None:
            self.out_bias.copy_(bias.detach())
        return self

    @property
    def alpha(self) -> Tensor:
        """Locality strengths ``alpha_h = softplus_5(alpha~_h)`` ``(9,)``."""
        return F.softplus(self.locality, beta=BETA)

    def set_exact(self, alpha: float = 1e4, gating: float = 1e4) -> ConvGPSA:
        """Large locality and gating: the layer reproduces its convolution (off-centre weight ``exp(-alpha)``)."""
        with torch.no_grad():
            self.locality.fill_(inverse_softplus(alpha))
            self.gating.fill_(gating)
        return self

    def conv_reference(self, x: Tensor) -> Tensor:
        """The convolution this layer was built from, from its current ``W_out`` (``(B, D_in, H, W)`` ->
        ``(B, D_out, H_out, W_out)``, stride ``self.stride``): what the layer equals at large alpha and lambda."""
        weight = self.out_weight.reshape(3, 3, self.d_in, self.d_out).permute(3, 2, 0, 1)
        return F.conv2d(x, weight.to(x.dtype), self.out_bias, stride=self.stride, padding=1)

    def positions(self, rows: int, cols: int, device, dtype) -> Tensor:
        """``(rows * cols, 2)`` (row, col) of every pixel of a ``rows x cols`` map, row-major (also read by
        :func:`archspec.diagnostics.metrics` on the padded map)."""
        r = torch.arange(rows, device=device, dtype=dtype)
        c = torch.arange(cols, device=device, dtype=dtype)
        return torch.stack(torch.meshgrid(r, c, indexing="ij"), -1).reshape(-1, 2)  # (N, 2) row, col

    def forward(self, x: Tensor) -> Tensor:
        """``(B, D_in, H, W) -> (B, D_out, H_out, W_out)``."""
        B, C, H, W = x.shape
        padded = F.pad(x, (1, 1, 1, 1))  # the conv's zero padding as explicit zero pixels
        rows, cols = H + 2, W + 2
        tokens = padded.flatten(2).transpose(1, 2)  # (B, N, D_in)
        keys = self.positions(rows, cols, x.device, x.dtype)
        qr = torch.arange(1, H + 1, self.stride, device=x.device)
        qc = torch.arange(1, W + 1, self.stride, device=x.device)
        q_index = (qr[:, None] * cols + qc[None, :]).reshape(-1)  # query pixels (conv output positions)
        heads, d = self.num_heads, self.head_dim
        q, k = self.qk(tokens).reshape(B, -1, 2, heads, d).permute(2, 0, 3, 1, 4)  # (B, heads, N, d)
        content = torch.softmax((q[:, :, q_index] @ k.transpose(-2, -1)) * d ** -0.5, dim=-1)
        delta = keys[None, :, :] - keys[q_index][:, None, :]  # (M, N, 2): key minus query
        dist = ((delta[None] - self.centers[:, None, None, :].to(x.dtype)) ** 2).sum(-1)  # (heads, M, N)
        position = torch.softmax(-self.alpha[:, None, None].to(x.dtype) * dist, dim=-1)
        gate = torch.sigmoid(self.gating)[None, :, None, None].to(x.dtype)
        attn = (1 - gate) * content + gate * position[None]  # eq. 7; both terms sum to 1 over keys
        mixed = attn @ self.v(tokens)[:, None]  # (B, heads, M, D_in)
        # sum_h mixed_h W_out^h as one GEMM over (head, D_in): W_out's reshape is a view, where einsum copies
        # the (9, D_in, D_out) weight on every call outside inference mode
        mixed = mixed.transpose(1, 2).reshape(B, -1, heads * self.d_in)  # (B, M, heads D_in)
        out = mixed @ self.out_weight.reshape(heads * self.d_in, self.d_out).to(x.dtype)  # (B, M, D_out)
        if self.out_bias is not None:
            out = out + self.out_bias
        h_out, w_out = len(qr), len(qc)
        return out.transpose(1, 2).reshape(B, self.d_out, h_out, w_out)

    def extra_repr(self) -> str:
        return f"{self.d_in}->{self.d_out}, heads=9, head_dim={self.head_dim}, stride={self.stride}"


class MapAttention(nn.Module):
    """Self-attention of any head kinds on a feature map's pixels (a bottleneck's ``mixer: {kind: attention}`` whose
    heads are not all BoTNet's ``botnet_rel``): ``(B, C, H, W)`` -> the ``H W`` pixels as tokens, row-major ->
    :class:`archspec.families.attention.module.Attention` (``attn``: ``qk``, ``v``, ``proj``; per-head MHSA, GPSA,
    LeViT / CMHSA bias, MaiT masks) -> ``(B, C, H, W)`` -> a 2x2 stride-2 average pool where ``stride == 2``
    (BoTNet's stride handling, timm ``BottleneckAttn.pool``) -> ``(B, C, H / s, W / s)``.

    Raises:
        ValueError: (forward) a map of another size than the layer's grid (the attention's tables are built for it).
    """

    def __init__(self, attn: nn.Module, stride: int = 1) -> None:
        super().__init__()
        self.attn = attn
        self.pool = nn.AvgPool2d(2, 2) if stride == 2 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        B, C, H, W = x.shape
        out = self.attn(x.flatten(2).transpose(1, 2))
        return self.pool(out.transpose(1, 2).reshape(B, C, H, W))


def build_bot(bot: BotShape) -> nn.Module:
    """The attention mixer of ``bot``: ``(B, C, H, W) -> (B, C, H / s, W / s)``.  Every head ``botnet_rel``: timm's
    own ``layers.BottleneckAttn(C, C, feat_size=grid, stride, num_heads)`` (Srinivas et al. 2021; names ``qkv``,
    ``pos_embed.height_rel`` / ``width_rel``; timm's init); every head one ``halo``: timm's own
    ``layers.HaloAttn(C, C, stride, num_heads, dim_head, block_size, halo_size, qk_ratio)`` (Vaswani et al. 2021;
    names ``q``, ``kv``, ``pos_embed.height_rel`` / ``width_rel``; timm's init, as ``ByobNet``'s blocks reset it);
    else :class:`MapAttention` around archspec's ``Attention`` (the token stages' head kinds, d = C / heads)."""
    if bot.halo is not None:
        spec = bot.halo
        return HaloAttn(bot.dim, bot.dim, feat_size=bot.grid, stride=bot.stride, num_heads=len(bot.heads),
                        dim_head=spec.dim_head, block_size=spec.block_size, halo_size=spec.halo_size,
                        qk_ratio=spec.qk_ratio, qkv_bias=bot.qkv_bias)
    if bot.timm:
        return BottleneckAttn(bot.dim, bot.dim, feat_size=bot.grid, stride=bot.stride, num_heads=len(bot.heads),
                              qkv_bias=bot.qkv_bias)

    return MapAttention(build_attention(attention_shape(bot)), bot.stride)


def _block_class(block: str, expansion: int) -> type[nn.Module]:
    """timm's block class, subclassed only to change its class attribute ``expansion`` when the spec does."""
    cls = BLOCKS[block]
    if expansion == EXPANSION[block]:
        return cls
    return type(f"{cls.__name__}{expansion}", (cls,), {"expansion": expansion})


def build(shape: ConvBlockShape) -> nn.Module:
    """The residual block of ``shape``: ``(B, in_chans, H, W) -> (B, channels, ceil(H / s), ceil(W / s))``.

    As timm ``make_blocks`` + ``ResNet.init_weights``: every conv (shortcut and SE included)
    ``kaiming_normal_(mode='fan_out', nonlinearity='relu')``, BatchNorms at weight 1 and bias 0, SE biases at
    torch's default; with ``zero_init_last`` the block's ``zero_init_last()`` (its last BatchNorm's weight 0).
    With ``mixer == 'gpsa'`` the Bottleneck's ``conv2`` is a :class:`~.ConvGPSA` (``width -> width`` at
    the block's stride, ``W_out`` Kaiming-initialised as that conv would be, alpha and lambda from the shape).
    ResNeXt's ``groups`` / ``base_width`` are timm Bottleneck's ``cardinality`` / ``base_width``.
    """
    downsample = None
    if shape.downsample is not None:
        make = downsample_avg if shape.downsample == "avg" else downsample_conv
        downsample = make(shape.in_chans, shape.channels, kernel_size=1, stride=shape.stride, dilation=1,
                          first_dilation=1)
    attn = partial(SEModule, rd_ratio=shape.rd_ratio, rd_divisor=shape.rd_divisor) if shape.se_channels else None
    cls = _block_class(shape.block, shape.expansion)
    grouped = dict(cardinality=shape.groups, base_width=shape.base_width) if shape.block == "bottleneck" else {}
    module = cls(shape.in_chans, shape.width, shape.stride, downsample, attn_layer=attn,
                 drop_path=DropPath(shape.drop_path) if shape.drop_path > 0 else None, **grouped)
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
    if shape.mixer == "gpsa":  # timm's Bottleneck calls self.conv2(x): the GPSA takes its place and its name
        module.conv2 = ConvGPSA(shape.mid, shape.mid, shape.stride, alpha=shape.locality_strength,
                                gating=shape.gating_init)
    if shape.bot is not None:  # BoTNet / HaloNet: attention in conv2's place; bn2, act2 are timm's post_attn
        module.conv2 = build_bot(shape.bot)
    if shape.zero_init_last:
        module.zero_init_last()
    return module
