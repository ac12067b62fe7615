"""State-dict conversion between timm models and their compiled archspec equivalents.

Supported timm families (the blocks archspec mirrors):

* ``VisionTransformer`` / ``VisionTransformerDistilled`` (DeiT): ``specs/deit_tiny.yaml``
* ``ConVit`` (GPSA + MHSA blocks): ``specs/convit_tiny.yaml``, ``convit_small.yaml``
* ``Levit`` / ``LevitDistilled``: ``specs/levit_128s.yaml``, ``levit_256.yaml``
* ``Cait`` (talking heads, LayerScale, class attention): ``specs/cait_xxs24.yaml``
* ``ResNet`` (conv nets: a ResNet stem and conv stages): ``specs/resnet18.yaml``, ``resnet50.yaml``,
  ``resnet50d.yaml``, ``resnetrs50.yaml``; the blocks are timm's own, so only the prefixes differ:
  ``conv1`` / ``bn1`` / ``maxpool`` <-> ``stem.conv1`` / ``stem.bn1`` / ``stem.maxpool``, ``layer{i}.{j}`` <->
  ``stages.{i-1}.blocks.{j}``, ``fc`` <-> ``head``

Names differ in these places only; everything else (LayerNorms, MLPs, GPSA ``qk``/``v``/``pos_proj``/
``gating_param``, LeViT ``LinearNorm`` / ``attention_biases`` / downsampling) is identical:

====================================  ==========================================
timm                                  archspec
====================================  ==========================================
``patch_embed.*``                     ``stem.*``
``blocks.{i}.*`` (ViT, ConViT)         ``stages.{s}.blocks.{j}.*`` (global i -> stage s, layer j)
``...attn.qkv.{weight,bias}`` (MHSA)  ``...attn.qk`` (rows [q; k]) and ``...attn.v`` (rows v)
``stages.{s}.blocks.{j}.attn.proj.1`` ``stages.{s}.blocks.{j}.attn.proj.ln`` (LeViT)
``blocks.{i}.gamma_{1,2}`` (CaiT)     ``stages.0.blocks.{i}.ls{1,2}.gamma``
``blocks_token_only.{j}.*`` (CaiT)    ``stages.{S}.blocks.{j}.*`` (S: the class-attention stage, last)
====================================  ==========================================

CaiT's talking-heads ``attn.qkv`` is kept whole (archspec's ``TalkingHeadAttn`` has the same ``qkv``).

Pretrained timm weights convert with the same code (``timm.create_model(name, pretrained=True)``
where the hub can be reached); the tests use random initialisations.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor, nn

from archspec.model import ArchModel

# archspec spec name -> timm model name with the same architecture
TIMM_EQUIVALENTS = {
    "deit_tiny": "deit_tiny_patch16_224",
    "convit_tiny": "convit_tiny",
    "convit_small": "convit_small",
    "levit_128s": "levit_128s",
    "levit_256": "levit_256",
    "cait_xxs24": "cait_xxs24_224",
    "resnet18": "resnet18",
    "resnet50": "resnet50",
    "resnet50d": "resnet50d",
    "resnetrs50": "resnetrs50",
}

_QKV = re.compile(r"^(?P<prefix>.*\.attn)\.qkv\.(?P<kind>weight|bias)$")
_VIT_BLOCK = re.compile(r"^blocks\.(\d+)\.")
_OUR_BLOCK = re.compile(r"^stages\.(\d+)\.blocks\.(\d+)\.")
_LEVIT_PROJ = (".attn.proj.1.", ".attn.proj.ln.")
_CAIT_TOKEN_BLOCK = re.compile(r"^blocks_token_only\.(\d+)\.")
_CAIT_GAMMA = re.compile(r"^(?P<block>stages\.\d+\.blocks\.\d+)\.gamma_(?P<n>[12])$")


def _cait_from_timm(key: str, model: ArchModel, ours: set[str]) -> str:
    """CaiT names: ``blocks_token_only.{j}`` -> the class-attention stage (the model's last); a
    self-attention block's ``gamma_{1,2}`` -> ``ls{1,2}.gamma`` (archspec's blocks use timm ``LayerScale``)."""
    match = _CAIT_TOKEN_BLOCK.match(key)
    if match:
        return f"stages.{len(model.stages) - 1}.blocks.{match.group(1)}." + key[match.end():]
    gamma = _CAIT_GAMMA.match(key)
    if gamma and key not in ours:
        return f"{gamma['block']}.ls{gamma['n']}.gamma"
    return key


_RESNET_STEM = re.compile(r"^(conv1|bn1|maxpool)\.")
_RESNET_LAYER = re.compile(r"^layer(\d+)\.(\d+)\.")
_OUR_CONV_STEM = re.compile(r"^stem\.(conv1|bn1|maxpool)\.")


def resnet_key_from_timm(key: str) -> str:
    """A timm ResNet state-dict key -> archspec's (:class:`~archspec.convnet.ConvNet`): ``conv1.weight`` ->
    ``stem.conv1.weight``, ``layer2.0.downsample.1.weight`` -> ``stages.1.blocks.0.downsample.1.weight``,
    ``fc.bias`` -> ``head.bias``; other keys unchanged."""
    if _RESNET_STEM.match(key):
        return "stem." + key
    match = _RESNET_LAYER.match(key)
    if match:
        return f"stages.{int(match.group(1)) - 1}.blocks.{match.group(2)}." + key[match.end():]
    return re.sub(r"^fc\.", "head.", key)


def resnet_key_to_timm(key: str) -> str:
    """The inverse of :func:`resnet_key_from_timm`."""
    if _OUR_CONV_STEM.match(key):
        return key[len("stem."):]
    match = _OUR_BLOCK.match(key)
    if match:
        return f"layer{int(match.group(1)) + 1}.{match.group(2)}." + key[match.end():]
    return re.sub(r"^head\.", "fc.", key)


def _is_convnet(model: nn.Module) -> bool:
    return getattr(getattr(model, "spec", None), "is_convnet", False)


def _stage_of(model: ArchModel) -> list[tuple[int, int]]:
    """Global block index -> (stage, layer)."""
    return [(s, j) for s, stage in enumerate(model.stages) for j in range(len(stage.blocks))]


def from_timm(state_dict: dict[str, Tensor], model: ArchModel) -> dict[str, Tensor]:
    """Convert a timm state dict into one that ``model.load_state_dict(..., strict=True)`` accepts.

    Args:
        state_dict: a timm ViT/DeiT, ConViT, LeViT, CaiT or ResNet state dict.
        model: the compiled archspec equivalent (same spec; see :data:`TIMM_EQUIVALENTS`).

    Raises:
        ValueError: a timm block index beyond the archspec model's depth.
    """
    if _is_convnet(model):
        return {resnet_key_from_timm(key): value for key, value in state_dict.items()}
    stage_of = _stage_of(model)
    ours = set(model.state_dict())
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        key = re.sub(r"^patch_embed\.", "stem.", key)
        match = _VIT_BLOCK.match(key)
        if match:
            index = int(match.group(1))
            if index >= len(stage_of):
                raise ValueError(f"timm block {index} has no counterpart: "
                                 f"the archspec model has {len(stage_of)} blocks")
            stage, layer = stage_of[index]
            key = f"stages.{stage}.blocks.{layer}." + key[match.end():]
        key = _cait_from_timm(key, model, ours)
        key = key.replace(*_LEVIT_PROJ) if _OUR_BLOCK.match(key) else key
        qkv = _QKV.match(key)
        if qkv and key not in ours:  # timm MHSA: rows [q; k; v] -> archspec qk = [q; k], v (CaiT keeps qkv)
            qk_rows = 2 * value.shape[0] // 3
            out[f"{qkv['prefix']}.qk.{qkv['kind']}"] = value[:qk_rows].clone()
            out[f"{qkv['prefix']}.v.{qkv['kind']}"] = value[qk_rows:].clone()
            continue
        out[key] = value
    return out


def to_timm(model: ArchModel, timm_model: nn.Module) -> dict[str, Tensor]:
    """Convert ``model``'s weights into a state dict for ``timm_model`` (the reverse of :func:`from_timm`).

    MHSA ``qk`` and ``v`` are concatenated back into ``qkv`` when ``timm_model`` has a ``qkv`` Linear
    there (ViT, ConViT MHSA); ConViT GPSA keeps ``qk`` / ``v``.

    Raises:
        KeyError: a tensor of ``timm_model`` has no archspec counterpart.
    """
    ours = model.state_dict()
    if _is_convnet(model):
        out = {}
        for key in timm_model.state_dict():
            src = resnet_key_from_timm(key)
            if src not in ours:
                raise KeyError(f"timm tensor {key!r} has no archspec counterpart (looked for {src!r})")
            out[key] = ours[src]
        return out
    our_keys = set(ours)
    flat_blocks = any(k.startswith("blocks.") for k in timm_model.state_dict())
    out: dict[str, Tensor] = {}
    for key in timm_model.state_dict():
        src = re.sub(r"^patch_embed\.", "stem.", key)
        if flat_blocks:
            match = _VIT_BLOCK.match(src)
            if match:
                stage, layer = _stage_of(model)[int(match.group(1))]
                src = f"stages.{stage}.blocks.{layer}." + src[match.end():]
        elif _OUR_BLOCK.match(src):
            src = src.replace(_LEVIT_PROJ[0], _LEVIT_PROJ[1])
        src = _cait_from_timm(src, model, our_keys)
        qkv = _QKV.match(src)
        if qkv and f"{qkv['prefix']}.qk.{qkv['kind']}" in ours:
            out[key] = torch.cat([ours[f"{qkv['prefix']}.qk.{qkv['kind']}"], ours[f"{qkv['prefix']}.v.{qkv['kind']}"]])
            continue
        if src not in ours:
            raise KeyError(f"timm tensor {key!r} has no archspec counterpart (looked for {src!r})")
        out[key] = ours[src]
    return out


def load_timm_weights(model: ArchModel, timm_model_or_state: nn.Module | dict[str, Tensor]) -> ArchModel:
    """Load a timm model's (or state dict's) weights into ``model`` in place, strictly; returns ``model``.

    Raises:
        RuntimeError: missing or unexpected keys, or shape mismatches (the architectures differ).
    """
    state = timm_model_or_state.state_dict() if isinstance(timm_model_or_state, nn.Module) else timm_model_or_state
    model.load_state_dict(from_timm(state, model), strict=True)
    return model
