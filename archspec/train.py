"""The one training loop of archspec: the search's proxy trainer, the CMHSA two-phase pipeline and anything
else that trains call :func:`train`.

AdamW (or any optimizer name timm's ``create_optimizer_v2`` knows, honouring ``model.no_weight_decay``),
linear warm-up then cosine decay to 0 per optimizer step, seeded epoch permutations and seeded augmentation,
val top-1 every ``eval_every`` steps.  On CUDA the data set is moved to the device once, the forward runs
under bf16 autocast, and the loss is read back only at the eval points (no per-step host sync).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from archspec.data import Dataset

__all__ = ["AUGMENTATIONS", "TrainConfig", "TrainResult", "TrialFailure", "evaluate", "resolve_device", "train"]

AUGMENTATIONS = ("none", "flip", "crop", "flip+crop")


class TrialFailure(Exception):
    """A model that cannot be trained: NaN/inf loss, an exception inside the model, out of memory."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass
class TrainConfig:
    """Optimisation settings of one run (units: optimizer steps and images).

    Attributes:
        steps: optimizer steps.
        batch_size: images per step.
        lr: peak learning rate (after warm-up).
        weight_decay: decoupled weight decay (not on 1-d parameters nor ``model.no_weight_decay``).
        optimizer: timm optimizer name (``adamw``: torch defaults betas (0.9, 0.999), eps 1e-8).
        warmup_steps: linear warm-up from ``lr / warmup_steps``; 0 = none.
        augmentation: ``none``, ``flip``, ``crop`` (pad ``size // 8`` + random crop) or ``flip+crop``.
        eval_every: evaluate val top-1 (and call ``report``) every this many steps, and at the end.
        device: ``auto`` (CUDA when available), ``cpu``, ``cuda`` or ``cuda:N``.
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

    def describe(self) -> dict:
        """JSON-ready dict of every setting."""
        return asdict(self)


@dataclass
class TrainResult:
    """Outcome of :func:`train`: final val top-1 (0..1), val loss, mean train loss of the last 20 steps,
    and ``history`` = ``(step, val top-1, mean train loss since the previous eval point)`` per eval point."""

    accuracy: float
    val_loss: float
    train_loss: float
    steps: int
    seconds: float
    history: list[tuple[int, float, float]] = field(default_factory=list)


def resolve_device(name: str) -> torch.device:
    """``auto`` -> ``cuda`` when available else ``cpu``; otherwise ``torch.device(name)``
    (:func:`archspec.timing.parse_device`, which the timing shares).

    Raises:
        ValueError: an unknown device name, or CUDA asked for but not available.
    """
    from archspec.errors import SpecError  # noqa: PLC0415
    from archspec.timing import parse_device  # noqa: PLC0415

    try:
        return parse_device(name)
    except SpecError as exc:
        raise ValueError(exc.problems[0].message) from None


def augment(x: torch.Tensor, mode: str, gen: torch.Generator) -> torch.Tensor:
    """Seeded random crop (zero pad ``H // 8``) and/or horizontal flip of ``(B, C, H, W)``; random numbers come
    from ``gen`` (a CPU generator) so a run is reproducible on any device."""
    b, _, h, w = x.shape
    if "crop" in mode:
        pad = max(h // 8, 1)
        padded = F.pad(x, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (b,), generator=gen).to(x.device)
        dx = torch.randint(0, 2 * pad + 1, (b,), generator=gen).to(x.device)
        rows = torch.arange(h, device=x.device)[None, :] + dy[:, None]  # (B, h)
        cols = torch.arange(w, device=x.device)[None, :] + dx[:, None]  # (B, w)
        x = padded[torch.arange(b, device=x.device)[:, None, None, None],
                   torch.arange(x.shape[1], device=x.device)[None, :, None, None],
                   rows[:, None, :, None], cols[:, None, None, :]]
    if "flip" in mode:
        flip = (torch.rand(b, generator=gen) < 0.5).to(x.device)
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    return x


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Dataset, batch: int = 256,
             device: str | torch.device = "cpu") -> tuple[float, float]:
    """Val top-1 (0..1) and mean cross-entropy of ``model`` on ``data.val``, in eval mode (restored after)."""
    device = torch.device(device)
    was = model.training
    model.eval()
    correct, loss_sum, n = 0, 0.0, 0
    images, labels = data.val.tensors
    for start in range(0, len(labels), batch):
        x, y = images[start:start + batch].to(device), labels[start:start + batch].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(x).float()
        loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(dim=1) == y).sum().item()
        n += len(y)
    model.train(was)
    return correct / max(n, 1), loss_sum / max(n, 1)


def failure(exc: BaseException, where: str) -> TrialFailure:
    """A :class:`TrialFailure` naming an exception raised ``where`` (out of memory told apart)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower() or isinstance(exc, torch.OutOfMemoryError):
        return TrialFailure(f"out of memory {where}: {text[:300]}")
    return TrialFailure(f"{type(exc).__name__} {where}: {text[:300]}")


def warmup_cosine(warmup: int, total: int) -> Callable[[int], float]:
    """LR factor of step ``s`` (0-based): ``(s + 1) / warmup`` during warm-up, then cosine from 1 to 0."""
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(total - warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return factor


def train(model: torch.nn.Module, data: Dataset, config: TrainConfig, seed: int = 0,
          report: Callable[[int, float], None] | None = None,
          param_groups: list[dict] | None = None) -> TrainResult:
    """Train ``model`` in place on ``data.train`` for ``config.steps`` steps; ``model`` ends in eval mode on
    ``config.device``.  Batches: ``(B, C, H, W)`` images, integer labels, cross-entropy on ``(B, classes)``.

    Deterministic given ``seed``, the model's initial weights, the thread count and the device (batch order
    and augmentation come from a CPU generator seeded with ``seed``; dropout uses torch's global RNG, which
    the caller seeds).

    Args:
        report: called as ``report(step, val_accuracy)`` at every eval point; may raise (e.g.
            ``optuna.TrialPruned``), which propagates.
        param_groups: optimizer parameter groups (each may carry its own ``lr``, e.g. T-CNN's gating); the
            schedule scales every group's lr by the same factor.  Default: timm's weight-decay groups.

    Raises:
        TrialFailure: empty training set, NaN/inf loss, an exception inside the model, out of memory.
        ValueError: an unknown device or augmentation.
    """
    from timm.optim import create_optimizer_v2  # noqa: PLC0415

    if config.augmentation not in AUGMENTATIONS:
        raise ValueError(f"augmentation must be one of {', '.join(AUGMENTATIONS)}, got {config.augmentation!r}")
    device = resolve_device(config.device)
    start_time = time.perf_counter()
    images, labels = data.train.tensors
    n_train = len(labels)
    if n_train == 0:
        raise TrialFailure("the training set is empty")
    images, labels = images.to(device), labels.to(device)  # once: no host-to-device copy per step
    model.to(device).train()
    optimizer = create_optimizer_v2(param_groups if param_groups is not None else model, opt=config.optimizer,
                                    lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(config.warmup_steps, config.steps))
    gen = torch.Generator().manual_seed(seed)
    order, cursor = torch.randperm(n_train, generator=gen), 0
    batch = min(config.batch_size, n_train)
    losses: list[torch.Tensor] = []  # detached per-step losses since the last eval point (read back there)
    recent: list[float] = []  # the last 20 step losses, for TrainResult.train_loss
    history: list[tuple[int, float, float]] = []
    for step in range(1, config.steps + 1):
        if cursor + batch > n_train:
            order, cursor = torch.randperm(n_train, generator=gen), 0
        idx = order[cursor:cursor + batch].to(device)
        cursor += batch
        x = augment(images[idx], config.augmentation, gen) if config.augmentation != "none" else images[idx]
        losses.append(_step(model, optimizer, x, labels[idx], step, device))
        scheduler.step()
        if step % config.eval_every == 0 or step == config.steps:
            since = torch.stack(losses).float().cpu()  # the only host sync of the steps in between
            losses = []
            if not torch.isfinite(since).all():
                raise TrialFailure(f"loss became {since[~torch.isfinite(since)][0].item()} by step {step}")
            recent = (recent + since.tolist())[-20:]
            try:
                accuracy, val_loss = evaluate(model, data, device=device)
            except (RuntimeError, ValueError, MemoryError) as exc:
                raise failure(exc, f"while evaluating at step {step}") from None
            if not math.isfinite(val_loss):
                raise TrialFailure(f"validation loss became {val_loss} at step {step}")
            history.append((step, accuracy, since.mean().item()))
            if report is not None:
                report(step, accuracy)
    model.eval()
    return TrainResult(accuracy=history[-1][1], val_loss=val_loss, train_loss=sum(recent) / len(recent),
                       steps=config.steps, seconds=time.perf_counter() - start_time, history=history)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, step: int,
          device: torch.device) -> torch.Tensor:
    """One optimizer step; returns the detached loss.  On CPU a NaN/inf loss fails at once (no sync cost)."""
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = F.cross_entropy(model(x).float(), y)
        if device.type == "cpu" and not torch.isfinite(loss):
            raise TrialFailure(f"loss became {loss.item()} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    except TrialFailure:
        raise
    except (RuntimeError, ValueError, MemoryError, IndexError) as exc:
        raise failure(exc, f"at step {step}") from None
    return loss.detach()
