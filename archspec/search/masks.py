"""Mode 2 of ``archspec search``: MaiT mask placement for a given spec (``archspec search masks SPEC``).

Three strategies (Li et al. 2022, "MaiT"):

``als`` -- the placement strategy of sec. 4.2, driven by the Attention Locality Score (eq. 3,
    :func:`archspec.diagnostics.metrics.layer_als`, on held-out images):

    1. round 1: a hard mask (``--window``, 3x3) on head 0 of every attention layer, every other mask
       removed; proxy-train; ALS per layer and head;
    2. assignment, per layer ``l`` from head 0's score ``a = ALS[l][0]``:
       ``a >= --als-high`` (default 0.8, "close to 1") -> mask every head of the layer;
       ``a <= --als-low`` (default 0.2, "close to 0") -> remove the mask;
       otherwise ("close to 0.5") -> keep head 0's mask only;
       ``a`` is the ALS *above uniform attention*, ``(ALS - u) / (1 - u)`` with ``u`` the score of a
       uniform map on the layer's grid (:func:`uniform_baselines`; ``--als-raw`` decides on the raw
       ALS instead).  On MaiT's 14x14 grid ``u`` = 0.05 and both agree; on a small proxy grid ``u``
       is large (0.37 on 4x4 with a 3x3 window) and the raw score would call uniform heads local;
    3. rounds 2.. (``--rounds``, default 2: the paper's "2-3 training iterations"): proxy-train the
       current placement, recompute ALS, and calibrate: a masked head whose own ALS is
       ``<= --als-low`` loses its mask.  Stops early once the placement no longer changes.

    Thresholds: the paper says only "close to 1 / 0.5 / 0".  0.8 is the level the paper reports for
    the locally-attending first layers (MaiT-T ALS "over 0.8/0.9" in layers 0-7, sec. 5.4, A.2) and
    0.2 sits well below the middle layers' "around 0.5-0.6"; on a small proxy grid a uniform head
    already scores ``|window| / N`` (e.g. 9/64 = 0.14 on an 8x8 grid), which is why the low
    threshold is not closer to 0 even after the baseline correction.  Both are options.

``optuna`` -- Optuna (TPE) over :func:`archspec.search.space.mask_placement_space`: the number of
    masked heads per group of layers and their window; objective proxy accuracy (the same engine
    as mode 1, :func:`archspec.search.engine.run_optuna_search`).

``soft`` -- sec. 4.3: every head of every attention layer gets a soft mask (non-neighbour logits
    scaled by a learned ``alpha = sigmoid(a)``, initial 0.5); proxy-train; then a head whose learned
    alpha is below ``--alpha-threshold`` (it learned to suppress non-neighbours: local) gets a hard
    mask of the window, the others none (global).

Every strategy writes ``best.yaml`` (the placement on SPEC at its real input size, with
provenance; ``archspec build`` accepts it), an ALS heatmap (layer x head) and ``als.json``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState
from pydantic import ValidationError

from archspec.errors import SpecError, format_path
from archspec.families.attention.heads import HeadSpec, MaskSpec
from archspec.io.datasets import load_data
from archspec.ir.loader import load_spec
from archspec.search import report, runs
from archspec.search.config import MASKS_PROXY_DEFAULTS, MASKS_TRIAL_TIMEOUT_S, complete_config, warmup_warning
from archspec.search.engine import (
    SearchConfig,
    SearchOutcome,
    check_data_path,
    check_outputs,
    open_run,
    quiet_optuna,
    run_lock,
    zombie_notes,
)
from archspec.search.study import mark_worker
from archspec.spec import ArchSpec, ConvStageSpec

__all__ = ["MaskConfig", "run_masks", "attention_layers", "apply_placement", "assign_from_als", "calibrate",
           "soft_placement", "DEFAULT_ALS_HIGH", "DEFAULT_ALS_LOW"]

DEFAULT_ALS_HIGH = 0.8
DEFAULT_ALS_LOW = 0.2
ALS_IMAGES = 128  # held-out images the ALS is averaged over

Placement = dict[tuple[int, int], list[bool]]  # (stage, layer) -> masked flag per head


@dataclass
class MaskConfig:
    """Settings of ``archspec search masks``.

    ``search``: a :class:`~archspec.search.config.SearchConfig`, or a dict of its fields over mode 2's
    defaults (objective ``accuracy``, :data:`~archspec.search.config.MASKS_PROXY_DEFAULTS`,
    :data:`~archspec.search.config.MASKS_TRIAL_TIMEOUT_S`), or ``None`` for those defaults.
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


# ----------------------------------------------------------------------------------- spec surgery
def attention_layers(spec: ArchSpec) -> list[tuple[int, int, list[HeadSpec]]]:
    """``(stage, layer, heads)`` of every token-stage block whose token mixer is attention, in order (a hybrid's conv
    stages, attention inside bottlenecks included, take no MaiT mask: they are skipped)."""
    out = []
    for s in token_stages(spec):
        for l, plan in enumerate(spec.layer_plans(s)):
            if plan.mixer.kind == "attention":
                out.append((s, l, list(plan.heads)))
    return out


