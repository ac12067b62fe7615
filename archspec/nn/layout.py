"""What :class:`~archspec.nn.model.ArchModel` knows of its own structure, read from the IR's plan, not the spec.

:func:`layout_of` reads a :class:`~archspec.ir.plan.Plan`'s node records -- the stem's shape and grid, each
stage's blocks (their family, width, stride), the interface and tokens records, the head's shape -- into a
:class:`ModelLayout`: stage counts, widths, the token grid where the token stages start, where the class token
enters, the head's options, the feature levels' reductions.  The compiler hands it to the model, which keeps its
spec only as metadata (``model.spec``, as timm keeps ``pretrained_cfg``).  Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from archspec.families import CONV_STAGE_FAMILIES
from archspec.families.conv_block import rules as conv_blocks
from archspec.families.stem import rules as stems
from archspec.ir.plan import Plan

__all__ = ["ModelLayout", "layout_of", "TRANSITIONS"]

#: the node kinds that open a token stage and halve its grid (a stage's ``downsample`` module): LeViT's shrinking
#: attention (family ``shrink``), Swin's patch merging and NAT's conv downsampler (family ``downsample``)
TRANSITIONS = ("shrink", "downsample")


@dataclass(frozen=True)
class ModelLayout:
    """A compiled model's structure, from its plan (all sizes in pixels, tokens or channels).

    Attributes:
        input_size: ``(C_in, H, W)`` of the images the plan was made for.
        n_stages: the spec's stages (CaiT's class-attention stage not counted).
        n_conv_stages: conv stages before the first token stage (every stage for a conv net, 0 for a token model).
        tail_start: the first stage of a conv tail (conv stages after the token stages); ``n_stages`` when none.
        stage_dims: each stage's width after it (a conv stage's channels).
        stage_strides: each stage's reduction of its input's side: a conv stage's first stride, 2 for a token
            stage opening with a transition (:data:`TRANSITIONS`: a shrinking attention or a downsample) or whose
            first block pools (CoAtNet's ``downsample: pool``), else 1.
        patch_grid: the token grid where the token stages start (the stem's, or a hybrid's interface's; a conv
            net's: the stem's map).
        stem_kind, stem_patch_size, stem_conv_layers, stem_deep: the stem's kind, patch size (None for conv and
            ResNet stems), LeViT conv-stem layers, whether a ResNet stem is the deep one.
        interface_pools: whether a hybrid's interface pools the map to a fixed grid (``patch_grid``).
        dim_in: the first token stage's width (None: a conv net); ``dim_out``: the last stage's width.
        cls_at, n_extra, token_dim, pos_embed_len: where the class token enters (None: never), how many prefix
            tokens (class + distillation), their width, the tokens the position embedding covers (0: none).
        has_dist: a distillation token; ``distilled``: a distillation head.
        pool: the head's pooling (``cls`` or ``mean``); ``num_classes``: its classes (0: features only).
        batchnorm_head: LeViT's BatchNorm classifier; ``norm_eps``: the final LayerNorm's eps (None: no LayerNorm);
            ``norm_before_pool``: that LayerNorm on every token before a mean pool (timm Swin's ``norm``), not on the
            pooled features (timm ViT's ``fc_norm``).
        ends_on_map, is_convnet: the model ends on a map (timm ResNet's head); every stage is a conv stage.
    """

    input_size: tuple[int, int, int]
    n_stages: int
    n_conv_stages: int
    tail_start: int
    stage_dims: tuple[int, ...]
    stage_strides: tuple[int, ...]
    patch_grid: tuple[int, int]
    stem_kind: str
    stem_patch_size: int | None
    stem_conv_layers: int
    stem_deep: bool
    interface_pools: bool
    dim_in: int | None
    dim_out: int
    cls_at: int | None
    n_extra: int
    token_dim: int | None
    pos_embed_len: int
    has_dist: bool
    distilled: bool
    pool: str
    num_classes: int
    batchnorm_head: bool
    norm_eps: float | None
    norm_before_pool: bool
    ends_on_map: bool
    is_convnet: bool

    @property
    def stem_reduction(self) -> int:
        """Pixels per token side after the stem (:func:`archspec.families.stem.rules.reduction`)."""
        return stems.reduction(self.stem_kind, self.stem_patch_size, self.stem_conv_layers)

    def token_grid(self, img_size: Sequence[int]) -> tuple[int, int]:
        """The token grid ``(H, W)`` the token stages start on for images of ``img_size`` pixels: the stem's grid
        (:func:`archspec.families.stem.rules.grid`), for a hybrid through its conv stages' strides and its
        interface (the pooled grid, or the map's).  Unchecked; raises nothing."""
        grid = stems.grid(self.stem_kind, img_size, self.stem_patch_size, self.stem_conv_layers)
        if not 0 < self.n_conv_stages < self.n_stages:
            return grid
        for stride in self.stage_strides[:self.n_conv_stages]:
            grid = conv_blocks.strided_grid(grid, stride)
        return self.patch_grid if self.interface_pools else grid


def _stage_of(records: Sequence[Mapping[str, Any]], i: int) -> list[Mapping[str, Any]]:
    return [n for n in records if n.get("stage") == i and n["kind"] in ("block", *TRANSITIONS)]


def layout_of(plan: Plan) -> ModelLayout:
    """The :class:`ModelLayout` of a model compiled from ``plan``, read from its node records only.

    Raises:
        KeyError / StopIteration: ``plan`` lacks the records every valid plan has (an input, a stem, a head, a
            block per stage) -- a plan made by :func:`archspec.ir.plan.build_plan` never does.
    """
    nodes = plan.nodes
    image, stem, head = nodes[0], next(plan.of_kind("stem")), next(plan.of_kind("head"))
    embed, interface, to_map = plan.first("embed"), plan.first("interface"), plan.first("to_map")
    blocks = [n for n in nodes if n["kind"] == "block"]
    n_stages = max(n["stage"] for n in blocks) + 1
    conv = [all(n["family"] in CONV_STAGE_FAMILIES for n in _stage_of(nodes, i) if n["kind"] == "block")
            for i in range(n_stages)]
    n_conv = next((i for i, c in enumerate(conv) if not c), n_stages)
    tail_start = to_map["stage"] if to_map is not None else n_stages
    strides = []
    for i in range(n_stages):
        stage = _stage_of(nodes, i)
        if conv[i]:
            strides.append(stage[0]["shape"].stride)
        else:
            pools = getattr(stage[0]["shape"], "entry", None) is not None  # CoAtNet's first block pools
            strides.append(2 if stage[0]["kind"] in TRANSITIONS or pools else 1)
    token_blocks = [n for n in blocks if n["family"] == "block"]
    head_shape, stem_shape = head["shape"], stem["shape"]
    tokens = embed["tokens_plan"] if embed is not None else None
    ends_on_map = embed is None or to_map is not None
    layernorm = not head_shape.batchnorm and not ends_on_map
    return ModelLayout(
        input_size=(image["dim"], *image["grid"]), n_stages=n_stages, n_conv_stages=n_conv, tail_start=tail_start,
        stage_dims=tuple(_stage_of(nodes, i)[-1]["dim"] for i in range(n_stages)), stage_strides=tuple(strides),
        patch_grid=tuple(interface["grid"] if interface is not None else stem["grid"]),
        stem_kind=stem_shape.kind, stem_patch_size=stem_shape.patch_size, stem_conv_layers=len(stem_shape.channels),
        stem_deep=bool(stem_shape.stem_width), interface_pools=interface is not None and interface["shape"].pool,
        dim_in=embed["dim"] if embed is not None else None, dim_out=head_shape.dim,
        cls_at=tokens.cls_at if tokens is not None else None, n_extra=tokens.n_extra if tokens is not None else 0,
        token_dim=tokens.width if tokens is not None else None,
        pos_embed_len=embed["pos_embed_len"] if embed is not None else 0,
        has_dist=tokens is not None and tokens.n_extra - (tokens.cls_at is not None) == 1,
        distilled=head_shape.distillation, pool=head_shape.pool, num_classes=head_shape.num_classes,
        batchnorm_head=not ends_on_map and head_shape.batchnorm,
        norm_eps=token_blocks[-1]["shape"].norm_eps if layernorm else None,
        norm_before_pool=head_shape.norm_before_pool,
        ends_on_map=ends_on_map, is_convnet=embed is None)
