"""Block math of archspec.nn.blocks checked against hand formulas and hand-computed cases."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from timm.models import convit, levit
from torch import nn

from archspec.families.attention.heads import HeadSpec
from archspec.nn.blocks import (
    Attention,
    ConvMixer,
    IdentityStem,
    ShrinkBlock,
    TransformerBlock,
    conv_kernel_offsets,
    gpsa_rel_indices,
    levit_bias_idxs,
    signed_bias_idxs,
    window_mask,
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ----------------------------------------------------------------------------- helpers (independent formulas)
def _hand_logits(attn: Attention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled logits (B, H, N, N) and values (B, H, N, dv) straight from the layernorm-family weights."""
    B, N, C = x.shape
    H, d, dv = attn.num_heads, attn.qk_dim, attn.v_dim
    qk = x @ attn.qk.weight.T + attn.qk.bias
    q = qk[..., : H * d].reshape(B, N, H, d).transpose(1, 2)
    k = qk[..., H * d:].reshape(B, N, H, d).transpose(1, 2)
    v = (x @ attn.v.weight.T + attn.v.bias).reshape(B, N, H, dv).transpose(1, 2)
    return torch.einsum("bhnd,bhmd->bhnm", q, k) / math.sqrt(d), v


def _hand_out(attn: Attention, probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    B, H, N, _ = probs.shape
    return (probs @ v).transpose(1, 2).reshape(B, N, -1) @ attn.proj.weight.T + attn.proj.bias


def _rowcol(t: int, cols: int) -> tuple[int, int]:
    return t // cols, t % cols


# ----------------------------------------------------------------------------- position tables
def test_gpsa_rel_indices_square_equals_timm_and_non_square_hand_case():
    ref = convit.GPSA(8, num_heads=1).get_rel_indices(25)[0]
    assert torch.equal(gpsa_rel_indices((5, 5)), ref)
    r = gpsa_rel_indices((2, 3))
    assert r.shape == (6, 6, 3)
    # query token 0 at (0,0), key token 5 at (1,2): dx = 2 (cols), dy = 1 (rows), d^2 = 5
    assert r[0, 5].tolist() == [2.0, 1.0, 5.0]
    assert r[5, 0].tolist() == [-2.0, -1.0, 5.0]
    assert r[4, 2].tolist() == [1.0, -1.0, 2.0]  # (1,1) -> (0,2)


def test_levit_bias_idxs_hand_case_and_timm():
    idx = levit_bias_idxs((3, 3))
    assert idx[0, 2 * 3 + 1].item() == 2 * 3 + 1  # (0,0) -> (2,1): |dr|=2, |dc|=1
    assert idx[2 * 3 + 1, 0].item() == 2 * 3 + 1  # absolute offsets: symmetric
    assert idx[4, 0].item() == 1 * 3 + 1          # (1,1) -> (0,0)
    assert int(idx.max()) < 9
    ref = levit.Attention(16, 4, num_heads=2, resolution=(3, 4))
    assert torch.equal(levit_bias_idxs((3, 4)), ref.attention_bias_idxs)
    ref_down = levit.AttentionDownsample(16, 16, 4, num_heads=2, resolution=(5, 3))
    got = levit_bias_idxs((5, 3), stride=2)
    assert got.shape == (3 * 2, 15) and torch.equal(got, ref_down.attention_bias_idxs)


def test_signed_bias_idxs_symmetry_and_uniqueness():
    H, W = 3, 4
    idx = signed_bias_idxs((H, W))
    center = (H - 1) * (2 * W - 1) + (W - 1)
    assert idx.shape == (12, 12) and int(idx.min()) >= 0 and int(idx.max()) < (2 * H - 1) * (2 * W - 1)
    assert torch.all(idx.diagonal() == center)
    assert torch.all(idx + idx.T == 2 * center)  # offset and its negation are mirrored around the centre
    seen: dict[int, tuple[int, int]] = {}
    for i in range(12):
        for j in range(12):
            (ri, ci), (rj, cj) = _rowcol(i, W), _rowcol(j, W)
            off = (ri - rj, ci - cj)  # query minus key (CMHSA eq. 4)
            assert seen.setdefault(int(idx[i, j]), off) == off  # one index <-> one signed offset
    assert len(seen) == (2 * H - 1) * (2 * W - 1)
    assert idx[0, 1 * W + 2].item() == (-1 + H - 1) * (2 * W - 1) + (-2 + W - 1)


def test_conv_kernel_offsets_timm_order():
    off = conv_kernel_offsets(9)  # position = h1 + 3*h2 -> (h1-1, h2-1)
    assert off[0] == (-1.0, -1.0) and off[1] == (0.0, -1.0) and off[3] == (-1.0, 0.0) and off[4] == (0.0, 0.0)
    assert off[8] == (1.0, 1.0) and len(set(off)) == 9
    assert conv_kernel_offsets(4) == [(-0.5, -0.5), (0.5, -0.5), (-0.5, 0.5), (0.5, 0.5)]
    assert conv_kernel_offsets(1) == [(0.0, 0.0)]
    for bad in (0, 2, 3, 8):
        with pytest.raises(ValueError):
            conv_kernel_offsets(bad)


# ----------------------------------------------------------------------------- masks
def test_window_mask_3x5_corner_on_4x4_hand_checked():
    m = window_mask((4, 4), (3, 5), num_prefix_tokens=0)
    # query (0,0): rows 0..1, cols 0..2
    assert set(torch.nonzero(m[0]).flatten().tolist()) == {0, 1, 2, 4, 5, 6}
    # query (1,1) = token 5: rows 0..2, cols 0..3
    assert set(torch.nonzero(m[5]).flatten().tolist()) == set(range(12))
    # query (3,3) = token 15: rows 2..3, cols 1..3
    assert set(torch.nonzero(m[15]).flatten().tolist()) == {9, 10, 11, 13, 14, 15}
    mp = window_mask((4, 4), (3, 5), num_prefix_tokens=2)
    assert mp.shape == (18, 18)
    assert mp[:2].all() and mp[:, :2].all()
    assert torch.equal(mp[2:, 2:], m)
    with pytest.raises(ValueError):
        window_mask((4, 4), (2, 3))


def _masked_layer(kinds, prefix=1, grid=(4, 4), dim=24):
    attn = Attention(dim, kinds, grid, num_prefix_tokens=prefix).eval()
    with torch.no_grad():  # larger weights so logits are far from 0 and the checks bite
        attn.qk.weight.normal_(0, 0.5)
        attn.qk.bias.normal_(0, 0.5)
    return attn


def test_hard_mask_non_neighbours_get_logit_zero_and_class_row_is_full():
    attn = _masked_layer(["mask", "mhsa"])
    x = torch.randn(2, 17, 24)
    probs = attn.get_attention(x)
    logits, v = _hand_logits(attn, x)
    M = window_mask((4, 4), (3, 3), 1)
    hand0 = torch.where(M, logits[:, 0], torch.zeros(())).softmax(-1)
    assert torch.allclose(probs[:, 0], hand0, atol=1e-6)
    # weight of a non-neighbour is e^0 / Z: query patch (0,0) = token 1, key patch (3,3) = token 16
    Z = torch.where(M[1], logits[:, 0, 1], torch.zeros(())).exp().sum(-1)
    assert torch.allclose(probs[:, 0, 1, 16] * Z, torch.ones(2), atol=1e-5)
    # class-token row: full, unmasked attention
    assert torch.allclose(probs[:, 0, 0], logits[:, 0, 0].softmax(-1), atol=1e-6)
    # the global head is plain softmax
    assert torch.allclose(probs[:, 1], logits[:, 1].softmax(-1), atol=1e-6)
    assert torch.allclose(attn(x), _hand_out(attn, probs, v), atol=1e-5)


def test_soft_mask_scales_non_neighbour_logits_by_alpha():
    spec = {"mask": {"mode": "soft", "alpha_init": 0.3, "window": "3x5"}}
    attn = _masked_layer([spec, "mhsa"])
    assert torch.allclose(attn.mask_alpha(), torch.tensor([0.3]))
    with torch.no_grad():
        attn.mask_alpha_logit.fill_(math.log(0.7 / 0.3))
    x = torch.randn(2, 17, 24)
    logits, v = _hand_logits(attn, x)
    M = window_mask((4, 4), (3, 5), 1)
    hand = torch.where(M, logits[:, 0], 0.7 * logits[:, 0]).softmax(-1)
    probs = attn.get_attention(x)
    assert torch.allclose(probs[:, 0], hand, atol=1e-6)
    assert torch.allclose(attn(x), _hand_out(attn, probs, v), atol=1e-5)
    attn(x).sum().backward()
    assert attn.mask_alpha_logit.grad is not None and attn.mask_alpha_logit.grad.abs().item() > 0


def test_strict_mask_gives_non_neighbours_zero_weight():
    attn = _masked_layer(["strict_mask", "mhsa", "levit_bias"])
    with torch.no_grad():
        attn.attention_biases.normal_(0, 1.0)
    x = torch.randn(2, 17, 24)
    probs = attn.get_attention(x)
    M = window_mask((4, 4), (3, 3), 1)
    assert torch.all(probs[:, 0][:, ~M] == 0)
    logits, v = _hand_logits(attn, x)
    assert torch.allclose(probs[:, 0], logits[:, 0].masked_fill(~M, float("-inf")).softmax(-1), atol=1e-6)
    # bias head: LeViT table on absolute offsets, patch-patch block only (hand-built index)
    bias = torch.zeros(17, 17)
    for i in range(16):
        for j in range(16):
            (ri, ci), (rj, cj) = _rowcol(i, 4), _rowcol(j, 4)
            bias[1 + i, 1 + j] = attn.attention_biases[0, abs(ri - rj) * 4 + abs(ci - cj)]
    assert torch.allclose(probs[:, 2], (logits[:, 2] + bias).softmax(-1), atol=1e-6)
    assert not attn.explicit_logits  # SDPA path with a float attn_mask ...
    assert torch.allclose(attn(x), _hand_out(attn, probs, v), atol=1e-5)  # ... agrees with the hand output


def test_signed_bias_head_hand_formula():
    attn = Attention(16, ["signed_bias", "mhsa"], (2, 3), num_prefix_tokens=1).eval()
    with torch.no_grad():
        attn.signed_biases.normal_(0, 1.0)
    assert attn.signed_biases.shape == (1, 3 * 5)
    x = torch.randn(2, 7, 16)
    logits, v = _hand_logits(attn, x)
    bias = torch.zeros(7, 7)
    for i in range(6):
        for j in range(6):
            (ri, ci), (rj, cj) = _rowcol(i, 3), _rowcol(j, 3)
            bias[1 + i, 1 + j] = attn.signed_biases[0, (ri - rj + 1) * 5 + (ci - cj + 2)]
    probs = attn.get_attention(x)
    assert torch.allclose(probs[:, 0], (logits[:, 0] + bias).softmax(-1), atol=1e-6)
    assert torch.allclose(attn(x), _hand_out(attn, probs, v), atol=1e-5)


def test_mixed_two_masked_one_global():
    attn = _masked_layer(["mask", "mask:3x5", "mhsa"])
    x = torch.randn(2, 17, 24)
    probs = attn.get_attention(x)
    logits, _ = _hand_logits(attn, x)
    for h, win in ((0, (3, 3)), (1, (3, 5))):
        M = window_mask((4, 4), win, 1)
        assert torch.allclose(probs[:, h], (logits[:, h] * M).softmax(-1), atol=1e-6)
    assert torch.allclose(probs[:, 2], logits[:, 2].softmax(-1), atol=1e-6)


# ----------------------------------------------------------------------------- GPSA
def test_gpsa_rows_sum_to_one_and_gating_formula():
    attn = Attention(24, ["gpsa", "mask", {"gpsa": {"gating_init": -1.0, "conv_init": False}, "mask": {}}, "mhsa"],
                     (3, 5),
                     num_prefix_tokens=0).eval()
    assert attn.conv_init_heads == [0] and attn.gpsa_heads == [0, 2]
    with torch.no_grad():
        attn.qk.weight.normal_(0, 0.5)
    x = torch.randn(2, 15, 24)
    probs = attn.get_attention(x)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 4, 15), atol=1e-6)
    logits, _ = _hand_logits(attn, x)
    M = window_mask((3, 5), (3, 3), 0)
    r = gpsa_rel_indices((3, 5))
    pos = (r @ attn.pos_proj.weight.T + attn.pos_proj.bias).permute(2, 0, 1).softmax(-1)  # (2, N, N)
    for g, (h, content) in enumerate(((0, logits[:, 0].softmax(-1)), (2, (logits[:, 2] * M).softmax(-1)))):
        lam = torch.sigmoid(attn.gating_param[g])
        mix = (1 - lam) * content + lam * pos[g]
        assert torch.allclose(probs[:, h], mix / mix.sum(-1, keepdim=True), atol=1e-6)
    assert torch.allclose(probs[:, 1], (logits[:, 1] * M).softmax(-1), atol=1e-6)
    assert torch.allclose(probs[:, 3], logits[:, 3].softmax(-1), atol=1e-6)
    assert torch.allclose(attn.gating_param.data, torch.tensor([1.0, -1.0]))


