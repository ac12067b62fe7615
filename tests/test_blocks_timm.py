"""Block-level parity of archspec.nn.blocks against timm modules with copied weights (eval mode, max |diff| <= 1e-5)."""

from __future__ import annotations

import pytest
import torch
from timm.layers import Attention as TimmAttention
from timm.layers import PatchEmbed
from timm.models import convit, levit
from timm.models import vision_transformer as vit
from torch import nn

from archspec.nn.blocks import Attention, ConvStem, LevitBlock, PatchStem, ShrinkBlock, TransformerBlock

TOL = 1e-5


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def _randomize(module: nn.Module) -> None:
    """Random values everywhere timm would start at zeros/ones (biases, BN stats, bias tables, gating)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 1 or "attention_biases" in name or "gating" in name:
                p.normal_(0.0, 0.5)
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.normal_(0.0, 0.2)
                m.running_var.uniform_(0.5, 1.5)


def _split_qkv(state: dict, prefix: str = "") -> dict:
    """timm ViT ``qkv`` rows [q; k; v] -> our ``qk`` = [q; k] and ``v``."""
    out = {}
    for key, val in state.items():
        if key.startswith(prefix + "qkv."):
            kind = key[len(prefix) + 4:]
            d = val.shape[0] // 3
            out[prefix + "qk." + kind] = val[: 2 * d].clone()
            out[prefix + "v." + kind] = val[2 * d:].clone()
        else:
            out[key] = val
    return out


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape
    assert (a - b).abs().max().item() <= TOL


def test_plain_heads_match_timm_vit_attention():
    dim, heads, grid = 48, 4, (3, 4)
    ref = TimmAttention(dim, num_heads=heads, qkv_bias=True).eval()
    _randomize(ref)
    ours = Attention(dim, ["mhsa"] * heads, grid, num_prefix_tokens=1).eval()
    ours.load_state_dict(_split_qkv(ref.state_dict()), strict=True)
    x = torch.randn(2, 13, dim)
    _close(ours(x), ref(x))
    # explicit path agrees too
    q, k, v = ours._qkv(x)
    manual = ours.proj((ours.get_attention(x) @ v).transpose(1, 2).reshape(2, 13, dim))
    _close(manual, ref(x))


@pytest.mark.parametrize("strength", [1.0, 2.5])
def test_gpsa_heads_match_timm_convit_gpsa(strength):
    dim, heads, side = 36, 9, 4
    ref = convit.GPSA(dim, num_heads=heads, qkv_bias=False, locality_strength=strength).eval()
    _randomize(ref)
    spec = {"gpsa": {"locality_strength": strength}}
    ours = Attention(dim, [spec] * heads, (side, side), qkv_bias=False).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)  # qk, v, proj, pos_proj, gating_param
    x = torch.randn(2, side * side, dim)
    _close(ours(x), ref(x))
    _close(ours.get_attention(x), ref.get_attention(x))
    # rel indices identical to timm's
    assert torch.equal(ours.rel_indices, ref.rel_indices[0])

    # our conv init == timm local_init (pos_proj weight, v = eye); gating init 1 like timm
    fresh = Attention(dim, [spec] * heads, (side, side), qkv_bias=False)
    ref.local_init()
    _close(fresh.pos_proj.weight, ref.pos_proj.weight)
    assert torch.equal(fresh.v.weight, ref.v.weight)
    assert torch.equal(fresh.gating_param.data, torch.ones(heads))


@pytest.mark.parametrize("grid", [(4, 4), (3, 5)])
def test_levit_bias_heads_match_timm_levit_attention(grid):
    dim, key_dim, heads, ratio = 32, 8, 4, 2.0
    ref = levit.Attention(dim, key_dim, num_heads=heads, attn_ratio=ratio, resolution=grid,
                          act_layer=nn.Hardswish)
    ref.eval()  # timm's levit.Attention.train returns None
    _randomize(ref)
    ours = Attention(dim, ["levit_bias"] * heads, grid, qk_dim=key_dim, v_dim=int(ratio * key_dim),
                     norm="batchnorm", proj_act=nn.Hardswish).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    assert torch.equal(ours.attention_bias_idxs, ref.attention_bias_idxs)
    x = torch.randn(2, grid[0] * grid[1], dim)
    _close(ours(x), ref(x))


def test_transformer_block_matches_timm_vit_block():
    dim, heads = 32, 4
    ref = vit.Block(dim, heads, mlp_ratio=4.0, qkv_bias=True, init_values=0.1).eval()
    _randomize(ref)
    ours = TransformerBlock(dim, Attention(dim, ["mhsa"] * heads, (3, 3), num_prefix_tokens=1),
                            mlp_ratio=4.0, layer_scale=0.1).eval()
    ours.load_state_dict(_split_qkv(ref.state_dict(), "attn."), strict=True)
    assert ours.norm1.eps == ref.norm1.eps == 1e-6
    x = torch.randn(2, 10, dim)
    _close(ours(x), ref(x))


@pytest.mark.parametrize("use_gpsa", [True, False])
def test_transformer_block_matches_timm_convit_block(use_gpsa):
    dim, heads, side = 32, 4, 3
    ref = convit.Block(dim, heads, mlp_ratio=4.0, qkv_bias=False, use_gpsa=use_gpsa).eval()
    _randomize(ref)
    mixer = Attention(dim, ["gpsa" if use_gpsa else "mhsa"] * heads, (side, side), qkv_bias=False)
    ours = TransformerBlock(dim, mixer, mlp_ratio=4.0).eval()
    state = ref.state_dict() if use_gpsa else _split_qkv(ref.state_dict(), "attn.")
    ours.load_state_dict(state, strict=True)
    assert ours.norm1.eps == ref.norm1.eps
    x = torch.randn(2, side * side, dim)
    _close(ours(x), ref(x))


def test_levit_block_matches_timm():
    dim, key_dim, heads, grid = 32, 8, 4, (4, 4)
    ref = levit.LevitBlock(dim, key_dim, num_heads=heads, attn_ratio=2.0, mlp_ratio=2.0, resolution=grid,
                           act_layer=nn.Hardswish).eval()
    _randomize(ref)
    mixer = Attention(dim, ["levit_bias"] * heads, grid, qk_dim=key_dim, v_dim=2 * key_dim,
                      norm="batchnorm", proj_act=nn.Hardswish)
    ours = LevitBlock(dim, mixer, mlp_ratio=2.0, act_layer=nn.Hardswish).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 16, dim)
    _close(ours(x), ref(x))


def test_shrink_block_matches_timm_levit_downsample():
    ref = levit.LevitDownsample(32, 48, key_dim=8, num_heads=4, attn_ratio=4.0, mlp_ratio=2.0,
                                act_layer=nn.Hardswish, resolution=(7, 7)).eval()
    _randomize(ref)
    ours = ShrinkBlock(32, 48, key_dim=8, grid=(7, 7)).eval()
    assert ours.attn_downsample.num_heads == 4  # in_dim // key_dim
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 49, 32)
    _close(ours(x), ref(x))


def test_conv_stem_matches_timm_stem16():
    C = 64
    ref = levit.Stem16(3, C, act_layer=nn.Hardswish).eval()
    _randomize(ref)
    ours = ConvStem(3, [C // 8, C // 4, C // 2, C]).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    assert [n for n, _ in ours.named_children()] == [n for n, _ in ref.named_children()]
    x = torch.randn(2, 3, 32, 48)
    _close(ours(x), ref(x).flatten(2).transpose(1, 2))
    assert ours.output_grid((32, 48)) == (2, 3) and ours(x).shape == (2, 6, C)


def test_patch_stem_matches_timm_patch_embed():
    ref = PatchEmbed(img_size=32, patch_size=8, in_chans=3, embed_dim=24).eval()
    ours = PatchStem(3, 24, 8, 32).eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    x = torch.randn(2, 3, 32, 32)
    _close(ours(x), ref(x))
    assert ours.grid == (4, 4) and ours(x).shape == (2, 16, 24)
