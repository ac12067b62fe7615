"""`archspec search` and `archspec search masks` write nothing before every input is known to be good.

Each bad input exits 2 with a message naming the option (and file), and afterwards the working
directory holds exactly what it held before: no ``runs/<study>/``, no ``study.db``, and a user's file
given as ``--storage`` keeps its bytes.  Every case fails before any training (seconds each).
"""

from __future__ import annotations

import hashlib
import os
import signal
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image
from search_fixtures import TINY_SPACE

from archspec.cli import main
from archspec.errors import SpecError
from archspec.search._storage import check_storage

MAIT = """\
name: tiny_mait
input: {channels: 3, resolution: 32}
stem: {kind: patch, patch_size: 4}
tokens: {cls_token: input, pos_embed: learned}
stages:
  - {depth: 2, dim: 32, heads: 2, attention: mhsa, layers: [{range: 0, heads: ["mask:3x3", mhsa]}]}
head: {pool: cls, num_classes: 10}
"""
NO_ATTENTION = MAIT.replace("attention: mhsa, layers: [{range: 0, heads: [\"mask:3x3\", mhsa]}]",
                            "mixer: {kind: conv}").replace("cls_token: input", "cls_token: none").replace("pool: cls",
                                                                                                         "pool: mean")
FAST = ["--proxy-steps", "1", "--proxy-size", "32", "--max-images", "40", "--latency-repeats", "1", "--no-progress",
        "--study-name", "t"]


def _png_header(width: int, height: int) -> bytes:
    """A PNG that claims ``width`` x ``height`` RGB pixels and holds none (what a decompression bomb looks like)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IEND", b""))


@pytest.fixture()
def work(tmp_path, monkeypatch):
    """A working directory with a tiny space, a masked spec and a good 2-class ImageFolder."""
    monkeypatch.chdir(tmp_path)
    Path("space.yaml").write_text(yaml.safe_dump(TINY_SPACE))
    Path("mait.yaml").write_text(MAIT)
    Path("conv.yaml").write_text(NO_ATTENTION)
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        Path("folder", c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(f"folder/{c}/{i}.png")
    Path("notes.txt").write_text("a user's file\n")
    Path("foreign").mkdir()
    Path("foreign/best.yaml").write_text("mine\n")
    return tmp_path


def _snapshot(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir" if p.is_dir() else "other"
    return out


def _refused(argv: list[str], needles: list[str], capsys, root: Path) -> None:
    before = _snapshot(root)
    signal.alarm(30)  # a hang (a FIFO among the images) fails the test instead of the suite
    try:
        assert main(argv) == 2, capsys.readouterr().err
    finally:
        signal.alarm(0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)
    assert _snapshot(root) == before  # no runs/, no study.db, no file touched


DESIGN = ["search", "--space", "space.yaml", *FAST]
MASKS = ["search", "masks", "mait.yaml", *FAST]


@pytest.mark.parametrize("extra, needles", [
    (["--data", "nope"], ["--data", "nope"]),
    (["--data", "notes.txt"], ["--data", "not a directory"]),
    (["--data", "foreign"], ["--data", "no images"]),
    (["--max-images", "1"], ["--max-images", ">= 2"]),
    (["--budget-flops", "1k"], ["--budget-flops", "smallest achievable"]),
    (["--budget-flops", "lots"], ["--budget-flops"]),
    (["--study-name", "../evil"], ["--study-name"]),
    (["--proxy-lr", "-1"], ["--proxy-lr"]),
    (["--latency-device", "tpu9"], ["--latency-device"]),
    (["--out", "notes.txt"], ["--out", "not a directory"]),
    (["--out", "foreign"], ["--out", "did not write"]),
    (["--storage", "sqlite:///notes.txt"], ["--storage", "not an SQLite database"]),
    (["--storage", "journal:notes.txt"], ["--storage", "not an Optuna journal"]),
    (["--storage", "sqlite:///nodir/x.db"], ["--storage", "does not exist"]),
    (["--timeout", "nan"], ["--timeout", "finite"]),
    (["--trial-timeout", "inf"], ["--trial-timeout", "finite"]),
    (["--proxy-lr", "inf"], ["--proxy-lr", "finite"]),
    (["--seed", "-1"], ["--seed", "seed must be in [0, 2^31), got -1"]),  # issue 57: numpy's ValueError before
    (["--seed", "4294967296"], ["--seed", "got 4294967296"]),
])
def test_design_bad_input_writes_nothing(work, capsys, extra, needles):
    _refused([*DESIGN, *extra], needles, capsys, work)


def test_design_bad_space_writes_nothing(work, capsys):
    bad = {**TINY_SPACE, "spec": {**TINY_SPACE["spec"], "stages": [{**TINY_SPACE["spec"]["stages"][0], "heads": 0}]}}
    Path("bad.yaml").write_text(yaml.safe_dump(bad))
    _refused(["search", "--space", "bad.yaml", *FAST], ["bad.yaml", "heads"], capsys, work)
    _refused(["search", "--space", "missing.yaml", *FAST], ["missing.yaml", "no such"], capsys, work)


@pytest.mark.parametrize("extra, needles", [
    (["--window", "99x99"], ["--window", "99x99 masks do not fit"]),
    (["--window", "4x4"], ["--window"]),
    (["--strategy", "soft", "--window", "99x99"], ["--window"]),
    (["--als-low", "0.9"], ["--als-low"]),
    (["--max-images", "1"], ["--max-images", ">= 2"]),
    (["--data", "nope"], ["--data"]),
    (["--budget-flops", "1G"], ["--budget-flops"]),
    (["--strategy", "optuna", "--windows", "4x4"], ["--windows"]),
    (["--strategy", "optuna", "--max-masked", "0"], ["--max-masked", ">= 1"]),
    (["--storage", "sqlite:///notes.txt"], ["--storage", "not an SQLite database"]),
    (["--seed", "-1"], ["--seed", "seed must be in [0, 2^31)"]),
    (["--strategy", "optuna", "--seed", "4294967296"], ["--seed", "got 4294967296"]),
])
def test_masks_bad_input_writes_nothing(work, capsys, extra, needles):
    _refused([*MASKS, *extra], needles, capsys, work)


CONV_ONLY = """\
name: conv_only
input: {channels: 3, resolution: 32}
stem: {kind: resnet}
stages:
  - {kind: conv, block: basic, depth: 1, channels: 8}
