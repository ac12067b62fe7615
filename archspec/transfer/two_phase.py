"""CMHSA's two-phase training pipeline (Li et al., sec. 4.1, Fig. 1, App. B): train the convolutional ViT
(phase 1), transfer it into multi-head self-attention by App. A.2's construction (:func:`conv_to_mhsa`), and
continue training (phase 2); optionally train the phase-2 architecture from random initialisation for the
same total number of steps (Tab. 1's "CMHSA (2nd phase)" baseline).  Both phases and the baseline use
:func:`archspec.train.train`, the package's one training loop.

The paper: 200 + 200 epochs, AdamW (betas 0.9, 0.999, eps 1e-8), 5 warm-up epochs then cosine decay, peak lr
{1,3,5}e-4 (phase 1) and {1,3,5,7}e-5 (phase 2), batch 128; phase 2 may drop the warm-up (sec. 4.3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import TensorDataset

from archspec.io.datasets import Dataset
from archspec.nn.compiler import compile as compile_spec
from archspec.spec import ArchSpec
from archspec.train import TrainConfig, TrainResult, evaluate, resolve_device, train
from archspec.transfer.cmhsa import DEFAULT_PEAK, attention_spec, conv_to_mhsa

__all__ = ["TwoPhaseResult", "fit_to_data", "match_channels", "two_phase"]


@dataclass
class TwoPhaseResult:
    """The trained models and the figures: ``report`` is JSON-ready (accuracies 0..1, seconds)."""

    phase1: torch.nn.Module
    phase2: torch.nn.Module
    baseline: torch.nn.Module | None
    report: dict[str, Any] = field(default_factory=dict)


def fit_to_data(spec: ArchSpec, data: Any) -> ArchSpec:
    """``spec`` with the data's channels, image size and number of classes (the architecture is unchanged)."""
    doc = spec.model_dump(mode="json")
    doc["input"] = {"channels": data.channels, "resolution": [data.image_size, data.image_size]}
    doc["head"]["num_classes"] = data.num_classes
    return ArchSpec.model_validate(doc)


def match_channels(data: Any, channels: int) -> Any:
    """``data`` with ``channels`` image channels: grey images repeated to 3 (as the built-in digits are), so a
    3-channel spec runs on Fashion-MNIST; any other mismatch is returned unchanged (the spec's check names it)."""


    if data.channels != 1 or channels != 3:
        return data
    rgb = [TensorDataset(split.tensors[0].expand(-1, 3, -1, -1).contiguous(), split.tensors[1])
           for split in (data.train, data.val)]
    return Dataset(name=data.name + " (grey as RGB)", train=rgb[0], val=rgb[1], num_classes=data.num_classes,
                   channels=3, image_size=data.image_size)


def _summary(result: TrainResult) -> dict[str, Any]:
    return {"accuracy": result.accuracy, "val_loss": result.val_loss, "train_loss": result.train_loss,
            "steps": result.steps, "seconds": round(result.seconds, 2),
            "history": [{"step": s, "accuracy": a, "train_loss": loss} for s, a, loss in result.history]}


def _compile_seeded(spec: ArchSpec, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return compile_spec(spec.model_copy(update={"seed": seed}))


def two_phase(conv_spec: ArchSpec, data: Any, phase1: TrainConfig, phase2: TrainConfig, peak: float = DEFAULT_PEAK,
              seed: int = 0, baseline: bool = True, progress: bool = False) -> TwoPhaseResult:
    """Run the two-phase pipeline on ``data`` (an :class:`archspec.io.datasets.Dataset`).

    Args:
        conv_spec: a phase-1 spec (``mixer: conv<K>``), adapted to the data by :func:`fit_to_data`.
        phase1, phase2: the two runs' settings (the baseline uses ``phase2``'s for
            ``phase1.steps + phase2.steps`` steps, with ``phase1``'s warm-up, as a random init needs it).
        peak: Lemma 2's M for the transfer.
        seed: initial weights, batch order and augmentation of every run.
        baseline: also train the phase-2 architecture from random initialisation.
        progress: print each run's progress lines on stderr (:func:`archspec.train.train`).

    Returns:
        :class:`TwoPhaseResult` whose report holds ``phase1``, ``transfer`` (val top-1 of the transferred model
        at step 0, which equals phase 1's, and the max logit difference on the val set), ``phase2`` and
        ``baseline`` figures.

    Raises:
        TransferError: the spec has no conv mixer or cannot be transferred.
        TrainingFailure: a run diverged or failed inside the model.
    """
    spec = fit_to_data(conv_spec, data)
    device = resolve_device(phase1.device)
    with torch.random.fork_rng(devices=[]):
        conv_model = _compile_seeded(spec, seed)
        label = (lambda name: name) if progress else (lambda name: None)
        first = train(conv_model, data, phase1, seed=seed, progress=label("phase 1"))
        attn_model = conv_to_mhsa(conv_model, peak=peak)
        step0 = evaluate(attn_model, data, device=device)
        logit_error = _max_logit_error(conv_model, attn_model, data, device)
        second = train(attn_model, data, phase2, seed=seed + 1, progress=label("phase 2"))
        base_model, base = None, None
        if baseline:
            base_model = _compile_seeded(attention_spec(spec), seed)
            steps = phase1.steps + phase2.steps
            base_config = TrainConfig.from_dict({**phase2.describe(), "steps": steps,
                                                 "warmup_steps": phase1.warmup_steps})
            base = train(base_model, data, base_config, seed=seed, progress=label("baseline"))
    report = {
        "data": data.describe(), "seed": seed, "peak": peak,
        "phase1_spec": spec.name, "phase2_spec": attn_model.spec.name,
        "phase1": {**_summary(first), "config": phase1.describe()},
        "transfer": {"accuracy_step0": step0[0], "val_loss_step0": step0[1], "max_logit_error": logit_error},
        "phase2": {**_summary(second), "config": phase2.describe()},
        "baseline": None if base is None else {**_summary(base), "config": base_config.describe()},
    }
    return TwoPhaseResult(phase1=conv_model, phase2=attn_model, baseline=base_model, report=report)


@torch.no_grad()
def _max_logit_error(a: torch.nn.Module, b: torch.nn.Module, data: Any, device: torch.device) -> float:
    """Largest |logit difference| of two models on (up to 256 images of) the val split, in fp32."""
    images = data.val.tensors[0][:256].to(device)
    a.eval(), b.eval()
    return (a(images) - b(images)).abs().max().item()