def token_stages(spec: ArchSpec) -> list[int]:
    """Indices of the spec's attention (token) stages; a hybrid's conv stages are not among them."""
    return [i for i, stage in enumerate(spec.stages) if not isinstance(stage, ConvStageSpec)]


def _strip_mask(head: HeadSpec) -> HeadSpec:
    return head.model_copy(update={"mask": None}) if head.mask is not None else head


def _with_mask(head: HeadSpec, window: tuple[int, int], mode: str = "hard", alpha_init: float = 0.5) -> HeadSpec:
    mask = MaskSpec(window=window, mode=mode, alpha_init=alpha_init)
    return HeadSpec.model_validate({**head.model_dump(exclude={"mask"}), "mask": mask.model_dump()})


def apply_placement(spec: ArchSpec, heads_of: dict[tuple[int, int], list[HeadSpec]]) -> ArchSpec:
    """``spec`` with the heads of the given (stage, layer) replaced; consecutive equal layers share a range.

    Every attention layer of a touched stage gets an explicit override, so the result does not depend
    on the stage's ``attention`` default (which is set to that default with its mask removed).
    """
    doc = spec.model_dump(mode="json")
    for s, stage in enumerate(spec.stages):
        if not any(key[0] == s for key in heads_of):
            continue
        plans = spec.layer_plans(s)
        rows = []
        for l, plan in enumerate(plans):
            heads = heads_of.get((s, l), plan.heads) if plan.mixer.kind == "attention" else plan.heads
            rows.append((tuple(h.model_dump_json() for h in heads), plan.mixer.model_dump_json(), heads, plan.mixer))
        overrides = []
        start = 0
        for l in range(1, len(rows) + 1):
            if l == len(rows) or rows[l][:2] != rows[start][:2]:
                _, _, heads, mixer = rows[start]
                entry: dict[str, Any] = {"range": [start, l - 1], "heads": [h.model_dump(mode="json") for h in heads]}
                if mixer != stage.mixer:
                    entry["mixer"] = mixer.model_dump(mode="json")
                overrides.append(entry)
                start = l
        default = stage.attention if stage.attention is not None else HeadSpec()
        doc["stages"][s]["attention"] = _strip_mask(default).model_dump(mode="json")
        doc["stages"][s]["layers"] = overrides
    return load_spec(doc)


def placement_heads(spec: ArchSpec, placement: Placement,
                    window: tuple[int, int]) -> dict[tuple[int, int], list[HeadSpec]]:
    """Heads per layer for a boolean placement: masks removed, then a hard ``window`` mask where flagged."""
    out = {}
    for s, l, heads in attention_layers(spec):
        flags = placement.get((s, l), [False] * len(heads))
        out[(s, l)] = [_with_mask(h, window) if flag else _strip_mask(h) for h, flag in zip(heads, flags)]
    return out


def head0_placement(spec: ArchSpec) -> Placement:
    """MaiT sec. 4.2 step 1: head 0 masked in every attention layer."""
    return {(s, l): [h == 0 for h in range(len(heads))] for s, l, heads in attention_layers(spec)}


def assign_from_als(placement: Placement, als: dict[tuple[int, int], list[float]], high: float,
                    low: float) -> tuple[Placement, dict]:
    """Step 2 (assignment) from head 0's ALS per layer; returns the new placement and the decision per layer."""
    new, decisions = {}, {}
    for key, flags in placement.items():
        scores = als.get(key)
        if scores is None or not flags[0]:
            new[key], decisions[key] = list(flags), "no score" if scores is None else "unchanged"
            continue
        a = scores[0]
        if a >= high:
            new[key], decisions[key] = [True] * len(flags), f"mask all (head-0 ALS {a:.2f} >= {high:g})"
        elif a <= low:
            new[key], decisions[key] = [False] * len(flags), f"remove (head-0 ALS {a:.2f} <= {low:g})"
        else:
            new[key], decisions[key] = [True] + [False] * (len(flags) - 1), f"keep head 0 (ALS {a:.2f})"
    return new, decisions


def calibrate(placement: Placement, als: dict[tuple[int, int], list[float]], low: float) -> tuple[Placement, dict]:
    """Step 3 (calibration): a masked head whose own ALS is <= ``low`` loses its mask."""
    new, decisions = {}, {}
    for key, flags in placement.items():
        scores = als.get(key)
        if scores is None:
            new[key], decisions[key] = list(flags), "no score"
            continue
        kept = [flag and scores[h] > low for h, flag in enumerate(flags)]
        removed = [h for h, flag in enumerate(flags) if flag and not kept[h]]
        new[key] = kept
        decisions[key] = f"removed heads {removed} (ALS <= {low:g})" if removed else "unchanged"
    return new, decisions


def soft_placement(alphas: dict[tuple[int, int], list[float | None]], threshold: float) -> Placement:
    """Sec. 4.3 -> hard placement: learned alpha below ``threshold`` -> mask; above (or unknown) -> none."""
    return {key: [a is not None and a < threshold for a in values] for key, values in alphas.items()}


