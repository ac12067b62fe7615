"""CMHSA's exact convolution-to-attention transfer (Li et al., "Can Vision Transformers Perform
Convolution?", Theorem 1, Lemma 2, App. A.1-A.2).

A phase-1 model (``mixer: conv<K>``: a K x K conv over the ``P x P x c`` pixel view of each token) becomes a
phase-2 model whose mixers are multi-head self-attention with signed relative biases; every other weight
(norms, FFNs, classifier) is copied.  Per transferred layer, App. A.2's construction:

* ``W_Q = W_K = 0`` (and their biases): the logits are the relative bias alone;
* head ``r`` owns patch offset ``delta_r`` of ``{-R..R}^2``, ``R = ceil((K - 1) / (2P))`` (eq. 13), row-major;
  its bias is ``peak`` (the paper's M, Lemma 2) at that offset and 0 elsewhere, so it attends to the one
  neighbour patch ``q + delta_r`` up to ``(N - 1) exp(-peak)``;
* ``W_V^r = (I_d, 0)`` with zero bias;
* ``W_O`` gathers, for output pixel ``t`` of the query patch and input pixel ``s`` of neighbour ``r``, the
  kernel tap ``W^C[x(r,s,t), y(r,s,t)]`` (zero outside the receptive field); ``b_O`` = the conv bias per pixel.

Borders: the phase-2 spec surrounds the token grid with ``R`` rings of zero tokens (``mixer.pad_tokens``,
:class:`archspec.nn.blocks.ZeroPadTokens`); with ``W_V = I`` and zero value bias they carry zeros, the conv's
zero padding, so border patches are exact too.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from archspec.errors import TransferError
from archspec.nn.blocks import Attention, ConvMixer, ZeroPadTokens
from archspec.nn.compiler import compile as compile_spec
from archspec.spec import ArchSpec, MixerSpec

__all__ = ["DEFAULT_PEAK", "TransferError", "attention_spec", "conv_to_mhsa", "conv_to_attention_weights",
           "patch_offsets"]

DEFAULT_PEAK = 40.0
"""Lemma 2's M (the paper's example value): off-peak weights are ``exp(-40) = 4e-18`` of the peak."""


def patch_offsets(kernel: int, patch: int) -> list[tuple[int, int]]:
    """Patch offsets ``delta = (d_row, d_col)`` of a K x K conv's receptive field on P x P patches (eq. 13),
    row-major; ``len = (2 ceil((K - 1) / (2P)) + 1)^2`` = Theorem 1's head count (9 when ``K < 2P``)."""
    reach = math.ceil((kernel - 1) / (2 * patch))
    return [(dr, dc) for dr in range(-reach, reach + 1) for dc in range(-reach, reach + 1)]


def _gather(weight: Tensor, offset: tuple[int, int], patch: int) -> Tensor:
    """App. A.2's block of ``W_O`` for one head: ``(c P^2, c P^2)`` mapping the pixels ``(i, s)`` of neighbour
    patch ``q + offset`` to the pixels ``(o, t)`` of patch ``q`` (channel-major tokens, as IdentityStem)."""
    c_out, c_in, k, _ = weight.shape
    t = torch.arange(patch)
    tap_r = offset[0] * patch + t[None, :] - t[:, None] + k // 2  # (t_row, s_row): kernel row of the pair
    tap_c = offset[1] * patch + t[None, :] - t[:, None] + k // 2
    inside = ((tap_r >= 0) & (tap_r < k))[:, None, :, None] & ((tap_c >= 0) & (tap_c < k))[None, :, None, :]
    taps = weight[:, :, tap_r.clamp(0, k - 1)[:, None, :, None], tap_c.clamp(0, k - 1)[None, :, None, :]]
    taps = taps * inside  # (o, i, t_row, t_col, s_row, s_col)
    return taps.permute(0, 2, 3, 1, 4, 5).reshape(c_out * patch * patch, c_in * patch * patch)


def conv_to_attention_weights(conv: ConvMixer, attn: Attention, peak: float = DEFAULT_PEAK) -> dict[str, Tensor]:
    """App. A.2's attention weights reproducing ``conv`` (a pixel-view :class:`ConvMixer`), as a state dict of
    ``attn`` (an :class:`Attention` on the grid padded by ``R`` rings, every head ``signed_bias``).

    Shapes: ``qk`` zero; ``v.weight`` ``(H d_H, d)`` = ``(I_d, 0)`` per head; ``proj.weight`` ``(d, H d_H)``;
    ``signed_biases`` ``(H, (2R'-1)(2C'-1))`` on the padded ``R' x C'`` grid.  Heads past Theorem 1's count
    get zero output columns.

    Raises:
        TransferError: too few heads, ``d_H < d``, heads without a signed bias, LeViT-style attention.
    """
    offsets = patch_offsets(conv.kernel, conv.patch)
    d = conv.dim
    if attn.norm != "layernorm" or attn.dim != d:
        raise TransferError(f"the target attention must be a layernorm-family layer of width {d}")
    if attn.signed_bias_heads != list(range(attn.num_heads)) or attn.gpsa_heads or attn.mask_heads:
        raise TransferError("every head of a transferred layer needs a signed relative bias and nothing else "
                            "(attention: signed_bias; Lemma 2)")
    if attn.num_heads < len(offsets):
        raise TransferError(f"a {conv.kernel}x{conv.kernel} conv on {conv.patch}x{conv.patch} patches needs "
                            f"{len(offsets)} heads (Theorem 1), the layer has {attn.num_heads}")
    if attn.v_dim < d:
        raise TransferError(f"Theorem 1 needs head dim d_H >= d = {d}, got {attn.v_dim}")
    dv = attn.v_dim
    rows, cols = attn.grid
    state = {name: torch.zeros_like(value) for name, value in attn.state_dict().items()}
    eye = torch.eye(d, dtype=state["v.weight"].dtype)
    weight = conv.conv.weight.detach().to(eye.dtype)
    for head, offset in enumerate(offsets):
        state["v.weight"][head * dv:head * dv + d] = eye
        state["proj.weight"][:, head * dv:head * dv + d] = _gather(weight, offset, conv.patch)
        # key = query + offset; the table is indexed by query minus key (position.signed_bias_idxs)
        index = (-offset[0] + rows - 1) * (2 * cols - 1) + (-offset[1] + cols - 1)
        state["signed_biases"][head, index] = peak
    state["proj.bias"] = conv.conv.bias.detach().to(eye.dtype).repeat_interleave(conv.patch ** 2)
    return state


