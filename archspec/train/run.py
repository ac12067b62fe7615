"""A whole training run into a run directory: :func:`fit`, what ``archspec train`` calls.

The run directory (``out``; ``--out`` on the command line, default ``runs/train/<spec name>/``) holds::

    run.json         marker (archspec version), the spec name, the resolved settings and the data
    spec.yaml        the trained spec (its classifier sized to the data)
    checkpoint.pt    the latest checkpoint (archspec.train.checkpoint), replaced atomically
    metrics.csv      one row per evaluation (step, epoch, train loss, lr, val top-1, val loss, EMA top-1)
    metrics.jsonl    the same, one JSON object per line
    model/           the final model: an archspec build directory (``archspec.load("OUT/model")``)
    model_ema/       the EMA weights, when ``ema_decay`` is set
    summary.json     accuracy, steps, seconds, images/s

``out`` must be missing, an empty directory, or a run directory archspec wrote: with ``resume`` it
continues (a run with a checkpoint that has not finished), with ``restart`` it is replaced (an unfinished run,
e.g. one stopped before its first checkpoint, or a finished one); anything else is refused before any work and
left untouched.  One run at a time writes a run directory (an ``flock`` on it; a second is refused).

Every random draw of step ``k`` on rank ``r``
(dropout, drop-path, Mixup/CutMix) comes from generators reseeded with ``(seed, r, k)`` before the step, and
each sample's augmentation from ``(seed, epoch, index)``, so ``resume`` after ``kill -9`` continues
bit-for-bit from the last checkpoint (same threads, same device).
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.optim import list_optimizers
from torch.utils.data import DataLoader

from archspec._util.imports import try_import
from archspec._version import __version__
from archspec.errors import SpecError
from archspec.io.artifact import load, save
from archspec.io.atomic import atomic_write_text
from archspec.io.builddir import BUILD, is_build, only_build_files, uncreatable, writable_dir, write_build
from archspec.ir.checked import load_spec
from archspec.nn.compiler import compile as compile_spec
from archspec.spec import ArchSpec
from archspec.spec.yaml_source import is_yaml_text
from archspec.train.batches import StreamBatches, quiet_worker
from archspec.train.checkpoint import CHECKPOINT, load_checkpoint, save_checkpoint
from archspec.train.config import TrainConfig, check_config, recipe
from archspec.train.distributed import init_processes, shutdown
from archspec.train.loop import Hooks, Trainer, evaluate, resolve_device, run_steps
from archspec.train.param_groups import gating_param_groups, transformed_layers
from archspec.train.progress import Progress
from archspec.train.stop import check_together, deferred
from archspec.train.streamed_data import (
    DamagedImages,
    DeviceTransform,
    check_auto_augment,
    damaged_message,
    make_transforms,
    open_stream_data,
)
from archspec.train.teacher import load_teacher

with try_import() as _fcntl:  # POSIX only: no lock where it does not exist
    import fcntl

__all__ = ["FitResult", "fit", "RUN_MARKER", "prepare_run_dir", "check_optimizer"]

RUN_MARKER = "run.json"
_RUN_FILES = {RUN_MARKER, "spec.yaml", "checkpoint.pt", "metrics.csv", "metrics.jsonl", "summary.json", "model",
              "model_ema", "tensorboard"}


@dataclass
class FitResult:
    """What :func:`fit` returns: final val top-1 (0..1) and loss, the EMA's top-1 (``None`` without EMA), steps,
    seconds of this process's training, training images/s (all processes), the run directory and the model."""

    accuracy: float
    val_loss: float
    ema_accuracy: float | None
    steps: int
    seconds: float
    images_per_second: float
    run_dir: Path | None
    history: list = field(default_factory=list)
    model: Any = field(default=None, repr=False)


def _is_run_entry(name: str) -> bool:
    """A name a run writes into its directory: a run file, or a leftover of an interrupted atomic write
    (``.checkpoint.pt.*``, ``.run.json.*.tmp``, the staging ``.model.archspec-tmp-*`` of a build)."""
    if name in _RUN_FILES:
        return True
    return any(name.startswith(f".{run_file}.") for run_file in _RUN_FILES)


