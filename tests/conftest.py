"""Shared fixtures: keep torch to the machine's 2 cores and give tests real images."""

from __future__ import annotations

import pytest
import torch

from archspec.image import sample_batch


@pytest.fixture(scope="session")
def real_images() -> torch.Tensor:
    """Three real photographs (matplotlib's grace_hopper, scikit-learn's china and flower), (3, 3, 224, 224)."""
    return sample_batch((224, 224))
