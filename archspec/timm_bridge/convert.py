"""State-dict conversion between timm models and their compiled archspec equivalents.

Supported timm families (the blocks archspec mirrors):

* ``VisionTransformer`` / ``VisionTransformerDistilled`` (DeiT): ``specs/deit_tiny.yaml``
* ``ConVit`` (GPSA + MHSA blocks): ``specs/convit_tiny.yaml``, ``convit_small.yaml``
* ``Levit`` / ``LevitDistilled``: ``specs/levit_128s.yaml``, ``levit_256.yaml``
* ``Cait`` (talking heads, LayerScale, class attention): ``specs/cait_xxs24.yaml``
* ``ResNet`` (conv nets: a ResNet stem and conv stages): ``specs/resnet18.yaml``, ``resnet50.yaml``,
  ``resnet50d.yaml``, ``resnetrs50.yaml``; the blocks are timm's own, so only the prefixes differ:
  ``conv1`` / ``bn1`` / ``maxpool`` <-> ``stem.conv1`` / ``stem.bn1`` / ``stem.maxpool``, ``layer{i}.{j}`` <->
  ``stages.{i-1}.blocks.{j}``, ``fc`` <-> ``head``.  :func:`resnet_spec_from_timm` writes the spec of a timm
  ResNet.
* ``ByobNet`` BoTNets (``specs/botnet26t.yaml``, timm ``botnet26t_256``): conv stages whose attention mixer is
  timm's ``BottleneckAttn``; :func:`byobnet_key_from_timm` renames the ConvNormAct pairs to ResNet's names.
* ``SwinTransformer`` (``specs/swin_tiny_patch4_window7_224.yaml``, ``swin_base_patch4_window12_384.yaml``): the
  window head kind keeps timm's ``attn.relative_position_bias_table`` under its name, and ``attn.qkv`` splits into
  ``qk`` and ``v`` as ViT's; the structure's names:
  ``patch_embed.proj`` / ``patch_embed.norm`` <-> ``stem.proj`` / ``stem.norm`` (a patch stem with ``norm:
  layernorm``), ``layers.{i}.downsample.{norm,reduction}`` <-> ``stages.{i}.downsample.{norm,reduction}`` (patch
  merging entering stage ``i``), ``layers.{i}.blocks.{j}`` <-> ``stages.{i}.blocks.{j}``, ``norm`` <-> ``norm``
  (``head.norm: before_pool``), ``head.fc`` <-> ``head`` (:func:`swin_key_from_timm`).
* ``MaxxVit``'s conv side (CoAtNet, MaxViT: a ``stem: {kind: maxxvit}`` and ``block: mbconv`` conv stages): the
  stem and blocks are timm's own ``maxxvit.Stem`` and ``MbConvBlock``, under timm's names: ``stem.*`` and a ``C``
  block's ``stages.{i}.blocks.{j}.*`` are unchanged; an ``M`` block's (MaxViT) MBConv ``stages.{i}.blocks.{j}.conv.*``
  <-> ``stages.{i}.blocks.{j}.*`` (:func:`maxxvit_key_from_timm`).  CoAtNet's ``T`` blocks (timm
  ``TransformerBlock2d``; ``specs/coatnet_nano_rw_224.yaml``, ``coatnet_0_rw_224.yaml``) are archspec's pre-norm
  blocks: ``norm1.norm`` <-> ``norm1``, ``attn.rel_pos.relative_position_bias_table`` <->
  ``attn.relative_position_bias_table``, timm's 1x1 convs (``shortcut.expand``, ``attn.proj``, ``mlp.fc1/fc2``) <->
  Linears, the fused head-major ``attn.qkv`` <-> ``qk`` and ``v``; ``head.fc`` <-> ``head``
  (:func:`maxxvit_from_timm`, :func:`maxxvit_to_timm`).  MaxViT's ``M`` blocks' attention is not mapped yet.
* ``ByobNet`` MobileViTs (``specs/mobilevit_xxs.yaml``, timm ``mobilevit_xxs``): the stem and blocks are timm's
  own (``ConvNormAct``, ``BottleneckBlock``, ``MobileVitBlock``), so only the prefixes differ: ``stages.{i}.{j}`` <->
  ``stages.{i}.blocks.{j}``, ``final_conv`` <-> the last stage's ``stages.{n-1}.blocks.0`` (a ``conv_bn_act``
  stage), ``head.fc`` <-> ``head`` (:func:`mobilevit_key_from_timm`).
* T-CNNs (``specs/t_resnet50d.yaml``, ``t_resnet50rs.yaml``: conv stages with ``mixer: {kind: gpsa}``) load a
  timm ResNet's weights one way (:func:`from_timm`): a transformed block's ``conv2.weight`` becomes its GPSA's
  ``W_out`` (T-CNN eq. 6), and the GPSA's own tensors (W_qry, W_key, W_val = I, centres, locality, gating),
  which the CNN does not have, keep the T-CNN's initialisation.

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
``layers.{i}.*`` (Swin)               ``stages.{i}.*``
``head.fc.*`` (Swin)                  ``head.*``
====================================  ==========================================

CaiT's talking-heads ``attn.qkv`` is kept whole (archspec's ``TalkingHeadAttn`` has the same ``qkv``).

Pretrained timm weights convert with the same code (``timm.create_model(name, pretrained=True)``
where the hub can be reached); the tests use random initialisations.
"""

