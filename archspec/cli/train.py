"""``archspec train``: the command-line client of :func:`archspec.train.run.fit` (torch-free until it runs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from archspec.errors import SpecError
from archspec.train.config import AMP_MODES, RECIPES, check_config, recipe
from archspec.train.stop import Terminated, sigterm_stops

__all__ = ["add_train_parser", "cmd_train"]

DESCRIPTION = """\
Train SPEC on --data with a recipe from the seed papers, writing checkpoints, metrics and the final model
(an archspec build directory: archspec.load("OUT/model")) into OUT (default runs/train/<spec name>/).

  archspec train levit_128s --data digits --epochs 2          a first run on the built-in digits
  archspec train levit_128s --data DIR --recipe deit           DeiT's recipe on an ImageFolder (DIR/train, DIR/val)
  archspec train levit_128s --data DIR --recipe levit --teacher regnety_160 --teacher-checkpoint W.pth
  torchrun --nproc_per_node 2 -m archspec train levit_128s --data DIR     data-parallel (gloo on CPU, NCCL on CUDA)
  archspec train levit_128s --data DIR --out runs/x --resume   continue a killed run bit-for-bit
  archspec train levit_128s --data DIR --out runs/x --restart  replace archspec's own earlier run there
  archspec train build/t --data DIR --recipe tcnn              fine-tune a build directory from its weights

