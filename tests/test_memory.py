"""Memory estimates of the IR against a hand-computed case and against measured reality, and the limit.

Measurement: :class:`LiveBytes`, a ``TorchDispatchMode`` that adds up the bytes of every tensor
storage an aten op creates during the forward and subtracts them when the storage is freed (a
weakref finalizer); its ``peak`` is the largest sum of storages alive at once.  Tensors that existed
before (weights, buffers, the eval-mode caches of the first forward) are not counted; the input
image is.  Kernel-internal workspaces that never become tensors are invisible to it.
"""

from __future__ import annotations

import gc
import math
import warnings
import weakref
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from archspec import analyze, compile, load_spec
from archspec._util.memory import format_bytes, parse_memory
from archspec.errors import SpecError, format_path
from archspec.ir.plan import DEFAULT_MAX_MEMORY, build_plan


def _data_ptr(tensor: torch.Tensor) -> int | None:
    """Storage address, or None for tensors without storage (fake tensors that torch.export in another test
    of this process left for the garbage collector)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except RuntimeError:
        return None


def _existing_storages() -> set[int | None]:
    out = set()
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor):
                out.add(_data_ptr(obj))
        except ReferenceError:  # a weak proxy whose referent is gone (left by another test)
            continue
    return out


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the tensor storages created inside the context and alive at once."""

    def __init__(self) -> None:
        super().__init__()
        with warnings.catch_warnings():  # isinstance on some deprecated torch objects warns
            warnings.simplefilter("ignore")
            self.existing = _existing_storages()
        self.live: dict[int, int] = {}
        self.current = self.peak = 0

    def count(self, nbytes: int) -> None:
        self.current += nbytes
        self.peak = max(self.peak, self.current)

    def _free(self, key: int) -> None:
        self.current -= self.live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key in self.live or key in self.existing or storage.nbytes() == 0:
                    continue
                self.live[key] = storage.nbytes()
                self.count(storage.nbytes())
                weakref.finalize(storage, self._free, key)
        return out


def measured_inference_peak(spec) -> int:
    """Measured peak activation bytes of a batch-1 eval forward (input image included)."""
    model = compile(spec).eval()
    h, w = spec.input.resolution
    x = torch.randn(1, spec.input.channels, h, w)
    with torch.inference_mode():
        model(x)  # the first eval forward builds the constant bias / mask caches (buffers in the estimate)
        with LiveBytes() as live:
            live.count(x.nbytes)
            model(x)
    return live.peak


# A tiny spec, worked by hand: 1x8x8 image, 4x4 patches -> N = 4 tokens, C = 8, 2 heads of dim 4, MLP 16.
TINY = {"input": {"channels": 1, "resolution": 8}, "stem": {"kind": "patch", "patch_size": 4},
        "tokens": {"cls_token": "none", "pos_embed": "none"},
        "stages": [{"depth": 1, "dim": 8, "heads": 2, "mlp_ratio": 2}], "head": {"pool": "mean", "num_classes": 3}}


def test_tiny_spec_hand_computed():
    a = analyze(load_spec(TINY))
    image = 1 * 8 * 8
    # attention block, in elements: input X = N C = 32 and the norm output 32, q/k 4*2*2*4 = 64, v 4*2*4 = 32;
    # the largest phase is the output projection: transpose copy + act + out (3 * 32) + proj (2 * 32) = 160;
    # plus the residual sum 32.  (Logits H N N = 32 with the q/k copies 64 = 96 are smaller.)
    attention = (32 + 32 + 64 + 32) + 160 + 32
    mlp = 3 * 32 + 2 * 4 * 16  # input, residual sum, norm output, fc1 output and its activation
    assert attention == 352 and mlp == 224
    assert a.peak_activation_bytes == 4 * (image + max(attention, mlp))
    assert a.peak_layer == "stages.0.blocks.0"
    # params: stem 16*8 + 8; q/k/v/proj 8*16+16 + 8*8+8 + 8*8+8; fc1 8*16+16; fc2 16*8+8; 2 LayerNorms;
    # head 8*3+3 + fc_norm 16
    params = 136 + (144 + 72 + 72) + 144 + 136 + 32 + 27 + 16
    assert a.params == params == 779
    assert a.weight_bytes == 4 * params
    assert a.buffer_bytes == 4 * 2 * (2 * 4 + 4) * (8 + 1)  # the stacked q/k/v weights + biases of the eval GEMM
    assert a.peak_memory_bytes == a.peak_activation_bytes + 4 * params + a.buffer_bytes


