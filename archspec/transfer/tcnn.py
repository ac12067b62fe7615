"""Transformed CNNs (d'Ascoli et al., "Transformed CNNs: recasting pre-trained convolutional layers with
self-attention", sec. 2-3): re-express the 3x3 convolutions of a (pre-trained) timm ResNet's last stage(s) as
9-head gated positional self-attention (GPSA) layers that reproduce them at initialisation.

Per 3x3 convolution ``W_filter`` (9 taps of ``D_in x D_out``), :class:`ConvGPSA`:

* explicit zero padding of the feature map by the conv's padding (sec. 3: "explicit padding layers"), so
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
locality").  The first stride-2 convolution of a transformed stage becomes stride 1 (BoTNet, sec. 3), and
its block's shortcut loses its stride too (the ResNet-D average pool, or the 1x1 conv's stride).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archspec.transfer.cmhsa import TransferError

__all__ = ["BETA", "ConvGPSA", "conv_gpsa_macs", "count_macs", "gating_param_groups", "load_tcnn", "tcnn",
           "tcnn_from_recipe", "transformed_layers"]

BETA = 5.0
"""Softplus sharpness of the locality strength (footnote 1)."""


def _inverse_softplus(value: float, beta: float = BETA) -> float:
    """``alpha~`` with ``softplus_beta(alpha~) = value``; stable for large ``value``."""
    return value + math.log(-math.expm1(-beta * value)) / beta


class ConvGPSA(nn.Module):
    """A 3x3 convolution re-expressed as 9-head GPSA on the pixels of a feature map (T-CNN sec. 2).

    ``(B, D_in, H, W) -> (B, D_out, H_out, W_out)`` with the conv's output size (stride 1 or 2, padding 1);
    the ``(H + 2)(W + 2)`` padded pixels are the keys, every ``stride``-th inner pixel a query.
    Parameters: ``2 D_in N_h d`` (W_qry, W_key) + ``D_in^2`` (W_val) + ``9 D_in D_out`` (W_out) + ``D_out``
    (bias, if the conv had one) + 9 x 3 (centres and locality) + 9 (gating).  MACs (``N`` padded pixels,
    ``M`` queries): ``N D_in (2 N_h d + D_in)`` (projections) ``+ M N N_h (d + D_in)``
    (attention) ``+ N_h M D_in D_out`` (W_out) -- see :func:`conv_gpsa_macs`.

    Args:
        conv: a ``Conv2d`` with a 3x3 kernel, padding 1, no groups or dilation.
        alpha: initial locality strength (paper: 1).
        gating: initial gating ``lambda`` (paper: 1).
        stride: 1 (BoTNet) or the conv's own stride.
        qk_init_std: std of the new W_qry / W_key (timm ConViT: 0.02).

    Raises:
        TransferError: for a conv that is not a plain 3x3 conv with padding 1.
    """

    def __init__(self, conv: nn.Conv2d, alpha: float = 1.0, gating: float = 1.0, stride: int | None = None,
                 qk_init_std: float = 0.02) -> None:
        super().__init__()
        if conv.kernel_size != (3, 3) or conv.groups != 1 or conv.dilation != (1, 1) or conv.padding != (1, 1):
            raise TransferError("T-CNN transforms plain 3x3 convolutions (padding 1, no groups or dilation), "
                                f"got {conv}")
        d_in, d_out = conv.in_channels, conv.out_channels
        self.num_heads, self.d_in, self.d_out = 9, d_in, d_out
        self.head_dim = max(d_in // self.num_heads, 1)
        self.stride = conv.stride[0] if stride is None else stride
        self.qk = nn.Linear(d_in, 2 * self.num_heads * self.head_dim, bias=False)
        nn.init.trunc_normal_(self.qk.weight, std=qk_init_std)
        self.v = nn.Linear(d_in, d_in, bias=False)  # W_val = I, shared by the heads (eq. 6)
        ref = conv.weight.detach()
        self.v.weight.data.copy_(torch.eye(d_in, dtype=ref.dtype))
        # W_out^h = tap h of the filter, h = 3 * (d_row + 1) + (d_col + 1); stored (heads, D_in, D_out)
        self.out_weight = nn.Parameter(ref.permute(2, 3, 1, 0).reshape(9, d_in, d_out).clone())
        self.out_bias = nn.Parameter(conv.bias.detach().clone()) if conv.bias is not None else None
        offsets = torch.tensor([(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1)], dtype=ref.dtype)
        self.centers = nn.Parameter(offsets)  # Delta_h (row, col), learnable (eq. 4)
        self.locality = nn.Parameter(torch.full((9,), _inverse_softplus(alpha), dtype=ref.dtype))  # alpha~_h
        self.gating = nn.Parameter(torch.full((9,), float(gating), dtype=ref.dtype))  # lambda_h

    @property
    def alpha(self) -> Tensor:
        """Locality strengths ``alpha_h = softplus_5(alpha~_h)`` ``(9,)``."""
        return F.softplus(self.locality, beta=BETA)

    def set_exact(self, alpha: float = 1e4, gating: float = 1e4) -> ConvGPSA:
        """Large locality and gating: the layer reproduces its convolution (off-centre weight ``exp(-alpha)``)."""
        with torch.no_grad():
            self.locality.fill_(_inverse_softplus(alpha))
            self.gating.fill_(gating)
        return self

    def conv_reference(self, x: Tensor) -> Tensor:
        """The convolution this layer was built from, from its current ``W_out`` (``(B, D_in, H, W)`` ->
        ``(B, D_out, H_out, W_out)``, stride ``self.stride``): what the layer equals at large alpha and lambda."""
        weight = self.out_weight.reshape(3, 3, self.d_in, self.d_out).permute(3, 2, 0, 1)
        return F.conv2d(x, weight.to(x.dtype), self.out_bias, stride=self.stride, padding=1)

    def _positions(self, rows: int, cols: int, device, dtype) -> Tensor:
        r = torch.arange(rows, device=device, dtype=dtype)
        c = torch.arange(cols, device=device, dtype=dtype)
        return torch.stack(torch.meshgrid(r, c, indexing="ij"), -1).reshape(-1, 2)  # (N, 2) row, col

    def forward(self, x: Tensor) -> Tensor:
        """``(B, D_in, H, W) -> (B, D_out, H_out, W_out)``."""
        B, C, H, W = x.shape
        padded = F.pad(x, (1, 1, 1, 1))  # the conv's zero padding as explicit zero pixels
        rows, cols = H + 2, W + 2
        tokens = padded.flatten(2).transpose(1, 2)  # (B, N, D_in)
        keys = self._positions(rows, cols, x.device, x.dtype)
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
        out = torch.einsum("bhmi,hio->bmo", mixed, self.out_weight.to(x.dtype))
        if self.out_bias is not None:
            out = out + self.out_bias
        h_out, w_out = len(qr), len(qc)
        return out.transpose(1, 2).reshape(B, self.d_out, h_out, w_out)

    def extra_repr(self) -> str:
        return f"{self.d_in}->{self.d_out}, heads=9, head_dim={self.head_dim}, stride={self.stride}"


def conv_gpsa_macs(d_in: int, d_out: int, height: int, width: int, stride: int = 1) -> int:
    """Hand count of :class:`ConvGPSA`'s MACs on an ``(H, W)`` map (what ``forward`` multiplies)."""
    n = (height + 2) * (width + 2)
    m = ((height - 1) // stride + 1) * ((width - 1) // stride + 1)
    qk = 9 * max(d_in // 9, 1)
    return n * d_in * 2 * qk + n * d_in * d_in + m * n * (qk + 9 * d_in) + 9 * m * d_in * d_out


def _stage_modules(cnn: nn.Module, stages: Iterable[int | str]) -> list[tuple[str, nn.Module]]:
    names = [n for n, _ in cnn.named_children() if n.startswith("layer")]
    if not names:
        raise TransferError("T-CNN needs a timm ResNet-family model (stages named layer1..layer4)")
    chosen = []
    for stage in stages:
        name = stage if isinstance(stage, str) else (names[stage] if -len(names) <= stage < 0 else f"layer{stage}")
        if name not in names:
            raise TransferError(f"no stage {stage!r}; the model's stages are {', '.join(names)} (or -1 for the last)")
        chosen.append((name, getattr(cnn, name)))
    return chosen


def _drop_shortcut_stride(block: nn.Module) -> None:
    """The block's shortcut keeps the new stride 1: ResNet-D's AvgPool2d goes, a strided 1x1 conv gets stride 1."""
    down = getattr(block, "downsample", None)
    if down is None:
        return
    for name, module in list(down.named_children()):
        if isinstance(module, nn.AvgPool2d):
            setattr(down, name, nn.Identity())
        elif isinstance(module, nn.Conv2d) and module.stride != (1, 1):
            module.stride = (1, 1)


def tcnn(cnn: nn.Module, stages: Sequence[int | str] = (-1,), alpha: float = 1.0, gating: float = 1.0,
         stride_one: bool = True) -> nn.Module:
    """A T-CNN: a deep copy of ``cnn`` whose chosen stages' 3x3 convolutions are :class:`ConvGPSA` layers.

    Args:
        cnn: a timm ResNet-family model (``resnetrs50``, ``resnet50d``, ``resnet18``, ...), trained or not.
        stages: stage indices (4 = ``layer4``, -1 = the last) or names; default the last (sec. 3).
        alpha: initial locality strength (paper: 1).
        gating: initial gating lambda (paper: 1).
        stride_one: replace the first stride-2 convolution of each transformed stage by stride 1 (BoTNet,
            sec. 3), and its shortcut's stride likewise.

    Returns:
        the T-CNN, same input and output as ``cnn``, in ``cnn``'s train/eval mode.

    Raises:
        TransferError: a model without ``layer*`` stages, an unknown stage, a 3x3 conv that is grouped,
            dilated or not padding 1.
    """
    model = copy.deepcopy(cnn)
    for _, stage in _stage_modules(model, stages):
        for block in stage.children():
            strided = False
            for name, conv in list(block.named_children()):
                if isinstance(conv, nn.Conv2d) and conv.kernel_size == (3, 3):
                    strided = strided or conv.stride != (1, 1)
                    layer = ConvGPSA(conv, alpha, gating, stride=1 if stride_one else None)
                    setattr(block, name, layer.to(conv.weight.device).train(conv.training))
            if strided and stride_one:
                _drop_shortcut_stride(block)
    return model


def transformed_layers(model: nn.Module) -> list[ConvGPSA]:
    """The :class:`ConvGPSA` layers of a T-CNN, in order."""
    return [m for m in model.modules() if isinstance(m, ConvGPSA)]


def gating_param_groups(model: nn.Module, lr: float, gating_lr: float = 0.1, weight_decay: float = 0.05) -> list[dict]:
    """Optimizer groups for fine-tuning a T-CNN (sec. 3): the gating ``lambda_h`` at ``gating_lr`` (paper 0.1) and
    no weight decay; other 1-d parameters (norms, biases, locality, centres) without weight decay; the rest
    with it.  Pass to ``torch.optim.AdamW`` or :func:`archspec.train.train` (``param_groups``)."""
    layers = transformed_layers(model)
    gating = {id(m.gating) for m in layers}
    positional = {id(m.centers) for m in layers}  # 2-d, but positions: no weight decay (as timm's pos_proj-free GPSA)
    groups = {"gating": [], "no_decay": [], "decay": []}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        key = "gating" if id(p) in gating else ("no_decay" if p.ndim <= 1 or id(p) in positional else "decay")
        groups[key].append(p)
    return [{"params": groups["decay"], "lr": lr, "weight_decay": weight_decay},
            {"params": groups["no_decay"], "lr": lr, "weight_decay": 0.0},
            {"params": groups["gating"], "lr": gating_lr, "weight_decay": 0.0}]


RECIPE_KEYS = ("base", "stages", "alpha", "gating", "stride_one", "num_classes")


def tcnn_from_recipe(recipe: dict, pretrained: bool = False) -> nn.Module:
    """Build a T-CNN from its recipe (``base`` timm model name, ``stages``, ``alpha``, ``gating``, ``stride_one``,
    ``num_classes``) -- what ``archspec tcnn`` writes as ``spec.yaml`` -- with the base's timm initialisation
    (or its pretrained weights).

    Raises:
        TransferError: an unknown key or timm model, or a model T-CNN cannot transform.
    """
    import timm  # noqa: PLC0415

    unknown = set(recipe) - set(RECIPE_KEYS)
    if unknown or "base" not in recipe:
        raise TransferError(f"a T-CNN recipe has the keys {', '.join(RECIPE_KEYS)} ('base' required); "
                            f"got {', '.join(sorted(recipe))}")
    if not timm.is_model(recipe["base"]):
        raise TransferError(f"timm has no model {recipe['base']!r}")
    kwargs = {} if recipe.get("num_classes") is None else {"num_classes": int(recipe["num_classes"])}
    cnn = timm.create_model(recipe["base"], pretrained=pretrained, **kwargs).eval()
    return tcnn(cnn, stages=recipe.get("stages", [-1]), alpha=recipe.get("alpha", 1.0),
                gating=recipe.get("gating", 1.0), stride_one=recipe.get("stride_one", True))


def load_tcnn(directory: str | Path) -> nn.Module:
    """Load a T-CNN that ``archspec tcnn`` wrote: its recipe (``spec.yaml``) and weights (``model.safetensors``).

    Raises:
        TransferError: a missing or malformed recipe; OSError / safetensors errors for unreadable weights.
    """
    import yaml  # noqa: PLC0415
    from safetensors.torch import load_model  # noqa: PLC0415

    directory = Path(directory)
    try:
        recipe = yaml.safe_load((directory / "spec.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TransferError(f"{directory / 'spec.yaml'}: not a T-CNN recipe ({exc})") from None
    if not isinstance(recipe, dict) or "tcnn" not in recipe:
        raise TransferError(f"{directory / 'spec.yaml'}: not a T-CNN recipe (no 'tcnn' key)")
    model = tcnn_from_recipe(recipe["tcnn"])
    load_model(model, str(directory / "model.safetensors"))
    return model.eval()


def count_macs(model: nn.Module, x: Tensor) -> int:
    """Multiply-accumulates of ``model(x)``: torch's ``FlopCounterMode`` total / 2 (matmuls, convs, einsums)."""
    from torch.utils.flop_counter import FlopCounterMode  # noqa: PLC0415

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return int(counter.get_total_flops() // 2)
