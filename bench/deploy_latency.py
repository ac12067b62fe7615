"""Deployment latency on CPU, side by side in one run: int8 (LeViT sec. 5.3), folded, compiled and eager archspec
against timm's float32 twin, and the same LeViTs in ONNX Runtime, folded and unfolded.

    nice -n 19 python bench/deploy_latency.py [--models levit_128s levit_256 deit_tiny] [--batches 1 16]

Every model runs on **one thread** (LeViT's CPU protocol is batch 1, one thread; batch 16 keeps one thread so the
two batch sizes compare and a shared 2-core machine is not oversubscribed).  Cases per model and batch:

* ``timm`` float32 eager: ``timm.create_model(twin, pretrained=False)``; the baseline (speed 1.00);
* ``timm compiled``: the same under :func:`archspec.diagnostics.timing.compile_for_inference` (``torch.compile``,
  Inductor, freezing);
* ``archspec``: the archspec model with the timm model's weights (:mod:`archspec.timm_bridge.convert`), eager;
* ``archspec folded``: ``model.fuse()`` (BatchNorms folded into the linears/convs, LeViT sec. 5.3; LeViTs only);
* ``archspec compiled`` / ``archspec folded compiled``: the two under the same ``torch.compile``;
* ``archspec int8``: :func:`archspec.quantize` (folded, int8 linears/convs, attention products and softmax in
  float32), compiled (Inductor, oneDNN int8 kernels);
* ``archspec int8, uncompiled``: the same int8 model's PT2E reference graph, run without ``torch.compile``
  (explicit quantize/dequantize ops around float kernels).

The archspec model's BatchNorm statistics are those of the three shipped photographs (flipped and shifted too;
:func:`photo_statistics`) and int8 is calibrated on the same twelve images, so logits have a trained model's scale
and the int8 and ONNX checks mean something; the weights do not change the timings.

Each compiled case compiles once per batch size (static shapes; the seconds are reported, never timed).  Every
case is measured in two rounds; in each round the cases alternate ``--samples`` times (medians of
``torch.utils.benchmark.Timer`` samples of about ``--min-time`` / samples seconds), so drift on a shared machine
hits all of them alike and the two rounds show the noise.  Speed = timm eager ms / case ms (> 1: faster).

ONNX part (LeViTs, batch 1, one thread): the unfolded, folded and int8 models exported by
:func:`archspec.deploy.onnx_export.export_onnx` (dynamic batch), timed in ONNX Runtime (``intra_op_num_threads=1``)
next to PyTorch eager, interleaved the same way, with the max |logit difference| ONNX Runtime vs PyTorch.

Profile part (batch 1): shares of self CPU time (``torch.profiler``) of the int8 model, compiled and as the
uncompiled PT2E reference graph (explicit quantize/dequantize ops: the eager-mode int8 LeViT measured), and of
timm's float32 model (the share in GEMMs/convolutions, the only part int8 speeds up).

Writes ``OUT.json`` and ``OUT.md`` (default ``bench/deploy_latency``; not committed).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import timm
import torch
from torch.utils.benchmark import Timer

import archspec
from archspec.diagnostics.timing import compile_for_inference
from archspec.io.images import sample_batch
from archspec.timm_bridge.convert import TIMM_EQUIVALENTS, load_timm_weights

MODELS = ["levit_128s", "levit_256", "deit_tiny"]


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _forward(model, x):
    def run():
        with torch.inference_mode():
            model(x)
    return run


def interleaved(fns: dict[str, callable], samples: int, min_time: float, rounds: int = 2) -> dict[str, list[float]]:
    """Per case, the median seconds of one call in each of ``rounds`` rounds; in a round the cases alternate
    ``samples`` times (one ``Timer.timeit(number)`` sample each, ``number`` calls of about ``min_time / samples``
    seconds), so drift hits every case alike."""
    timers = {name: Timer("fn()", globals={"fn": fn}, num_threads=1) for name, fn in fns.items()}
    numbers = {}
    for name, timer in timers.items():  # warm-up, and the calls per sample
        once = timer.timeit(1).median
        numbers[name] = max(1, round(min_time / samples / max(once, 1e-6)))
    out = {name: [] for name in fns}
    for _ in range(rounds):
        collected = {name: [] for name in fns}
        for _ in range(samples):
            for name, timer in timers.items():
                collected[name].append(timer.timeit(numbers[name]).median)
        for name in fns:
            out[name].append(statistics.median(collected[name]))
    return out


def _first_call(model, x) -> float:
    start = time.perf_counter()
    with torch.inference_mode():
        model(x)
    return time.perf_counter() - start


def shares(model, x, runs: int = 20) -> dict[str, float]:
    """Shares of the CPU time (``torch.profiler``, ``runs`` forwards after 3 warm-up) by kind of work.

    ``quantize/dequantize ops``: the reference graph's explicit ``quantized_decomposed`` ops, *inclusive* of the
    ATen ops they decompose into (sub, mul, round, clamp, copies); ``int8 GEMM/conv``: oneDNN ``onednn::q*``
    kernels (which requantise their output inside); ``fused kernels with (de)quantize``: Inductor kernels whose
    name holds ``quantize`` (element-wise work fused with a (de)quantize step; needs
    ``cpp.enable_kernel_profile`` at compile time); ``float GEMM/conv``: ``aten::mm/addmm/bmm/...``; ``other
    generated kernels``; ``compiled-graph wrapper``: the Python code Inductor generates to call its kernels, and
    Dynamo's guard checks (self time of those frames); ``rest``: the remainder (dispatcher, views, allocation,
    softmax and other element-wise ATen ops).  Self times, except for the quantize/dequantize ops."""
    from torch.profiler import profile

    with torch.inference_mode():
        for _ in range(3):
            model(x)
        with profile() as prof:
            for _ in range(runs):
                model(x)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) or 1
    float_gemm = ("aten::mm", "aten::addmm", "aten::bmm", "aten::mkldnn_convolution", "aten::baddbmm",
                  "mkldnn::_linear_pointwise", "mkl::_mkl_linear", "mkldnn::_convolution_pointwise")
    out = dict.fromkeys(("quantize/dequantize ops", "int8 GEMM/conv", "fused kernels with (de)quantize",
                         "float GEMM/conv", "other generated kernels"), 0.0)
    for e in events:
        key = e.key
        if key.startswith("quantized_decomposed::"):
            out["quantize/dequantize ops"] += e.cpu_time_total / total
        elif key.startswith("onednn::q"):
            out["int8 GEMM/conv"] += e.self_cpu_time_total / total
        elif "cpp_fused" in key:
            out["fused kernels with (de)quantize" if "quantize" in key else "other generated kernels"] += (
                e.self_cpu_time_total / total)
        elif key in float_gemm:
            out["float GEMM/conv"] += e.self_cpu_time_total / total
        elif key.startswith(("## Call CompiledFxGraph", "TorchDynamo Cache Lookup", "Torch-Compiled Region",
                             "AOTDispatcher", "Pregraph bytecode")):
            out["compiled-graph wrapper"] = out.get("compiled-graph wrapper", 0.0) + e.self_cpu_time_total / total
    out.setdefault("compiled-graph wrapper", 0.0)
    out["rest"] = max(0.0, 1.0 - sum(out.values()))
    return {k: round(v, 4) for k, v in out.items()}


def photo_batch(size: int) -> torch.Tensor:
    """The three shipped real photographs, plain, flipped and shifted right and down: ``(12, 3, size, size)``."""
    photos = sample_batch((size, size))
    return torch.cat([photos, photos.flip(-1), photos.roll(size // 8, -1), photos.roll(size // 8, -2)])


def photo_statistics(model, size: int) -> None:
    """Set ``model``'s BatchNorm running statistics to those of real photographs (train-mode forwards of
    :func:`photo_batch`), so its logits have a trained model's scale and the logit checks mean something
    (random-init statistics leave LeViT's logits ~1e-4).  Timing is unaffected."""
    batch = photo_batch(size)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for module in norms:
        module.reset_running_stats()
        module.momentum = None
    model.train()
    with torch.no_grad():
        model(batch)
    model.eval()


def bench_model(name: str, batches: list[int], args) -> dict:
    size = args.size
    reference = timm.create_model(TIMM_EQUIVALENTS[name], pretrained=False, img_size=size).eval()
    doc = archspec.load_spec(name).model_dump(mode="json", exclude_none=True)
    doc["input"]["resolution"] = size
    ours = load_timm_weights(archspec.compile(doc), reference).eval()
    photo_statistics(ours, size)
    levit = name.startswith("levit")
    variants = {"timm": reference, "timm compiled": compile_for_inference(reference), "archspec": ours}
    if levit:
        folded = ours.fuse()
        variants["archspec folded"] = folded
    variants["archspec compiled"] = compile_for_inference(ours)
    if levit:
        variants["archspec folded compiled"] = compile_for_inference(folded)
    start = time.perf_counter()
    calibration = [photo_batch(size)]  # the images whose statistics the BatchNorms hold
    variants["archspec int8"] = archspec.quantize(ours, calibration, description={"data": "photos"})
    quantize_s = time.perf_counter() - start
    variants["archspec int8, uncompiled"] = variants["archspec int8"].reference()  # PT2E reference graph
    result = {"model": name, "timm": TIMM_EQUIVALENTS[name], "quantize_s": round(quantize_s, 1), "batches": {},
              "int8_ops": variants["archspec int8"].summary}
    for batch in batches:
        x = torch.randn(batch, 3, size, size)
        compile_s = {label: round(_first_call(model, x), 1) for label, model in variants.items()
                     if label.endswith(" compiled") or label == "archspec int8"}
        print(f"{name} batch {batch}: compiled in {compile_s} s", flush=True)
        seconds = interleaved({label: _forward(model, x) for label, model in variants.items()}, args.samples,
                              args.min_time)
        result["batches"][str(batch)] = {"ms": {k: [round(s * 1e3, 3) for s in v] for k, v in seconds.items()},
                                         "compile_s": compile_s}
        print(table_rows(name, batch, result["batches"][str(batch)]["ms"]), flush=True)
    photo = sample_batch((size, size))[:1]
    with torch.inference_mode():
        base, got = ours(photo), variants["archspec int8"](photo)
    result["int8_vs_float32_on_photo"] = {"max_abs_logit_diff": (got - base).abs().max().item(),
                                          "max_abs_logit": base.abs().max().item()}
    if args.profile:
        x = torch.randn(1, 3, size, size)
        quantized = variants["archspec int8"]
        # a copy of the graph (a new GraphModule class): compiled afresh, not served from Dynamo's cache
        named = archspec.QuantizedModel(copy.deepcopy(quantized.program), ours, quantized.observers, {})
        with torch._inductor.config.patch({"cpp.enable_kernel_profile": True}):  # kernel names in the profile
            _first_call(named, x)
        result["profile"] = {"int8 compiled": shares(named, x),
                             "int8 reference graph": shares(quantized.reference(), x),
                             "timm float32": shares(reference, x)}
        print(json.dumps(result["profile"], indent=1), flush=True)
    if levit and args.onnx:
        result["onnx"] = bench_onnx(ours, folded, variants["archspec int8"], args)
    return result


def table_rows(name: str, batch: int, ms: dict[str, list[float]]) -> str:
    base = ms["timm"]
    lines = []
    for label, values in ms.items():
        speed = " / ".join(f"{b / v:.2f}" for b, v in zip(base, values))
        lines.append(f"| {name} | {batch} | {label} | {' ; '.join(f'{v:.2f}' for v in values)} | {speed} |")
    return "\n".join(lines)


def bench_onnx(model, folded, quantized, args) -> dict:
    """ONNX Runtime vs PyTorch eager, batch 1, one thread, for the unfolded, folded and int8 model."""
    from archspec.deploy.onnx_export import export_onnx, ort_session, run_onnx

    size = args.size
    photos = sample_batch((size, size))
    x = torch.randn(1, 3, size, size)
    out = {"max_abs_logit_diff": {}, "nodes": {}}
    fns = {"PyTorch eager": _forward(model, x), "PyTorch eager folded": _forward(folded, x)}
    with tempfile.TemporaryDirectory(prefix="archspec-onnx-") as tmp:
        for label, module, reference in (("ONNX Runtime", model, model), ("ONNX Runtime folded", folded, folded),
                                         ("ONNX Runtime int8", quantized.program, quantized.reference())):
            path = Path(tmp) / f"{label.replace(' ', '_')}.onnx"
            written = export_onnx(module, path, photos[:2], {"bench": label})
            session = ort_session(path, threads=1)
            with torch.inference_mode():
                expected = reference(photos)
            out["max_abs_logit_diff"][label] = (run_onnx(session, photos) - expected).abs().max().item()
            out["max_abs_logit"] = expected.abs().max().item()
            out["nodes"][label] = {k: written["nodes"].get(k, 0) for k in
                                   ("BatchNormalization", "QuantizeLinear", "DequantizeLinear", "MatMul")}
            feed = {session.get_inputs()[0].name: x.numpy()}
            fns[label] = (lambda s, f: lambda: s.run(None, f))(session, feed)
        seconds = interleaved(fns, args.samples, args.min_time)
    out["ms"] = {k: [round(s * 1e3, 3) for s in v] for k, v in seconds.items()}
    return out


def markdown(results: list[dict], meta: dict) -> str:
    lines = [f"### int8, folded and compiled against timm (CPU, one thread, {meta['size']} px)", "",
             "| model | batch | case | ms (2 rounds) | speed vs timm eager |", "|---|---|---|---|---|"]
    for r in results:
        for batch, data in r["batches"].items():
            lines.append(table_rows(r["model"], int(batch), data["ms"]))
    lines += ["", "Compilation (first call) seconds: " + "; ".join(
        f"{r['model']} b{batch}: " + ", ".join(f"{k} {v}" for k, v in d["compile_s"].items())
        for r in results for batch, d in r["batches"].items())]
    onnx = [r for r in results if "onnx" in r]
    if onnx:
        lines += ["", "### ONNX Runtime next to PyTorch (batch 1, one thread)", "",
                  "| model | case | ms (2 rounds) | speed vs PyTorch eager | max logit diff vs PyTorch (int8: its "
                  "reference graph) | "
                  "BatchNormalization nodes |", "|---|---|---|---|---|---|"]
        for r in onnx:
            ms = r["onnx"]["ms"]
            base = ms["PyTorch eager"]
            for label, values in ms.items():
                speed = " / ".join(f"{b / v:.2f}" for b, v in zip(base, values))
                diff = r["onnx"]["max_abs_logit_diff"].get(label)
                bns = r["onnx"]["nodes"].get(label, {}).get("BatchNormalization", "-")
                lines.append(f"| {r['model']} | {label} | {' ; '.join(f'{v:.2f}' for v in values)} | {speed} | "
                             f"{'-' if diff is None else f'{diff:.1e}'} | {bns} |")
        lines += ["", "Logits of the photo-statistics models reach " + ", ".join(
            f"{r['model']} {r['onnx']['max_abs_logit']:.2f}" for r in onnx) + " in absolute value."]
    lines += ["", "int8 vs float32 archspec on Grace Hopper's photo (max |logit diff| / max |logit|): " + ", ".join(
        f"{r['model']} {r['int8_vs_float32_on_photo']['max_abs_logit_diff']:.3f} / "
        f"{r['int8_vs_float32_on_photo']['max_abs_logit']:.3f}" for r in results)]
    prof = [r for r in results if "profile" in r]
    if prof:
        keys = list(prof[0]["profile"]["int8 compiled"])
        lines += ["", "### Where the time goes (batch 1, one thread, share of self CPU time, torch.profiler)", "",
                  "| model | run | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
        for r in prof:
            for run, share in r["profile"].items():
                lines.append(f"| {r['model']} | {run} | " + " | ".join(f"{100 * share[k]:.1f} %" for k in keys) + " |")
    lines += ["", f"Command: `{meta['command']}`; commit {meta['commit']}; {meta['cpu']}, {meta['cores']} cores; "
              f"torch {meta['torch']}, torchao {meta['torchao']}, timm {meta['timm']}, onnxruntime "
              f"{meta['onnxruntime']}; {meta['minutes']} min."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=MODELS, choices=sorted(TIMM_EQUIVALENTS))
    parser.add_argument("--batches", nargs="*", type=int, default=[1, 16])
    parser.add_argument("--samples", type=int, default=7, help="alternations per round (default 7)")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds per case and round (default 1)")
    parser.add_argument("--size", type=int, default=224, help="input side in px (default 224, the papers')")
    parser.add_argument("--no-onnx", dest="onnx", action="store_false", help="skip the ONNX Runtime part")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="skip the profile part")
    parser.add_argument("--out", default=str(Path(__file__).with_name("deploy_latency")))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # compile, calibrate and time on one thread (Inductor bakes the count into its kernels)
    started, commit = time.time(), _commit()  # the code that runs, before anyone edits the tree meanwhile
    results = [bench_model(name, args.batches, args) for name in args.models]
    import torchao

    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
    except ImportError:
        ort_version = "-"
    meta = {"command": " ".join(["python", *sys.argv]), "size": args.size, "commit": commit, "cpu": _cpu(),
            "cores": len(__import__("os").sched_getaffinity(0)), "torch": torch.__version__,
            "torchao": torchao.__version__, "timm": timm.__version__, "onnxruntime": ort_version,
            "minutes": round((time.time() - started) / 60, 1)}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    text = markdown(results, meta)
    out.with_suffix(".md").write_text(text)
    print("\n" + text)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
