"""Mode 2 of ``archspec search``: MaiT mask placement for a given spec (``archspec search masks SPEC``).

Three strategies (Li et al. 2022, "MaiT"):

``als`` -- the placement strategy of sec. 4.2, driven by the Attention Locality Score (eq. 3,
    :func:`archspec.diagnostics.metrics.layer_als`, on held-out images):

    1. round 1: a hard mask (``window``, 3x3) on head 0 of every attention layer, every other mask
       removed; proxy-train; ALS per layer and head;
    2. assignment, per layer ``l`` from head 0's score ``a = ALS[l][0]``:
       ``a >= als_high`` (default 0.8, "close to 1") -> mask every head of the layer;
       ``a <= als_low`` (default 0.2, "close to 0") -> remove the mask;
       otherwise ("close to 0.5") -> keep head 0's mask only;
       ``a`` is the ALS *above uniform attention*, ``(ALS - u) / (1 - u)`` with ``u`` the score of a
       uniform map on the layer's grid (:func:`uniform_baselines`; ``normalise=False``, ``--als-raw`` on the
       command line, decides on the raw ALS instead).  On MaiT's 14x14 grid ``u`` = 0.05 and both agree; on a
       small proxy grid ``u`` is large (0.37 on 4x4 with a 3x3 window) and the raw score would call uniform heads local;
    3. rounds 2.. (``rounds``, default 2: the paper's "2-3 training iterations"): proxy-train the
       current placement, recompute ALS, and calibrate: a masked head whose own ALS is
       ``<= als_low`` loses its mask.  Stops early once the placement no longer changes.

    Thresholds: the paper says only "close to 1 / 0.5 / 0".  0.8 is the level the paper reports for
    the locally-attending first layers (MaiT-T ALS "over 0.8/0.9" in layers 0-7, sec. 5.4, A.2) and
    0.2 sits well below the middle layers' "around 0.5-0.6"; on a small proxy grid a uniform head
    already scores ``|window| / N`` (e.g. 9/64 = 0.14 on an 8x8 grid), which is why the low
    threshold is not closer to 0 even after the baseline correction.  Both are options.

``optuna`` -- Optuna (TPE) over :func:`archspec.search._space.language.mask_placement_space`: the number of
    masked heads per group of layers and their window; objective proxy accuracy (the same engine
    as mode 1, :func:`archspec.search._engine.loop.run_sampled`).

``soft`` -- sec. 4.3: every head of every attention layer gets a soft mask (non-neighbour logits
    scaled by a learned ``alpha = sigmoid(a)``, initial 0.5); proxy-train; then a head whose learned
    alpha is below ``alpha_threshold`` (it learned to suppress non-neighbours: local) gets a hard
    mask of the window, the others none (global).

Each strategy is a client of the engine's contract (:mod:`archspec.search._engine.mode`), in
:mod:`archspec.search._modes.mask_strategies`: ``optuna`` a sampled mode
(:func:`~archspec.search._engine.loop.run_sampled`),
``als`` and ``soft`` rounds modes (:func:`~archspec.search._engine.loop.run_rounds`).  The placement rule itself
(assignment, calibration, soft alphas, the uniform baseline) is :mod:`archspec.families.attention.placement`;
the spec surgery :mod:`archspec.search._space.mask_placement`; the scores read off a trained model
:mod:`archspec.search._evaluation.mask_scores`.

Every strategy writes ``best.yaml`` (the placement on SPEC at its real input size, with
provenance; ``archspec build`` accepts it), an ALS heatmap (layer x head) and ``als.json``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from archspec.errors import SpecError
from archspec.families.attention.placement import (
    DEFAULT_ALS_HIGH,
    DEFAULT_ALS_LOW,
    Placement,
    assign_from_als,
    calibrate,
    normalise_als,
    soft_placement,
)
from archspec.ir.checked import load_spec
from archspec.search._engine.config import (
    MASKS_PROXY_DEFAULTS,
    MASKS_TRIAL_TIMEOUT_S,
    SearchConfig,
    SearchOutcome,
    complete_config,
    warmup_warning,
)
from archspec.search._engine.loop import run_rounds, run_sampled
from archspec.search._engine.session import quiet_optuna
from archspec.search._evaluation.mask_scores import ALS_IMAGES, layer_scores, train_keeping_model, uniform_baselines
from archspec.search._modes.mask_strategies import AlsPlacement, OptunaPlacement, SoftPlacement
from archspec.search._space.language import mask_placement_space
from archspec.search._space.mask_placement import (
    apply_placement,
    attention_layers,
    first_spec,
    head0_placement,
    parse_window,
    placement_heads,
    provenance_free_yaml,
    rule_thresholds,
    token_stages,
)
from archspec.spec import ArchSpec

# The entry point, and (re-exported from the modules named in the docstring, for their importers: bench/,
# notebooks) the placement rule, the spec surgery and the scores.
__all__ = ["MaskConfig", "run_masks", "attention_layers", "apply_placement", "assign_from_als", "calibrate",
           "soft_placement", "DEFAULT_ALS_HIGH", "DEFAULT_ALS_LOW", "ALS_IMAGES", "Placement", "head0_placement",
           "layer_scores", "normalise_als", "placement_heads", "provenance_free_yaml", "token_stages",
           "train_keeping_model", "uniform_baselines"]


@dataclass
class MaskConfig:
    """Settings of ``archspec search masks``.

    ``search``: a :class:`~archspec.search._engine.config.SearchConfig`, or a dict of its fields over mode 2's
    defaults (objective ``accuracy``, :data:`~archspec.search._engine.config.MASKS_PROXY_DEFAULTS`,
    :data:`~archspec.search._engine.config.MASKS_TRIAL_TIMEOUT_S`), or ``None`` for those defaults.
    """

    spec: Any                       # path / shipped name / ArchSpec
    search: Any = None              # SearchConfig | dict | None
    strategy: str = "als"           # als | optuna | soft
    rounds: int = 2
    als_high: float | None = None
    als_low: float | None = None
    window: str = "3x3"
    windows: Sequence[str] = ("3x3", "3x5", "5x5")
    max_masked: int | None = None
    alpha_threshold: float = 0.5
    normalise: bool = True          # als: decide on (ALS - u) / (1 - u), u = the uniform-attention ALS of the layer


def _masks_search_config(search: Any) -> SearchConfig:
    """Mode 2's :class:`SearchConfig`: ``search`` itself, or a dict of fields over mode 2's defaults."""
    if isinstance(search, SearchConfig):
        return complete_config(search)
    options = dict(search or {})
    protocol = options.pop("protocol", None)
    if isinstance(protocol, dict | None):
        protocol = {**MASKS_PROXY_DEFAULTS, **(protocol or {})}
    # a placement search returns one placement, not a front: no `verify` re-training (design search only)
    defaults = {"objective": "accuracy", "trial_timeout": MASKS_TRIAL_TIMEOUT_S, "fidelity": "none", "verify": 0}
    return complete_config(None, **{**defaults, **options, "protocol": protocol})


def run_masks(mcfg: MaskConfig | None = None, /, **options: Any) -> SearchOutcome:
    """Mode 2, MaiT mask placement (``archspec search masks SPEC``), from Python.

    ``mcfg`` is a :class:`MaskConfig`; ``options`` replace its fields (or make one):
    ``run_masks(spec="mait_tiny_sch2", strategy="als", search={"out": "runs", "data": "fashion-mnist"})``.
    Returns a :class:`~archspec.search._engine.config.SearchOutcome` (``.best_spec``: the spec with its masks placed).

    Raises:
        TypeError: an unknown option.
        SpecError: a bad spec (also a conv net, or a hybrid without attention stages), strategy, threshold, window
            or any input the search refuses; nothing is written then.
    """
    mcfg = MaskConfig(**options) if mcfg is None else dataclasses.replace(mcfg, **options)
    mcfg = dataclasses.replace(mcfg, search=_masks_search_config(mcfg.search))
    quiet_optuna()
    warning = warmup_warning(mcfg.search.protocol)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
    spec = mcfg.spec if isinstance(mcfg.spec, ArchSpec) else load_spec(mcfg.spec)
    source = None if isinstance(mcfg.spec, ArchSpec) else str(mcfg.spec)  # the SPEC argument: a file or a name
    if spec.n_conv_stages and not attention_layers(spec):
        raise SpecError.single(("SPEC",), f"spec {spec.name!r} has no attention stage: mask placement puts MaiT "
                               "masks on the heads of token stages (attention inside bottlenecks takes none)",
                               "a hybrid needs attention stages after its conv stages (e.g. levit_graft_r50s1_deit9)",
                               source)
    if not attention_layers(spec):
        raise SpecError.single(("SPEC",), f"spec {spec.name!r} has no attention layer to place masks in", None, source)
    if mcfg.strategy not in ("als", "optuna", "soft"):
        raise SpecError.single(("strategy",), f"unknown strategy {mcfg.strategy!r}", "als, optuna or soft")
    cfg = mcfg.search
    name = cfg.study_name or f"masks-{spec.name}-{mcfg.strategy}"[:80]
    if mcfg.strategy == "optuna":
        return _run_optuna(spec, mcfg, name)
    high, low = rule_thresholds(mcfg.als_high, mcfg.als_low, mcfg.alpha_threshold)
    window = parse_window(mcfg.window, "window")
    first_spec(spec, mcfg.strategy, window)  # a window that does not fit the token grid fails here
    strategy = AlsPlacement if mcfg.strategy == "als" else SoftPlacement
    # run_rounds checks `data` and `out`, then decodes every image: nothing is written before they pass.
    return run_rounds(strategy(spec, mcfg, window, high, low), cfg, name)




def _run_optuna(spec: ArchSpec, mcfg: MaskConfig, name: str) -> SearchOutcome:
    """``strategy="optuna"``: the engine's sampled search
    (:class:`~archspec.search._modes.mask_strategies.OptunaPlacement`) over
    :func:`~archspec.search._space.language.mask_placement_space`, objective proxy accuracy.

    Raises:
        SpecError: a bad ``windows`` entry, or any input the engine refuses.
    """
    for w in mcfg.windows:
        parse_window(w, "windows")
    space = mask_placement_space(spec, windows=tuple(mcfg.windows), max_masked=mcfg.max_masked)
    cfg = dataclasses.replace(mcfg.search, objective="accuracy")
    summary_extra = {"strategy": "optuna", "spec": spec.name, "windows": list(mcfg.windows),
                     "max_masked": mcfg.max_masked}
    outcome = run_sampled(OptunaPlacement(space, summary_extra), cfg, name)
    outcome.summary.update(summary_extra)
    return outcome
