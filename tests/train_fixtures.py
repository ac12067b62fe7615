"""What the training-run tests share (tests/test_train_run.py, tests/test_train_safety.py): a one-block ViT for
two classes, a folder of striped PNGs it can learn, and a quick TrainConfig; the families' train-and-resume check
(:func:`train_then_resume`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from archspec.cli import main
from archspec.train import TrainConfig
from tests.test_train import TINY as TINY_10

# the one-block ViT of tests/test_train.py, for a 2-class data set
TINY = TINY_10.replace("name: t\n", "name: tiny_train\n").replace("num_classes: 10", "num_classes: 2")


def image_folder(root: Path, per_class: int = 24, size: int = 16) -> Path:
    """Two classes a model can tell apart: horizontal vs vertical stripes, with seeded noise (PNG files)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    stripes = (np.arange(size) // 2 % 2 * 200).astype(np.float64)
    patterns = {"horizontal": stripes[:, None].repeat(size, 1), "vertical": stripes[None].repeat(size, 0)}
    for label, pattern in patterns.items():
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            pixels = np.clip(pattern + rng.normal(0, 30, (size, size)), 0, 255).astype(np.uint8)
            Image.fromarray(np.stack([pixels] * 3, -1)).save(root / label / f"{i}.png")
    return root


def train_then_resume(source: Path, tmp_path: Path) -> dict:
    """``archspec train`` of the spec file ``source`` on a striped folder: 2 steps with a checkpoint after each, the
    summary deleted (what a kill after the checkpoint leaves), then ``--resume`` to 4 steps; returns the final
    summary (asserting both runs exit 0 and the weights were written)."""
    data, run = image_folder(tmp_path / "stripes"), tmp_path / "run"
    quick = ["--data", str(data), "--out", str(run), "--max-images", "40", "--batch-size", "8", "--workers", "0",
             "--quiet"]
    assert main(["train", str(source), *quick, "--steps", "2", "--checkpoint-every", "1"]) == 0
    (run / "summary.json").unlink()
    assert main(["train", str(source), *quick, "--steps", "4", "--resume"]) == 0
    assert (run / "model" / "model.safetensors").is_file()
    return json.loads((run / "summary.json").read_text())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The striped image folder (24 PNGs a class, 16 px), once per module."""
    return image_folder(tmp_path_factory.mktemp("data") / "stripes")


@pytest.fixture
def spec_file(tmp_path):
    """:data:`TINY` written to a YAML file."""
    path = tmp_path / "tiny_train.yaml"
    path.write_text(TINY)
    return path


def quick_config(**kw) -> TrainConfig:
    """12 steps of batch 8 on CPU, evaluated every 6, no loader workers; ``kw`` overrides."""
    base = {"steps": 12, "batch_size": 8, "lr": 3e-3, "warmup_steps": 2, "eval_every": 6, "workers": 0,
            "log_every": 4, "smoothing": 0.0}
    return TrainConfig(**{**base, **kw})
