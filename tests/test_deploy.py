"""Deployment on CPU: int8 (LeViT sec. 5.3) and compiled latency, each against something independent -- the
float32 model's logits on real photographs, the float graph's own attention ops, a saved build against the model
it was saved from, the reference int8 graph against Inductor's int8 kernels.

The model is LeViT-128S at 64 px with BatchNorm statistics of real photographs (``deploy_fixtures``).
"""

from __future__ import annotations

import json

import deploy_fixtures
import pytest
import torch
from deploy_fixtures import LEVIT_1_1, RESOLUTION, augmented
from torch import nn

import archspec
from archspec.cli import main
from archspec.deploy.int8 import QuantizedModel, calibration_batches, load_quantized, needs_reduce_range, quantize
from archspec.errors import SpecError
from archspec.io.images import load_image, sample_batch
from archspec.nn.fuse import count_batchnorms

photos, levit = deploy_fixtures.photos, deploy_fixtures.levit  # the shared fixtures

# int8 against float32 on the three real photos (stated tolerance): per image, cosine >= 0.98 and relative L2
# error ||int8 - float|| / ||float|| <= 0.2.  Measured: 8-bit activations cosine 0.997-0.999, relative error
# 0.04-0.08; 7-bit (reduce_range, CPUs without VNNI) worst image cosine 0.987, relative error 0.163; a calibration on
# images 20x too dark gives cosine 0.02-0.2, relative error ~1.7.
MIN_COSINE, MAX_RELATIVE = 0.98, 0.2


@pytest.fixture(scope="module")
def int8_reference(levit, photos) -> QuantizedModel:
    """int8 LeViT, calibrated on the augmented photos, running the uncompiled reference graph."""
    return quantize(levit, [augmented(photos)], torch_compile=False)


def _close(int8_logits: torch.Tensor, float_logits: torch.Tensor) -> None:
    cosine = torch.nn.functional.cosine_similarity(int8_logits, float_logits, dim=1)
    relative = (int8_logits - float_logits).norm(dim=1) / float_logits.norm(dim=1)
    assert (cosine >= MIN_COSINE).all() and (relative <= MAX_RELATIVE).all(), (cosine, relative)


# ------------------------------------------------------------------------------------------------ int8


@pytest.mark.slow  # PT2E quantisation of LeViT-128S at 64 px: seconds (docs/contributing.md)
def test_int8_logits_close_to_float32_on_real_photos(levit, int8_reference, photos):
    with torch.no_grad():
        _close(int8_reference(photos), levit(photos))


@pytest.mark.slow  # PT2E quantisation of LeViT-128S at 64 px: seconds (docs/contributing.md)
def test_a_bad_calibration_is_caught_by_the_tolerance(levit, photos):
    """The tolerance can fail: activations calibrated on images 20x too dark clip the real ones."""
    bad = quantize(levit, [augmented(photos) * 0.05], torch_compile=False)
    with torch.no_grad(), pytest.raises(AssertionError):
        _close(bad(photos), levit(photos))


@pytest.mark.slow  # PT2E quantisation of LeViT-128S at 64 px: seconds (docs/contributing.md)
def test_int8_quantises_linears_and_convs_and_keeps_attention_in_float32(levit, int8_reference):
    """Every linear and conv of the folded model runs in int8; the float graph's attention products and softmaxes
    (counted in torch.export's graph of the float model, before any quantiser) all stay float32."""
    folded = levit.fuse()
    linears = sum(isinstance(m, nn.Linear) for m in folded.modules())
    convs = sum(isinstance(m, nn.Conv2d) for m in folded.modules())
    x = torch.randn(2, 3, RESOLUTION, RESOLUTION)
    with torch.no_grad():
        folded(x)  # fill the eval-mode attention-bias caches before export, as quantize() does
    graph = torch.export.export(folded, (x,)).graph
    ops = [str(node.target) for node in graph.nodes if node.op == "call_function"]
    assert int8_reference.summary["int8"] == {"linear": linears, "conv2d": convs}
    kept = int8_reference.summary["float32"]
    assert kept["matmul"] == sum(op.startswith("aten.matmul") for op in ops) == 2 * 11  # Q K^T and A V, 9 + 2 layers
    assert kept["softmax"] == sum("softmax" in op for op in ops) == 11
    for node in int8_reference.program.graph.nodes:  # no matmul / softmax reads an int8 tensor
        if node.op == "call_function" and ("matmul" in str(node.target) or "softmax" in str(node.target)):
            assert all("quantize_per" not in str(getattr(arg, "target", "")) for arg in node.all_input_nodes)


