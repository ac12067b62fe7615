"""Model artifacts: a directory holding ``model.safetensors`` (weights and buffers) and ``spec.yaml``.

``archspec.load(dir)`` recompiles the spec and loads the weights, so the rebuilt model is exactly
the saved one.  Safetensors stores tensors only -- loading never executes code (unlike pickle).
"""

from __future__ import annotations

import os
from pathlib import Path

from safetensors.torch import load_model, save_model

from archspec.errors import SpecError
from archspec.model import ArchModel

WEIGHTS = "model.safetensors"
SPEC = "spec.yaml"


def save(model: ArchModel, directory: "str | os.PathLike") -> Path:
    """Write ``model`` to ``directory`` (created if needed): ``model.safetensors`` and ``spec.yaml``.

    Files get mode ``0o666 & ~umask`` (safetensors alone writes 0o600).
    """
    from archspec.builddir import normal_mode

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SPEC).write_text(model.spec.to_yaml(), encoding="utf-8")
    save_model(model, str(directory / WEIGHTS))
    os.chmod(directory / WEIGHTS, normal_mode(directory=False))
    return directory


def load(directory: "str | os.PathLike", device: str = "cpu") -> ArchModel:
    """Rebuild the model saved in ``directory`` by :func:`save` (or ``archspec build``).

    Raises:
        SpecError: the directory, its spec or its weights file is missing or does not match.
    """
    from archspec.compiler import compile

    directory = Path(directory)
    for name in (SPEC, WEIGHTS):
        if not (directory / name).is_file():
            raise SpecError.single((), f"no {name} in this directory", "point to a directory written by `archspec build`",
                                   str(directory))
    model = compile(directory / SPEC)
    try:
        missing, unexpected = load_model(model, str(directory / WEIGHTS), strict=True, device=device)
    except (RuntimeError, ValueError, OSError) as exc:
        raise SpecError.single((), f"weights do not match the spec: {str(exc).splitlines()[0]}", None,
                               str(directory / WEIGHTS)) from None
    return model.to(device)
