"""The one training loop of archspec: ``archspec train``, the search's proxy, ``two-phase`` and T-CNN fine-tuning
all run :func:`run_steps` through a :class:`Trainer`.

The parts are timm's and torch's: ``create_optimizer_v2`` (weight-decay groups, layer decay),
``create_scheduler_v2`` (linear warm-up then cosine, stepped per update), ``Mixup`` / ``SoftTargetCrossEntropy``
/ ``LabelSmoothingCrossEntropy``, ``ModelEmaV3``, ``dispatch_clip_grad``, ``torch.autocast`` (bf16 on CUDA, or
fp16 with ``torch.amp.GradScaler``) and ``torch.compile``.  Batches come from a batch source
(:mod:`archspec.train.batches`: the in-memory fast path or a streaming ``DataLoader``); :func:`train` is the
fast path's entry point, :func:`archspec.train.run.fit` the streaming one.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, dispatch_clip_grad

from archspec.diagnostics.devices import parse_device
from archspec.errors import SpecError
from archspec.train.batches import TensorBatches
from archspec.train.config import AUGMENTATIONS, TrainConfig
from archspec.train.failures import TrainingFailure, failure
from archspec.train.progress import Progress
from archspec.train.stop import check

if TYPE_CHECKING:
    from archspec.io.datasets import Dataset

__all__ = ["TrainResult", "Trainer", "TrainingFailure", "evaluate", "failure", "resolve_device", "run_steps", "train",
           "PROGRESS_SECONDS"]

#: With a ``progress`` label, :func:`train` prints a line at least this often (seconds), not only every
#: ``log_every`` steps: a search's proxy (or a mask round) that takes minutes shows its pace from the start.
PROGRESS_SECONDS = 10.0


@dataclass
class TrainResult:
    """Outcome of a run: final val top-1 (0..1), val loss, mean train loss of the last 20 steps, and
    ``history`` = ``(step, val top-1, mean train loss since the previous eval point)`` per eval point;
    ``loss_sum``: the sum of every step's training loss this run trained (TSE, Ru et al. 2021, "Speedy
    Performance Estimation for Neural Architecture Search"; from the resumed step on, for a resumed run)."""

    accuracy: float
    val_loss: float
    train_loss: float
    steps: int
    seconds: float
    history: list[tuple[int, float, float]] = field(default_factory=list)
    ema_accuracy: float | None = None
    loss_sum: float = math.nan


def resolve_device(name: str) -> torch.device:
    """``auto`` -> ``cuda`` when available else ``cpu``; otherwise ``torch.device(name)``
    (:func:`archspec.diagnostics.devices.parse_device`, which the timing shares).

    Raises:
        ValueError: an unknown device name, or CUDA asked for but not available.
    """

    try:
        return parse_device(name)
    except SpecError as exc:
        raise ValueError(exc.problems[0].message) from None


def autocast_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``amp`` on ``device`` (``None``: full precision)."""
    if amp == "off" or (amp == "auto" and device.type != "cuda"):
        return None
    return torch.float16 if amp == "fp16" else torch.bfloat16


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Any, batch: int = 256, device: str | torch.device = "cpu",
             amp: str = "auto", reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[float, float]:
    """Val top-1 (0..1) and mean cross-entropy of ``model`` in eval mode (restored after).

    ``data``: an in-memory :class:`archspec.io.datasets.Dataset` (its ``val`` tensors) or an iterable of ``(x, y)``
    batches (a ``DataLoader`` of ``(B, C, H, W)`` images and labels).  ``reduce`` sums the
    ``[correct, loss sum, count]`` tensor over processes (``torch.distributed``).
    """
    device = torch.device(device)
    dtype = autocast_dtype(amp, device)
    was = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64)

    for x, y in _val_batches(data, batch):
        check()  # a SIGTERM to `archspec train` stops a long evaluation too (archspec.train.stop)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(x).float()
        totals += torch.tensor([(logits.argmax(dim=1) == y).sum().item(),
                                F.cross_entropy(logits, y, reduction="sum").item(), len(y)], dtype=torch.float64)
    model.train(was)
    if reduce is not None:
        totals = reduce(totals)
    n = max(totals[2].item(), 1)
    return totals[0].item() / n, totals[1].item() / n


def _val_batches(data: Any, batch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if hasattr(data, "val") and hasattr(data.val, "tensors"):
        images, labels = data.val.tensors
        for start in range(0, len(labels), batch):
            yield images[start:start + batch], labels[start:start + batch]
    else:
        yield from data


# torch's Adam/AdamW with ``fused=True``: one kernel over all parameters instead of ``foreach``'s per-op passes
# (on CPU 5x faster per step on levit_128s's 7.8 M parameters, 5.6-6.2 against 27.5-29.1 ms on two threads,
# `python bench/train_throughput.py --optimizer-cost 20 --repeats 4 --threads 2`: the same update
# rule, summed in another order, so weights differ from ``foreach`` in the last bits).  Deterministic, so
# ``--resume`` stays bit-exact; timm passes the keyword through to torch's class.
_FUSED_OPTIMIZERS = ("adam", "adamw")


def _fused(optimizer: str, device: torch.device) -> dict[str, bool]:
    """``{"fused": True}`` for torch's Adam/AdamW on CPU or CUDA (torch ``optim.AdamW(fused=True)``), else ``{}``."""
    return {"fused": True} if optimizer.lower() in _FUSED_OPTIMIZERS and device.type in ("cpu", "cuda") else {}