def _is_run_dir(path: Path) -> bool:
    try:
        marker = json.loads((path / RUN_MARKER).read_text())
        names = os.listdir(path)
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and "archspec_train" in marker and all(_is_run_entry(n) for n in names)


def _out_error(out: Path, message: str, hint: str | None = None, option: str = "out") -> SpecError:
    return SpecError.single((option,), message, hint, str(out))


def prepare_run_dir(out: Path, resume: bool, restart: bool = False) -> str:
    """Check ``out`` before any work (see the module docstring); writes nothing.

    Returns ``"new"`` (missing or empty), ``"resume"`` (a run to continue) or ``"replace"`` (``restart``: an
    archspec run to remove before the new one starts).

    Raises:
        SpecError: at ``out``: not a directory, a directory archspec did not write, not writable (or its
            parent, for a new one), an earlier run without ``resume`` or ``restart``; at ``resume``: no run,
            a run without a checkpoint or a finished run; at ``restart``: given with ``resume``.
    """
    if resume and restart:
        raise SpecError.single(("restart",), "cannot be combined with `resume`",
                               "`resume` continues the run in `out`; `restart` replaces it")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise _out_error(out, "exists and is not a directory; archspec leaves it untouched")
    blocked = uncreatable(out)
    if blocked is not None:
        raise _out_error(out, f"cannot be created: {blocked}", "give another `out`")
    try:
        entries = os.listdir(out) if out.exists() else []
    except OSError as exc:
        raise _out_error(out, f"cannot list it: {exc.strerror or exc}") from None
    ours = bool(entries) and _is_run_dir(out)
    if entries and not ours:
        raise _out_error(out, "is a directory archspec did not write; it is left untouched",
                         "give a missing or empty directory" + (" (`resume` continues only a run archspec wrote)"
                                                                if resume else ""))
    if out.is_dir() and not writable_dir(out):  # found before the data are read, not as a PermissionError mid-run
        raise _out_error(out, "is not writable (permissions, a read-only or immutable directory); nothing was "
                              "written", "give a writable `out`")
    finished = ours and (out / "summary.json").exists()
    checkpointed = ours and (out / "checkpoint.pt").is_file()
    if resume:
        if not ours:
            raise _out_error(out, "no archspec training run with a checkpoint here",
                             "`resume` continues a run `archspec train` wrote into this `out`", "resume")
        if finished:
            raise _out_error(out, f"the run here has finished (its model is {out / 'model'}); there is "
                                  "nothing to resume", "add `restart` instead to train it again from the start, or "
                                                       "give another `out`", "resume")
        if not checkpointed:
            raise _out_error(out, "the run here stopped before its first checkpoint; there is nothing to resume",
                             "add `restart` instead of `resume` to start it over", "resume")
        return "resume"
    if not ours:
        return "new"
    if restart:
        return "replace"
    if finished:
        hint = "add `restart` to replace it (its model is removed), or give another `out`"
    elif checkpointed:
        hint = "add `resume` to continue it from its checkpoint, `restart` to start it over, or give another `out`"
    else:
        hint = "it stopped before its first checkpoint: add `restart` to start it over, or give another `out`"
    raise _out_error(out, "holds an earlier training run", hint)


def _clear_run(out: Path) -> None:
    """Remove what the archspec run in ``out`` wrote (``restart``), after checking every entry first.

    Raises:
        SpecError: at ``out``: an entry is not what a run writes (then nothing is removed).
    """


    removals = []
    for name in sorted(os.listdir(out)):
        path = out / name
        if not _is_run_entry(name):  # prepare_run_dir checked this; checked again right before removing anything
            raise _out_error(out, f"`restart`: {path} is not what archspec train writes; nothing was removed",
                             "move it away yourself, or give another `out`")
        if path.is_symlink() or path.is_file():
            removals.append(path.unlink)
        elif name == "tensorboard" and all(f.is_file() and f.name.startswith("events.out.tfevents")
                                           for f in path.iterdir()):
            removals.append(lambda p=path: shutil.rmtree(p))
        elif path.is_dir() and only_build_files(path, BUILD):  # model/, model_ema/ or a build's staging dir
            removals.append(lambda p=path: shutil.rmtree(p))
        else:
            raise _out_error(out, f"`restart`: {path} is not what archspec train writes; nothing was removed",
                             "move it away yourself, or give another `out`")
    for remove in removals:
        remove()