def test_conv_init_gpsa_peaks_at_kernel_offsets():
    side, heads = 6, 9
    spec = {"gpsa": {"locality_strength": 100.0, "gating_init": 20.0}}
    attn = Attention(36, [spec] * heads, (side, side)).eval()
    probs = attn.get_attention(torch.randn(2, side * side, 36))
    offsets = conv_kernel_offsets(heads)
    for h in range(heads):
        dr, dc = int(offsets[h][0]), int(offsets[h][1])
        for r in range(1, side - 1):
            for c in range(1, side - 1):
                q, key = r * side + c, (r + dr) * side + (c + dc)
                assert int(probs[0, h, q].argmax()) == key
                assert probs[:, h, q, key].min().item() > 0.99


def test_conv_init_values_and_pos_proj_rows_mixed_layer():
    heads = [{"gpsa": {"locality_strength": 2.0}}, "mhsa", {"gpsa": {"conv_init": False}},
             {"gpsa": {"locality_strength": 3.0}}, "mask", "gpsa", "gpsa"]
    attn = Attention(28, heads, (4, 4))  # conv-init GPSA heads: 0, 3, 5, 6 -> 4 heads, k = 2
    assert attn.conv_init_heads == [0, 3, 5, 6] and attn.v_dim == 4
    off = conv_kernel_offsets(4)
    strengths = {0: 2.0, 3: 3.0, 5: 1.0, 6: 1.0}
    for pos, head in enumerate(attn.conv_init_heads):
        row = attn.gpsa_heads.index(head)
        dr, dc = off[pos]
        expect = strengths[head] * torch.tensor([2 * dc, 2 * dr, -1.0])
        assert torch.allclose(attn.pos_proj.weight[row], expect)
        assert torch.equal(attn.v.weight[4 * head:4 * head + 4], torch.eye(28)[4 * head:4 * head + 4])
    for head in (1, 2, 4):  # not conv-initialised: random value rows
        assert not torch.equal(attn.v.weight[4 * head:4 * head + 4], torch.eye(28)[4 * head:4 * head + 4])
    assert attn.pos_proj.weight[attn.gpsa_heads.index(2)].abs().max() < 0.1  # trunc_normal(.02)


