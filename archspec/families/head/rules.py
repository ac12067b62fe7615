"""The classifier head: pooling, final norm and the classifier(s), torch-free rules.

ViT family: one LayerNorm (before class-token pooling, or after mean pooling as timm's ``fc_norm``) and
``Linear`` classifiers; LeViT: timm ``NormLinear`` (BatchNorm1d + Linear) per classifier; a distillation
head doubles the classifier (DeiT, LeViT).  The classifier is built by
:func:`archspec.families.head.module.build_classifier`; pooling and norms belong to
:class:`archspec.nn.model.ArchModel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from archspec._util.memory import F32, NodeMemory
from archspec._util.pydantic_base import HINT, StrictModel

__all__ = ["HeadOutSpec", "HeadShape", "counts", "memory", "batchnorm_channels_before_linear", "classifier_names",
           "NO_WEIGHT_DECAY"]

NO_WEIGHT_DECAY: frozenset[str] = frozenset()


class HeadOutSpec(StrictModel):
    """Classifier head."""

    pool: Literal["cls", "mean"] = Field("cls", description="'cls': class token; 'mean': average of patch tokens.")
    num_classes: int = Field(1000, ge=0, le=100_000, description="Classes; 0 gives features only (timm convention).")
    distillation: bool = Field(
        False, description="Second (distillation) head, averaged with the first at eval (DeiT / LeViT)."
    )
    norm: Literal["before_pool", "after_pool"] | None = Field(
        None, description="Where the final LayerNorm sits: 'before_pool' on every token (timm ViT's norm; Swin and "
        "NAT: norm, then the average), 'after_pool' on the pooled features (timm ViT's fc_norm, pool: mean only). "
        "Default: after_pool for pool: mean, before_pool for pool: cls.")

    @model_validator(mode="after")
    def _norm_after_mean_pool(self) -> HeadOutSpec:
        if self.norm == "after_pool" and self.pool == "cls":
            raise ValueError("norm: after_pool needs pool: mean (the class token is taken from the normed tokens)"
                             f"{HINT}use norm: before_pool, or leave it out")
        return self


@dataclass(frozen=True)
class HeadShape:
    """The head on ``n_tokens`` tokens of width ``dim``: ``num_classes`` (0: features only), a distillation
    classifier, LeViT's BatchNorm classifier (``batchnorm``), pooling ``pool``; ``final_norm``: the ViT family's
    LayerNorm (False for a conv net's head: timm ResNet's global average pool + ``fc``); ``norm_before_pool``: that
    LayerNorm on every token before a mean pool (timm Swin's ``norm``), not on the pooled features (timm ViT's
    ``fc_norm``)."""

    dim: int
    n_tokens: int
    num_classes: int
    distillation: bool
    batchnorm: bool
    pool: str
    final_norm: bool = True
    norm_before_pool: bool = False


def counts(shape: HeadShape) -> tuple[int, int]:
    """(params, MACs per image): per classifier ``C n + n`` (+ ``2C`` BatchNorm, LeViT), plus the final LayerNorm
    ``2C`` of the ViT family (not a conv net's); ``C n`` MACs per classifier."""
    dim, n_cls, bn = shape.dim, shape.num_classes, shape.batchnorm
    heads = 2 if shape.distillation else 1
    norm = 2 * dim if shape.final_norm and not bn else 0
    if n_cls == 0:
        params = norm
    else:
        params = heads * (dim * n_cls + n_cls + (2 * dim if bn else 0)) + norm
    return params, dim * n_cls * heads


def memory(shape: HeadShape) -> NodeMemory:
    """Bytes (batch 1, float32): the final norm (a copy of the tokens), pooling and the classifier(s)."""
    n, dim, n_cls = shape.n_tokens, shape.dim, shape.num_classes
    return NodeMemory(act=F32 * (2 * n * dim + 4 * (dim + n_cls)), saved=F32 * (n * dim + 4 * (dim + n_cls)))


def batchnorm_channels_before_linear(shape: HeadShape) -> int:
    """BatchNorm channels ``model.fuse()`` folds into the following classifier (LeViT's ``NormLinear``)."""
    heads = 2 if shape.distillation else 1
    return heads * shape.dim if shape.batchnorm and shape.num_classes else 0


def classifier_names(batchnorm: bool, distillation: bool) -> str | tuple[str, str]:
    """The classifier Linear(s) of a compiled model, as timm's cfgs name them: ``head`` (ViT, DeiT, ConViT,
    CaiT), ``head.linear`` for LeViT's BatchNorm + Linear ``NormLinear``; with a distillation head the pair
    ``(head, head_dist)`` (timm DeiT distilled, LeViT: ``('head.linear', 'head_dist.linear')``)."""
    name = "head.linear" if batchnorm else "head"
    return (name, name.replace("head", "head_dist", 1)) if distillation else name
