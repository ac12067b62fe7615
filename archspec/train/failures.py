"""Why a model could not be trained: :class:`TrialFailure` (NaN/inf loss, an exception inside the model, out of
memory), raised by the training loop and its batch sources and reported by the search as a failed trial.
Torch-free, so the search's engine imports it at the top."""

from __future__ import annotations

import sys

__all__ = ["TrialFailure", "failure"]


class TrialFailure(Exception):
    """A model that cannot be trained: NaN/inf loss, an exception inside the model, out of memory."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def failure(exc: BaseException, where: str) -> TrialFailure:
    """A :class:`TrialFailure` naming an exception raised ``where`` (out of memory told apart).  Torch-free: a
    ``torch.OutOfMemoryError`` exists only once torch is imported, so torch is looked up, never imported."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    torch = sys.modules.get("torch")
    torch_oom = torch is not None and isinstance(exc, torch.OutOfMemoryError)
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower() or torch_oom:
        return TrialFailure(f"out of memory {where}: {text[:300]}")
    return TrialFailure(f"{type(exc).__name__} {where}: {text[:300]}")