from __future__ import annotations

import re
from functools import partial

import torch
from timm.layers.squeeze_excite import SEModule
from timm.models.resnet import BasicBlock, Bottleneck, ResNet
from torch import Tensor, nn

from archspec.families.conv_block.module import conv_to_out_weight
from archspec.families.conv_block.rules import EXPANSION, se_channels
from archspec.nn.model import ArchModel

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
    "resnext50_32x4d": "resnext50_32x4d",
    "resnet26t": "resnet26t",
    "seresnext26d_32x4d": "seresnext26d_32x4d",
    "swin_tiny_patch4_window7_224": "swin_tiny_patch4_window7_224",
    "swin_base_patch4_window12_384": "swin_base_patch4_window12_384",
    "coatnet_nano_rw_224": "coatnet_nano_rw_224",
    "coatnet_0_rw_224": "coatnet_0_rw_224",
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


_SWIN_LAYER = re.compile(r"^layers\.(\d+)\.")
_SWIN_HEAD = re.compile(r"^head\.fc\.")


def swin_key_from_timm(key: str) -> str:
    """A timm ``SwinTransformer`` key's stage and head prefixes -> archspec's: ``layers.1.downsample.reduction.weight``
    -> ``stages.1.downsample.reduction.weight`` (timm 1.0's patch merging opens stage 1, as archspec's downsample
    does), ``layers.0.blocks.1.mlp.fc1.bias`` -> ``stages.0.blocks.1.mlp.fc1.bias``, ``head.fc.weight`` ->
    ``head.weight`` (timm's ``ClassifierHead``); other keys unchanged (``patch_embed.*`` is renamed with ViT's)."""
    key = _SWIN_LAYER.sub(r"stages.\1.", key)
    return _SWIN_HEAD.sub("head.", key)


_RESNET_STEM = re.compile(r"^(conv1|bn1|maxpool)\.")
_RESNET_LAYER = re.compile(r"^layer(\d+)\.(\d+)\.")
_OUR_CONV_STEM = re.compile(r"^stem\.(conv1|bn1|maxpool)\.")


def resnet_key_from_timm(key: str) -> str:
    """A timm ResNet state-dict key -> a compiled conv net's (:class:`~archspec.nn.model.ArchModel`):
    ``conv1.weight`` -> ``stem.conv1.weight``, ``layer2.0.downsample.1.weight`` ->
    ``stages.1.blocks.0.downsample.1.weight``, ``fc.bias`` -> ``head.bias``; other keys unchanged."""
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


# timm ByobNet (byobnet.py / byoanet.py: botnet26t_256, resnet26t-like 'bottle' stages) -> archspec's ResNet names.
# Its ConvNormAct pairs (``.conv`` + ``.bn``) are timm ResNet's ``convN`` + ``bnN``; a SelfAttnBlock's ``self_attn``
# sits where archspec's attention mixer does (``conv2``) and its ``post_attn`` BatchNorm is ``bn2``.
_BYOB_STEM = {"stem.conv1.conv.": "stem.conv1.0.", "stem.conv1.bn.": "stem.conv1.1.",
              "stem.conv2.conv.": "stem.conv1.3.", "stem.conv2.bn.": "stem.conv1.4.",
              "stem.conv3.conv.": "stem.conv1.6.", "stem.conv3.bn.": "stem.bn1.", "head.fc.": "head."}
