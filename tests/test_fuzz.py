"""Seeded mutation fuzzer: every mutated spec either fails validation with a SpecError, or builds and runs.

Bases are the shipped specs shrunk to small sizes (48 px, at most 3 blocks a stage, a quarter of the
width), so that a valid mutant can be compiled and run in milliseconds.  Each mutant gets 1-3
random mutations (delete a key, replace a value by another type / an extreme or boundary number /
a string / a list / None, add a known key, duplicate a list entry, swap a head kind, move a layer
range or the class-token index).  In-process, ``random.Random(seed)``: the same mutants every run.

For each mutant: ``load_spec`` may raise only :class:`SpecError`; a spec that validates must
compile under the default memory limit, run a batch of 2 to finite logits of the right shape,
and have exactly ``analyze(spec).params`` parameters.  Valid mutants over :data:`BUILD_MACS` are
counted but not built, to keep the run near a minute.
"""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from archspec import analyze, compile, load_spec
from archspec.errors import SpecError
from archspec.spec import (
    SPEC_DIR,
    ArchSpec,
    ConvStageBase,
    ConvStageSpec,
    ConvStemSpec,
    GPSASpec,
    HeadOutSpec,
    HeadSpec,
    IdentityStemSpec,
    InputSpec,
    LayerOverride,
    MapToTokensSpec,
    MaskSpec,
    MaxxVitStemSpec,
    MBConvSESpec,
    MBConvStageSpec,
    MixerSpec,
    PatchStemSpec,
    RelBiasSpec,
    ResNetStemSpec,
    SESpec,
    ShrinkSpec,
    StageSpec,
    TokensSpec,
)

N_MUTANTS = 3000
SEED = 20240611
BUILD_MACS = 25_000_000  # valid mutants at or under this many MACs per image are built and run (T-CNN at 48 px: 21M)
BUILD_PARAMS = 2_500_000  # Swin-B small base: 2.48M

HEAD_KINDS = ["mhsa", "gpsa", "mask", "mask:3x5", "mask:5x5", "soft_mask", "strict_mask", "levit_bias", "signed_bias",
              {"gpsa": {"gating_trainable": False, "conv_init": False}}, {"gpsa": {"locality_strength": 3.0}},
              {"mask": {"depth": 1, "mode": "soft", "alpha_init": 0.2}}, {"rel_bias": {"table": "signed"},
                                                                             "mask": {"window": "3x3"}},
              {"gpsa": {"conv_init": False}, "mask": {"window": [1, 3], "mode": "strict"}}]
KEYS = ["depth", "dim", "heads", "head_dim", "key_dim", "attn_ratio", "mlp_ratio", "norm", "norm_eps", "act",
        "qkv_bias", "drop_path", "layer_scale", "attention", "mixer", "layers", "shrink", "stride", "patch_size",
        "channels", "cls_token", "dist_token", "pos_embed", "pool", "num_classes", "distillation", "range", "window",
        "from_map", "grid", "proj",
        "mode", "kind", "resolution", "seed", "gating_trainable", "conv_init", "table", "alpha_init", "kernel", "bogus",
        "groups", "base_width", "widths", "head_kinds", "block", "expansion", "expand_from", "stride_mode", "padding",
        "pre_norm_act", "output_bias", "early", "rd_ratio"]
VALUES: list[Any] = [None, True, False, 0, 1, 2, 3, 4, 5, 7, 8, 9, 16, 48, 64, 4096, 4097, -1, -16, 2**31, 10**12,
                     0.0, 0.01, 0.5, 0.999, 1.0, 1.5, 2.0, 1e-9, 1e308, -0.5, math.nan, math.inf, "", "abc", "3",
                     "input", "none", "mean", "cls", "batchnorm", "layernorm", "hardswish", "gelu", "conv", "patch",
                     "identity", "conv3", "conv4", "attention", "3x3", "3x4", "0-1", "1-0", "2", [], [0], [1, 2],
                     [0, 1, 2], [48, 48], [8, 16], [0.1, 0.2], {}, {"bogus": 1}, {"kind": "conv"},
                     {"kind": "attention"}, {"kind": "attention", "heads": 2, "attention": "mhsa", "layers": [1]},
                     {"kind": "gpsa"}] + HEAD_KINDS

