"""Checkpoints: everything a killed run needs to continue bit-for-bit, written atomically.

A checkpoint holds the step, the :class:`~archspec.train.loop.Trainer` state (model, EMA, optimizer, scheduler,
gradient scaler), the batch source's position, and the RNG states of torch (CPU and every CUDA device),
numpy and Python -- so dropout, drop-path and Mixup draw what an uninterrupted run would draw.  It is written
to a temporary file in the same directory, flushed to disk, then renamed over the previous one
(``os.replace``): at every instant the file is the old or the new complete checkpoint.  It loads with
``torch.load(weights_only=True)`` (tensors, numbers, strings, lists and dicts only).
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["CHECKPOINT", "rng_state", "set_rng_state", "save_checkpoint", "load_checkpoint"]

CHECKPOINT = "checkpoint.pt"


def rng_state() -> dict:
    """The RNG states of torch (CPU, CUDA), numpy and Python, in ``weights_only``-loadable types."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(gauss)],
            "python": [version, list(internal), gauss_next]}


def set_rng_state(state: dict) -> None:
    """Restore :func:`rng_state`'s output."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))


def save_checkpoint(path: str | os.PathLike, step: int, trainer: Any, batches: Any, extra: dict | None = None) -> Path:
    """Write the checkpoint of ``step`` atomically to ``path``; returns it.

    Raises:
        OSError: the directory is not writable or the disk is full (the previous checkpoint stays intact).
    """
    path = Path(path)
    state = {"step": int(step), "trainer": trainer.state_dict(), "batches": batches.state_dict(),
             "rng": rng_state(), "extra": extra or {}}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | os.PathLike, trainer: Any, batches: Any) -> dict:
    """Restore ``trainer``, ``batches`` and the RNG states from ``path``; returns ``{"step", "extra"}``.

    Raises:
        OSError, RuntimeError: the file is missing or not a checkpoint archspec wrote.
    """
    state = torch.load(path, map_location="cpu", weights_only=True)
    trainer.load_state_dict(state["trainer"])
    batches.load_state_dict(state["batches"])
    set_rng_state(state["rng"])
    return {"step": int(state["step"]), "extra": state.get("extra", {})}
