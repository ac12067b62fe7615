"""The search's second public face: what the command line (:mod:`archspec.cli`) builds on besides the product.

:mod:`archspec.search` is the product a Python user calls (the modes, the space language, the settings, the
tables).  A front end over it needs more: the defaults and choices of its options (printed by ``--help``, so they
come from a stdlib-only module), the parsing and checks the library applies to the same values, the summary's
printing, and the commands that read a table without searching (``archspec table --report``, ``archspec search
masks --oracle``).  They are here, public and kept as stable as the product, as Optuna keeps ``optuna.cli`` beside
its library faces; :mod:`archspec.cli` imports the search from these two faces only (the import-linter contract
in pyproject.toml), and the bench scripts read the command line's defaults from here too.

Each name is imported on first use: ``import archspec.search.cli_support`` imports neither torch nor Optuna, and
the defaults and choices import nothing but the standard library.

* defaults: :data:`DEFAULT_TRIALS`, :data:`DEFAULT_TIMEOUT_S`, :data:`DEFAULT_TRIAL_TIMEOUT_S`,
  :data:`DEFAULT_FIDELITY`, :data:`DEFAULT_SAMPLER`, :data:`DEFAULT_SAMPLER_STARTUP`, :data:`DEFAULT_VERIFY`, mode 2's
  :data:`MASKS_PROXY_DEFAULTS` and :data:`MASKS_TRIAL_TIMEOUT_S`;
* choices: :data:`FIDELITIES`, :data:`SAMPLERS`, :data:`ZERO_COST_RANKINGS`, :data:`PROXY_SCORES`; each budget
  field's option, :data:`BUDGET_OPTIONS`;
* parsing and checks: :func:`parse_quantity` (``1G``, ``500M``), :func:`validate_study_name`;
* output: :func:`print_summary` (the tables of ``archspec search``), :func:`jsonable` (its ``--json``);
* tables read without searching: :func:`study_rows` (a table study's rows, for ``archspec table --report``'s
  :func:`~archspec.search.seed_check`), :func:`mask_table_space` and :func:`table_replay_report` (mode 2's
  strategies replayed on a mask table).
"""

from __future__ import annotations

from archspec._util.lazy import lazy_exports

_DEFAULTS = "archspec.search._engine.defaults"  # stdlib only: the parser's defaults
_REPLAY = "archspec.search._tabulation.mask_replay"

# public name -> the private module that defines it (PEP 562: imported on first use)
_EXPORTS = {
    **{name: _DEFAULTS for name in (
        "DEFAULT_TRIALS", "DEFAULT_TIMEOUT_S", "DEFAULT_TRIAL_TIMEOUT_S", "DEFAULT_FIDELITY", "DEFAULT_SAMPLER",
        "DEFAULT_SAMPLER_STARTUP", "DEFAULT_VERIFY", "MASKS_PROXY_DEFAULTS", "MASKS_TRIAL_TIMEOUT_S", "FIDELITIES",
        "SAMPLERS", "ZERO_COST_RANKINGS", "BUDGET_OPTIONS")},
    "PROXY_SCORES": "archspec.search._evaluation.scoring",  # stdlib only
    "parse_quantity": "archspec.search._evaluation.budget", "validate_study_name": "archspec.search._storage",
    "print_summary": "archspec.search._report.results", "jsonable": "archspec.search._report.run_files",
    "study_rows": "archspec.search._tabulation.exchange", "mask_table_space": _REPLAY,
    "table_replay_report": _REPLAY,
}

# A literal list (the API docs read it statically); tests keep it equal to _EXPORTS.
__all__ = [
    "DEFAULT_TRIALS", "DEFAULT_TIMEOUT_S", "DEFAULT_TRIAL_TIMEOUT_S", "DEFAULT_FIDELITY", "DEFAULT_SAMPLER",
    "DEFAULT_SAMPLER_STARTUP", "DEFAULT_VERIFY", "MASKS_PROXY_DEFAULTS", "MASKS_TRIAL_TIMEOUT_S",
    "FIDELITIES", "SAMPLERS", "ZERO_COST_RANKINGS", "PROXY_SCORES", "BUDGET_OPTIONS",
    "parse_quantity", "validate_study_name", "print_summary", "jsonable",
    "study_rows", "mask_table_space", "table_replay_report",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