@pytest.mark.slow  # PT2E quantisation of LeViT-128S at 64 px: seconds (docs/contributing.md)
def test_int8_leaves_the_float_model_alone_and_is_inference_only(levit, int8_reference, photos):
    assert count_batchnorms(levit) > 0 and not levit.training  # quantize() folded a copy
    assert int8_reference.calibration["images"] == 12 and int8_reference.calibration["input_shape"] == [3, 64, 64]
    assert int8_reference.eval() is int8_reference
    with pytest.raises(RuntimeError, match="inference only"):
        int8_reference.train()
    with torch.no_grad():
        one = int8_reference(photos[:1])
    torch.testing.assert_close(one, int8_reference(photos)[:1])  # dynamic batch


@pytest.mark.slow  # PT2E quantisation of LeViT-128S at 64 px: seconds (docs/contributing.md)
def test_int8_save_and_load_rebuild_the_same_model(levit, int8_reference, photos, tmp_path):
    archspec.save(int8_reference, tmp_path / "q")
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == ["int8.safetensors", "model.safetensors",
                                                                  "spec.yaml"]
    loaded = load_quantized(tmp_path / "q", torch_compile=False)
    assert torch.equal(loaded(photos), int8_reference(photos))  # no calibration data needed
    assert loaded.calibration == int8_reference.calibration
    with torch.no_grad():  # the float build is still one
        assert torch.equal(archspec.load(tmp_path / "q").eval()(photos), levit(photos))
    archspec.save(levit, tmp_path / "f")
    with pytest.raises(SpecError, match="--int8"):
        load_quantized(tmp_path / "f")
    (tmp_path / "q" / "int8.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(SpecError, match="int8.safetensors"):
        load_quantized(tmp_path / "q")


def _tampered(directory, metadata=None, tensors=None):
    """Rewrite ``directory/int8.safetensors`` with changed metadata or tensors (what a hostile file holds)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = directory / "int8.safetensors"
    with safe_open(str(path), framework="pt") as handle:
        meta, saved = handle.metadata(), {key: handle.get_tensor(key) for key in handle.keys()}
    save_file((tensors or (lambda t: t))(saved), str(path), metadata=(metadata or (lambda m: m))(meta))


@pytest.mark.slow  # PT2E quantisation of LeViT-128S at 64 px: seconds (docs/contributing.md)
@pytest.mark.parametrize("damage, message", [
    ("no calibration", "no calibration input shape"),
    ("huge input shape", "is not the model's input"),
    ("reshaped observer", "do not fit this model's observers"),
])
def test_load_quantized_refuses_a_tampered_calibration_file(levit, int8_reference, tmp_path, damage, message):
    """Metadata and tensors of int8.safetensors are untrusted: a clear SpecError naming the file, and nothing
    allocated at a size the file alone decides (the input shape must be the spec's)."""
    import json

    archspec.save(int8_reference, tmp_path / "q")

    def meta(m):
        record = json.loads(m["archspec_int8"])
        if damage == "no calibration":
            del record["calibration"]
        else:
            record["calibration"]["input_shape"] = [3, 100000, 100000]
        return {**m, "archspec_int8": json.dumps(record)}

    def tensors(saved):
        key = next(k for k, v in saved.items() if v.numel() > 1)
        return {**saved, key: saved[key].reshape(-1)[:-1].clone()}

    _tampered(tmp_path / "q", **({"tensors": tensors} if damage == "reshaped observer" else {"metadata": meta}))
    with pytest.raises(SpecError, match=message) as info:
        load_quantized(tmp_path / "q", torch_compile=False)
    assert "int8.safetensors" in str(info.value)


class _DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 8 * 8, 4)

    def forward(self, x):
        if x.mean() > 0:  # Python control flow on a value: torch.export cannot capture it
            x = -x
        return self.fc(x.flatten(1))


class _NoWeights(nn.Module):
    def forward(self, x):
        return x.mean(dim=(2, 3))


@pytest.mark.parametrize("model, batches, message", [
    (_DataDependent(), [torch.randn(2, 3, 8, 8)], "torch.export cannot capture"),
    (_NoWeights(), [torch.randn(2, 3, 8, 8)], "no linear or convolution"),
    (_NoWeights(), [], "no calibration batches"),
    (_NoWeights(), [torch.randn(2, 3, 8, 8), torch.randn(2, 3, 9, 9)], "has shape"),
    (_NoWeights(), ["images"], "not a tensor"),
    (_NoWeights(), [torch.full((2, 3, 8, 8), float("nan"))], "not finite"),
    (_NoWeights(), torch.randn(2, 3, 8, 8), "one tensor"),
], ids=["data-dependent", "no-weights", "empty", "shapes", "not-tensor", "nan", "bare-tensor"])
def test_what_cannot_be_quantised_is_refused_clearly(model, batches, message, one_thread):
    with pytest.raises(SpecError, match=message):
        quantize(model.eval(), batches, torch_compile=False)


def test_reduce_range_follows_the_cpu(monkeypatch):
    """7-bit activations on x86 without VNNI only (torchao: "Set it to True on earlier CPUs without VNNI")."""
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert needs_reduce_range() is False
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: True, raising=False)
    assert needs_reduce_range() is False
    monkeypatch.setattr(torch.cpu, "_is_vnni_supported", lambda: False, raising=False)
    flags = {"flags": "fpu avx2 avx_vnni\n", "plain": "fpu avx2\n"}
    for name, expected in (("flags", False), ("plain", True)):
        monkeypatch.setattr("builtins.open", lambda *a, _text=flags[name], **k: __import__("io").StringIO(
            "flags\t\t: " + _text))
        assert needs_reduce_range() is expected


