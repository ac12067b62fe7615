"""Streamed training data: ``(PIL image, label)`` datasets read at run time, and timm's transforms.

``fit``'s ``data`` (``--data`` on the command line) takes what :func:`archspec.io.datasets.load_data` takes --
nothing (scikit-learn's digits), ``fashion-mnist`` (Debian's ``dataset-fashion-mnist``), a directory of the four
IDX files, a CIFAR-10/100 directory, or an ImageFolder -- but nothing is decoded or resized up front: images are
decoded by the ``DataLoader`` workers as they are used, so an ImageFolder of any size trains in constant memory.

* An ImageFolder with ``train/`` and ``val/`` (or ``validation/``) sub-folders uses them as the splits
  (timm's and torchvision's layout); one without them is split 80/20, stratified and seeded, as
  :func:`archspec.io.datasets.load_data` splits it.
* Fashion-MNIST and CIFAR keep their published train/test splits; digits is split 80/20 (seeded).

Transforms are timm's ``create_transform`` at the model's input size, split as timm splits them for its
prefetcher: per image in the loader workers, training crops (``RandomResizedCrop``, flip, the recipe's
RandAugment) or evaluation resize + centre crop, ending in ``uint8``; per batch on the device, normalisation and
the recipe's random erasing (:class:`DeviceTransform`).  Grey images are repeated to RGB for a 3-channel model
(ImageNet mean/std), a 1-channel model reads them as they are (mean/std 0.5).
"""

from __future__ import annotations

import os
import re
import stat
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from PIL import Image as PILImage
from sklearn.datasets import load_digits
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform
from timm.data.auto_augment import augment_and_mix_transform, auto_augment_transform, rand_augment_transform
from timm.data.random_erasing import RandomErasing
from torch.utils.data import Dataset, Subset
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from archspec.errors import SpecError
from archspec.io import datasets as mem
from archspec.io.data_sources import check_data_dir
from archspec.io.datasets import (
    DATA_HINT,
    IMAGE_SUFFIXES,
    check_cifar_files,
    data_error,
    fashion_mnist_arrays,
    split_indices,
    stratified_subset,
)

__all__ = ["StreamData", "open_stream_data", "make_transforms", "DeviceTransform", "check_auto_augment"]


@dataclass
class StreamData:
    """Train and val datasets of ``(PIL image, label)``, the number of classes and a name."""

    name: str
    train: Any
    val: Any
    num_classes: int

    def describe(self) -> dict:
        """JSON-ready summary."""
        return {"name": self.name, "train": len(self.train), "val": len(self.val), "num_classes": self.num_classes}


