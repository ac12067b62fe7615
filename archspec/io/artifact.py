"""Model artifacts: a directory holding ``model.safetensors`` (weights and buffers) and ``spec.yaml``.

``archspec.load(dir)`` recompiles the spec and loads the weights, so the rebuilt model is exactly
the saved one.  Safetensors stores tensors only -- loading never executes code (unlike pickle).

An edit to ``spec.yaml`` that keeps every tensor shape (a mask window 3x3 -> 1x1, a hard mask made
strict, ``norm_eps``) would load without complaint and change the outputs, so :func:`save` stores the
SHA-256 of the resolved spec (:func:`spec_digest`) and the archspec version in the safetensors
metadata, and :func:`load` refuses a spec.yaml whose digest differs unless ``allow_spec_change=True``.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model, save_file, save_model

from archspec._version import __version__
from archspec.errors import SpecError
from archspec.io.builddir import normal_mode
from archspec.ir.checked import load_spec
from archspec.nn.compiler import compile
from archspec.nn.model import ArchModel
from archspec.spec import ArchSpec
from archspec.spec.stable import stable_dump

if TYPE_CHECKING:
    from torch import nn

WEIGHTS = "model.safetensors"
SPEC = "spec.yaml"
META_VERSION = "archspec_version"
META_DIGEST = "archspec_spec_sha256"


def spec_digest(spec: ArchSpec) -> str:
    """SHA-256 (hex) of the resolved spec: ``json.dumps(spec.model_dump(mode='json'), sort_keys=True)``.

    Every field counts, ``name`` and ``description`` included: any edit of spec.yaml is detected.  A head kind
    added since a build was saved does not change its digest while no head uses it
    (:func:`~archspec.spec.stable.stable_dump`: nor does a field added since, while the spec does not use it).
    Raises nothing.
    """
    dump = stable_dump(spec)
    canonical = json.dumps(dump, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def save(model: ArchModel, directory: str | os.PathLike) -> Path:
    """Write ``model`` to ``directory`` (created if needed): ``model.safetensors`` and ``spec.yaml``.

    The weights file's metadata holds the spec digest (:func:`spec_digest`) and the archspec version.
    Files get mode ``0o666 & ~umask`` (safetensors alone writes 0o600).  Both files are overwritten if
    present.  Returns the directory.  An int8 model (:class:`archspec.deploy.int8.QuantizedModel`) is written by
    :func:`archspec.deploy.int8.save_quantized`: its float build plus ``int8.safetensors``.

    Raises:
        OSError: the directory or a file cannot be written.
        SpecError: an int8 model that was not made from an archspec model.
    """
    if type(model).__name__ == "QuantizedModel":  # it saves itself: archspec.deploy sits above storage
        return model.save_build(directory)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / SPEC).write_text(model.spec.to_yaml(), encoding="utf-8")
    metadata = {"format": "pt", META_VERSION: __version__, META_DIGEST: spec_digest(model.spec)}
    save_weights(model, directory / WEIGHTS, metadata)
    return directory


def save_weights(module: nn.Module, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_model`` with the file mode ``open`` would give (``0o666 & ~umask``).

    safetensors writes its files 0o600; every file archspec writes follows the umask instead.

    Raises:
        OSError: the file cannot be written.
    """

    save_model(module, str(path), metadata=metadata)
    os.chmod(path, normal_mode(directory=False))