Recipes (--recipe; any option below overrides its value):
""" + "\n".join(f"  {name:<7}{why}" for name, (_, why) in RECIPES.items())


def _positive(kind, name: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} expects a number, got {text!r}") from None
        if not (value > 0 and value != float("inf")):
            raise argparse.ArgumentTypeError(f"{name} must be a positive number, got {text}")
        return value
    return parse


def add_train_parser(sub) -> None:
    """The ``train`` sub-command."""
    p = sub.add_parser("train", help="train a spec with the seed papers' recipes (one CPU, GPUs, torchrun)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(handler=cmd_train)
    p.add_argument("spec", metavar="SPEC", help="YAML file, shipped spec name (see `archspec list`), or a build "
                   "directory to fine-tune (e.g. a T-CNN from `archspec tcnn`)")
    p.add_argument("--data", metavar="DATA", help="digits (default), fashion-mnist, a CIFAR or Fashion-MNIST "
                   "directory, or an ImageFolder (with train/ and val/, or split 80/20)")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="short", help="training recipe (default: short)")
    p.add_argument("--out", metavar="DIR", help="run directory (default: runs/train/<spec name>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--restart", action="store_true",
                   help="replace the run archspec wrote in --out (stopped before a checkpoint, failed, or finished) "
                        "and train from the start; anything archspec did not write is refused")
    p.add_argument("--seed", type=int, default=0, help="data order, augmentation and random draws (default 0)")
    p.add_argument("--max-images", type=_positive(int, "--max-images"), metavar="N",
                   help="use at most N images (stratified), for quick runs")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    p.add_argument("--threads", type=_positive(int, "--threads"), metavar="N", help="torch CPU threads")
    g = p.add_argument_group("length and optimisation (override the recipe)")
    g.add_argument("--epochs", type=_positive(float, "--epochs"), metavar="E")
    g.add_argument("--steps", type=_positive(int, "--steps"), metavar="N", help="optimizer steps instead of epochs")
    g.add_argument("--batch-size", type=_positive(int, "--batch-size"), default=32, metavar="B",
                   help="images per step over all processes (default 32)")
    g.add_argument("--lr", type=_positive(float, "--lr"), metavar="LR", help="peak learning rate")
    g.add_argument("--weight-decay", type=float, metavar="WD")
    g.add_argument("--opt", dest="optimizer", metavar="NAME", help="timm optimizer name (adamw, sgd, lamb, ...)")
    g.add_argument("--warmup-epochs", type=float, metavar="E")
    g.add_argument("--layer-decay", type=float, metavar="X", help="timm layer-wise lr decay")
    g.add_argument("--clip-grad", type=_positive(float, "--clip-grad"), metavar="NORM")
    g.add_argument("--amp", choices=AMP_MODES, help="auto: bf16 autocast on CUDA, none on CPU")
    g.add_argument("--torch-compile", "--compile", dest="torch_compile", action="store_true", default=None,
                   help="torch.compile the model (--compile is an alias)")
    g.add_argument("--ema-decay", type=float, metavar="D", help="timm ModelEmaV3 decay (e.g. 0.99996)")
    g.add_argument("--sync-bn", action="store_true", help="SyncBatchNorm across processes (CUDA)")
    a = p.add_argument_group("augmentation and regularisation (override the recipe)")
    a.add_argument("--smoothing", type=float, metavar="X", help="label smoothing")
    a.add_argument("--mixup", type=float, metavar="ALPHA")
    a.add_argument("--cutmix", type=float, metavar="ALPHA")
    a.add_argument("--aa", dest="auto_augment", metavar="POLICY", help="timm auto-augment, e.g. rand-m9-mstd0.5-inc1")
    a.add_argument("--reprob", type=float, metavar="P", help="random-erasing probability")
    d = p.add_argument_group("distillation (DeiT hard distillation through the distillation token)")
    d.add_argument("--teacher", metavar="MODEL|DIR", help="a timm model name or an archspec build directory")
    d.add_argument("--teacher-checkpoint", metavar="FILE", help="the timm teacher's weights (nothing is downloaded)")
    d.add_argument("--distill-alpha", type=float, metavar="A", help="weight of the distillation loss (0.5)")
    o = p.add_argument_group("output")
    o.add_argument("--workers", type=int, metavar="N", help="DataLoader worker processes (default 2)")
    o.add_argument("--eval-every", type=_positive(int, "--eval-every"), metavar="N",
                   help="evaluate every N steps (default: every epoch)")
    o.add_argument("--log-every", type=_positive(int, "--log-every"), metavar="N", help="a progress line every N steps")
    o.add_argument("--checkpoint-every", type=_positive(int, "--checkpoint-every"), metavar="N",
                   help="checkpoint every N steps (default: at every evaluation)")
    o.add_argument("--tensorboard", action="store_true", help="also write TensorBoard scalars (needs tensorboard)")
    o.add_argument("--quiet", action="store_true", help="no progress output")
    o.add_argument("--json", action="store_true", help="print the summary as JSON")


_OVERRIDES = ("epochs", "lr", "weight_decay", "optimizer", "warmup_epochs", "layer_decay", "clip_grad", "amp",
              "torch_compile", "ema_decay", "smoothing", "mixup", "cutmix", "auto_augment", "reprob", "distill_alpha",
              "workers", "log_every", "checkpoint_every", "device")


def config_from_args(args: argparse.Namespace):
    """The :class:`~archspec.train.config.TrainConfig` of the recipe with the given options."""
    from dataclasses import replace


    overrides = {name: getattr(args, name) for name in _OVERRIDES}
    config = recipe(args.recipe, args.batch_size, **overrides)
    check_config(config)  # before the warm-up share below is computed from it
    if args.steps is not None:  # the recipe's warm-up share of the run (short: 1 of 10 epochs; deit: 5 of 300)
        share = (config.warmup_epochs / config.epochs if config.epochs and config.warmup_epochs is not None
                 else config.warmup_steps / config.steps)
        config = replace(config, steps=args.steps, epochs=None, warmup_epochs=None,
                         warmup_steps=min(round(share * args.steps), args.steps - 1),
                         eval_every=args.eval_every or min(config.eval_every, args.steps))
    elif args.eval_every is not None:
        config = replace(config, eval_every=args.eval_every)
    return config


def cmd_train(args: argparse.Namespace) -> int:
    """Run :func:`~archspec.train.run.fit` from the command line; returns the exit status (1: training failed,
    143: stopped by SIGTERM after shutting its DataLoader workers down).

    A build directory as SPEC is passed to ``fit`` as the directory, so training starts from its weights.

    Raises:
        SpecError: what :func:`~archspec.train.run.fit` raises; ``--recipe levit`` without ``--teacher``
            (exit 2 in :func:`archspec.cli.main`).
    """
    from archspec.io.builddir import is_build
    from archspec.io.data_sources import check_data_dir

    config = config_from_args(args)
    check_data_dir(args.data)  # a bad --data is refused here, before the spec parser and torch are imported
    if args.recipe == "levit" and args.teacher is None:
        raise SpecError.single(("--recipe",), "levit trains with hard distillation and needs --teacher",
                               "give --teacher MODEL|DIR (and --teacher-checkpoint for a timm model), or "
                               "--recipe deit for the same recipe without distillation")
    from archspec.ir.checked import load_spec

    build = Path(args.spec).is_dir() and is_build(args.spec)  # as archspec.train.run.is_build_dir
    spec = load_spec(Path(args.spec) / "spec.yaml" if build else args.spec)
    out = Path(args.out) if args.out else Path("runs") / "train" / spec.name
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    from archspec.train.loop import TrainingFailure
    from archspec.train.run import fit

    try:
        with sigterm_stops():
            result = fit(args.spec if build else spec, args.data, config, out=out, resume=args.resume,
                         restart=args.restart, seed=args.seed, teacher=args.teacher,
                         teacher_checkpoint=args.teacher_checkpoint, max_images=args.max_images,
                         progress=not args.quiet and not args.json, tensorboard=args.tensorboard,
                         sync_bn=args.sync_bn)
    except TrainingFailure as exc:
        print(f"archspec train: training failed: {exc.reason}", file=sys.stderr)
        return 1
    except Terminated:
        print(f"archspec train: stopped by SIGTERM; continue with --resume --out {out}", file=sys.stderr)
        return 143
    summary = {"accuracy": result.accuracy, "val_loss": result.val_loss, "ema_accuracy": result.ema_accuracy,
               "steps": result.steps, "seconds": round(result.seconds, 2),
               "images_per_second": round(result.images_per_second, 2), "run_dir": str(out),
               "model": str(out / "model")}
    if _is_main():
        print(json.dumps(summary, indent=2) if args.json else
              f"val top-1 {result.accuracy:.4f} after {result.steps} steps ({result.images_per_second:.1f} img/s); "
              f"model: {out / 'model'} (archspec.load)")
    return 0


def _is_main() -> bool:
    import os

    return os.environ.get("RANK", "0") == "0"
