"""Labelled image data for proxy training, loaded fully into memory as tensors (no downloads, ever).

Sources:

* ``None``: scikit-learn's ``load_digits`` -- 1797 real 8x8 handwritten digits, 10 classes, shipped
  inside the scikit-learn wheel.  Upsampled (bilinear) to ``image_size``, repeated to 3 channels;
  a fixed stratified 80/20 train/val split (seeded).
* ``"fashion-mnist"``: Fashion-MNIST (70,000 real 28x28 grey photos of clothing, 10 classes; 60,000
  train / 10,000 test as published), from Debian's ``dataset-fashion-mnist`` package
  (``apt-get install dataset-fashion-mnist`` puts the gzipped IDX files under
  ``/usr/share/datasets/fashion-mnist/``), read with torchvision's ``FashionMNIST``.  A directory holding
  the four IDX files (plain or ``.gz``) is read the same way.  One channel.
* a CIFAR-10 or CIFAR-100 directory in the standard python format (``cifar-10-batches-py`` /
  ``cifar-100-python``; the directory itself or its parent), read with torchvision's ``CIFAR10`` /
  ``CIFAR100``: each file's MD5 is checked against the published one before anything is unpickled.
* a directory in torchvision ``ImageFolder`` layout (``root/<class>/<image>``), listed by torchvision's
  ``ImageFolder``; when it holds ``train/`` and ``val/`` (or ``test/``) sub-folders those are the split,
  otherwise a stratified 80/20 split.  Images are read by :func:`archspec.io.images.read_image`, converted to
  RGB and resized to ``image_size`` x ``image_size``.

Pixels are scaled to [0, 1] and normalised per channel with the *train* split's mean and std.
"""

from __future__ import annotations

import gzip
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset
from torchvision.datasets import CIFAR10, CIFAR100, FashionMNIST, ImageFolder
from torchvision.datasets.utils import check_integrity

from archspec.errors import SpecError
from archspec.io.data_sources import (
    DATA_HINT,
    IDX_FILES,
    data_error,
    fashion_mnist_dir,
    is_idx_dir,
)
from archspec.io.images import read_image

__all__ = ["Dataset", "load_data", "IMAGE_SUFFIXES"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".webp", ".tif", ".tiff")
_OPTION = ("data",)  # the field of a data problem: `data` to fit and SearchConfig, `source` here
_CIFAR_MAX_BYTES = 200_000_000  # a CIFAR-10 batch is 31 MB, CIFAR-100 train 155 MB; never hash a huge file
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

    _sizes: dict = field(default_factory=dict, repr=False, compare=False)  # resized copies, by (H, W)

    def at_size(self, size: tuple[int, int]) -> Dataset:
        """The same images resized (bilinear, antialiased when shrinking) to ``(H, W)``; kept for reuse.

        The search trains each candidate's proxy at the input size that gives it its own token grid
        (:func:`archspec.search._evaluation.proxy.proxy_spec`), so one loaded dataset serves many sizes.
        """
        size = (int(size[0]), int(size[1]))
        if size == (self.image_size, self.image_size):
            return self
        if size not in self._sizes:
            if len(self._sizes) >= 2:  # a search uses one or two sizes; do not hold every one ever asked for
                self._sizes.pop(next(iter(self._sizes)))
            x_train, y_train = self.train.tensors
            x_val, y_val = self.val.tensors
            self._sizes[size] = Dataset(self.name, TensorDataset(_resize(x_train, size), y_train),
                                        TensorDataset(_resize(x_val, size), y_val), self.num_classes,
                                        self.channels, max(size))
        return self._sizes[size]

    def describe(self) -> dict:
        """JSON-ready summary."""
        return {"name": self.name, "train": len(self.train), "val": len(self.val), "num_classes": self.num_classes,
                "channels": self.channels, "image_size": self.image_size}


