"""Mask placement on models of any input size (issue 80, item 2).

The search decodes its data once at ``protocol.image_size`` (64 px by default) and trains each proxy at the size
that gives the candidate its token grid (``proxy_spec``): 64 px for MaiT's 224 px specs at ``min_grid`` 8, but
32 px for a 32 px spec with patch 4, 48 px for a 48 px spec.  The ALS was read on the 64 px images whatever the
proxy's size, so every round failed ("Input height (64) doesn't match model (32)") except where the two sizes met
by chance.  These runs cross input sizes, patch sizes, proxy grids and strategies; each must read an ALS for every
head of every layer (MaiT eq. 3 lies in [0, 1]) and fail no round.
"""

from __future__ import annotations

import json

import pytest

from archspec import load_spec
from archspec.search import run_masks
from archspec.search._evaluation.protocols import ProxyProtocol
from archspec.search._evaluation.proxy import proxy_geometry

PROTOCOL = {"steps": 1, "eval_every": 1, "batch_size": 8, "warmup_steps": 1, "threads": 1}
LATENCY = {"repeats": 1, "warmup": 0}


def _vit(resolution: int, patch: int, depth: int = 2) -> dict:
    return {"name": f"vit_{resolution}_p{patch}", "input": {"channels": 3, "resolution": resolution},
            "stem": {"kind": "patch", "patch_size": patch}, "tokens": {"cls_token": "input", "pos_embed": "learned"},
            "stages": [{"depth": depth, "dim": 16, "heads": 2, "attention": "mhsa"}],
            "head": {"pool": "cls", "num_classes": 10}}


CASES = [  # (spec, min_grid): the proxy's input side is printed in the id
    pytest.param(_vit(32, 4), 8, id="32px-patch4-grid8-proxy32"),
    pytest.param(_vit(32, 4), None, id="32px-patch4-real-proxy32"),
    pytest.param(_vit(64, 4), None, id="64px-patch4-real-proxy64"),
    pytest.param(_vit(48, 8), 8, id="48px-patch8-grid6-proxy48"),
    pytest.param(_vit(96, 8), None, id="96px-patch8-real-grid12-proxy60"),
]


@pytest.mark.slow  # a proxy training of one step per round, a few seconds each
@pytest.mark.parametrize("doc, min_grid", CASES)
@pytest.mark.parametrize("strategy", ["als", "soft", "optuna"])
def test_mask_placement_reads_the_als_at_the_proxys_own_size(tmp_path, one_thread, doc, min_grid, strategy):
    """``optuna`` read the ALS inside a guard that never fails a trial, so its als.json was silently missing."""
    spec = load_spec(doc)
    outcome = run_masks(spec=spec, strategy=strategy, rounds=1, windows=("3x3",),
                        search={"out": tmp_path / "runs", "max_images": 40, "latency": LATENCY, "progress": False,
                                "trials": 1, "protocol": {**PROTOCOL, "min_grid": min_grid}})
    assert not any("failed" in note for note in outcome.summary["notes"]), outcome.summary["notes"]
    als = json.loads((tmp_path / "runs" / "als.json").read_text())
    scores = als["rounds"][0]["als"] if strategy == "als" else als["als"]  # soft: the soft-masked model's
    assert len(scores) == 2  # both layers scored
    assert all(len(heads) == 2 and all(0.0 <= a <= 1.0 for a in heads) for heads in scores.values())
    assert outcome.best_spec is not None


def test_the_cases_cover_proxy_sizes_other_than_the_decoded_64_px():
    """The cases above are not all 64 px proxies (where the old code happened to work): the proxy's input size by
    its own rule (``proxy_geometry``), against the 64 px the data are decoded at."""
    class Data:  # the two fields the proxy's geometry reads
        channels, num_classes = 3, 10

    sizes = []
    for case in CASES:
        doc, min_grid = case.values
        protocol = ProxyProtocol(image_size=64, min_grid=min_grid)
        sizes.append(proxy_geometry(load_spec(doc), Data(), protocol)[0].image_size)
    assert sizes == [(32, 32), (32, 32), (64, 64), (48, 48), (60, 60)]