# ----------------------------------------------------------------------------------- model access
def _attention_modules(model) -> dict[tuple[int, int], Any]:
    """(stage, layer) -> the block's :class:`~archspec.families.attention.module.Attention` module."""
    from archspec.families.attention.module import Attention

    out = {}
    tokens = set(token_stages(model.spec))
    for s, stage in enumerate(model.stages):
        if s not in tokens:  # a conv stage (attention inside a bottleneck takes no MaiT mask)
            continue
        for l, block in enumerate(stage.blocks):
            for module in block.modules():
                if isinstance(module, Attention):
                    out[(s, l)] = module
                    break
    return out


def layer_scores(model, images, window: tuple[int, int]) -> dict[tuple[int, int], list[float]]:
    """ALS per head of every attention layer (:func:`archspec.diagnostics.metrics.layer_als`), keyed by
    (stage, layer)."""
    import torch

    from archspec.diagnostics.metrics import layer_als

    modules = _attention_modules(model)
    by_id = {id(m): key for key, m in modules.items()}
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            raw = layer_als(model, images, window=window)
    finally:
        model.train(was)
    out = {}
    for name, values in raw.items():
        key = None
        try:
            key = by_id.get(id(model.get_submodule(name)))
        except AttributeError:
            pass
        if key is None:  # names such as "stages.0.blocks.3" (the block, not its attention module)
            try:
                sub = model.get_submodule(name)
                key = next((by_id[id(m)] for m in sub.modules() if id(m) in by_id), None)
            except AttributeError:
                key = None
        if key is not None:
            out[key] = [float(v) for v in values.detach().flatten().tolist()]
    return out


def uniform_baselines(model, window: tuple[int, int]) -> dict[tuple[int, int], float]:
    """ALS a head would score with uniform attention (every token weight ``1/N``), per attention layer.

    ``ALS_uniform = mean over patch queries of |window neighbours| / N``: 0.05 on MaiT's 14x14 grid with
    a 3x3 window and a class token, but 0.37 on a 4x4 proxy grid -- the level "no locality" sits at.
    Computed with :func:`archspec.diagnostics.metrics.attention_locality_score` on a uniform map.
    """
    import torch

    from archspec.diagnostics.metrics import attention_locality_score, patch_window_mask

    out = {}
    for key, module in _attention_modules(model).items():
        n = module.num_tokens
        mask = patch_window_mask(module.grid, window, module.num_prefix_tokens)
        uniform = torch.full((1, 1, n, n), 1.0 / n)
        out[key] = float(attention_locality_score(uniform, mask, module.num_prefix_tokens)[0])
    return out


def normalise_als(scores: dict[tuple[int, int], list[float]], baselines: dict[tuple[int, int], float]) -> dict:
    """``(ALS - u) / (1 - u)`` clipped to [0, 1], with ``u`` the layer's uniform-attention ALS: 0 = no more
    local than uniform attention, 1 = all attention inside the window, whatever the grid size."""
    out = {}
    for key, values in scores.items():
        u = baselines.get(key, 0.0)
        out[key] = [min(max((v - u) / (1.0 - u), 0.0), 1.0) if u < 1.0 else 0.0 for v in values]
    return out


def _alphas(model) -> dict[tuple[int, int], list[float | None]]:
    """Learned soft-mask alpha per head (None for heads without a soft mask in the trained model)."""
    out = {}
    for key, module in _attention_modules(model).items():
        values: list[float | None] = [None] * module.num_heads
        alpha = module.mask_alpha()
        alpha = alpha.detach() if alpha is not None else None
        if alpha is not None:
            for i, head in enumerate(module.soft_heads):
                values[head] = float(alpha[i])
        out[key] = values
    return out


def train_keeping_model(spec: ArchSpec, data, protocol, seed: int, report=None, progress: str | None = None):
    """``train_proxy`` and the trained model (eval mode): ``(result, model)``; ``progress`` labels the loop's
    progress lines on stderr (``None``: silent)."""
    from archspec.search import proxy

    result = proxy.train_proxy(spec, data, protocol, seed=seed, report=report, progress=progress)
    return result, result.model


# ----------------------------------------------------------------------------------- labels / plots
def _label(spec: ArchSpec, key: tuple[int, int]) -> str:
    s, l = key
    return f"s{s}.l{l}" if len(spec.stages) > 1 else f"layer {l}"


def _als_table(spec: ArchSpec, als: dict, placement: Placement | None) -> tuple[dict, dict]:
    keys = [(s, l) for s, l, _ in attention_layers(spec) if (s, l) in als]
    scores = {_label(spec, k): als[k] for k in keys}
    masked = {_label(spec, k): placement[k] for k in keys} if placement else None
    return scores, masked


def _placement_json(spec: ArchSpec, placement: Placement) -> dict:
    return {_label(spec, k): [int(f) for f in v] for k, v in placement.items()}