def stratified_subset(labels: np.ndarray, keep: int, seed: int) -> np.ndarray:
    """Indices of a stratified subset of ``keep`` samples (at least one per class when possible)."""
    if keep >= len(labels):
        return np.arange(len(labels))

    classes = np.unique(labels)
    if keep < 2 * len(classes):  # too few for stratification: take a seeded spread
        rng = np.random.default_rng(seed)
        return np.sort(rng.permutation(len(labels))[:keep])
    idx, _ = train_test_split(np.arange(len(labels)), train_size=keep, stratify=labels, random_state=seed)
    return np.sort(idx)


def split_indices(labels: np.ndarray, seed: int, val_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)`` indices: a stratified, seeded split holding out ``val_fraction`` (scikit-learn's
    ``train_test_split``; unstratified when a class has one sample or the validation share holds fewer images
    than there are classes)."""
    idx = np.arange(len(labels))
    counts = np.bincount(labels)
    stratify = (labels if counts[counts > 0].min() >= 2 and len(labels) * val_fraction >= len(np.unique(labels))
                else None)
    train, val = train_test_split(idx, test_size=val_fraction, stratify=stratify, random_state=seed)
    return np.sort(train), np.sort(val)


def _resize(images: torch.Tensor, size: int | tuple[int, int]) -> torch.Tensor:
    """``(N, C, h, w)`` float -> ``(N, C, H, W)`` (``size`` an int: square): bilinear, antialiased when shrinking."""
    size = (size, size) if isinstance(size, int) else tuple(size)
    if tuple(images.shape[-2:]) == size:
        return images
    shrink = images.shape[-2] > size[0] or images.shape[-1] > size[1]
    out = []
    for chunk in images.split(1024):
        out.append(F.interpolate(chunk, size=size, mode="bilinear", align_corners=False, antialias=shrink))
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
    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # (1797, 8, 8), values 0..16
    labels = digits.target.astype(np.int64)
    if max_images is not None:
        keep = stratified_subset(labels, max_images, seed)
        images, labels = images[keep], labels[keep]
    train, val = split_indices(labels, seed)
    x = torch.from_numpy(images)[:, None].expand(-1, 3, -1, -1).contiguous()
    return _finish("digits", x[train], labels[train], x[val], labels[val], 10, image_size)


def _regular_file(path: Path, limit: int | None = None, what: str = "file") -> os.stat_result:
    """``stat`` of ``path``, refusing FIFOs, devices and sockets (reading them hangs or never ends) and
    files over ``limit`` bytes."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise data_error(f"cannot read {path.name}: {exc.strerror}", None, path) from None
    if not stat.S_ISREG(st.st_mode):
        raise data_error(f"{path.name} is not a regular file (a FIFO, device or socket)", "remove it from the dataset",
                         path)
    if limit is not None and st.st_size > limit:
        raise data_error(f"{path.name} is {st.st_size / 1e6:,.0f} MB; a {what} is at most {limit / 1e6:,.0f} MB",
                    "expected the standard files of the dataset", path)
    return st


# ------------------------------------------------------------------------------------ CIFAR-10/100


def cifar_class(path: Path):
    """The torchvision CIFAR class whose standard directory ``path`` (or ``path/<base_folder>``) is, else None."""

    for cls in (CIFAR10, CIFAR100):
        for folder in (path, path / cls.base_folder):
            if folder.name == cls.base_folder and folder.is_dir():
                return cls, folder
    return None


def check_cifar_files(cls, folder: Path) -> None:
    """Name the first missing, irregular, oversized or non-genuine file (torchvision checks each file's
    published MD5 before it unpickles anything, so only the genuine batches are ever unpickled)."""

    for name, md5 in [*cls.train_list, *cls.test_list, [cls.meta["filename"], cls.meta["md5"]]]:
        path = folder / name
        if not path.exists():
            raise data_error(f"incomplete {cls.__name__} directory: {name} is missing",
                        f"expected the files of {cls.base_folder}: "
                        f"{', '.join(n for n, _ in [*cls.train_list, *cls.test_list])}, {cls.meta['filename']}", folder)
        _regular_file(path, _CIFAR_MAX_BYTES, f"{cls.__name__} file")
        if not check_integrity(str(path), md5):
            raise data_error(f"{name} is not the published {cls.__name__} file (its MD5 differs)",
                        "use the python-format archive from https://www.cs.toronto.edu/~kriz/cifar.html", path)


