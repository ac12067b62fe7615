"""Architecture search: its product face -- the two modes, the space language, the settings and results, the tables.

The Python API (each name is imported on first use, so ``import archspec.search`` imports neither torch nor
Optuna)::

    from archspec.search import run_design, run_masks, load_space

    result = run_design(budgets={"macs": "1G"}, trials=8, out="runs", fidelity="zc")
    result.study, result.pareto_specs, result.best_spec      # optuna.Study, [ArchSpec], ArchSpec

    result = run_masks(spec="mait_tiny_sch2", strategy="als", search={"out": "runs"})

    space = load_space()                   # the embedded LeViT-family space, or a YAML path / dict
    def objective(trial):                  # your own Optuna objective
        spec = space.sample(trial)         # an ArchSpec; compile(spec) is the model
        check = static_check(spec, Budgets(macs=1e9))  # MACs, params, memory against the budgets: no weights
        ...                                # train_proxy / measure_latency under a ProxyProtocol / LatencyProtocol

    table = load_table("levit_small")      # a tabulated space: every design trained with three seeds
    table.rows[architecture_key(spec)]     # a design's rows, keyed as the search keys it

The names, as Optuna's ``study`` and ``samplers`` faces hold theirs (10 and 13), are what a user calls:

* the modes: :func:`run_design` (mode 1, design under budgets), :func:`run_masks` and :class:`MaskConfig` (mode 2,
  MaiT mask placement);
* the space language: :func:`load_space`, :class:`SearchSpace`;
* the settings and the result: :class:`SearchConfig` (``run_design``'s keywords), :class:`Budgets`,
  :class:`ProxyProtocol`, :class:`LatencyProtocol`, :class:`SearchOutcome`;
* what applies those settings to one spec, in a user's own objective: :func:`static_check`, :func:`train_proxy`,
  :func:`measure_latency`, and :func:`architecture_key` (a design's identity in a study and a table);
* tabulated spaces (``archspec table``, ``--oracle``): :func:`tabulate`, :func:`table_protocol`,
  :func:`export_table`, :func:`import_table`, :func:`seed_check`, :func:`load_table`.

The command line (:mod:`archspec.cli`) has a second face, :mod:`archspec.search.cli_support`: the defaults and
choices of its options, the parsing and printing it shares with the library, and the commands that replay a mask
table.  Neither it nor anything else outside the package imports the private inside below (an import-linter
contract in pyproject.toml; tests/test_layers.py holds the bench and research scripts to the faces, but for the
private modules it lists, each with its reason).  The inside, as ``optuna/study/`` and ``optuna/samplers/`` are
laid out, in layers that import only downward (a third import-linter contract):

* ``_modes/``      -- the modes: ``design`` (:func:`run_design`), ``masks`` (:func:`run_masks`) and its strategies
  ``mask_strategies``;
* ``_engine/``     -- the shared Optuna engine: ``mode`` (the mode contract: ``SampledMode``, ``RoundsMode``,
  ``Candidate``, ``RoundResult``, ``RunContext``, as Optuna's ``BaseSampler`` is to a study), ``loop``
  (``run_sampled``, ``run_rounds``), ``config`` (:class:`SearchConfig`; no Optuna, no torch), ``defaults`` (stdlib
  only), ``session`` (a run's directory opened: study, lock, resume), ``preflight`` (input checks, cheapest
  first), ``objective`` (one sampled candidate = one trial), ``round_trial`` (one proposed candidate = one trial),
  ``early_stop`` (fidelity rungs, stop rules), ``failures`` (fail reasons, deadlines), ``study`` (samplers,
  distinct candidates), ``front_sampler`` (``--sampler front``), ``strata`` (``--sampler strata``), ``verify``
  (the front trained again), ``fidelity``;
* ``_tabulation/`` -- ``archspec table``: ``tabulate`` (a finite space trained on an Optuna storage), ``exchange``
  (a table's rows out and in, the seed check), ``rows`` (one row), ``checks`` (a table's rules), ``oracle``
  (``--oracle``: evaluations answered from a table, and the table checked against the search), ``mask_replay``
  (MaiT's ALS rule replayed on a mask table);
* ``_report/``     -- ``results`` (trials.csv, the chosen specs, the summary), ``progress`` (while it runs),
  ``plots``, and ``run_files`` (the run directory's marker, atomic writes, emitted specs with provenance);
* ``_evaluation/`` -- what a candidate is measured by: ``budget`` (static feasibility), ``proxy`` (proxy
  training), ``latency``, ``zero_cost``, ``scoring`` (what ranks a trained proxy), ``priors`` (the look at every
  candidate before the first trial, and the hook of a sampler that uses it), ``mask_scores`` (ALS and alphas read
  off a trained model);
* ``_space/``      -- ``language``: the declarative search-space language (:func:`load_space`), its markers and
  structural check (``checks``), its sampling (``sampling``), and ``mask_placement`` (a placement of MaiT masks
  on a spec);
* ``_storage``     -- Optuna storages: resolution, checks, a study opened or resumed, workers and zombie trials.

Data beside the code: ``spaces/`` (the shipped search spaces) and ``tables/`` (the shipped tabulated spaces).  The
proxy training data comes from :mod:`archspec.io.datasets` (``load_data``), shared with training and the weight
transfers.
"""

from __future__ import annotations

from archspec._util.lazy import lazy_exports

_CONFIG = "archspec.search._engine.config"
_EVAL = "archspec.search._evaluation"
_TABLES = "archspec.search._tabulation"

# public name -> the private module that defines it (PEP 562: imported on first use)
_EXPORTS = {
    # the two modes and the space language
    "run_design": "archspec.search._modes.design", "run_masks": "archspec.search._modes.masks",
    "MaskConfig": "archspec.search._modes.masks",
    "load_space": "archspec.search._space.language", "SearchSpace": "archspec.search._space.language",
    # the settings and the result (torch- and Optuna-free)
    "SearchConfig": _CONFIG, "SearchOutcome": _CONFIG, "Budgets": f"{_EVAL}.budget",
    "ProxyProtocol": f"{_EVAL}.protocols", "LatencyProtocol": f"{_EVAL}.protocols",
    # the settings applied to one spec (a user's own objective)
    "static_check": f"{_EVAL}.budget", "train_proxy": f"{_EVAL}.proxy", "measure_latency": f"{_EVAL}.latency",
    "architecture_key": f"{_EVAL}.latency_cache",
    # tabulated spaces (archspec table, --oracle)
    "tabulate": f"{_TABLES}.tabulate", "table_protocol": f"{_TABLES}.tabulate", "export_table": f"{_TABLES}.exchange",
    "import_table": f"{_TABLES}.exchange", "seed_check": f"{_TABLES}.exchange", "load_table": f"{_TABLES}.oracle",
}

# A literal list (the API docs read it statically); tests keep it equal to _EXPORTS.
__all__ = [
    "run_design", "run_masks", "MaskConfig", "load_space", "SearchSpace",
    "SearchConfig", "SearchOutcome", "Budgets", "ProxyProtocol", "LatencyProtocol",
    "static_check", "train_proxy", "measure_latency", "architecture_key",
    "tabulate", "table_protocol", "export_table", "import_table", "seed_check", "load_table",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
