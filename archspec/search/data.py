"""Labelled image data for proxy training, loaded fully into memory as tensors (no downloads, ever).

Sources:

* ``None``: scikit-learn's ``load_digits`` -- 1797 real 8x8 handwritten digits, 10 classes, shipped
  inside the scikit-learn wheel.  Upsampled (bilinear) to ``image_size``, repeated to 3 channels;
  a fixed stratified 80/20 train/val split (seeded).
* a directory in torchvision ``ImageFolder`` layout (``root/<class>/<image>``); when it holds
  ``train/`` and ``val/`` (or ``test/``) sub-folders those are the split, otherwise a stratified
  80/20 split.  Images are converted to RGB and resized to ``image_size`` x ``image_size``.
* a CIFAR-10 directory in its standard python format (``cifar-10-batches-py`` with ``data_batch_1``
  ... ``data_batch_5`` and ``test_batch``; the directory itself or its parent).  Only those standard
  files are unpickled, with ``encoding='bytes'`` and an unpickler restricted to numpy arrays.

Pixels are scaled to [0, 1] and normalised per channel with the *train* split's mean and std.
"""

from __future__ import annotations

import io
import os
import pickle
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

from archspec.errors import SpecError

__all__ = ["Dataset", "load_data", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".webp", ".tif", ".tiff")
_CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
_OPTION = ("--data",)
_CIFAR_MAX_BYTES = 64_000_000  # a CIFAR-10 batch is 31 MB; never read a huge file whole
_MAX_CLASSES = 1000  # a label beyond this would build an absurd classifier head


@dataclass
class Dataset:
    """In-memory train/val tensors: images ``(N, channels, image_size, image_size)`` float32, labels int64."""

    name: str
    train: TensorDataset
    val: TensorDataset
    num_classes: int
    channels: int
    image_size: int

    def describe(self) -> dict:
        """JSON-ready summary."""
        return {"name": self.name, "train": len(self.train), "val": len(self.val), "num_classes": self.num_classes,
                "channels": self.channels, "image_size": self.image_size}


def _fail(message: str, hint: str | None, path: object) -> SpecError:
    return SpecError.single(_OPTION, message, hint, str(path) if path is not None else None)


def _stratified_subset(labels: np.ndarray, keep: int, seed: int) -> np.ndarray:
    """Indices of a stratified subset of ``keep`` samples (at least one per class when possible)."""
    if keep >= len(labels):
        return np.arange(len(labels))
    from sklearn.model_selection import train_test_split  # noqa: PLC0415

    classes = np.unique(labels)
    if keep < 2 * len(classes):  # too few for stratification: take a seeded spread
        rng = np.random.default_rng(seed)
        return np.sort(rng.permutation(len(labels))[:keep])
    idx, _ = train_test_split(np.arange(len(labels)), train_size=keep, stratify=labels, random_state=seed)
    return np.sort(idx)


def _split(labels: np.ndarray, seed: int, val_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.model_selection import train_test_split  # noqa: PLC0415

    idx = np.arange(len(labels))
    counts = np.bincount(labels)
    stratify = labels if counts[counts > 0].min() >= 2 and len(labels) * val_fraction >= len(np.unique(labels)) else None
    train, val = train_test_split(idx, test_size=val_fraction, stratify=stratify, random_state=seed)
    return np.sort(train), np.sort(val)


def _resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """``(N, C, h, w)`` float -> ``(N, C, size, size)``: bilinear (antialiased when shrinking)."""
    if images.shape[-2:] == (size, size):
        return images
    shrink = images.shape[-1] > size or images.shape[-2] > size
    out = []
    for chunk in images.split(1024):
        out.append(F.interpolate(chunk, size=(size, size), mode="bilinear", align_corners=False, antialias=shrink))
    return torch.cat(out)


def _finish(name: str, x_train: torch.Tensor, y_train: np.ndarray, x_val: torch.Tensor, y_val: np.ndarray,
            num_classes: int, image_size: int) -> Dataset:
    x_train, x_val = _resize(x_train, image_size), _resize(x_val, image_size)
    mean = x_train.mean(dim=(0, 2, 3), keepdim=True)
    std = x_train.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    x_train, x_val = ((x_train - mean) / std).contiguous(), ((x_val - mean) / std).contiguous()
    return Dataset(
        name=name,
        train=TensorDataset(x_train.float(), torch.as_tensor(y_train, dtype=torch.long)),
        val=TensorDataset(x_val.float(), torch.as_tensor(y_val, dtype=torch.long)),
        num_classes=num_classes, channels=x_train.shape[1], image_size=image_size,
    )


# ---------------------------------------------------------------------------------------------


def _digits(image_size: int, seed: int, max_images: int | None) -> Dataset:
    from sklearn.datasets import load_digits  # noqa: PLC0415

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # (1797, 8, 8), values 0..16
    labels = digits.target.astype(np.int64)
    if max_images is not None:
        keep = _stratified_subset(labels, max_images, seed)
        images, labels = images[keep], labels[keep]
    train, val = _split(labels, seed)
    x = torch.from_numpy(images)[:, None].expand(-1, 3, -1, -1).contiguous()
    return _finish("digits", x[train], labels[train], x[val], labels[val], 10, image_size)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickler that only builds numpy arrays, dtypes and plain containers (CIFAR batches need no more)."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"), ("copy_reg", "_reconstructor"),
        ("copyreg", "_reconstructor"), ("__builtin__", "object"), ("builtins", "object"),
    }

    def find_class(self, module: str, name: str):  # noqa: ANN201
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a CIFAR batch")


