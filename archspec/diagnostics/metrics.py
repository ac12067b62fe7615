"""Attention diagnostics of compiled models: attention maps, MaiT's locality score, ConViT's nonlocality.

* :func:`attention_maps` -- the final attention probabilities ``(B, H, N, N)`` of every
  :class:`archspec.nn.blocks.Attention` in a model, from one forward pass (hooks on the layers' inputs).
* :func:`attention_locality_score` -- MaiT eq. 3: ``ALS_n = sum_i (M (.) A)_{n,i}``, the attention
  mass a patch query puts inside its window; per head, the mean over patch queries (and the batch).
* :func:`layer_als` -- ALS of every layer and head with a window mask on that layer's token grid.
* :func:`nonlocality` -- ConViT eq. 8: ``D_loc = sum_j A_ij ||delta_ij||`` in patch units, averaged
  over patch queries (and the batch), per head.
* :func:`cross_layer_similarity` -- MaiT App. A.3 eq. 5 (after DeepViT): the cosine similarity
  ``M^{i,j}_{h,t}`` of the attention rows ``A^i_{h,t,:}`` and ``A^j_{h,t,:}`` of layers ``i`` and ``j``,
  per head and token; :func:`layer_cross_similarity` runs it on a model's layers.
* :func:`layer_gating` -- ConViT's gating ``sigmoid(lambda_h)`` of every GPSA layer (T-CNN's too).
* :func:`layer_gauss` -- the learned amplitude and width of every ``gauss_mask`` head (GMM-Mask).
* :func:`attention_layers` -- the maps with what the diagnostics need of each layer (grid, prefix tokens,
  head letters), attention inside bottlenecks included.

These work on any archspec model (whatever its heads: masked, biased, GPSA or plain), and the
functions on tensors work on any attention map.

Attention inside conv stages' bottlenecks (BoTNet, T-CNN) is read on the map's pixels, row-major, no prefix:

* ``mixer: {kind: attention}`` with mixed heads: an :class:`Attention` on the pixels (as any token layer);
* all heads ``botnet_rel``: timm's ``BottleneckAttn``, ``softmax(q k^T / sqrt(d) + rel_logits)`` ``(B, H, HW, HW)``
  recomputed from its input as its forward does (attention runs at stride 1; the pool comes after);
* every head one ``halo``: timm's ``HaloAttn`` (HaloNet), each ``b x b`` query block's softmax over its
  ``(b + 2h)^2`` window recomputed as its forward does and scattered into ``(B, H, HW, HW)`` (0 outside the window;
  the halo's zero padding, keys of the layer too, left out, so a border row sums to at most 1); a strided layer
  (its queries subsampled in each block: not one query per pixel) is not read;
* T-CNN's :class:`~archspec.families.conv_block.module.ConvGPSA` (9 heads, eq. 7 with its gating): queries
  every pixel of the map -- at stride 2 the layer itself queries every other one, we take all of them (our choice,
  so the map stays square) -- and keys the map's pixels; the conv padding's zero pixels, also keys of the layer,
  are left out, so a row sums to 1 minus the share on the padding (ALS and nonlocality count real pixels only).

MobileViT's blocks (timm ``MobileVitBlock``, every head a ``grid``): each transformer layer's
``softmax(q k^T / sqrt(d))`` over the patches of one offset, recomputed from the layer's input and scattered into
``(B, H, T, T)`` on the block's (resized) ``H' x W'`` pixels, row-major (0 between pixels of different offsets:
:func:`mobilevit_attention`); a layer is named ``<block>.transformer.<l>.attn``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from timm.layers.bottleneck_attn import BottleneckAttn
from timm.layers.halo_attn import HaloAttn
from timm.models.mobilevit import MobileVitBlock
from timm.models.vision_transformer import Attention as TimmAttention
from torch import Tensor, nn

from archspec.families.attention.mask_terms import window_mask
from archspec.families.attention.module import Attention
from archspec.families.attention.tables import squared_distances
from archspec.families.conv_block.module import ConvGPSA
from archspec.families.talking_heads.module import TalkingHeadAttn

__all__ = ["attention_maps", "attention_layers", "AttentionLayer", "attention_locality_score", "layer_als",
           "nonlocality", "patch_window_mask", "cross_layer_similarity", "layer_cross_similarity", "layer_gating",
           "layer_gauss", "bottleneck_attention", "halo_attention", "conv_gpsa_attention", "mobilevit_attention",
           "SELF_ATTENTION_LAYERS", "MAP_ATTENTION_LAYERS"]

# Token-to-token attention layers (square (B, H, N, N) maps on a patch grid): what the diagnostics read.
SELF_ATTENTION_LAYERS = (Attention, TalkingHeadAttn)
# Attention on a feature map's pixels inside a bottleneck (input (B, C, H, W)): BoTNet's, HaloNet's and T-CNN's
MAP_ATTENTION_LAYERS = (BottleneckAttn, HaloAttn, ConvGPSA)


class AttentionLayer(NamedTuple):
    """One layer's attention ``attn`` ``(B, H, N, N)`` with its token ``grid`` (rows, cols), its
    ``num_prefix_tokens`` (class/distillation tokens first) and its head ``letters`` (``"A A P"``)."""

    attn: Tensor
    grid: tuple[int, int]
    num_prefix_tokens: int
    letters: str


def bottleneck_attention(layer: BottleneckAttn, x: Tensor) -> Tensor:
    """timm ``BottleneckAttn``'s probabilities on its input map ``x`` ``(B, C, H, W)``: ``(B, heads, HW, HW)``,
    ``softmax(q k^T * scale + rel_logits)`` (BoTNet / AA-Net relative logits) as its forward computes them."""
    B = x.shape[0]
    q, k, _ = torch.split(layer.qkv(x), [layer.dim_out_qk, layer.dim_out_qk, layer.dim_out_v], dim=1)
    q = q.reshape(B * layer.num_heads, layer.dim_head_qk, -1).transpose(-1, -2)
    k = k.reshape(B * layer.num_heads, layer.dim_head_qk, -1)
    if layer.scale_pos_embed:
        logits = (q @ k + layer.pos_embed(q)) * layer.scale
    else:
        logits = (q @ k) * layer.scale + layer.pos_embed(q)
    return logits.softmax(dim=-1).reshape(B, layer.num_heads, q.shape[1], q.shape[1])


def halo_attention(layer: HaloAttn, x: Tensor) -> Tensor:
    """timm ``HaloAttn``'s probabilities (HaloNet, unstrided queries) on its input map ``x`` ``(B, C, H, W)``:
    ``(B, heads, HW, HW)``, row-major pixels.  Each ``b x b`` block's ``softmax(q k^T * scale + rel_logits)`` over
    its ``(b + 2h)^2`` window, as the layer's forward computes it (timm's ``(B heads, d_qk + d_v)`` split of the
    ``kv`` channels included), is written at its query and key pixels; keys outside the window are 0 and the
    halo's zero padding is left out (a border row sums to 1 minus its share on the padding).

    Raises:
        ValueError: a strided layer (its subsampled queries are not one per pixel).
    """
    if layer.block_stride != 1:
        raise ValueError("a strided HaloAttn queries every other pixel of a block: no (HW, HW) map")
    B, _, H, W = x.shape
    b, halo, win, heads = layer.block_size, layer.halo_size, layer.win_size, layer.num_heads
    nh, nw, d = H // b, W // b, layer.dim_head_qk
    q = layer.q(x).reshape(-1, d, nh, b, nw, b).permute(0, 1, 3, 5, 2, 4)
    q = q.reshape(B * heads, d, -1, nh * nw).transpose(1, 3)  # (B heads, blocks, b^2, d)
    kv = F.pad(layer.kv(x), [halo] * 4).unfold(2, win, b).unfold(3, win, b)
    kv = kv.reshape(B * heads, d + layer.dim_head_v, nh * nw, -1).permute(0, 2, 3, 1)
    logits = q @ kv[..., :d].transpose(-1, -2)
    if layer.scale_pos_embed:
        logits = (logits + layer.pos_embed(q)) * layer.scale
    else:
        logits = logits * layer.scale + layer.pos_embed(q)
    # pixel of each block's queries and of its window's keys (H W for a padded key: a column dropped below)
    rows, cols = torch.arange(nh, device=x.device) * b, torch.arange(nw, device=x.device) * b
    r = (rows[:, None, None, None] + torch.arange(b, device=x.device)[None, None, :, None])
    c = (cols[None, :, None, None] + torch.arange(b, device=x.device)[None, None, None, :])
    queries = (r * W + c).reshape(nh * nw, b * b)
    kr = rows[:, None, None, None] - halo + torch.arange(win, device=x.device)[None, None, :, None]
    kc = cols[None, :, None, None] - halo + torch.arange(win, device=x.device)[None, None, None, :]
    inside = (kr >= 0) & (kr < H) & (kc >= 0) & (kc < W)
    keys = torch.where(inside, kr * W + kc, H * W).reshape(nh * nw, win * win)
    dense = logits.new_zeros(B * heads, H * W, H * W + 1)
    dense[:, queries[:, :, None], keys[:, None, :]] = logits.softmax(dim=-1)
    return dense[..., :-1].reshape(B, heads, H * W, H * W)


def conv_gpsa_attention(layer: ConvGPSA, x: Tensor) -> Tensor:
    """T-CNN's GPSA probabilities (eq. 7, gated content + positional) on its input map ``x`` ``(B, C, H, W)``:
    ``(B, 9, HW, HW)``, every pixel a query (at stride 2 the layer queries every other one), the map's pixels as
    keys (the zero padding's keys, which the layer also attends to, left out: rows sum to at most 1)."""
    B, _, H, W = x.shape
    padded = F.pad(x, (1, 1, 1, 1)).flatten(2).transpose(1, 2)  # (B, (H+2)(W+2), C)
    rows, cols = H + 2, W + 2
    inner = (torch.arange(1, H + 1, device=x.device)[:, None] * cols
             + torch.arange(1, W + 1, device=x.device)[None, :]).reshape(-1)
    heads, d = layer.num_heads, layer.head_dim
    q, k = layer.qk(padded).reshape(B, -1, 2, heads, d).permute(2, 0, 3, 1, 4)
    content = torch.softmax((q[:, :, inner] @ k.transpose(-2, -1)) * d ** -0.5, dim=-1)
    keys = layer.positions(rows, cols, x.device, x.dtype)
    delta = keys[None, :, :] - keys[inner][:, None, :]
    dist = ((delta[None] - layer.centers[:, None, None, :].to(x.dtype)) ** 2).sum(-1)
    position = torch.softmax(-layer.alpha[:, None, None].to(x.dtype) * dist, dim=-1)
    gate = torch.sigmoid(layer.gating)[None, :, None, None].to(x.dtype)
    return ((1 - gate) * content + gate * position[None])[..., inner]


def mobilevit_attention(layer: TimmAttention, x: Tensor, grid: tuple[int, int], patch: tuple[int, int]) -> Tensor:
    """One transformer layer of a timm ``MobileVitBlock`` (MobileViT sec. 3.1): its probabilities on its input
    ``x`` ``(B P, N, D)`` (the block's unfold of a ``grid = (H', W')`` map into ``P = p_h p_w`` sequences of ``N``
    patches, after ``norm1``), ``softmax(q k^T * scale)`` per sequence as timm's ``Attention`` computes it, written
    at their pixels of the map: ``(B, heads, H' W', H' W')``, row-major, 0 between pixels of different offsets."""
    (rows, cols), (ph, pw) = grid, patch
    bp, n, _ = x.shape
    b, heads = bp // (ph * pw), layer.num_heads
    q, k, _ = layer.qkv(x).reshape(bp, n, 3, heads, layer.head_dim).permute(2, 0, 3, 1, 4)
    probs = ((layer.q_norm(q) * layer.scale) @ layer.k_norm(k).transpose(-2, -1)).softmax(dim=-1)
    # sequence (i, j), patch (a, c) -> pixel (a p_h + i, c p_w + j): timm's unfold, B P = (B, P) batch-major
    a = torch.arange(rows // ph, device=x.device)[:, None] * ph
    c = torch.arange(cols // pw, device=x.device)[None, :] * pw
    offsets = torch.arange(ph, device=x.device)[:, None] * cols + torch.arange(pw, device=x.device)[None, :]
    pixels = (offsets.reshape(-1, 1) + (a * cols + c).reshape(1, -1))  # (P, N)
    dense = probs.new_zeros(b, heads, rows * cols, rows * cols)
    probs = probs.reshape(b, ph * pw, heads, n, n).transpose(1, 2)  # (B, heads, P, N, N)
    dense[:, :, pixels[:, :, None], pixels[:, None, :]] = probs
    return dense


#: each map attention layer's probabilities on its input map
_MAP_PROBABILITIES = {BottleneckAttn: bottleneck_attention, HaloAttn: halo_attention, ConvGPSA: conv_gpsa_attention}


def _letters(module: nn.Module) -> str:
    if isinstance(module, BottleneckAttn):
        return " ".join(["B"] * module.num_heads)  # botnet_rel's letter
    if isinstance(module, HaloAttn):
        return " ".join(["H"] * module.num_heads)  # halo's letter
    if isinstance(module, ConvGPSA):
        return " ".join(["P"] * module.num_heads)
    return " ".join(h.letter for h in module.head_specs)


def _mobilevit_hooks(name: str, block: MobileVitBlock, out: dict[str, AttentionLayer]) -> list:
    """Pre-hooks reading a MobileViT block's transformer layers into ``out`` (:func:`mobilevit_attention`): one on the
    block noting the map its patches tile (each side rounded up to whole patches, as timm's forward resizes it), one
    on each layer's attention."""
    seen: dict[str, tuple[int, int]] = {}
    patch = tuple(block.patch_size)

    def on_block(mod: nn.Module, args: tuple) -> None:
        h, w = args[0].shape[-2:]
        seen["grid"] = (-(-h // patch[0]) * patch[0], -(-w // patch[1]) * patch[1])

    handles = [block.register_forward_pre_hook(on_block)]
    for index, layer in enumerate(block.transformer):
        def hook(mod: nn.Module, args: tuple, _name: str = f"{name}.transformer.{index}.attn".lstrip(".")) -> None:
            grid = seen["grid"]
            out[_name] = AttentionLayer(mobilevit_attention(mod, args[0], grid, patch).detach(), grid, 0,
                                        " ".join(["O"] * mod.num_heads))  # the grid kind's letter
        handles.append(layer.attn.register_forward_pre_hook(hook))
    return handles


@torch.no_grad()
def attention_layers(model: nn.Module, x: Tensor) -> dict[str, AttentionLayer]:
    """``{module path: AttentionLayer}`` for every self-attention layer of ``model``: the token layers
    (:data:`SELF_ATTENTION_LAYERS`) and the attention inside bottlenecks (:data:`MAP_ATTENTION_LAYERS`, on the
    map's pixels, no prefix tokens; an :class:`Attention` inside a bottleneck is a token layer on the pixels; a
    strided ``HaloAttn`` is left out: :func:`halo_attention`), and each transformer layer of a MobileViT block on
    its map's pixels (:func:`mobilevit_attention`).

    One forward pass in ``eval`` mode without gradients; a forward pre-hook on each layer computes its
    probabilities from its input (after masks, biases and GPSA gating, without dropout; for CaiT's talking heads
    each head's softmax, before ``proj_w``).  CaiT's class-attention layers (one query) are not included.  The
    model's train/eval mode is restored afterwards.
    """
    out: dict[str, AttentionLayer] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, SELF_ATTENTION_LAYERS):
            def hook(mod: nn.Module, args: tuple, _name: str = name) -> None:
                out[_name] = AttentionLayer(mod.get_attention(args[0]).detach(), tuple(mod.grid),
                                            mod.num_prefix_tokens, _letters(mod))
        elif isinstance(module, MAP_ATTENTION_LAYERS) and getattr(module, "block_stride", 1) == 1:
            def hook(mod: nn.Module, args: tuple, _name: str = name) -> None:
                probs = _MAP_PROBABILITIES[type(mod)]
                out[_name] = AttentionLayer(probs(mod, args[0]).detach(), tuple(args[0].shape[-2:]), 0, _letters(mod))
        elif isinstance(module, MobileVitBlock):
            handles += _mobilevit_hooks(name, module, out)
            continue
        else:
            continue
        handles.append(module.register_forward_pre_hook(hook))
    was_training = model.training
    model.eval()
    try:
        model(x)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    return out


@torch.no_grad()
def attention_maps(model: nn.Module, x: Tensor) -> dict[str, Tensor]:
    """``{module path: (B, H, N, N)}`` for every self-attention layer of ``model`` (:func:`attention_layers`: the
    token layers and the attention inside bottlenecks), from one forward pass in eval mode."""
    return {name: layer.attn for name, layer in attention_layers(model, x).items()}


def attention_locality_score(attn: Tensor, mask: Tensor, num_prefix_tokens: int = 0) -> Tensor:
    """MaiT Attention Locality Score (eq. 3) per head.

    ``ALS_n = sum_i (M (.) A)_{n,i}`` for each patch query ``n`` (rows ``num_prefix_tokens..N-1``); a
    head's ALS is the mean over those rows and over the batch.  The mask is used as given: pass
    :func:`patch_window_mask` to count only the spatial neighbours (what :func:`layer_als` does), or a
    layer's own ``attn_masks`` (which treat the class token as a neighbour) to count that too.

    Args:
        attn: attention probabilities ``(B, H, N, N)`` (rows sum to 1).
        mask: BoolTensor ``(N, N)``, ``True`` = neighbour of the query row.
        num_prefix_tokens: class/distillation tokens first; their rows are not averaged.

    Returns:
        ``(H,)``: 1 when every patch attends only inside its window; ``|window| / N`` for uniform attention.
    """
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attn must be (B, H, N, N), got {tuple(attn.shape)}")
    n = attn.shape[-1]
    if mask.shape != (n, n):
        raise ValueError(f"mask must be ({n}, {n}) for {n} tokens, got {tuple(mask.shape)}")
    if not 0 <= num_prefix_tokens < n:
        raise ValueError(f"num_prefix_tokens must be in [0, {n}), got {num_prefix_tokens}")
    als_n = (attn * mask.to(attn.dtype)).sum(dim=-1)  # (B, H, N)
    return als_n[:, :, num_prefix_tokens:].mean(dim=(0, 2))


def patch_window_mask(grid: tuple[int, int], window: tuple[int, int], num_prefix_tokens: int = 0) -> Tensor:
    """Window mask ``(N, N)`` of spatial neighbours only: prefix rows and columns are ``False``.

    Windows may exceed the grid (they are clipped at the border, as in MaiT's masks).
    """
    mask = window_mask(grid, window, num_prefix_tokens).clone()
    p = num_prefix_tokens
    mask[:p, :] = False
    mask[:, :p] = False
    return mask


def layer_als(model: nn.Module, x: Tensor, window: tuple[int, int] = (3, 3)) -> dict[str, Tensor]:
    """ALS ``(H,)`` of every attention layer of ``model`` on images ``x``, with a ``window`` mask on its grid.

    Whatever each head is (masked or not), the score counts the attention a patch query puts on the
    patches of its ``window`` (class/distillation columns are not neighbours here), averaged over
    patch queries and the batch -- MaiT's per-head, per-layer ALS (Fig. 3).
    """
    out: dict[str, Tensor] = {}
    for name, layer in attention_layers(model, x).items():
        mask = patch_window_mask(layer.grid, window, layer.num_prefix_tokens).to(layer.attn.device)
        out[name] = attention_locality_score(layer.attn, mask, layer.num_prefix_tokens)
    return out


def nonlocality(attn: Tensor, grid: tuple[int, int], num_prefix_tokens: int = 0) -> Tensor:
    """ConViT nonlocality (eq. 8) per head: ``sum_j A_ij ||delta_ij||``, averaged over patch queries and batch.

    ``delta_ij`` is the offset between patches ``i`` and ``j`` on the ``grid`` in patch units (Euclidean).
    Only patch-to-patch attention counts: the weight a patch puts on class/distillation tokens has no
    distance and is left out (ConViT's GPSA layers have no class token).

    Args:
        attn: ``(B, H, N, N)`` with ``N = num_prefix_tokens + rows * cols``.

    Returns:
        ``(H,)`` mean attention distance in patches (0 for attention on the query itself only).
    """
    rows, cols = grid
    n = num_prefix_tokens + rows * cols
    if attn.dim() != 4 or attn.shape[-2:] != (n, n):
        raise ValueError(f"attn must be (B, H, {n}, {n}) for grid {rows}x{cols} and {num_prefix_tokens} prefix "
                         f"tokens, got {tuple(attn.shape)}")
    dist = squared_distances((rows, cols)).to(attn.device, attn.dtype).sqrt()  # (P, P)
    p = num_prefix_tokens
    patch = attn[:, :, p:, p:]
    return (patch * dist).sum(dim=-1).mean(dim=(0, 2))


def cross_layer_similarity(maps: list[Tensor], eps: float = 1e-12) -> Tensor:
    """MaiT App. A.3 eq. 5: ``M^{i,j}_{h,t} = A^i_{h,t,:} . A^j_{h,t,:} / (||A^i_{h,t,:}|| ||A^j_{h,t,:}||)``.

    The cosine similarity, for head ``h`` and output token ``t``, between the attention row of layer ``i``
    and that of layer ``j`` (the weights token ``t`` gives every input token), for every pair of layers.

    Args:
        maps: ``L`` attention maps ``(B, H, N, N)`` of the same shape, one per layer, in layer order.
        eps: guards a zero row (its similarity is then 0).

    Returns:
        ``(B, H, L, L, N)``: ``out[b, h, i, j, t] = M^{i,j}_{h,t}`` for image ``b``; symmetric in ``i, j``,
        1 on the diagonal for non-zero rows.  MaiT's Fig. 7-9 heat maps are per head, ``L x L``: we
        average over tokens and images, ``out.mean(dim=(0, 4))`` (what :func:`layer_cross_similarity` returns).

    Raises:
        ValueError: fewer than one map, or maps of different shapes or not ``(B, H, N, N)``.
    """
    if not maps:
        raise ValueError("cross_layer_similarity needs at least one attention map")
    shape = maps[0].shape
    if len(shape) != 4 or shape[-1] != shape[-2] or any(m.shape != shape for m in maps):
        raise ValueError(f"maps must all be (B, H, N, N) of one shape, got {[tuple(m.shape) for m in maps]}")
    stacked = torch.stack(maps, dim=2)  # (B, H, L, N, N): [b, h, layer, t, :]
    unit = stacked / stacked.norm(dim=-1, keepdim=True).clamp_min(eps)
    return torch.einsum("bhitk,bhjtk->bhijt", unit, unit)


def layer_cross_similarity(model: nn.Module, x: Tensor,
                           maps: dict[str, Tensor] | None = None) -> tuple[list[str], Tensor]:
    """Cross-layer similarity (eq. 5) of every self-attention layer of ``model`` on images ``x``.

    Returns ``(layer names, (H, L, L))``: ``M^{i,j}_h`` averaged over tokens ``t`` and images.  When all
    layers see the same tokens (DeiT, MaiT, CaiT's self-attention stage), the rows cover all ``N``
    tokens as in the paper; when they differ (ConViT inserts the class token later) every map is cut
    to its patch-to-patch block so the layers compare on the same tokens (our choice).

    ``maps`` (from :func:`attention_maps` of the same ``model`` and ``x``) saves the forward pass.

    Raises:
        ValueError: no self-attention layer, or layers with different head counts or patch grids.
    """
    maps = attention_maps(model, x) if maps is None else maps
    if not maps:
        raise ValueError("the model has no self-attention layer")
    names, tensors = list(maps), list(maps.values())
    if len({t.shape for t in tensors}) > 1:
        modules = dict(model.named_modules())  # a bottleneck's attention has no prefix tokens
        prefix = {n: getattr(modules[n], "num_prefix_tokens", 0) for n in names}
        tensors = [t[..., prefix[n]:, prefix[n]:] for n, t in zip(names, tensors)]
    return names, cross_layer_similarity(tensors).mean(dim=(0, 4))


def layer_gating(model: nn.Module) -> dict[str, Tensor]:
    """``{layer: sigmoid(lambda_h) (n_gpsa,)}`` of every attention layer with GPSA heads (ConViT eq. 7), T-CNN's
    9-head GPSA in bottlenecks included.

    The weight of positional attention per GPSA head; empty for models without GPSA.
    """
    out: dict[str, Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, SELF_ATTENTION_LAYERS):
            gate = module.gating()
            if gate is not None:
                out[name] = gate.detach()
        elif isinstance(module, ConvGPSA):
            out[name] = torch.sigmoid(module.gating).detach()
    return out


def layer_gauss(model: nn.Module) -> dict[str, Tensor]:
    """``{layer: (n_gauss, 2)}`` of every attention layer with ``gauss_mask`` heads: per Gaussian head (head order)
    its amplitude ``alpha`` (logit units) and width ``sigma`` (patches; the bias is ``alpha exp(-d^2 / (2 (sigma^2 +
    1e-5)))``, GMM-Mask, arXiv 2309.05375, :mod:`archspec.families.attention.kinds.gauss_mask`).  ``|sigma|`` is what
    acts (the bias reads ``sigma^2``).  Empty for models without Gaussian heads.  Raises nothing.
    """
    out: dict[str, Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, Attention) and module.gauss_heads:
            out[name] = torch.stack([module.gauss_alpha, module.gauss_sigma.abs()], dim=1).detach()
    return out