class Trainer:
    """One model's optimisation state and its step: optimizer, schedule, EMA, gradient scaler, loss.

    Args:
        model: the module to train (wrapped by ``ddp`` when given; the EMA and checkpoints use the bare module).
        config: the settings (``steps`` already resolved from epochs).
        param_groups: optimizer parameter groups (each may carry its own ``lr``, e.g. T-CNN's gating);
            default: timm's weight-decay groups of ``model``.
        num_classes: for Mixup's soft targets.
        teacher: a distillation teacher (DeiT hard distillation; ``model`` must return ``(cls, dist)``
            logits in train mode, :meth:`archspec.nn.model.ArchModel.set_distilled_training`).
        wrap: ``f(model) -> module`` applied after the optimizer is built (DistributedDataParallel).

    Raises:
        ValueError: an unknown optimizer or augmentation.
    """

    def __init__(self, model: torch.nn.Module, config: TrainConfig, device: torch.device, *,
                 param_groups: list[dict] | None = None, num_classes: int | None = None,
                 teacher: torch.nn.Module | None = None,
                 wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None):
        self.config, self.device, self.module = config, device, model.to(device).train()
        self.optimizer = create_optimizer_v2(param_groups if param_groups is not None else model,
                                             opt=config.optimizer, lr=config.lr, weight_decay=config.weight_decay,
                                             layer_decay=config.layer_decay, **_fused(config.optimizer, device))
        warmup = min(config.warmup_steps, config.steps - 1)
        self.scheduler, _ = create_scheduler_v2(
            self.optimizer, sched="cosine", num_epochs=config.steps - warmup, warmup_epochs=warmup,
            warmup_prefix=True,
            warmup_lr=config.warmup_lr if config.warmup_lr is not None else config.lr / max(warmup, 1),
            min_lr=config.min_lr, updates_per_epoch=1, step_on_epochs=False)
        self.dtype = autocast_dtype(config.amp, device)
        self.scaler = torch.amp.GradScaler(device.type) if self.dtype == torch.float16 else None
        self.ema = None
        if config.ema_decay is not None:
            self.ema = ModelEmaV3(model, decay=config.ema_decay)
        self.mixup = _mixup(config, num_classes)
        self.teacher = teacher.to(device).eval() if teacher is not None else None
        self.model = wrap(model) if wrap is not None else model
        self.forward = torch.compile(self.model) if config.torch_compile else self.model

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The training loss of batch ``x`` ``(B, C, H, W)``, ``y`` ``(B,)``: cross-entropy (label-smoothed, or
        soft-target under Mixup/CutMix), plus DeiT's hard distillation (Touvron et al. 2021, sec. 5:
        ``(1 - a) CE(cls, y) + a CE(dist, argmax teacher(x))``) when a teacher is set."""
        target = y
        if self.mixup is not None:
            x, target = self.mixup(x, y)
        with torch.autocast(self.device.type, dtype=self.dtype or torch.bfloat16, enabled=self.dtype is not None):
            out = self.forward(x)
            if self.teacher is None:
                return _base_loss(_first(out).float(), target, self.config.smoothing)
            with torch.no_grad():
                teacher_labels = self.teacher(x).argmax(dim=1)
        cls, dist = out
        alpha = self.config.distill_alpha
        return ((1 - alpha) * _base_loss(cls.float(), target, self.config.smoothing)
                + alpha * F.cross_entropy(dist.float(), teacher_labels))

    def step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> torch.Tensor:
        """One optimizer step (the ``step``-th, 1-based); returns the detached loss.

        Raises:
            TrainingFailure: a NaN/inf loss (checked at once on CPU, where it costs no sync) or an exception
                inside the model (out of memory told apart).
        """
        try:
            loss = self.loss(x, y)
            if self.device.type == "cpu" and not torch.isfinite(loss):
                raise TrainingFailure(f"loss became {loss.item()} at step {step}")
            self.optimizer.zero_grad(set_to_none=True)
            self._backward(loss)
        except TrainingFailure:
            raise
        except (RuntimeError, ValueError, MemoryError, IndexError) as exc:
            raise failure(exc, f"at step {step}") from None
        if self.ema is not None:
            self.ema.update(self.module, step=step)
        self.scheduler.step_update(num_updates=step)
        return loss.detach()

    def _backward(self, loss: torch.Tensor) -> None:
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            if self.config.clip_grad is not None:
                self.scaler.unscale_(self.optimizer)
                dispatch_clip_grad(params, self.config.clip_grad)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return
        loss.backward()
        if self.config.clip_grad is not None:
            dispatch_clip_grad(params, self.config.clip_grad)
        self.optimizer.step()

    def lr(self) -> float:
        """The current learning rate of the first parameter group."""
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self) -> dict:
        """Model, EMA, optimizer, scheduler and scaler states (for :mod:`archspec.train.checkpoint`)."""
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "ema": self.ema.state_dict() if self.ema is not None else None,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output."""
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.load_state_dict(state["ema"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])


