"""Architecture search: the public faces of the engine, its two modes, the tabulated spaces and their ingredients.

The Python API (what ``archspec search`` and ``archspec table`` call; each name is imported on first use, so
``import archspec.search`` imports neither torch nor Optuna)::

    from archspec.search import run_design, run_masks, load_space

    result = run_design(budgets={"macs": "1G"}, trials=8, out="runs", fidelity="zc")
    result.study, result.pareto_specs, result.best_spec      # optuna.Study, [ArchSpec], ArchSpec

    result = run_masks(spec="mait_tiny_sch2", strategy="als", search={"out": "runs"})

    space = load_space()                   # the embedded LeViT-family space, or a YAML path / dict
    def objective(trial):                  # your own Optuna objective
        spec = space.sample(trial)         # an ArchSpec; compile(spec) is the model
        ...

This module is the only door: the command line (:mod:`archspec.cli`) and the bench scripts import names from
here, never from the private sub-packages below (an import-linter contract in pyproject.toml and
tests/test_layers.py hold it).  The inside, as ``optuna/study/`` and ``optuna/samplers/`` are laid out:

* ``_engine/``     -- the shared Optuna engine: ``config`` (:class:`SearchConfig`; no Optuna, no torch),
  ``defaults`` (stdlib only), ``loop`` (``run_sampled``, ``run_rounds``), ``session`` (a run's directory
  opened: study, lock, resume), ``preflight`` (input checks, cheapest first), ``objective`` (one sampled
  candidate = one trial),
  ``round_trial`` (one proposed candidate = one trial), ``early_stop`` (fidelity rungs, stop rules),
  ``failures`` (fail reasons, deadlines), ``study`` (storages, samplers, zombie trials), ``front_sampler``
  (``--sampler front``), ``fidelity``;
* ``_modes/``      -- the mode contract ``base`` (:class:`SampledMode`, :class:`RoundsMode`, :class:`Candidate`,
  :class:`RoundResult`, :class:`RunContext`, as Optuna's ``BaseSampler`` is to a study), mode 1 ``design``
  (:func:`run_design`), mode 2 ``masks`` (:func:`run_masks`) with its strategies ``mask_strategies``, the
  torch-free spec surgery ``mask_placement`` and the torch scores ``mask_scores``;
* ``_evaluation/`` -- what a candidate is measured by: ``budget`` (static feasibility), ``proxy`` (proxy
  training), ``latency``, ``zero_cost``, ``scoring`` (what ranks a trained proxy), ``verify`` (the front
  trained again);
* ``_report/``     -- ``results`` (trials.csv, the chosen specs, the summary), ``progress`` (while it runs),
  ``plots``, and ``run_files`` (the run directory's marker, atomic writes, emitted specs with provenance);
* ``_tabulation/`` -- ``archspec table``: ``tabulate`` (a finite space trained on an Optuna storage), ``exchange``
  (a table's rows out and in, the seed check), ``rows``
  (one row), ``checks`` (a table's rules), ``oracle`` (``--oracle``: evaluations answered from a table),
  ``mask_replay`` (MaiT's ALS rule replayed on a mask table);
* ``_space/``      -- ``language``: the declarative search-space language (:func:`load_space`), its markers and
  structural check (``checks``) and its sampling (``sampling``).

Data beside the code: ``spaces/`` (the shipped search spaces, :data:`SPACES_DIR`) and ``tables/`` (the
shipped tabulated spaces, :data:`TABLES_DIR`).  The proxy training data comes from
:mod:`archspec.io.datasets` (``load_data``), shared with training and the weight transfers.
"""

from __future__ import annotations

from pathlib import Path

from archspec._util.lazy import lazy_exports

SPACES_DIR = Path(__file__).resolve().parent / "spaces"
DEFAULT_SPACE = SPACES_DIR / "levit_family.yaml"

_CONFIG = "archspec.search._engine.config"
_DEFAULTS = "archspec.search._engine.defaults"  # stdlib only: the parser's defaults
_MODES = "archspec.search._modes"
_EVAL = "archspec.search._evaluation"
_TABLES = "archspec.search._tabulation"
_PLACE = "archspec.search._space.mask_placement"
_SCORES = "archspec.search._evaluation.mask_scores"