class ArrayImages(Dataset):
    """Images held as a uint8 array ``(N, H, W)`` or ``(N, H, W, 3)``, returned as PIL images with labels."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return Image.fromarray(self.images[index]), int(self.labels[index])


class ToMode:
    """Convert a PIL image to ``mode`` (``RGB`` or ``L``) before ``transform`` (picklable for workers)."""

    def __init__(self, mode: str, transform: Any):
        self.mode, self.transform = mode, transform

    def __call__(self, image):
        # ImageFolder's loader has converted to RGB already: a second convert would copy the image (same pixels)
        return self.transform(image if image.mode == self.mode else image.convert(self.mode))


def make_transforms(channels: int, size: tuple[int, int], config: Any) -> tuple[Any, Any]:
    """``(train, eval)`` per-image transforms of timm ``create_transform`` for ``channels`` x ``size`` inputs, as
    timm builds them for its CUDA prefetcher (``use_prefetcher=True``): they end in a ``uint8`` ``(C, H, W)``
    tensor, and normalisation and random erasing run on whole batches on the device (:class:`DeviceTransform`).

    Training: random-resized crop, horizontal flip, ``config.auto_augment``; evaluation: resize (crop_pct
    0.875) and centre crop.  Why uint8: a loader worker then neither converts nor normalises 3 floats per pixel,
    and its batches cross to the main process (and the GPU) at a quarter of the bytes -- on a GPU the workers
    are what starves the device (``bench/train_throughput.py --device cuda``: docs/benchmarks.md).
    """

    common = {"input_size": (channels, *size), "interpolation": "bicubic", "use_prefetcher": True}
    train = create_transform(**common, is_training=True, auto_augment=config.auto_augment)
    val = create_transform(**common, is_training=False, crop_pct=0.875)
    mode = "RGB" if channels == 3 else "L"
    return ToMode(mode, train), ToMode(mode, val)


class DeviceTransform:
    """The batch half of timm's transform, on the training device (timm ``PrefetchLoader``'s work): ``uint8``
    ``(B, C, H, W)`` -> float ``(B, C, H, W)`` normalised with ImageNet's mean/std (3 channels) or 0.5/0.5
    (1 channel), then, for training, timm ``RandomErasing(reprob, mode="pixel", max_count=1)`` (DeiT's
    erasing) per image.  Erasing draws from the global ``random`` and torch RNGs of this process, which
    ``archspec train`` reseeds at every step, so a resumed run erases exactly as an uninterrupted one does.
    Raises nothing of its own.
    """

    def __init__(self, channels: int, device: Any, reprob: float = 0.0):
        mean, std = (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD) if channels == 3 else ((0.5,), (0.5,))
        self.mean = torch.tensor([255 * m for m in mean], device=device).view(1, -1, 1, 1)
        self.std = torch.tensor([255 * v for v in std], device=device).view(1, -1, 1, 1)
        self.erase = (RandomErasing(reprob, mode="pixel", max_count=1, device=device) if reprob > 0 else None)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.float().sub_(self.mean).div_(self.std)
        return self.erase(x) if self.erase is not None else x


_AA_SECTIONS = {"rand": ("mstd", "mmax", "inc", "m", "n", "p"), "augmix": ("mstd", "m", "w", "d", "a", "b")}


def check_auto_augment(policy: str) -> None:
    """Check a timm auto-augment policy string (``config.auto_augment``) as timm's ``create_transform`` would parse it.

    timm skips a section without digits silently (``rand-garbage`` is plain RandAugment); here every section
    after the policy name must be one timm reads (``rand``: ``m9``, ``n2``, ``mstd0.5``, ``mmax10``, ``inc1``,
    ``p0.5``, ``t<choices>``; ``augmix``: ``m``, ``w``, ``d``, ``a``, ``b``, ``mstd``; AutoAugment's ``v0``,
    ``v0r``, ``original``, ``originalr``, ``3a``: ``mstd``), then timm builds the transform.

    Raises:
        SpecError: at ``config.auto_augment``, naming the section timm would not read.
    """


    hint = "timm policies: rand-m9-mstd0.5-inc1 (RandAugment), augmix-m5-w4-d2, original-mstd0.5, v0, 3a"
    name, *sections = policy.split("-")
    known = _AA_SECTIONS.get(name, ("mstd",))
    for section in sections:
        match = re.fullmatch(r"([a-z]+)(\d.*)", section)
        if not ((name == "rand" and section.startswith("t") and len(section) > 1)
                or (match and match.group(1) in known)):
            raise SpecError.single(("config", "auto_augment"),
                                   f"{policy!r}: timm does not read the section {section!r}", hint)
    build = {"rand": rand_augment_transform, "augmix": augment_and_mix_transform}.get(name, auto_augment_transform)
    try:
        build(policy, {"translate_const": 100, "img_mean": (124, 116, 104)})
    except (AssertionError, ValueError, KeyError, TypeError) as exc:
        raise SpecError.single(("config", "auto_augment"),
                               f"{policy!r} is not a timm auto-augment policy: {exc or 'unknown'}", hint) from None


def open_stream_data(source: str | os.PathLike | None, seed: int = 0, max_images: int | None = None) -> StreamData:
    """The train/val datasets of ``source`` (see the module docstring), nothing decoded yet.

    Args:
        max_images: keep at most this many images in total (stratified), for quick runs and tests.

    Raises:
        SpecError: at ``data``: a missing path, a file instead of a directory, no images, Fashion-MNIST
            not installed (with the apt line), CIFAR files that are not the published ones.
    """

    if max_images is not None and max_images < 2:
        raise SpecError.single(("max_images",),
                               f"must be at least 2 (a train and a validation image), got {max_images}")
    root = check_data_dir(source)
    if root is None:
        return _digits(seed, max_images)
    if str(source) == "fashion-mnist":
        return _fashion_mnist(root, seed, max_images)
    cifar = mem.cifar_class(root)
    if cifar is not None:
        return _cifar(*cifar, seed, max_images)
    if mem.is_idx_dir(root):
        return _fashion_mnist(root, seed, max_images)
    return _image_folder(root, seed, max_images)


def _subset(dataset: Any, labels: np.ndarray, keep: int | None, seed: int) -> Any:
    if keep is None or keep >= len(labels):
        return dataset
    return Subset(dataset, stratified_subset(labels, keep, seed).tolist())


def _split_sizes(n_train: int, n_val: int, max_images: int | None) -> tuple[int | None, int | None]:
    if max_images is None:
        return None, None
    keep_val = max(1, round(max_images * n_val / (n_train + n_val)))
    return max(1, max_images - keep_val), keep_val


def _digits(seed: int, max_images: int | None) -> StreamData:

    digits = load_digits()
    images = np.round(digits.images * (255 / 16)).astype(np.uint8)  # (1797, 8, 8), values 0..16
    labels = digits.target.astype(np.int64)
    if max_images is not None:
        keep = stratified_subset(labels, max_images, seed)
        images, labels = images[keep], labels[keep]
    train, val = split_indices(labels, seed)
    return StreamData("digits", ArrayImages(images[train], labels[train]), ArrayImages(images[val], labels[val]), 10)


def _fashion_mnist(source: Path, seed: int, max_images: int | None) -> StreamData:
    """Fashion-MNIST's published split (:func:`archspec.io.datasets.fashion_mnist_arrays`), images kept as uint8."""

    x_train, y_train, x_val, y_val = fashion_mnist_arrays(source)
    splits = [ArrayImages(x_train, y_train), ArrayImages(x_val, y_val)]
    keep_train, keep_val = _split_sizes(len(splits[0]), len(splits[1]), max_images)
    return StreamData("fashion-mnist", _subset(splits[0], splits[0].labels, keep_train, seed),
                      _subset(splits[1], splits[1].labels, keep_val, seed), 10)


