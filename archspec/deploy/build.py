"""What ``archspec build --torch-compile / --int8`` adds to a build: the compiled and int8 reports (ms, seconds of
compilation, logit differences) and their lines in the build's summary (the option checks are
:func:`archspec.cli.deploy.check_build_options`).

``archspec.cli.app.cmd_build`` imports this module (and with it torch) when a build runs; the parser needs none of
it (``archspec build --help`` stays torch-free).
"""

from __future__ import annotations

import time

import torch

from archspec.deploy.int8 import BACKEND, load_calibration, quantize
from archspec.diagnostics.timing import compile_for_inference, measure_forward
from archspec.errors import SpecError

__all__ = ["compiled_report", "int8_report", "compiled_line", "int8_line", "first_call"]


def compiled_line(compiled: dict, eager_ms: float) -> str:
    """The build summary's line of :func:`compiled_report` (``eager_ms``: the eager latency, ms)."""
    folded = compiled.get("fused_latency_ms")
    return (f"torch.compile (--torch-compile, Inductor, freezing): latency {compiled['latency_ms']:.1f} ms "
            f"({eager_ms / compiled['latency_ms']:.2f}x eager, max |logit diff| {compiled['max_abs_logit_diff']:.1e})"
            + (f", folded {folded:.1f} ms" if folded is not None else "")
            + f", first call (compilation) {compiled['compile_s']:.0f} s\n")


def int8_line(int8: dict, eager_ms: float) -> str:
    """The build summary's lines of :func:`int8_report` (``eager_ms``: the float32 eager latency, ms)."""
    ops = ", ".join(f"{n} {op}" for op, n in int8["ops"]["int8"].items())
    kept = ", ".join(f"{n} {op}" for op, n in int8["ops"]["float32"].items()) or "nothing"
    return (f"int8 (--int8, {int8['calibration']['images']} {int8['calibration']['data']} images): latency "
            f"{int8['latency_ms']:.1f} ms ({eager_ms / int8['latency_ms']:.2f}x float32 eager), first call "
            f"(compilation) {int8['compile_s']:.0f} s; max |logit diff| vs float32 {int8['max_abs_logit_diff']:.2e} "
            f"(logits up to {int8['max_abs_logit']:.2e}), top-1 {'agrees' if int8['top1_agrees'] else 'differs'}\n"
            f"  int8: {ops}; float32: {kept}\n")


def compiled_report(model, x, logits, args) -> dict:
    """``--torch-compile``: the model (and its folded copy with ``--fuse``) timed under ``torch.compile`` (ms), the
    first call's seconds (``torch.export`` + Inductor compilation) and the largest |logit difference| from the eager
    ``logits`` ``(1, classes)`` on the photo ``x`` ``(1, C, H, W)``.

    Raises:
        SpecError: at ``torch_compile``: torch.compile fails on this machine or model (:func:`first_call`).
    """
    shape, report = tuple(x.shape[1:]), {"backend": "inductor", "options": {"freezing": True}}
    for key, variant in (("", model), ("fused_", model.fuse() if args.fuse else None)):
        if variant is None:
            continue
        compiled = compile_for_inference(variant)
        seconds, out = first_call(compiled, x, args.threads, "torch_compile")
        report[f"{key}compile_s"] = round(seconds, 2)
        report[f"{key}max_abs_logit_diff"] = (out - logits).abs().max().item()
        report[f"{key}latency_ms"] = round(measure_forward(compiled, shape, x.device, threads=args.threads, warmup=2,
                                                           repeats=args.repeats).ms, 3)
    return report


def first_call(model, x, threads: int, option: str):
    """The first forward of a compiled model (where torch.export and Inductor compile): ``(seconds, output)``.

    Raises:
        SpecError: at ``option``: the capture or the compilation failed -- most often Inductor's CPU backend
            finding no working C++ compiler -- with the first line of torch's reason.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # Inductor generates its kernels for the thread count of the first call
    try:
        start = time.perf_counter()
        with torch.inference_mode():
            out = model(x)
        return time.perf_counter() - start, out
    except SpecError:
        raise
    except Exception as exc:  # Dynamo / export / Inductor raise many types (BackendCompilerFailed, InductorError...)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise SpecError.single((option,), f"torch.compile failed: {reason}",
                               "Inductor's CPU backend needs a C++ compiler (g++ or clang) on PATH; "
                               f"or leave out `{option}`") from None
    finally:
        torch.set_num_threads(before)


def int8_report(model, x, logits, args):
    """``--int8``: quantise ``model`` (LeViT sec. 5.3, :func:`archspec.quantize`) on ``--calibrate`` data, compare
    it with the float logits ``(1, classes)`` on the photo ``x`` ``(1, C, H, W)``, time it compiled (ms).
    Returns ``(report, QuantizedModel)``.

    Raises:
        SpecError: at ``source`` (the data), ``calibration_batches`` or ``int8`` (what
            :func:`archspec.deploy.int8.quantize` refuses; a compilation that fails, :func:`first_call`)."""
    spec = model.spec
    batches, description = load_calibration(args.calibrate, spec.input.channels, tuple(spec.input.resolution),
                                            args.calibration_batches)
    quantized = quantize(model, batches, description=description)
    seconds, out = first_call(quantized, x, args.threads, "int8")
    diff = (out - logits).abs().max().item()
    report = {
        "backend": BACKEND, "calibration": quantized.calibration, "ops": quantized.summary,
        "compile_s": round(seconds, 2),
        "latency_ms": round(measure_forward(quantized, tuple(x.shape[1:]), "cpu", threads=args.threads, warmup=2,
                                            repeats=args.repeats).ms, 3),
        "max_abs_logit_diff": diff, "max_abs_logit": logits.abs().max().item(),
        "cosine": torch.nn.functional.cosine_similarity(out.flatten(), logits.flatten(), dim=0).item(),
        "top1_agrees": bool((out.argmax(-1) == logits.argmax(-1)).all()),
    }
    return report, quantized
