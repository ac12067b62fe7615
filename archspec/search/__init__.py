"""Architecture search: the engine, its two modes (thin clients), and their ingredients.

Modules (import them directly; this package imports nothing heavy on its own):

* :mod:`archspec.search.engine`  -- the shared Optuna engine: ``run_optuna_search``, the run directory
  (``open_run``, ``run_lock``), the trial objective, failures, deadlines and stop rules;
* :mod:`archspec.search.config`  -- ``SearchConfig``, ``SearchOutcome`` and the defaults (no Optuna, no torch);
* :mod:`archspec.search.design`  -- mode 1, design under budgets: ``run_design``;
* :mod:`archspec.search.masks`   -- mode 2, MaiT mask placement: ``run_masks``;
* :mod:`archspec.search.report`  -- progress, trials.csv, the Pareto / best specs, plots, the printed summary;
* :mod:`archspec.search.runs`    -- run-directory files: marker, atomic writes, specs with provenance;
* :mod:`archspec.search.cli`     -- ``archspec search`` (the command-line client of the two modes);
* :mod:`archspec.search.space`   -- the declarative search-space language, ``load_space``,
  ``mask_placement_space`` (MaiT mode 2);
* :mod:`archspec.search.budget`  -- ``parse_quantity``, ``Budgets``, ``static_check`` (graph only);
* :mod:`archspec.search.proxy`   -- ``ProxyProtocol``, ``proxy_spec``, ``train_proxy``, ``TrialFailure``;
* :mod:`archspec.search.latency` -- ``LatencyProtocol``, ``measure_latency``, ``LatencyCache``;
* :mod:`archspec.search.zero_cost` -- zero-cost proxies before training: ``naswot``, ``synflow``, ``grad_norm``,
  ``zero_cost_scores``;
* :mod:`archspec.search.study`   -- storages, samplers, resume, zombie trials; :mod:`archspec.search.fidelity`
  -- multi-fidelity rungs.

The proxy training data comes from :mod:`archspec.data` (``load_data``: digits by default, Fashion-MNIST,
CIFAR-10/100, ImageFolder), shared with training and the weight transfers.
"""

from __future__ import annotations

from pathlib import Path

SPACES_DIR = Path(__file__).resolve().parent / "spaces"
DEFAULT_SPACE = SPACES_DIR / "levit_family.yaml"

__all__ = ["SPACES_DIR", "DEFAULT_SPACE"]
