"""Preflight: every input of a search checked, cheapest first, before anything is written.

:func:`preflight` runs the checks in order -- ``trials`` / ``timeout``, :func:`check_fidelity`,
:func:`check_budgets_feasible`, :func:`check_space_valid`, :func:`check_oracle` (``oracle``) or
:func:`check_data_path`, :func:`~archspec.search._engine.session.check_outputs` -- and decodes the data last (the
slowest check).  Each raises :class:`~archspec.errors.SpecError` naming the :class:`SearchConfig` field (the
command line names its option: :mod:`archspec.cli.options`; exit 2); the run directory, the study and every file
are created only after all of them passed.

The torch side (:mod:`archspec.io.datasets`) is imported inside the checks that need it, so a bad option is
refused without importing torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optuna

from archspec._util.units import human
from archspec.errors import SpecError
from archspec.io.data_sources import check_source
from archspec.search._engine.config import SearchConfig
from archspec.search._engine.fidelity import FIDELITIES, ZERO_COST_RANKINGS
from archspec.search._engine.session import check_outputs
from archspec.search._engine.study import make_sampler
from archspec.search._engine.verify import verify_count
from archspec.search._evaluation.budget import static_check
from archspec.search._evaluation.priors import MAX_PRIOR_POINTS
from archspec.search._tabulation.oracle import table_for_search

__all__ = ["preflight", "first_problem", "study_sampler", "strata_count", "check_budgets_feasible", "check_space_valid",
           "check_data_path", "check_fidelity", "check_oracle", "check_seed"]

def first_problem(exc: SpecError) -> str:
    """The first problem of ``exc``, formatted (its message when it has none)."""
    return exc.problems[0].format() if exc.problems else str(exc)


def check_budgets_feasible(space, budgets) -> Any:
    """Raise :class:`SpecError` when even ``space.smallest()`` breaks a static budget; else its static check.

    The error names the budget's field (``budgets.macs``, ``budgets.params``, ``budgets.memory``); the command
    line names its option instead (:meth:`archspec.errors.SpecError.with_options` with
    :data:`archspec.search._engine.defaults.BUDGET_OPTIONS`).

    Raises:
        SpecError: the smallest point is invalid, over the memory limit (``budgets.memory``), or over the MAC or
            parameter budget (the error gives the smallest achievable value).
    """
    check = static_check(space.smallest(), budgets)
    if check.feasible:
        return check
    if check.macs == 0 and check.params == 0 and check.reason:
        raise SpecError.single(("space",),
                               f"search space {space.name!r}: its smallest point is invalid: {check.reason}")
    over_macs = budgets.macs is not None and check.macs > budgets.macs
    if not over_macs and not (budgets.params is not None and check.params > budgets.params):  # the memory limit
        raise SpecError.single(("budgets", "memory"), f"search space {space.name!r}: its smallest point: "
                               f"{check.reason}", "raise `budgets.memory`, or search a smaller space (`space`)")
    if over_macs:
        field, what = ("budgets", "macs"), "MACs"
        message = (f"no point of search space {space.name!r} fits {human(budgets.macs)} MACs: the smallest achievable "
                   f"is {human(check.macs)} MACs ({check.macs:,}) and {human(check.params)} params")
    else:
        field, what = ("budgets", "params"), "params"
        message = (f"no point of search space {space.name!r} fits {human(budgets.params)} params: the smallest "
                   f"achievable is {human(check.params)} params ({check.params:,}) at {human(check.macs)} MACs")
    raise SpecError.single(field, message, f"raise `{'.'.join(field)}` to at least the smallest achievable {what}, "
                                           "or search a smaller space (`space`)")


def check_strata_space(space) -> None:
    """``sampler="strata"`` looks at every candidate before the first trial: the space must be finite and list at
    most :data:`~archspec.search._evaluation.priors.MAX_PRIOR_POINTS` points.

    Raises:
        SpecError: at ``sampler``, saying why the space cannot be listed (a float range, too many points).
    """
    try:
        next(iter(space.points(limit=MAX_PRIOR_POINTS)), None)
    except SpecError as exc:
        raise SpecError.single(("sampler",), f"strata looks at every candidate of the space first, and this space "
                                               f"cannot be listed: {first_problem(exc)}",
                               "search a finite space of a few hundred points (e.g. levit_small), or use "
                               "`sampler` random / tpe") from None


def strata_count(cfg: SearchConfig) -> int:
    """The cost strata of ``sampler="strata"``: ``cfg.strata``, or by default the trained candidates less the
    verification re-trainings (a run cut by ``timeout`` with a large ``trials`` should name them).  Raises nothing."""
    return cfg.strata or max(1, cfg.trials - verify_count(cfg.verify, cfg.trials))


def study_sampler(cfg: SearchConfig, seed: int, n_objectives: int):
    """The study's Optuna sampler of ``cfg`` (``sampler``, ``sampler_startup``, the strata), seeded with ``seed``
    (:func:`~archspec.search._engine.study.make_sampler`).

    Raises:
        SpecError: an unknown ``sampler``.
    """
    return make_sampler(cfg.sampler, seed, n_objectives, cfg.sampler_startup, n_strata=strata_count(cfg))


def check_space_valid(space, n: int = 12, seed: int = 0) -> None:
    """Sample ``n`` random points (seeded by ``seed``).

    Raises:
        SpecError: a point is not a valid spec; each problem keeps its field path and names the sampled params.
    """
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    for _ in range(n):
        trial = study.ask()
        try:
            space.sample(trial)
        except SpecError as exc:
            raise SpecError([dataclasses.replace(p, message=f"search space {space.name!r} produced an invalid spec "
                                                             f"(params {trial.params}): {p.message}")
                             for p in exc.problems]) from None
        study.tell(trial, 0.0)


def check_data_path(data: str | None) -> None:
    """Fail fast, before a study is opened, when ``data`` names nothing
    (see :func:`archspec.io.data_sources.check_source`).

    Raises:
        SpecError: a missing path, or Fashion-MNIST asked for where it is not installed (exit 2 from the CLI).
    """
    check_source(data)


MAX_SEED = 2**31  # what `archspec train --seed` accepts; numpy's samplers take seeds below 2**32


def check_seed(seed) -> None:
    """``seed`` is an integer in [0, 2^31), as for ``archspec train`` (numpy's samplers refuse others with a
    traceback).

    Raises:
        SpecError: at ``seed``.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED:
        raise SpecError.single(("seed",), f"seed must be in [0, 2^31), got {seed}")