_BYOB_BLOCK = {"conv1_1x1.conv.": "conv1.", "conv1_1x1.bn.": "bn1.", "conv2_kxk.conv.": "conv2.",
               "conv2_kxk.bn.": "bn2.", "self_attn.": "conv2.", "post_attn.": "bn2.", "conv3_1x1.conv.": "conv3.",
               "conv3_1x1.bn.": "bn3.", "shortcut.conv.conv.": "downsample.1.", "shortcut.conv.bn.": "downsample.2.",
               "shortcut.conv.": "downsample.0.", "shortcut.bn.": "downsample.1."}
_BYOB_LAYER = re.compile(r"^stages\.(\d+)\.(\d+)\.")


def byobnet_key_from_timm(key: str) -> str:
    """A timm ByobNet key (BoTNet's ``botnet26t_256``) -> archspec's: ``stem.conv3.bn.weight`` -> ``stem.bn1.weight``,
    ``stages.3.0.self_attn.qkv.weight`` -> ``stages.3.blocks.0.conv2.qkv.weight``, ``stages.2.0.shortcut.conv.weight``
    -> ``stages.2.blocks.0.downsample.0.weight``, ``head.fc.bias`` -> ``head.bias``; other keys unchanged."""
    for theirs, ours in _BYOB_STEM.items():
        if key.startswith(theirs):
            return ours + key[len(theirs):]
    match = _BYOB_LAYER.match(key)
    if not match:
        return key
    rest = key[match.end():]
    for theirs, ours in _BYOB_BLOCK.items():
        if rest.startswith(theirs):
            rest = ours + rest[len(theirs):]
            break
    return f"stages.{match.group(1)}.blocks.{match.group(2)}." + rest


_MAXXVIT_MBCONV = re.compile(r"^(stages\.\d+\.blocks\.\d+\.)conv\.")
_MAXXVIT_PRE_NORM = re.compile(r"^stages\.\d+\.blocks\.\d+\.(conv\.)?pre_norm\.")


_MAXXVIT_T_BLOCK = re.compile(r"^(?P<block>stages\.\d+\.blocks\.\d+\.)(?P<rest>.*)$")
#: a MaxxVit transformer block's names -> archspec's pre-norm block's (timm's 1x1 convs are archspec's Linears)
_MAXXVIT_RENAMES = (("norm1.norm.", "norm1."), ("attn.rel_pos.relative_position_bias_table",
                                                  "attn.relative_position_bias_table"),
                    ("attn.rel_pos.mlp.", "attn.rel_pos_mlp."))


def _qkv_rows(value: Tensor, heads: int, head_first: bool) -> Tensor:
    """timm's fused ``qkv`` rows (``(3 A, ...)``, ``A = heads d``) in archspec's order ``[q; k; v]``, each head-major:
    timm's ``head_first`` layout is ``(heads, 3, d)`` (``Attention2d`` / ``AttentionCl`` with ``head_first=True``),
    the ``_tf`` ports' ``(3, heads, d)`` is archspec's already."""
    if not head_first:
        return value
    rest = value.shape[1:]
    d = value.shape[0] // (3 * heads)
    return value.reshape(heads, 3, d, *rest).transpose(0, 1).reshape(value.shape)


def _qkv_rows_back(value: Tensor, heads: int, head_first: bool) -> Tensor:
    """The inverse of :func:`_qkv_rows`."""
    if not head_first:
        return value
    rest = value.shape[1:]
    d = value.shape[0] // (3 * heads)
    return value.reshape(3, heads, d, *rest).transpose(0, 1).reshape(value.shape)


