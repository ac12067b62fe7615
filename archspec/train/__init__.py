"""Training: the package's one loop, its batch sources, checkpoints, processes and the ``archspec train`` run.

Public names (each imported on first use, so ``import archspec.train`` and the command line's ``--help`` stay
free of torch)::

    from archspec.train import fit, recipe

    result = fit("levit_128s", data="path/to/imagefolder", config=recipe("deit", batch_size=256),
                 out="runs/levit")
    result.accuracy, result.run_dir                    # val top-1 (0..1), the run directory

Modules:

* :mod:`archspec.train.config` -- ``TrainConfig`` and the seed papers' ``RECIPES`` (torch-free);
* :mod:`archspec.train.loop` -- the one loop (``run_steps``, ``Trainer``) and the in-memory fast path ``train``;
* :mod:`archspec.train.batches` -- batch sources: in memory, or streamed through a ``DataLoader``;
* :mod:`archspec.train.streamed_data` -- streamed datasets (ImageFolder, Fashion-MNIST, CIFAR, digits) and timm
  transforms;
* :mod:`archspec.train.checkpoint` -- atomic checkpoints and bit-for-bit resume;
* :mod:`archspec.train.distributed` -- ``torchrun`` processes (DDP: gloo on CPU, NCCL on CUDA);
* :mod:`archspec.train.progress` -- progress bar / log lines, metrics CSV and JSON lines;
* :mod:`archspec.train.run` -- ``fit``: a whole run into a run directory (``archspec train``);
* :mod:`archspec.cli.train` -- the ``archspec train`` command line (torch-free).
"""

from __future__ import annotations

from archspec._util.lazy import lazy_exports

_EXPORTS = {
    "AUGMENTATIONS": "config", "AMP_MODES": "config", "RECIPES": "config", "TrainConfig": "config", "recipe": "config",
    "TrainResult": "loop", "Trainer": "loop", "TrainingFailure": "failures", "evaluate": "loop", "failure": "failures",
    "resolve_device": "loop", "run_steps": "loop", "train": "loop",
    "fit": "run", "FitResult": "run",
}

# A literal list (the API docs read it statically); tests keep it equal to _EXPORTS.
__all__ = [
    "AMP_MODES", "AUGMENTATIONS", "FitResult", "RECIPES", "TrainConfig", "TrainResult", "Trainer", "TrainingFailure",
    "evaluate", "failure", "fit", "recipe", "resolve_device", "run_steps", "train",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
