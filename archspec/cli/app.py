"""The ``archspec`` command line: ``build``, ``validate``, ``inspect``, ``list``, ``schema`` (and ``search``).

Every user mistake (a bad spec, a missing file, an impossible option) is printed as a located
message on stderr with exit status 2 and nothing written; a Python traceback means a bug in archspec.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from archspec._util.memory import format_bytes
from archspec._util.units import human
from archspec._version import __version__
from archspec.cli.common import (
    MAX_MEMORY_HELP,
    load_artifact_arg,
    load_spec_arg,
    make_console,
    parse_max_memory,
    parse_resolution,
)
from archspec.cli.deploy import add_build_options, add_export_parser, check_build_options
from archspec.cli.options import options_for
from archspec.cli.search import add_search_parser
from archspec.cli.table import add_table_parser
from archspec.cli.train import add_train_parser
from archspec.cli.transfer import add_transfer_parsers
from archspec.errors import SpecError
from archspec.io import builddir

EXIT_USAGE = 2

DESCRIPTION = """\
archspec compiles YAML architecture specs of vision transformers with convolutional inductive
biases (ConViT GPSA, LeViT attention bias and shrinking attention, CMHSA relative-bias heads,
MaiT masked heads) into PyTorch models.

  archspec list                                  the shipped specs
  archspec validate specs/mait_tiny_sch2.yaml    static checks + per-layer table, no weights
  archspec build mait_tiny_sch2                  compile, run a real photo through it, save it
  archspec inspect masked_cait_xxs24             ALS, nonlocality, gating, cross-layer similarity plots
  archspec schema > archspec.schema.json         JSON Schema for editor completion
  archspec two-phase cmhsa_k3_conv_digits        CMHSA: conv phase, exact transfer to attention, attention phase
  archspec tcnn resnetrs50 --checkpoint W.pth    T-CNN: a timm ResNet's last stage as 9-head GPSA
  archspec train levit_128s --data DIR           train with the seed papers' recipes (torchrun for several)
  archspec build levit_128s --fuse --int8 --torch-compile   LeViT sec. 5.3 int8, folded and compiled CPU latency
  archspec export levit_128s --onnx l.onnx --fuse     ONNX (dynamic batch), checked in ONNX Runtime

