"""MaiT's placement rule (archspec.families.attention.placement) on hand-made scores, torch-free; and the search
mode contract the strategies implement."""

from __future__ import annotations

import subprocess
import sys

import pytest

from archspec.families.attention.placement import assign_from_als, calibrate, normalise_als, soft_placement
from archspec.search._engine.mode import RoundsMode


def test_assignment_sec_4_2():
    placement = {(0, 0): [True, False], (0, 1): [True, False], (0, 2): [True, False], (0, 3): [False, False]}
    als = {(0, 0): [0.9, 0.1], (0, 1): [0.1, 0.1], (0, 2): [0.5, 0.5], (0, 3): [0.9, 0.9]}
    new, decisions = assign_from_als(placement, als, high=0.8, low=0.2)
    assert new == {(0, 0): [True, True], (0, 1): [False, False], (0, 2): [True, False], (0, 3): [False, False]}
    assert decisions[(0, 0)].startswith("mask all") and decisions[(0, 3)] == "unchanged"


def test_calibration_removes_masked_heads_at_or_below_low():
    new, decisions = calibrate({(0, 0): [True, True], (0, 1): [True, False]}, {(0, 0): [0.9, 0.2]}, low=0.2)
    assert new == {(0, 0): [True, False], (0, 1): [True, False]}
    assert decisions == {(0, 0): "removed heads [1] (ALS <= 0.2)", (0, 1): "no score"}


def test_soft_alphas_and_uniform_baseline():
    assert soft_placement({(0, 0): [0.3, 0.7, None]}, 0.5) == {(0, 0): [True, False, False]}
    out = normalise_als({(0, 0): [0.37, 1.0, 0.1], (0, 1): [0.5]}, {(0, 0): 0.37, (0, 1): 1.0})
    assert out == {(0, 0): [0.0, 1.0, 0.0], (0, 1): [0.0]}


def test_placement_rule_imports_no_torch():
    code = "import sys, archspec.families.attention.placement; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"


def test_masks_keeps_its_public_names():
    from archspec.families.attention import placement
    from archspec.search._modes import masks

    assert masks.assign_from_als is placement.assign_from_als and masks.calibrate is placement.calibrate
    assert masks.DEFAULT_ALS_HIGH == 0.8 and masks.DEFAULT_ALS_LOW == 0.2
    assert all(hasattr(masks, name) for name in masks.__all__)


def test_a_rounds_mode_must_propose_observe_and_write():
    with pytest.raises(TypeError):
        RoundsMode()


def test_mask_proxy_defaults_warm_up_within_their_training():
    """The default mask proxy peaks at its lr (issue 37: 1e-3, the rate at which round 1's heads became local): its
    warm-up ends before its last step, so the run prints no warm-up warning and trains at that rate."""
    from archspec.search._engine.config import MASKS_PROXY_DEFAULTS, warmup_warning
    from archspec.search._evaluation.proxy import ProxyProtocol

    protocol = ProxyProtocol(**MASKS_PROXY_DEFAULTS)
    assert warmup_warning(protocol) is None and protocol.warmup_steps < protocol.steps
    assert warmup_warning(ProxyProtocol(**{**MASKS_PROXY_DEFAULTS, "steps": 3})) is not None  # the check can fail