def test_training_forward_builds_gpsa_positional_attention_once_for_both_gpsa_paths():
    """Training, a GPSA head on the GPSA path and a hard-masked one on the explicit-logits path (plus an SDPA head):
    one forward computes softmax(pos_proj(r)) (ConViT eq. 5) once for both, not once per path; the next forward
    computes it again (a training value is not cached); eval caches it."""
    gpsa = {"gpsa": {"conv_init": False}}
    layer = Attention(24, [gpsa, "mhsa", {**gpsa, "mask": {}}], (3, 3)).train()
    assert [key[0] for key, _ in layer._groups] == ["gpsa", "sdpa", "dense"]
    builds = []
    layer.pos_proj.register_forward_hook(lambda *_: builds.append(1))
    x = torch.randn(2, 9, 24)
    layer(x).sum().backward()
    assert len(builds) == 1 and layer._forward_memo is None
    assert layer.pos_proj.weight.grad.abs().min() > 0  # both heads' rows reached by the shared build
    layer(x)
    assert len(builds) == 2
    layer.eval()
    layer(x), layer(x)
    assert len(builds) == 3


def test_parameters_only_for_heads_that_use_them():
    attn = Attention(32, ["mhsa", "levit_bias", "gpsa", "soft_mask"], (4, 4))
    shapes = {n: tuple(p.shape) for n, p in attn.named_parameters()}
    assert shapes == {
        "qk.weight": (64, 32), "qk.bias": (64,), "v.weight": (32, 32), "v.bias": (32,),
        "proj.weight": (32, 32), "proj.bias": (32,),
        "attention_biases": (1, 16), "pos_proj.weight": (1, 3), "pos_proj.bias": (1,),
        "gating_param": (1,), "mask_alpha_logit": (1,),
    }
    assert set(attn.state_dict()) == set(shapes)  # index / mask buffers are non-persistent
    plain = Attention(32, ["mhsa"] * 4, (4, 4))
    assert sum(p.numel() for p in plain.parameters()) == 4 * 32 * 32 + 4 * 32
    frozen = Attention(32, [{"gpsa": {"gating_trainable": False}}] * 4, (4, 4))
    assert isinstance(frozen.gating_param, nn.Parameter) and not frozen.gating_param.requires_grad
    assert frozen.positional_attention().shape == (4, 16, 16)  # once per forward, no batch axis