def _cifar(cls, folder: Path, image_size: int, seed: int, max_images: int | None) -> Dataset:
    """CIFAR-10/100 through torchvision's ``CIFAR10``/``CIFAR100`` (``download=False``)."""
    check_cifar_files(cls, folder)
    train, val = (cls(str(folder.parent), train=split, download=False) for split in (True, False))
    x_train, x_val = (np.asarray(d.data).transpose(0, 3, 1, 2) for d in (train, val))  # (N, 32, 32, 3) -> NCHW
    y_train, y_val = (np.asarray(d.targets, dtype=np.int64) for d in (train, val))
    x_train, y_train, x_val, y_val = _subsample(x_train, y_train, x_val, y_val, seed, max_images)
    to_t = lambda a: torch.from_numpy(a.astype(np.float32) / 255.0)  # noqa: E731
    return _finish(cls.__name__.lower(), to_t(x_train), y_train, to_t(x_val), y_val, len(train.classes), image_size)


def _subsample(x_train, y_train, x_val, y_val, seed: int, max_images: int | None):
    """Keep at most ``max_images`` in total, stratified, in the ratio of the published train/test split."""
    if max_images is None:
        return x_train, y_train, x_val, y_val
    n_val = max(1, round(max_images * len(y_val) / (len(y_val) + len(y_train))))
    keep_train = stratified_subset(y_train, max(1, max_images - n_val), seed)
    keep_val = stratified_subset(y_val, n_val, seed)
    return x_train[keep_train], y_train[keep_train], x_val[keep_val], y_val[keep_val]


# ------------------------------------------------------------------------------------ Fashion-MNIST

_IDX_MAX_BYTES = 64_000_000  # the largest Fashion-MNIST file, train images, is 47 MB uncompressed


def _stage_idx_files(source: Path, raw: Path) -> None:
    """Put the four IDX files where torchvision's ``FashionMNIST`` reads them (``raw``): a link to an
    uncompressed file, or the decompressed ``.gz`` (Debian ships them gzipped), capped in size."""

    for name in IDX_FILES:
        plain, packed = source / name, source / f"{name}.gz"
        if plain.exists():
            _regular_file(plain, _IDX_MAX_BYTES, "Fashion-MNIST file")
            os.symlink(plain.resolve(), raw / name)
            continue
        _regular_file(packed, _IDX_MAX_BYTES, "Fashion-MNIST file")
        try:
            with gzip.open(packed, "rb") as fh:
                data = fh.read(_IDX_MAX_BYTES + 1)
        except (OSError, EOFError) as exc:
            raise data_error(f"cannot decompress {packed.name}: {exc}", "expected the gzipped IDX files",
                             packed) from None
        if len(data) > _IDX_MAX_BYTES:
            raise data_error(f"{packed.name} decompresses to more than {_IDX_MAX_BYTES / 1e6:,.0f} MB", None, packed)
        (raw / name).write_bytes(data)