A SPEC is a path to a YAML file or the name of a shipped spec.  Exit status: 0 ok, 2 bad input.
"""


def make_parser() -> argparse.ArgumentParser:
    """The whole command line.  Built for every command, ``--help`` and ``validate`` included, so it is made from
    torch-free modules only: a command imports what it needs when it runs (``tests/test_front_door.py``)."""
    parser = argparse.ArgumentParser(prog="archspec", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"archspec {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_build_parser(sub)
    _add_validate_parser(sub)
    _add_inspect_parser(sub)
    sub.add_parser("list", help="the shipped specs, with params and MACs")
    _add_schema_parser(sub)
    add_search_parser(sub)
    add_table_parser(sub)
    add_train_parser(sub)
    add_transfer_parsers(sub)  # two-phase and tcnn (each sets its own handler)
    add_export_parser(sub)
    return parser


def _add_build_parser(sub) -> None:
    build = sub.add_parser(
        "build", help="validate, compile, run a real photograph through the model and save it",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Validate SPEC, compile it into a torch model (initial weights from the spec's seed), push a\n"
                    "real photograph through it (Grace Hopper's portrait, shipped in matplotlib, unless --image),\n"
                    "print the per-layer table and totals, and write to OUT (default build/<name>/):\n"
                    "  spec.yaml          the resolved spec, every default explicit\n"
                    "  report.json        the table and totals\n"
                    "  model.safetensors  weights; archspec.load(OUT) rebuilds the model exactly\n"
                    "OUT must be missing, an empty directory, or a build archspec wrote (replaced atomically);\n"
                    "anything else is refused and left untouched.",
        epilog="example: archspec build specs/mait_tiny_sch2.yaml --resolution 160 --out /tmp/mait")
    build.add_argument("spec", metavar="SPEC", help="YAML file or shipped spec name (see `archspec list`)")
    build.add_argument("--image", metavar="PATH", help="photograph to run (default: the embedded one)")
    build.add_argument("--out", metavar="DIR", help="output directory (default: build/<name>)")
    build.add_argument("--resolution", type=parse_resolution, metavar="N|HxW",
                       help="override the spec's input resolution")
    build.add_argument("--device", default="cpu",
                       help="auto, cpu, cuda or cuda:N for the forward pass and its timing (default: cpu; LeViT's CPU "
                            "protocol there, its GPU protocol on cuda: largest power-of-two batch, bf16, images/s)")
    build.add_argument("--threads", type=int, default=1, metavar="N",
                       help="torch threads while timing on CPU (default 1: LeViT's CPU protocol)")
    build.add_argument("--seed", type=int, metavar="N", help="override the spec's initialisation seed")
    build.add_argument("--repeats", type=int, default=10, metavar="N",
                       help="timed forward passes for the latency median (default: 10, after 2 warm-up runs; "
                            "torch.utils.benchmark.Timer)")
    build.add_argument("--fuse", action="store_true",
                       help="also fold every BatchNorm into its linear/conv (LeViT sec. 5.3) "
                            "and time the folded model; "
                            "the saved weights stay unfolded (model.fuse() after archspec.load)")
    add_build_options(build)  # --torch-compile, --int8, --calibrate, --calibration-batches (archspec.cli.deploy)
    build.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    build.add_argument("--max-memory", type=parse_max_memory, metavar="SIZE", help=MAX_MEMORY_HELP)


def _add_validate_parser(sub) -> None:
    validate = sub.add_parser(
        "validate", help="static checks and the analysis table only (no weights, fast); or check a build directory",
        description="Check SPEC (schema and shapes, no weights) and print the analysis table.  Given a directory\n"
                    "written by `archspec build` or archspec.save, load it instead: spec, weights and the digest\n"
                    "that ties them together.", formatter_class=argparse.RawDescriptionHelpFormatter)
    validate.add_argument("spec", metavar="SPEC|DIR", help="YAML file, shipped spec name, or build directory")
    validate.add_argument("--allow-spec-change", action="store_true",
                          help="DIR only: load even if spec.yaml was edited after the weights were saved")
    validate.add_argument("--resolution", type=parse_resolution, metavar="N|HxW",
                          help="override the input resolution (DIR: load the weights at it, position embedding and "
                               "bias tables resampled)")
    validate.add_argument("--json", action="store_true", help="print the analysis as JSON")
    validate.add_argument("--max-memory", type=parse_max_memory, metavar="SIZE", help=MAX_MEMORY_HELP)


def _add_schema_parser(sub) -> None:
    schema = sub.add_parser(
        "schema", help="print the JSON Schema of a spec (for editor completion)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Print the JSON Schema (Draft 2020-12) of a spec, shorthands included.  For completion and\n"
                    "checking in an editor with the YAML language server, save it and start the spec with\n"
                    "  # yaml-language-server: $schema=archspec.schema.json\n"
                    "(a path relative to the spec, or a URL).  The shipped specs use specs/archspec.schema.json;\n"
                    "--space prints the schema of search-space files (archspec/search/spaces/*.yaml use it).")
    schema.add_argument("--markdown", action="store_true", help="print the field reference as Markdown instead")
    schema.add_argument("--space", action="store_true",
                        help="print the JSON Schema of a search-space file (archspec search --space) instead")


def _window(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not match or int(match.group(1)) % 2 == 0 or int(match.group(2)) % 2 == 0:
        raise argparse.ArgumentTypeError(f"expected an odd window RxC such as 3x3 or 3x5, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def _add_inspect_parser(sub) -> None:
    inspect = sub.add_parser(
        "inspect", help="attention diagnostics on real photos: ALS, nonlocality, gating, cross-layer similarity",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run real photographs (three shipped ones unless --image) through SPEC (random init from its\n"
                    "seed) or a saved model DIR and write to OUT (default build/<name>-inspect/):\n"
                    "  als.png          MaiT eq. 3 attention locality score per layer and head\n"
                    "  nonlocality.png  ConViT eq. 8 mean attention distance per layer and head\n"
                    "  gating.png       ConViT sigmoid(lambda) of every GPSA head\n"
                    "  similarity.png   MaiT App. A.3 eq. 5 cross-layer similarity, one L x L map per head\n"
                    "  inspect.json     the numbers\n"
                    "OUT must be missing, an empty directory, or an earlier `archspec inspect` output.",
        epilog="example: archspec inspect masked_cait_xxs24 --out /tmp/mcait")
    inspect.add_argument("spec", metavar="SPEC|DIR", help="YAML file, shipped spec name, or build directory")
    inspect.add_argument("--image", action="append", metavar="PATH", help="photograph to run (repeatable)")
    inspect.add_argument("--out", metavar="DIR", help="output directory (default: build/<name>-inspect)")
    inspect.add_argument("--window", type=_window, default=(3, 3), metavar="RxC", help="ALS window (default 3x3)")
    inspect.add_argument("--allow-spec-change", action="store_true",
                         help="DIR only: load even if spec.yaml was edited after the weights were saved")
    inspect.add_argument("--json", action="store_true", help="print the numbers as JSON")
    inspect.add_argument("--max-memory", type=parse_max_memory, metavar="SIZE", help=MAX_MEMORY_HELP)


def _version() -> str:
    return __version__


def _table(analysis, title: str):
    from rich.table import Table

    from archspec.families.attention.heads import head_letters_legend

    used = " ".join(row.heads for row in analysis.rows)
    caption = (f"heads: {head_letters_legend(used)}\n" if used.strip() else "") + (
        f"memory of a batch-1 float32 forward (estimate): {format_bytes(analysis.peak_memory_bytes)} = peak "
        f"activations {format_bytes(analysis.peak_activation_bytes)} (at {analysis.peak_layer}) + weights "
        f"{format_bytes(analysis.weight_bytes)} + buffers {format_bytes(analysis.buffer_bytes)}")
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    executed = analysis.macs_executed != analysis.macs  # the column only when some layer runs other MACs
    columns = [("layer", "left"), ("kind", "left"), ("heads", "left"), ("tokens", "right"), ("dim", "right"),
               ("params", "right"), ("MACs", "right")] + ([("MACs executed", "right")] if executed else [])
    for column, justify in columns:
        table.add_column(column, justify=justify)
    for row in analysis.rows:
        cells = [row.layer, row.kind, row.heads, str(row.tokens), str(row.dim), human(row.params), human(row.macs)]
        table.add_row(*cells, *([human(row.macs_executed)] if executed else []))
    return table


def _executed_note(analysis) -> str:
    """`` (N executed: why)`` when the model runs other MACs than the papers count (attn_impl='auto'), else ''."""
    from archspec._util.units import human
    if analysis.macs_executed == analysis.macs:
        return ""
    rows = [row for row in analysis.rows if row.macs_executed != row.macs]
    why = [text for letter, text in (("M", "hard-masked heads run on the linear-time window path"),
                                     ("P", "GPSA heads run as SDPA plus a P V product"),
                                     ("N", "neighbourhood heads run on whole key blocks per query tile, or every pair "
                                      "on small grids"))
           if any(letter in row.heads for row in rows)]
    return f" ({human(analysis.macs_executed)} executed: {'; '.join(why) or 'the attention paths chosen'})"


def cmd_validate(args: argparse.Namespace) -> int:
    """`archspec validate SPEC|DIR`: checks plus the analysis table; a directory is loaded as an artifact.

    SPEC: schema and shape checks, no weights.  DIR (written by ``archspec build`` / ``archspec.save``):
    spec, weights and spec digest via :func:`archspec.io.artifact.load`.  Returns the exit status.

    Raises:
        SpecError: anything invalid (exit 2 in :func:`main`); options that do not apply to the argument.
    """
    from archspec._util.units import human
    from archspec.ir.analysis import analyze
    is_dir = Path(args.spec).is_dir()
    if not is_dir and args.allow_spec_change:
        raise SpecError.single(("--allow-spec-change",), "applies only to a build directory (DIR), not to a spec")
    if is_dir:
        spec = load_artifact_arg(args.spec, args.allow_spec_change, args.max_memory, args.resolution).spec
    else:
        spec = load_spec_arg(args.spec, args.resolution, max_memory=args.max_memory)
    analysis = analyze(spec)
    artifact = {"artifact": args.spec} if is_dir else {}
    if args.json:
        print(json.dumps({"valid": True, **artifact, **analysis.to_dict()}, indent=2))
        return 0
    console = make_console()
    console.print(_table(analysis, f"{spec.name}: valid" + (f" artifact {args.spec} (spec, weights, digest)" * is_dir)))
    console.print(f"params {human(analysis.params)} ({analysis.params:,})   MACs {human(analysis.macs)} per image "
                  f"({analysis.macs:,}{_split_note(spec, analysis)})   input {analysis.input_shape}   "
                  f"output {analysis.output_shape}")
    return 0


def _split_note(spec, analysis) -> str:
    """A hybrid's conv / transformer MACs, as LeViT Tab. 1 reports its grafted models."""
    from archspec._util.units import human
    if not spec.is_hybrid:
        return ""
    return f"; conv {human(analysis.conv_macs)}, transformer {human(analysis.token_macs)}"


