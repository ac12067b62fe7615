"""MaiT mask placement: which heads of which layers take a mask (Li et al. 2022, "MaiT", sec. 4.2, 4.3), torch-free.

A placement maps an attention layer, keyed ``(stage, layer)``, to one flag per head (``True``: the head
takes a hard window mask).  The rules read the Attention Locality Score (eq. 3: the share of a query's
attention inside its window of neighbouring patches, averaged over patch queries; 0..1, unitless), computed
on a trained model by :func:`archspec.diagnostics.metrics.layer_als` (the search's driver is
:mod:`archspec.search._modes.masks`):

* sec. 4.2, assignment (:func:`assign_from_als`): from head 0's ALS ``a`` of a layer whose head 0 was masked,
  ``a >= high`` ("close to 1") masks every head, ``a <= low`` ("close to 0") removes the mask, otherwise
  ("close to 0.5") keeps head 0's mask only;
* sec. 4.2, calibration (:func:`calibrate`): a masked head whose own ALS is ``<= low`` loses its mask;
* sec. 4.3, soft masks (:func:`soft_placement`): a head whose learned ``alpha`` (eq. 4, in (0, 1)) is below a
  threshold learned to suppress its non-neighbours (local) and gets a hard mask; the others stay global;
* the uniform baseline (:func:`normalise_als`): a head attending uniformly over ``N`` tokens scores
  ``u = |window| / N`` on average, 0.05 on MaiT's 14x14 grid but 0.37 on a 4x4 proxy grid, so the rules may
  decide on ``(ALS - u) / (1 - u)`` instead, which reads the same whatever the grid.

Thresholds: the paper says only "close to 1 / 0.5 / 0".  :data:`DEFAULT_ALS_HIGH` (0.8) is the level the paper
reports for the locally-attending first layers (MaiT-T ALS "over 0.8/0.9" in layers 0-7, sec. 5.4, A.2);
:data:`DEFAULT_ALS_LOW` (0.2) sits well below the middle layers' "around 0.5-0.6".
"""

from __future__ import annotations

__all__ = ["Placement", "LayerScores", "DEFAULT_ALS_HIGH", "DEFAULT_ALS_LOW", "assign_from_als", "calibrate",
           "soft_placement", "normalise_als"]

DEFAULT_ALS_HIGH = 0.8
DEFAULT_ALS_LOW = 0.2

Placement = dict[tuple[int, int], list[bool]]  # (stage, layer) -> masked flag per head
LayerScores = dict[tuple[int, int], list[float]]  # (stage, layer) -> ALS per head (eq. 3, 0..1)


def assign_from_als(placement: Placement, als: LayerScores, high: float, low: float) -> tuple[Placement, dict]:
    """Sec. 4.2 step 2 (assignment) from head 0's ALS per layer; returns the new placement and the decision per layer.

    A layer without a score, or whose head 0 was not masked, is left as it is.  Raises nothing."""
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


def calibrate(placement: Placement, als: LayerScores, low: float) -> tuple[Placement, dict]:
    """Sec. 4.2 step 3 (calibration): a masked head whose own ALS is <= ``low`` loses its mask; returns the new
    placement and the decision per layer.  Raises nothing."""
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
    """Sec. 4.3 -> hard placement: learned alpha below ``threshold`` -> mask; above (or unknown, ``None``) -> none."""
    return {key: [a is not None and a < threshold for a in values] for key, values in alphas.items()}


def normalise_als(scores: LayerScores, baselines: dict[tuple[int, int], float]) -> LayerScores:
    """``(ALS - u) / (1 - u)`` clipped to [0, 1], with ``u`` the layer's uniform-attention ALS (``baselines``, 0 where
    missing): 0 = no more local than uniform attention, 1 = all attention inside the window, whatever the grid
    size.  A layer with ``u >= 1`` (the window covers the grid) scores 0.  Raises nothing."""
    out = {}
    for key, values in scores.items():
        u = baselines.get(key, 0.0)
        out[key] = [min(max((v - u) / (1.0 - u), 0.0), 1.0) if u < 1.0 else 0.0 for v in values]
    return out