def fashion_mnist_arrays(source: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Fashion-MNIST's published split as ``(x_train (60000, 28, 28) uint8, y_train int64, x_test, y_test)``,
    read by torchvision's ``FashionMNIST``.

    The IDX files (plain or ``.gz``) are staged into a temporary ``FashionMNIST/raw`` folder that
    torchvision reads with ``download=False``; the folder is removed afterwards.

    Raises:
        SpecError: at ``data``: missing, oversized or malformed IDX files, image and label files of
            different lengths.
    """


    with tempfile.TemporaryDirectory(prefix="archspec-fmnist-") as tmp:
        raw = Path(tmp) / "FashionMNIST" / "raw"
        raw.mkdir(parents=True)
        _stage_idx_files(source, raw)
        try:
            train, val = (FashionMNIST(tmp, train=split, download=False) for split in (True, False))
        except (RuntimeError, ValueError, AssertionError) as exc:  # torchvision's checks of the IDX headers
            why = str(exc) or "a header is not in the IDX format (magic number or dimensions)"
            raise data_error(f"cannot read the IDX files: {why}", "expected the four Fashion-MNIST IDX files",
                        source) from None
    x_train, x_val = (d.data.numpy() for d in (train, val))  # (N, 28, 28) uint8
    y_train, y_val = (d.targets.numpy().astype(np.int64) for d in (train, val))
    if len(y_train) != len(x_train) or len(y_val) != len(x_val) or not len(y_val):
        raise data_error("the IDX image and label files disagree in length", None, source)
    return x_train, y_train, x_val, y_val


def _fashion_mnist(source: Path, image_size: int, seed: int, max_images: int | None) -> Dataset:
    """Fashion-MNIST (70,000 28x28 grey images, 10 classes) in memory (:func:`fashion_mnist_arrays`)."""
    x_train, y_train, x_val, y_val = fashion_mnist_arrays(source)
    x_train, x_val = x_train[:, None], x_val[:, None]  # (N, 1, 28, 28)
    x_train, y_train, x_val, y_val = _subsample(x_train, y_train, x_val, y_val, seed, max_images)
    to_t = lambda a: torch.from_numpy(a.astype(np.float32) / 255.0)  # noqa: E731
    return _finish("fashion-mnist", to_t(x_train), y_train, to_t(x_val), y_val, 10, image_size)


# ------------------------------------------------------------------------------------ ImageFolder


def _folder_images(root: Path) -> tuple[list[Path], list[str]]:
    """Image files and class names of an ImageFolder directory, as torchvision's ``ImageFolder`` finds them
    (``root/<class>/**/<image>``, classes sorted; empty class folders count as classes)."""

    def is_image(name: str) -> bool:
        path = Path(name)
        if path.suffix.lower() not in IMAGE_SUFFIXES:
            return False
        _regular_file(path)  # a FIFO named x.png would block Pillow forever
        return True

    try:
        folder = ImageFolder(str(root), loader=str, is_valid_file=is_image, allow_empty=True)
    except FileNotFoundError:  # torchvision: no class folder at all
        return [], []
    return [Path(p) for p, _ in folder.samples], list(folder.classes)


def _load_image(path: Path, image_size: int) -> np.ndarray:
    """One image as ``(image_size, image_size, 3)`` float32 in [0, 1], read by :func:`archspec.io.images.read_image`.

    Raises:
        SpecError: on ``data``: the file cannot be decoded, is not a regular file, or is a
            decompression bomb (more pixels than Pillow's ``Image.MAX_IMAGE_PIXELS``).
    """


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
            raise data_error("the train/ or val/ folder holds no images",
                        "layout: root/train/<class>/*.png, root/val/<class>/*.png", root)
        index = {c: i for i, c in enumerate(classes)}
        unknown = sorted(set(val_classes) - set(index))
        if unknown:
            raise data_error(f"val classes {unknown} are not among the train classes", None, split_dirs[1])
        y_train = np.array([index[f.relative_to(split_dirs[0]).parts[0]] for f in train_files], dtype=np.int64)
        y_val = np.array([index[f.relative_to(split_dirs[1]).parts[0]] for f in val_files], dtype=np.int64)
        if max_images is not None:
            n_val = max(1, round(max_images * len(y_val) / (len(y_val) + len(y_train))))
            kt, kv = (stratified_subset(y_train, max(1, max_images - n_val), seed),
                      stratified_subset(y_val, n_val, seed))
            train_files, y_train = [train_files[i] for i in kt], y_train[kt]
            val_files, y_val = [val_files[i] for i in kv], y_val[kv]
    else:
        files, classes = _folder_images(root)
        if not files:
            raise data_error("no images found", "ImageFolder layout: root/<class>/<image>.png (one folder per class)",
                             root)
        labels = np.array([classes.index(f.relative_to(root).parts[0]) for f in files], dtype=np.int64)
        if max_images is not None:
            keep = stratified_subset(labels, max_images, seed)
            files, labels = [files[i] for i in keep], labels[keep]
        if len(files) < 2:
            raise data_error(f"only {len(files)} image found; a train/val split needs at least 2", None, root)
        train_idx, val_idx = split_indices(labels, seed)
        train_files, y_train = [files[i] for i in train_idx], labels[train_idx]
        val_files, y_val = [files[i] for i in val_idx], labels[val_idx]
    if len(classes) < 2:
        raise data_error(f"found {len(classes)} class folder(s); classification needs at least 2", None, root)
    x_train, x_val = _load_images(train_files, image_size), _load_images(val_files, image_size)
    return _finish(f"imagefolder:{root.name}", x_train, y_train, x_val, y_val, len(classes), image_size)


def load_data(source: str | os.PathLike | None, image_size: int, seed: int = 0,
              max_images: int | None = None) -> Dataset:
    """Load a labelled image dataset into memory at ``image_size`` x ``image_size`` (see the module docstring).

    Args:
        source: ``None`` (scikit-learn digits), ``"digits"``, ``"fashion-mnist"`` (Debian's
            ``dataset-fashion-mnist``), a directory holding the four Fashion-MNIST IDX files, a CIFAR-10/100
            directory (``cifar-10-batches-py`` / ``cifar-100-python`` or their parent) or an ImageFolder directory.
        image_size: side of the square images returned.
        seed: seed of the train/val split and of ``max_images`` subsampling (same seed, same split).
        max_images: keep at most this many images in total (stratified), for quick runs and tests.

    Returns:
        :class:`Dataset` with images ``(N, C, image_size, image_size)`` float32, normalised per channel.

    Raises:
        SpecError: at ``data``: Fashion-MNIST not installed (with the apt line), a missing path, a file
            instead of a directory, no images, unreadable or undecodable files, decompression bombs, FIFOs
            or devices among the files, CIFAR files that are not the published ones, malformed IDX files --
            with the offending path as the file (``data``: the field that ``source`` is to :func:`archspec.train.fit`
            and :class:`archspec.search.SearchConfig`); at ``max_images``: fewer than 2.
    """
    if not isinstance(image_size, int) or image_size < 1:
        raise data_error(f"image size must be a positive integer, got {image_size!r}", None, None)
    if max_images is not None and max_images < 2:
        raise SpecError.single(("max_images",),
                               f"must be at least 2 (a train and a validation image), got {max_images}")
    if source is None or str(source) == "digits":
        return _digits(image_size, seed, max_images)
    try:
        if str(source) == "fashion-mnist":
            return _fashion_mnist(fashion_mnist_dir(), image_size, seed, max_images)
        return _load_directory(Path(source).expanduser(), image_size, seed, max_images)
    except PermissionError as exc:
        raise data_error(f"cannot read: {exc.strerror}", None, exc.filename or source) from None


def _load_directory(root: Path, image_size: int, seed: int, max_images: int | None) -> Dataset:
    hint = DATA_HINT
    if not root.exists():
        raise data_error("no such directory", hint, root)
    if not root.is_dir():
        raise data_error("not a directory", hint, root)
    cifar = cifar_class(root)
    if cifar is not None:
        return _cifar(*cifar, image_size, seed, max_images)
    if any(root.glob("data_batch_*")):
        raise data_error("a CIFAR-10 batch outside a cifar-10-batches-py directory",
                    "keep the published directory name, cifar-10-batches-py", root)
    if is_idx_dir(root):
        return _fashion_mnist(root, image_size, seed, max_images)
    return _image_folder(root, image_size, seed, max_images)