# Plausible values per key: most mutants stay close to valid, so the build path gets exercised.
PLAUSIBLE: dict[str, list[Any]] = {
    "depth": [1, 2, 3, 4], "dim": [8, 16, 24, 32, 48, 64, 96],
    "head_dim": [None, 1, 4, 8, 16, 48], "key_dim": [None, 1, 4, 8, 16, 32], "attn_ratio": [None, 0.01, 0.5, 1, 2, 4],
    "mlp_ratio": [0.01, 0.1, 0.5, 1, 2, 4], "norm": ["layernorm", "batchnorm"], "act": ["gelu", "hardswish", "relu"],
    "qkv_bias": [True, False], "layer_scale": [None, 1e-5, 0.1], "drop_path": [0.0, 0.1, [0.0, 0.2]],
    "attention": [None] + HEAD_KINDS, "mixer": ["attention", "conv1", "conv3", "conv5", {"kind": "conv", "kernel": 7}],
    "shrink": [None, {}, {"key_dim": 8}, {"attn_ratio": 0.01}, {"mlp_ratio": 0.01}, {"heads": 3, "key_dim": 4},
               {"key_dim": 4, "attn_ratio": 0.5, "mlp_ratio": 0.5}],
    "patch_size": [1, 2, 3, 4, 8, 16], "channels": [None, [8, 16], [4, 8, 16, 32], [16], [3, 5, 7]],
    "cls_token": ["input", "none", 0, 1, 2, 3, 4, 5, 9], "dist_token": [True, False], "pos_embed": ["learned", "none"],
    "pool": ["cls", "mean"], "num_classes": [0, 1, 10], "distillation": [True, False],
    "resolution": [16, 24, 32, 48, 64, [32, 48], [48, 32], [16, 64]], "window": ["1x1", "3x3", "3x5", "5x3", "7x7"],
    "range": ["0", "0-1", "1-2", "2", "0-2", [1, 1]],
    # one key for a stage's head count (an int) and a layer override's head list
    "heads": [1, 2, 3, 4, 6, 8, 9, ["mhsa", "gpsa"], ["mask", "mhsa", "soft_mask"], ["gpsa"] * 4, ["levit_bias"] * 3,
              ["strict_mask", "mask:3x5"]],
    "layers": [[], [{"range": "0", "attention": "gpsa"}], [{"range": "0-1", "mixer": "conv3"}],
               [{"range": "1", "heads": ["mask", "mhsa"]}]],
    "mode": ["hard", "soft", "strict"], "kind": ["patch", "conv", "identity", "attention"],
    "from_map": [None, {}, {"pool": "avg", "grid": 2}, {"pool": "avg", "grid": [3, 2]}, {"pool": "none"},
                 {"proj": False}, {"proj": True}, {"pool": "avg"}, {"grid": 3}],
    "grid": [1, 2, 3, 14, [2, 3], 0], "proj": [True, False, None],
    "gating_trainable": [True, False], "conv_init": [True, False], "depth_mask": [1, 2],
    # conv stages: ResNeXt groups, tiered stems, BoTNet attention / T-CNN GPSA mixers (the "mixer" key above is an
    # attention stage's; a conv stage's comes from VALUES and from these)
    "groups": [1, 2, 4, 32, 0], "base_width": [4, 16, 64, 1], "widths": [[24, 32], [4, 8], [8], [0, 4]],
    "head_kinds": [None, ["mhsa", "gpsa"], ["botnet_rel", "mhsa"], ["botnet_rel"] * 4],
    # MBConv stages and the maxxvit stem (CoAtNet, MaxViT)
    "block": ["mbconv", "basic", "bottleneck"], "expansion": [0.1, 1, 2.5, 4, 6], "expand_from": ["input", "output"],
    "stride_mode": ["dw", "1x1", "pool"], "padding": ["symmetric", "same"], "rd_ratio": [0.01, 1 / 16, 0.25, 1.0],
}


