"""``archspec export SPEC_OR_BUILD --onnx FILE``: the command line of the ONNX export (torch-free parser).

``archspec.cli`` calls :func:`add_export_parser` with its sub-command registry; the handler imports torch, onnx
and onnxruntime only when it runs (``tests/test_front_door.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from archspec._version import __version__
from archspec.cli.common import load_artifact_arg, load_spec_arg, parse_resolution
from archspec.errors import SpecError
from archspec.io.builddir import INT8_FILE

__all__ = ["add_build_options", "add_export_parser", "check_build_options", "cmd_export"]

EXPORT_DESCRIPTION = """\
Export SPEC (random initialisation from its seed) or a build directory DIR (its weights) to ONNX with a dynamic
batch dimension, then run it in ONNX Runtime on three real photographs (and on one, for the dynamic batch) and
print the largest logit difference from PyTorch (float32: at most 1e-4 expected).

  --fuse   fold every BatchNorm into its linear / conv first (LeViT sec. 5.3): no BatchNormalization node left
  --int8   int8 as LeViT sec. 5.3 (archspec.quantize; folds first): QuantizeLinear / DequantizeLinear around
           int8 linears and convs, attention products and softmax in float32.  A DIR built with
           `archspec build --int8` uses its saved calibration; otherwise --calibrate DATA (default digits).

FILE must be missing or an ONNX file `archspec export` wrote (replaced atomically); anything else is refused and
left untouched.  Needs the extra archspec[export] (onnx, onnxscript, onnxruntime)."""


def add_export_parser(sub) -> argparse.ArgumentParser:
    """Register ``archspec export`` on ``sub``."""
    export = sub.add_parser("export", help="ONNX export (dynamic batch; --fuse, --int8), checked in ONNX Runtime",
                            description=EXPORT_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="example: archspec export levit_128s --onnx levit.onnx --fuse")
    export.add_argument("spec", metavar="SPEC|DIR", help="YAML file, shipped spec name, or build directory")
    export.add_argument("--onnx", required=True, metavar="FILE", help="the ONNX file to write")
    export.add_argument("--fuse", action="store_true", help="fold the BatchNorms first (LeViT sec. 5.3)")
    export.add_argument("--int8", action="store_true", help="export the int8 model (LeViT sec. 5.3; x86 CPUs)")
    export.add_argument("--calibrate", metavar="DATA",
                        help="--int8: calibration images (digits, the default; fashion-mnist; a CIFAR, IDX or "
                             "ImageFolder directory); not needed for a DIR built with --int8")
    export.add_argument("--calibration-batches", type=int, default=4, metavar="N",
                        help="--int8: batches of 32 training images (default 4)")
    export.add_argument("--resolution", metavar="N|HxW", help="SPEC only: override the spec's input resolution")
    export.add_argument("--opset", type=int, metavar="N", help="ONNX opset (default: the exporter's)")
    export.add_argument("--allow-spec-change", action="store_true",
                        help="DIR only: load even if spec.yaml was edited after the weights were saved")
    export.add_argument("--json", action="store_true", help="print the report as JSON")
    export.set_defaults(handler=cmd_export)
    return export


def add_build_options(build: argparse.ArgumentParser) -> None:
    """Add ``--torch-compile`` (alias ``--compile``), ``--int8``, ``--calibrate`` and ``--calibration-batches`` to
    ``archspec build``."""
    build.add_argument("--torch-compile", "--compile", dest="torch_compile", action="store_true",
                       help="also time the model under torch.compile (Inductor, freezing: weights as constants) "
                            "next to eager (and the folded one with --fuse); the first call compiles (seconds)")
    build.add_argument("--int8", action="store_true",
                       help="also quantise to int8 as LeViT sec. 5.3 did (BatchNorms folded, weights per channel, "
                            "activation scales calibrated on --calibrate, attention products and softmax in float32; "
                            "torchao PT2E, x86 CPUs), time it compiled and write int8.safetensors beside the float "
                            "weights (archspec.load_quantized(OUT) rebuilds it)")
    build.add_argument("--calibrate", metavar="DATA",
                       help="--int8: the training images to calibrate on, what `archspec train --data` takes: "
                            "digits (the default, embedded), fashion-mnist, a CIFAR, IDX or ImageFolder directory")
    build.add_argument("--calibration-batches", type=int, default=4, metavar="N",
                       help="--int8: calibrate on N batches of 32 training images (default 4; LeViT: 'a few batches')")


def check_build_options(args: argparse.Namespace, device) -> None:
    """``archspec build``'s ``--int8`` / ``--calibrate`` / ``--calibration-batches`` before any work (``device``:
    the torch device of ``--device``).  Imports torch only with ``--int8``.

    Raises:
        SpecError: an option without the one it needs, int8 off the CPU, an unknown or missing --calibrate
            source, a machine that cannot run int8 (:func:`archspec.deploy.int8.require_backend`).
    """
    _check_int8_options(args)
    if not args.int8:
        return
    if device.type != "cpu":
        raise SpecError.single(("--int8",), f"int8 runs on the CPU (oneDNN kernels), not on {device}",
                               "use --device cpu with --int8")
    from archspec.deploy.int8 import require_backend
    from archspec.io.data_sources import check_source

    require_backend()  # at `int8`, check_source at `data`: main names them --int8 and --calibrate
    check_source(args.calibrate)


def _check_int8_options(args: argparse.Namespace) -> None:
    """``--calibrate`` and ``--calibration-batches`` (build and export): only with ``--int8``, at least 1 batch."""
    if not args.int8:
        for option, given in (("--calibrate", args.calibrate is not None),
                              ("--calibration-batches", args.calibration_batches != 4)):
            if given:
                raise SpecError.single((option,), "applies only with --int8", f"add --int8, or drop {option}")
    if args.calibration_batches < 1:
        raise SpecError.single(("--calibration-batches",), f"needs at least 1 batch, got {args.calibration_batches}")


def _check_options(args: argparse.Namespace, is_dir: bool) -> None:
    _check_int8_options(args)
    if is_dir and args.resolution:
        raise SpecError.single(("--resolution",), "applies only to a spec; a build directory keeps its resolution")
    if not is_dir and args.allow_spec_change:
        raise SpecError.single(("--allow-spec-change",), "applies only to a build directory (DIR), not to a spec")
    if args.opset is not None and not 7 <= args.opset <= 30:
        raise SpecError.single(("--opset",), f"not an ONNX opset: {args.opset}", "leave it out for the default")


def _model(args: argparse.Namespace, is_dir: bool):
    """The float model to export (and its origin), from DIR or SPEC."""
    from archspec.nn.compiler import compile

    if is_dir:
        return load_artifact_arg(args.spec, args.allow_spec_change, None).eval(), f"weights of {args.spec}"
    resolution = None
    if args.resolution:
        try:
            resolution = parse_resolution(args.resolution)
        except argparse.ArgumentTypeError as exc:
            raise SpecError.single(("--resolution",), str(exc)) from None
    spec = load_spec_arg(args.spec, resolution)
    return compile(spec).eval(), f"random initialisation (seed {spec.seed})"


def _quantized(args: argparse.Namespace, model, is_dir: bool):
    """The int8 model (reference graph: what is exported): the DIR's saved calibration, or --calibrate."""
    from archspec.deploy.int8 import load_calibration, load_quantized, quantize, require_backend
    from archspec.io.data_sources import check_source

    require_backend()
    if is_dir and args.calibrate is None and (Path(args.spec) / INT8_FILE).is_file():
        return load_quantized(args.spec, torch_compile=False, allow_spec_change=args.allow_spec_change)
    check_source(args.calibrate)  # at `data`: main() maps it to --calibrate for export (archspec.cli.options)
    spec = model.spec
    batches, description = load_calibration(args.calibrate, spec.input.channels, tuple(spec.input.resolution),
                                            args.calibration_batches)
    return quantize(model, batches, torch_compile=False, description=description)


