"""archspec.io.datasets: Fashion-MNIST and CIFAR through torchvision's readers, on tiny files written here.

The tests never need Debian's ``dataset-fashion-mnist`` nor the real CIFAR archives: they write
IDX files (the format of LeCun's MNIST page: big-endian magic ``0x00000803``/``0x00000801``, sizes, bytes)
and CIFAR pickles themselves, and check that the pixels and labels come back where they were written.
"""

from __future__ import annotations

import gzip
import hashlib
import pickle
import struct

import numpy as np
import pytest
import torch

from archspec import SpecError
from archspec.io import data_sources as data_module  # where FASHION_MNIST_DIR lives
from archspec.io.datasets import load_data

IDX_NAMES = {"train": "train", "test": "t10k"}


def _idx_images(images: np.ndarray) -> bytes:
    n, rows, cols = images.shape
    return struct.pack(">IIII", 0x00000803, n, rows, cols) + images.astype(np.uint8).tobytes()


def _idx_labels(labels: np.ndarray) -> bytes:
    return struct.pack(">II", 0x00000801, len(labels)) + labels.astype(np.uint8).tobytes()


def _write_idx(root, n_train=40, n_test=20, gz=True):
    """Four IDX files whose image k is filled with the value 5 * label + k % 5 (so pixels identify labels)."""
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        labels = np.arange(n) % 10
        images = np.broadcast_to((5 * labels + np.arange(n) % 5)[:, None, None], (n, 28, 28))
        for kind, payload in (("images-idx3-ubyte", _idx_images(images)), ("labels-idx1-ubyte", _idx_labels(labels))):
            name = f"{IDX_NAMES[split]}-{kind}"
            if gz:
                (root / f"{name}.gz").write_bytes(gzip.compress(payload))
            else:
                (root / name).write_bytes(payload)
    return root


@pytest.mark.parametrize("gz", [True, False], ids=["gzipped (Debian)", "plain"])
def test_idx_directory_reads_pixels_and_labels_in_order(tmp_path, gz):
    _write_idx(tmp_path / "fm", gz=gz)
    data = load_data(tmp_path / "fm", 28)
    assert data.name == "fashion-mnist" and data.num_classes == 10 and data.channels == 1
    assert len(data.train) == 40 and len(data.val) == 20  # the published train/test split, not a re-split
    x, y = data.train.tensors
    assert x.shape == (40, 1, 28, 28) and y.tolist() == [k % 10 for k in range(40)]
    # normalisation is affine, so the raw value order survives: pixel value 5 * label + k % 5
    raw = torch.tensor([5 * (k % 10) + k % 5 for k in range(40)], dtype=torch.float32)
    order = torch.argsort(x[:, 0, 0, 0], stable=True)
    assert torch.equal(order, torch.argsort(raw, stable=True))
    assert torch.allclose(x[:, 0], x[:, 0, :1, :1].expand(-1, 28, 28))  # constant images stay constant


def test_fashion_mnist_keyword_reads_the_debian_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(data_module, "FASHION_MNIST_DIR", _write_idx(tmp_path / "usr-share"))
    data = load_data("fashion-mnist", 14, max_images=30)
    assert data.train.tensors[0].shape[1:] == (1, 14, 14) and len(data.train) + len(data.val) == 30


def test_fashion_mnist_missing_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(data_module, "FASHION_MNIST_DIR", tmp_path / "nothing")
    with pytest.raises(SpecError) as info:
        load_data("fashion-mnist", 28)
    problem = info.value.problems[0]
    assert problem.path == ("data",) and "not installed" in problem.message
    assert "apt-get install dataset-fashion-mnist" in problem.hint


def test_idx_file_with_a_wrong_magic_number_is_explained(tmp_path):
    root = _write_idx(tmp_path / "fm", gz=False)
    images = root / "train-images-idx3-ubyte"
    images.write_bytes(b"\x00\x00\x08\x09" + images.read_bytes()[4:])  # magic 0x0809: no IDX type
    with pytest.raises(SpecError) as info:
        load_data(root, 28)
    assert "not in the IDX format" in info.value.problems[0].message