def _scale(dim: int) -> int:
    return max(8, dim // 4)


def _shrink_stage(stage: dict, heads_width: bool) -> dict:
    depth = min(stage.get("depth", 1), 3)  # a stage without a depth (MobileViT's final 1x1 conv) is one block
    stage = dict(stage, depth=depth) if "depth" in stage else dict(stage)
    if stage.get("kind") == "conv":  # a quarter of the channels keeps bottleneck widths divisible by 4
        stage["channels"] = max(4, stage["channels"] // 4)
        return stage
    if heads_width:
        stage["dim"] = _scale(stage["dim"])
        if "head_dim" in stage:
            stage["head_dim"] = max(4, stage["head_dim"] // 4)
    layers = []
    for override in stage.get("layers", []):
        start, end = override["range"] if isinstance(override["range"], list) else _range(override["range"])
        if start < depth:
            layers.append(dict(override, range=[start, min(end, depth - 1)]))
    stage["layers"] = layers
    return stage


def _small_locality(node: Any) -> Any:
    """The local head kinds at a small base's grids: 3x3 windows clamped to a smaller grid as timm clamps them (Swin
    at 48 px: grids 12, 6, 3, 2), 3x3 neighbourhoods with dilation at most 2 (NAT, DiNAT), 2x2 halo blocks with a
    halo of 1 (HaloNet) -- the kinds stay in the bases, their sizes fit."""
    if isinstance(node, str):
        small = {"window": {"window": {"size": 3, "clamp": True}}, "neighborhood": "neighborhood:3"}
        return small.get(node.split(":")[0], node)
    if isinstance(node, list):
        return [_small_locality(value) for value in node]
    if not isinstance(node, dict):
        return node
    out = {key: _small_locality(value) for key, value in node.items()}
    if isinstance(out.get("window"), dict) and out["window"].get("size") != "full":  # CoAtNet's: the whole grid
        out["window"] = dict(out["window"], size=3, clamp=True)
    if isinstance(out.get("neighborhood"), dict):
        dilation = min(out["neighborhood"].get("dilation", 1), 2)
        out["neighborhood"] = dict(out["neighborhood"], kernel=3, dilation=dilation)
    if isinstance(out.get("halo"), dict):
        out["halo"] = dict(out["halo"], block_size=2, halo_size=1)
    return out


def _range(text: Any) -> tuple[int, int]:
    if isinstance(text, int):
        return text, text
    start, _, end = str(text).partition("-")
    return int(start), int(end or start)


def small_base(path: Path) -> dict:
    """A shipped spec at 48 px, with at most 3 blocks per stage and a quarter of the width (identity stems keep
    P^2 C)."""
    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    doc["input"] = dict(doc.get("input", {}), resolution=48)
    stem = doc.get("stem", {"kind": "patch"})
    widths = stem.get("kind") != "identity"
    if stem.get("kind") == "conv" and stem.get("channels"):
        stem["channels"] = [max(1, c // 4) for c in stem["channels"]]
    if stem.get("kind") in ("resnet", "maxxvit"):  # ResNet / MaxxVit stems and conv stages: a quarter of the widths
        stem["channels"] = max(1, stem.get("channels", 64) // 4)
        if stem.get("stem_width"):
            stem["stem_width"] = max(1, stem["stem_width"] // 4)
    doc["stages"] = [_shrink_stage(s, widths) for s in doc["stages"]]
    if any((s.get("mixer") or {}).get("kind") == "attention" for s in doc["stages"] if s.get("kind") == "conv"):
        doc["input"]["resolution"] = 64  # BoTNet: a strided attention block needs even sides (48 px: c4 at 3x3)
    for stage in doc["stages"]:  # a hybrid's pooled token grid shrinks with the input (LeViT's 14 -> 3 at 48 px)
        if (stage.get("from_map") or {}).get("grid"):
            stage["from_map"]["grid"] = max(1, stage["from_map"]["grid"] // 4)
    if stem.get("kind") == "identity":  # CMHSA: tokens are raw 4x4 patches (dim 48) on a 4x4 grid
        stem["patch_size"] = 4
        doc["input"]["resolution"] = 16
        for stage in doc["stages"]:
            stage.update(dim=48, head_dim=48) if "head_dim" in stage else stage.update(dim=48)
    if any(isinstance(s.get("downsample"), dict) and s["downsample"].get("kind") == "pool" for s in doc["stages"]):
        doc["input"]["resolution"] = 64  # CoAtNet's pooling blocks need even grids: 16, 8, 4, 2 at 64 px
    if "neighborhood" in str(doc["stages"]):
        doc["input"]["resolution"] = 96  # NAT's /4 tokenizer: grids 24, 12, 6, 3, each at least a 3x3 kernel
    doc["stages"] = _small_locality(doc["stages"])
    tokens = doc.get("tokens", {})
    if isinstance(tokens.get("cls_token"), int):
        tokens["cls_token"] = min(tokens["cls_token"], sum(s["depth"] for s in doc["stages"]))
    doc.setdefault("head", {})["num_classes"] = 10
    return doc


def _containers(node: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    out = []
    if isinstance(node, (dict, list)):
        out.append((path, node))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            out.extend(_containers(value, path + (key,)))
    return out


_MODELS = {"": [ArchSpec], "input": [InputSpec], "stem": [PatchStemSpec, ConvStemSpec, IdentityStemSpec,
                                                            ResNetStemSpec, MaxxVitStemSpec],
           "tokens": [TokensSpec], "stages": [StageSpec, ConvStageSpec, MBConvStageSpec], "se": [SESpec, MBConvSESpec],
           "shrink": [ShrinkSpec],
           "layers": [LayerOverride],
           "head": [HeadOutSpec], "mixer": [MixerSpec], "gpsa": [GPSASpec], "mask": [MaskSpec],
           "rel_bias": [RelBiasSpec], "attention": [HeadSpec], "heads": [HeadSpec], "from_map": [MapToTokensSpec]}


def _fields(path: tuple) -> list[str]:
    """Keys the spec model at ``path`` knows (the mapping's owner is its last named ancestor)."""
    names = [p for p in path if isinstance(p, str)]
    models = _MODELS.get(names[-1] if names else "", [])
    return sorted({name for model in models for name in model.model_fields}) or list(PLAUSIBLE)


def mutate(doc: dict, rng: random.Random) -> dict:
    """One random mutation of ``doc`` (in place; returned for convenience)."""
    path, node = rng.choice(_containers(doc))
    keys = list(node.keys()) if isinstance(node, dict) else list(range(len(node)))
    op = rng.random()
    if isinstance(node, list) and node and op < 0.15:  # duplicate or drop a list entry
        k = rng.choice(keys)
        if rng.random() < 0.5:
            node.insert(k, copy.deepcopy(node[k]))
        else:
            node.pop(k)
    elif isinstance(node, dict) and op < 0.25:  # add (or overwrite) a known key
        node[rng.choice(KEYS)] = copy.deepcopy(rng.choice(VALUES))
    elif keys and op < 0.35 and isinstance(node, dict):  # delete a key
        del node[rng.choice(keys)]
    elif isinstance(node, dict) and op < 0.75:  # a plausible value for a key this mapping may have
        k = rng.choice(_fields(path) + keys) if rng.random() < 0.9 else rng.choice(list(PLAUSIBLE))
        node[k] = copy.deepcopy(rng.choice(PLAUSIBLE.get(k) or VALUES))
    elif isinstance(node, list) and path and path[-1] == "heads" and node:
        node[rng.randrange(len(node))] = copy.deepcopy(rng.choice(HEAD_KINDS))
    elif keys:
        k = rng.choice(keys)
        value = node[k]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or rng.random() < 0.4:
            node[k] = copy.deepcopy(rng.choice(VALUES))
        else:  # a neighbouring or extreme number of the same kind
            choices = [value + 1, value - 1, value * 2, value // 2 if isinstance(value, int) else value / 2, 0, -value]
            node[k] = rng.choice(choices)
    return doc


def _check_built(spec, analysis) -> None:
    model = compile(spec).eval()
    assert sum(p.numel() for p in model.parameters()) == analysis.params, spec.to_yaml()
    h, w = spec.input.resolution
    with torch.inference_mode():
        out = model(torch.randn(2, spec.input.channels, h, w))
    last = spec.stages[-1]  # a conv net or a conv tail ends on a conv stage's channels
    expected = spec.head.num_classes or (last.channels if isinstance(last, ConvStageBase) else last.dim)
    assert tuple(out.shape) == (2, expected), spec.to_yaml()
    assert torch.isfinite(out).all(), spec.to_yaml()


# bases of kinds no shipped spec has yet: CoAtNet's conv side (maxxvit stem, MBConv stages) alone and before
# attention stages
_MBCONV = {"kind": "conv", "block": "mbconv", "depth": 2, "channels": 16, "stride": 2}
EXTRA_BASES = [
    {"name": "mbconv", "input": {"resolution": 48}, "stem": {"kind": "maxxvit", "stem_width": 8, "channels": 16},
     "stages": [{**_MBCONV, "stride_mode": "pool", "act": "silu", "se": {"rd_ratio": 0.25, "early": True}},
                {**_MBCONV, "channels": 24, "padding": "same", "act": "gelu_tanh", "se": {}}],
     "head": {"num_classes": 10}},
    {"name": "mbconv_hybrid", "input": {"resolution": 48}, "stem": {"kind": "maxxvit", "channels": 8},
     "tokens": {"cls_token": "none", "pos_embed": "none"},
     "stages": [{**_MBCONV, "stride_mode": "1x1", "pool": "max"}, {"depth": 2, "dim": 32, "heads": 2}],
     "head": {"pool": "mean", "num_classes": 10}},
]


def run_fuzz(n: int, seed: int) -> dict[str, int]:
    """Mutate and check ``n`` specs; returns counts (``invalid``, ``built``, ``skipped`` large ones)."""
    bases = [small_base(p) for p in sorted(SPEC_DIR.glob("*.yaml"))] + EXTRA_BASES
    rng = random.Random(seed)
    stats = {"invalid": 0, "built": 0, "skipped": 0}
    for i in range(n):
        doc = copy.deepcopy(rng.choice(bases))
        for _ in range(rng.randint(1, 3)):
            mutate(doc, rng)
        try:
            spec = load_spec(doc)
        except SpecError as exc:
            assert exc.problems and all(p.message for p in exc.problems)
            stats["invalid"] += 1
            continue
        except Exception as exc:  # noqa: BLE001 - anything else is the bug this test looks for
            raise AssertionError(f"mutant {i}: {type(exc).__name__}: {exc}\n{doc!r}") from exc
        analysis = analyze(spec)
        if analysis.macs > BUILD_MACS or analysis.params > BUILD_PARAMS:
            stats["skipped"] += 1
            continue
        try:
            _check_built(spec, analysis)
        except Exception as exc:
            raise AssertionError(f"mutant {i} validated but failed to build or run: {type(exc).__name__}: {exc}\n"
                                 f"{doc!r}") from exc
        stats["built"] += 1
    return stats


@pytest.mark.slow
def test_small_bases_are_valid_and_built(one_thread):
    for base in [small_base(p) for p in sorted(SPEC_DIR.glob("*.yaml"))] + EXTRA_BASES:
        spec = load_spec(base)
        analysis = analyze(spec)
        assert analysis.macs <= BUILD_MACS and analysis.params <= BUILD_PARAMS, (base["name"], analysis.macs,
                                                                                 analysis.params)
        _check_built(spec, analysis)


@pytest.mark.slow
def test_fuzz_only_spec_errors_and_every_valid_spec_builds(one_thread):
    torch.manual_seed(0)
    stats = run_fuzz(N_MUTANTS, SEED)
    valid = stats["built"] + stats["skipped"]
    assert stats["invalid"] > N_MUTANTS // 4, stats  # the mutations do break specs
    assert valid > N_MUTANTS // 10, stats              # ... and leave many valid
    assert stats["built"] >= 0.8 * valid, stats         # most valid mutants are small enough to run


if __name__ == "__main__":  # pragma: no cover - manual runs: python tests/test_fuzz.py N SEED
    import sys

    torch.set_num_threads(1)
    print(run_fuzz(int(sys.argv[1]), int(sys.argv[2])))