def check_fidelity(cfg: SearchConfig) -> None:
    """``cfg.fidelity`` is known and ``cfg.zc_score`` a zero-cost ranking.

    Raises:
        SpecError: at ``fidelity`` or ``zc_score``, naming the choices.
    """
    if cfg.fidelity not in FIDELITIES:
        raise SpecError.single(("fidelity",), f"unknown fidelity {cfg.fidelity!r}", f"one of {', '.join(FIDELITIES)}")
    if cfg.zc_score not in ZERO_COST_RANKINGS:
        raise SpecError.single(("zc_score",), f"unknown zero-cost score {cfg.zc_score!r}",
                               f"one of {', '.join(ZERO_COST_RANKINGS)}")


def preflight(space, cfg: SearchConfig, name: str, n_objectives: int):
    """Check every input of a search of ``space`` (``n_objectives``: 1 or 2), cheapest first, writing nothing.

    Returns ``(data, sampler, oracle)``: the decoded :class:`~archspec.io.datasets.Dataset` (the oracle's stand-in with
    ``oracle``), the study's sampler and the :class:`~archspec.search._tabulation.oracle.OracleTable` (or ``None``).

    Raises:
        SpecError: the first bad input (trials, timeout, sampler start-up, seed, fidelity, strata -- below 1, or
            without the strata sampler --, budgets, space, oracle, data, ``out``, ``storage``).
    """
    if cfg.trials < 1:
        raise SpecError.single(("trials",), f"needs at least 1 trial, got {cfg.trials}")
    if cfg.timeout is not None and cfg.timeout <= 0:
        raise SpecError.single(("timeout",), f"must be positive seconds, got {cfg.timeout}")
    if cfg.sampler_startup < 0:
        raise SpecError.single(("sampler_startup",), f"needs 0 or more trials, got {cfg.sampler_startup}")
    check_seed(cfg.seed)
    check_fidelity(cfg)
    check_budgets_feasible(space, cfg.budgets)
    check_space_valid(space, seed=cfg.seed)
    if cfg.strata is not None and cfg.strata < 1:
        raise SpecError.single(("strata",), f"needs at least 1 stratum, got {cfg.strata}")
    if cfg.strata is not None and cfg.sampler != "strata":
        raise SpecError.single(("strata",), f"applies to the strata sampler, not {cfg.sampler!r}",
                               "set `sampler` to 'strata', or leave `strata` unset")
    if cfg.sampler == "strata":
        check_strata_space(space)
    oracle = check_oracle(cfg, space, n_objectives)
    if oracle is None:
        check_data_path(cfg.data)
    check_outputs(cfg, name)
    sampler = study_sampler(cfg, cfg.seed, n_objectives)
    if oracle is not None:  # nothing is trained: the table answers; no images are read
        return oracle.dataset(), sampler, oracle
    # Decoding every image is the last input check (the slowest): still nothing written.
    from archspec.io.datasets import load_data  # noqa: PLC0415 - torch-side: after the torch-free checks

    data = load_data(cfg.data, image_size=cfg.protocol.image_size, seed=cfg.seed, max_images=cfg.max_images)
    return data, sampler, None


