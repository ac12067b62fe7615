"""The compiled model: a timm-style ``nn.Module`` that keeps its spec.

:class:`ArchModel` behaves like a timm classification model in training code: ``forward_features``
/ ``forward_head``, ``num_classes``, ``reset_classifier``, ``get_classifier``, ``no_weight_decay``,
``set_distilled_training`` (timm ``VisionTransformerDistilled`` / ``LevitDistilled``),
``pretrained_cfg`` -- so ``timm.optim.create_optimizer_v2`` and a timm-style loop take it unchanged.
It is built by :func:`archspec.compile`; the constructor takes already-built parts.
"""

from __future__ import annotations

from typing import Sequence

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import trunc_normal_
from timm.models.levit import NormLinear
from torch import Tensor, nn

from archspec.spec import ArchSpec

# Parameter leaf names that timm-style optimizers must not decay (position embedding, tokens,
# attention biases, GPSA gating / positional projection, soft-mask alphas).
NO_WEIGHT_DECAY_LEAVES = frozenset({
    "pos_embed", "cls_token", "dist_token", "attention_biases", "signed_biases", "gating_param",
    "mask_alpha_logit",
})


class Stage(nn.Module):
    """One stage: optional LeViT shrinking attention (``downsample``) then ``blocks``. ``(B, N, C) -> (B, N', C')``."""

    def __init__(self, downsample: nn.Module | None, blocks: Sequence[nn.Module]):
        super().__init__()
        self.downsample = downsample if downsample is not None else nn.Identity()
        self.blocks = nn.ModuleList(blocks)