def maxxvit_key_from_timm(key: str) -> str:
    """A timm ``MaxxVit`` key (CoAtNet, MaxViT) -> archspec's name for it: the stem's and a ``C`` block's (timm's own
    modules) unchanged, a MaxViT ``M`` block's MBConv ``stages.0.blocks.1.conv.conv2_kxk.weight`` ->
    ``stages.0.blocks.1.conv2_kxk.weight``; a ``T`` block's (timm ``TransformerBlock2d``) as archspec's pre-norm block
    names it -- ``norm1.norm.*`` (the downsampling block's norm) -> ``norm1.*``,
    ``attn.rel_pos.relative_position_bias_table`` -> ``attn.relative_position_bias_table``, ``attn.rel_pos.mlp.*`` ->
    ``attn.rel_pos_mlp.*``; ``norm.*`` (the final LayerNorm2d) unchanged, ``head.fc.*`` -> ``head.*``.
    (``attn.qkv`` splits into ``qk`` and ``v``: not a rename, :func:`maxxvit_from_timm`.)"""
    if key.startswith("head.fc."):
        return "head." + key[len("head.fc."):]
    if _MAXXVIT_MBCONV.match(key):
        return _MAXXVIT_MBCONV.sub(r"\1", key)
    match = _MAXXVIT_T_BLOCK.match(key)
    if not match:
        return key
    rest = match["rest"]
    for theirs, ours in _MAXXVIT_RENAMES:
        if rest.startswith(theirs):
            rest = ours + rest[len(theirs):]
            break
    return match["block"] + rest


def _attention_heads(model: nn.Module, prefix: str) -> int:
    """Heads of the attention layer at ``prefix`` (``stages.2.blocks.0.attn``) of ``model``."""
    return model.get_submodule(prefix).num_heads


def maxxvit_from_timm(state_dict: dict[str, Tensor], model: ArchModel, head_first: bool = True
                      ) -> dict[str, Tensor]:
    """A timm ``MaxxVit`` state dict (CoAtNet: ``C`` and ``T`` blocks) -> ``model``'s: names by
    :func:`maxxvit_key_from_timm`; a ``T`` block's 1x1 convs (``shortcut.expand``, ``attn.proj``, ``mlp.fc1``,
    ``mlp.fc2``) as Linear weights; its ``attn.qkv`` split into ``attn.qk`` (rows ``[q; k]``) and ``attn.v``, from
    timm's ``head_first`` layout (``MaxxVitTransformerCfg.head_first``: True but in the ``_tf`` ports)."""
    ours_like = model.state_dict()
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        ours = maxxvit_key_from_timm(key)
        qkv = _QKV.match(ours)
        if qkv and _MAXXVIT_T_BLOCK.match(ours):
            rows = _qkv_rows(value.reshape(value.shape[0], -1) if value.dim() > 1 else value,
                             _attention_heads(model, qkv["prefix"]), head_first)
            split = 2 * rows.shape[0] // 3
            out[f"{qkv['prefix']}.qk.{qkv['kind']}"] = rows[:split].clone()
            out[f"{qkv['prefix']}.v.{qkv['kind']}"] = rows[split:].clone()
            continue
        like = ours_like.get(ours)
        if like is not None and like.dim() == 2 and value.dim() == 4:  # a 1x1 conv of timm's is our Linear
            value = value.reshape(like.shape)
        out[ours] = value
    return out


def maxxvit_to_timm(model: ArchModel, timm_model: nn.Module) -> dict[str, Tensor]:
    """``model``'s weights as ``timm_model``'s (a timm ``MaxxVit``) state dict: the inverse of
    :func:`maxxvit_from_timm`, the qkv layout read from ``timm_model``'s attention layers (``head_first``).

    Raises:
        KeyError: a tensor of ``timm_model`` has no archspec counterpart.
    """
    ours = model.state_dict()
    out: dict[str, Tensor] = {}
    for key, like in timm_model.state_dict().items():
        src = maxxvit_key_from_timm(key)
        qkv = _QKV.match(src)
        if qkv and _MAXXVIT_T_BLOCK.match(src):
            rows = torch.cat([ours[f"{qkv['prefix']}.qk.{qkv['kind']}"], ours[f"{qkv['prefix']}.v.{qkv['kind']}"]])
            head_first = getattr(timm_model.get_submodule(key.rsplit(".qkv.", 1)[0]), "head_first", True)
            out[key] = _qkv_rows_back(rows, _attention_heads(model, qkv["prefix"]), head_first).reshape(like.shape)
            continue
        if src not in ours:
            raise KeyError(f"timm tensor {key!r} has no archspec counterpart (looked for {src!r})")
        out[key] = ours[src].reshape(like.shape)
    return out


_MOBILEVIT_FINAL = re.compile(r"^final_conv\.")


