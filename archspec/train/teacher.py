"""The distillation teacher (DeiT hard distillation, Touvron et al. 2021 sec. 5; LeViT sec. 5.1 trains with a
RegNetY-16GF teacher): any timm model with the user's own checkpoint, or an archspec build directory.

archspec downloads nothing: a timm model name without its checkpoint (``fit(teacher_checkpoint=...)``,
``--teacher-checkpoint`` on the command line; timm would fetch pretrained weights from a hub) is refused with a
message saying what to give instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import timm
import torch

from archspec.errors import SpecError
from archspec.io.artifact import load

__all__ = ["load_teacher"]


def load_teacher(teacher: str, checkpoint: str | os.PathLike | None, num_classes: int) -> torch.nn.Module:
    """The teacher in eval mode, its parameters frozen: ``(B, C, H, W)`` -> ``(B, num_classes)`` logits.

    Args:
        teacher: an archspec build directory (``archspec build`` / ``archspec train`` output), or a timm model
            name (``timm.list_models()``), built with ``pretrained=False`` and ``num_classes``.
        checkpoint: the timm model's weights (a ``.pth`` / ``.safetensors`` file, timm ``load_checkpoint``:
            a bare state dict or one under ``state_dict`` / ``model``).

    Raises:
        SpecError: at ``teacher``: an unknown model, a build directory with another class count; at
            ``teacher_checkpoint`` (``checkpoint``, named as :func:`archspec.train.run.fit` names it): missing
            (no downloads), unreadable, or weights that do not fit the model.
    """
    path = Path(teacher).expanduser()
    if path.is_dir():
        model = _from_build(path, num_classes)
    else:
        model = _from_timm(teacher, checkpoint, num_classes)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _from_build(path: Path, num_classes: int) -> torch.nn.Module:
    model = load(path)
    if model.spec.head.num_classes != num_classes:
        raise SpecError.single(("teacher",), f"the teacher has {model.spec.head.num_classes} classes, the data "
                               f"{num_classes}", "train the teacher on the same classes", str(path))
    return model


def _from_timm(name: str, checkpoint, num_classes: int) -> torch.nn.Module:
    if not timm.is_model(name):
        close = timm.list_models(f"*{name.split('.')[0][:8]}*")[:5]
        raise SpecError.single(("teacher",), f"{name!r} is neither a directory nor a timm model",
                               f"timm models like it: {', '.join(close)}" if close else "see timm.list_models()")
    if checkpoint is None:
        raise SpecError.single(("teacher_checkpoint",), f"the teacher {name} needs its weights",
                               "archspec downloads nothing (no pretrained weights from a hub): give "
                               "`teacher_checkpoint` FILE, or an archspec build directory as `teacher`")
    checkpoint = Path(checkpoint).expanduser()
    if not checkpoint.is_file():
        raise SpecError.single(("teacher_checkpoint",), "no such file", None, str(checkpoint))
    model = timm.create_model(name, pretrained=False, num_classes=num_classes)
    try:
        timm.models.load_checkpoint(model, str(checkpoint), strict=True)
    except (RuntimeError, KeyError, ValueError, OSError, EOFError) as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise SpecError.single(("teacher_checkpoint",), f"the weights do not load into {name}: {first}",
                               f"give a checkpoint of {name} with {num_classes} classes", str(checkpoint)) from None
    return model