def _window(text: str, option: str) -> tuple[int, int]:
    try:
        return MaskSpec(window=text).window
    except ValidationError as exc:
        raise SpecError.single((option,),
                               f"invalid window {text!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}",
                               "e.g. 3x3, 3x5, 5x5 (odd sides)") from None


# ----------------------------------------------------------------------------------- entry point
def _masks_search_config(search: Any) -> SearchConfig:
    """Mode 2's :class:`SearchConfig`: ``search`` itself, or a dict of fields over mode 2's defaults."""
    if isinstance(search, SearchConfig):
        return complete_config(search)
    options = dict(search or {})
    protocol = options.pop("protocol", None)
    if isinstance(protocol, dict | None):
        protocol = {**MASKS_PROXY_DEFAULTS, **(protocol or {})}
    defaults = {"objective": "accuracy", "trial_timeout": MASKS_TRIAL_TIMEOUT_S, "fidelity": "none"}
    return complete_config(None, **{**defaults, **options, "protocol": protocol})


def run_masks(mcfg: MaskConfig | None = None, /, **options: Any) -> SearchOutcome:
    """Mode 2, MaiT mask placement (``archspec search masks SPEC``), from Python.

    ``mcfg`` is a :class:`MaskConfig`; ``options`` replace its fields (or make one):
    ``run_masks(spec="mait_tiny_sch2", strategy="als", search={"out": "runs", "data": "fashion-mnist"})``.
    Returns a :class:`~archspec.search.config.SearchOutcome` (``.best_spec``: the spec with its masks placed).

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
    if spec.n_conv_stages and not attention_layers(spec):
        raise SpecError.single(("SPEC",), f"spec {spec.name!r} has no attention stage: mask placement puts MaiT "
                               "masks on the heads of token stages (attention inside bottlenecks takes none)",
                               "a hybrid needs attention stages after its conv stages (e.g. levit_graft_r50s1_deit9)")
    if not attention_layers(spec):
        raise SpecError.single(("SPEC",), f"spec {spec.name!r} has no attention layer to place masks in")
    if mcfg.strategy not in ("als", "optuna", "soft"):
        raise SpecError.single(("--strategy",), f"unknown strategy {mcfg.strategy!r}", "als, optuna or soft")
    cfg = mcfg.search
    name = cfg.study_name or f"masks-{spec.name}-{mcfg.strategy}"[:80]
    if mcfg.strategy == "optuna":
        return _run_optuna(spec, mcfg, name)
    high = DEFAULT_ALS_HIGH if mcfg.als_high is None else mcfg.als_high
    low = DEFAULT_ALS_LOW if mcfg.als_low is None else mcfg.als_low
    if not 0.0 <= low < high <= 1.0:
        raise SpecError.single(("--als-low",), f"need 0 <= --als-low < --als-high <= 1, got {low:g} and {high:g}")
    if not 0.0 < mcfg.alpha_threshold < 1.0:
        raise SpecError.single(("--alpha-threshold",), f"alpha lies in (0, 1); got {mcfg.alpha_threshold:g}")
    window = _window(mcfg.window, "--window")
    _first_spec(spec, mcfg.strategy, window)  # a window that does not fit the token grid fails here
    check_data_path(cfg.data)
    check_outputs(cfg, name)
    # Decoding every image is the last input check: nothing is written before it passes.
    data = load_data(cfg.data, image_size=cfg.protocol.image_size, seed=cfg.seed, max_images=cfg.max_images)
    return _run_training_strategy(spec, mcfg, name, window, high, low, data)


def _first_spec(spec: ArchSpec, strategy: str, window: tuple[int, int]) -> ArchSpec:
    """The spec the first training round of ``als`` / ``soft`` trains.

    Raises:
        SpecError: the masks do not fit ``spec`` (e.g. ``--window 99x99`` on a 14 x 14 token grid).
    """
    try:
        if strategy == "soft":
            return apply_placement(spec, _soft_heads(spec, window))
        return apply_placement(spec, placement_heads(spec, head0_placement(spec), window))
    except SpecError as exc:
        raise SpecError([dataclasses.replace(p, path=("--window",), file=None, line=None, column=None,
                                             message=f"{window[0]}x{window[1]} masks do not fit {spec.name!r}: "
                                                     f"{format_path(p.path)}: {p.message}")
                         for p in exc.problems]) from None


def _soft_heads(spec: ArchSpec, window: tuple[int, int]) -> dict[tuple[int, int], list[HeadSpec]]:
    """MaiT sec. 4.3: a soft ``window`` mask on every head of every attention layer."""
    return {(s, l): [_with_mask(_strip_mask(h), window, "soft") for h in heads]
            for s, l, heads in attention_layers(spec)}


def _run_optuna(spec: ArchSpec, mcfg: MaskConfig, name: str) -> SearchOutcome:
    """``--strategy optuna``: the engine's Optuna search over :func:`~archspec.search.space.mask_placement_space`,
    objective proxy accuracy, with :class:`_AlsHooks` recording ALS."""
    from archspec.search.engine import run_optuna_search
    from archspec.search.space import mask_placement_space

    for w in mcfg.windows:
        _window(w, "--windows")
    space = mask_placement_space(spec, windows=tuple(mcfg.windows), max_masked=mcfg.max_masked)
    cfg = dataclasses.replace(mcfg.search, objective="accuracy")
    hooks = _AlsHooks()
    summary_extra = {"strategy": "optuna", "spec": spec.name, "windows": list(mcfg.windows),
                     "max_masked": mcfg.max_masked}
    outcome = run_optuna_search(space, cfg, mode="masks/optuna", name=name, extra_attrs=summary_extra,
                                train_fn=hooks.train, after_train=hooks.after_train, finalize_extra=hooks.finalize)
    outcome.summary.update(summary_extra)
    return outcome


class _AlsHooks:
    """``--strategy optuna``'s hooks into :func:`~archspec.search.engine.run_optuna_search`: the ALS (3x3 window,
    on :data:`ALS_IMAGES` held-out images) of every trained trial, then the best trial's heatmap and als.json."""

    def __init__(self) -> None:
        self.images = None  # the held-out images, taken from the data of the first training

    def train(self, trained_spec, data, protocol, seed=0, report=None, on_model=None):
        """:func:`~archspec.search.proxy.train_proxy`, keeping the first :data:`ALS_IMAGES` validation images."""
        from archspec.search import proxy

        if self.images is None:
            self.images = data.val.tensors[0][:ALS_IMAGES]
        return proxy.train_proxy(trained_spec, data, protocol, seed=seed, report=report, on_model=on_model)

    def after_train(self, trial, trained_spec, result) -> None:
        """ALS per layer and head of the trained model on the trial (user attr ``als``)."""
        model = getattr(result, "model", None)
        if model is None or self.images is None:
            return
        try:
            scores = layer_scores(model, self.images, (3, 3))
            trial.set_user_attr("als", {f"{s}.{l}": v for (s, l), v in scores.items()})
        except Exception:  # noqa: BLE001 - ALS is a diagnostic; never fail a trained trial over it
            pass

    def finalize(self, study, run_dir, summary, files, best_file):
        """als.png and als.json of the best trial, when it has ALS; never replaces ``best_file`` (returns None)."""
        best = summary.get("best_trial")
        if best is None:
            return None
        trial = study.trials[best]
        scores = trial.user_attrs.get("als")
        if scores:
            best_spec = load_spec(trial.user_attrs["spec"])
            keys = {tuple(int(p) for p in k.split(".")): v for k, v in scores.items()}
            placement = {(s, l): [h.mask is not None for h in heads] for s, l, heads in attention_layers(best_spec)}
            table, masked = _als_table(best_spec, keys, placement)
            runs.atomic_write_text(run_dir / "als.json", report.summary_json({"trial": best, "window": "3x3",
                                                                               "als": table,
                                                                               "masked": masked}))
            report.plot_als_heatmap(table, run_dir / "als.png",
                                    f"{summary['study']}: ALS of best trial {best} (3x3 window)",
                                    masked)
            files.extend(["als.png", "als.json"])
        return None


