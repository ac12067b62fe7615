"""Which command-line option each library field or parameter is, one table per command.

The library's errors name what a Python caller passed: a parameter (``out``), a field of a config (``config.lr``,
``budgets.macs``), code-quoted in the text (`` `out` ``).  :func:`archspec.cli.main` renames them to the command's
flags with :meth:`archspec.errors.SpecError.with_options` and the table of the command (:func:`options_for`), so
the command line speaks of ``--out`` and ``--lr``.  Torch-free.
"""

from __future__ import annotations

from dataclasses import fields

from archspec.errors import Path
from archspec.train.config import TrainConfig

__all__ = ["TRAIN_CONFIG", "TRAIN", "options_for"]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# ``fit(config=...)``: each TrainConfig field is the option of the same name but two.
TRAIN_CONFIG: dict[Path, str] = {("config", f.name): {"optimizer": "--opt", "auto_augment": "--aa"}.get(
    f.name, _flag(f.name)) for f in fields(TrainConfig)}

# ``archspec train``: :func:`archspec.train.run.fit`'s keywords and its config.
TRAIN: dict[Path, str] = {
    **{(name,): _flag(name) for name in ("out", "resume", "restart", "seed", "data", "teacher", "teacher_checkpoint",
                                         "max_images", "sync_bn")},
    **TRAIN_CONFIG,
}

_TABLES: dict[str, dict[Path, str]] = {"train": TRAIN}


def options_for(command: str | None, mode: str | None = None) -> dict[Path, str]:
    """The field -> option table of ``archspec COMMAND [MODE]`` (empty for a command without one)."""
    return _TABLES.get(f"{command} {mode}" if mode else str(command), {})