def _attention_mixer(conv: MixerSpec, spec: ArchSpec) -> dict[str, Any]:
    reach = math.ceil((conv.kernel - 1) / (2 * spec.pixel_patch(conv)))
    return {"kind": "attention", "pad_tokens": reach}


def attention_spec(conv_spec: ArchSpec, name: str | None = None) -> ArchSpec:
    """The phase-2 spec of a phase-1 spec: every conv mixer becomes ``signed_bias`` attention over the grid
    padded by ``R = ceil((K - 1) / (2P))`` rings of zero tokens; all else unchanged.  Heads and head dims are
    the stage's (the shipped cmhsa_k*_conv specs carry phase 2's 9 heads of d_H = 768).

    Raises:
        TransferError: when the spec has no conv mixer, or a conv layer override also names heads.
    """
    doc = conv_spec.model_dump(mode="json")
    found = False
    for index, stage in enumerate(conv_spec.stages):
        body = doc["stages"][index]
        if stage.mixer.kind == "conv":
            found = True
            body["mixer"] = _attention_mixer(stage.mixer, conv_spec)
            body["attention"] = "signed_bias"
        for j, override in enumerate(stage.layers):
            if override.mixer is not None and override.mixer.kind == "conv":
                found = True
                body["layers"][j]["mixer"] = _attention_mixer(override.mixer, conv_spec)
                body["layers"][j]["attention"] = "signed_bias"
                body["layers"][j]["heads"] = None
    if not found:
        raise TransferError(f"spec {conv_spec.name!r} has no conv mixer to transfer (mixer: conv3 / conv5)")
    doc["name"] = name or (conv_spec.name[:-5] if conv_spec.name.endswith("_conv") else conv_spec.name + "_mhsa")
    return ArchSpec.model_validate(doc)


def _mixer_pairs(conv_model: nn.Module, attn_model: nn.Module):
    """(block name, ConvMixer, Attention) for every conv mixer of ``conv_model``."""
    attn_modules = dict(attn_model.named_modules())
    for name, module in conv_model.named_modules():
        if isinstance(module, ConvMixer):
            target = attn_modules.get(name)
            if isinstance(target, ZeroPadTokens):
                target = target.attn
            if not isinstance(target, Attention):
                raise TransferError(f"{name}: the target model has no attention layer where the conv mixer is")
            yield name, module, target


def conv_to_mhsa(conv_model: nn.Module, peak: float = DEFAULT_PEAK, spec: ArchSpec | None = None) -> nn.Module:
    """Transfer a (trained) phase-1 CMHSA model into its phase-2 attention model (App. A.2, every layer).

    Args:
        conv_model: an :class:`archspec.nn.model.ArchModel` with pixel-view conv mixers (``mixer: conv<K>``).
        peak: Lemma 2's M, the relative-bias value at each head's offset; the transferred logits differ
            from the conv model's by about ``N exp(-peak)`` relative (``N`` tokens).
        spec: the phase-2 spec; default :func:`attention_spec` of the model's spec.

    Returns:
        the phase-2 :class:`ArchModel`, in ``conv_model``'s train/eval mode, on its device and dtype:
        ``(B, C, H, W) -> (B, num_classes)`` equal to ``conv_model`` up to the finite peak.

    Raises:
        TransferError: when the two specs differ in anything but the transferred mixers, or a layer cannot
            express its conv (too few heads, ``d_H < d``, heads without signed bias).
    """

    target = spec if spec is not None else attention_spec(conv_model.spec)
    attn_model = compile_spec(target)
    ref = next(conv_model.parameters())
    attn_model.to(device=ref.device, dtype=ref.dtype)
    state = attn_model.state_dict()
    mixer_keys = set()
    for _name, conv, attn in _mixer_pairs(conv_model, attn_model):
        prefix = next(n for n, m in attn_model.named_modules() if m is attn) + "."
        layer_state = conv_to_attention_weights(conv, attn, peak)
        mixer_keys.update(prefix + key for key in layer_state)
        state.update({prefix + key: value.to(ref.device, ref.dtype) for key, value in layer_state.items()})
    conv_prefixes = tuple(n + "." for n, m in conv_model.named_modules() if isinstance(m, ConvMixer))
    copied = {k: v for k, v in conv_model.state_dict().items() if not k.startswith(conv_prefixes)}
    left_out = set(state) - mixer_keys - set(copied)
    wrong = [k for k in copied if k not in state or state[k].shape != copied[k].shape]
    if left_out or wrong:
        raise TransferError("the phase-2 spec differs from the phase-1 model beyond its mixers: "
                            f"{sorted(left_out | set(wrong))[:5]}")
    state.update(copied)
    attn_model.load_state_dict(state)
    return attn_model.train(conv_model.training)