class ArchModel(nn.Module):
    """A compiled archspec model.

    Shapes: images ``(B, C_in, H, W)`` -> ``forward_features`` tokens ``(B, N, C)`` -> logits
    ``(B, num_classes)`` (pooled features ``(B, C)`` when ``num_classes == 0``).  With a distillation
    head the output is the average of the two heads, or the tuple ``(cls_logits, dist_logits)`` in
    train mode after ``set_distilled_training(True)``, exactly as timm's distilled DeiT / LeViT.

    Args (besides the built parts): ``dim_in``/``dim_out`` widths of the first/last stage; ``cls_at`` the
    global block index before which the class (and distillation) token is prepended (0: after the stem,
    None: no class token); ``n_extra`` the number of such tokens; ``pos_embed_len`` tokens covered by
    the position embedding (0: none); ``token_dim`` their width (default ``dim_in``; the width of the
    stage they enter when inserted later).

    Attributes:
        spec: the :class:`~archspec.spec.ArchSpec` it was compiled from (``model.spec.to_yaml()``).
        num_classes, num_features, num_prefix_tokens, global_pool: as in timm.
    """

    def __init__(self, spec: ArchSpec, stem: nn.Module, stages: Sequence[Stage], dim_in: int, dim_out: int,
                 cls_at: int | None, n_extra: int, pos_embed_len: int, token_dim: int | None = None):
        super().__init__()
        self.spec = spec
        self.stem = stem
        self.stages = nn.ModuleList(stages)
        self.cls_at = cls_at
        self.has_dist = spec.tokens.dist_token
        self.num_prefix_tokens = n_extra
        self.global_pool = "token" if spec.head.pool == "cls" else "avg"
        self.num_features = self.head_hidden_size = self.embed_dim = dim_out
        self.batchnorm_head = spec.stages[-1].norm == "batchnorm"
        self.distilled = spec.head.distillation
        self.distilled_training = False
        self.grad_checkpointing = False

        # A class token inserted before a later block has that block's width (after a shrink, not dim_in).
        token_dim = dim_in if token_dim is None else token_dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, token_dim)) if cls_at is not None else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, token_dim)) if self.has_dist else None
        self.pos_embed = nn.Parameter(torch.zeros(1, pos_embed_len, dim_in)) if pos_embed_len else None
        # layernorm family as timm ViT: final norm before token pooling, fc_norm after mean pooling
        layernorm = not self.batchnorm_head
        eps = spec.stages[-1].norm_eps
        self.norm = nn.LayerNorm(dim_out, eps=eps) if layernorm and self.global_pool == "token" else nn.Identity()
        self.fc_norm = nn.LayerNorm(dim_out, eps=eps) if layernorm and self.global_pool == "avg" else nn.Identity()
        self._init_tokens()
        self.reset_classifier(spec.head.num_classes)
        h, w = spec.input.resolution
        self.pretrained_cfg = {
            "input_size": (spec.input.channels, h, w), "num_classes": spec.head.num_classes,
            "mean": IMAGENET_DEFAULT_MEAN, "std": IMAGENET_DEFAULT_STD, "crop_pct": 0.875,
            "interpolation": "bicubic", "classifier": "head", "first_conv": "stem",
        }
        self.default_cfg = self.pretrained_cfg

    # ----------------------------------------------------------------------------- init / timm API
    def _init_tokens(self) -> None:
        for p in (self.pos_embed, self.cls_token, self.dist_token):
            if p is not None:
                trunc_normal_(p, std=0.02)

    @property
    def num_classes(self) -> int:
        """Number of classes of the classifier (0 when features only)."""
        return self._num_classes

    def get_classifier(self) -> nn.Module:
        """The classifier module (``head``), as timm."""
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the classifier (and distillation) head with fresh ones for ``num_classes``.

        Raises:
            ValueError: ``global_pool`` other than None, 'token' or 'avg', or 'token' without a class token.
        """
        if global_pool is not None:
            if global_pool not in ("token", "avg"):
                raise ValueError(f"global_pool must be 'token' or 'avg', got {global_pool!r}")
            if global_pool == "token" and self.cls_token is None:
                raise ValueError("token pooling needs a class token")
            self.global_pool = global_pool
        self._num_classes = num_classes
        if num_classes != self.spec.head.num_classes:  # keep model.spec true to the model
            self.spec = self.spec.model_copy(update={"head": self.spec.head.model_copy(update={"num_classes": num_classes})})
        self.head = self._make_head(num_classes)
        self.head_dist = self._make_head(num_classes) if self.distilled else None

    def _make_head(self, num_classes: int) -> nn.Module:
        if num_classes <= 0:
            return nn.Identity()
        if self.batchnorm_head:
            return NormLinear(self.num_features, num_classes)  # timm levit: BatchNorm1d + Linear
        head = nn.Linear(self.num_features, num_classes)
        trunc_normal_(head.weight, std=0.02)
        nn.init.zeros_(head.bias)
        return head

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

    def forward_features(self, x: Tensor) -> Tensor:
        """Images ``(B, C_in, H, W)`` -> tokens ``(B, N, C)`` after the last block (and final norm)."""
        x = self.stem(x)
        if self.cls_at == 0:
            x = self._prefix(x)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        index = 0
        for stage in self.stages:
            x = stage.downsample(x)
            for block in stage.blocks:
                if self.cls_at == index and index > 0:
                    x = self._prefix(x)
                if self.grad_checkpointing and self.training and not torch.jit.is_scripting():
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
                index += 1
        if self.cls_at is not None and self.cls_at == index and index > 0:
            x = self._prefix(x)
        return self.norm(x)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Tokens ``(B, N, C)`` -> logits ``(B, num_classes)`` (pooled ``(B, C)`` with ``pre_logits``)."""
        if self.global_pool == "token":
            pooled = x[:, 0]
            pooled_dist = x[:, 1] if self.dist_token is not None else pooled
        else:
            pooled = self.fc_norm(x[:, self.num_prefix_tokens if self.cls_at is not None else 0:].mean(dim=1))
            pooled_dist = pooled
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

    def fuse(self, inplace: bool = False) -> "ArchModel":
        """Inference copy with every BatchNorm folded into its linear / conv (LeViT sec. 5.3); see
        :func:`archspec.fuse.fuse_model`.  Equal to ``self.eval()`` to float rounding; returned in eval mode."""
        from archspec.fuse import fuse_model

        return fuse_model(self, inplace=inplace)
