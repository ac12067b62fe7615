"""The embedded real photograph and image loading.

The default input is Grace Hopper's portrait (``grace_hopper.jpg``), which matplotlib ships inside
its wheel (``matplotlib/mpl-data/sample_data``).  :func:`sample_batch` adds the two photographs
scikit-learn ships (``china.jpg``, ``flower.jpg``) for tests that need a batch of real images.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform

from archspec.errors import SpecError


def default_image_path() -> Path:
    """Path of the embedded photograph (matplotlib's ``grace_hopper.jpg``)."""
    import matplotlib

    return Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"


def _to_tensor(image: Image.Image, resolution: tuple[int, int], channels: int) -> torch.Tensor:
    """PIL image -> ``(1, channels, H, W)``: timm's eval transform (bicubic resize, centre crop 0.875, ImageNet norm)."""
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


def load_image(path: "str | os.PathLike | None", resolution: tuple[int, int], channels: int = 3) -> torch.Tensor:
    """Load ``path`` (default: the embedded photo) as a normalised batch ``(1, channels, H, W)``.

    Raises:
        SpecError: the file is missing or is not an image.
    """
    path = Path(path) if path is not None else default_image_path()
    try:
        with Image.open(path) as image:
            return _to_tensor(image, resolution, channels)
    except FileNotFoundError:
        raise SpecError.single(("--image",), "no such image file", None, str(path)) from None
    except (UnidentifiedImageError, OSError) as exc:
        raise SpecError.single(("--image",), f"cannot read the image: {exc}", "give a JPEG or PNG file", str(path)) from None


def sample_batch(resolution: tuple[int, int] = (224, 224), channels: int = 3) -> torch.Tensor:
    """Three real photographs as ``(3, channels, H, W)``: grace_hopper (matplotlib), china and flower (scikit-learn)."""
    from sklearn.datasets import load_sample_images

    images = [Image.open(default_image_path())]
    images += [Image.fromarray(np.asarray(a)) for a in load_sample_images().images]
    return torch.cat([_to_tensor(im, resolution, channels) for im in images])