def _first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def _base_loss(logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:
    if target.dim() == 2:  # Mixup / CutMix soft targets (smoothing already in them)
        return SoftTargetCrossEntropy()(logits, target)
    if smoothing > 0:
        return LabelSmoothingCrossEntropy(smoothing)(logits, target)
    return F.cross_entropy(logits, target)


def _mixup(config: TrainConfig, num_classes: int | None):
    if not (config.mixup > 0 or config.cutmix > 0):
        return None

    return Mixup(mixup_alpha=config.mixup, cutmix_alpha=config.cutmix, label_smoothing=config.smoothing,
                 num_classes=num_classes or 1000)


@dataclass
class Hooks:
    """Callbacks of :func:`run_steps`: ``report(step, accuracy)`` at each eval point (may raise, e.g.
    ``optuna.TrialPruned``); ``before_step(step)`` (reseeding); ``on_step(step, loss)`` after each step
    (progress); ``on_eval(step, record)``
    after each evaluation (logs, checkpoints)."""

    report: Callable[[int, float], None] | None = None
    before_step: Callable[[int], None] | None = None
    on_step: Callable[[int, torch.Tensor], None] | None = None
    on_eval: Callable[[int, dict], None] | None = None


def run_steps(trainer: Trainer, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], evaluate_fn: Callable[[], dict],
              *, start: int = 0, hooks: Hooks | None = None) -> TrainResult:
    """Steps ``start + 1 .. config.steps`` of ``trainer`` on ``batches``; evaluation every ``eval_every`` steps and
    at the end (``evaluate_fn() -> {"accuracy", "val_loss", ...}``).

    Raises:
        TrainingFailure: NaN/inf loss, an exception inside the model or the evaluation.
    """
    hooks = hooks or Hooks()
    config, start_time = trainer.config, time.perf_counter()
    losses: list[torch.Tensor] = []  # detached per-step losses since the last eval point (read back there)
    recent: list[float] = []
    loss_sum = 0.0  # TSE: every step's training loss, summed at the eval points (no extra host sync)
    history: list[tuple[int, float, float]] = []
    record: dict = {}
    for step in range(start + 1, config.steps + 1):
        if hooks.before_step is not None:
            hooks.before_step(step)
        x, y = next(batches)
        losses.append(trainer.step(x, y, step))
        if hooks.on_step is not None:
            hooks.on_step(step, losses[-1])
        if step % config.eval_every and step != config.steps:
            continue
        since = torch.stack(losses).float().cpu()  # the only host sync of the steps in between
        losses = []
        if not torch.isfinite(since).all():
            raise TrainingFailure(f"loss became {since[~torch.isfinite(since)][0].item()} by step {step}")
        recent = (recent + since.tolist())[-20:]
        loss_sum += float(since.double().sum())
        try:
            record = {"step": step, "train_loss": since.mean().item(), "lr": trainer.lr(), **evaluate_fn(),
                      "loss_sum": loss_sum}
        except (RuntimeError, ValueError, MemoryError) as exc:
            raise failure(exc, f"while evaluating at step {step}") from None
        if not math.isfinite(record["val_loss"]):
            raise TrainingFailure(f"validation loss became {record['val_loss']} at step {step}")
        history.append((step, record["accuracy"], record["train_loss"]))
        if hooks.report is not None:
            hooks.report(step, record["accuracy"])
        if hooks.on_eval is not None:
            hooks.on_eval(step, record)
    trainer.module.eval()
    if not record:  # resumed at the end: nothing left to run
        record = {"accuracy": math.nan, "val_loss": math.nan}
    return TrainResult(accuracy=record["accuracy"], val_loss=record["val_loss"],
                       train_loss=sum(recent) / len(recent) if recent else math.nan, steps=config.steps,
                       seconds=time.perf_counter() - start_time, history=history,
                       ema_accuracy=record.get("ema_accuracy"), loss_sum=loss_sum if record.get("step") else math.nan)