def test_buffers_hand_computed():
    """A 2x2 grid with one hard-mask head and one LeViT-biased head, no class token: N = 4."""
    spec = load_spec({**TINY, "stages": [{"depth": 1, "dim": 8, "heads": 2, "layers": [
        {"range": 0, "heads": ["mask:1x1", "levit_bias"]}]}]})
    a = analyze(spec)
    bias_idx, bias_cache = 8 * 4 * 4, 4 * 2 * 4 * 4  # int64 (N, N) table; float32 (H, N, N) eval cache
    mask, window = 1 * 4 * 4, 4 * 4 * (1 + 1)        # bool (n_mask, N, N); linear-time tables (N, 1x1) + (N,)
    zero = 1 * 2 * 4 * 4      # bool (H, N, N): the hard head runs on explicit logits on so small a grid
    additive = 4 * 2 * 4 * 4  # float32 (H, N, N): the biased head's SDPA mask
    qkv = 4 * 2 * (2 * 4 + 4) * (8 + 1)  # the stacked q/k/v weights + biases of the eval GEMM
    assert a.buffer_bytes == bias_idx + bias_cache + mask + window + zero + additive + qkv


MEDIUM = ["deit_tiny", "convit_tiny", "levit_128s", "mait_tiny_sch2", "cmhsa_k3_conv"]


@pytest.mark.parametrize("name", MEDIUM)
@pytest.mark.slow
def test_estimate_is_conservative_and_close_to_measured(name, one_thread):
    """Shipped specs at their real 224 px (levit: every kind of node; mait: masks; convit: GPSA)."""
    spec = load_spec(name)
    if name == "mait_tiny_sch2":  # 24 blocks: 6 keep every head kind of it, and the test fast
        doc = spec.model_dump(mode="json")
        doc["stages"][0].update(depth=6, layers=[{"range": "0-2", "heads": ["mask:3x3", "mask:3x3", "mhsa"]},
                                                 {"range": "3-5", "heads": ["soft_mask", "strict_mask", "mhsa"]}])
        spec = load_spec(doc)
    estimate = analyze(spec).peak_activation_bytes
    measured = measured_inference_peak(spec)
    assert measured <= estimate <= 3 * measured, (format_bytes(estimate), format_bytes(measured))


@pytest.mark.slow
def test_attention_dominated_estimate_is_conservative(one_thread):
    """Wide heads (64 x 4096, the issue's reproducer) on an 8x8 grid: q/k/v dominate, as at 63x64 tokens."""
    spec = load_spec({"input": {"resolution": 128}, "stem": {"kind": "patch", "patch_size": 16},
                      "stages": [{"depth": 1, "dim": 64, "heads": 64, "head_dim": 4096}], "head": {"num_classes": 10}})
    estimate = analyze(spec).peak_activation_bytes
    measured = measured_inference_peak(spec)
    assert measured <= estimate <= 3 * measured, (format_bytes(estimate), format_bytes(measured))


@pytest.mark.slow
def test_training_estimate_is_conservative(one_thread):
    """Forward + backward of a batch of 4 in train mode: activations kept for backward plus gradients."""
    from archspec.search._evaluation.budget import TRAINING_STATE_FACTOR, training_memory

    spec = load_spec({**load_spec("levit_128s").model_dump(mode="json"), "input": {"channels": 3, "resolution": 64}})
    plan = build_plan(spec)
    model = compile(spec).train()
    x = torch.randn(4, 3, 64, 64)
    with LiveBytes() as live:
        live.count(x.nbytes)
        model(x).sum().backward()
    # the weights exist before; gradients and AdamW's moments do not (no optimizer step here)
    estimate = training_memory(plan, 4) - plan.totals["weight_bytes"]
    assert TRAINING_STATE_FACTOR == 4
    assert live.peak <= estimate <= 4 * live.peak, (format_bytes(estimate), format_bytes(live.peak))


ISSUE_SPEC = """\
name: huge
input: {resolution: [1008, 1024]}
stem: {kind: patch, patch_size: 16}
stages:
  - {depth: 4, dim: 64, heads: 64, head_dim: 4096}
head: {num_classes: 10}
"""