def _cifar(cls, folder: Path, seed: int, max_images: int | None) -> StreamData:
    check_cifar_files(cls, folder)
    train, val = (cls(str(folder.parent), train=split, download=False) for split in (True, False))
    keep_train, keep_val = _split_sizes(len(train), len(val), max_images)
    return StreamData(cls.__name__.lower(), _subset(train, np.asarray(train.targets), keep_train, seed),
                      _subset(val, np.asarray(val.targets), keep_val, seed), len(train.classes))


# What decoding a damaged file raises in PIL: UnidentifiedImageError and truncated data (OSError), a header PIL
# cannot parse (SyntaxError, ValueError, EOFError, struct.error) and DecompressionBombError (over twice
# PIL.Image.MAX_IMAGE_PIXELS, e.g. 15000x15000).
_DAMAGED = (OSError, ValueError, SyntaxError, EOFError, ArithmeticError, struct.error, PILImage.DecompressionBombError)
_MAX_SKIPS = 20  # consecutive damaged images before a run gives up (timm's ImageDataset does the same)


class _Candidates:
    """``is_valid_file`` of an ImageFolder: an image suffix, a regular file (a FIFO would hang the reader) and
    not empty; what is left out is counted and named once, on stderr."""

    def __init__(self, suffixes: tuple[str, ...]):
        self.suffixes, self.left_out = suffixes, []

    def __call__(self, path: str) -> bool:
        if not path.lower().endswith(self.suffixes):
            return False
        try:
            info = os.stat(path)
        except OSError as exc:
            self.left_out.append(f"{path} ({exc.strerror})")
            return False
        if not stat.S_ISREG(info.st_mode):
            self.left_out.append(f"{path} (not a regular file)")
            return False
        if info.st_size == 0:
            self.left_out.append(f"{path} (empty)")
            return False
        return True

    def report(self, root: Path) -> None:
        if self.left_out:
            shown = "; ".join(self.left_out[:3]) + (f"; and {len(self.left_out) - 3} more" if len(self.left_out) > 3
                                                     else "")
            print(f"archspec train: warning: left out {len(self.left_out)} file(s) of {root} that cannot be "
                  f"images: {shown}", file=sys.stderr)


class DamagedImages(Exception):  # noqa: N818 - what the user reads is the message, at data
    """:data:`_MAX_SKIPS` damaged images in a row: the data folder, not the run, is at fault.  Not a RuntimeError,
    so the training loop does not take it for a failure of the model; from a DataLoader worker it arrives as the
    same class with torch's "Caught ... Original Traceback" text around the message (:func:`damaged_message`)."""