def save_weights_dict(tensors: dict, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file`` of a dict of tensors, with the file mode of :func:`save_weights`.

    Raises:
        OSError: the file cannot be written.
    """

    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, normal_mode(directory=False))


def _require_files(directory: Path) -> None:
    """Both artifact files exist and are regular files (a FIFO named model.safetensors would block a reader)."""
    hint = "point to a directory written by `archspec build` or archspec.save"
    if not any((directory / name).exists() for name in (SPEC, WEIGHTS)):
        raise SpecError.single((), f"is a directory, not a spec file or a build directory (no {SPEC}, no {WEIGHTS})",
                               "give a YAML spec file, or " + hint.replace("point to ", ""), str(directory))
    for name in (SPEC, WEIGHTS):
        try:
            mode = os.stat(directory / name).st_mode
        except OSError:
            raise SpecError.single((), f"no {name} in this directory", hint, str(directory)) from None
        if not stat.S_ISREG(mode):
            raise SpecError.single((), "is not a regular file", hint, str(directory / name))


def _read_weights_header(path: Path) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """Metadata and tensor shapes of a safetensors file, read from its header only.

    Raises:
        SpecError: the file is empty, truncated, not safetensors (a pickle, a torch.save file) or its
            header is invalid or too large -- safetensors' own checks, reported with the file named.
    """
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            shapes = {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise SpecError.single((), f"not a readable safetensors file: {str(exc).splitlines()[0]}",
                               "the file is damaged or was not written by archspec; rebuild it (archspec build)",
                               str(path)) from None
    return metadata, shapes


def _check_digest(spec: ArchSpec, metadata: dict[str, str], directory: Path, allow_spec_change: bool) -> None:
    """Refuse a spec.yaml that is not the one the weights were saved with (see the module docstring)."""
    saved = metadata.get(META_DIGEST)
    if saved is None:
        warnings.warn(f"{directory / WEIGHTS}: no spec digest (written by an older archspec), so it cannot be checked "
                      f"that {SPEC} is the spec these weights were saved with", UserWarning, stacklevel=3)
        return
    if saved == spec_digest(spec) or allow_spec_change:
        return
    version = metadata.get(META_VERSION)
    note = f"; the weights were saved by archspec {version}, this is {__version__}" if version != __version__ else ""
    raise SpecError.single(
        (), f"{SPEC} was changed after the weights were saved (its digest differs from the one stored in {WEIGHTS}"
            f"{note}); what changed cannot be told, and a change that keeps every shape (a mask window, norm_eps) "
            "would silently change the outputs",
        "restore the saved spec.yaml or rebuild the model; to load it anyway on purpose use "
        "archspec.load(dir, allow_spec_change=True) or `archspec validate DIR --allow-spec-change`",
        str(directory / SPEC))


def _check_tensors(model: ArchModel, shapes: dict[str, tuple[int, ...]], path: Path) -> None:
    """Every tensor in the file is one the model has, with the model's shape."""
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    problems = [f"unexpected tensor {key!r}" for key in sorted(set(shapes) - set(expected))]
    problems += [f"{key!r} has shape {shapes[key]} but the spec needs {expected[key]}"
                 for key in sorted(set(shapes) & set(expected)) if shapes[key] != expected[key]]
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise SpecError.single((), f"weights do not match the spec: {'; '.join(problems[:3])}{more}",
                               "the weights file belongs to another spec; rebuild it", str(path))


def load(directory: str | os.PathLike, device: str = "cpu", allow_spec_change: bool = False,
         max_memory: float | None = None, img_size: int | tuple[int, int] | None = None,
         resolution: int | tuple[int, int] | None = None) -> ArchModel:
    """Rebuild the model saved in ``directory`` by :func:`save` (or ``archspec build``).

    Args:
        directory: holds ``spec.yaml`` and ``model.safetensors``.
        device: where the returned model lives.
        allow_spec_change: load even when spec.yaml's digest differs from the one saved with the
            weights (a deliberate edit).  Artifacts without a digest (older archspec) load with a
            ``UserWarning``.
        max_memory: bytes allowed for a batch-1 float32 forward (see :func:`archspec.nn.compiler.compile`);
            ``None``: the 8 GiB default; pass the limit a large model was built with.
        img_size: run the loaded model at this input resolution (an int or ``(H, W)`` in pixels, timm's
            name; ``resolution`` is an alias): the saved weights are loaded at the saved size, then
            :meth:`~archspec.nn.model.ArchModel.set_input_size` resamples the position embedding and bias tables.

    Raises:
        SpecError: a file is missing or not a regular file; the spec is invalid; the weights file is
            not readable safetensors (empty, truncated, a pickle, a bad or huge header) or does not
            match the spec; the spec was changed since the weights were saved; the spec is invalid at
            ``img_size``.  Each names the file.
    """

    directory = Path(directory)
    _require_files(directory)
    metadata, shapes = _read_weights_header(directory / WEIGHTS)
    spec = load_spec(directory / SPEC, max_memory=max_memory)
    _check_digest(spec, metadata, directory, allow_spec_change)
    model = compile(spec, max_memory=max_memory)
    _check_tensors(model, shapes, directory / WEIGHTS)
    try:
        load_model(model, str(directory / WEIGHTS), strict=True, device=device)
    except (SafetensorError, RuntimeError, ValueError, OSError) as exc:
        missing = sorted(set(model.state_dict()) - set(shapes))
        reason = f"missing tensors {', '.join(missing[:3])}" if missing else str(exc).splitlines()[0]
        raise SpecError.single((), f"weights do not match the spec: {reason}", "rebuild it",
                               str(directory / WEIGHTS)) from None
    size = img_size if img_size is not None else resolution
    if size is not None:
        try:
            model.set_input_size(img_size=size)
        except SpecError as exc:
            raise SpecError([replace(p, file=p.file or str(directory / SPEC)) for p in exc.problems]) from None
    return model.to(device)