# public name -> the private module that defines it (PEP 562: imported on first use)
_EXPORTS = {
    # the two modes and the space language
    "run_design": f"{_MODES}.design", "run_masks": f"{_MODES}.masks", "MaskConfig": f"{_MODES}.masks",
    "load_space": "archspec.search._space.language", "SearchSpace": "archspec.search._space.language",
    "mask_placement_space": "archspec.search._space.language",
    # settings, outcome and defaults (torch- and Optuna-free)
    "SearchConfig": _CONFIG, "SearchOutcome": _CONFIG, "complete_config": _CONFIG,
    "DEFAULT_TRIALS": _DEFAULTS, "DEFAULT_TIMEOUT_S": _DEFAULTS, "DEFAULT_TRIAL_TIMEOUT_S": _DEFAULTS,
    "DEFAULT_FIDELITY": _DEFAULTS, "DEFAULT_SAMPLER": _DEFAULTS, "DEFAULT_SAMPLER_STARTUP": _DEFAULTS,
    "DEFAULT_VERIFY": _DEFAULTS, "FIDELITIES": _DEFAULTS, "SAMPLERS": _DEFAULTS, "ZERO_COST_RANKINGS": _DEFAULTS,
    "MASKS_PROXY_DEFAULTS": _DEFAULTS, "MASKS_TRIAL_TIMEOUT_S": _DEFAULTS, "BUDGET_OPTIONS": _DEFAULTS,
    "validate_study_name": "archspec.search._storage",
    # the mode contract
    "SampledMode": "archspec.search._engine.mode", "RoundsMode": "archspec.search._engine.mode",
    "Candidate": "archspec.search._engine.mode",
    "RoundResult": "archspec.search._engine.mode", "RunContext": "archspec.search._engine.mode",
    # what a candidate is measured by
    "Budgets": f"{_EVAL}.budget", "parse_quantity": f"{_EVAL}.budget", "static_check": f"{_EVAL}.budget",
    "static_check_rate": f"{_EVAL}.check_rate",
    "ProxyProtocol": f"{_EVAL}.protocols", "train_proxy": f"{_EVAL}.proxy", "score_proxy": f"{_EVAL}.proxy",
    "TrainingFailure": f"{_EVAL}.proxy",
    "LatencyProtocol": f"{_EVAL}.protocols", "measure_latency": f"{_EVAL}.latency",
    "architecture_key": f"{_EVAL}.latency",
    "ZERO_COST_SCORES": f"{_EVAL}.zero_cost", "zero_cost_scores": f"{_EVAL}.zero_cost",
    "PROXY_SCORES": f"{_EVAL}.scoring", "proxy_score": f"{_EVAL}.scoring",
    # what a search reports
    "print_summary": "archspec.search._report.results", "jsonable": "archspec.search._report.run_files",
    # tabulated spaces (archspec table, --oracle)
    "tabulate": f"{_TABLES}.tabulate", "table_protocol": f"{_TABLES}.tabulate", "study_rows": f"{_TABLES}.exchange",
    "export_table": f"{_TABLES}.exchange", "import_table": f"{_TABLES}.exchange", "seed_check": f"{_TABLES}.exchange",
    "git_commit": f"{_TABLES}.tabulate", "machine": f"{_TABLES}.tabulate",
    "TABLES_DIR": f"{_TABLES}.oracle", "load_table": f"{_TABLES}.oracle", "curve_at": f"{_TABLES}.oracle",
    "linear_at": f"{_TABLES}.oracle", "design_seconds": f"{_TABLES}.oracle", "mask_groups": f"{_TABLES}.mask_replay",
    "table_replay_report": f"{_TABLES}.mask_replay", "mask_geometry": f"{_TABLES}.mask_replay",
    "rule_score": f"{_TABLES}.mask_replay", "uniform_als": f"{_TABLES}.mask_replay",
    "mask_table_space": f"{_TABLES}.mask_replay", "mask_depths": f"{_TABLES}.mask_replay",
    "reference_data": f"{_TABLES}.rows", "train_row": f"{_TABLES}.rows",
    # mask placement (mode 2's parts, for the bench's studies of it)
    "attention_layers": _PLACE, "apply_placement": _PLACE,
    "placement_heads": _PLACE, "head0_placement": _PLACE,
    "soft_heads": _PLACE,
    "ALS_IMAGES": _SCORES, "layer_scores": _SCORES,
    "learned_alphas": _SCORES, "uniform_baselines": _SCORES,
    "train_keeping_model": _SCORES,
}

# A literal list (the API docs read it statically); tests keep it equal to _EXPORTS plus the constants.
__all__ = [
    "SPACES_DIR", "DEFAULT_SPACE",
    "run_design", "run_masks", "MaskConfig", "load_space", "SearchSpace", "mask_placement_space",
    "SearchConfig", "SearchOutcome", "complete_config", "DEFAULT_TRIALS", "DEFAULT_TIMEOUT_S",
    "DEFAULT_TRIAL_TIMEOUT_S", "DEFAULT_FIDELITY", "DEFAULT_SAMPLER", "DEFAULT_SAMPLER_STARTUP", "DEFAULT_VERIFY",
    "FIDELITIES", "SAMPLERS", "ZERO_COST_RANKINGS", "MASKS_PROXY_DEFAULTS", "MASKS_TRIAL_TIMEOUT_S",
    "BUDGET_OPTIONS", "validate_study_name",
    "SampledMode", "RoundsMode", "Candidate", "RoundResult", "RunContext",
    "Budgets", "parse_quantity", "static_check", "static_check_rate", "ProxyProtocol", "train_proxy",
    "score_proxy", "TrainingFailure", "LatencyProtocol", "measure_latency", "architecture_key", "ZERO_COST_SCORES",
    "zero_cost_scores", "PROXY_SCORES", "proxy_score",
    "print_summary", "jsonable",
    "tabulate", "table_protocol", "study_rows", "export_table", "import_table", "seed_check", "git_commit",
    "machine", "TABLES_DIR", "load_table", "curve_at", "linear_at", "design_seconds", "mask_groups",
    "table_replay_report", "mask_geometry", "rule_score", "uniform_als", "mask_table_space", "mask_depths",
    "reference_data", "train_row",
    "attention_layers", "apply_placement", "placement_heads", "head0_placement", "soft_heads", "ALS_IMAGES",
    "layer_scores", "learned_alphas", "uniform_baselines", "train_keeping_model",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