def train(model: torch.nn.Module, data: Dataset, config: TrainConfig, seed: int = 0,
          report: Callable[[int, float], None] | None = None,
          param_groups: list[dict] | None = None, progress: str | None = None,
          on_eval: Callable[[int, dict], None] | None = None) -> TrainResult:
    """The in-memory fast path: train ``model`` in place on ``data.train`` for ``config.steps`` steps; ``model``
    ends in eval mode on ``config.device``.  Batches: ``(B, C, H, W)`` images, integer labels, cross-entropy
    on ``(B, classes)``.

    Deterministic given ``seed``, the model's initial weights, the thread count and the device (batch order
    and augmentation come from a CPU generator seeded with ``seed``: :class:`archspec.train.batches.TensorBatches`;
    dropout uses torch's global RNG, which the caller seeds).

    Args:
        report: called as ``report(step, val_accuracy)`` at every eval point; may raise (e.g.
            ``optuna.TrialPruned``), which propagates.
        param_groups: optimizer parameter groups (each may carry its own ``lr``, e.g. T-CNN's gating); the
            schedule scales every group's lr by the same factor.  Default: timm's weight-decay groups.
        progress: a label to print progress lines under (every ``config.log_every`` steps, after
            :data:`PROGRESS_SECONDS` without one, and each evaluation, on stderr:
            :class:`archspec.train.progress.Progress`); ``None``: silent.
        on_eval: called as ``on_eval(step, record)`` after ``report`` at every eval point; ``record`` holds
            ``accuracy``, ``val_loss``, ``train_loss`` (the mean over the steps since the previous eval point),
            ``loss_sum`` (every step's training loss so far, summed: TSE) and ``lr``.  It may raise, like ``report``.

    Raises:
        TrainingFailure: empty training set, NaN/inf loss, an exception inside the model, out of memory.
        ValueError: an unknown device or augmentation.
    """

    if config.augmentation not in AUGMENTATIONS:
        raise ValueError(f"augmentation must be one of {', '.join(AUGMENTATIONS)}, got {config.augmentation!r}")
    device = resolve_device(config.device)
    batches = TensorBatches(data.train, config.batch_size, config.augmentation, seed, device)
    trainer = Trainer(model, config, device, param_groups=param_groups, num_classes=data.num_classes)

    def evaluate_fn() -> dict:
        accuracy, val_loss = evaluate(model, data, device=device, amp=config.amp)
        return {"accuracy": accuracy, "val_loss": val_loss}

    hooks = Hooks(report=report, on_eval=on_eval)
    if progress is not None:


        shown = Progress(config.steps, 0, batches.batch, log_every=config.log_every, bar=False, stream=sys.stderr,
                         label=progress, log_seconds=PROGRESS_SECONDS)
        hooks.on_step = lambda step, loss: shown.on_step(step, loss, trainer.lr())

        def show_and_call(step: int, record: dict) -> None:
            shown.on_eval(record)
            if on_eval is not None:
                on_eval(step, record)

        hooks.on_eval = show_and_call
    return run_steps(trainer, iter(batches), evaluate_fn, hooks=hooks)
