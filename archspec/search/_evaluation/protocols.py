"""How a candidate is measured, torch-free: the proxy-training and latency protocols, the zero-cost scores'
names and result record.  The search's engine imports these at the top; the torch halves that use them --
:mod:`~archspec.search._evaluation.proxy`, :mod:`~archspec.search._evaluation.latency`,
:mod:`~archspec.search._evaluation.zero_cost` -- load when a candidate is trained or timed (they re-export these
names)."""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from typing import Any

from archspec.errors import SpecError
from archspec.search._evaluation.scoring import PROXY_SCORES, proxy_score
from archspec.train.config import AUGMENTATIONS as _AUGMENTATIONS
from archspec.train.config import TrainConfig

__all__ = ["LatencyProtocol", "ProxyProtocol", "ZERO_COST_SCORES", "ZeroCostResult", "GEOMETRY_ATTR"]

ZERO_COST_SCORES = ("naswot", "synflow", "grad_norm")
# Trial user attribute: the proxy's input size, stem and stage grids next to the real grids
# (archspec.search._evaluation.proxy.ProxyGeometry.describe): written by the search, reported in trials.csv.
GEOMETRY_ATTR = "proxy_geometry"


@dataclass
class ProxyProtocol(TrainConfig):
    """How a candidate is trained and scored by the search (``proxy_spec`` and ``train_proxy``:
    :mod:`archspec.search._evaluation.proxy`).

    Defaults: every stage at the candidate's own token grid (``proxy_spec``; a 224 px LeViT's 14x14 ->
    7x7 -> 4x4, from 56 px through the last two of its four stride-2 stem convs), the images resized to
    that size (the built-in 8x8 digits upsampled); 120 AdamW steps of batch 16, lr 2e-3 with 12 linear
    warm-up steps then cosine to 0, weight decay 0.05 (timm ``create_optimizer_v2``: not on 1-d parameters
    nor ``model.no_weight_decay`` -- attention bias tables, gating), random crop (pad 8) + horizontal flip,
    val top-1 every 20 steps (3 report points for pruning; the search evaluates only the last step when no
    rung or pruner reads the others).

    With other processes on the same cores use ``threads=1``: two processes with 2 OpenMP threads each
    on 2 cores ran 5-10x slower here (busy-waiting); ``archspec search`` defaults to the idle cores
    (:func:`archspec.cli.search.idle_cores`).  Measured costs: ``docs/benchmarks.md`` ("Search").

    Attributes (besides :class:`archspec.train.TrainConfig`'s optimisation settings -- steps, batch_size,
    lr, weight_decay, optimizer, warmup_steps, augmentation, eval_every, device -- with the same defaults;
    ``device`` is where the proxy trains, the CLI resolving ``auto``):
        image_size: the largest proxy input side in pixels: the stem keeps as many stride-2 convs (or as
            large a patch) as fit it (``proxy_spec``); a pure conv net trains at it; a hybrid after a
            ResNet stem trains at the smallest size that keeps its token grids, above it if need be.
        threads: ``torch.set_num_threads`` during the trial (restored afterwards); ``None`` leaves it.
        min_grid: ``None`` (default): the proxy has the candidate's own token grid in every stage; a side
            ``m``: the first stage's grid is at least ``m`` (and every stage's at least its largest mask window).
    """

    # Batch 16: at the candidates' real token grids (14x14 for a 224 px LeViT) a step costs ~4x one on the old
    # 4x4 proxy grid, and the bare search must train several candidates in its 540 s on 2 cores.  120 steps, not
    # 60: at 60 the 16 candidates of a bare search reached 0.27-0.43 and one design dominated the rest (a 1-point
    # front); at 120, 11 candidates, 0.45-0.56, a 3-point front (docs/benchmarks.md, "Search").
    steps: int = 120
    batch_size: int = 16
    warmup_steps: int = 12
    eval_every: int = 20
    image_size: int = 64
    threads: int | None = None
    min_grid: int | None = None
    # What ranks the candidates (archspec.search._evaluation.scoring: accuracy | tse).  Val top-1 (issue 82): on
    # levit_small's complete table (224 designs, 3 seeds; the one table whose reference reproduces itself), 200
    # paired replays scored on the seeds that did not answer each proxy end with larger fronts ranked by it than by
    # TSE at equal CPU -- median HV 0.546 against 0.533 (accuracy, latency; Holm p 0.079) and 0.551 against 0.517
    # (accuracy, MACs; Holm p 5.1e-05) -- although TSE ranks single designs better (tau 0.498 against 0.413 at 120
    # steps): TSE leans to large models and fills the front with them.  One table only (docs/search-works.md).
    score: str = "accuracy"

    def __post_init__(self) -> None:
        checks = [("image_size", self.image_size >= 8), ("steps", self.steps >= 1),
                  ("batch_size", self.batch_size >= 1),
                  ("lr", self.lr > 0), ("weight_decay", self.weight_decay >= 0),
                  ("warmup_steps", self.warmup_steps >= 0),
                  ("eval_every", self.eval_every >= 1), ("min_grid", self.min_grid is None or self.min_grid >= 1),
                  ("augmentation", self.augmentation in _AUGMENTATIONS), ("score", self.score in PROXY_SCORES),
                  ("threads", self.threads is None or self.threads >= 1)]
        for name, ok in checks:
            if not ok:
                hint = {"augmentation": f"one of {', '.join(_AUGMENTATIONS)}",
                        "score": f"one of {', '.join(PROXY_SCORES)}"}.get(name)
                raise SpecError.single(("proxy", name), f"invalid {name}: {getattr(self, name)!r}", hint)

    def describe(self) -> dict:
        """JSON-ready dict of every setting (``score`` only when it is not "accuracy", the default: a study written
        before the score existed ranked by accuracy and records the same protocol; one written while ``tse`` was the
        default records ``"score": "tse"`` and resumes only with ``--proxy-score tse``)."""
        out = super().describe()
        if out["score"] == "accuracy":
            del out["score"]
        return out

    def score_of(self, accuracy: float, loss_sum: float, steps: int) -> float:
        """The value that ranks a candidate (higher is better): ``accuracy``, or ``-loss_sum / steps``
        (:func:`archspec.search._evaluation.scoring.proxy_score`)."""
        return proxy_score(self.score, accuracy, loss_sum, steps)

    def train_config(self) -> TrainConfig:
        """The optimisation settings for :func:`archspec.train.train` (the one training loop) on ``device``."""
        return TrainConfig(**{f.name: getattr(self, f.name) for f in fields(TrainConfig)})