def test_broken_idx_file_is_named(tmp_path):
    root = _write_idx(tmp_path / "fm")
    (root / "t10k-labels-idx1-ubyte.gz").write_bytes(b"not gzip at all")
    with pytest.raises(SpecError) as info:
        load_data(root, 28)
    assert "t10k-labels-idx1-ubyte.gz" in info.value.problems[0].message


def _write_cifar(root, monkeypatch, n=20, classes=10):
    """A CIFAR-10 directory of tiny batches, with torchvision's published MD5s pointed at them."""
    from torchvision.datasets import CIFAR10

    folder = root / CIFAR10.base_folder
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    md5 = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"labels": [i % classes for i in range(n)],
                 "data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(classes)]}))
    for f in folder.iterdir():
        md5[f.name] = hashlib.md5(f.read_bytes()).hexdigest()
    monkeypatch.setattr(CIFAR10, "train_list", [[f"data_batch_{i}", md5[f"data_batch_{i}"]] for i in range(1, 6)])
    monkeypatch.setattr(CIFAR10, "test_list", [["test_batch", md5["test_batch"]]])
    monkeypatch.setattr(CIFAR10, "meta", {"filename": "batches.meta", "key": "label_names", "md5": md5["batches.meta"]})
    return folder


def test_cifar10_through_torchvision(tmp_path, monkeypatch):
    folder = _write_cifar(tmp_path, monkeypatch)
    data = load_data(tmp_path, 16)
    assert data.name == "cifar10" and data.num_classes == 10 and data.channels == 3
    assert data.train.tensors[0].shape == (100, 3, 16, 16) and data.val.tensors[0].shape == (20, 3, 16, 16)
    assert load_data(folder, 32, max_images=60).train.tensors[0].shape[1:] == (3, 32, 32)


def test_cifar_with_a_foreign_pickle_is_refused_before_unpickling(tmp_path, monkeypatch):
    folder = _write_cifar(tmp_path, monkeypatch)

    class Evil:
        def __reduce__(self):
            return (exec, ("raise SystemExit('unpickled')",))

    (folder / "test_batch").write_bytes(pickle.dumps({"data": Evil(), "labels": [0]}))
    with pytest.raises(SpecError) as info:
        load_data(tmp_path, 16)
    assert info.value.problems[0].path == ("data",) and "test_batch" in info.value.problems[0].message
    assert "MD5" in info.value.problems[0].message


@pytest.mark.slow
def test_search_cli_on_fashion_mnist(tmp_path, monkeypatch, one_thread):
    """`archspec search --data fashion-mnist` end to end (the Debian directory stood in for by tiny IDX files)."""
    import json

    import yaml
    from search_fixtures import TINY_SPACE

    from archspec.cli import main

    monkeypatch.setattr(data_module, "FASHION_MNIST_DIR", _write_idx(tmp_path / "usr-share", n_train=60, n_test=20))
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(TINY_SPACE), encoding="utf-8")
    out = tmp_path / "run"
    assert main(["search", "--space", str(space), "--data", "fashion-mnist", "--device", "cpu", "--out", str(out),
                 "--trials", "1", "--proxy-steps", "2", "--proxy-size", "32", "--proxy-batch", "8",
                 "--latency-repeats", "2", "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["name"] == "fashion-mnist" and summary["data"]["channels"] == 1
    assert summary["data"]["train"] == 60 and summary["data"]["val"] == 20


def test_search_cli_without_fashion_mnist_says_how_to_install(tmp_path, monkeypatch, capsys):
    from archspec.cli import main

    monkeypatch.setattr(data_module, "FASHION_MNIST_DIR", tmp_path / "absent")
    monkeypatch.chdir(tmp_path)
    assert main(["search", "--data", "fashion-mnist", "--trials", "1"]) == 2
    err = capsys.readouterr().err
    assert "--data" in err and "apt-get install dataset-fashion-mnist" in err
    assert list(tmp_path.iterdir()) == []  # nothing written
