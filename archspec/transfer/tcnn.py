"""Transformed CNNs (d'Ascoli et al., "Transformed CNNs: recasting pre-trained convolutional layers with
self-attention", sec. 2-3): re-express the 3x3 convolutions of a (pre-trained) timm ResNet's last stage(s) as
9-head gated positional self-attention (GPSA) layers that reproduce them at initialisation.

The layer, :class:`ConvGPSA`, lives in the conv-block family (:mod:`archspec.families.conv_block.module`, where
its construction is described) and a conv stage's ``mixer: {kind: gpsa}`` puts it in every bottleneck of the
stage, so a T-CNN is a spec (``specs/t_resnet50d.yaml``, ``t_resnet50rs.yaml``) that ``archspec build``,
``analyze``, :func:`archspec.save` and :func:`archspec.load` take as any other.  From a timm ResNet:

* :func:`tcnn_spec` writes the T-CNN spec of the CNN (:func:`archspec.timm_bridge.convert.resnet_spec_from_timm`, then
  ``mixer: {kind: gpsa}`` and BoTNet's ``stride: 1`` on the chosen stages);
* :func:`tcnn_model` compiles a T-CNN spec and loads the CNN's weights into it
  (:func:`archspec.timm_bridge.convert.load_timm_weights`: every untransformed tensor as is, each transformed 3x3
  conv's taps into its GPSA's ``W_out``, eq. 6) -- what ``archspec tcnn`` does and saves;
* :func:`tcnn` is the older weight surgery on the timm model itself (any timm ResNet, basic blocks included;
  not a spec, so not saved by ``archspec.save``).

The first stride-2 convolution of a transformed stage becomes stride 1 (BoTNet, sec. 2), and its block's
shortcut loses its stride too (the ResNet-D average pool, or the 1x1 conv's stride).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import timm
import torch
import yaml
from safetensors.torch import load_model
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from archspec.errors import TransferError
from archspec.families.conv_block.module import BETA, ConvGPSA
from archspec.families.conv_block.module import inverse_softplus as _inverse_softplus  # noqa: F401 - older name
from archspec.families.conv_block.rules import gpsa_counts
from archspec.io.artifact import load as load_artifact
from archspec.nn.compiler import compile as compile_spec
from archspec.timm_bridge.convert import load_timm_weights, resnet_spec_from_timm
from archspec.train.param_groups import gating_param_groups, transformed_layers

__all__ = ["BETA", "ConvGPSA", "conv_gpsa_macs", "count_macs", "gating_param_groups", "load_tcnn", "tcnn",
           "tcnn_from_recipe", "tcnn_model", "tcnn_spec", "transformed_layers"]


def conv_gpsa_macs(d_in: int, d_out: int, height: int, width: int, stride: int = 1) -> int:
    """MACs of :class:`ConvGPSA` (``D_in -> D_out``) on an ``(H, W)`` map at ``stride``: the MAC part of
    :func:`archspec.families.conv_block.rules.gpsa_counts` (what ``forward`` multiplies)."""
    return gpsa_counts(d_in, d_out, (height, width), stride)[1]


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
                    layer = ConvGPSA.from_conv(conv, alpha, gating, stride=1 if stride_one else None)
                    setattr(block, name, layer.to(conv.weight.device).train(conv.training))
            if strided and stride_one:
                _drop_shortcut_stride(block)
    return model


def tcnn_spec(cnn: nn.Module, stages: Sequence[int | str] = (-1,), alpha: float = 1.0, gating: float = 1.0,
              stride_one: bool = True, resolution: int | tuple[int, int] = 224, name: str = "t_cnn") -> dict:
    """The T-CNN spec of a timm ResNet (a dict for :func:`archspec.load_spec`): the CNN's own spec
    (:func:`archspec.timm_bridge.convert.resnet_spec_from_timm`) with ``mixer: {kind: gpsa, locality_strength: alpha,
    gating_init: gating}`` on the chosen stages and, with ``stride_one``, their ``stride: 1`` (BoTNet's move,
    sec. 2: the stage then keeps its input map).

    Args:
        cnn: a timm ``resnet.ResNet`` with bottleneck blocks in the chosen stages (``resnetrs50``, ``resnet50d``).
        stages: stage indices (4 = ``layer4``, -1 = the last) or names; default the last (sec. 2).
        alpha: initial locality strength (paper: 1).
        gating: initial gating lambda (paper: 1).
        stride_one: move the stride out of the transformed stages (paper: yes).
        resolution: the spec's input side in pixels (or ``(H, W)``).
        name: the spec's name.

    Raises:
        TransferError: not a ResNet archspec can write (its reason), an unknown stage, a stage of basic blocks
            (T-CNN re-expresses a bottleneck's single 3x3 conv; :func:`tcnn` does basic blocks by surgery).
    """

    try:
        doc = resnet_spec_from_timm(cnn, resolution, name)
    except ValueError as exc:
        raise TransferError(f"T-CNN needs a timm ResNet-family model the spec language describes: {exc}") from None
    cfg = getattr(cnn, "pretrained_cfg", None)
    arch = (cfg.get("architecture") if isinstance(cfg, dict) else None) or type(cnn).__name__
    doc["source"] = f"T-CNN (d'Ascoli et al. 2021, Transformed CNNs, sec. 2) of timm {arch}"
    for stage_name, _ in _stage_modules(cnn, stages):
        i = int(stage_name[len("layer"):]) - 1
        stage = doc["stages"][i]
        if stage["block"] != "bottleneck":
            raise TransferError(f"{stage_name} has {stage['block']} blocks; a T-CNN spec re-expresses a bottleneck's "
                                "3x3 conv (archspec.transfer.tcnn(cnn) transforms basic blocks by weight surgery, "
                                "without a spec)")
        stage["mixer"] = {"kind": "gpsa", "locality_strength": float(alpha), "gating_init": float(gating)}
        if stride_one:
            stage["stride"] = 1
    return doc


def tcnn_model(cnn: nn.Module, spec: Any = None, **spec_options: Any) -> nn.Module:
    """A T-CNN of ``cnn`` built from a spec: :func:`archspec.compile` of ``spec`` (default :func:`tcnn_spec`
    ``(cnn, **spec_options)``; or a shipped T-CNN spec such as ``"t_resnet50d"``), with ``cnn``'s weights loaded
    by :func:`archspec.timm_bridge.convert.load_timm_weights` -- each transformed 3x3 conv's taps into its GPSA's
    ``W_out`` (eq. 6), every other tensor as is -- in ``cnn``'s train/eval mode and on its device.

    Returns an :class:`archspec.nn.model.ArchModel` (images ``(B, C, H, W)`` -> logits ``(B, num_classes)``) that
    :func:`archspec.save` writes and :func:`archspec.load` reads back.

    Raises:
        TransferError: as :func:`tcnn_spec`, or ``cnn``'s tensors do not fit the spec (another architecture).
        SpecError: the spec is invalid (at its resolution, or over the memory limit).
    """
    if spec is None:
        spec = tcnn_spec(cnn, **spec_options)
    elif spec_options:
        raise TypeError(f"tcnn_model: give spec options ({', '.join(spec_options)}) or a spec, not both")
    model = compile_spec(spec)
    try:
        load_timm_weights(model, cnn)
    except RuntimeError as exc:
        first = (str(exc).splitlines() or ["no message"])[0][:300]
        raise TransferError(f"the CNN's weights do not fit the T-CNN spec {model.spec.name!r}: {first}") from None
    device = next(cnn.parameters()).device
    return model.to(device).train(cnn.training)


RECIPE_KEYS = ("base", "stages", "alpha", "gating", "stride_one", "num_classes")


def tcnn_from_recipe(recipe: dict, pretrained: bool = False) -> nn.Module:
    """Build a T-CNN from its recipe (``base`` timm model name, ``stages``, ``alpha``, ``gating``, ``stride_one``,
    ``num_classes``) -- what ``archspec tcnn`` writes as ``spec.yaml`` -- with the base's timm initialisation
    (or its pretrained weights).

    Raises:
        TransferError: an unknown key or timm model, or a model T-CNN cannot transform.
    """

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
    """Load a T-CNN that ``archspec tcnn`` wrote.  Its build directory (``spec.yaml``, ``model.safetensors``) is
    an archspec build, read by :func:`archspec.load`; a directory of an older archspec, whose ``spec.yaml`` is a
    recipe (``tcnn: {base, stages, ...}``), is rebuilt from the recipe by weight surgery (:func:`tcnn_from_recipe`).

    Raises:
        TransferError: a missing or malformed ``spec.yaml``; SpecError: as :func:`archspec.load`; OSError /
            safetensors errors for unreadable weights of a recipe directory.
    """

    directory = Path(directory)
    try:
        document = yaml.safe_load((directory / "spec.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise TransferError(f"{directory / 'spec.yaml'}: not a T-CNN build ({exc})") from None
    if not isinstance(document, dict):
        raise TransferError(f"{directory / 'spec.yaml'}: not a T-CNN build (not a mapping)")
    if "tcnn" not in document:
        return load_artifact(directory).eval()
    model = tcnn_from_recipe(document["tcnn"])
    load_model(model, str(directory / "model.safetensors"))
    return model.eval()


def count_macs(model: nn.Module, x: Tensor) -> int:
    """Multiply-accumulates of ``model(x)``: torch's ``FlopCounterMode`` total / 2 (matmuls, convs, einsums)."""

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(x)
    return int(counter.get_total_flops() // 2)