class _RunLock:
    """An exclusive ``flock`` on the run directory for one run (``None`` fd where ``fcntl`` is missing)."""

    def __init__(self, out: Path):
        if not _fcntl.is_successful():  # pragma: no cover - not POSIX
            self.fd = None
            return
        self.fd = os.open(out, os.O_RDONLY)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self.fd)
            self.fd = None
            raise _out_error(out, "another `archspec train` is writing this run directory right now",
                             "wait for it to end, or give another `out`") from None
        # A forked child (a DataLoader worker) shares the lock's open file description: closing its copy keeps
        # the lock with this process alone, so a run killed with -9 does not leave an orphaned worker holding it.
        os.register_at_fork(after_in_child=self._close_in_child)

    def _close_in_child(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _claim(out: Path, resume: bool, restart: bool) -> _RunLock:
    """Create ``out`` if needed, lock it, check it again under the lock and clear it for ``restart``.

    Raises:
        SpecError: at ``out``: it cannot be created (permissions, a read-only or immutable directory), another
            run holds it, or it changed since :func:`prepare_run_dir` looked.
    """
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _out_error(out, f"cannot create the run directory: {exc.strerror or exc}",
                         "give a writable `out`") from None
    lock = _RunLock(out)
    try:
        if prepare_run_dir(out, resume, restart) == "replace":
            _clear_run(out)
    except BaseException:
        lock.release()
        raise
    return lock


def _reseed(seed: int, rank: int, step: int) -> None:
    """torch, numpy and Python RNGs from ``(seed, rank, step)``: a step's random draws do not depend on history."""
    s = int(np.random.SeedSequence([seed, rank, step]).generate_state(1, np.uint32)[0])
    torch.manual_seed(s)
    np.random.seed(s)
    random.seed(s)


def check_optimizer(name: str) -> None:
    """Raise SpecError at ``config.optimizer`` unless timm's optimizer factory knows ``name`` (``lookahead_adamw``
    is timm's ``adamw`` behind Lookahead)."""
    if name.lower().split("_")[-1] not in list_optimizers():
        raise SpecError.single(("config", "optimizer"), f"{name!r} is not a timm optimizer",
                               "e.g. adamw, sgd, lamb, lion; timm.optim.list_optimizers() names them all")


def _check(config: TrainConfig, seed: int) -> None:
    """Every setting, the optimizer name and auto-augment policy as timm reads them, and the seed.

    Raises:
        SpecError: at the field (``config.optimizer``, ``config.auto_augment``, ``config.warmup_epochs``, ...) or
            ``seed``.
    """


    check_config(config)
    check_optimizer(config.optimizer)
    if config.auto_augment is not None:
        check_auto_augment(config.auto_augment)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise SpecError.single(("seed",), f"must be an integer in [0, 2^31), got {seed}")


def is_build_dir(source: Any) -> bool:
    """Whether ``source`` names an archspec build directory (its weights are the starting point); YAML text never
    does (a long one is no file name: asking the file system would raise)."""

    if isinstance(source, str) and is_yaml_text(source):
        return False
    return isinstance(source, (str, os.PathLike)) and Path(source).is_dir() and is_build(source)


def _load(spec: Any, num_classes: int):
    """The spec with its classifier sized to the data's classes (a build directory's spec for a build)."""

    spec = load_spec(Path(spec) / "spec.yaml") if is_build_dir(spec) else load_spec(spec)
    if spec.head.num_classes == num_classes:
        return spec
    doc = spec.model_dump(mode="json")
    doc["head"]["num_classes"] = num_classes
    return ArchSpec.model_validate(doc)


def _initial_model(source: Any, spec):
    """A fresh model of ``spec`` (its seed's initialisation), or a build directory's weights with the classifier
    reset when the data has other classes (fine-tuning; T-CNN after ``archspec tcnn``)."""

    if not is_build_dir(source):
        return compile_spec(spec)

    model = load(source)
    if model.spec.head.num_classes != spec.head.num_classes:
        model.reset_classifier(spec.head.num_classes)
    return model


def _param_groups(model, config: TrainConfig) -> list[dict] | None:
    """T-CNN's groups (sec. 3: gating at lr 0.1, no weight decay) when the model has transformed layers."""
    if not transformed_layers(model):
        return None
    return gating_param_groups(model, config.lr, weight_decay=config.weight_decay)


def fit(spec: Any, data: str | os.PathLike | None = None, config: TrainConfig | None = None, *,
        out: str | os.PathLike | None = None, resume: bool = False, restart: bool = False, seed: int = 0,
        teacher: str | None = None,
        teacher_checkpoint: str | os.PathLike | None = None, max_images: int | None = None, progress: bool = True,
        bar: bool | None = None, tensorboard: bool = False, sync_bn: bool = False) -> FitResult:
    """Train ``spec`` on ``data`` with ``config`` (default: the ``short`` recipe) into the run directory ``out``.

    Args:
        spec: a spec file, shipped name, dict or ``ArchSpec`` (fresh weights from its seed), or an archspec
            build directory (its weights: fine-tuning, e.g. a T-CNN from ``archspec tcnn``, whose gating then
            trains at lr 0.1 without weight decay as T-CNN sec. 3); the classifier is sized to the data.
        data: what ``open_stream_data`` takes (:func:`archspec.train.streamed_data.open_stream_data`); ``None``: digits.
        out: the run directory (``None``: nothing written, no checkpoints).
        resume: continue the run in ``out`` from its checkpoint (the same spec; a finished run is refused).
        restart: replace the run archspec wrote in ``out`` (unfinished or finished) with a new one; it is removed
            only once every input has been checked.
        seed: data order, augmentation and every random draw of training (the weights come from the spec's seed).
        teacher: DeiT hard distillation's teacher (:func:`archspec.train.teacher.load_teacher`): a timm model
            name or an archspec build directory.
        teacher_checkpoint: the timm teacher's weights file (nothing is downloaded).
        progress: show progress (:class:`archspec.train.progress.Progress`; metrics files are always written).
        bar: a progress bar instead of log lines (default: when stdout is a terminal).
        tensorboard: also write TensorBoard scalars (needs ``tensorboard``).
        sync_bn: ``torch.nn.SyncBatchNorm`` across processes (CUDA only).

    Run under ``torchrun --nproc_per_node N`` it trains data-parallel (:mod:`archspec.train.distributed`).

    Raises:
        SpecError: bad input (spec, ``data``, ``config``, ``seed``, ``out``, teacher, a damaged build directory);
            with ``resume``: another spec than the run's, a damaged or mismatched ``checkpoint.pt``; another
            run writing ``out``.  Nothing is written then (and an earlier run in ``out`` is left as it was).
            At ``data`` also during the run: 20 damaged images in a row (the run directory is left as an
            unfinished run, which ``resume`` continues from its last checkpoint or ``restart`` replaces).
        TrainingFailure: training diverged (NaN/inf loss) or the model failed at run time.
    """

    config = config or recipe("short")
    _check(config, seed)
    try:
        device = resolve_device(config.device)
    except ValueError as exc:
        raise SpecError.single(("config", "device"), str(exc)) from None
    out = Path(out) if out is not None else None
    if out is not None:
        prepare_run_dir(out, resume, restart)

    stream = open_stream_data(data, seed=seed, max_images=max_images)
    source, spec = spec, _load(spec, stream.num_classes)

    processes = init_processes(device)
    locks: list[_RunLock] = []
    try:
        return _fit(source, spec, stream, config, processes, out, (resume, restart, locks), seed, teacher,
                    teacher_checkpoint, progress, bar, tensorboard, sync_bn)
    except DamagedImages as exc:
        raise _damaged_data(exc, data, out) from None
    finally:
        for lock in locks:
            lock.release()
        shutdown(processes)


def _damaged_data(exc: BaseException, data: Any, out: Path | None) -> SpecError:
    """The SpecError at ``data`` for :class:`~archspec.train.streamed_data.DamagedImages`, saying what to do with
    the run directory: it is an archspec run (``restart`` replaces it), resumable once it holds a checkpoint."""

    hint = "remove or repair the damaged files"
    if out is not None and (out / "checkpoint.pt").is_file():
        hint += f", then continue with `resume` `out` {out} (or start over with `restart`)"
    elif out is not None and (out / RUN_MARKER).is_file():
        hint += f", then start over with `restart` `out` {out}"
    return SpecError.single(("data",), f"{damaged_message(exc)}; the run stopped", hint, str(data))


def _check_resumed_spec(out: Path, spec) -> None:
    """Refuse to continue the run in ``out`` with another spec than the one it trained (its ``spec.yaml``)."""

    earlier = load_spec(out / "spec.yaml")
    if earlier.model_dump(mode="json") != spec.model_dump(mode="json"):
        raise SpecError.single(("resume",), f"the run here trained the spec {earlier.name!r}; SPEC "
                                              f"({spec.name!r}) differs from it",
                               f"resume with the run's own spec: archspec train {out / 'spec.yaml'} ... --resume",
                               str(out / "spec.yaml"))


def _fit(source, spec, stream, config, processes, out, run_mode, seed, teacher, teacher_checkpoint, progress, bar,
         tensorboard, sync_bn) -> FitResult:
    device = processes.device
    train_tf, val_tf = make_transforms(spec.input.channels, tuple(spec.input.resolution), config)
    try:
        batches = StreamBatches(stream.train, train_tf, config.batch_size, seed, device, config.workers,
                                processes.rank, processes.world,
                                on_device=DeviceTransform(spec.input.channels, device, config.reprob))
    except ValueError as exc:
        raise SpecError.single(("config", "batch_size"), str(exc)) from None
    per_epoch = batches.batches_per_epoch()
    if config.epochs is not None:
        config = replace(config.resolved(per_epoch), eval_every=per_epoch)
    model = _initial_model(source, spec)
    teacher_model = _teacher(model, teacher, teacher_checkpoint, stream.num_classes)
    if sync_bn:
        model = _sync_bn(model, device)
    trainer = Trainer(model, config, device, param_groups=_param_groups(model, config),
                      num_classes=stream.num_classes, teacher=teacher_model, wrap=processes.wrap)
    start = 0
    resume, restart, locks = run_mode
    if out is not None and processes.main:  # every input is checked: now the run directory is ours
        locks.append(_claim(out, resume, restart))
    if resume:
        _check_resumed_spec(out, spec)
        start = load_checkpoint(out / CHECKPOINT, trainer, batches)["step"]
    elif out is not None and processes.main:
        _write_start(out, spec, config, stream, seed, teacher, processes.world)
    processes.barrier()
    return _run(trainer, batches, stream, val_tf, config, processes, out, start, seed, progress, bar, tensorboard,
                per_epoch)


def _run(trainer, batches, stream, val_tf, config, processes, out, start, seed, progress, bar, tensorboard,
         per_epoch) -> FitResult:
    main = processes.main
    shown = Progress(config.steps, start, config.batch_size, steps_per_epoch=per_epoch, log_every=config.log_every,
                     run_dir=out if main else None, enabled=progress and main, bar=bar,
                     tensorboard=tensorboard)
    evaluate_fn = _evaluator(trainer, stream.val, val_tf, config, processes,
                             DeviceTransform(trainer.module.spec.input.channels, processes.device))

    def checkpoint(step: int) -> None:
        if out is not None and main:
            save_checkpoint(out / CHECKPOINT, step, trainer, batches)

    def on_step(step: int, loss: torch.Tensor) -> None:
        shown.on_step(step, loss, trainer.lr())
        if config.checkpoint_every is not None and step % config.checkpoint_every == 0:
            checkpoint(step)

    def on_eval(step: int, record: dict) -> None:
        shown.on_eval({"epoch": round(step / per_epoch, 3), **record})
        if config.checkpoint_every is None:
            checkpoint(step)

    def before_step(step: int) -> None:
        check_together()  # a SIGTERM since the last step, in any process, stops them all here (archspec.train.stop)
        _reseed(seed, processes.rank, step)

    hooks = Hooks(before_step=before_step, on_step=on_step, on_eval=on_eval)
    t0 = time.perf_counter()
    try:
        with deferred(together=processes.any if processes.world > 1 else None):
            result = run_steps(trainer, iter(batches), evaluate_fn, start=start, hooks=hooks)
        if start >= config.steps:  # resumed after the last step (killed while writing the model): evaluate it
            record = evaluate_fn()
            result = replace(result, accuracy=record["accuracy"], val_loss=record["val_loss"],
                             ema_accuracy=record.get("ema_accuracy"))
    finally:
        shown.close()
        batches.close()  # the run's one loader iterator: its workers end here, not in a __del__
    seconds = time.perf_counter() - t0
    rate = (config.steps - start) * config.batch_size / seconds if seconds > 0 else math.nan
    fitted = FitResult(result.accuracy, result.val_loss, result.ema_accuracy, config.steps, seconds, rate, out,
                       result.history, trainer.module)
    if out is not None and main:
        _write_end(out, trainer, fitted)
    processes.barrier()
    return fitted


def _evaluator(trainer, val_set, val_tf, config, processes, on_device):
    shard = _Transformed(val_set, val_tf, range(processes.rank, len(val_set), processes.world))
    # timm's train.py evaluates at the training batch size (--validation-batch-size unset): with a small
    # validation set a double batch leaves one loader worker decoding it all while the others wait
    loader = DataLoader(shard, batch_size=max(config.batch_size // processes.world, 1),
                        num_workers=config.workers, pin_memory=processes.device.type == "cuda",
                        worker_init_fn=quiet_worker if config.workers else None)

    def batches():
        for x, y in loader:
            yield on_device(x.to(processes.device, non_blocking=True)), y

    def evaluate_fn() -> dict:
        accuracy, val_loss = evaluate(trainer.module, batches(), device=processes.device, amp=config.amp,
                                      reduce=processes.sum)
        record = {"accuracy": accuracy, "val_loss": val_loss}
        if trainer.ema is not None:
            record["ema_accuracy"], _ = evaluate(trainer.ema.module, batches(), device=processes.device,
                                                 amp=config.amp, reduce=processes.sum)
        return record

    return evaluate_fn


class _Transformed(torch.utils.data.Dataset):
    """``dataset[indices[i]]`` through ``transform`` (the validation shard of one rank)."""

    def __init__(self, dataset: Any, transform: Any, indices: range):
        self.dataset, self.transform, self.indices = dataset, transform, indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        image, label = self.dataset[self.indices[i]]
        return self.transform(image), int(label)


def _teacher(model, teacher, teacher_checkpoint, num_classes):
    if teacher is None:
        if teacher_checkpoint is not None:
            raise SpecError.single(("teacher_checkpoint",), "given without `teacher`")
        return None
    if not getattr(model, "distilled", False):
        raise SpecError.single(("teacher",), "the spec has no distillation head",
                               "DeiT/LeViT distillation needs `tokens: {dist_token: true}` and "
                               "`head: {distillation: true}` in the spec (e.g. levit_128s)")

    loaded = load_teacher(teacher, teacher_checkpoint, num_classes)
    model.set_distilled_training(True)
    return loaded


def _sync_bn(model, device):
    if device.type != "cuda":
        raise SpecError.single(("sync_bn",), "SyncBatchNorm runs on CUDA only", "drop `sync_bn` on CPU")
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)


def _write_start(out: Path, spec, config: TrainConfig, stream, seed: int, teacher: str | None, world: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    marker = {"archspec_train": __version__, "spec": spec.name, "config": config.describe(),
              "data": stream.describe(), "seed": seed, "teacher": teacher, "processes": world}
    atomic_write_text(out / RUN_MARKER, json.dumps(marker, indent=2) + "\n")  # first: the directory is a run
    atomic_write_text(out / "spec.yaml", spec.to_yaml())


def _write_end(out: Path, trainer, fitted: FitResult) -> None:
    report = {"trained": {"accuracy": fitted.accuracy, "val_loss": fitted.val_loss, "steps": fitted.steps}}
    module = trainer.module
    was = getattr(module, "distilled_training", False)
    if was:
        module.set_distilled_training(False)
    write_build(out / "model", lambda d: save(module.cpu(), d), report)
    if trainer.ema is not None:
        write_build(out / "model_ema", lambda d: save(trainer.ema.module.cpu(), d),
                    {"trained": {"ema_accuracy": fitted.ema_accuracy, "steps": fitted.steps}})
    summary = {"accuracy": fitted.accuracy, "val_loss": fitted.val_loss, "ema_accuracy": fitted.ema_accuracy,
               "steps": fitted.steps, "seconds": round(fitted.seconds, 2),
               "images_per_second": round(fitted.images_per_second, 2)}
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
