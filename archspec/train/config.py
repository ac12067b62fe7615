"""Training settings and the seed papers' recipes (torch-free: the command line reads this module).

:class:`TrainConfig` holds everything one run needs; :data:`RECIPES` are named presets of it:

* ``short`` (``archspec train``'s default): DeiT's optimizer and schedule for 10 epochs (1 of warm-up), label
  smoothing 0.1, crops and flips only -- a first run on a small data set, minutes on a CPU;
* ``proxy``: the settings of the search's short in-memory run (:class:`TrainConfig`'s defaults);
* ``deit``: DeiT's recipe (Touvron et al. 2021, Tab. 9 and its ``main.py`` defaults), which LeViT and MaiT
  train with: AdamW, lr ``5e-4 * batch / 512``, weight decay 0.05, 5 warm-up epochs from 1e-6 then cosine
  to 1e-5, 300 epochs, label smoothing 0.1, RandAugment ``rand-m9-mstd0.5-inc1``, random erasing 0.25,
  Mixup 0.8 / CutMix 1.0 (switch probability 0.5), random-resized crops and flips (timm ``create_transform``);
* ``levit``: ``deit`` with hard distillation through the distillation token and 1000 epochs (LeViT sec. 5.1;
  the teacher, RegNetY-16GF there, is the user's ``--teacher``);
* ``tcnn``: T-CNN's fine-tuning length, 50 epochs (d'Ascoli et al. 2021, sec. 4), on the ``deit`` recipe.

Choices where the papers are silent are named in each recipe's ``why``: DeiT's repository also keeps a
model EMA (decay 0.99996) that its paper does not list; the ``deit`` recipe leaves EMA off (``--ema-decay``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from archspec.errors import SpecError

__all__ = ["AUGMENTATIONS", "AMP_MODES", "PERSISTED_KEYS", "RECIPES", "TrainConfig", "check_config", "recipe"]

AUGMENTATIONS = ("none", "flip", "crop", "flip+crop")  # the in-memory fast path's tensor augmentation
AMP_MODES = ("auto", "bf16", "fp16", "off")  # auto: bf16 autocast on CUDA, none on CPU
# Settings written under another key than their name (TrainConfig.describe: run directories, study attributes,
# reports) and read back under it (TrainConfig.from_dict): ``torch_compile`` was ``compile`` until issue 58
# renamed it, and its key stays, so what was written before reads the same.
PERSISTED_KEYS = {"torch_compile": "compile"}


@dataclass
class TrainConfig:
    """Optimisation settings of one run (units: optimizer steps, epochs of the training set, images).

    Attributes:
        steps: optimizer steps (used when ``epochs`` is ``None``).
        batch_size: images per optimizer step over all processes (each of ``N`` ranks takes ``batch / N``).
        lr: peak learning rate (after warm-up).
        weight_decay: decoupled weight decay (timm ``create_optimizer_v2``: not on 1-d parameters nor
            ``model.no_weight_decay``).
        optimizer: timm optimizer name (``adamw``: betas (0.9, 0.999), eps 1e-8; ``sgd``: Nesterov momentum 0.9).
        warmup_steps: linear warm-up from ``warmup_lr`` to ``lr``; then cosine to ``min_lr`` (timm
            ``create_scheduler_v2``, per update, warm-up as a prefix).
        augmentation: the in-memory fast path's augmentation: ``none``, ``flip``, ``crop`` (pad ``H // 8`` +
            random crop) or ``flip+crop``; streamed data uses ``auto_augment`` / ``reprob`` / the crops of
            timm ``create_transform`` instead.
        eval_every: evaluate val top-1 (and call ``report``) every this many steps, and at the end.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
        epochs: when set, the run length in epochs (``steps = ceil(epochs * batches per epoch)``).
        warmup_epochs: when set (with ``epochs``), the warm-up in epochs instead of ``warmup_steps``.
        warmup_lr: lr at the first step (default ``lr / warmup_steps``).
        min_lr: lr at the end of the cosine.
        layer_decay: timm layer-wise lr decay (``None``: off).
        smoothing: label smoothing (timm ``LabelSmoothingCrossEntropy``; with Mixup, timm's soft targets).
        mixup, cutmix: Beta alphas of timm ``Mixup`` (0: off).
        auto_augment: timm auto-augment policy string, e.g. ``rand-m9-mstd0.5-inc1`` (streamed data).
        reprob: random-erasing probability (streamed data).
        ema_decay: timm ``ModelEmaV3`` decay (``None``: no EMA); the EMA is evaluated beside the model.
        amp: ``auto`` (bf16 autocast on CUDA, off on CPU), ``bf16``, ``fp16`` (with a gradient scaler) or ``off``.
        clip_grad: clip the gradient norm to this (``None``: no clipping).
        torch_compile: ``torch.compile`` the model for training (key ``compile`` in :meth:`describe`).
        workers: DataLoader worker processes (streamed data).
        log_every: a progress line every this many steps.
        checkpoint_every: write the checkpoint every this many steps (``None``: at every eval point).
        distill_alpha: weight of the distillation loss (DeiT hard distillation: 0.5).
    """

    steps: int = 150
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 0.05
    optimizer: str = "adamw"
    warmup_steps: int = 20
    augmentation: str = "flip+crop"
    eval_every: int = 50
    device: str = "cpu"
    epochs: float | None = None
    warmup_epochs: float | None = None
    warmup_lr: float | None = None
    min_lr: float = 0.0
    layer_decay: float | None = None
    smoothing: float = 0.0
    mixup: float = 0.0
    cutmix: float = 0.0
    auto_augment: str | None = None
    reprob: float = 0.0
    ema_decay: float | None = None
    amp: str = "auto"
    clip_grad: float | None = None
    torch_compile: bool = False
    workers: int = 2
    log_every: int = 50
    checkpoint_every: int | None = None
    distill_alpha: float = 0.5

    def describe(self) -> dict:
        """JSON-ready dict of every setting, under its persisted key (:data:`PERSISTED_KEYS`: ``compile``)."""
        return {PERSISTED_KEYS.get(name, name): value for name, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]):
        """The settings of ``data``: a :meth:`describe` dict (persisted keys) or one keyed by field name."""
        names = {key: name for name, key in PERSISTED_KEYS.items()}
        return cls(**{names.get(key, key): value for key, value in data.items()})

    def problems(self) -> list[tuple[str, str]]:
        """``(field, message)`` for every invalid setting (empty when valid)."""
        positive = ("steps", "batch_size", "eval_every", "log_every")
        out = [(name, f"must be at least 1, got {getattr(self, name)}") for name in positive
               if getattr(self, name) < 1]
        nonneg = ("weight_decay", "warmup_steps", "min_lr", "smoothing", "mixup", "cutmix", "reprob", "workers")
        out += [(name, f"must be >= 0, got {getattr(self, name)}") for name in nonneg
                if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0)]
        if not (math.isfinite(self.lr) and self.lr > 0):
            out.append(("lr", f"must be a positive number, got {self.lr}"))
        if self.augmentation not in AUGMENTATIONS:
            out.append(("augmentation", f"must be one of {', '.join(AUGMENTATIONS)}, got {self.augmentation!r}"))
        if self.amp not in AMP_MODES:
            out.append(("amp", f"must be one of {', '.join(AMP_MODES)}, got {self.amp!r}"))
        if self.epochs is not None and not (math.isfinite(self.epochs) and self.epochs > 0):
            out.append(("epochs", f"must be a positive number, got {self.epochs}"))
        if self.warmup_epochs is not None and not (math.isfinite(self.warmup_epochs) and self.warmup_epochs >= 0):
            out.append(("warmup_epochs", f"must be a number >= 0, got {self.warmup_epochs}"))
        if self.warmup_lr is not None and not (math.isfinite(self.warmup_lr) and self.warmup_lr >= 0):
            out.append(("warmup_lr", f"must be a number >= 0, got {self.warmup_lr}"))
        if self.layer_decay is not None and not (math.isfinite(self.layer_decay) and 0 < self.layer_decay <= 1):
            out.append(("layer_decay", f"must be in (0, 1] (each earlier layer's lr is multiplied by it), "
                                       f"got {self.layer_decay}"))
        if self.clip_grad is not None and not (math.isfinite(self.clip_grad) and self.clip_grad > 0):
            out.append(("clip_grad", f"must be a positive number, got {self.clip_grad}"))
        if not 0 <= self.smoothing < 1:
            out.append(("smoothing", f"must be in [0, 1), got {self.smoothing}"))
        out += [(name, f"must be in [0, 1], got {getattr(self, name)}") for name in ("reprob", "distill_alpha")
                if not 0 <= getattr(self, name) <= 1]
        if self.ema_decay is not None and not 0 < self.ema_decay < 1:
            out.append(("ema_decay", f"must be in (0, 1), got {self.ema_decay}"))
        if self.checkpoint_every is not None and self.checkpoint_every < 1:
            out.append(("checkpoint_every", f"must be at least 1, got {self.checkpoint_every}"))
        return out

    def resolved(self, batches_per_epoch: int) -> TrainConfig:
        """The same settings with ``epochs`` / ``warmup_epochs`` turned into steps for ``batches_per_epoch``."""
        if self.epochs is None:
            return self
        steps = max(1, math.ceil(self.epochs * batches_per_epoch))
        warmup = self.warmup_steps if self.warmup_epochs is None else round(self.warmup_epochs * batches_per_epoch)
        return replace(self, steps=steps, warmup_steps=min(warmup, steps - 1), epochs=None, warmup_epochs=None)


def _deit(batch_size: int) -> dict:
    return {"optimizer": "adamw", "lr": 5e-4 * batch_size / 512, "weight_decay": 0.05, "epochs": 300,
            "warmup_epochs": 5, "warmup_lr": 1e-6, "min_lr": 1e-5, "smoothing": 0.1,
            "auto_augment": "rand-m9-mstd0.5-inc1", "reprob": 0.25, "mixup": 0.8, "cutmix": 1.0}


def _short(batch_size: int) -> dict:
    return {"optimizer": "adamw", "lr": 1e-3, "weight_decay": 0.05, "epochs": 10,
            "warmup_epochs": 1, "warmup_lr": 1e-6, "min_lr": 1e-5, "smoothing": 0.1}


RECIPES = {  # name -> (settings for a batch size, where they come from)
    "short": (_short, "archspec's default: AdamW lr 1e-3 on DeiT's schedule, 10 epochs (1 of warm-up), smoothing 0.1, "
                      "crops and flips only (no RandAugment, erasing or Mixup): a first run on a small data set"),
    "proxy": (lambda b: {}, "the search's proxy settings (TrainConfig's defaults)"),
    "deit": (_deit, "DeiT (Touvron et al. 2021) Tab. 9: AdamW 5e-4*B/512, wd 0.05, 300 epochs, warm-up 5, "
                    "smoothing 0.1, RandAugment m9, random erasing 0.25, Mixup 0.8, CutMix 1.0; no EMA"),
    "levit": (lambda b: {**_deit(b), "epochs": 1000},
              "LeViT (Graham et al. 2021) sec. 5.1: DeiT's recipe, 1000 epochs, hard distillation (--teacher)"),
    "tcnn": (lambda b: {**_deit(b), "epochs": 50},
             "T-CNN (d'Ascoli et al. 2021) sec. 4: 50 epochs of fine-tuning on DeiT's recipe"),
}


def recipe(name: str, batch_size: int = 32, **overrides) -> TrainConfig:
    """The :class:`TrainConfig` of recipe ``name`` at ``batch_size``, with ``overrides`` (``None`` values skipped).

    Raises:
        KeyError: an unknown recipe name.
        TypeError: an unknown setting name.
    """
    settings, _ = RECIPES[name]
    known = {f.name for f in fields(TrainConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown training settings: {', '.join(unknown)}")
    chosen = {**settings(batch_size), "batch_size": batch_size,
              **{k: v for k, v in overrides.items() if v is not None}}
    return TrainConfig(**chosen)


def check_config(config: TrainConfig) -> None:
    """Raise on the first invalid setting of ``config``, named as its field (``archspec train`` names the option).

    Raises:
        SpecError: at ``config.<setting>`` (e.g. ``config.warmup_epochs: must be a number >= 0, got -2.0``).
    """

    problems = config.problems()
    if problems:
        name, message = problems[0]
        raise SpecError.single(("config", name), message)