@pytest.mark.slow  # PT2E quantisation of LeViT-128S at 64 px: seconds (docs/contributing.md)
def test_reduce_range_clamps_every_activation_and_survives_save_and_load(levit, photos, tmp_path, one_thread):
    """With reduce_range every activation is quantised to 0..127 and reads its input clamped to that range (the
    clamp changes no value of the reference graph); the choice is saved, so a load rebuilds the same model."""
    seven = quantize(levit, [augmented(photos)], torch_compile=False, reduce_range=True)
    eight = quantize(levit, [augmented(photos)], torch_compile=False, reduce_range=False)
    target = torch.ops.quantized_decomposed.quantize_per_tensor.default
    for model, top in ((seven, 127), (eight, 255)):
        nodes = [n for n in model.program.graph.nodes if n.target is target]
        assert nodes and all(n.args[4] == top for n in nodes)
        clamped = [n for n in nodes if n.args[0].target is torch.ops.aten.clamp.default]
        assert len(clamped) == (len(nodes) if top == 127 else 0)
        for n in clamped:  # the clamp is the range's own: (q_min - zp) s .. (q_max - zp) s
            _, scale, zero_point, q_min, q_max, _ = n.args
            assert n.args[0].args[1:] == ((q_min - zero_point) * scale, (q_max - zero_point) * scale)
    assert seven.calibration["reduce_range"] is True and eight.calibration["reduce_range"] is False
    archspec.save(seven, tmp_path / "q")
    loaded = load_quantized(tmp_path / "q", torch_compile=False)
    assert loaded.calibration["reduce_range"] is True and torch.equal(loaded(photos), seven(photos))
    assert not torch.equal(seven(photos), eight(photos))


@pytest.mark.slow  # PT2E quantisation of LeViT-128S at 64 px: seconds (docs/contributing.md)
def test_int8_refuses_other_cpus(monkeypatch, levit, photos):
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    with pytest.raises(SpecError, match="x86-64"):
        quantize(levit, [photos], torch_compile=False)