def test_value_errors():
    attn = Attention(16, ["mhsa", "mask"], (3, 3), num_prefix_tokens=1)
    with pytest.raises(ValueError):
        attn(torch.randn(1, 9, 16))  # missing class token
    with pytest.raises(ValueError):
        attn.get_attention(torch.randn(1, 11, 16))
    with pytest.raises(ValueError):
        Attention(16, ["gpsa", "gpsa"], (3, 3))  # 2 conv-init GPSA heads: not a square
    Attention(16, ["gpsa", {"gpsa": {"conv_init": False}}], (3, 3))  # 1 conv-init head is fine
    with pytest.raises(ValueError):
        Attention(16, ["gpsa"], (3, 3), num_prefix_tokens=1)
    with pytest.raises(ValueError):
        Attention(16, ["gpsa", {"gpsa": {"gating_trainable": False, "conv_init": False}}], (3, 3))
    with pytest.raises(ValueError):
        Attention(16, [], (3, 3))
    with pytest.raises(ValueError):
        Attention(16, ["mhsa"] * 3, (3, 3))  # 16 not divisible by 3
    with pytest.raises(ValueError):
        Attention(16, ["mhsa"], (3, 3), norm="rmsnorm")
    with pytest.raises(ValueError):
        ConvMixer(8, 4, (3, 3))
    with pytest.raises(ValueError):
        ConvMixer(8, 3, (3, 3))(torch.randn(1, 10, 8))