@dataclass(frozen=True)
class LatencyProtocol:
    """How latency is measured (:func:`archspec.diagnostics.timing.measure_forward`).

    Default = LeViT's CPU protocol: one thread, batch 1, float32; the figure is the median ms of one
    forward pass.  ``device='cuda'`` (or ``'auto'`` on a GPU machine) with ``batch=None`` is LeViT's GPU
    protocol: the largest power-of-two batch that fits, bf16 autocast; the figure is then ms per image
    (``1000 / images_per_s``) so candidates measured at different batches compare.  ``torch_compile=True`` times the
    model under ``torch.compile`` (:func:`archspec.diagnostics.timing.compile_for_inference`: Inductor, freezing); its
    compilation runs before the warm-up and is never timed (``archspec search --latency-compile``).  Its key
    in :meth:`describe` (latency tables, run summaries, study attributes) and in the cache key stays ``compile``,
    its name until issue 58.
    """

    device: str = "cpu"
    threads: int = 1
    batch: int | None = 1
    warmup: int = 5
    repeats: int = 20
    torch_compile: bool = False

    def key(self) -> str:
        """Cache key of the protocol on this machine (CPU model and torch version included); ``|compile`` is
        appended for compiled latency only, so caches written before the option keep their eager entries."""
        import torch  # noqa: PLC0415 - the torch version is part of the key; the protocol itself is torch-free

        return (f"{self.device}|threads={self.threads}|batch={self.batch}|warmup={self.warmup}|repeats={self.repeats}"
                f"|{_machine()}|torch={torch.__version__}" + ("|compile" if self.torch_compile else ""))

    def describe(self) -> dict:
        """JSON-ready dict (``torch_compile`` under its persisted key ``compile``)."""
        return {_LATENCY_KEYS.get(name, name): value for name, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyProtocol:
        """The protocol of ``data``: a :meth:`describe` dict (key ``compile``) or one keyed by field name."""
        names = {key: name for name, key in _LATENCY_KEYS.items()}
        return cls(**{names.get(key, key): value for key, value in data.items()})


# LatencyProtocol's settings written under another key than their name (as archspec.train.config.PERSISTED_KEYS)
_LATENCY_KEYS = {"torch_compile": "compile"}


@lru_cache(maxsize=1)
def _machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return model


@dataclass
class ZeroCostResult:
    """Scores of one model and how long each took.

    Attributes:
        scores: score name (one of :data:`ZERO_COST_SCORES`) -> value.
        seconds: score name -> wall-clock seconds it took (``time.perf_counter``).
    """

    scores: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
