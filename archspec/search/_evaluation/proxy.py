"""Proxy training: a short, deterministic CPU training run that ranks candidate architectures.

:func:`proxy_spec` adapts a candidate to the data (input size, channels, classes) while keeping its
architecture; :func:`train_proxy` trains it for a fixed number of steps and returns val top-1.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from archspec._util.memo import ContentMemo
from archspec.errors import SpecError
from archspec.families.stem.rules import reduction
from archspec.io.datasets import Dataset
from archspec.ir.checked import load_spec
from archspec.ir.graph import build_graph
from archspec.nn import compiler
from archspec.nn.compiler import compile as compile_spec
from archspec.search._evaluation.protocols import ProxyProtocol
from archspec.search._evaluation.zero_cost import zero_cost_scores
from archspec.spec import ArchSpec
from archspec.train import TrainingFailure, failure, train

if TYPE_CHECKING:
    from archspec.search._evaluation.zero_cost import ZeroCostResult

__all__ = ["ProxyGeometry", "ProxyProtocol", "ProxyResult", "TrainingFailure", "proxy_geometry", "proxy_spec",
           "score_proxy", "stage_grids", "train_proxy"]


@dataclass
class ProxyResult:
    """Outcome of :func:`train_proxy`: final val top-1 (0..1), val loss, mean train loss of the last steps,
    ``loss_sum`` (the sum of every step's training loss: TSE) and ``score`` (what ranks the candidate:
    :meth:`ProxyProtocol.score_of`)."""

    accuracy: float
    val_loss: float
    train_loss: float
    steps: int
    seconds: float
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, reported score) at every eval point
    geometry: ProxyGeometry | None = None  # input size, stem and stage grids the proxy trained at
    model: Any = field(default=None, repr=False, compare=False)  # the trained ArchModel (eval mode), for ALS / alphas
    loss_sum: float = math.nan
    score: float | None = None  # None: the accuracy


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProxyGeometry:
    """Where a candidate's proxy trains: its input size, its stem and the token grid of every stage.

    Attributes:
        image_size: proxy input ``(H, W)`` in pixels (the data are resized to it).
        stem: the proxy's stem, as JSON (``kind`` plus ``channels`` or ``patch_size``; a ``resnet`` stem is the
            candidate's own, unchanged).
        grids: ``(rows, cols)`` token grid of each stage's blocks in the proxy.
        real_grids: the same for the candidate at its own input size.
    """

    image_size: tuple[int, int]
    stem: dict
    grids: tuple[tuple[int, int], ...]
    real_grids: tuple[tuple[int, int], ...]

    def describe(self) -> dict:
        """JSON-ready dict (recorded in ``summary.json`` and in each trial's attributes)."""
        return {"image_size": list(self.image_size), "grids": [list(g) for g in self.grids],
                "real_grids": [list(g) for g in self.real_grids], "stem": self.stem}


def stage_grids(spec: ArchSpec | dict) -> tuple[tuple[int, int], ...]:
    """``(rows, cols)`` token grid of each stage's first block, from the graph (``(0, 0)`` for a stage without one).

    Raises:
        SpecError: the spec is invalid.
    """

    graph = build_graph(spec if isinstance(spec, ArchSpec) else load_spec(spec))  # the graph the spec carries
    grids: dict[int, tuple[int, int]] = {}
    for node in graph.graph["order"]:
        data = graph.nodes[node]
        if data["kind"] == "block":
            grids.setdefault(data["stage"], tuple(data["grid"]))
    return tuple(grids.get(i, (0, 0)) for i in range(len(graph.graph["spec"].stages)))


def _window(head: dict | str | None) -> tuple[int, int]:
    """A head's mask window ``(rows, cols)`` (``(0, 0)`` without a mask; a depth-``d`` mask is ``2d+1`` square)."""
    mask = head.get("mask") if isinstance(head, dict) else None
    if not mask:
        return (0, 0)
    return (2 * mask["depth"] + 1,) * 2 if mask.get("depth") else tuple(mask["window"])


def _stage_windows(doc: dict) -> list[tuple[int, int]]:
    """The largest mask window of each stage, over its default head kind and every layer's heads."""
    out = []
    for stage in doc["stages"]:
        heads = [stage.get("attention")]
        for override in stage.get("layers") or []:
            heads += [override.get("attention"), *(override.get("heads") or [])]
        windows = [_window(h) for h in heads]
        out.append((max(w[0] for w in windows), max(w[1] for w in windows)))
    return out


def _conv_stem(spec: ArchSpec, target: tuple[int, int], cap: int) -> tuple[dict, tuple[int, int]]:
    """Keep the last ``k`` stride-2 convs of a conv stem, ``k`` as large as fits ``cap``; input ``target * 2**k``.

    A 3x3 stride-2 conv with padding 1 maps ``2m`` pixels to ``m``, so ``k`` convs give exactly ``target``.
    """
    channels = list(spec.stem.channels or [max(spec.stages[0].dim // d, 1) for d in (8, 4, 2, 1)])
    k = len(channels)
    while k > 1 and max(target) * 2**k > cap:
        k -= 1
    size = (target[0] * 2**k, target[1] * 2**k)
    return {**spec.stem.model_dump(mode="json"), "channels": channels[-k:]}, size


def _patch_stem(spec: ArchSpec, target: tuple[int, int], cap: int) -> tuple[dict, tuple[int, int]]:
    """The largest patch ``p`` (at most the spec's) with ``target * p`` within ``cap``; input ``target * p``."""
    p = spec.stem.patch_size
    while p > 1 and max(target) * p > cap:
        p -= 1
    return {**spec.stem.model_dump(mode="json"), "patch_size": p}, (target[0] * p, target[1] * p)


def _resnet_input(spec: ArchSpec, target: tuple[int, int], cap: int) -> tuple[dict, tuple[int, int]]:
    """The stem unchanged; the input ``map * F`` per side, at most the real one (``F`` = the stem's reduction x the
    conv strides).

    A ResNet stem divides by 4 (the maxxvit stem of CoAtNet / MaxViT and MobileViT's by 2) and every conv stage by
    its stride (each a ceiling division, so the map is ``ceil(H / F)``): the input size is the only knob.  ``map`` is
    the feature map the first attention stage needs to get a first token grid of ``target``: its ``from_map`` grid for
    ``pool: avg`` (pooling keeps that grid while the map is at least as large: a 1-stage graft keeps 14x14 tokens
    from 56 px), ``target`` itself otherwise (every pixel a token).  A multiple of ``F`` so that every stride halves
    a side exactly.  This is the smallest such size, above ``cap`` when the tokens need it (the token grids win:
    the module's rule; a graft after 3 ResNet-50 stages without pooling keeps its full 224 px).  A pure conv net
    has no tokens: its input is ``cap`` (at most the real size).  Source: timm ``resnet.ResNet`` (stem /4, stage
    strides), timm ``maxxvit.MaxxVit`` (stem /2).
    """
    real = spec.input.resolution
    if spec.is_convnet:
        return spec.stem.model_dump(mode="json"), (min(cap, real[0]), min(cap, real[1]))
    lead = spec.n_conv_stages
    factor = reduction(spec.stem.kind) * math.prod(stage.stride for stage in spec.stages[:lead])
    interface = spec.stages[lead].from_map
    needed = interface.grid if interface is not None and interface.pool == "avg" else target
    size = (min(needed[0] * factor, real[0]), min(needed[1] * factor, real[1]))
    return spec.stem.model_dump(mode="json"), size


def _tokenizer_input(spec: ArchSpec, target: tuple[int, int], cap: int) -> tuple[dict, tuple[int, int]]:
    """NAT's tokenizer unchanged (two 3x3 stride-2 convs: its reduction is fixed at 4); input ``target * 4``, which
    the two convs map to exactly ``target`` (``2m`` pixels -> ``m`` each).  ``cap`` cannot shrink it further."""
    return spec.stem.model_dump(mode="json"), (4 * target[0], 4 * target[1])


# a candidate's proxy (geometry and validated proxy spec) by the candidate's content and the proxy settings
_PROXIES = ContentMemo(256)

# map stems (resnet, maxxvit, mobilevit): the input size only
_STEM_RULES = {"conv": _conv_stem, "resnet": _resnet_input, "maxxvit": _resnet_input, "mobilevit": _resnet_input,
               "conv_tokenizer": _tokenizer_input}  # else _patch_stem


def _geometry_doc(spec: ArchSpec, data: Dataset, cap: int, target: tuple[int, int]) -> dict:
    """The candidate's JSON with the stem and input size that give a first-token-stage grid of ``target``."""
    stem, size = _STEM_RULES.get(spec.stem.kind, _patch_stem)(spec, target, cap)
    doc = spec.model_dump(mode="json")
    doc["name"] = (spec.name + "_proxy")[:100]
    doc["input"] = {"channels": data.channels, "resolution": list(size)}
    doc["head"]["num_classes"] = data.num_classes
    doc["stem"] = stem
    return doc


def _fits(doc: dict, windows: list[tuple[int, int]]) -> tuple[tuple[tuple[int, int], ...], ArchSpec] | None:
    """The stage grids of ``doc`` and the validated spec (carrying its graph) when ``doc`` is valid and no stage's
    grid is smaller than its largest window."""
    try:
        pspec = load_spec(doc)
    except SpecError:
        return None
    grids = stage_grids(pspec)
    ok = all(g[0] >= w[0] and g[1] >= w[1] for g, w in zip(grids, windows))
    return (grids, pspec) if ok else None


def _adapt(spec: ArchSpec, data: Dataset, protocol: ProxyProtocol) -> tuple[ProxyGeometry, dict, ArchSpec]:
    """:func:`proxy_geometry` and the validated proxy spec (whose graph the IR keeps).

    Computed once per candidate content and proxy setting: kept in :data:`_PROXIES` (keyed on the candidate's
    ``model_dump_json()``, never in the spec), and checked unchanged (``model_dump_json``) before reuse.  The
    returned dict is the kept one: callers copy it.
    """
    real = stage_grids(spec)  # the candidate's own graph (archspec.ir.graph keeps it by content)
    memo = _PROXIES
    key = ("proxy", spec.model_dump_json(), data.channels, data.num_classes, protocol.image_size, protocol.min_grid)
    kept = memo.get(key)
    if kept is not None and kept[2].model_dump_json() == kept[3]:
        return kept[:3]
    first = real[0 if spec.is_convnet else spec.n_conv_stages]  # the first token stage's grid (conv stages: maps)
    targets = [first]
    if protocol.min_grid is not None:  # smallest first grid >= min_grid whose stages all hold their windows
        side = min(protocol.min_grid, max(first))
        targets = [(min(t, first[0]), min(t, first[1])) for t in range(side, max(first) + 1)] + [first]
    windows = _stage_windows(spec.model_dump(mode="json"))
    for target in targets:
        doc = _geometry_doc(spec, data, protocol.image_size, target)
        fit = _fits(doc, windows)
        if fit is not None:
            grids, pspec = fit
            break
    else:  # nothing smaller works: the candidate's own grids (its own spec is valid)
        doc = _geometry_doc(spec, data, protocol.image_size, first)
        pspec = load_spec(doc)
        grids = stage_grids(pspec)
    size = tuple(doc["input"]["resolution"])
    geometry = ProxyGeometry(size, doc["stem"], grids, real)
    memo.put(key, (geometry, doc, pspec, pspec.model_dump_json()))
    return geometry, doc, pspec


def _seeded_proxy(spec: ArchSpec, data: Dataset, protocol: ProxyProtocol, seed: int) -> tuple[ProxyGeometry, ArchSpec]:
    """The geometry and the proxy spec with ``seed`` as its initialisation seed (carrying its graph when the seed
    is a valid spec seed: then the proxy is validated with it, not copied, and kept like :func:`_adapt`'s)."""
    geometry, doc, pspec = _adapt(spec, data, protocol)
    if pspec.seed == seed and type(pspec.seed) is type(seed):
        return copy.deepcopy(geometry), pspec
    if type(seed) is not int or not 0 <= seed <= 2**31 - 1:  # not a spec seed: copied as it always was
        return copy.deepcopy(geometry), pspec.model_copy(update={"seed": seed})
    memo = _PROXIES
    key = ("proxy", spec.model_dump_json(), data.channels, data.num_classes, protocol.image_size, protocol.min_grid,
           "seed", seed)
    kept = memo.get(key)
    if kept is None or kept[0].model_dump_json() != kept[1]:
        seeded = load_spec({**doc, "seed": seed})
        kept = memo.put(key, (seeded, seeded.model_dump_json()))
    return copy.deepcopy(geometry), kept[0]


def proxy_geometry(spec: ArchSpec, data: Dataset, protocol: ProxyProtocol) -> tuple[ProxyGeometry, dict]:
    """The proxy's geometry, and the proxy spec as JSON (see :func:`proxy_spec` for the rule).

    Raises:
        SpecError: the candidate itself is invalid.
    """
    geometry, doc, _ = _adapt(spec, data, protocol)
    return copy.deepcopy((geometry, doc))


def proxy_spec(spec: ArchSpec, data: Dataset, protocol: ProxyProtocol) -> ArchSpec:
    """The same architecture, at the token geometry it has at its real input size, on the data's images.

    What changes (and only this):

    * ``input.channels`` -> ``data.channels``; ``head.num_classes`` -> ``data.num_classes``; the name gets
      ``_proxy``.
    * The stem and the input size, so that **every stage has the token grid it has at the candidate's own
      resolution** (LeViT at 224 px: 14x14 -> 7x7 -> 4x4): a conv stem keeps as many of its last stride-2
      convs ``k`` as fit ``protocol.image_size`` (a 3x3 stride-2 conv halves an even side exactly), and
      the input is ``grid * 2**k`` pixels (LeViT's 4-conv stem -> 2 convs at 56 px); a patch (or identity)
      stem takes the largest patch ``p`` that fits, at ``grid * p`` pixels; NAT's tokenizer (a fixed 4x
      reduction) is kept, at ``grid * 4`` pixels.  A ResNet stem (a hybrid's or a
      conv net's) is kept whole and only the input shrinks: to the smallest multiple of ``4 x`` the conv
      stages' strides at which every attention stage keeps its token grid (``from_map: {pool: avg, grid: 14}``
      needs only a 14x14 map: 56 px after the stem alone, 112 px after two ResNet-50 stages; ``pool: none``
      after three needs the full 224 px), even above ``protocol.image_size`` -- the token grids win; a pure
      conv net, which has no tokens, trains at ``protocol.image_size`` (at most its own size).  The data are
      resized to that.
    * With ``protocol.min_grid`` set, a smaller first grid: the smallest side from ``min_grid`` up whose
      stages (their grids derived by the candidate's own shrinks) are each at least as large as the stage's
      largest mask window and which validates (e.g. a conv mixer's kernel fits); never larger than the
      candidate's own.  Mask placement uses 8 (64 px, patch 8 -> 8x8).  After a ResNet stem "first" is the
      first attention stage: a ``pool: none`` graft's tokens shrink with the input (3 ResNet-50 stages with
      ``min_grid=7``: 7x7 from 112 px), a ``pool: avg`` one's keep the pooled grid.

    Stages, depths, widths, heads, head kinds, mask windows, biases and shrinks are the candidate's own:
    a masked head's mask in the proxy is the candidate's.

    Raises:
        SpecError: the adapted spec is invalid.
    """
    return _adapt(spec, data, protocol)[2]


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
                on_model: Callable[[torch.nn.Module], None] | None = None,
                progress: str | None = None) -> ProxyResult:
    """Train ``proxy_spec(spec, ...)`` for ``protocol.steps`` steps and return its val top-1.

    The training loop is :func:`archspec.train.train` (the package's one loop): timm's optimizer factory
    (``create_optimizer_v2``, honouring ``model.no_weight_decay``) and a linear-warm-up + cosine schedule;
    batches are drawn from seeded epoch permutations, augmentation
    uses the same seeded generator, and the weights are initialised from ``seed`` (the spec's seed is
    replaced), so a run is deterministic given ``seed`` and the thread count.  The caller's RNG state
    and thread count are left as they were.

    Args:
        report: called as ``report(step, score)`` at every eval point (every ``eval_every`` steps and the
            last): the val top-1, or with ``protocol.score == "tse"`` minus the mean training loss so far; it may
            raise ``optuna.TrialPruned``, which propagates.
        on_model: called with the freshly built model before training (e.g. to install a deadline
            forward hook); an exception it raises from a hook propagates like ``report``'s.
        progress: a label for the training loop's progress lines on stderr (step, loss, lr, images/s, ETA:
            :class:`archspec.train.progress.Progress`); ``None`` (default): silent.

    Returns:
        :class:`ProxyResult`, whose ``model`` is the trained model (eval mode).

    Raises:
        TrainingFailure: NaN/inf loss, an exception inside the model (with its message), out of memory.
        SpecError: the spec cannot be adapted to the proxy.
    """

    geometry, pspec = _seeded_proxy(spec, data, protocol, seed)
    data = data.at_size(geometry.image_size)
    if len(data.train) == 0:
        raise TrainingFailure("the training set is empty")
    with _threads(protocol.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = compile_spec(pspec)
        except (RuntimeError, ValueError, MemoryError) as exc:
            raise failure(exc, "while building the model") from None
        if on_model is not None:
            on_model(model)
        scored = []  # (step, score) at every eval point

        def on_eval(step: int, record: dict) -> None:
            scored.append((step, protocol.score_of(record["accuracy"], record["loss_sum"], step)))
            if report is not None:
                report(*scored[-1])

        result = train(model, data, protocol.train_config(), seed=seed, progress=progress, on_eval=on_eval)
    score = protocol.score_of(result.accuracy, result.loss_sum, result.steps)
    return ProxyResult(accuracy=result.accuracy, val_loss=result.val_loss, train_loss=result.train_loss,
                       steps=result.steps, seconds=result.seconds, history=scored, geometry=geometry, model=model,
                       loss_sum=result.loss_sum, score=score)


def score_proxy(spec: ArchSpec, data: Dataset, protocol: ProxyProtocol, names: tuple[str, ...],
                seed: int = 0) -> tuple[ZeroCostResult, ProxyGeometry]:
    """Zero-cost scores of the candidate's proxy, freshly initialised from ``seed``, on one training batch.

    The model is the one :func:`train_proxy` would train (same geometry, same initialisation); the batch is
    the first ``protocol.batch_size`` images of a ``seed``-permutation of ``data.train`` at the proxy's
    size.  Scores: :mod:`archspec.search._evaluation.zero_cost` (NASWOT, SynFlow, grad-norm).

    Returns:
        ``(ZeroCostResult, ProxyGeometry)``: scores (higher ranks better) and seconds per score.

    Raises:
        TrainingFailure: an exception inside the model, or out of memory.
        SpecError: the spec cannot be adapted to the proxy.
    """
    geometry, pspec = _seeded_proxy(spec, data, protocol, seed)
    images, labels = data.at_size(geometry.image_size).train.tensors
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))[:protocol.batch_size]
    with _threads(protocol.threads), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = compiler.compile(pspec)  # looked up per call (tests replace it)
            return zero_cost_scores(model, images[order], labels[order], names), geometry
        except (RuntimeError, ValueError, MemoryError) as exc:
            raise failure(exc, "while scoring the model") from None