def mobilevit_key_from_timm(key: str, n_stages: int) -> str:
    """A timm MobileViT key (``ByobNet`` of ``mobilevit.py``) -> archspec's, for a model of ``n_stages`` stages whose
    last is ByobNet's ``final_conv`` (a ``conv_bn_act`` stage): ``stages.2.1.transformer.0.attn.qkv.weight`` ->
    ``stages.2.blocks.1.transformer.0.attn.qkv.weight``, ``final_conv.bn.weight`` ->
    ``stages.5.blocks.0.bn.weight``, ``head.fc.bias`` -> ``head.bias``; the stem's keys unchanged (timm's own
    ``ConvNormAct``)."""
    key = _BYOB_LAYER.sub(r"stages.\1.blocks.\2.", key)
    key = _MOBILEVIT_FINAL.sub(f"stages.{n_stages - 1}.blocks.0.", key)
    return re.sub(r"^head\.fc\.", "head.", key)


def _is_mobilevit(model: nn.Module) -> bool:
    """An archspec model with MobileViT's stages (family ``mobilevit``): its blocks are timm ByobNet's own, named as
    timm names them (not ResNet's, as the other ByobNets' are)."""
    stages = getattr(getattr(model, "spec", None), "stages", ())
    return any(getattr(stage, "family", None) == "mobilevit" for stage in stages)


def _is_maxxvit(keys) -> bool:
    """A timm MaxxVit state dict: its MBConv blocks have a ``pre_norm`` (ByobNet's ``conv1_1x1`` blocks have none)."""
    return any(_MAXXVIT_PRE_NORM.match(k) for k in keys)


def _is_byobnet(keys) -> bool:
    return any(".conv1_1x1." in k for k in keys)


def _is_convnet(model: nn.Module) -> bool:
    return getattr(getattr(model, "spec", None), "is_convnet", False)


_GPSA_OWN = (".qk.weight", ".v.weight", ".centers", ".locality", ".gating")  # ConvGPSA's tensors a CNN lacks


