"""One row of a tabulated space (torch): train a point once under a table protocol and write down what a search
could ask of it.

The torch half of :mod:`archspec.search._tabulation.tabulate` (``archspec table``), moved here from
``bench/space_table.py``
unchanged in what it computes, so that rows of the shipped ``levit_small`` table and new rows are the same
measurement:

* data: the protocol's data set at its own size, a fixed class-stratified training subset (seed 0), a fixed
  class-stratified subset of the validation images for the intermediate curve points, all of them for the last;
* training: archspec's one loop (:class:`archspec.train.loop.Trainer`, :func:`~archspec.train.loop.run_steps`)
  with the protocol's optimizer, schedule, batch and augmentation; the seed sets the initial weights, the batch
  order and the augmentation;
* curve: val top-1 and val loss at the protocol's curve steps, the cumulative training loss (TSE, Ru et al. 2021)
  and the training seconds to each step;
* zero-cost: SynFlow, NASWOT and grad-norm of the untrained model on one batch
  (:func:`archspec.search._evaluation.proxy.score_proxy`);
* ALS (protocols with ``als``): MaiT eq. 3 per layer and head at every curve step, on the first ``als.images``
  curve-validation images with the protocol's window (:func:`archspec.search._evaluation.mask_scores.layer_scores`, what
  ``archspec search masks --strategy als`` reads of a trained model);
* soft-mask alphas (models with MaiT's soft mask, sec. 4.3): each head's learned ``alpha`` at every curve step
  (:func:`archspec.search._evaluation.mask_scores.learned_alphas`, what ``--strategy soft`` reads), so that a mask
  table's soft-mask rows (``<table>.soft.jsonl``) let the strategy run on the table.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from archspec.errors import SpecError
from archspec.families.attention.heads import MaskSpec
from archspec.io.datasets import Dataset, load_data
from archspec.nn.compiler import compile as compile_spec
from archspec.search._evaluation.mask_scores import layer_scores, learned_alphas
from archspec.search._evaluation.proxy import ProxyProtocol, proxy_spec, score_proxy
from archspec.search._evaluation.zero_cost import ZERO_COST_SCORES
from archspec.spec import ArchSpec
from archspec.train.batches import TensorBatches
from archspec.train.config import TrainConfig, check_config
from archspec.train.loop import Hooks, Trainer, evaluate, run_steps
from archspec.train.run import check_optimizer

__all__ = ["stratified", "reference_data", "proxy_size_problem", "train_config", "check_training", "train_row",
           "zero_cost_row"]


def stratified(labels: np.ndarray, keep: int, seed: int) -> np.ndarray:
    """Sorted indices of a class-stratified subset of ``keep`` samples of ``labels`` ``(N,)``: ``keep // classes``
    of each class, drawn by a seeded permutation.  Raises nothing."""
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    per = keep // len(classes)
    out = [rng.permutation(np.flatnonzero(labels == c))[:per] for c in classes]
    return np.sort(np.concatenate(out))


def _check_subset(labels: np.ndarray, keep: int, field: str, split: str, data: str) -> None:
    """Refuse a class-stratified subset of ``keep`` of ``labels`` ``(N,)`` that is not ``keep`` images (what
    :func:`stratified` would take silently): fewer than one of each class, not a multiple of the classes, more of
    a class than its smallest holds.

    Raises:
        SpecError: at ``protocol.<field>``, naming the data set ``data`` and its ``split``.
    """
    counts = np.unique(labels, return_counts=True)[1]
    n, per = len(counts), keep // max(len(counts), 1)
    if keep < n:
        raise SpecError.single(("protocol", field), f"{keep} images cannot hold one of each of the {n} classes",
                               f"at least {n}: a class-stratified subset takes {field} / {n} of each class")
    if keep % n:
        raise SpecError.single(("protocol", field), f"{keep} is not a multiple of the {n} classes: a class-stratified "
                               f"subset takes {per} of each, {per * n} images", f"e.g. {per * n}")
    if per > counts.min():
        raise SpecError.single(("protocol", field), f"{keep} images of {n} classes is {per} of each; the {split} "
                               f"images of {data} hold {counts.min()} of their smallest class",
                               f"at most {counts.min() * n}")


def proxy_size_problem(points: Iterable[tuple[dict, ArchSpec]], data: Dataset, protocol: dict) -> str | None:
    """Why the protocol's ``image_size`` cannot train the ``(params, spec)`` points (``None`` when it can):
    :func:`train_row` feeds images of that size to :func:`~archspec.search._evaluation.proxy.proxy_spec`, whose
    input keeps each stage's token grid and may be another size (an 8 px spec with ``image_size`` 16 failed every
    pair on the shape).  Raises nothing of its own."""
    geometry = ProxyProtocol(image_size=protocol["image_size"])
    for params, spec in points:
        side = proxy_spec(spec, data, geometry).input.resolution
        if tuple(side) != (protocol["image_size"],) * 2:
            return (f"the proxy of {protocol['space']} trains at {side[0]} px, not the protocol's "
                    f"{protocol['image_size']} (point {params}: the proxy keeps every stage's token grid)")
    return None


def reference_data(protocol: dict) -> tuple[Dataset, Dataset]:
    """``(curve, final)`` views of the protocol's data: the same training subset, validated on the curve subset
    and on the first ``final_val_images`` validation images.

    Raises:
        SpecError: the data set is not installed (:func:`archspec.io.datasets.load_data`); at
            ``protocol.<field>``: a subset the data cannot give (``train_images`` / ``curve_val_images`` that a
            class-stratified draw would cut short, ``final_val_images`` past the validation images).
    """
    full = load_data(protocol["data"], image_size=protocol["image_size"], seed=0)
    x, y = full.train.tensors
    xv, yv = full.val.tensors
    _check_subset(y.numpy(), protocol["train_images"], "train_images", "training", full.name)
    _check_subset(yv.numpy(), protocol["curve_val_images"], "curve_val_images", "validation", full.name)
    if protocol["final_val_images"] > len(yv):
        raise SpecError.single(("protocol", "final_val_images"), f"{protocol['final_val_images']} images: the "
                               f"validation images of {full.name} are {len(yv)}", f"at most {len(yv)}")
    keep = stratified(y.numpy(), protocol["train_images"], seed=0)
    curve = stratified(yv.numpy(), protocol["curve_val_images"], seed=0)

    def view(train_idx, val_idx) -> Dataset:
        return Dataset(full.name, TensorDataset(x[train_idx], y[train_idx]), TensorDataset(xv[val_idx], yv[val_idx]),
                       full.num_classes, full.channels, full.image_size)

    everything = torch.arange(len(yv))[: protocol["final_val_images"]]
    return view(keep, curve), view(keep, everything)


def train_config(protocol: dict) -> TrainConfig:
    """The :class:`~archspec.train.config.TrainConfig` of a table protocol (CPU, one evaluation at the end)."""
    return TrainConfig(steps=protocol["steps"], batch_size=protocol["batch_size"], lr=protocol["lr"],
                       weight_decay=protocol["weight_decay"], optimizer=protocol["optimizer"],
                       warmup_steps=protocol["warmup_steps"], augmentation=protocol["augmentation"],
                       eval_every=protocol["steps"], device="cpu")


def check_training(protocol: dict) -> None:
    """The protocol's training settings as ``archspec train`` checks them (:func:`~archspec.train.config.check_config`
    of :func:`train_config`, timm's optimizer names), before any pair.

    Raises:
        SpecError: at ``protocol.<field>`` (a TrainConfig field is the protocol's field of the same name).
    """
    try:
        check_config(train_config(protocol))
        check_optimizer(protocol["optimizer"])
    except SpecError as exc:
        raise SpecError([dataclasses.replace(p, path=("protocol", *p.path[1:])) for p in exc.problems]) from None


def _als_reader(protocol: dict, data_curve: Dataset):
    """``model -> {"stage.layer": [ALS per head]}`` for protocols with ``als``, else ``None``."""
    als = protocol.get("als")
    if not als:
        return None
    window = MaskSpec(window=als["window"]).window
    images = data_curve.val.tensors[0][: als["images"]]

    def read(model) -> dict[str, list[float]]:
        scores = layer_scores(model, images, window)
        return {f"{s}.{l}": [round(v, 4) for v in values] for (s, l), values in sorted(scores.items())}

    return read


def _alpha_reader(model):
    """``model -> {"stage.layer": [alpha per head, None for a head without a soft mask]}`` for a model with MaiT's
    soft mask on any head (sec. 4.3), else ``None``."""
    if not any(a is not None for values in learned_alphas(model).values() for a in values):
        return None

    def read(trained) -> dict[str, list[float | None]]:
        return {f"{s}.{l}": [None if a is None else round(a, 4) for a in values]
                for (s, l), values in sorted(learned_alphas(trained).items())}

    return read


class _StopAfter(Exception):
    """Raised by the step hook once ``stop_after`` steps have run (the protocol's schedule is left unchanged)."""


def train_row(spec: ArchSpec, data_curve: Dataset, data_final: Dataset, protocol: dict, seed: int,
              stop_after: int | None = None) -> dict[str, Any]:
    """Train ``spec`` once under ``protocol`` with ``seed``: ``{"curve": [[step, val top-1, val loss]], "tse":
    [[step, sum of training losses, training seconds]], "als": [[step, {"stage.layer": [ALS per head]}]] (ALS
    protocols only), "alphas": [[step, {"stage.layer": [soft-mask alpha per head or None]}]] (models with a soft
    mask only), "final_accuracy", "final_val_loss", "train_seconds", "eval_seconds"}``.  Accuracies in 0..1,
    seconds of CPU wall time.

    ``stop_after=K`` runs only the protocol's first K steps (same learning-rate schedule, same batches) and returns
    the curve points up to K, without the final evaluation (``final_accuracy`` and ``final_val_loss`` are ``None``):
    a prefix of the full row, which a test compares with a tabulated row for a fraction of the training.

    Raises:
        TrainingFailure: the training diverged (non-finite loss), from :func:`archspec.train.loop.run_steps`.
    """
    config = train_config(protocol)
    geometry = ProxyProtocol(image_size=protocol["image_size"])
    pspec = proxy_spec(spec, data_curve, geometry).model_copy(update={"seed": seed})
    torch.manual_seed(seed)
    model = compile_spec(pspec)
    batches = TensorBatches(data_curve.train, config.batch_size, config.augmentation, seed, torch.device("cpu"))
    trainer = Trainer(model, config, torch.device("cpu"), num_classes=data_curve.num_classes)
    points = set(protocol["curve_steps"])
    read_als, read_alphas = _als_reader(protocol, data_curve), _alpha_reader(model)
    curve, tse, als, alphas = [], [], [], []
    state = {"loss_sum": 0.0, "eval_s": 0.0, "last": time.perf_counter(), "train_s": 0.0}

    def on_step(step: int, loss) -> None:
        state["loss_sum"] += float(loss)
        state["train_s"] += time.perf_counter() - state["last"]
        if step in points:
            start = time.perf_counter()
            acc, val_loss = evaluate(model, data_curve)
            if read_als is not None:
                als.append([step, read_als(model)])
            if read_alphas is not None:
                alphas.append([step, read_alphas(model)])
            state["eval_s"] += time.perf_counter() - start
            curve.append([step, acc, round(val_loss, 5)])
            tse.append([step, round(state["loss_sum"], 4), round(state["train_s"], 2)])
        state["last"] = time.perf_counter()
        if step == stop_after:
            raise _StopAfter

    def final_eval() -> dict:
        start = time.perf_counter()
        acc, val_loss = evaluate(model, data_final)
        state["eval_s"] += time.perf_counter() - start
        return {"accuracy": acc, "val_loss": val_loss}

    try:
        result = run_steps(trainer, iter(batches), final_eval, hooks=Hooks(on_step=on_step))
    except _StopAfter:
        result = None
    row = {"curve": curve, "tse": tse}
    if read_als is not None:
        row["als"] = als
    if read_alphas is not None:
        row["alphas"] = alphas
    if result is None:
        row.update({"final_accuracy": None, "final_val_loss": None, "train_seconds": round(state["train_s"], 2),
                    "eval_seconds": round(state["eval_s"], 2)})
        return row
    row.update({"final_accuracy": result.accuracy, "final_val_loss": round(result.val_loss, 5),
                "train_seconds": round(state["train_s"], 2), "eval_seconds": round(state["eval_s"], 2)})
    return row


def zero_cost_row(spec: ArchSpec, data: Dataset, protocol: dict, seed: int) -> dict[str, Any]:
    """``{"zc": {score: value or None}, "zc_seconds": {score: s}}``: the zero-cost scores of the untrained model on
    one batch of ``zero_cost_batch`` training images (a non-finite score is ``None``).  Raises nothing of its own."""
    proto = ProxyProtocol(image_size=protocol["image_size"], batch_size=protocol["zero_cost_batch"])
    result, _ = score_proxy(spec, data, proto, ZERO_COST_SCORES, seed=seed)
    return {"zc": {k: (v if math.isfinite(v) else None) for k, v in result.scores.items()},
            "zc_seconds": {k: round(v, 4) for k, v in result.seconds.items()}}