def _run_training_strategy(spec: ArchSpec, mcfg: MaskConfig, name: str, window: tuple[int, int], high: float,
                           low: float, data) -> SearchOutcome:
    """The ``als`` and ``soft`` strategies: train rounds of ``spec`` (:class:`_MaskRun`), write the run directory."""
    run = _MaskRun(spec, mcfg, name, window, high, low, data)
    interrupted = False
    placement: Placement | None = None
    extra: dict = {}
    try:
        placement, extra = run.als_rounds() if mcfg.strategy == "als" else run.soft_round()
    except KeyboardInterrupt:
        interrupted = True
        run.notes.append("interrupted: re-run the same command to start again (finished rounds stay in the study)")
    return run.finish(placement, extra, interrupted)


class _MaskRun:
    """One ``als`` / ``soft`` mask-placement run: its study (one trial per trained round), run directory, notes
    and round log.  MaiT sec. 4.2: ALS rounds assign then calibrate the masks; soft masking reads the learned
    alphas (eq. 4)."""

    def __init__(self, spec: ArchSpec, mcfg: MaskConfig, name: str, window: tuple[int, int], high: float,
                 low: float, data) -> None:
        from archspec.search.latency import LatencyCache

        self.spec, self.mcfg, self.name, self.window, self.high, self.low, self.data = \
            spec, mcfg, name, window, high, low, data
        self.cfg = cfg = mcfg.search
        self.wall_start = time.perf_counter()
        attrs = {"mode": f"masks/{mcfg.strategy}", "spec": spec.name, "strategy": mcfg.strategy,
                 "proxy": cfg.protocol.describe(), "data": cfg.data or "embedded", "seed": cfg.seed,
                 "thresholds": {"als_high": high, "als_low": low, "alpha_threshold": mcfg.alpha_threshold},
                 "window": list(window), "rounds": mcfg.rounds}
        # heartbeat None: ask/tell rounds; zombies are found by pid
        self.run_dir, self.info, self.study = open_run(cfg, name, ["maximize"], ["accuracy"], attrs,
                                                       optuna.samplers.RandomSampler(seed=cfg.seed), None,
                                                       heartbeat=None)
        self.notes: list[str] = zombie_notes(self.study)
        self.x_val = data.val.tensors[0][:ALS_IMAGES]
        self.cache = LatencyCache(self.run_dir / "latency.json")
        self.files: list[str] = []
        self.rounds_log: list[dict] = []
        self.rounds_dir = self.run_dir / "rounds"
        self.baselines: dict[tuple[int, int], float] = {}
        self.chance = 1.0 / max(data.num_classes, 1)

    def check_learned(self, label: str, accuracy: float) -> None:
        """Note a round whose proxy accuracy is near chance: its attention says little."""
        if accuracy < 1.5 * self.chance:
            self.notes.append(f"{label}: proxy accuracy {accuracy:.3f} is near chance ({self.chance:.3f}): the model "
                              "hardly learned, so its attention (and the placement read from it) says little; raise "
                              "--proxy-steps or --proxy-lr")

    def train_round(self, round_index: int, round_spec: ArchSpec, label: str):
        """Train ``round_spec`` as one trial: ``(result, model, ALS per layer, trial number)``, or ``(None, None,
        None, number)`` when it failed (the reason is on the trial and in the notes)."""
        trial = self._ask_round(round_index, round_spec)
        try:
            result, model, scores = self._train_and_score(trial, round_spec)
        except KeyboardInterrupt:
            trial.set_user_attr("fail_reason", "interrupted (Ctrl-C / SIGINT)")
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        except Exception as exc:  # noqa: BLE001 - recorded on the trial, then reported
            reason = str(getattr(exc, "reason", "")) or f"{type(exc).__name__}: {exc}"
            trial.set_user_attr("fail_reason", reason[:1000])
            self.study.tell(trial, state=TrialState.FAIL)
            self.notes.append(f"{label} (trial {trial.number}) failed: {reason}")
            return None, None, None, trial.number
        self.study.tell(trial, float(result.accuracy))
        return result, model, scores, trial.number

    def _ask_round(self, round_index: int, round_spec: ArchSpec):
        """A new trial for a training round, with its strategy, round, spec, MACs and params."""
        from archspec.ir.analysis import analyze

        trial = self.study.ask()
        mark_worker(trial)
        trial.set_user_attr("strategy", self.mcfg.strategy)
        trial.set_user_attr("round", round_index)
        trial.set_user_attr("spec", round_spec.model_dump(mode="json"))
        analysis = analyze(round_spec)
        trial.set_user_attr("macs", int(analysis.macs))
        trial.set_user_attr("params", int(analysis.params))
        return trial

    def _train_and_score(self, trial, round_spec: ArchSpec):
        """Latency, proxy training and ALS of one round, on the trial: ``(result, model, ALS per layer)``.

        Raises:
            RuntimeError: training diverged (a non-finite loss or accuracy); any failure of the training itself.
        """
        from archspec.search.latency import measure_latency

        cfg = self.cfg
        trial.set_user_attr("latency_ms", float(measure_latency(round_spec, cfg.latency, self.cache)))
        start = time.perf_counter()
        label = f"{self.mcfg.strategy} round {trial.user_attrs.get('round', '?')}" if cfg.progress else None
        result, model = train_keeping_model(round_spec, self.data, cfg.protocol, cfg.seed, progress=label)
        trial.set_user_attr("train_seconds", round(time.perf_counter() - start, 3))
        for key in ("accuracy", "val_loss", "train_loss"):
            trial.set_user_attr(key, float(getattr(result, key)))
        if not all(math.isfinite(float(getattr(result, k))) for k in ("accuracy", "val_loss", "train_loss")):
            raise RuntimeError("non-finite loss (training diverged)")
        scores = layer_scores(model, self.x_val, self.window)
        self.baselines.update(uniform_baselines(model, self.window))
        trial.set_user_attr("als", {f"{s}.{l}": v for (s, l), v in scores.items()})
        return result, model, scores

    def als_rounds(self) -> tuple[Placement | None, dict]:
        """ALS strategy: round 1 assigns masks from ALS (high/low thresholds), later rounds calibrate; stops when a
        calibration changes nothing.  Returns the last placement and ``{"rounds": log}``."""
        spec, window = self.spec, self.window
        placement, final = head0_placement(spec), None
        for r in range(1, self.mcfg.rounds + 1):
            round_spec = apply_placement(spec, placement_heads(spec, placement, window))
            result, _, scores, number = self.train_round(r, round_spec, f"round {r}")
            if result is None:
                break
            self.check_learned(f"round {r}", result.accuracy)
            new = self._decide_round(r, number, result.accuracy, scores, placement)
            runs.atomic_write_text(self.rounds_dir / f"round{r}.yaml", provenance_free_yaml(round_spec))
            changed, placement = new != placement, new
            final = placement
            if r >= 2 and not changed:
                self.notes.append(f"placement unchanged by the calibration of round {r}: stopped")
                break
        return final, {"rounds": self.rounds_log}

    def _decide_round(self, r: int, number: int, accuracy: float, scores: dict, placement: Placement) -> Placement:
        """Round ``r``'s decision from its ALS ``scores``: assignment (round 1) or calibration; plots the heatmap,
        logs the round, returns the next placement."""
        spec, window = self.spec, self.window
        decide = normalise_als(scores, self.baselines) if self.mcfg.normalise else scores
        table, masked = _als_table(spec, decide, placement)
        raw_table, _ = _als_table(spec, scores, placement)
        what = "ALS above uniform, (ALS-u)/(1-u)" if self.mcfg.normalise else "ALS (eq. 3)"
        report.plot_als_heatmap(table, self.run_dir / f"als_round{r}.png",
                                f"{self.name}: round {r}, {what}, {window[0]}x{window[1]} window, trial {number}",
                                masked, (self.high, self.low))
        self.files.append(f"als_round{r}.png")
        if r == 1:
            new, decisions = assign_from_als(placement, decide, self.high, self.low)
        else:
            new, decisions = calibrate(placement, decide, self.low)
        self.rounds_log.append({
            "round": r, "trial": number, "step": "assignment" if r == 1 else "calibration",
            "accuracy": accuracy, "placement_trained": _placement_json(spec, placement), "als": raw_table,
            "als_decided_on": table,
            "uniform_baseline": {_label(spec, k): round(v, 4) for k, v in self.baselines.items()},
            "decisions": {_label(spec, k): v for k, v in decisions.items()},
            "placement_next": _placement_json(spec, new)})
        if self.cfg.progress:
            for key, text in decisions.items():
                print(f"round {r}: {_label(spec, key)}: {text}", file=sys.stderr, flush=True)
        return new

    def soft_round(self) -> tuple[Placement | None, dict]:
        """Soft strategy: train every head soft-masked, keep a hard mask where the learned alpha is below the
        threshold.  Returns the placement (None if training failed) and the alphas / ALS record."""
        spec, window = self.spec, self.window
        soft_spec = apply_placement(spec, _soft_heads(spec, window))
        result, model, scores, number = self.train_round(1, soft_spec, "soft-mask training")
        if result is None:
            return None, {}
        self.check_learned("soft-mask training", result.accuracy)
        alphas = _alphas(model)
        placement = soft_placement(alphas, self.mcfg.alpha_threshold)
        unknown = [_label(spec, k) for k, v in alphas.items() if any(a is None for a in v)]
        if unknown:
            self.notes.append(f"layers {unknown}: the window covers the whole proxy token grid, so the proxy model "
                              "had no soft mask there (no alpha learned): left global")
        table, masked = _als_table(spec, scores, placement)
        report.plot_als_heatmap(table, self.run_dir / "als.png",
                              f"{self.name}: ALS of the soft-masked model ({window[0]}x{window[1]}), trial {number}",
                              masked, None)
        self.files.append("als.png")
        runs.atomic_write_text(self.rounds_dir / "soft.yaml", provenance_free_yaml(soft_spec))
        return placement, {"alphas": {_label(spec, k): v for k, v in alphas.items()}, "als": table, "trial": number,
                           "accuracy": result.accuracy, "placement": _placement_json(spec, placement)}

    def finish(self, placement: Placement | None, extra: dict, interrupted: bool) -> SearchOutcome:
        """Write trials.csv, best.yaml (when a placement was decided and not interrupted), als.json and
        summary.json."""
        mcfg, cfg, window, data = self.mcfg, self.cfg, self.window, self.data
        summary = {
            "mode": f"masks/{mcfg.strategy}", "study": self.name, "storage": self.info.url,
            "run_dir": str(self.run_dir),
            "strategy": mcfg.strategy, "spec": self.spec.name, "window": f"{window[0]}x{window[1]}",
            "thresholds": ({"als_high": self.high, "als_low": self.low} if mcfg.strategy == "als"
                           else {"alpha_threshold": mcfg.alpha_threshold}),
            "data": data.describe() if hasattr(data, "describe") else {"name": getattr(data, "name", None)},
            "proxy": cfg.protocol.describe(), "latency_protocol": dataclasses.asdict(cfg.latency), "seed": cfg.seed,
            "notes": self.notes, "interrupted": interrupted, **extra,
        }
        best_file = None
        empty = self._empty_note(placement, interrupted)
        if empty is not None:
            summary["notes"].insert(0, empty)
            summary["no_locality"] = True
        with run_lock(self.run_dir):
            self._summarise_trials(summary, placement)
            if placement is not None and not interrupted:
                best_file = self._write_best(summary, placement, extra)
            else:
                summary["notes"].append("no placement decided: no best.yaml written")
            als_blob = {"window": f"{window[0]}x{window[1]}", "strategy": mcfg.strategy, **extra}
            runs.atomic_write_text(self.run_dir / "als.json", report.summary_json(als_blob))
            self.files += ["als.json", "summary.json"]
            summary["files"] = self.files
        summary["wall_seconds"] = round(time.perf_counter() - self.wall_start, 2)
        runs.atomic_write_text(self.run_dir / "summary.json", report.summary_json(summary))
        return SearchOutcome(self.study, summary, self.run_dir, interrupted, best_file)

    def _empty_note(self, placement: Placement | None, interrupted: bool) -> str | None:
        """The note for a placement that masks no head at all (MaiT's rule found no local layer): what it means
        and what to try; ``None`` when some head stays masked (or nothing was decided)."""
        if placement is None or interrupted or any(sum(v) for v in placement.values()):
            return None
        steps = self.cfg.protocol.steps
        if self.mcfg.strategy == "soft":
            return (f"no layer became local after {steps} proxy steps: no learned alpha fell below "
                    f"{self.mcfg.alpha_threshold:g}, so best.yaml is the unmasked model; train longer with "
                    "--proxy-steps, or use a larger --proxy-size")
        return (f"no layer became local after {steps} proxy steps: no masked head reached ALS {self.high:g}, so "
                "best.yaml is the unmasked model; train longer with --proxy-steps, or use --strategy soft")

    def _summarise_trials(self, summary: dict, placement: Placement | None) -> None:
        """trials.csv, and the study's counts, failures and median trial time into ``summary``."""
        trials = self.study.get_trials(deepcopy=False)
        report.write_trials_csv(trials, self.run_dir / "trials.csv")
        self.files.insert(0, "trials.csv")
        done = [t for t in trials if t.state == TrialState.COMPLETE]
        summary["counts"] = {"trained": len(done), "failed": sum(t.state == TrialState.FAIL for t in trials)}
        summary["trained_this_run"] = (len(self.rounds_log) if self.mcfg.strategy == "als"
                                       else int(placement is not None))
        summary["notes"].extend(_round_lines(self.rounds_log))
        summary["failures"] = [{"trial": t.number, "reason": t.user_attrs.get("fail_reason", "unknown")}
                               for t in trials if t.state == TrialState.FAIL]
        durations = [t.duration.total_seconds() for t in done if t.duration is not None]
        summary["per_trial_seconds"] = round(sorted(durations)[len(durations) // 2], 2) if durations else None

    def _write_best(self, summary: dict, placement: Placement, extra: dict):
        """best.yaml: ``spec`` with the decided placement, and its provenance; returns its path."""
        from archspec.ir.analysis import analyze

        spec, window, rounds_log = self.spec, self.window, self.rounds_log
        final_spec = apply_placement(spec, placement_heads(spec, placement, window))
        analysis = analyze(final_spec)
        masked_total = sum(sum(v) for v in placement.values())
        prov = {
            "study": self.name, "trial": [r["trial"] for r in rounds_log] or extra.get("trial"),
            "strategy": self.mcfg.strategy, "storage": self.info.url, "source_spec": spec.name,
            "objectives": {"proxy_accuracy_of_last_trained_round": (rounds_log[-1]["accuracy"] if rounds_log
                                                                    else extra.get("accuracy"))},
            "macs": analysis.macs, "params": analysis.params, "input": list(final_spec.input.resolution),
            "window": f"{window[0]}x{window[1]}", "thresholds": summary["thresholds"],
            "placement": _placement_json(spec, placement), "masked_heads": masked_total,
            "data": summary["data"], "proxy": summary["proxy"], "seed": self.cfg.seed, "created": runs.now_iso(),
        }
        if summary.get("no_locality"):
            prov["note"] = summary["notes"][0]
        _, text = runs.emit_spec(final_spec, None, f"{spec.name}_{self.mcfg.strategy}"[:100], prov)
        best_file = runs.atomic_write_text(self.run_dir / "best.yaml", text)
        self.files.insert(0, "best.yaml")
        summary.update(best=str(best_file), masked_heads=masked_total, placement=_placement_json(spec, placement))
        summary["pareto"] = [{"rank": 0,
                              "trial": prov["trial"] if isinstance(prov["trial"], int) else prov["trial"][-1],
                              "accuracy": prov["objectives"]["proxy_accuracy_of_last_trained_round"],
                              "latency_ms": None, "macs": analysis.macs, "params": analysis.params,
                              "file": "best.yaml"}]
        summary["table_title"] = ("final placement (accuracy: the last trained round; the final placement "
                                  "itself is untrained)")
        return best_file


def _round_lines(rounds_log: list[dict]) -> list[str]:
    lines = []
    for r in rounds_log:
        kinds: dict[str, int] = {}
        for text in r["decisions"].values():
            word = text.split(" (")[0]
            kinds[word] = kinds.get(word, 0) + 1
        lines.append(f"round {r['round']} ({r['step']}, trial {r['trial']}, proxy acc {r['accuracy']:.3f}): "
                     + ", ".join(f"{n} layers {k}" for k, n in kinds.items()))
    return lines


def provenance_free_yaml(spec: ArchSpec) -> str:
    """The plain YAML of a spec (round specs are diagnostics, not results)."""
    from archspec.spec import spec_to_yaml

    return "# a mask-placement round of `archspec search masks` (diagnostic; see best.yaml)\n" + spec_to_yaml(spec)
