"""Architecture search: the engine, its two modes (thin clients), and their ingredients.

The Python API (what ``archspec search`` calls; each name is imported on first use, so
``import archspec.search`` stays light)::

    from archspec.search import run_design, run_masks, load_space

    result = run_design(budgets={"macs": "1G"}, trials=8, out="runs", fidelity="zc")
    result.study, result.pareto_specs, result.best_spec      # optuna.Study, [ArchSpec], ArchSpec

    result = run_masks(spec="mait_tiny_sch2", strategy="als", search={"out": "runs"})

    space = load_space()                   # the embedded LeViT-family space, or a YAML path / dict
    def objective(trial):                  # your own Optuna objective
        spec = space.sample(trial)         # an ArchSpec; compile(spec) is the model
        ...

Modules (import them directly; this package imports nothing heavy on its own):

* :mod:`archspec.search.mode`    -- the contract of a search mode: ``SampledMode`` (a space Optuna samples),
  ``RoundsMode`` (candidates proposed from earlier results), ``Candidate``, ``RoundResult``, ``RunContext``;
* :mod:`archspec.search.engine`  -- the shared Optuna engine: ``run_sampled``, ``run_rounds`` (and
  ``run_optuna_search``); its parts :mod:`~archspec.search.rundir` (run directory, lock, resume),
  :mod:`~archspec.search.preflight` (input checks), :mod:`~archspec.search.objective` (one candidate),
  :mod:`~archspec.search.rungs` (rungs and stop rules), :mod:`~archspec.search.failures`,
  :mod:`~archspec.search.rounds` (one proposed round);
* :mod:`archspec.search.config`  -- ``SearchConfig``, ``SearchOutcome`` and the defaults (no Optuna, no torch);
* :mod:`archspec.search.design`  -- mode 1, design under budgets: ``run_design``;
* :mod:`archspec.search.masks`   -- mode 2, MaiT mask placement: ``run_masks``; its strategies
  :mod:`~archspec.search.mask_modes`, spec surgery :mod:`~archspec.search.mask_specs`, scores
  :mod:`~archspec.search.mask_scores`; the placement rule is :mod:`archspec.families.attention.placement`;
* :mod:`archspec.search.report`  -- progress, trials.csv, the Pareto / best specs, plots, the printed summary;
* :mod:`archspec.search.runs`    -- run-directory files: marker, atomic writes, specs with provenance;
* :mod:`archspec.cli.search`     -- ``archspec search`` (the command-line client of the two modes);
* :mod:`archspec.search.space`   -- the declarative search-space language, ``load_space``,
  ``mask_placement_space`` (MaiT mode 2);
* :mod:`archspec.search.budget`  -- ``parse_quantity``, ``Budgets``, ``static_check`` (graph only);
* :mod:`archspec.search.proxy`   -- ``ProxyProtocol``, ``proxy_spec``, ``train_proxy``, ``TrialFailure``;
* :mod:`archspec.search.latency` -- ``LatencyProtocol``, ``measure_latency``, ``LatencyCache``;
* :mod:`archspec.search.zero_cost` -- zero-cost proxies before training: ``naswot``, ``synflow``, ``grad_norm``,
  ``zero_cost_scores``;
* :mod:`archspec.search.study`   -- storages, samplers, resume, zombie trials; :mod:`archspec.search.fidelity`
  -- multi-fidelity rungs.

The proxy training data comes from :mod:`archspec.io.datasets` (``load_data``: digits by default, Fashion-MNIST,
CIFAR-10/100, ImageFolder), shared with training and the weight transfers.
"""

from __future__ import annotations

from pathlib import Path

from archspec._util.lazy import lazy_exports

SPACES_DIR = Path(__file__).resolve().parent / "spaces"
DEFAULT_SPACE = SPACES_DIR / "levit_family.yaml"

# public name -> submodule that defines it (PEP 562: imported on first use)
_EXPORTS = {
    "SearchConfig": "config", "SearchOutcome": "config", "complete_config": "config",
    "run_design": "design", "run_masks": "masks", "MaskConfig": "masks",
    "load_space": "space", "SearchSpace": "space", "mask_placement_space": "space",
    "Budgets": "budget", "ProxyProtocol": "proxy", "LatencyProtocol": "latency",
    "ZERO_COST_SCORES": "zero_cost", "zero_cost_scores": "zero_cost",
}

# A literal list (the API docs read it statically); tests keep it equal to _EXPORTS plus the constants.
__all__ = [
    "SPACES_DIR", "DEFAULT_SPACE", "Budgets", "LatencyProtocol", "MaskConfig", "ProxyProtocol", "SearchConfig",
    "SearchOutcome", "SearchSpace", "ZERO_COST_SCORES", "complete_config", "load_space", "mask_placement_space",
    "run_design", "run_masks", "zero_cost_scores",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
