"""``archspec two-phase``: CMHSA's two-phase training from the command line (see :mod:`.two_phase`)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from archspec.errors import SpecError, TransferError
from archspec.io.builddir import check_group_out, write_build

__all__ = ["add_transfer_parsers", "cmd_tcnn", "cmd_two_phase"]

TWO_PHASE_DESCRIPTION = """\
CMHSA's two-phase training (Li et al., "Can Vision Transformers Perform Convolution?", sec. 4.1, App. B):
  1. train SPEC, a convolutional ViT (mixer: conv3 / conv5, a KxK conv on the pixel view of the tokens);
  2. transfer every conv into 9-head self-attention by App. A.2's exact construction (the transferred
     model's val accuracy at step 0 equals phase 1's; the report gives the max logit difference);
  3. train the attention model; and (unless --no-baseline) the same attention model from random
     initialisation for the steps of both phases together.
Data: --data as for `archspec search` (default: scikit-learn's digits), resized to SPEC's input resolution;
the classifier is sized to the data's classes.  Writes OUT/phase1 and OUT/phase2, each an archspec build
directory (spec.yaml, model.safetensors, report.json; archspec.load reads them), and OUT/phase2/report.json
holds the whole report (and OUT/baseline when trained).  OUT must be missing, empty, or hold nothing but
those three, each missing, empty or a build archspec wrote; anything else is refused before training starts."""


def add_transfer_parsers(sub) -> None:
    """Register ``archspec two-phase`` on the CLI's sub-parsers."""
    p = sub.add_parser("two-phase", help="CMHSA two-phase training: conv phase, exact transfer, attention phase",
                       description=TWO_PHASE_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example: archspec two-phase specs/cmhsa_k3_conv_digits.yaml --steps1 300 --steps2 300")
    p.add_argument("spec", metavar="SPEC", help="phase-1 spec (YAML file or shipped name) with conv mixers")
    p.add_argument("--data", metavar="PATH", help="ImageFolder or CIFAR-10 directory (default: sklearn digits)")
    p.add_argument("--max-images", type=int, metavar="N", help="keep at most N images (stratified)")
    p.add_argument("--out", metavar="DIR", help="output directory (default: build/<phase-2 name>-two-phase)")
    p.add_argument("--steps1", type=int, default=300, metavar="N", help="phase-1 steps (default 300)")
    p.add_argument("--steps2", type=int, default=300, metavar="N", help="phase-2 steps (default 300)")
    p.add_argument("--lr1", type=float, default=2e-3, help="phase-1 peak lr (default 2e-3)")
    p.add_argument("--lr2", type=float, default=5e-4, help="phase-2 peak lr (default 5e-4)")
    p.add_argument("--warmup1", type=int, default=20, metavar="N", help="phase-1 warm-up steps (default 20)")
    p.add_argument("--warmup2", type=int, default=0, metavar="N",
                   help="phase-2 warm-up steps (default 0: the transferred init needs none, sec. 4.3)")
    p.add_argument("--batch-size", type=int, default=32, metavar="N")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--augmentation", default="flip+crop", choices=["none", "flip", "crop", "flip+crop"])
    p.add_argument("--peak", type=float, default=None, metavar="M", help="relative-bias peak of the transfer (40)")
    p.add_argument("--seed", type=int, default=0, metavar="N")
    p.add_argument("--device", default="cpu", help="auto, cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--threads", type=int, metavar="N", help="torch threads (default: torch's)")
    p.add_argument("--no-baseline", action="store_true", help="skip the random-init phase-2 baseline")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=cmd_two_phase)

    t = sub.add_parser("tcnn", help="T-CNN: a timm ResNet's last-stage 3x3 convs as 9-head GPSA layers",
                       description=TCNN_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="example: archspec tcnn resnetrs50 --checkpoint rs50.safetensors --out build/t-rs50")
    t.add_argument("model", metavar="MODEL", help="timm ResNet-family model name (resnetrs50, resnet50d, ...)")
    t.add_argument("--checkpoint", metavar="PATH", help="weights to load into MODEL (timm load_checkpoint)")
    t.add_argument("--pretrained", action="store_true", help="timm's pretrained weights (downloads from its hub)")
    t.add_argument("--stages", nargs="+", default=["-1"], metavar="S",
                   help="stages to transform: 1-4, layer4, or -1 for the last (default)")
    t.add_argument("--alpha", type=float, default=1.0, help="initial locality strength (paper: 1)")
    t.add_argument("--gating", type=float, default=1.0, help="initial gating lambda (paper: 1)")
    t.add_argument("--no-stride-one", action="store_true", help="keep the stage's stride-2 conv (default: stride 1)")
    t.add_argument("--resolution", type=int, default=224, metavar="N", help="input side for counts and checks")
    t.add_argument("--num-classes", type=int, metavar="N", help="classifier size (default: the model's)")
    t.add_argument("--out", metavar="DIR", help="output directory (default: build/t-<MODEL>)")
    t.add_argument("--json", action="store_true", help="print the report as JSON")
    t.set_defaults(handler=cmd_tcnn)


TCNN_DESCRIPTION = """\
T-CNN (d'Ascoli et al., "Transformed CNNs", sec. 2-3): re-express the 3x3 convolutions of MODEL's chosen stages
(default the last) as 9-head GPSA layers -- W_val = I shared by the heads, W_out^h = kernel tap h, new W_qry
and W_key, locality alpha (softplus, beta = 5) and gating lambda per head, explicit zero padding -- with the
stage's first stride-2 conv made stride 1 (BoTNet).  MODEL is a timm ResNet with bottleneck blocks in those
stages; its T-CNN is a spec (conv stages with mixer: {kind: gpsa}, as specs/t_resnet50d.yaml), compiled, with
MODEL's weights loaded into it (each transformed conv's taps into its GPSA's W_out).  Runs Grace Hopper's portrait
through MODEL and, with alpha = lambda = 40 and the stride unchanged, through a twin holding the saved weights,
and reports the largest logit difference (the exactness of the construction), the saved model's own distance
from the CNN, the parameter counts and the MACs at --resolution.  --alpha, --gating, --resolution and
--checkpoint are checked before anything is built.  Writes OUT (default build/t-<MODEL>), an archspec build:
spec.yaml (the T-CNN spec at --resolution), model.safetensors and report.json; archspec.load(OUT) (or
archspec.transfer.load_tcnn(OUT)) rebuilds the model, and archspec build / analyze take its spec.yaml.  OUT must
be missing, empty or a directory archspec wrote."""


def _check_args(args: argparse.Namespace) -> None:
    for name in ("steps1", "steps2", "batch_size"):
        if getattr(args, name) < 1:
            raise SpecError.single(("--" + name.replace("_", "-"),), f"must be at least 1, got {getattr(args, name)}")
    for name in ("warmup1", "warmup2"):
        if getattr(args, name) < 0:
            raise SpecError.single(("--" + name,), f"must be >= 0, got {getattr(args, name)}")
    for name in ("lr1", "lr2"):
        if not (math.isfinite(getattr(args, name)) and getattr(args, name) > 0):
            raise SpecError.single(("--" + name,), f"must be a positive finite number, got {getattr(args, name)}")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        raise SpecError.single(("--weight-decay",), f"must be a finite number >= 0, got {args.weight_decay}")
    if args.peak is not None and not (math.isfinite(args.peak) and 0 < args.peak <= 1e4):
        raise SpecError.single(("--peak",), f"must be in (0, 10000], got {args.peak}",
                               "the relative-bias peak makes each head attend to its kernel offset (App. A.2): "
                               "the larger, the more exact; 40 by default")
    if args.threads is not None and args.threads < 1:
        raise SpecError.single(("--threads",), f"must be at least 1, got {args.threads}")


def cmd_two_phase(args: argparse.Namespace) -> int:
    """Validate everything (spec, data, output directories) before training; write the three builds."""
    import torch

    from archspec.io.datasets import load_data
    from archspec.train import TrainConfig, TrainingFailure, resolve_device
    from archspec.transfer.cmhsa import DEFAULT_PEAK, TransferError, attention_spec
    from archspec.transfer.two_phase import match_channels, two_phase

    _check_args(args)
    from archspec.ir.checked import load_spec

    spec = load_spec(args.spec)
    try:
        phase2_name = attention_spec(spec).name
    except TransferError as exc:
        raise SpecError.single(("stages",), str(exc), "give a phase-1 spec, e.g. specs/cmhsa_k3_conv.yaml",
                               args.spec) from None
    try:
        device = str(resolve_device(args.device))
    except ValueError as exc:
        raise SpecError.single(("--device",), str(exc)) from None
    out = Path(args.out or Path("build") / f"{phase2_name}-two-phase")
    names = ["phase1", "phase2"] + ([] if args.no_baseline else ["baseline"])
    check_group_out(out, ("phase1", "phase2", "baseline"))  # refuses what archspec did not write, before training
    data = load_data(args.data, spec.input.resolution[0], seed=args.seed, max_images=args.max_images)
    data = match_channels(data, spec.input.channels)
    common = {"batch_size": args.batch_size, "weight_decay": args.weight_decay, "augmentation": args.augmentation,
              "device": device, "eval_every": 50}
    phase1 = TrainConfig(steps=args.steps1, lr=args.lr1, warmup_steps=args.warmup1, **common)
    phase2 = TrainConfig(steps=args.steps2, lr=args.lr2, warmup_steps=args.warmup2, **common)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        result = two_phase(spec, data, phase1, phase2, peak=DEFAULT_PEAK if args.peak is None else args.peak,
                           seed=args.seed, baseline=not args.no_baseline, progress=not args.json)
    except (TransferError, TrainingFailure) as exc:
        raise SpecError.single((), str(exc), None, args.spec) from None
    _write(out, result, names)
    report = result.report
    print(json.dumps(report, indent=2) if args.json else _table(report, out))
    return 0


def _write(out: Path, result, names: list[str]) -> None:
    from archspec.io.artifact import save

    models = {"phase1": result.phase1, "phase2": result.phase2, "baseline": result.baseline}
    for name in names:
        model = models[name].cpu()
        report = {"two_phase": name, **({k: v for k, v in result.report.items()} if name == "phase2" else
                                        {k: result.report[k] for k in ("data", "seed", name)})}
        write_build(out / name, lambda d, m=model: save(m, d), report)


def _table(report: dict, out: Path) -> str:
    rows = [("phase 1 (conv)", report["phase1"]["steps"], report["phase1"]["accuracy"]),
            ("phase 2 at step 0 (transferred)", 0, report["transfer"]["accuracy_step0"]),
            ("phase 2 (attention)", report["phase2"]["steps"], report["phase2"]["accuracy"])]
    if report["baseline"] is not None:
        rows.append(("attention from random init", report["baseline"]["steps"], report["baseline"]["accuracy"]))
    lines = [f"data: {report['data']['name']} ({report['data']['train']} train / {report['data']['val']} val, "
             f"{report['data']['image_size']} px)   transfer peak {report['peak']}: max |logit difference| "
             f"{report['transfer']['max_logit_error']:.2e}", f"{'run':<34}{'steps':>7}{'val top-1':>11}"]
    lines += [f"{name:<34}{steps:>7}{acc:>11.4f}" for name, steps, acc in rows]
    lines.append(f"wrote {out}/{{phase1,phase2{',baseline' if report['baseline'] else ''}}}")
    return "\n".join(lines)


_TCNN_RANGES = {  # option: (lowest, highest, why); every value must also be finite
    "alpha": (1e-3, 1e4, "a locality strength alpha > 0 (softplus of a real number; paper: 1)"),
    "gating": (-1e4, 1e4, "a gating lambda (sigmoid(lambda) weighs positional attention; paper: 1)"),
}


def _check_tcnn_args(args: argparse.Namespace) -> None:
    """Every numeric option finite and in range, before anything is built or written."""
    for name, (low, high, what) in _TCNN_RANGES.items():
        value = getattr(args, name)
        if not math.isfinite(value) or not low <= value <= high:
            raise SpecError.single((f"--{name}",), f"must be {what}, between {low:g} and {high:g}; got {value}")
    if not 32 <= args.resolution <= 1024:
        raise SpecError.single(("--resolution",), f"must be between 32 and 1024 pixels, got {args.resolution}",
                               "GPSA's attention grows with the 4th power of the side; 224 is the paper's")
    if args.num_classes is not None and not 1 <= args.num_classes <= 1_000_000:
        raise SpecError.single(("--num-classes",), f"must be between 1 and 1,000,000, got {args.num_classes}")
    if args.checkpoint is not None and args.pretrained:
        raise SpecError.single(("--checkpoint",), "give --checkpoint or --pretrained, not both")


def _load_checkpoint(model, path: str) -> None:
    """timm's ``load_checkpoint`` (``weights_only`` torch.load, or safetensors) with every failure located.

    Raises:
        SpecError: on ``--checkpoint``, naming the file: missing, not a regular file (a directory, a FIFO,
            which would block), unreadable, not a checkpoint, not this model's, or non-finite weights.
    """
    import os
    import stat

    import timm
    import torch

    def refuse(message: str, hint: str | None = None) -> SpecError:
        return SpecError.single(("--checkpoint",), message, hint, path)

    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise refuse(f"cannot open it: {exc.strerror}") from None
    if stat.S_ISDIR(mode):
        raise refuse("is a directory, not a checkpoint file", "give the .safetensors or .pth file itself")
    if not stat.S_ISREG(mode):
        raise refuse("is not a regular file (a pipe or a device)", "give a .safetensors or .pth file")
    try:
        timm.models.load_checkpoint(model, path)
    except Exception as exc:  # noqa: BLE001 - safetensors, pickle, timm and torch all raise their own types
        detail = " ".join(line.strip() for line in str(exc).splitlines() if line.strip())[:300] or "no message"
        raise refuse(f"cannot load it into {type(model).__name__} ({type(exc).__name__}: {detail})",
                     "give a state dict of this timm model: a .safetensors file "
                     "or a torch.save'd dict of tensors") from None
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and not torch.isfinite(tensor).all():
            raise refuse(f"holds non-finite values (NaN or inf) in {name}")


def _base_cnn(args: argparse.Namespace, recipe: dict):
    """The CNN to transform: timm's model with the checkpoint or pretrained weights; errors located."""
    from archspec.transfer.cmhsa import TransferError
    from archspec.transfer.tcnn import tcnn_from_recipe

    try:
        base = tcnn_from_recipe({**recipe, "stages": []}, pretrained=args.pretrained)  # the CNN itself
    except TransferError as exc:
        raise SpecError.single(("MODEL",), str(exc), None, args.model) from None
    except Exception as exc:  # noqa: BLE001 - only --pretrained reaches the network (timm's hub)
        raise SpecError.single(("--pretrained",), f"cannot fetch timm's weights for {args.model}: "
                               f"{(str(exc).splitlines() or [type(exc).__name__])[0][:300]}",
                               "give the weights as --checkpoint FILE") from None
    if args.checkpoint:
        _load_checkpoint(base, args.checkpoint)
    return base


def cmd_tcnn(args: argparse.Namespace) -> int:
    """Write MODEL's T-CNN spec, compile it, load MODEL's weights (each transformed 3x3 conv into its GPSA's
    W_out), check exactness on a real photograph, count, and save it as an archspec build (nothing written on
    error)."""
    import timm

    from archspec.io.artifact import save
    from archspec.io.builddir import check_out, write_build
    from archspec.transfer.tcnn import tcnn_model, tcnn_spec

    if not timm.is_model(args.model):
        raise SpecError.single(("MODEL",), f"timm has no model {args.model!r}", "e.g. resnetrs50, resnet50d, resnet50")
    _check_tcnn_args(args)
    stages = [int(s) if s.lstrip("-").isdigit() else s for s in args.stages]
    recipe = {"base": args.model, "stages": stages, "alpha": args.alpha, "gating": args.gating,
              "stride_one": not args.no_stride_one, "num_classes": args.num_classes}
    out = Path(args.out or Path("build") / f"t-{args.model}")
    check_out(out)
    base = _base_cnn(args, recipe)
    options = {"stages": stages, "alpha": args.alpha, "gating": args.gating, "resolution": args.resolution,
               "name": "t_" + args.model.replace("/", "_")}
    try:
        spec = tcnn_spec(base, stride_one=recipe["stride_one"], **options)
        model = tcnn_model(base, spec)
        twin = tcnn_model(base, tcnn_spec(base, stride_one=False, **options))  # the stride kept: the CNN's map
    except TransferError as exc:
        if str(exc).startswith("no stage"):
            raise SpecError.single(("--stages",), str(exc), "give 1-4, layer1-layer4, or -1 for the last",
                                   args.model) from None
        raise SpecError.single(("MODEL",), str(exc), "T-CNN specs take timm ResNets with bottleneck blocks: "
                               "resnet50, resnet50d, resnetrs50, resnet26d, ...", args.model) from None
    report = _tcnn_report(base, model, twin, recipe, args.resolution)
    write_build(out, lambda directory: save(model, directory), report)
    print(json.dumps(report, indent=2) if args.json else _tcnn_table(report, out))
    return 0


def _tcnn_report(base, model, twin, recipe: dict, resolution: int) -> dict:
    """Counts and exactness of the T-CNN that is saved, on Grace Hopper's portrait at ``resolution``.

    Exactness is the construction's (T-CNN sec. 2): ``twin``, the T-CNN spec with the stride kept, holding the
    saved model's own weights, with alpha = lambda = 40, against the CNN -- every GPSA layer against its conv on
    the features it receives, and the logits.  ``init_max_logit_difference`` is the saved model itself (its
    alpha, lambda and stride) against the CNN: how far "the verge of locality" is from the convolution.
    ``analysis`` is the spec's static count (``archspec analyze``), equal to the measured ``tcnn`` figures.
    """
    import torch

    from archspec.io.images import load_image
    from archspec.transfer.tcnn import count_macs, transformed_layers

    twin.load_state_dict(model.state_dict())  # the saved weights; only strides differ (no tensors)
    for layer in transformed_layers(twin):
        layer.set_exact(40.0, 40.0)
    x = load_image(None, (resolution, resolution), 3)  # (1, 3, R, R)
    layer_errors = []  # each layer against its own conv: meaningful even where timm's init zeroes a branch
    hooks = [layer.register_forward_hook(
        lambda m, inp, out: layer_errors.append((out - m.conv_reference(inp[0])).abs().max().item()))
        for layer in transformed_layers(twin)]
    with torch.no_grad():
        ref = base.eval()(x)
        error = (twin.eval()(x) - ref).abs().max().item()
        init_error = (model.eval()(x) - ref).abs().max().item()
    for hook in hooks:
        hook.remove()
    graph = model.analysis.graph
    return {"tcnn": recipe, "spec": model.spec.name, "resolution": resolution,
            "gpsa_layers": len(transformed_layers(model)),
            "params": {"cnn": sum(p.numel() for p in base.parameters()),
                       "tcnn": sum(p.numel() for p in model.parameters())},
            "macs": {"cnn": count_macs(base, x), "tcnn": count_macs(model, x)},
            "analysis": {"params": graph["params"], "macs": graph["macs"]},
            "exactness_max_logit_error": error, "exactness_max_layer_error": max(layer_errors),
            "exactness_setting": "the saved weights with alpha = lambda = 40 and the stride kept, Grace Hopper's "
                                 "portrait",
            "init_max_logit_difference": init_error, "logit_scale": ref.abs().max().item()}


def _tcnn_table(report: dict, out: Path) -> str:
    params, macs, res = report["params"], report["macs"], report["resolution"]
    recipe = report["tcnn"]
    return (f"T-CNN of {recipe['base']}: {report['gpsa_layers']} GPSA layers in stages {recipe['stages']}\n"
            f"params {params['cnn']:,} -> {params['tcnn']:,}   MACs at {res} px "
            f"{macs['cnn'] / 1e9:.2f}G -> {macs['tcnn'] / 1e9:.2f}G\n"
            f"exactness of the saved weights (alpha = lambda = 40, stride kept): max |logit difference| "
            f"{report['exactness_max_logit_error']:.2e} (logits up to {report['logit_scale']:.2f}), "
            f"max |GPSA - its conv| per layer {report['exactness_max_layer_error']:.2e}\n"
            f"the saved model (alpha {recipe['alpha']:g}, lambda {recipe['gating']:g}) against the CNN: "
            f"max |logit difference| {report['init_max_logit_difference']:.2e}\n"
            f"wrote {out} (spec {report['spec']}; archspec.load reads it)")
