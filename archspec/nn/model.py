"""The compiled model: a timm-style ``nn.Module`` that keeps its spec.

One class for every spec: token models (timm ``VisionTransformer`` / ``Levit`` / ``Cait`` / ``ConVit``), hybrids
(conv stages, then attention stages, optionally conv stages after them) and conv nets (timm ``ResNet``: a hybrid
without token stages).  :class:`ArchModel` behaves like a timm classification model in training code:
``forward_features`` / ``forward_head``, ``num_classes``, ``reset_classifier``, ``get_classifier``, ``no_weight_decay``,
``set_distilled_training`` (timm ``VisionTransformerDistilled`` / ``LevitDistilled``),
``pretrained_cfg`` -- so ``timm.optim.create_optimizer_v2`` and a timm-style loop take it unchanged.
As a backbone it has timm's ``forward_intermediates``, ``prune_intermediate_layers``, ``feature_info``
and ``group_matcher`` (layer-wise LR decay), and it changes input size with ``set_input_size`` or
``set_dynamic_img_size`` (timm ``VisionTransformer``'s API).
It is built by :func:`archspec.compile`; the constructor takes already-built parts.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import PatchEmbed, register_notrace_module, resample_abs_pos_embed, to_2tuple, trunc_normal_
from timm.models._features import feature_take_indices
from torch import Tensor, nn

from archspec.families import no_weight_decay_leaves
from archspec.families.attention.module import Attention, ZeroPadTokens
from archspec.families.attention.rules import RESAMPLED_TABLES
from archspec.families.conv_block.module import ConvGPSA, MapAttention
from archspec.families.conv_mixer.module import ConvMixer
from archspec.families.downsample.module import ConvDownsample, TokenPatchMerging
from archspec.families.head.module import build_classifier
from archspec.families.head.rules import classifier_names
from archspec.families.shrink.module import ShrinkBlock
from archspec.families.stem import rules as stems
from archspec.families.stem.module import IdentityStem
from archspec.ir.checked import with_resolution
from archspec.ir.plan import build_plan
from archspec.nn.fuse import fuse_model
from archspec.nn.layout import ModelLayout, layout_of
from archspec.spec import ArchSpec

# Token mixers, the identity stem and the mixers in a bottleneck's conv2 (T-CNN's GPSA builds its pixel grid from
# the map's size; MapAttention unpacks it) read their input shape in Python (data-dependent control flow for
# torch.fx), so FX treats them as leaves: timm's feature extractors use this registry; torchvision's take
# FX_LEAF_MODULES as tracer_kwargs, and symbolic_trace below uses them.
FX_LEAF_MODULES = (Attention, ConvMixer, IdentityStem, ShrinkBlock, TokenPatchMerging, ConvDownsample, ZeroPadTokens,
                   ConvGPSA, MapAttention)
for _leaf in FX_LEAF_MODULES:
    register_notrace_module(_leaf)

# Parameter leaf names that timm-style optimizers must not decay (position embedding, tokens,
# attention biases, GPSA gating, soft-mask alphas): every family's NO_WEIGHT_DECAY.
NO_WEIGHT_DECAY_LEAVES = no_weight_decay_leaves()


def _halves(stage: nn.Module) -> bool:
    """Whether a token stage halves its grid: it opens with a transition (LeViT's shrinking attention, Swin's patch
    merging, NAT's conv downsampler) or its first block pools (CoAtNet's ``downsample: pool``)."""
    return not isinstance(stage.downsample, nn.Identity) or bool(
        stage.blocks and getattr(stage.blocks[0], "downsamples", False))


class Stage(nn.Module):
    """One stage: an optional transition ``downsample`` (LeViT's shrinking attention, Swin's patch merging, NAT's
    conv downsampler) then ``blocks``. ``(B, N, C) -> (B, N', C')``."""

    def __init__(self, downsample: nn.Module | None, blocks: Sequence[nn.Module]):
        super().__init__()
        self.downsample = downsample if downsample is not None else nn.Identity()
        self.blocks = nn.ModuleList(blocks)


class ArchModel(nn.Module):
    """A compiled archspec model: a token model, a hybrid or a conv net.

    Shapes: images ``(B, C_in, H, W)`` -> ``forward_features`` tokens ``(B, N, C)`` -> logits
    ``(B, num_classes)`` (pooled features ``(B, C)`` when ``num_classes == 0``).  With a distillation
    head the output is the average of the two heads, or the tuple ``(cls_logits, dist_logits)`` in
    train mode after ``set_distilled_training(True)``, exactly as timm's distilled DeiT / LeViT.
    A model that ends on conv stages (a conv net, or a hybrid's conv tail) returns the last map
    ``(B, C, H', W')`` from ``forward_features`` and ends on timm ResNet's head (average pool + classifier).

    A conv net (every stage ``kind: conv``, timm ``resnet.ResNet``) is the hybrid with no token stages: its
    ``n_conv_stages`` is every stage, and it has no interface, tokens, position embedding or norm.  Its module
    names follow timm ResNet's with archspec's layout: ``stem.{conv1,bn1,act1,maxpool}`` = timm ``conv1, bn1,
    act1, maxpool``; ``stages.{i}.blocks.{j}`` = timm ``layer{i+1}.{j}``; ``head`` = timm ``fc`` (an
    ``nn.Linear`` with torch's default init, as timm ResNet leaves it); see
    :func:`archspec.timm_bridge.convert.resnet_key_from_timm` for the key mapping.

    Args (besides the built parts): ``spec`` the spec it was compiled from, kept as metadata (``model.spec``, as
    timm keeps ``pretrained_cfg``; the model's structure is not read from it); ``layout`` its structure, read from
    the IR's plan (:func:`archspec.nn.layout.layout_of`): stage counts and widths, the token grid, where the
    class (and distillation) token is prepended (``cls_at``: the global block index; 0 after the stem, None
    never) and how many, the position embedding's length, the head's options; ``drop_rate`` dropout on the
    pooled features before the classifier (timm ViT's ``head_drop``; not part of the spec, like timm's
    ``drop_rate`` kwarg); ``interface`` for a hybrid (LeViT sec. 3.2 grafting): the first
    ``layout.n_conv_stages`` of ``stages`` are conv stages run on the stem's feature map, ``interface`` turns
    their map into the tokens ``(B, N, C)`` the class token and position embedding join (family ``interface``;
    None for a conv net, whose ``n_conv_stages`` is ``len(stages)``: its last map goes to the head); ``to_map``
    for a conv tail (conv stages after the attention stages, from ``layout.tail_start``): it drops the
    class/distillation tokens and lays the rest out as a map ``(B, C, gh, gw)`` on the last token grid; the tail's
    conv stages run on it and the head is timm ResNet's (average pool + classifier, no norm), so
    ``forward_features`` returns a map.

    The constructor raises nothing of its own: :func:`archspec.compile` checks the spec and builds the parts.

    Attributes:
        spec: the :class:`~archspec.spec.ArchSpec` it was compiled from (``model.spec.to_yaml()``), metadata.
        layout: its :class:`~archspec.nn.layout.ModelLayout` (from the IR's plan).
        num_classes, num_features, num_prefix_tokens, global_pool: as in timm.
        ends_on_map: whether the last stage is a conv stage (a conv net or a conv tail): ``forward_features``
            returns a map and the head is timm ResNet's.
    """

    def __init__(self, spec: ArchSpec, layout: ModelLayout, stem: nn.Module, stages: Sequence[Stage],
                 drop_rate: float = 0.0, interface: nn.Module | None = None, to_map: nn.Module | None = None):
        super().__init__()
        self.spec = spec
        self.layout = layout
        self.stem = stem
        self.n_conv_stages = layout.n_conv_stages
        self.interface = interface
        self.to_map = to_map
        # the first stage of a conv tail (conv stages after the attention stages); len(stages) when none
        self.tail_start = layout.tail_start
        self.stages = nn.ModuleList(stages)
        # The spec's stages; a compiled CaiT has one more, its class-attention stage, after them.
        self.n_patch_stages = layout.n_stages
        self.cls_at = layout.cls_at
        self.has_dist = layout.has_dist
        self.num_prefix_tokens = layout.n_extra
        self.global_pool = "token" if layout.pool == "cls" else "avg"
        self.num_features = self.head_hidden_size = self.embed_dim = layout.dim_out
        # a conv net or a conv tail ends on a map: timm ResNet's head (average pool + classifier, no norm)
        self.ends_on_map = layout.ends_on_map
        # a conv net's classifier is timm ResNet's fc (torch's default init), and so is a MaxxVit's (CoAtNet, MaxViT:
        # timm's ClassifierHead has no init of its own); the others' timm ViT's / LeViT's
        self._resnet_fc = layout.is_convnet or layout.stem_kind == "maxxvit"
        self.batchnorm_head = layout.batchnorm_head
        self.distilled = layout.distilled
        self.distilled_training = False
        self.grad_checkpointing = False
        self.dynamic_img_size = False
        self.patch_grid = layout.patch_grid

        # A class token inserted before a later block has that block's width (after a shrink, not dim_in).
        token_dim = layout.token_dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, token_dim)) if layout.cls_at is not None else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, token_dim)) if self.has_dist else None
        self.pos_embed = (nn.Parameter(torch.zeros(1, layout.pos_embed_len, layout.dim_in)) if layout.pos_embed_len
                          else None)
        # layernorm family as timm ViT: final norm before token pooling, fc_norm after mean pooling; timm Swin (and
        # NAT): norm on every token, then the mean (head.norm: before_pool)
        layernorm = layout.norm_eps is not None  # timm ResNet's head and LeViT's BatchNorm head have none
        eps, dim_out = layout.norm_eps, layout.dim_out
        on_tokens = self.global_pool == "token" or layout.norm_before_pool
        self.norm = nn.LayerNorm(dim_out, eps=eps) if layernorm and on_tokens else nn.Identity()
        self.fc_norm = nn.LayerNorm(dim_out, eps=eps) if layernorm and not on_tokens else nn.Identity()
        self._init_tokens()
        self.drop_rate = drop_rate
        # timm ViT's head_drop; timm LeViT's NormLinear head has its own dropout (head.drop) instead.
        self.head_drop = None if self.batchnorm_head else nn.Dropout(drop_rate)
        self.reset_classifier(layout.num_classes)
        self.feature_info = self._feature_info()
        self.pretrained_cfg = self.default_cfg = default_pretrained_cfg(layout)

    # ----------------------------------------------------------------------------- init / timm API
    def _init_tokens(self) -> None:
        """Position embedding and distillation token ``trunc_normal_(std=.02)`` (timm ViT, DeiT, ConViT, CaiT).
        The class token as the timm model with that placement: entering at the input (``cls_at == 0``),
        timm ``VisionTransformer.init_weights``'s ``normal_(std=1e-6)`` (DeiT, MaiT); inserted before a
        later block, ``trunc_normal_(std=.02)`` as timm's ``ConVit`` and ``Cait``."""
        for p in (self.pos_embed, self.dist_token):
            if p is not None:
                trunc_normal_(p, std=0.02)
        if self.cls_token is not None:
            if self.cls_at == 0:
                nn.init.normal_(self.cls_token, std=1e-6)
            else:
                trunc_normal_(self.cls_token, std=0.02)

    @property
    def num_classes(self) -> int:
        """Number of classes of the classifier (0 when features only)."""
        return self._num_classes

    def get_classifier(self) -> nn.Module:
        """The classifier module (``head``), as timm."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the classifier (and distillation) head with fresh ones for ``num_classes``.

        ``global_pool=''`` (timm's "no pooling") makes ``forward_head`` return the tokens (or the map) unpooled.
        The classifier is ``(B, num_features) -> (B, num_classes)`` (``nn.Identity`` for 0): timm ViT's ``head``,
        timm LeViT's ``NormLinear``, or for a conv net timm ResNet's ``fc``.

        Raises:
            ValueError: ``global_pool`` other than None, 'token', 'avg' or '', or 'token' without a class token
                (a conv net has none; a conv tail drops it).
        """
        if global_pool is not None:
            token_pool = self.cls_token is not None and self.to_map is None
            if global_pool not in (("token", "avg", "") if token_pool else ("avg", "")):
                allowed = "'token', 'avg' or ''" if token_pool else "'avg' or ''"
                why = "" if global_pool != "token" else ": token pooling needs a class token" + (
                    " (a conv tail drops it where the tokens become a map)" if self.cls_token is not None else "")
                raise ValueError(f"global_pool must be {allowed}, got {global_pool!r}{why}")
            self.global_pool = global_pool
        self._num_classes = num_classes
        if num_classes != self.spec.head.num_classes:  # keep model.spec (and its layout) true to the model
            self.spec = self.spec.model_copy(
                update={"head": self.spec.head.model_copy(update={"num_classes": num_classes})})
            self.layout = dataclasses.replace(self.layout, num_classes=num_classes)
        self.head = self._make_head(num_classes)
        self.head_dist = self._make_head(num_classes) if self.distilled else None

    def _make_head(self, num_classes: int) -> nn.Module:
        if self._resnet_fc:  # timm ResNet's / MaxxVit's fc: torch's default init (timm's init_weights leaves it)
            return nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        return build_classifier(self.num_features, num_classes, self.batchnorm_head, self.drop_rate)

    def set_distilled_training(self, enable: bool = True) -> None:
        """Return ``(cls_logits, dist_logits)`` in train mode (timm's distilled models' switch)."""
        self.distilled_training = enable

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute blocks in the backward pass to save memory (timm API)."""
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameter names timm's optimizer factory must not decay.

        Position embedding, class/distillation tokens, LeViT/CMHSA attention biases, GPSA gating
        parameters and soft-mask alphas (names ending in one of :data:`NO_WEIGHT_DECAY_LEAVES`).
        """
        return {name for name, _ in self.named_parameters() if name.rsplit(".", 1)[-1] in NO_WEIGHT_DECAY_LEAVES}

    # ----------------------------------------------------------------------------- forward
    def _prefix(self, x: Tensor) -> Tensor:
        tokens = [self.cls_token.expand(x.shape[0], -1, -1)]
        if self.dist_token is not None:
            tokens.append(self.dist_token.expand(x.shape[0], -1, -1))
        return torch.cat(tokens + [x], dim=1)

    def _embed(self, x: Tensor, take: Sequence[int] = (), taken: list | None = None) -> tuple[Tensor, tuple[int, int]]:
        """Images ``(B, C_in, H, W)`` -> (stem tokens with class token and position embedding, patch grid).
        A hybrid runs its conv stages on the stem's map first (appending to ``taken`` the maps of the levels in
        ``take``, as tokens) and turns the last map into tokens through its interface; a conv net (conv stages
        only, no interface) returns its last map ``(B, C, H', W')``."""
        grid = self.layout.token_grid(x.shape[-2:]) if self.dynamic_img_size else self.patch_grid
        x = self.stem(x)
        for s, stage in enumerate(self.stages[:self.n_conv_stages]):
            for block in stage.blocks:
                x = self._run_block(block, x)
            if s in take and taken is not None:
                taken.append((x.flatten(2).transpose(1, 2), tuple(x.shape[-2:]), 0))
        if self.interface is not None:
            x = self.interface(x)
        if self.cls_at == 0:
            x = self._prefix(x)
        if self.pos_embed is not None:
            pos = self.pos_embed
            if self.dynamic_img_size:  # timm ViT's _pos_embed: resample on the fly, learned grid unchanged
                pos = resample_abs_pos_embed(pos, new_size=list(grid), old_size=list(self.patch_grid),
                                             num_prefix_tokens=self.num_prefix_tokens if self.cls_at == 0 else 0)
            x = x + pos
        if self.dynamic_img_size:
            self._set_block_grids(grid)
        return x, grid

    def _run_block(self, block: nn.Module, x: Tensor) -> Tensor:
        if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
            return torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        return block(x)

    def _forward_levels(self, x: Tensor, take: Sequence[int] = ()) -> tuple[Tensor, list[tuple[Tensor, tuple, int]]]:
        """Images -> (last tokens ``(B, N, C)`` before the final norm, or a conv net's / conv tail's last map
        ``(B, C, H', W')``; ``[(tokens, grid, n_prefix)]`` of the feature levels in ``take``, a map as its
        ``(B, H*W, C)`` tokens).  A level is a block for one-stage token models, a stage otherwise."""
        taken: list[tuple[Tensor, tuple, int]] = []
        x, grid = self._embed(x, take, taken)
        per_block = self._per_block_levels()
        prefix = self.num_prefix_tokens if self.cls_at == 0 else 0
        index = 0  # token blocks: the index space of cls_at
        for s, stage in enumerate(self.stages):  # the patch stages, then CaiT's class-attention stage if any
            if s < self.n_conv_stages:  # a hybrid's conv stages ran in _embed
                continue
            if self.to_map is not None and s >= self.tail_start:  # a conv tail: tokens -> map once (no prefix)
                if s == self.tail_start:
                    x = self.to_map(x, grid)  # the grid at this input size
                    prefix = 0
                for block in stage.blocks:
                    x = self._run_block(block, x)
                if s in take:  # the map's size read only here: torch.fx cannot make a tuple of a traced shape
                    taken.append((x.flatten(2).transpose(1, 2), tuple(x.shape[-2:]), 0))
                continue
            if not isinstance(stage.downsample, nn.Identity):
                x = stage.downsample(x)
            if _halves(stage):
                grid = ((grid[0] - 1) // 2 + 1, (grid[1] - 1) // 2 + 1)
            for block in stage.blocks:
                if self.cls_at == index and index > 0:
                    x = self._prefix(x)
                    prefix = self.num_prefix_tokens
                x = self._run_block(block, x)
                if per_block and index in take and s < self.n_patch_stages:
                    taken.append((x, grid, prefix))
                index += 1
            if not per_block and s in take and s < self.n_patch_stages:
                taken.append((x, grid, prefix))
        if self.cls_at is not None and self.cls_at == index and index > 0 and x.dim() == 3:
            x = self._prefix(x)
        return x, taken

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``(B, C_in, H, W)`` -> tokens ``(B, N, C)`` after the last block (and final norm); a conv net's or
        a conv tail's last map ``(B, C, H', W')`` (timm ResNet's ``forward_features``)."""
        return self.norm(self._forward_levels(x)[0])

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Tokens ``(B, N, C)`` -> logits ``(B, num_classes)`` (pooled ``(B, C)`` with ``pre_logits``;
        the tokens unchanged after ``reset_classifier(0, '')``); a conv net's or conv tail's map ``(B, C, H', W')``
        is averaged (timm ResNet's head).  With a distillation head: the average of both heads' logits, or the
        pair ``(cls_logits, dist_logits)`` in distilled training (timm ``VisionTransformerDistilled``)."""
        if self.global_pool == "":
            return x if pre_logits else self.head(x)
        if self.ends_on_map:  # a map (static: FX traces no branch on a tensor)
            x = self.head_drop(x.mean(dim=(2, 3)))
            return x if pre_logits else self.head(x)
        if self.global_pool == "token":
            pooled = x[:, 0]
            pooled_dist = x[:, 1] if self.dist_token is not None else pooled
        else:
            pooled = self.fc_norm(x[:, self.num_prefix_tokens if self.cls_at is not None else 0:].mean(dim=1))
            pooled_dist = pooled
        if self.head_drop is not None and self.dist_token is not None:  # one call keeps FX node names unique
            pooled, pooled_dist = self.head_drop(torch.stack((pooled, pooled_dist))).unbind(0)
        elif self.head_drop is not None:
            pooled = pooled_dist = self.head_drop(pooled)
        if pre_logits:
            return (pooled + pooled_dist) / 2 if self.dist_token is not None else pooled
        logits = self.head(pooled)
        if self.head_dist is None:
            return logits
        logits_dist = self.head_dist(pooled_dist)
        if self.distilled_training and self.training and not torch.jit.is_scripting():
            return logits, logits_dist
        return (logits + logits_dist) / 2

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """Images ``(B, C_in, H, W)`` -> logits ``(B, num_classes)``."""
        return self.forward_head(self.forward_features(x))

    def fuse(self, inplace: bool = False) -> ArchModel:
        """Inference copy with every BatchNorm folded into its linear / conv (LeViT sec. 5.3); see
        :func:`archspec.nn.fuse.fuse_model`.  Equal to ``self.eval()`` to float rounding; returned in eval mode."""

        return fuse_model(self, inplace=inplace)

    # ----------------------------------------------------------------------------- timm backbone API
    def _per_block_levels(self) -> bool:
        """Whether the feature levels are blocks (a one-stage token model, as timm ViT), not stages."""
        return self.n_patch_stages == 1 and self.n_conv_stages == 0

    def _feature_info(self) -> list[dict[str, Any]]:
        """timm ``feature_info``: one entry per block (one-stage token models, as timm ViT) or per stage (LeViT,
        ResNet: a conv stage's channels and its reduction of the input)."""
        layout = self.layout
        reduction, info = layout.stem_reduction, []
        for s in range(self.n_conv_stages):  # a hybrid's conv stages
            reduction *= layout.stage_strides[s]
            info.append(dict(num_chs=layout.stage_dims[s], reduction=reduction, module=f"stages.{s}"))
        if self.interface is not None:  # the interface's pooling
            reduction = layout.input_size[1] // self.patch_grid[0]
        for s, stage in enumerate(self.stages[:self.n_patch_stages]):  # CaiT's class attention is no level
            if s < self.n_conv_stages:
                continue
            if self.to_map is not None and s >= self.tail_start:  # a conv tail's stage
                reduction *= layout.stage_strides[s]
                info.append(dict(num_chs=layout.stage_dims[s], reduction=reduction, module=f"stages.{s}"))
                continue
            if _halves(stage):
                reduction *= 2
            dim = layout.stage_dims[s]
            if self._per_block_levels():
                info += [dict(num_chs=dim, reduction=reduction, module=f"stages.0.blocks.{b}")
                         for b in range(len(stage.blocks))]
            else:
                info.append(dict(num_chs=dim, reduction=reduction, module=f"stages.{s}"))
        return info

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups for timm's layer-wise LR decay (``create_optimizer_v2(..., layer_decay=...)``).

        As timm ``VisionTransformer`` / ``Levit.group_matcher``: stem, tokens and position embedding form
        group 0; then one group per block in global order (``stages.S.blocks.B`` sorts by ``(S, B)``; a
        shrinking attention joins the first block of its stage, as in timm LeViT); the final norm joins the
        last block (timm's ``(99999,)`` suffix); the head, unmatched, is the last group.  ``coarse``: one
        group per stage.  A conv stage's blocks are grouped the same way (timm ``ResNet.group_matcher``: the
        stem, then one group per ``layerN`` block); CaiT's class attention takes :meth:`_class_attention_matcher`.
        Raises nothing; needs no tensors.
        """
        if self.n_patch_stages < len(self.stages):
            return self._class_attention_matcher
        blocks = r"^stages\.(\d+)" if coarse else [
            (r"^stages\.(\d+)\.downsample", (0,)), (r"^stages\.(\d+)\.blocks\.(\d+)", None)]
        if not coarse:
            blocks.append((r"^norm|^fc_norm", (99999,)))
        return dict(stem=r"^cls_token|^dist_token|^pos_embed|^stem|^interface", blocks=blocks)

    def _class_attention_matcher(self, name: str) -> float:
        """Layer-decay group of a parameter of a model with CaiT's class-attention stage, as timm
        ``Cait.group_matcher``: stem and tokens 0, self-attention block ``i`` (global) ``i + 1``, class-attention
        block ``j`` overlapping the last blocks (``j + depth - n_class + 1``), the final norm ``depth``, the
        head last."""
        depth = sum(len(stage.blocks) for stage in self.stages[:self.n_patch_stages])
        n_class = len(self.stages[-1].blocks)
        if re.match(r"^(cls_token|dist_token|pos_embed|stem)", name):
            return 0
        match = re.match(r"^stages\.(\d+)\.(blocks\.(\d+)|downsample)", name)
        if match:
            stage, block = int(match.group(1)), int(match.group(3) or 0)
            if stage == self.n_patch_stages:
                return block + depth - n_class + 1
            return sum(len(s.blocks) for s in self.stages[:stage]) + block + 1
        if re.match(r"^(norm|fc_norm)", name):
            return depth
        return float("inf")

    def forward_intermediates(self, x: Tensor, indices: int | Sequence[int] | None = None,
                              return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False) -> Any:
        """timm's backbone API: features of the levels in ``indices`` (see ``feature_info``).

        A level is a block for one-stage token models (as timm ViT) and a stage for multi-stage ones (as timm
        LeViT, and timm ResNet for conv stages).  ``indices``: None = all, an int n = the last n, a list = those
        (negative from the end).
        Each feature is ``(B, C, H, W)`` (``output_fmt='NCHW'``: patch tokens on their grid, class and
        distillation tokens dropped) or ``(B, H*W, C)`` (``'NLC'``); with ``return_prefix_tokens`` a pair
        ``(feature, prefix (B, n_prefix, C))`` (n_prefix 0 for maps and before ConViT's class token enters).  ``norm``
        applies the final norm to features as wide as the last stage.  ``stop_early`` is accepted for
        timm compatibility (use ``prune_intermediate_layers`` to drop unused blocks).

        Returns:
            the list of features, or ``(final tokens (B, N, C) after the norm, list)`` unless ``intermediates_only``
            (a conv net's or conv tail's final map ``(B, C, H', W')``).

        Raises:
            ValueError: an ``output_fmt`` other than 'NCHW' / 'NLC'; an index out of range (timm's assertion).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, _ = feature_take_indices(len(self.feature_info), indices)
        final, taken = self._forward_levels(x, set(take))
        features, prefixes = [], []
        for (tokens, grid, prefix), level in zip(taken, sorted(take)):
            if norm and self.feature_info[level]["num_chs"] == self.num_features:
                tokens = self.norm(tokens)
            prefixes.append(tokens[:, :prefix])
            tokens = tokens[:, prefix:]
            if output_fmt == "NCHW":
                tokens = tokens.reshape(x.shape[0], grid[0], grid[1], -1).permute(0, 3, 1, 2).contiguous()
            features.append(tokens)
        if return_prefix_tokens:
            features = list(zip(features, prefixes))
        return features if intermediates_only else (self.norm(final), features)

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop the blocks (or stages) after the last level in ``indices`` (timm API); returns the kept indices.

        ``prune_norm`` replaces the final norms by identities, ``prune_head`` the classifier
        (``reset_classifier(0, '')``).  ``model.spec`` still describes the unpruned model.  As timm
        ``VisionTransformer`` / ``Levit`` / ``ResNet.prune_intermediate_layers``; no tensors in or out.

        Raises:
            AssertionError: an index out of range (timm's ``feature_take_indices``).
        """
        take, max_index = feature_take_indices(len(self.feature_info), indices)
        per_block = self._per_block_levels()
        if per_block:
            self.stages[0].blocks = self.stages[0].blocks[:max_index + 1]
        self.stages = self.stages[:1 if per_block else max_index + 1]  # class attention goes too
        self.n_patch_stages = len(self.stages)
        self.feature_info = self.feature_info[:max_index + 1]
        self.num_features = self.head_hidden_size = self.feature_info[-1]["num_chs"]
        if prune_norm:
            self.norm, self.fc_norm = nn.Identity(), nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0, "")
        return take

    # ----------------------------------------------------------------------------- input size
    def _set_block_grids(self, grid: tuple[int, int]) -> None:
        """Move every token mixer and shrinking attention to the patch grid ``grid`` of a new input size
        (CaiT's class attention has no grid: it attends from the class token to whatever tokens come)."""
        for stage in self.stages[self.n_conv_stages:self.tail_start]:  # conv stages (a hybrid's, a tail's) take any map
            if not isinstance(stage.downsample, nn.Identity):
                if stage.downsample.grid != tuple(grid):
                    stage.downsample.set_grid(grid)
                grid = stage.downsample.out_grid
            for block in stage.blocks:
                if hasattr(block, "set_grid"):  # a pre-norm block moves its mixer (and its pools, CoAtNet's)
                    block.set_grid(grid)
                    grid = block.out_grid
                    continue
                mixer = block.attn
                if tuple(mixer.grid) == tuple(grid):
                    continue
                if hasattr(mixer, "set_grid"):
                    mixer.set_grid(grid)
                else:  # ConvMixer: a convolution runs on any grid
                    mixer.grid = tuple(grid)

    @torch.no_grad()
    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: Any = None) -> None:
        """Run at another input resolution from now on, keeping the weights (timm ``set_input_size``).

        The spec is re-checked at the new size (grids, mask windows against them); then the position
        embedding is resampled (timm ``resample_abs_pos_embed``, bicubic), the relative bias tables are
        resampled and GPSA's ``r_ij``, the index tables and the MaiT masks rebuilt for the new grid
        (``Attention.set_grid``, ``ShrinkBlock.set_grid``); conv stages run on any map (a conv net changes no
        module, as timm ResNet needs no call).  ``model.spec`` gets the new resolution, so ``archspec.save``
        writes a spec that rebuilds this model.  Images ``(B, C_in, H, W)`` at the new size from now on.

        Raises:
            SpecError: the spec is invalid at ``img_size`` (say, a grid smaller than a mask window).
            ValueError: a ``patch_size`` other than the stem's (a patch resize is not supported).
        """
        stem_patch = self.layout.stem_patch_size
        if patch_size is not None and to_2tuple(patch_size) != to_2tuple(stem_patch):
            raise ValueError(f"changing the patch size is not supported (the stem's is {self.spec.stem})"
                             if stem_patch is not None else f"a {self.layout.stem_kind} stem has no patch size")
        if img_size is None:
            return
        spec = with_resolution(self.spec, img_size)  # re-checked: its plan is the model's at the new size
        layout = layout_of(build_plan(spec))
        grid = layout.patch_grid
        if isinstance(self.stem, PatchEmbed):
            self.stem.set_input_size(img_size=layout.input_size[1:])
            self.stem.grid = tuple(self.stem.grid_size)
        if self.pos_embed is not None and grid != self.patch_grid:
            prefix = self.num_prefix_tokens if self.cls_at == 0 else 0
            resized = resample_abs_pos_embed(self.pos_embed.data, new_size=list(grid), old_size=list(self.patch_grid),
                                             num_prefix_tokens=prefix)
            self.pos_embed = nn.Parameter(resized, requires_grad=self.pos_embed.requires_grad)
        self._set_block_grids(grid)
        self.patch_grid = grid
        self.spec, self.layout = spec, layout
        self.pretrained_cfg = {**self.pretrained_cfg, "input_size": layout.input_size}
        self.default_cfg = self.pretrained_cfg

    def set_dynamic_img_size(self, enable: bool = True) -> None:
        """Accept any input size at forward time, as timm ViT's ``dynamic_img_size=True``.

        The position embedding is resampled on the fly from its learned grid; masks and GPSA's ``r_ij``
        are rebuilt when the grid changes (buffers only, no parameter changes).  Specs with learned
        relative tables (LeViT attention bias, CMHSA signed bias, shrinking attention) need a fixed grid:
        use :meth:`set_input_size` for them.  Sizes must still be multiples of the patch size.

        Raises:
            ValueError: the model has learned relative-position tables.
        """
        if enable:
            tables = [name for name, _ in self.named_parameters()
                      if name.rsplit(".", 1)[-1] in RESAMPLED_TABLES]
            if tables:
                raise ValueError(f"dynamic_img_size needs a model without learned relative-position tables; "
                                 f"this one has {tables[0]} (and {len(tables) - 1} more): call "
                                 "set_input_size(img_size=...) to move it to one fixed size instead")
        self.dynamic_img_size = enable
        if isinstance(self.stem, PatchEmbed):
            self.stem.strict_img_size = not enable


def default_pretrained_cfg(layout: ModelLayout) -> dict[str, Any]:
    """timm pretrained cfg (data config) of a model of ``layout`` (:func:`archspec.nn.layout.layout_of`): its input
    size and classes, ImageNet mean/std, bicubic 0.875 crop as timm's DeiT (a conv net: bilinear, as timm's
    ResNet); no weight source (archspec publishes no weights).

    ``classifier`` and ``first_conv`` name the real modules (the head's and the stem's rules), so timm's
    ``load_pretrained`` drops the classifier for another ``num_classes`` and adapts the first convolution for
    another ``in_chans`` (``timm.models.adapt_input_conv``) as it does for its own models.  A conv net's is timm
    ResNet's: its ``fc`` is archspec's ``head``, its ``conv1`` the stem's.  Raises nothing."""
    return {"input_size": layout.input_size, "num_classes": layout.num_classes,
            "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD, "crop_pct": 0.875,
            "interpolation": "bilinear" if layout.is_convnet else "bicubic",
            "classifier": classifier_names(layout.batchnorm_head, layout.distilled),
            "first_conv": stems.first_conv_name(layout.stem_kind, layout.stem_deep)}


class _LeafTracer(torch.fx.Tracer):
    """``torch.fx`` tracer that keeps :data:`FX_LEAF_MODULES` as leaves."""

    def is_leaf_module(self, module: nn.Module, qualname: str) -> bool:
        return isinstance(module, FX_LEAF_MODULES) or super().is_leaf_module(module, qualname)


def symbolic_trace(model: nn.Module) -> torch.fx.GraphModule:
    """``torch.fx.symbolic_trace`` for archspec models: token mixers, shrinking attention and the identity stem
    stay leaf modules (their Python shape checks are not traceable).  Returns the ``GraphModule``."""
    return torch.fx.GraphModule(model, _LeafTracer().trace(model))