def _write_out(verb: str, out: Path, write, report: dict, layout=None) -> dict:
    """Write ``report`` and what ``write(dir)`` writes into OUT under :mod:`archspec.io.builddir`'s rules; a
    warning goes to stderr.  Returns the report as written.

    Raises:
        SpecError: at ``--out``: the directory cannot be written (exit 2 in :func:`main`).
    """

    try:
        report, warning = (builddir.write_build(out, write, report) if layout is None
                           else builddir.write_build(out, write, report, layout))
    except OSError as exc:
        raise SpecError.single(("--out",), f"cannot write the output directory: {exc.strerror or exc}",
                               "choose a writable directory with --out", str(out)) from None
    if warning:
        print(f"archspec {verb}: warning: {warning}", file=sys.stderr)
    return report




def cmd_build(args: argparse.Namespace) -> int:
    """`archspec build`: validate, compile, run the photo, time it, write the build directory. Returns the exit status.

    OUT is checked before any work and written by :func:`archspec.io.builddir.write_build`: a missing OUT or an
    empty directory is filled, an earlier archspec build is replaced atomically, anything else is refused.
    ``--fuse``, ``--torch-compile`` and ``--int8`` add the folded, compiled and int8 models' figures to the report;
    ``--int8`` also writes ``int8.safetensors`` (:func:`archspec.deploy.int8.save_quantized`).

    Raises:
        SpecError: a bad spec, option, image, calibration source or OUT, a model that cannot be quantised
            (exit 2 in :func:`main`); nothing is written then.
    """
    import torch

    from archspec._util.units import human
    from archspec.deploy import build as deploy_build
    from archspec.diagnostics.timing import measure_forward, parse_device
    from archspec.io import artifact, builddir
    from archspec.io.images import default_image_path, load_image
    from archspec.ir.analysis import analyze
    from archspec.nn.compiler import compile

    if args.repeats < 1:
        raise SpecError.single(("--repeats",), "needs at least 1 timed run")
    if args.threads < 1:
        raise SpecError.single(("--threads",), f"needs at least 1 thread, got {args.threads}")
    device = parse_device(args.device)
    check_build_options(args, device)
    spec = load_spec_arg(args.spec, args.resolution, args.seed, max_memory=args.max_memory)
    out = Path(args.out) if args.out else Path("build") / spec.name
    builddir.check_out(out)  # refuse an OUT that is not ours before any work
    x = load_image(args.image, spec.input.resolution, spec.input.channels).to(device)
    analysis = analyze(spec)
    model = compile(spec, max_memory=args.max_memory).eval().to(device)
    with torch.inference_mode():
        logits = model(x)
    timing = measure_forward(model, tuple(x.shape[1:]), device, threads=args.threads, warmup=2, repeats=args.repeats)
    fused = _fused_report(model, x, logits, args) if args.fuse else None
    compiled = deploy_build.compiled_report(model, x, logits, args) if args.torch_compile else None
    int8, quantized = deploy_build.int8_report(model, x, logits, args) if args.int8 else (None, None)
    report = {
        **analysis.to_dict(),
        "image": str(Path(args.image) if args.image else default_image_path()),
        "output_shape": list(logits.shape),
        "latency_ms": round(timing.ms, 3),
        "images_per_s": round(timing.images_per_s, 1),
        "latency_protocol": timing.describe(),
        "seed": spec.seed,
        "out": str(out),
        **({"fused": fused} if fused else {}),
        **({"compiled": compiled} if compiled else {}),
        **({"int8": int8} if int8 else {}),
    }
    report = _write_out("build", out, lambda d: artifact.save(quantized or model.cpu(), d), report)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    console = make_console()
    console.print(_table(analysis, f"{spec.name}  ({spec.source or 'user spec'})"))
    files = "spec.yaml, report.json, model.safetensors" + (", int8.safetensors" if int8 else "")
    console.print(
        f"params {human(analysis.params)} ({analysis.params:,})   MACs {human(analysis.macs)} per image"
        f"{_executed_note(analysis)}   "
        f"input {tuple(x.shape)} from {Path(report['image']).name}   output {tuple(logits.shape)}\n"
        f"forward latency {timing.ms:.1f} ms, {timing.images_per_s:,.0f} images/s (median of {args.repeats}, "
        f"batch {timing.batch}, {device}, {timing.threads} thread(s){', ' + timing.amp if timing.amp else ''})   "
        f"initial weights: seed {spec.seed}\n"
        + (f"folded (--fuse): {fused['batchnorms_folded']} BatchNorms folded, params {fused['params']:,}, "
           f"latency {fused['latency_ms']:.1f} ms, "
           f"max |logit diff| {fused['max_abs_logit_diff']:.1e}\n" if fused else "")
        + (deploy_build.compiled_line(compiled, timing.ms) if compiled else "")
        + (deploy_build.int8_line(int8, timing.ms) if int8 else "")
        + f"wrote {out}/: {files}   (archspec.load{'_quantized' * bool(int8)}('{out}') rebuilds it)"
    )
    return 0