def test_issue_reproducer_fails_validation_with_the_estimate(tmp_path):
    path = tmp_path / "huge.yaml"
    path.write_text(ISSUE_SPEC, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_spec(str(path))
    (problem,) = info.value.problems
    assert format_path(problem.path) == "stages[0]" and problem.line == 5 and problem.file == str(path)
    assert "over the memory limit of 8.0 GiB" in problem.message
    # weights 1.0 GiB + activations 23.6 GiB (q/k/v of 64 x 4096 dims) + buffers 780 MiB (the eval-mode copy of
    # the q/k/v weights: 4 layers x 64 heads x 3 x 4096 rows x 65 columns x 4 bytes)
    assert "25.4 GiB" in problem.message
    assert "--max-memory" in problem.hint
    spec = load_spec(str(path), max_memory=parse_memory("32G"))  # a raised limit accepts it
    assert spec.stages[0].head_dim == 4096
    assert analyze(spec).macs > 35e12


def test_limit_keywords_and_module_default(monkeypatch):
    spec = load_spec(TINY)
    need = analyze(spec).peak_memory_bytes
    assert DEFAULT_MAX_MEMORY == 8 * 2**30
    with pytest.raises(SpecError, match="over the memory limit"):
        load_spec(TINY, max_memory=need - 1)
    assert load_spec(TINY, max_memory=need) == spec
    with pytest.raises(SpecError, match="over the memory limit"):
        compile(spec, max_memory=need - 1)
    monkeypatch.setattr("archspec.ir.plan.DEFAULT_MAX_MEMORY", need - 1)
    with pytest.raises(SpecError):
        compile(spec)
    assert sum(p.numel() for p in compile(spec, max_memory=math.inf).parameters()) == analyze(spec).params


@pytest.mark.parametrize("text, expected", [("32G", 32 * 2**30), ("8GiB", 8 * 2**30), ("512M", 512 * 2**20),
                                            ("1.5T", int(1.5 * 2**40)), ("1000", 1000), ("2 gb", 2 * 2**30)])
def test_parse_memory(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["", "-1G", "0", "lots", "1X", "nan"])
def test_parse_memory_rejects(text):
    with pytest.raises(SpecError) as info:
        parse_memory(text, "--max-memory")
    assert format_path(info.value.problems[0].path) == "--max-memory"


def test_cli_validate_and_build_limit(tmp_path, capsys):
    from archspec.cli import main

    path = tmp_path / "huge.yaml"
    path.write_text(ISSUE_SPEC, encoding="utf-8")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:5:" in err and "25.4 GiB" in err and "--max-memory" in err and "Traceback" not in err
    assert main(["validate", str(path), "--max-memory", "32G"]) == 0
    assert "memory of a batch-1 float32 forward" in capsys.readouterr().out
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("name: tiny\n" + "\n".join(f"{k}: {v}" for k, v in TINY.items()), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["build", str(tiny), "--out", str(out), "--max-memory", "1K", "--repeats", "1"]) == 2
    assert not out.exists()
    assert main(["validate", str(tiny), "--max-memory", "zero"]) == 2


def test_search_rejects_candidates_whose_training_batch_is_over_the_limit():
    from archspec.search._evaluation.budget import Budgets, static_check, training_memory
    from archspec.search._evaluation.proxy import ProxyProtocol, proxy_spec

    spec = load_spec("levit_128s")
    data = SimpleNamespace(channels=3, num_classes=10)
    protocol = ProxyProtocol(batch_size=32)
    inference = analyze(spec).peak_memory_bytes
    training = training_memory(build_plan(proxy_spec(spec, data, protocol)), protocol.batch_size)
    assert training > inference  # 32 images with everything kept for backward, vs one image at 224 px
    budgets = Budgets(memory=(inference + training) / 2)
    assert static_check(spec, budgets).feasible
    check = static_check(spec, budgets, data, protocol)
    assert not check.feasible and "proxy training step (batch 32 at 64 px)" in check.reason
    assert check.macs > 0  # rejected like an over-budget candidate, not as an invalid spec
    assert static_check(spec, Budgets(memory=training), data, protocol).feasible


def test_search_refuses_a_space_whose_smallest_point_is_over_the_limit():
    from archspec.search._engine.preflight import check_budgets_feasible
    from archspec.search._evaluation.budget import Budgets
    from archspec.search._space.language import load_space

    space = load_space()
    assert check_budgets_feasible(space, Budgets(macs=1e12)).feasible
    with pytest.raises(SpecError) as info:
        check_budgets_feasible(space, Budgets(macs=1e12, memory=1000))
    (problem,) = info.value.problems
    assert problem.path == ("budgets", "memory") and "over the memory limit of 1000 B" in problem.message
