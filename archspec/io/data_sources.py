"""Where a data set comes from, checked without reading it (torch-free): the ``data`` names and paths.

:func:`check_source` is the cheap check every entry point runs on its ``data`` before anything heavy is imported
(on the command line ``archspec train SPEC --data nope`` answers before torch loads); :mod:`archspec.io.datasets`
(torch) loads the data and re-exports every name here.  A problem is reported at the field ``data`` (the keyword
of :func:`archspec.train.fit` and of :class:`archspec.search.SearchConfig`); ``archspec.cli`` names it ``--data``
(``--calibrate`` for ``build`` and ``export``).
"""

from __future__ import annotations

import os
from pathlib import Path

from archspec.errors import SpecError

__all__ = ["DATA_OPTION", "DATA_HINT", "FASHION_MNIST_DIR", "FASHION_MNIST_INSTALL", "IDX_FILES", "check_source",
           "check_data_dir", "data_error", "fashion_mnist_dir", "is_idx_dir"]

DATA_OPTION = ("data",)  # the field a data problem is reported at

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
FASHION_MNIST_INSTALL = "apt-get install dataset-fashion-mnist"
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def data_error(message: str, hint: str | None, path: object) -> SpecError:
    """The :class:`SpecError` at ``data`` for a dataset problem found at ``path`` (file or directory)."""
    return SpecError.single(DATA_OPTION, message, hint, str(path) if path is not None else None)


def is_idx_dir(path: Path) -> bool:
    return all((path / f).exists() or (path / f"{f}.gz").exists() for f in IDX_FILES)


def fashion_mnist_dir() -> Path:
    """The installed Fashion-MNIST, or a SpecError that says how to install it."""
    if not is_idx_dir(FASHION_MNIST_DIR):
        raise data_error(f"Fashion-MNIST is not installed ({FASHION_MNIST_DIR} holds no IDX files)",
                    f"on Debian/Ubuntu: sudo {FASHION_MNIST_INSTALL}; or give `data` DIR holding "
                    f"{', '.join(IDX_FILES)} (optionally .gz)", FASHION_MNIST_DIR)
    return FASHION_MNIST_DIR


DATA_HINT = ("give `data` fashion-mnist, a CIFAR-10/100 directory (cifar-10-batches-py, cifar-100-python), "
             "a directory of Fashion-MNIST IDX files or an ImageFolder directory (one sub-directory per class), "
             "or leave `data` out for the built-in digits")


def check_source(source: str | os.PathLike | None) -> None:
    """Cheap check of ``source`` (a ``data`` argument) before anything is read or written: a name archspec knows
    (``digits``, ``fashion-mnist`` -- installed), or an existing path.

    Raises:
        SpecError: at ``data``: Fashion-MNIST is not installed (with the apt line), or no such path.
    """
    if source is None or str(source) == "digits":
        return
    if str(source) == "fashion-mnist":
        fashion_mnist_dir()
        return
    if not Path(source).expanduser().exists():
        raise data_error(f"no such file or directory: {source}", DATA_HINT, source)


def check_data_dir(source: str | os.PathLike | None) -> Path | None:
    """The ``data`` of :func:`archspec.train.fit` (streamed from disk), checked before anything is read or torch
    imported: ``None`` for the built-in digits, else the directory to read (Fashion-MNIST's when ``fashion-mnist``).

    Raises:
        SpecError: at ``data``: Fashion-MNIST is not installed (with the apt line), no such directory, or a
            file instead of a directory.
    """
    if source is None or str(source) == "digits":
        return None
    if str(source) == "fashion-mnist":
        return fashion_mnist_dir()
    root = Path(source).expanduser()
    if not root.exists():
        raise data_error("no such directory", DATA_HINT, root)
    if not root.is_dir():
        raise data_error("not a directory", DATA_HINT, root)
    return root