def test_calibration_batches_from_a_dataset():
    from archspec.io.datasets import load_data

    data = load_data("digits", 8, max_images=100)
    batches = calibration_batches(data, 1, (16, 12), batches=3, batch_size=16)
    assert [tuple(b.shape) for b in batches] == [(16, 1, 16, 12)] * 3
    again = calibration_batches(data, 1, (16, 12), batches=3, batch_size=16)
    assert all(torch.equal(a, b) for a, b in zip(batches, again))  # seeded
    from archspec.deploy.int8 import load_calibration

    batches, description = load_calibration(None, 3, (16, 12), batches=2, batch_size=8)
    assert [tuple(b.shape) for b in batches] == [(8, 3, 16, 12)] * 2  # from a subset of 22 images, not all 1797
    assert description == {"data": "digits", "source": "digits", "seed": 0}


@pytest.mark.slow
def test_compiled_int8_agrees_with_the_reference_graph(photos, one_thread):
    """Inductor's oneDNN int8 kernels compute what the reference graph simulates (requantisation rounding
    aside); one batch size (each new one compiles again).  On a CPU without VNNI this needs the 7-bit activations
    and their clamp (measured on an AVX2 VM: relative L2 1.39 with 8 bits, 0.08 with 7 unclamped, 0 clamped).
    LeViT-128S at depth 1 a stage (5 attention layers of its 11, both shrink attentions): Inductor's compile time
    grows with the graph (49 s of CPU for the whole model, issue 53), the kernels are the same."""
    levit = deploy_fixtures.photo_levit(photos, depth=1)
    int8_reference = quantize(levit, [augmented(photos)], torch_compile=False)
    compiled = QuantizedModel(int8_reference.program, levit, int8_reference.observers, {}, torch_compile=True)
    reference, got = int8_reference(photos), compiled(photos)
    assert (got - reference).abs().max().item() <= 0.05 * reference.abs().max().item()
    with torch.no_grad():
        _close(got, levit(photos))


# ------------------------------------------------------------------------------------------------ CLI


