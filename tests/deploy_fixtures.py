"""The model the deployment tests share: LeViT-128S at 64 px with BatchNorm statistics of real photographs.

At 64 px it has 4x4 tokens, both shrinking attentions and the NormLinear head.  Its BatchNorm running statistics
are those of the three real photographs (flipped and shifted copies too, train-mode forwards), so activations
and logits have the scale of a trained model: with random-init statistics the logits are ~1e-4 and any
tolerance is meaningless.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import archspec
from archspec.io.images import sample_batch
from archspec.ir.checked import load_spec

RESOLUTION = 64

# LeViT-128S's stem, blocks, shrink attention and distillation head at depth 1 + 1: the build, int8, compile and
# export paths of the command line, not the model's size, are what the command-line tests check.  Inductor compiles
# a graph in time that grows with its ops: with LeViT-128S's 11 attention layers the build test took 73 s of CPU,
# with these 3 about 36 s (issue 53).
LEVIT_1_1 = """\
name: levit_1_1
source: "LeViT-128S (Graham et al. 2021) at depth 1 + 1: the command-line tests' build"
input: {channels: 3, resolution: 64}
stem: {kind: conv, channels: [16, 32, 64, 128], activation: hardswish}
tokens: {cls_token: none, pos_embed: none}
stages:
  - {depth: 1, dim: 128, heads: 4, key_dim: 16, attn_ratio: 2, mlp_ratio: 2, norm: batchnorm, act: hardswish,
     qkv_bias: false, attention: levit_bias}
  - {depth: 1, dim: 256, heads: 6, key_dim: 16, attn_ratio: 2, mlp_ratio: 2, norm: batchnorm, act: hardswish,
     qkv_bias: false, attention: levit_bias, shrink: {stride: 2, key_dim: 16, attn_ratio: 4, mlp_ratio: 2}}
head: {pool: mean, num_classes: 1000, distillation: true}
"""


def augmented(photos: torch.Tensor) -> torch.Tensor:
    """``photos`` ``(N, C, H, W)`` and three altered copies (flipped, shifted right, down): ``(4N, C, H, W)``."""
    return torch.cat([photos, photos.flip(-1), photos.roll(8, -1), photos.roll(8, -2)])


def photo_levit(photos: torch.Tensor, depth: int | None = None) -> nn.Module:
    """LeViT-128S at :data:`RESOLUTION` px (seed 0) with the BatchNorm statistics of ``augmented(photos)``,
    in eval mode; ``depth`` sets every stage's depth (1: 3 blocks and the 2 shrink attentions, for a test whose
    cost grows with the graph, as torch.compile's does)."""
    doc = load_spec("levit_128s").model_dump(mode="json", exclude_none=True)
    doc["input"]["resolution"] = RESOLUTION
    if depth is not None:
        for stage in doc["stages"]:
            stage["depth"] = depth
    torch.manual_seed(0)
    model = archspec.compile(doc)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # cumulative average: the statistics of exactly these images
    model.train()
    with torch.no_grad():
        model(augmented(photos))
    return model.eval()


@pytest.fixture(scope="module")
def photos() -> torch.Tensor:
    """Fixture: the three real photographs at 64 px, ``(3, 3, 64, 64)``."""
    return sample_batch((RESOLUTION, RESOLUTION))


@pytest.fixture(scope="module")
def levit(photos, one_thread_module) -> nn.Module:
    """Fixture: :func:`photo_levit` of the photos, built with one torch thread."""
    return photo_levit(photos)