def cmd_inspect(args: argparse.Namespace) -> int:
    """`archspec inspect SPEC|DIR`: the four attention diagnostics on real photos, as PNG and JSON.

    Returns the exit status.

    Raises:
        SpecError: a bad spec, directory, option, image or OUT (exit 2 in :func:`main`); nothing is written then.
    """
    from archspec.diagnostics.inspection import INSPECT, diagnose, image_batch, write_plots
    from archspec.io import builddir
    from archspec.nn.compiler import compile

    is_dir = Path(args.spec).is_dir()
    if not is_dir and args.allow_spec_change:
        raise SpecError.single(("--allow-spec-change",), "applies only to a build directory (DIR), not to a spec")
    if is_dir:
        model = load_artifact_arg(args.spec, args.allow_spec_change, args.max_memory)
        origin = f"weights of {args.spec}"
    else:
        spec = load_spec_arg(args.spec, max_memory=args.max_memory)
        model, origin = compile(spec, max_memory=args.max_memory), f"random initialisation (seed {spec.seed})"
    spec = model.spec
    out = Path(args.out) if args.out else Path("build") / f"{spec.name}-inspect"
    builddir.check_out(out, INSPECT)  # refuse an OUT that is not ours before any work
    images, names = image_batch(args.image, spec.input.resolution, spec.input.channels)
    try:
        numbers = diagnose(model.eval(), images, args.window)
    except ValueError as exc:  # a model without self-attention (e.g. all conv mixers)
        raise SpecError.single((), str(exc), "inspect a spec with attention layers", args.spec) from None
    report = {"spec": spec.name, "model": origin, "images": names, **numbers}
    report = _write_out("inspect", out, lambda d: write_plots(numbers, d, spec.name), report, INSPECT)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"{spec.name}: {len(numbers['layers'])} attention layers, {len(names)} images, {origin}\n"
              f"wrote {out}/: {', '.join(sorted(INSPECT.files))}")
    return 0