def damaged_message(exc: DamagedImages) -> str:
    """The message of ``exc`` without what torch's DataLoader puts around it when a worker raised it."""
    last = (str(exc).strip().splitlines() or [""])[-1]
    return last.split(f"{DamagedImages.__name__}: ", 1)[-1]


class CheckedImageFolder(ImageFolder):
    """torchvision's ImageFolder that skips an image it cannot decode (random bytes, truncated data, a
    decompression bomb), as timm's ImageDataset does: the next image is used in its place and the file is
    named once per process on stderr.

    Raises:
        DamagedImages: 20 damaged images in a row (``fit`` turns it into a SpecError at ``data``).
    """

    def __getitem__(self, index: int):
        for attempt in range(min(_MAX_SKIPS, len(self.samples))):
            at = (index + attempt) % len(self.samples)
            try:
                return super().__getitem__(at)
            except _DAMAGED as exc:
                _warn_damaged(self.samples[at][0], exc)
        tried = min(_MAX_SKIPS, len(self.samples))
        raise DamagedImages(f"{tried} damaged images in a row in {self.root}, from {self.samples[index][0]} on")


_WARNED: set[str] = set()


def _warn_damaged(path: str, exc: BaseException) -> None:
    if path not in _WARNED:
        _WARNED.add(path)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        print(f"archspec train: warning: skipped a damaged image, {path}: {type(exc).__name__}: {reason} "
              "(the next image is used in its place)", file=sys.stderr, flush=True)


def _image_folder(root: Path, seed: int, max_images: int | None) -> StreamData:
    """torchvision ``ImageFolder``: ``root/{train,val}/<class>/...`` or ``root/<class>/...`` split 80/20.

    Files that cannot be images (not regular files, e.g. a FIFO; empty) are left out with one warning; an image
    that fails to decode during the run is skipped with a warning naming it (:class:`CheckedImageFolder`).

    Raises:
        SpecError: at ``data``: not an ImageFolder, train/ and val/ with different classes, fewer than 2
            classes or 2 images.
    """


    folder = CheckedImageFolder
    val_dir = next((root / name for name in ("val", "validation") if (root / name).is_dir()), None)
    try:
        if (root / "train").is_dir() and val_dir is not None:
            candidates = _Candidates(tuple(IMG_EXTENSIONS))
            train = folder(str(root / "train"), is_valid_file=candidates)
            val = folder(str(val_dir), is_valid_file=candidates)
            candidates.report(root)
            if train.classes != val.classes:
                raise data_error("train/ and val/ hold different class folders", "give both the same class names", root)
            _enough_classes(train.classes, root)
            keep_train, keep_val = _split_sizes(len(train), len(val), max_images)
            return StreamData(f"imagefolder:{root.name}", _subset(train, np.asarray(train.targets), keep_train, seed),
                              _subset(val, np.asarray(val.targets), keep_val, seed), len(train.classes))
        candidates = _Candidates(tuple(IMAGE_SUFFIXES))
        whole = folder(str(root), is_valid_file=candidates)
        candidates.report(root)
    except (FileNotFoundError, RuntimeError) as exc:  # torchvision: no class folders / no images
        raise data_error(f"not an ImageFolder: {exc}", DATA_HINT, root) from None
    _enough_classes(whole.classes, root)
    labels = np.asarray(whole.targets, dtype=np.int64)
    if len(labels) < 2:
        raise data_error("fewer than 2 images", DATA_HINT, root)
    if max_images is not None:
        whole, labels = _subset(whole, labels, max_images, seed), labels
        labels = np.asarray([whole.dataset.targets[i] for i in whole.indices]) if isinstance(whole, Subset) else labels
    train_idx, val_idx = split_indices(labels, seed)
    return StreamData(f"imagefolder:{root.name}", Subset(whole, train_idx.tolist()), Subset(whole, val_idx.tolist()),
                      len(whole.dataset.classes if isinstance(whole, Subset) else whole.classes))


def _enough_classes(classes: list, root: Path) -> None:

    if len(classes) < 2:
        raise data_error(f"found {len(classes)} class folder(s); classification needs at least 2", None, root)
