"""The shipped spec library (specs/*.yaml): every spec loads and builds, and the static counts of
:func:`archspec.ir.graph.build_graph` agree with timm (parameters exactly, MACs within 2%) and with the
papers' tables (MaiT Tab. 4, LeViT v1 Tab. 3)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch
from macs_reference import reference_macs

import archspec
from archspec.ir.checked import load_spec
from archspec.ir.graph import build_graph

SPEC_DIR = Path(__file__).resolve().parent.parent / "specs"
SPEC_FILES = sorted(SPEC_DIR.glob("*.yaml"))

# spec file stem -> timm model it must equal parameter for parameter
TIMM_TWINS = {
    "deit_tiny": "deit_tiny_patch16_224",
    "convit_tiny": "convit_tiny",
    "convit_small": "convit_small",
    "levit_128s": "levit_128s",
    "levit_256": "levit_256",
    "cait_xxs24": "cait_xxs24_224",
    "resnet18": "resnet18",
    "resnet50": "resnet50",
    "resnet50d": "resnet50d",
    "resnetrs50": "resnetrs50",
    "levit_graft_r50s0_deit12": "deit_small_patch16_224",  # LeViT Tab. 1's end rows: DeiT-S and ResNet-50
    "levit_graft_r50s4_deit0": "resnet50",
    "resnet26t": "resnet26t",
    "resnext50_32x4d": "resnext50_32x4d",
    "seresnext26d_32x4d": "seresnext26d_32x4d",
    "botnet26t": "botnet26t_256",
    "halonet26t": "halonet26t",
    "mobilevit_xxs": "mobilevit_xxs",
    "coatnet_nano_rw_224": "coatnet_nano_rw_224",
    "coatnet_0_rw_224": "coatnet_0_rw_224",
}
MACS_CHECKED = ("deit_tiny", "convit_tiny", "levit_128s")  # cait_xxs24: tests/test_cait.py
MACS_TOL = 0.02

EXPECTED_SPECS = {
    "deit_tiny", "convit_tiny", "convit_small", "levit_128s", "levit_256", "levit_128s_v1",
    "mait_tiny_sch1", "mait_tiny_sch2", "mait_tiny_sch3", "mait_xs_sch2", "cmhsa_k3_conv", "cmhsa_k3",
    "cmhsa_k5_conv", "cmhsa_k5", "cait_xxs24", "masked_cait_xxs24", "resnet18", "resnet50", "resnet50d", "resnetrs50",
    "levit_graft_r50s0_deit12", "levit_graft_r50s1_deit9", "levit_graft_r50s2_deit6", "levit_graft_r50s3_deit3",
    "levit_graft_r50s4_deit0", "resnet26t", "resnext50_32x4d", "seresnext26d_32x4d", "botnet26t",
    "halonet26t", "mobilevit_xxs", "coatnet_nano_rw_224", "coatnet_0_rw_224",
}


@cache
def _graph(stem: str):
    return build_graph(load_spec(SPEC_DIR / f"{stem}.yaml"))


@cache
def _timm(name: str) -> torch.nn.Module:
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False).eval()


def test_library_is_complete():
    assert EXPECTED_SPECS <= {p.stem for p in SPEC_FILES}


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.stem)
def test_spec_loads_and_builds(path: Path):
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#"), "every shipped spec opens with a comment block (source, readings)"
    spec = load_spec(path)
    assert spec.name == path.stem
    assert spec.source
    graph = build_graph(spec)
    assert graph.graph["params"] > 0 and graph.graph["macs"] > 0
    # the resolved YAML round-trips to the same spec
    assert load_spec(spec.to_yaml()) == spec


@pytest.mark.parametrize("stem", sorted(TIMM_TWINS))
@pytest.mark.slow
def test_params_equal_timm(stem: str):
    model = _timm(TIMM_TWINS[stem])
    expected = sum(p.numel() for p in model.parameters())
    assert _graph(stem).graph["params"] == expected


@pytest.mark.parametrize("stem", MACS_CHECKED)
@pytest.mark.slow
def test_macs_match_timm_flop_counter(stem: str):
    model = _timm(TIMM_TWINS[stem])
    # batch 1: ConViT's GPSA expands its pos scores over the batch
    timm_macs = reference_macs(model, torch.randn(1, 3, 224, 224))
    ours = _graph(stem).graph["macs"]
    assert abs(ours - timm_macs) <= MACS_TOL * timm_macs, (ours, timm_macs)


def test_mait_tiny_matches_paper_table4():
    # MaiT Tab. 4: MaiT-T, 24 layers, 11M params, 2.5 GFLOPs (= GMACs). The table rounds to 2 significant
    # digits, so allow 10%.
    g = _graph("mait_tiny_sch2").graph
    assert g["params"] == pytest.approx(11e6, rel=0.10)
    assert g["macs"] == pytest.approx(2.5e9, rel=0.10)
    # masks add no parameters (hard) or one per head (soft: 21 layers x 3 heads)
    assert _graph("mait_tiny_sch1").graph["params"] == g["params"]
    assert _graph("mait_tiny_sch3").graph["params"] == g["params"] + 21 * 3


def test_mait_xs_matches_paper_table4():
    # Tab. 4: MaiT-XS* 24.5M params, 5.3 GFLOPs (with LayerScale: +2 x 288 per layer, negligible).
    g = _graph("mait_xs_sch2").graph
    assert g["params"] == pytest.approx(24.5e6, rel=0.05)
    assert g["macs"] == pytest.approx(5.3e9, rel=0.05)


def test_levit_128s_v1_matches_paper_table3():
    # LeViT (arXiv v1) Tab. 3: LeViT-128S 4.7M params, 288M FLOPs; reported to 2-3 digits, allow 5%.
    g = _graph("levit_128s_v1").graph
    assert g["params"] == pytest.approx(4.7e6, rel=0.05)
    assert g["macs"] == pytest.approx(288e6, rel=0.05)


def _letters(stem: str) -> list[str]:
    spec = load_spec(SPEC_DIR / f"{stem}.yaml")
    return ["".join(h.letter for h in plan.heads) for plan in spec.layer_plans(0)]


@pytest.mark.parametrize("stem", ["mait_tiny_sch2", "mait_xs_sch2"])
def test_mait_sch2_head_kinds(stem: str):
    # Sch.2: H-1 = 2 masked heads in layers 0-7, one in 8-19 (layer 8: our reading), none in 20-23.
    assert _letters(stem) == ["MMA"] * 8 + ["MAA"] * 12 + ["AAA"] * 4
    spec = load_spec(SPEC_DIR / f"{stem}.yaml")
    masks = [h.mask for plan in spec.layer_plans(0) for h in plan.heads if h.mask is not None]
    assert masks and all(m.window == (3, 3) and m.mode == "hard" for m in masks)


def test_mait_sch1_and_sch3_head_kinds():
    assert _letters("mait_tiny_sch1") == ["MAA"] * 24
    assert _letters("mait_tiny_sch3") == ["SSS"] * 21 + ["AAA"] * 3


def test_convit_layers():
    for stem in ("convit_tiny", "convit_small"):
        spec = load_spec(SPEC_DIR / f"{stem}.yaml")
        plans = spec.layer_plans(0)
        assert [all(h.letter == "P" for h in p.heads) for p in plans] == [True] * 10 + [False] * 2
        assert spec.tokens.cls_token == 10 and not spec.stages[0].qkv_bias


@pytest.mark.parametrize("k", [3, 5])
def test_cmhsa_conv_phase_is_a_pixel_conv(k: int):
    """Thm. 1 / App. A.2: the phase-1 mixer is a K x K conv on the 224x224x3 pixel view (c = 768 / 16^2 = 3),
    not a 768-channel conv on the 14x14 token grid; hand counts, and the compiled module's own count."""
    g = _graph(f"cmhsa_k{k}_conv")
    block = g.nodes["stages.0.blocks.0"]
    hidden = 3072
    mlp_params = 768 * hidden + hidden + hidden * 768 + 768 + 4 * 768
    assert block["params"] == k * k * 3 * 3 + 3 + mlp_params
    assert block["macs"] == 224 * 224 * k * k * 3 * 3 + 2 * 196 * 768 * hidden
    model = archspec.compile(_small_cmhsa(k, conv=True))
    conv = model.stages[0].blocks[0].attn.conv
    assert tuple(conv.weight.shape) == (3, 3, k, k) and conv.padding == (k // 2, k // 2)
    assert sum(p.numel() for p in model.parameters()) == build_graph(model.spec).graph["params"]
    # the 14x14 token-grid conv stays available under its own name
    token = load_spec(SPEC_DIR / f"cmhsa_k{k}_conv.yaml").model_dump()
    token["stages"][0]["mixer"] = f"token_conv{k}"
    assert build_graph(load_spec(token)).nodes["stages.0.blocks.0"]["params"] == k * k * 768 * 768 + 768 + mlp_params


def test_cmhsa_attention_phase_pads_one_ring_of_zero_tokens():
    block = _graph("cmhsa_k3").nodes["stages.0.blocks.0"]
    qkv = 768 * 3 * 9 * 768 + 3 * 9 * 768
    assert block["params"] == qkv + 9 * 768 * 768 + 768 + 9 * 31 * 31 + 768 * 3072 * 2 + 3072 + 768 + 4 * 768
    model = archspec.compile(_small_cmhsa(3, conv=False))  # 8x8 grid of 4x4x3 patches
    mixer = model.stages[0].blocks[0].attn
    assert mixer.pad == 1 and mixer.attn.grid == (10, 10) and mixer.attn.signed_biases.shape == (9, 19 * 19)
    assert sum(p.numel() for p in model.parameters()) == build_graph(model.spec).graph["params"]
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def _small_cmhsa(k: int, conv: bool) -> dict:
    """The shipped CMHSA spec at CPU scale: 32 px, 4x4x3 patches (d = 48), two layers, 10 classes."""
    doc = load_spec(SPEC_DIR / f"cmhsa_k{k}{'_conv' if conv else ''}.yaml").model_dump()
    doc["input"]["resolution"], doc["stem"]["patch_size"] = 32, 4
    doc["stages"][0].update(depth=2, dim=48, head_dim=48)
    doc["head"]["num_classes"] = 10
    return doc


def test_cmhsa_pair_differs_only_in_mixer():
    conv, attn = load_spec(SPEC_DIR / "cmhsa_k3_conv.yaml"), load_spec(SPEC_DIR / "cmhsa_k3.yaml")
    assert [p.mixer.kind for p in conv.layer_plans(0)] == ["conv"] * 6
    assert all(p.mixer.kernel == 3 for p in conv.layer_plans(0))
    assert [p.mixer.kind for p in attn.layer_plans(0)] == ["attention"] * 6
    assert all([h.letter for h in p.heads] == ["R"] * 9 and p.heads[0].rel_bias.table == "signed"
               for p in attn.layer_plans(0))
    # same tokens on both sides: 14x14 raw 16x16x3 patches, no class token
    for g in (_graph("cmhsa_k3_conv"), _graph("cmhsa_k3")):
        stem = g.nodes["stem"]
        assert stem["grid"] == (14, 14) and stem["dim"] == 768 and stem["params"] == 0