def _fused_report(model, x, logits, args) -> dict:
    """``--fuse``: fold the BatchNorms of ``model`` (LeViT sec. 5.3), check it against ``logits`` and time it (ms)."""
    import torch

    from archspec.diagnostics.timing import measure_forward
    from archspec.nn.fuse import count_batchnorms

    folded = model.fuse()
    with torch.inference_mode():
        diff = (folded(x) - logits).abs().max().item()
    return {"batchnorms_folded": count_batchnorms(model) - count_batchnorms(folded),
            "params": sum(p.numel() for p in folded.parameters()),
            "latency_ms": round(measure_forward(folded, tuple(x.shape[1:]), x.device, threads=args.threads,
                                                warmup=2, repeats=args.repeats).ms, 3),
            "max_abs_logit_diff": diff}






def cmd_list(args: argparse.Namespace) -> int:
    """`archspec list`: the shipped specs with params and MACs. Returns the exit status."""
    from rich.table import Table

    from archspec._util.units import human
    from archspec.ir.analysis import analyze
    from archspec.ir.checked import load_spec
    from archspec.spec import SPEC_DIR, shipped_specs

    table = Table(title=f"shipped specs ({SPEC_DIR})", title_justify="left")
    for column in ("name", "params", "MACs", "source"):
        table.add_column(column, justify="right" if column in ("params", "MACs") else "left")
    for name in shipped_specs():
        spec = load_spec(name)
        analysis = analyze(spec)
        table.add_row(name, human(analysis.params), human(analysis.macs), (spec.source or "-").splitlines()[0])
    make_console().print(table)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    """`archspec schema`: the JSON Schema (or, with --markdown, the field reference). Returns the exit status."""
    if args.markdown:
        from archspec.spec.reference import markdown

        print(markdown())
        return 0
    from archspec.spec.schema import space_schema, spec_schema

    print(json.dumps(space_schema() if args.space else spec_schema(), indent=2))
    return 0


COMMANDS = {"build": cmd_build, "validate": cmd_validate, "inspect": cmd_inspect, "list": cmd_list,
            "schema": cmd_schema}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 2 bad input, 130 interrupted)."""
    parser = make_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse prints its own usage message
        return int(exc.code or 0)
    handler = COMMANDS.get(args.command) or getattr(args, "handler", None)
    try:
        return handler(args)
    except SpecError as exc:  # the library names its fields and parameters; the command line its options
        exc = exc.with_options(options_for(args.command, getattr(args, "search_mode", None)))
        print(f"archspec {args.command}: error", file=sys.stderr)
        print(str(exc), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `archspec schema | head`: the reader left; exit quietly (Python docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