def cmd_export(args: argparse.Namespace) -> int:
    """`archspec export SPEC|DIR --onnx FILE`: export, check in ONNX Runtime, report.  Returns the exit status.

    Raises:
        SpecError: a bad spec, directory, option or FILE, the export extra missing, a model that cannot be
            exported or quantised (exit 2 in :func:`archspec.cli.main`); FILE is untouched then.
    """
    from archspec.deploy.onnx_export import FLOAT32_TOLERANCE, check_target, export_onnx, require_onnx

    is_dir = Path(args.spec).is_dir()
    _check_options(args, is_dir)
    require_onnx()
    check_target(args.onnx)  # refuse a FILE that is not ours before any work
    import torch

    from archspec.deploy.onnx_export import ort_session, run_onnx
    from archspec.io.images import sample_batch
    from archspec.nn.fuse import count_batchnorms

    model, origin = _model(args, is_dir)
    spec = model.spec
    photos = sample_batch(tuple(spec.input.resolution), spec.input.channels)  # (3, C, H, W) real photographs
    with torch.no_grad():
        float_logits = model(photos)
    if args.int8:
        quantized = _quantized(args, model, is_dir)
        module, reference, kind = quantized.program, quantized, "int8"
    else:
        module = model.fuse() if args.fuse else model
        reference, kind = module, "float32 folded" if args.fuse else "float32"
    with torch.no_grad():
        expected = reference(photos)
    metadata = {"archspec_version": __version__, "spec": spec.name, "model": origin, "kind": kind,
                "torch": torch.__version__}
    written = export_onnx(module, args.onnx, photos[:2], metadata, args.opset)
    session = ort_session(args.onnx)
    got = run_onnx(session, photos)
    single = run_onnx(session, photos[:1])  # the dynamic batch: one image through the same file
    diff = (got - expected).abs().max().item()
    report = {
        "onnx": str(args.onnx), "spec": spec.name, "model": origin, "kind": kind, **written,
        "batchnorm_nodes": written["nodes"].get("BatchNormalization", 0),
        "pytorch_batchnorms": count_batchnorms(module) if not args.int8 else 0,
        "check": {"images": len(photos), "max_abs_logit_diff": diff, "max_abs_logit": expected.abs().max().item(),
                  "batch1_max_abs_diff": (single - got[:1]).abs().max().item(),
                  "against": "the int8 reference graph in PyTorch" if args.int8 else "PyTorch"},
    }
    if args.int8:
        report["check"]["max_abs_logit_diff_vs_float32"] = (got - float_logits).abs().max().item()
        report["int8_ops"] = quantized.summary
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        check = report["check"]
        print(f"wrote {args.onnx}: {kind} {spec.name} ({origin}), opset {written['opset']}, {written['bytes']:,} "
              f"bytes, dynamic batch, {report['batchnorm_nodes']} BatchNormalization nodes\n"
              f"ONNX Runtime vs {check['against']} on {len(photos)} real photos: max |logit diff| {diff:.2e} "
              f"(logits up to {check['max_abs_logit']:.2e})"
              + (f"; vs float32 {check['max_abs_logit_diff_vs_float32']:.2e}" if args.int8 else ""))
    if not args.int8 and diff > FLOAT32_TOLERANCE:
        print(f"archspec export: warning: ONNX Runtime differs from PyTorch by {diff:.2e} > {FLOAT32_TOLERANCE:g}",
              file=sys.stderr)
    return 0
