"""Why a model could not be trained: :class:`TrainingFailure` (NaN/inf loss, an exception inside the model, out of
memory), raised by the training loop and its batch sources and reported by the search as a failed trial.
Torch-free, so the search's engine imports it at the top.

The class was named ``TrialFailure`` before issue 58; the failure reasons a study stores still name it so
(:func:`stored_name`), so studies written before and after the rename read alike."""

from __future__ import annotations

import sys

__all__ = ["STORED_NAME", "TrainingFailure", "failure", "stored_name"]

# the name stored failure reasons give a TrainingFailure (its class name before issue 58's rename), kept as written
STORED_NAME = "TrialFailure"


class TrainingFailure(Exception):
    """A model that cannot be trained: NaN/inf loss, an exception inside the model, out of memory."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def failure(exc: BaseException, where: str) -> TrainingFailure:
    """A :class:`TrainingFailure` naming an exception raised ``where`` (out of memory told apart).  Torch-free: a
    ``torch.OutOfMemoryError`` exists only once torch is imported, so torch is looked up, never imported."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    torch = sys.modules.get("torch")
    torch_oom = torch is not None and isinstance(exc, torch.OutOfMemoryError)
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower() or torch_oom:
        return TrainingFailure(f"out of memory {where}: {text[:300]}")
    return TrainingFailure(f"{type(exc).__name__} {where}: {text[:300]}")


def stored_name(exc: BaseException) -> str:
    """The exception's name in a stored failure reason (``"<name>: <message>"``): its class name, except
    :data:`STORED_NAME` for a :class:`TrainingFailure`."""
    return STORED_NAME if isinstance(exc, TrainingFailure) else type(exc).__name__
