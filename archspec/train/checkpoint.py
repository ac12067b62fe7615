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
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from archspec.errors import SpecError
from archspec.io.builddir import normal_mode, staging_prefix

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
    fd, tmp = tempfile.mkstemp(prefix=staging_prefix(path.name, "", ".tmp"), suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, normal_mode(directory=False))  # mkstemp makes 0o600; files follow the umask
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
        SpecError: at ``resume``, naming ``path``: the file is missing, unreadable, truncated, not a
            checkpoint archspec wrote (random bytes, a pickle of other objects, missing entries) or one of
            another model (tensor shapes that do not match); nothing is changed on disk.
    """

    path = Path(path)

    def fail(reason: str) -> SpecError:
        return SpecError.single(("resume",), f"{path.name} cannot be resumed from: {reason}",
                                "the run directory is left as it is; `restart` starts the run over", str(path))

    try:
        with warnings.catch_warnings():  # torch's note on the pickle protocol of a file that is no checkpoint
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, EOFError, RuntimeError, ValueError, TypeError) as exc:
        text = str(exc).strip()
        reason = text.splitlines()[0].split(". ")[0] if text else type(exc).__name__
        if "weights_only" in str(exc) or "Weights only" in str(exc):
            reason = "not a checkpoint archspec wrote (it holds objects other than tensors, numbers and strings)"
        raise fail(f"unreadable or truncated ({reason})") from None
    except Exception as exc:  # noqa: BLE001 - pickle.UnpicklingError and the like: bytes that are no checkpoint
        raise fail(f"not a checkpoint archspec wrote ({type(exc).__name__})") from None
    if not isinstance(state, dict) or not isinstance(state.get("trainer"), dict) or not isinstance(
            state.get("step"), int):
        raise fail("not a checkpoint archspec wrote (no step and trainer state)")
    missing = [k for k in ("batches", "rng") if not isinstance(state.get(k), dict)]
    missing += [f"trainer.{k}" for k in ("model", "optimizer", "scheduler") if k not in state["trainer"]]
    if missing:
        raise fail(f"not a complete checkpoint (missing {', '.join(missing)})")
    try:
        trainer.load_state_dict(state["trainer"])
        batches.load_state_dict(state["batches"])
        set_rng_state(state["rng"])
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError, AttributeError) as exc:
        lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
        shown = "; ".join(lines[:3]) or type(exc).__name__
        raise fail(f"it does not match this model and settings ({shown})") from None
    return {"step": int(state["step"]), "extra": state.get("extra", {})}
