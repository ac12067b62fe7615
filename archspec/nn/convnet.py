"""The compiled conv net: an :class:`~archspec.nn.model.ArchModel` whose stages are all conv stages (ResNet).

Images ``(B, C_in, H, W)`` -> the ResNet stem's map -> each stage's residual blocks (timm's ``BasicBlock`` /
``Bottleneck``) -> ``forward_features`` the last map ``(B, C, H/32, W/32)`` -> global average pool -> ``head``
(``nn.Linear``, timm ResNet's ``fc`` with its default init) -> logits, exactly as timm ``resnet.ResNet``.  It keeps
the timm model API of :class:`ArchModel` (``forward_features``, ``forward_head``, ``reset_classifier``,
``pretrained_cfg``, ``forward_intermediates``, ``group_matcher``, input-size changes); the token-only parts
(class tokens, position embedding, distillation) do not exist.  Built by :func:`archspec.compile`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from timm.models._features import feature_take_indices
from torch import Tensor, nn

from archspec.nn.model import ArchModel, Stage, default_pretrained_cfg, stem_grid, with_resolution
from archspec.spec import ArchSpec

__all__ = ["ConvNet"]


class ConvNet(ArchModel):
    """A compiled conv net (every stage ``kind: conv``).

    Shapes: images ``(B, C_in, H, W)`` -> ``forward_features`` map ``(B, C, H', W')`` -> logits
    ``(B, num_classes)`` (pooled ``(B, C)`` when ``num_classes == 0``).  Module names follow timm ResNet's with
    archspec's layout: ``stem.{conv1,bn1,act1,maxpool}`` = timm ``conv1, bn1, act1, maxpool``;
    ``stages.{i}.blocks.{j}`` = timm ``layer{i+1}.{j}``; ``head`` = timm ``fc``.
    """

    def __init__(self, spec: ArchSpec, stem: nn.Module, stages: Sequence[Stage], dim_out: int,
                 drop_rate: float = 0.0):
        nn.Module.__init__(self)
        self.spec = spec
        self.stem = stem
        self.stages = nn.ModuleList(stages)
        self.n_patch_stages = self.tail_start = len(spec.stages)
        self.to_map = None
        self.cls_at = None
        self.has_dist = self.distilled = self.distilled_training = False
        self.cls_token = self.dist_token = self.pos_embed = None
        self.num_prefix_tokens = 0
        self.global_pool = "avg"
        self.num_features = self.head_hidden_size = self.embed_dim = dim_out
        self.batchnorm_head = False
        self.grad_checkpointing = False
        self.dynamic_img_size = False
        self.patch_grid = stem_grid(spec, spec.input.resolution)
        self.drop_rate = drop_rate
        self.head_drop = nn.Dropout(drop_rate)
        self.reset_classifier(spec.head.num_classes)
        self.feature_info = self._feature_info()
        self.pretrained_cfg = self.default_cfg = default_pretrained_cfg(spec)

    def _make_head(self, num_classes: int) -> nn.Module:
        """timm ResNet's ``fc``: an ``nn.Linear`` with torch's default init (timm's ``init_weights`` leaves it)."""
        return nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A fresh ``head`` for ``num_classes``; ``global_pool`` 'avg' or '' (no pooling: ``forward_head`` then
        applies the classifier to the map unpooled, as timm with ``global_pool=''``).

        Raises:
            ValueError: any other ``global_pool`` (a conv net has no class token).
        """
        if global_pool is not None and global_pool not in ("avg", ""):
            raise ValueError(f"a conv net's global_pool must be 'avg' or '', got {global_pool!r}")
        super().reset_classifier(num_classes, global_pool)

    # ----------------------------------------------------------------------------- forward
    def _forward_levels(self, x: Tensor, take: Sequence[int] = ()) -> tuple[Tensor, list[tuple[Tensor, tuple, int]]]:
        """Images -> (last map, ``[(map, grid, 0)]`` of the stages in ``take``)."""
        x = self.stem(x)
        taken = []
        for s, stage in enumerate(self.stages):
            for block in stage.blocks:
                x = self._run_block(block, x)
            if s in take:
                taken.append((x, tuple(x.shape[-2:]), 0))
        return x, taken

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``(B, C_in, H, W)`` -> the last stage's map ``(B, C, H', W')``."""
        return self._forward_levels(x)[0]

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Map ``(B, C, H', W')`` -> logits ``(B, num_classes)`` (pooled ``(B, C)`` with ``pre_logits``)."""
        if self.global_pool == "":
            return x if pre_logits else self.head(x)
        x = self.head_drop(x.mean(dim=(2, 3)))
        return x if pre_logits else self.head(x)

    # ----------------------------------------------------------------------------- timm backbone API
    def _feature_info(self) -> list[dict[str, Any]]:
        """timm ``feature_info``: one entry per stage, its channels and its reduction of the input."""
        reduction, info = 4, []
        for s, stage in enumerate(self.spec.stages[:len(self.stages)]):
            reduction *= stage.stride
            info.append(dict(num_chs=stage.channels, reduction=reduction, module=f"stages.{s}"))
        return info

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Layer-decay groups as timm ResNet: the stem, then one group per stage (coarse) or per block."""
        return dict(stem=r"^stem", blocks=r"^stages\.(\d+)" if coarse else r"^stages\.(\d+)\.blocks\.(\d+)")

    def forward_intermediates(self, x: Tensor, indices: int | Sequence[int] | None = None,
                              return_prefix_tokens: bool = False, norm: bool = False, stop_early: bool = False,
                              output_fmt: str = "NCHW", intermediates_only: bool = False) -> Any:
        """timm's backbone API: the maps ``(B, C, H, W)`` after the stages in ``indices`` (see ``feature_info``);
        ``(B, H*W, C)`` for ``output_fmt='NLC'``.  Returns the list, or ``(final map, list)``.

        Raises:
            ValueError: an ``output_fmt`` other than 'NCHW' / 'NLC'; an index out of range.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take, _ = feature_take_indices(len(self.feature_info), indices)
        final, taken = self._forward_levels(x, set(take))
        features = [m if output_fmt == "NCHW" else m.flatten(2).transpose(1, 2) for m, _, _ in taken]
        if return_prefix_tokens:
            features = [(f, f.new_zeros(f.shape[0], 0, f.shape[1])) for f in features]
        return features if intermediates_only else (final, features)

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1, prune_norm: bool = False,
                                  prune_head: bool = True) -> list[int]:
        """Drop the stages after the last one in ``indices`` (timm API); returns the kept indices."""
        take, max_index = feature_take_indices(len(self.feature_info), indices)
        self.stages = self.stages[:max_index + 1]
        self.n_patch_stages = len(self.stages)
        self.feature_info = self.feature_info[:max_index + 1]
        self.num_features = self.head_hidden_size = self.feature_info[-1]["num_chs"]
        if prune_head:
            self.reset_classifier(0, "")
        return take

    # ----------------------------------------------------------------------------- input size
    def _set_block_grids(self, grid: tuple[int, int]) -> None:
        """Nothing to do: convolutions run on any map."""

    @torch.no_grad()
    def set_input_size(self, img_size: int | tuple[int, int] | None = None, patch_size: Any = None) -> None:
        """Run at another input resolution from now on (the spec is re-checked there; no weight changes).

        Raises:
            SpecError: the spec is invalid at ``img_size``.  ValueError: a ``patch_size`` (a conv net has none).
        """
        if patch_size is not None:
            raise ValueError("a conv net has no patch size")
        if img_size is None:
            return
        spec = with_resolution(self.spec, img_size)
        self.patch_grid = stem_grid(spec, spec.input.resolution)
        self.spec = spec
        self.pretrained_cfg = {**self.pretrained_cfg, "input_size": (spec.input.channels, *spec.input.resolution)}
        self.default_cfg = self.pretrained_cfg

    def set_dynamic_img_size(self, enable: bool = True) -> None:
        """Accept any input size at forward time (a conv net always does)."""
        self.dynamic_img_size = enable