head: {num_classes: 10}
"""


def test_masks_bad_spec_writes_nothing(work, capsys):
    _refused(["search", "masks", "none.yaml", *FAST], ["none.yaml"], capsys, work)
    _refused(["search", "masks", "conv.yaml", *FAST], ["conv.yaml: SPEC:", "no attention layer"], capsys, work)
    # issue 57: a spec without token stages named "<spec>", not its file (a conv net without tokens: is valid now)
    Path("resnet_like.yaml").write_text(CONV_ONLY)
    _refused(["search", "masks", "resnet_like.yaml", *FAST],
             ["resnet_like.yaml: SPEC: spec 'conv_only' has no attention stage"], capsys, work)


# ----------------------------------------------------------------------------------- --data images
def test_decompression_bomb_is_named(work, capsys):
    Path("folder/cat/bomb.png").write_bytes(_png_header(15000, 15000))  # 225 Mpx: Pillow raises DecompressionBombError
    _refused([*DESIGN, "--data", "folder"], ["--data", "bomb.png", "too large"], capsys, work)
    Path("folder/cat/bomb.png").write_bytes(_png_header(10000, 10000))  # 100 Mpx: Pillow only warns, then allocates
    _refused([*DESIGN, "--data", "folder"], ["bomb.png", "too large"], capsys, work)


def test_broken_image_is_named(work, capsys):
    Path("folder/dog/broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    _refused([*MASKS, "--data", "folder"], ["--data", "broken.png", "cannot read the image"], capsys, work)


def test_fifo_image_is_named_not_waited_on(work, capsys):
    os.mkfifo("folder/dog/pipe.png")
    _refused([*DESIGN, "--data", "folder"], ["--data", "pipe.png", "not a regular file"], capsys, work)


@pytest.mark.slow
def test_cifar_problems_are_named(work, capsys):
    cifar = Path("cifar-10-batches-py")
    cifar.mkdir()
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (cifar / name).write_bytes(b"not a pickle")
    _refused([*DESIGN, "--data", str(cifar)], ["--data", "data_batch_1", "not the published CIFAR10 file"], capsys,
             work)
    os.remove(cifar / "data_batch_1")
    _refused([*DESIGN, "--data", str(cifar)], ["--data", "data_batch_1 is missing"], capsys, work)
    os.mkfifo(cifar / "data_batch_1")
    _refused([*DESIGN, "--data", str(cifar)], ["--data", "data_batch_1", "not a regular file"], capsys, work)
    os.remove(cifar / "data_batch_1")
    with open(cifar / "data_batch_1", "wb") as f:
        f.truncate(10**9)  # sparse 1 GB: refused from its size, never hashed or unpickled
    _refused([*DESIGN, "--data", str(cifar)], ["--data", "data_batch_1", "1,000 MB"], capsys, work)


# ----------------------------------------------------------------------------------- --storage
def test_storage_refuses_foreign_files_but_accepts_its_own(tmp_path):
    user = tmp_path / "thesis.tex"
    user.write_text("\\documentclass{article}\n")
    for url, needle in [(f"sqlite:///{user}", "not an SQLite database"), (f"journal:{user}", "not an Optuna journal")]:
        with pytest.raises(SpecError, match=needle):
            check_storage(url)
    assert user.read_text() == "\\documentclass{article}\n"
    empty = tmp_path / "empty.db"
    empty.touch()  # what a concurrent worker's fresh SQLite file looks like: accepted
    check_storage(f"sqlite:///{empty}")
    check_storage(f"sqlite:///{tmp_path / 'new.db'}")
    real = tmp_path / "real.db"
    import sqlite3

    sqlite3.connect(real).execute("create table t (x)").connection.commit()
    check_storage(f"sqlite:///{real}")


def test_load_data_refuses_one_image():
    from archspec.io.datasets import load_data

    with pytest.raises(SpecError, match="max_images"):
        load_data(None, image_size=16, max_images=1)