@pytest.mark.slow
def test_build_int8_and_compile_end_to_end(tmp_path, capsys, one_thread):
    spec = tmp_path / "levit_1_1.yaml"
    spec.write_text(LEVIT_1_1)
    out = tmp_path / "levit"
    argv = ["build", str(spec), "--out", str(out), "--repeats", "1", "--json", "--int8",
            "--calibration-batches", "1", "--torch-compile"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    int8 = report["int8"]
    assert int8["latency_ms"] > 0 and int8["calibration"]["data"] == "digits" and int8["calibration"]["images"] == 32
    # 1 + 1 blocks and the shrink attention between the stages: 3 softmaxes, each kept in float32
    assert int8["ops"]["int8"]["linear"] > 0 and int8["ops"]["float32"]["softmax"] == 3
    assert report["compiled"]["latency_ms"] > 0 and report["compiled"]["compile_s"] > 0
    assert report["compiled"]["max_abs_logit_diff"] <= 1e-4 * int8["max_abs_logit"]  # compiled = eager (float32)
    assert sorted(p.name for p in out.iterdir()) == ["int8.safetensors", "model.safetensors", "report.json",
                                                     "spec.yaml"]
    photo = load_image(None, (64, 64), 3)
    loaded = load_quantized(out, torch_compile=False)
    assert loaded.summary == int8["ops"]
    assert main(["build", str(spec), "--out", str(out), "--repeats", "1"]) == 0  # replaced
    assert not (out / "int8.safetensors").exists()
    assert archspec.load(out).eval()(photo).shape == (1, 1000)


@pytest.mark.slow  # PT2E quantisation of LeViT-128S at 64 px: seconds (docs/contributing.md)
def test_build_compile_failure_is_a_located_message(monkeypatch, tmp_path, capsys, one_thread):
    """A compilation that fails (here: torch.compile's compiled function raising, as Inductor does without a
    C++ compiler) ends in a message at --torch-compile (given here by its alias --compile), exit 2, nothing
    written -- not a traceback."""
    def broken_compile(*args, **kwargs):
        def run(*a, **k):
            raise RuntimeError("C++ compile error\nno such file: g++")
        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    out = tmp_path / "b"
    argv = ["build", "levit_128s", "--resolution", "64", "--out", str(out), "--repeats", "1", "--compile"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--torch-compile: torch.compile failed: C++ compile error" in err and "C++ compiler" in err
    assert not out.exists()


@pytest.mark.slow
def test_compile_for_inference_equals_eager_per_model_and_shape(one_thread):
    """Two models of one class compiled in one process each compute their own logits (the export keeps their
    compiled graphs apart), at two batch sizes, and .to() drops the compiled graphs."""
    from archspec.diagnostics.timing import compile_for_inference

    doc = {"name": "tiny", "input": {"channels": 3, "resolution": 32}, "stem": {"kind": "patch", "patch_size": 8},
           "stages": [{"depth": 1, "dim": 32, "heads": 2}], "head": {"num_classes": 10}}
    torch.manual_seed(0)
    models = [archspec.compile(doc).eval(), archspec.compile(doc).eval()]
    with torch.no_grad():  # random weights everywhere: the initial head is zero, and zero logits compare equal
        for model in models:
            for p in model.parameters():
                p.normal_(0.0, 0.2)
    x = sample_batch((32, 32))
    for model in models:
        compiled = compile_for_inference(model)
        for batch in (x, x[:1]):
            with torch.no_grad():
                expected = model(batch)
            assert expected.abs().max() > 0.1  # logits of a useful scale
            torch.testing.assert_close(compiled(batch), expected, rtol=1e-5, atol=1e-5)
        assert len(compiled._runners) == 2
        compiled.to("cpu", torch.float64).to(torch.float32)
        assert not compiled._runners
    with torch.no_grad():
        assert not torch.allclose(models[0](x), models[1](x))  # two different models, not one graph reused


@pytest.mark.parametrize("extra, message", [
    (["--calibrate", "digits"], "--calibrate: applies only with --int8"),
    (["--calibration-batches", "2"], "--calibration-batches: applies only with --int8"),
    (["--int8", "--calibrate", "/no/such/dir"], "no such file or directory"),
    (["--int8", "--calibration-batches", "0"], "at least 1 batch"),
])
def test_build_refuses_bad_int8_options_before_any_work(extra, message, tmp_path, capsys):
    out = tmp_path / "b"
    assert main(["build", "levit_128s", "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "--data" not in err  # build has no --data: the message names --calibrate
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ search


def test_latency_protocol_compile_is_in_the_cache_key():
    from archspec.cli.app import make_parser
    from archspec.cli.search import _latency
    from archspec.search._evaluation.latency import LatencyProtocol

    assert LatencyProtocol(torch_compile=True).key() != LatencyProtocol().key()
    assert "compile" not in LatencyProtocol().key()  # caches written before the option stay valid
    parser = make_parser()
    args = parser.parse_args(["search", "--latency-compile", "--device", "cpu"])
    assert _latency(args).torch_compile is True
    assert _latency(parser.parse_args(["search", "--device", "cpu"])).torch_compile is False


def test_torch_compile_keeps_its_persisted_key_and_build_keeps_the_compile_alias():
    """Issue 58 renamed the torch.compile settings ``compile`` -> ``torch_compile``: the latency protocol's
    ``describe()`` (latency tables, summaries, study attributes) still writes ``compile`` and its cache key still
    ends in ``|compile``; ``from_dict`` reads either key; ``archspec build`` takes ``--torch-compile`` and
    ``--compile``."""
    from archspec.cli.app import make_parser
    from archspec.search._evaluation.latency import LatencyProtocol
    from archspec.search._tabulation.oracle import TABLES_DIR

    on = LatencyProtocol(torch_compile=True)
    assert on.key().endswith("|compile") and list(on.describe()) == ["device", "threads", "batch", "warmup",
                                                                      "repeats", "compile"]
    assert LatencyProtocol.from_dict(on.describe()) == on == LatencyProtocol.from_dict({"torch_compile": True})
    shipped = json.loads((TABLES_DIR / "levit_small.latency.json").read_text())["protocol"]
    assert LatencyProtocol.from_dict(shipped).describe() == shipped == LatencyProtocol().describe()
    parser = make_parser()
    for flag in ("--torch-compile", "--compile"):
        assert parser.parse_args(["build", "deit_tiny", flag]).torch_compile is True
    assert parser.parse_args(["build", "deit_tiny"]).torch_compile is False


@pytest.mark.slow
def test_measure_latency_compiled(one_thread):
    from archspec.search._evaluation.latency import LatencyCache, LatencyProtocol, architecture_key, measure_latency

    spec = archspec.load_spec({"name": "tiny", "input": {"channels": 3, "resolution": 32},
                               "stem": {"kind": "patch", "patch_size": 8},
                               "stages": [{"depth": 1, "dim": 32, "heads": 2}], "head": {"num_classes": 10}})
    cache = LatencyCache(None)
    protocol = LatencyProtocol(torch_compile=True, warmup=1, repeats=2)
    ms = measure_latency(spec, protocol, cache)
    assert ms > 0 and cache.get(architecture_key(spec), protocol) == ms
    assert cache.get(architecture_key(spec), LatencyProtocol(warmup=1, repeats=2)) is None


@pytest.mark.slow
def test_int8_of_a_hybrid_with_attention_in_bottlenecks(photos, one_thread):
    """int8 (torchao PT2E) of a small hybrid: tiered stem, ResNeXt, T-CNN GPSA, an attention stage and a conv tail
    with BoTNet attention (tests/test_fuse.py's HYBRID): within the stated tolerance of float32 on real photos."""
    from test_fuse import HYBRID, _randomise_batchnorms

    torch.manual_seed(0)
    model = _randomise_batchnorms(archspec.compile(HYBRID))
    x = nn.functional.interpolate(photos, size=(64, 64), mode="bilinear", antialias=True)
    quantized = quantize(model, [augmented(x)], torch_compile=False)
    with torch.no_grad():
        _close(quantized(x), model(x))
    # BoTNet's bn2 (nothing to fold it into) reached the graph as its affine map, not as a BatchNorm op: with one
    # left, torchao's convert traced 96 QAT pattern graphs (about 18 of the 23 CPU s this test took, 5 s now)
    ops = {str(node.target) for node in quantized.program.graph.nodes if node.op == "call_function"}
    assert not [op for op in ops if "batch_norm" in op], ops


def test_a_batchnorm_left_after_folding_becomes_the_affine_map_it_computes():
    """By hand: eval-mode BatchNorm2d is ``(x - mean) / sqrt(var + eps) * gamma + beta`` per channel."""
    from archspec.deploy.int8 import _freeze_batchnorms

    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3, eps=1e-3).eval()
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
        bn.running_var.copy_(torch.tensor([4.0, 0.25, 1.0]))
        bn.weight.copy_(torch.tensor([1.5, -2.0, 0.5]))
        bn.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
    model = nn.Sequential(nn.Identity(), bn, nn.Sequential(nn.BatchNorm2d(3, track_running_stats=False)))
    assert _freeze_batchnorms(model) == 1  # no running statistics: it normalises by the batch, left alone
    assert not isinstance(model[1], nn.BatchNorm2d)  # no batch_norm op left for torchao's QAT pattern search
    x = torch.randn(2, 3, 4, 5)
    mean, var = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([4.0, 0.25, 1.0])
    gamma, beta = torch.tensor([1.5, -2.0, 0.5]), torch.tensor([0.1, 0.2, -0.3])
    by_hand = (x - mean[:, None, None]) / torch.sqrt(var[:, None, None] + 1e-3) * gamma[:, None, None] \
        + beta[:, None, None]
    torch.testing.assert_close(model[1](x), by_hand, rtol=1e-6, atol=1e-6)
    assert type(model[2][0]) is nn.BatchNorm2d