def test_decoupled_head_dims_and_batchnorm_family():
    attn = Attention(24, ["levit_bias", "mask", "mhsa"], (3, 3), qk_dim=5, v_dim=7, norm="batchnorm",
                     proj_act=nn.Hardswish).eval()
    assert attn.qkv.linear.weight.shape == (3 * (2 * 5 + 7), 24)
    assert attn.proj.ln.linear.weight.shape == (24, 21)
    x = torch.randn(2, 9, 24)
    assert attn(x).shape == (2, 9, 24) and attn.get_attention(x).shape == (2, 3, 9, 9)
    ln = Attention(24, [HeadSpec.model_validate("mhsa")] * 9, (3, 3), qk_dim=8, v_dim=16)
    assert ln.v.weight.shape == (9 * 16, 24) and ln(x).shape == (2, 9, 24)


# ----------------------------------------------------------------------------- mixer, stems, blocks
def test_conv_mixer_is_a_conv_on_the_pixel_view():
    """CMHSA phase 1: after an identity stem, the pixel-view conv of the tokens is the conv of the image."""
    stem, mix = IdentityStem(3, 4), ConvMixer(48, 3, (2, 3), patch=4)
    img = torch.randn(2, 3, 8, 12)
    ref = F.conv2d(img, mix.conv.weight, mix.conv.bias, padding=1)
    assert torch.allclose(mix(stem(img)), stem(ref), atol=1e-5)
    with pytest.raises(ValueError):
        ConvMixer(40, 3, (2, 3), patch=4)  # 16 does not divide 40


def test_conv_mixer_equals_conv2d_on_grid():
    mix = ConvMixer(6, 3, (3, 4))
    x = torch.randn(2, 12, 6)
    img = x.transpose(1, 2).reshape(2, 6, 3, 4)
    ref = F.conv2d(img, mix.conv.weight, mix.conv.bias, padding=1).flatten(2).transpose(1, 2)
    assert torch.allclose(mix(x), ref, atol=1e-6)
    # token (r, c) of the output at (1, 2) by hand
    hand = mix.conv.bias.clone()
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            hand += mix.conv.weight[:, :, dr + 1, dc + 1] @ img[0, :, 1 + dr, 2 + dc]
    assert torch.allclose(mix(x)[0, 1 * 4 + 2], hand, atol=1e-5)
    blk = TransformerBlock(6, mix, mlp_ratio=2.0)
    assert blk(x).shape == (2, 12, 6)


def test_identity_stem_tokens_are_raw_patches_channel_major():
    stem = IdentityStem(3, 4)
    x = torch.randn(2, 3, 8, 12)
    t = stem(x)
    assert t.shape == (2, 6, 48) and sum(p.numel() for p in stem.parameters()) == 0
    r, c = 1, 2  # token 1 * 3 + 2
    assert torch.equal(t[1, r * 3 + c], x[1, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4].reshape(-1))
    with pytest.raises(ValueError):
        stem(torch.randn(1, 3, 10, 12))


@pytest.mark.parametrize("grid,out", [((7, 7), (4, 4)), ((14, 14), (7, 7)), ((5, 8), (3, 4))])
def test_shrink_block_output_grid(grid, out):
    blk = ShrinkBlock(32, 48, key_dim=8, grid=grid).eval()
    y = blk(torch.randn(2, grid[0] * grid[1], 32))
    assert blk.out_grid == out and y.shape == (2, out[0] * out[1], 48)
    assert blk.attn_downsample.val_dim == 32 and blk.attn_downsample.num_heads == 4
    with pytest.raises(ValueError):
        blk(torch.randn(2, grid[0] * grid[1] + 1, 32))