def check_oracle(cfg: SearchConfig, space, n_objectives: int):
    """The :class:`~archspec.search._tabulation.oracle.OracleTable` of ``cfg.oracle`` (``None`` without one), checked
    against the search (:func:`~archspec.search._tabulation.oracle.table_for_search`): it tabulates ``space``, covers
    ``protocol.steps``, holds the zero-cost score the strata sampler or the zero-cost rung ranks by, and latency where
    the front or a latency budget needs it.

    Raises:
        SpecError: at ``oracle`` / ``oracle_subset`` / ``protocol.steps``.
    """
    if cfg.oracle is None:
        if cfg.oracle_subset:
            raise SpecError.single(("oracle_subset",), "`oracle_subset` needs `oracle` TABLE",
                                   "add `oracle` levit_small (or a table file), or drop `oracle_subset`")
        return None
    ranks_by_score = (cfg.sampler == "strata" or cfg.fidelity == "zc") and cfg.zc_score not in ("params", "macs")
    return table_for_search(cfg.oracle, space, steps=cfg.protocol.steps, subset=cfg.oracle_subset,
                            score=cfg.zc_score if ranks_by_score else None,
                            latency=n_objectives == 2 or cfg.budgets.latency_ms is not None)


def preflight_rounds(cfg: SearchConfig, name: str):
    """The inputs a rounds mode (:class:`~archspec.search._engine.mode.RoundsMode`) shares with every search: ``data``,
    then ``out`` / ``storage``, then every image decoded (the slowest check, still nothing written).

    Returns the :class:`~archspec.io.datasets.Dataset`.

    Raises:
        SpecError: ``seed`` out of range, a missing or unreadable data source, an unusable run directory or
            storage.
    """
    check_seed(cfg.seed)
    check_data_path(cfg.data)
    check_outputs(cfg, name)
    from archspec.io.datasets import load_data  # noqa: PLC0415 - torch-side: after the torch-free checks

    return load_data(cfg.data, image_size=cfg.protocol.image_size, seed=cfg.seed, max_images=cfg.max_images)
