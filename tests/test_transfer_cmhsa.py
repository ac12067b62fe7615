"""CMHSA's conv-to-attention transfer (Li et al., Theorem 1, Lemma 2, App. A.2): the transferred model's
logits against the phase-1 model's own, on real photographs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import archspec
from archspec.ir.checked import load_spec
from archspec.nn.blocks import Attention, ConvMixer
from archspec.spec import SPEC_DIR
from archspec.transfer import (
    DEFAULT_PEAK,
    TransferError,
    attention_spec,
    conv_to_attention_weights,
    conv_to_mhsa,
    patch_offsets,
)


def _phase1(k: int, resolution: int = 32, patch: int = 4, depth: int = 2, classes: int = 10) -> archspec.ArchModel:
    """The shipped cmhsa_k<K>_conv spec at CPU scale (identity stem: d = 3 P^2)."""
    doc = load_spec(SPEC_DIR / f"cmhsa_k{k}_conv.yaml").model_dump()
    doc["input"]["resolution"], doc["stem"]["patch_size"] = resolution, patch
    doc["stages"][0].update(depth=depth, dim=3 * patch * patch, head_dim=3 * patch * patch)
    doc["head"]["num_classes"] = classes
    torch.manual_seed(k)
    return archspec.compile(doc).eval()


def _error(a: torch.nn.Module, b: torch.nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        return (a(x) - b(x)).abs().max().item()


def test_head_count_is_theorem_1():
    assert len(patch_offsets(3, 16)) == len(patch_offsets(5, 16)) == 9  # Corollary 4: K < 2P
    assert len(patch_offsets(7, 2)) == 25 and len(patch_offsets(1, 4)) == 1
    assert patch_offsets(3, 1) == [(dr, dc) for dr in (-1, 0, 1) for dc in (-1, 0, 1)]  # pixel input: K^2


@pytest.mark.parametrize("kernel,patch", [(3, 4), (5, 2), (7, 2)])
def test_one_layer_equals_its_conv(one_thread, kernel: int, patch: int):
    """App. A.2 on one layer, including K >= 2P (25 heads, two rings of padding tokens)."""
    torch.manual_seed(0)
    grid, dim = (3, 4), 2 * patch * patch
    conv = ConvMixer(dim, kernel, grid, patch)
    heads = len(patch_offsets(kernel, patch))
    reach = (heads ** 0.5 - 1) / 2
    pad = int(reach)
    attn = Attention(dim, ["signed_bias"] * heads, (grid[0] + 2 * pad, grid[1] + 2 * pad), qk_dim=4, v_dim=dim)
    attn.load_state_dict(conv_to_attention_weights(conv, attn))
    x = torch.randn(2, 12, dim)
    padded = F.pad(x.reshape(2, *grid, dim), (0, 0, pad, pad, pad, pad)).reshape(2, -1, dim)
    out = attn(padded).reshape(2, grid[0] + 2 * pad, grid[1] + 2 * pad, dim)[:, pad:pad + grid[0], pad:pad + grid[1]]
    assert (out.reshape(2, 12, dim) - conv(x)).abs().max() < 1e-5


@pytest.mark.parametrize("k", [3, 5])
def test_transferred_logits_equal_phase1_on_real_images(one_thread, real_images, k: int):
    """Whole model: the logits agree to 1e-4 at the default peak; a smaller peak leaves the softmax visibly
    not one-hot (Lemma 2: off-peak weight exp(-M)), and the error falls as the peak grows."""
    conv = _phase1(k)
    x = F.interpolate(real_images, size=(32, 32), mode="area")
    errors = [_error(conv, conv_to_mhsa(conv, peak=peak), x) for peak in (2.0, 5.0, 10.0, DEFAULT_PEAK)]
    assert errors[0] > errors[1] > errors[2] > errors[3], errors
    assert errors[0] > 1e-2 and errors[-1] < 1e-4, errors


@pytest.mark.slow
def test_full_scale_layer_on_real_images(one_thread, real_images):
    """The paper's geometry (224 px, 16x16x3 patches, d = d_H = 768, 9 heads), one layer, K = 5."""
    conv = _phase1(5, resolution=224, patch=16, depth=1, classes=100)
    assert _error(conv, conv_to_mhsa(conv), real_images) < 1e-4


def test_border_patches_need_the_zero_tokens(one_thread, real_images):
    """Without the padding ring a border head finds no neighbour at its offset and averages instead."""
    conv = _phase1(3)
    doc = attention_spec(conv.spec).model_dump()
    doc["stages"][0]["mixer"]["pad_tokens"] = 0
    unpadded = conv_to_mhsa(conv, spec=load_spec(doc))
    x = F.interpolate(real_images, size=(32, 32), mode="area")
    assert _error(conv, unpadded, x) > 1e-2


def test_attention_spec_is_the_shipped_phase2_spec():
    for k in (3, 5):
        derived = attention_spec(load_spec(SPEC_DIR / f"cmhsa_k{k}_conv.yaml"))
        shipped = load_spec(SPEC_DIR / f"cmhsa_k{k}.yaml")
        assert derived.model_dump(exclude={"source"}) == shipped.model_dump(exclude={"source"})


def test_too_few_heads_or_no_conv_is_an_error(one_thread):
    conv = _phase1(3, depth=1)
    doc = attention_spec(conv.spec).model_dump()
    doc["stages"][0]["heads"] = 4
    with pytest.raises(TransferError, match="needs 9 heads"):
        conv_to_mhsa(conv, spec=load_spec(doc))
    with pytest.raises(TransferError, match="no conv mixer"):
        attention_spec(load_spec(SPEC_DIR / "deit_tiny.yaml"))