def _resnet_from_timm(state_dict: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """A timm ResNet state dict -> ``model``'s names; T-CNN blocks: ``conv2.weight`` -> ``conv2.out_weight``
    (the conv's taps, eq. 6), the GPSA's own tensors from ``model`` itself."""

    ours = model.state_dict()
    out = {}
    for key, value in state_dict.items():
        key = resnet_key_from_timm(key)
        gpsa = key[:-len(".weight")] + ".out_weight" if key.endswith(".conv2.weight") else None
        if gpsa is not None and key not in ours and gpsa in ours and value.dim() == 4:
            out[gpsa] = conv_to_out_weight(value)
            prefix = gpsa[:-len(".out_weight")]
            out.update({prefix + leaf: ours[prefix + leaf].clone() for leaf in _GPSA_OWN})
            continue
        out[key] = value
    return out


def _stage_of(model: ArchModel) -> list[tuple[int, int]]:
    """Global block index -> (stage, layer)."""
    return [(s, j) for s, stage in enumerate(model.stages) for j in range(len(stage.blocks))]


def from_timm(state_dict: dict[str, Tensor], model: ArchModel, head_first: bool = True) -> dict[str, Tensor]:
    """Convert a timm state dict into one that ``model.load_state_dict(..., strict=True)`` accepts.

    Args:
        state_dict: a timm ViT/DeiT, ConViT, LeViT, CaiT, ResNet, BoTNet, MobileViT (:func:`mobilevit_key_from_timm`),
            MaxxVit (its stem and MBConv blocks: :func:`maxxvit_key_from_timm`) or Swin state dict (Swin: the
            structure's names, :func:`swin_key_from_timm`; the window attention's tensors are the window head kind's).
        model: the compiled archspec equivalent (same spec; see :data:`TIMM_EQUIVALENTS`), or a T-CNN of the
            ResNet (its GPSA blocks take the 3x3 convs' weights as ``W_out``, T-CNN eq. 6, and keep their own
            W_qry, W_key, W_val = I, centres, locality and gating: see the module docstring).

    Raises:
        ValueError: a timm block index beyond the archspec model's depth.
    """
    if _is_convnet(model) and _is_mobilevit(model):
        return {mobilevit_key_from_timm(k, len(model.stages)): v for k, v in state_dict.items()}
    if _is_maxxvit(state_dict):
        return maxxvit_from_timm(state_dict, model, head_first)
    if _is_convnet(model) and _is_byobnet(state_dict):
        return {byobnet_key_from_timm(k): v for k, v in state_dict.items()}
    if _is_convnet(model):
        return _resnet_from_timm(state_dict, model)
    stage_of = _stage_of(model)
    ours = set(model.state_dict())
    out: dict[str, Tensor] = {}
    for key, value in state_dict.items():
        key = swin_key_from_timm(re.sub(r"^patch_embed\.", "stem.", key))
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
    there (ViT, ConViT MHSA); ConViT GPSA keeps ``qk`` / ``v``.  A T-CNN (conv stages with ``mixer: {kind: gpsa}``)
    into its timm ResNet: each GPSA's ``W_out`` becomes the 3x3 conv's weight again (the inverse of eq. 6's
    loading, so ``from_timm`` then ``to_timm`` gives the ResNet's weights back); the GPSA's own tensors (W_qry,
    W_key, W_val, centres, locality, gating), which a ResNet has no place for, are left out.

    Raises:
        KeyError: a tensor of ``timm_model`` has no archspec counterpart.
    """
    ours = model.state_dict()
    if _is_maxxvit(timm_model.state_dict()):
        return maxxvit_to_timm(model, timm_model)
    if _is_convnet(model):
        out = {}
        theirs = timm_model.state_dict()
        rename = (partial(mobilevit_key_from_timm, n_stages=len(model.stages)) if _is_mobilevit(model)
                  else byobnet_key_from_timm if _is_byobnet(theirs) else resnet_key_from_timm)
        for key in timm_model.state_dict():
            src = rename(key)
            gpsa = src[:-len(".weight")] + ".out_weight" if src.endswith(".conv2.weight") else None
            if src not in ours and gpsa in ours:  # a T-CNN block: W_out back to the 3x3 conv's taps (eq. 6)
                weight = ours[gpsa]  # (9, D_in, D_out) -> (D_out, D_in, 3, 3), inverse of conv_to_out_weight
                out[key] = weight.reshape(3, 3, weight.shape[1], weight.shape[2]).permute(3, 2, 0, 1).contiguous()
                continue
            if src not in ours:
                raise KeyError(f"timm tensor {key!r} has no archspec counterpart (looked for {src!r})")
            out[key] = ours[src]
        return out
    our_keys = set(ours)
    flat_blocks = any(k.startswith("blocks.") for k in timm_model.state_dict())
    out: dict[str, Tensor] = {}
    for key in timm_model.state_dict():
        src = swin_key_from_timm(re.sub(r"^patch_embed\.", "stem.", key))
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
    head_first = all(getattr(m, "head_first", True) for m in timm_model_or_state.modules()) \
        if isinstance(timm_model_or_state, nn.Module) else True
    model.load_state_dict(from_timm(state, model, head_first), strict=True)
    return model


def resnet_spec_from_timm(model: nn.Module, resolution: int | tuple[int, int] = 224, name: str = "resnet") -> dict:
    """The spec (a dict for :func:`archspec.load_spec`) of a timm ``resnet.ResNet``: its stem (7x7, or the deep
    stem with equal first widths; max-pool or ResNet-RS's conv pool), each ``layer{i}`` as a conv stage (block,
    depth, channels, stride, shortcut, SE), the average-pool classifier, at ``resolution`` pixels.

    Only the architecture's reading is done here; :func:`load_timm_weights` then checks every tensor's name and
    shape strictly, which catches what the reading cannot see.  ResNeXt's grouped 3x3 (``groups``, ``base_width``)
    and timm's tiered deep stem (``widths``) are read.

    Raises:
        ValueError: not a timm ResNet, or a part the spec language has no word for (anti-aliasing, dilation,
            attention other than SE, pooling other than 'avg'), naming it.
    """


    if not isinstance(model, ResNet):
        raise ValueError(f"not a timm ResNet (timm.models.resnet.ResNet): {type(model).__name__}")
    if isinstance(model.conv1, nn.Sequential):  # timm stem_type 'deep' / 'deep_tiered'
        widths = [m.out_channels for m in model.conv1 if isinstance(m, nn.Conv2d)]
        if len(widths) != 3:
            raise ValueError(f"its deep stem has {len(widths)} convs {widths}; archspec's deep stem has three")
        stem = {"kind": "resnet", "deep": True, "channels": widths[2]}
        if widths[0] == widths[1]:  # timm stem_type='deep'
            stem["stem_width"] = widths[0]
        else:  # 'deep_tiered'
            stem["widths"] = widths[:2]
        in_chans = model.conv1[0].in_channels
    else:
        if model.conv1.kernel_size != (7, 7):
            raise ValueError(f"its stem conv is {model.conv1.kernel_size[0]}x{model.conv1.kernel_size[1]}; "
                             "archspec's ResNet stem is 7x7 or deep")
        stem = {"kind": "resnet", "channels": model.conv1.out_channels}
        in_chans = model.conv1.in_channels
    if isinstance(model.maxpool, nn.Sequential):  # timm replace_stem_pool: conv + BatchNorm + ReLU
        stem["pool"] = "conv"
    elif not isinstance(model.maxpool, nn.MaxPool2d):
        raise ValueError(f"its stem pool is {type(model.maxpool).__name__}; archspec's is a max-pool or a conv")
    if getattr(model, "global_pool", None) is not None and getattr(model.global_pool, "pool_type", "avg") != "avg":
        raise ValueError(f"its global pool is {model.global_pool.pool_type!r}; archspec's conv-net head averages")
    stages = []
    for i in range(1, 5):
        blocks = list(getattr(model, f"layer{i}"))
        first = blocks[0]
        kind = "bottleneck" if isinstance(first, Bottleneck) else "basic" if isinstance(first, BasicBlock) else None
        if kind is None:
            raise ValueError(f"layer{i} holds {type(first).__name__} blocks; archspec has timm's BasicBlock and "
                             "Bottleneck")
        for j, block in enumerate(blocks):
            convs = [m for m in block.modules() if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
            plain = [isinstance(getattr(block, n, None), (nn.Identity, type(None))) for n in ("aa", "drop_block")]
            if any(c.dilation != (1, 1) for c in convs) or not all(plain):
                raise ValueError(f"layer{i}.{j} has dilated or anti-aliased convs or DropBlock, which "
                                 "archspec's conv stages do not have")
        channels = (first.conv3 if kind == "bottleneck" else first.conv2).out_channels
        strided = first.conv2 if kind == "bottleneck" else first.conv1
        entry = {"kind": "conv", "block": kind, "depth": len(blocks), "channels": channels,
                 "stride": strided.stride[0]}
        groups = first.conv2.groups if kind == "bottleneck" else 1
        planes = channels // EXPANSION[kind]
        if groups != 1 or (kind == "bottleneck" and first.conv1.out_channels != planes):  # ResNeXt
            width = first.conv1.out_channels // groups  # timm: floor(planes * base_width / 64) per group
            base_width = -(-width * 64 // planes)
            entry.update(groups=groups, base_width=base_width)
        elif channels // first.conv1.out_channels != EXPANSION[kind]:
            entry["expansion"] = channels // first.conv1.out_channels
        down = first.downsample
        if down is not None and isinstance(down[0], (nn.AvgPool2d, nn.Identity)):  # timm downsample_avg
            entry["downsample"] = "avg"
        se = getattr(first, "se", None)
        if isinstance(se, SEModule):
            rd = se.fc1.out_channels
            ratio = rd / channels
            if se_channels(channels, ratio, 8) != rd:
                raise ValueError(f"layer{i}'s squeeze-excitation width {rd} is not timm's make_divisible of "
                                 f"{channels} x a ratio")
            entry["se"] = {"rd_ratio": ratio}
        elif se is not None:
            raise ValueError(f"layer{i}'s attention is {type(se).__name__}; archspec's conv stages have SE only")
        stages.append(entry)
    size = [resolution, resolution] if isinstance(resolution, int) else list(resolution)
    return {"name": name, "source": f"timm {type(model).__name__} (archspec.timm_bridge.convert.resnet_spec_from_timm)",
            "input": {"channels": in_chans, "resolution": size}, "stem": stem,
            "tokens": {"cls_token": "none", "pos_embed": "none"}, "stages": stages,
            "head": {"pool": "mean", "num_classes": model.num_classes}}
