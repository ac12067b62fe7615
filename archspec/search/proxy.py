"""Proxy training: a short, deterministic CPU training run that ranks candidate architectures.

:func:`proxy_spec` adapts a candidate to the data (input size, channels, classes) while keeping its
architecture; :func:`train_proxy` trains it for a fixed number of steps and returns val top-1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch

from archspec.data import Dataset
from archspec.errors import SpecError
from archspec.loader import load_spec
from archspec.spec import ArchSpec
from archspec.train import AUGMENTATIONS as _AUGMENTATIONS
from archspec.train import TrainConfig, TrialFailure, failure, train

__all__ = ["ProxyProtocol", "ProxyResult", "TrialFailure", "proxy_spec", "train_proxy"]


@dataclass
class ProxyProtocol(TrainConfig):
    """How a candidate is trained and scored by the search.

    Defaults: 64x64 inputs (the built-in 8x8 digits upsampled), where LeViT's 4-conv stem gives a 4x4
    token grid, then 2x2 and 1x1 after shrinking -- the stem is left as it is; 150 AdamW steps of
    batch 32 (about 3.3 epochs of the 1437 training digits), lr 2e-3 with 20 linear warm-up steps then
    cosine to 0, weight decay 0.05 (timm ``create_optimizer_v2``: not on 1-d parameters nor
    ``model.no_weight_decay`` -- attention bias tables, gating), random crop (pad 8) + horizontal
    flip, val top-1 every 50 steps (3 report points for pruning).

    Measured on this project's 2-core CPU (10 random default-space candidates under 1 GMAC, 248-854M
    MACs at 224 px, 18-68M at the proxy size), while another search shared the machine (load ~3),
    with ``threads=1``: 14-43 s per trial, median ~24 s; a single thread runs a LeViT-128S-sized
    candidate at ~85 ms/step on a quiet core, so a lone search with 2 threads takes roughly 8-25 s per
    trial.  Val top-1 after 150 steps: 0.87-0.95 (chance 0.10; 0.29-0.78 at step 50), so
    candidates are told apart but none saturates.  With other processes on the same cores use
    ``threads=1``: two processes with 2 OpenMP threads each on 2 cores ran 5-10x slower here (busy-waiting).

    Attributes (besides :class:`archspec.train.TrainConfig`'s optimisation settings -- steps, batch_size,
    lr, weight_decay, optimizer, warmup_steps, augmentation, eval_every, device -- with the same defaults;
    ``device`` is where the proxy trains, the CLI resolving ``auto``):
        image_size: proxy input side in pixels (the candidate's own resolution is replaced).
        threads: ``torch.set_num_threads`` during the trial (restored afterwards); ``None`` leaves it.
        min_grid: the first stage's token grid side is kept at least this (stem shortened).
    """

    image_size: int = 64
    threads: int | None = None
    min_grid: int = 4

    def __post_init__(self) -> None:
        checks = [("image_size", self.image_size >= 8), ("steps", self.steps >= 1),
                  ("batch_size", self.batch_size >= 1),
                  ("lr", self.lr > 0), ("weight_decay", self.weight_decay >= 0),
                  ("warmup_steps", self.warmup_steps >= 0),
                  ("eval_every", self.eval_every >= 1), ("min_grid", self.min_grid >= 1),
                  ("augmentation", self.augmentation in _AUGMENTATIONS),
                  ("threads", self.threads is None or self.threads >= 1)]
        for name, ok in checks:
            if not ok:
                hint = f"one of {', '.join(_AUGMENTATIONS)}" if name == "augmentation" else None
                raise SpecError.single(("proxy", name), f"invalid {name}: {getattr(self, name)!r}", hint)

    def describe(self) -> dict:
        """JSON-ready dict of every setting."""
        return asdict(self)

    def train_config(self) -> TrainConfig:
        """The optimisation settings for :func:`archspec.train.train` (the one training loop) on ``device``."""
        return TrainConfig(**{f.name: getattr(self, f.name) for f in fields(TrainConfig)})


@dataclass
class ProxyResult:
    """Outcome of :func:`train_proxy`: final val top-1 (0..1), val loss, mean train loss of the last steps."""

    accuracy: float
    val_loss: float
    train_loss: float
    steps: int
    seconds: float
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, val accuracy) at every eval point
    model: Any = field(default=None, repr=False, compare=False)  # the trained ArchModel (eval mode), for ALS / alphas


# ---------------------------------------------------------------------------------------------


def _largest_odd_at_most(n: int) -> int:
    return n if n % 2 else max(n - 1, 1)


def _fit_head(head: dict, grid: tuple[int, int]) -> dict:
    """Make a head's mask window fit ``grid``: drop a mask that covers the whole grid, clip a larger one."""
    mask = head.get("mask")
    if not mask:
        return head
    rows, cols = (2 * mask["depth"] + 1,) * 2 if mask.get("depth") else tuple(mask["window"])
    if rows <= grid[0] and cols <= grid[1]:
        return head
    if rows // 2 >= grid[0] - 1 and cols // 2 >= grid[1] - 1:  # every patch is a neighbour: the mask is a no-op
        return {k: v for k, v in head.items() if k != "mask"}
    new_mask = dict(mask, depth=None, window=[min(rows, _largest_odd_at_most(grid[0])),
                                              min(cols, _largest_odd_at_most(grid[1]))])
    return dict(head, mask=new_mask)


def proxy_spec(spec: ArchSpec, data: Dataset, protocol: ProxyProtocol) -> ArchSpec:
    """The same architecture at the proxy's input size, the data's channels and number of classes.

    What changes (and only this):

    * ``input.resolution`` -> ``protocol.image_size``; ``input.channels`` -> ``data.channels``;
      ``head.num_classes`` -> ``data.num_classes``; the name gets ``_proxy``.
    * The stem's stride, so the token grid of the first stage is not degenerate: LeViT's 4-conv stem
      would turn 32 px into a 2x2 grid (then 1x1 after shrinking), where attention and locality mean
      nothing.  Leading stride-2 convs of a conv stem are dropped (the channel progression keeps its
      last entries, ending at the stage-0 width) and a patch stem's patch size is reduced, until the
      first grid side is at least ``min(protocol.min_grid, the spec's own grid side)``.  Widths, depths,
      heads and head kinds are unchanged; later grids follow from the stride-2 shrinks as usual.
    * Mask windows larger than their (smaller) token grid: a window that covers the whole grid is a
      no-op mask (every patch is a neighbour) and is removed, which is exact; otherwise each side is
      clipped to the largest odd size the grid allows (e.g. 5x5 on a 4x4 grid -> 3x3).  Conv-mixer
      kernels are clipped likewise.

    Raises:
        SpecError: the adapted spec is still invalid (e.g. an identity stem whose patch does not divide
            the proxy size).
    """
    from archspec.graph import build_graph  # noqa: PLC0415

    doc = spec.model_dump(mode="json")
    size = protocol.image_size
    doc["name"] = (spec.name + "_proxy")[:100]
    doc["input"] = {"channels": data.channels, "resolution": [size, size]}
    doc["head"]["num_classes"] = data.num_classes
    h0, w0 = spec.input.resolution
    stem = doc["stem"]
    if stem["kind"] == "conv":
        channels = stem["channels"] or [max(spec.stages[0].dim // d, 1) for d in (8, 4, 2, 1)]
        own = h0
        for _ in channels:
            own = (own - 1) // 2 + 1
        target = min(protocol.min_grid, own)
        while len(channels) > 1:
            side = size
            for _ in channels:
                side = (side - 1) // 2 + 1
            if side >= target:
                break
            channels = channels[1:]
        stem["channels"] = channels
    elif stem["kind"] == "patch":
        p = stem["patch_size"]
        target = min(protocol.min_grid, h0 // p)
        while p > 1 and (size // p < target or size % p):
            p -= 1
        stem["patch_size"] = p
    # token grid of each stage with masks removed (windows do not change shapes)
    bare = {**doc, "stages": [dict(s, attention=_strip(s.get("attention")),
                                   layers=[dict(o, heads=[_strip(h) for h in o["heads"]] if o.get("heads") else None,
                                                attention=_strip(o.get("attention"))) for o in s.get("layers", [])])
                              for s in doc["stages"]]}
    try:
        graph = build_graph(load_spec(bare, check=False))
    except SpecError:
        return load_spec(doc)  # report the real problems of the adapted spec
    grids: dict[int, tuple[int, int]] = {}
    for node in graph.graph["order"]:
        d = graph.nodes[node]
        if d["kind"] == "block":
            grids.setdefault(d["stage"], tuple(d["grid"]))
    for i, stage in enumerate(doc["stages"]):
        grid = grids.get(i)
        if grid is None:
            continue
        if stage.get("attention"):
            stage["attention"] = _fit_head(stage["attention"], grid)
        limit = _largest_odd_at_most(2 * max(grid) - 1)
        if stage["mixer"]["kind"] == "conv" and stage["mixer"]["kernel"] > 2 * max(grid) + 1:
            stage["mixer"]["kernel"] = limit
        for override in stage.get("layers", []):
            if override.get("heads"):
                override["heads"] = [_fit_head(h, grid) for h in override["heads"]]
            if override.get("attention"):
                override["attention"] = _fit_head(override["attention"], grid)
            mixer = override.get("mixer")
            if mixer and mixer["kind"] == "conv" and mixer["kernel"] > 2 * max(grid) + 1:
                mixer["kernel"] = limit
    return load_spec(doc)


def _strip(head: dict | None) -> dict | None:
    return None if head is None else {k: v for k, v in head.items() if k != "mask"}


@contextmanager
def _threads(n: int | None) -> Iterator[None]:
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def train_proxy(spec: ArchSpec, data: Dataset, protocol: ProxyProtocol, seed: int = 0,
                report: Callable[[int, float], None] | None = None,
                on_model: Callable[[torch.nn.Module], None] | None = None) -> ProxyResult:
    """Train ``proxy_spec(spec, ...)`` for ``protocol.steps`` steps and return its val top-1.

    The training loop is :func:`archspec.train.train` (the package's one loop): timm's optimizer factory
    (``create_optimizer_v2``, honouring ``model.no_weight_decay``) and a linear-warm-up + cosine schedule;
    batches are drawn from seeded epoch permutations, augmentation
    uses the same seeded generator, and the weights are initialised from ``seed`` (the spec's seed is
    replaced), so a run is deterministic given ``seed`` and the thread count.  The caller's RNG state
    and thread count are left as they were.

    Args:
        report: called as ``report(step, val_accuracy)`` at every eval point (every ``eval_every`` steps
            and the last); it may raise ``optuna.TrialPruned``, which propagates.
        on_model: called with the freshly built model before training (e.g. to install a deadline
            forward hook); an exception it raises from a hook propagates like ``report``'s.

    Returns:
        :class:`ProxyResult`, whose ``model`` is the trained model (eval mode).

    Raises:
        TrialFailure: NaN/inf loss, an exception inside the model (with its message), out of memory.
        SpecError: the spec cannot be adapted to the proxy.
    """
    from archspec.compiler import compile as compile_spec  # noqa: PLC0415

    pspec = proxy_spec(spec, data, protocol).model_copy(update={"seed": seed})
    if len(data.train) == 0:
        raise TrialFailure("the training set is empty")
    with _threads(protocol.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = compile_spec(pspec)
        except (RuntimeError, ValueError, MemoryError) as exc:
            raise failure(exc, "while building the model") from None
        if on_model is not None:
            on_model(model)
        result = train(model, data, protocol.train_config(), seed=seed, report=report)
    return ProxyResult(accuracy=result.accuracy, val_loss=result.val_loss, train_loss=result.train_loss,
                       steps=result.steps, seconds=result.seconds, history=[(s, a) for s, a, _ in result.history],
                       model=model)
