"""Architecture search ingredients: search spaces, budgets, proxy training, latency.

Modules (import them directly; this package imports nothing heavy on its own):

* :mod:`archspec.search.space`   -- the declarative search-space language, ``load_space``,
  ``mask_placement_space`` (MaiT mode 2);
* :mod:`archspec.search.budget`  -- ``parse_quantity``, ``Budgets``, ``static_check`` (graph only);
* :mod:`archspec.search.proxy`   -- ``ProxyProtocol``, ``proxy_spec``, ``train_proxy``, ``TrialFailure``;
* :mod:`archspec.search.latency` -- ``LatencyProtocol``, ``measure_latency``, ``LatencyCache``.

The proxy training data comes from :mod:`archspec.data` (``load_data``: digits by default, Fashion-MNIST,
CIFAR-10/100, ImageFolder), shared with training and the weight transfers.
"""

from __future__ import annotations

from pathlib import Path

SPACES_DIR = Path(__file__).resolve().parent / "spaces"
DEFAULT_SPACE = SPACES_DIR / "levit_family.yaml"

__all__ = ["SPACES_DIR", "DEFAULT_SPACE"]