def _cifar_dir(path: Path) -> Path | None:
    for candidate in (path, path / "cifar-10-batches-py"):
        if all((candidate / f).is_file() for f in _CIFAR_FILES):
            return candidate
    return None


def _regular_file(path: Path, limit: int | None = None) -> os.stat_result:
    """``stat`` of ``path``, refusing FIFOs, devices and sockets (reading them hangs or never ends) and
    files over ``limit`` bytes."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise _fail(f"cannot read {path.name}: {exc.strerror}", None, path) from None
    if not stat.S_ISREG(st.st_mode):
        raise _fail(f"{path.name} is not a regular file (a FIFO, device or socket)", "remove it from the dataset", path)
    if limit is not None and st.st_size > limit:
        raise _fail(f"{path.name} is {st.st_size / 1e6:,.0f} MB; a CIFAR-10 batch is 31 MB",
                    "expected the standard python-format batches of cifar-10-batches-py", path)
    return st


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    _regular_file(path, _CIFAR_MAX_BYTES)
    try:
        with open(path, "rb") as fh:
            batch = _ArrayUnpickler(io.BytesIO(fh.read(_CIFAR_MAX_BYTES + 1)), encoding="bytes").load()
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch.get(b"labels", batch.get(b"fine_labels")), dtype=np.int64)
    except Exception as exc:  # noqa: BLE001 - a malformed pickle raises almost any type; all are the file's fault
        raise _fail(f"cannot read CIFAR-10 batch {path.name}: {type(exc).__name__}: {str(exc)[:200]}",
                    "expected the standard python-format batches of cifar-10-batches-py", path) from None
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.ndim != 1 or len(labels) != len(data):
        raise _fail(f"CIFAR-10 batch {path.name} has data of shape {data.shape} and labels of shape {labels.shape}",
                    "expected (N, 3072) uint8 rows and N labels", path)
    if len(labels) and not (0 <= labels.min() and labels.max() < _MAX_CLASSES):
        raise _fail(f"CIFAR-10 batch {path.name} has labels from {labels.min()} to {labels.max()}",
                    f"labels are class indices, 0 to {_MAX_CLASSES - 1}", path)
    return data.reshape(-1, 3, 32, 32), labels


def _cifar(root: Path, image_size: int, seed: int, max_images: int | None) -> Dataset:
    parts = [_read_cifar_batch(root / f) for f in _CIFAR_FILES[:-1]]
    x_train = np.concatenate([p[0] for p in parts])
    y_train = np.concatenate([p[1] for p in parts])
    x_val, y_val = _read_cifar_batch(root / "test_batch")
    if max_images is not None:
        n_val = max(1, round(max_images * len(y_val) / (len(y_val) + len(y_train))))
        keep_train = _stratified_subset(y_train, max(1, max_images - n_val), seed)
        keep_val = _stratified_subset(y_val, n_val, seed)
        x_train, y_train, x_val, y_val = x_train[keep_train], y_train[keep_train], x_val[keep_val], y_val[keep_val]
    if len(y_train) == 0 or len(y_val) == 0:
        raise _fail("the CIFAR-10 batches hold no images", None, root)
    num_classes = int(max(y_train.max(), y_val.max())) + 1
    to_t = lambda a: torch.from_numpy(a.astype(np.float32) / 255.0)  # noqa: E731
    return _finish("cifar10", to_t(x_train), y_train, to_t(x_val), y_val, max(num_classes, 10), image_size)


def _folder_images(root: Path) -> tuple[list[Path], list[str]]:
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    files: list[Path] = []
    for c in classes:
        for p in sorted((root / c).rglob("*")):
            if p.suffix.lower() in IMAGE_SUFFIXES and not p.is_dir():
                _regular_file(p)  # a FIFO named x.png would block Pillow forever
                files.append(p)
    return files, classes


def _load_image(path: Path, image_size: int) -> np.ndarray:
    """One image as ``(image_size, image_size, 3)`` float32 in [0, 1], read by :func:`archspec.image.read_image`.

    Raises:
        SpecError: on ``--data``: the file cannot be decoded, is not a regular file, or is a
            decompression bomb (more pixels than Pillow's ``Image.MAX_IMAGE_PIXELS``).
    """
    from PIL import Image  # noqa: PLC0415

    from archspec.image import read_image  # noqa: PLC0415 - pulls timm; only when images are read

    img = read_image(path, _OPTION[0]).resize((image_size, image_size), Image.BILINEAR)
    return np.asarray(img, dtype=np.float32) / 255.0


def _load_images(files: list[Path], image_size: int) -> torch.Tensor:
    out = torch.empty(len(files), 3, image_size, image_size)
    for k, f in enumerate(files):
        out[k] = torch.from_numpy(_load_image(f, image_size)).permute(2, 0, 1)
    return out


def _image_folder(root: Path, image_size: int, seed: int, max_images: int | None) -> Dataset:
    split_dirs = [root / "train", next((root / d for d in ("val", "test") if (root / d).is_dir()), None)]
    if split_dirs[0].is_dir() and split_dirs[1] is not None:
        (train_files, classes), (val_files, val_classes) = _folder_images(split_dirs[0]), _folder_images(split_dirs[1])
        if not train_files or not val_files:
            raise _fail("the train/ or val/ folder holds no images", "layout: root/train/<class>/*.png, root/val/<class>/*.png", root)
        index = {c: i for i, c in enumerate(classes)}
        unknown = sorted(set(val_classes) - set(index))
        if unknown:
            raise _fail(f"val classes {unknown} are not among the train classes", None, split_dirs[1])
        y_train = np.array([index[f.relative_to(split_dirs[0]).parts[0]] for f in train_files], dtype=np.int64)
        y_val = np.array([index[f.relative_to(split_dirs[1]).parts[0]] for f in val_files], dtype=np.int64)
        if max_images is not None:
            n_val = max(1, round(max_images * len(y_val) / (len(y_val) + len(y_train))))
            kt, kv = _stratified_subset(y_train, max(1, max_images - n_val), seed), _stratified_subset(y_val, n_val, seed)
            train_files, y_train = [train_files[i] for i in kt], y_train[kt]
            val_files, y_val = [val_files[i] for i in kv], y_val[kv]
    else:
        files, classes = _folder_images(root)
        if not files:
            raise _fail("no images found", "ImageFolder layout: root/<class>/<image>.png (one folder per class)", root)
        labels = np.array([classes.index(f.relative_to(root).parts[0]) for f in files], dtype=np.int64)
        if max_images is not None:
            keep = _stratified_subset(labels, max_images, seed)
            files, labels = [files[i] for i in keep], labels[keep]
        if len(files) < 2:
            raise _fail(f"only {len(files)} image found; a train/val split needs at least 2", None, root)
        train_idx, val_idx = _split(labels, seed)
        train_files, y_train = [files[i] for i in train_idx], labels[train_idx]
        val_files, y_val = [files[i] for i in val_idx], labels[val_idx]
    if len(classes) < 2:
        raise _fail(f"found {len(classes)} class folder(s); classification needs at least 2", None, root)
    x_train, x_val = _load_images(train_files, image_size), _load_images(val_files, image_size)
    return _finish(f"imagefolder:{root.name}", x_train, y_train, x_val, y_val, len(classes), image_size)


def load_data(source: "str | os.PathLike | None", image_size: int, seed: int = 0, max_images: int | None = None) -> Dataset:
    """Load a labelled image dataset into memory at ``image_size`` x ``image_size`` (see the module docstring).

    Args:
        source: ``None`` (scikit-learn digits), an ImageFolder directory or a CIFAR-10 directory.
        image_size: side of the square images returned.
        seed: seed of the train/val split and of ``max_images`` subsampling (same seed, same split).
        max_images: keep at most this many images in total (stratified), for quick runs and tests.

    Raises:
        SpecError: at ``--data``: a missing path, a file instead of a directory, no images, unreadable
            or undecodable files, decompression bombs, FIFOs or devices among the files, malformed
            CIFAR-10 batches -- with the offending path as the file.
    """
    if not isinstance(image_size, int) or image_size < 1:
        raise _fail(f"image size must be a positive integer, got {image_size!r}", None, None)
    if max_images is not None and max_images < 2:
        raise SpecError.single(("--max-images",), f"must be at least 2 (a train and a validation image), got {max_images}")
    if source is None:
        return _digits(image_size, seed, max_images)
    root = Path(source).expanduser()
    if not root.exists():
        raise _fail("no such directory", "give an ImageFolder directory or a CIFAR-10 directory (cifar-10-batches-py), "
                    "or leave --data out for the built-in digits", root)
    if not root.is_dir():
        raise _fail("not a directory", "give an ImageFolder directory or a CIFAR-10 directory", root)
    try:
        cifar = _cifar_dir(root)
        if cifar is not None:
            return _cifar(cifar, image_size, seed, max_images)
        if any(root.glob("data_batch_*")) or (root / "cifar-10-batches-py").is_dir():
            raise _fail("incomplete CIFAR-10 directory", f"expected the files {', '.join(_CIFAR_FILES)}", root)
        return _image_folder(root, image_size, seed, max_images)
    except PermissionError as exc:
        raise _fail(f"cannot read: {exc.strerror}", None, exc.filename or root) from None
