"""The embedded real photograph and image loading.

The default input is Grace Hopper's portrait (``grace_hopper.jpg``), which matplotlib ships inside
its wheel (``matplotlib/mpl-data/sample_data``).  :func:`sample_batch` adds the two photographs
scikit-learn ships (``china.jpg``, ``flower.jpg``) for tests that need a batch of real images.
"""

from __future__ import annotations

import os
import re
import stat
import warnings
from pathlib import Path

import matplotlib  # the photograph's home (its sample data); no pyplot, no backend is chosen
import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from sklearn.datasets import load_sample_images
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform

from archspec.errors import SpecError


def default_image_path() -> Path:
    """Path of the embedded photograph (matplotlib's ``grace_hopper.jpg``)."""
    return Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"


def _to_tensor(image: Image.Image, resolution: tuple[int, int], channels: int) -> torch.Tensor:
    """PIL image -> ``(1, channels, H, W)``: timm's eval transform (bicubic resize, centre crop 0.875,
    ImageNet norm)."""
    if channels == 1:
        image = image.convert("L").convert("RGB")
    else:
        image = image.convert("RGB")
    transform = create_transform(input_size=(3, *resolution), crop_pct=0.875, interpolation="bicubic",
                                 mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD)
    x = transform(image)  # (3, H, W)
    if channels != 3:  # grey for 1 channel; otherwise repeat RGB cyclically to the spec's channel count
        x = x[:1] if channels == 1 else x[torch.arange(channels) % 3]
    return x.unsqueeze(0)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _open_regular(path: Path, option: str):
    """Open ``path`` for reading only if it is a regular file; a FIFO or device is never opened for reading.

    ``os.stat`` rejects them before any ``open``; the descriptor is opened non-blocking and checked
    again with ``fstat``, so a FIFO swapped in between cannot make the read hang.

    Raises:
        SpecError: on ``option``: missing, unreadable, or not a regular file (directory, FIFO, device, socket).
    """
    hint = "give a JPEG or PNG file"
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISREG(mode):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
            mode = os.fstat(fd).st_mode
            if stat.S_ISREG(mode):
                return os.fdopen(fd, "rb")
            os.close(fd)
    except FileNotFoundError:
        raise SpecError.single((option,), "no such image file", None, str(path)) from None
    except OSError as exc:
        raise SpecError.single((option,), f"cannot read the image: {exc.strerror or exc}", hint, str(path)) from None
    raise SpecError.single((option,), f"cannot read the image: it is {_kind(mode)}, not a regular file", hint,
                           str(path))


def _bomb_error(path: Path, exc: Exception, option: str) -> SpecError:
    """PIL's decompression-bomb check, as a message with the pixel count."""
    match = re.search(r"\((\d+) pixels\)", str(exc))
    pixels = f"{int(match.group(1)):,} pixels" if match else "too many pixels"
    return SpecError.single((option,), f"the image is too large to decode safely: it has {pixels}, more than PIL's "
                            f"limit of {Image.MAX_IMAGE_PIXELS:,} (PIL.Image.MAX_IMAGE_PIXELS, a guard against "
                            "decompression bombs)", "resize it first (the model sees it at a small resolution anyway)",
                            str(path))


def read_image(path: str | os.PathLike, option: str = "--image") -> Image.Image:
    """Decode the image file ``path`` into an RGB PIL image (pixels loaded), refusing anything unsafe.

    One reader for ``archspec build --image`` and the search's ``--data`` images.  Images over PIL's
    ``MAX_IMAGE_PIXELS`` are refused before decoding (PIL itself only warns up to twice that, then
    allocates gigabytes: a 26 kB PNG can claim 15000 x 15000 pixels).

    Raises:
        SpecError: on ``option`` with the file named: missing, not a regular file (a FIFO is never
            opened for reading, so it cannot hang), not a readable image, or over PIL's pixel limit.
    """
    path = Path(path)
    with _open_regular(path, option) as fh, warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(fh) as image:
                return image.convert("RGB")
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise _bomb_error(path, exc, option) from None
        except UnidentifiedImageError:
            raise SpecError.single((option,), "cannot read the image: not an image format PIL knows",
                                   "give a JPEG or PNG file", str(path)) from None
        except Exception as exc:  # noqa: BLE001 - PIL raises OSError, SyntaxError, struct.error... for damaged files
            raise SpecError.single((option,), f"cannot read the image: {type(exc).__name__}: {str(exc)[:200]}",
                                   "give a JPEG or PNG file", str(path)) from None


def load_image(path: str | os.PathLike | None, resolution: tuple[int, int], channels: int = 3) -> torch.Tensor:
    """Load ``path`` (default: the embedded photo) as a normalised batch ``(1, channels, H, W)``.

    Raises:
        SpecError: on ``--image``, as :func:`read_image` says.
    """
    return _to_tensor(read_image(path if path is not None else default_image_path()), resolution, channels)


def sample_batch(resolution: tuple[int, int] = (224, 224), channels: int = 3) -> torch.Tensor:
    """Three real photographs as ``(3, channels, H, W)``: grace_hopper (matplotlib), china and flower (scikit-learn)."""

    images = [Image.open(default_image_path())]
    images += [Image.fromarray(np.asarray(a)) for a in load_sample_images().images]
    return torch.cat([_to_tensor(im, resolution, channels) for im in images])
