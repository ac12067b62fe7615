"""Budgets (MACs, parameters, latency) and the static feasibility check of a candidate.

``static_check`` needs only the IR (:func:`archspec.graph.build_graph`): no weights are built, so a
search rejects an over-budget candidate in about a millisecond, before any training.  Latency is
not static; the orchestrator measures it with :func:`archspec.search.latency.measure_latency`.

Quantities on the command line are written with SI suffixes: ``1G`` = 1e9, ``500M``, ``2.5k``,
``1.5e9``; a trailing unit word (``MACs``, ``FLOPs``, ``ms``, ``params``) is ignored, so
``--budget-flops 1GFLOPs`` reads as 1e9 (the papers' "FLOPs" are multiply-accumulates).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from archspec.analysis import human
from archspec.errors import SpecError
from archspec.spec import ArchSpec

if TYPE_CHECKING:  # pragma: no cover
    from archspec.search.space import SearchSpace

__all__ = ["parse_quantity", "Budgets", "StaticCheck", "static_check", "static_check_rate"]

_SUFFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_UNITS = ("macs", "mac", "flops", "flop", "params", "param", "ms")
_QUANTITY_RE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([kKMGT]?)$")


def parse_quantity(text: "str | float | int", option: str) -> float:
    """``"1G" -> 1e9``, ``"500M" -> 5e8``, ``"2.5k" -> 2500``, ``"1.5e9"``, ``"300"``, ``"1GMACs"``, ``"20ms"``.

    Args:
        text: the quantity (a number passes through after the positivity check).
        option: the option it came from (``"--budget-flops"``), used as the error's field path.

    Raises:
        SpecError: unparseable text, a non-finite, zero or negative value.
    """
    hint = "write a positive number with an optional SI suffix: 300, 2.5k, 500M, 1G, 1.5e9 (units MACs/FLOPs/ms are ignored)"
    if isinstance(text, bool):
        raise SpecError.single((option,), f"expected a quantity, got {text!r}", hint)
    if isinstance(text, (int, float)):
        value = float(text)
    elif isinstance(text, str):
        body = text.strip().replace("_", "")
        lowered = body.lower()
        for unit in _UNITS:
            if lowered.endswith(unit) and len(body) > len(unit):
                body = body[: -len(unit)].strip()
                break
        match = _QUANTITY_RE.match(body)
        if not match:
            raise SpecError.single((option,), f"cannot read {text!r} as a quantity", hint)
        value = float(match.group(1)) * _SUFFIX[match.group(2)]
    else:
        raise SpecError.single((option,), f"expected a quantity, got a {type(text).__name__}", hint)
    if not math.isfinite(value):
        raise SpecError.single((option,), f"{text!r} is not a finite quantity", hint)
    if value <= 0:
        raise SpecError.single((option,), f"a budget must be positive, got {text!r}", hint)
    return value


@dataclass(frozen=True)
class Budgets:
    """Upper bounds of a search; ``None`` = unconstrained.  MACs per image at the spec's input size."""

    macs: float | None = None
    params: float | None = None
    latency_ms: float | None = None

    def describe(self) -> dict:
        """JSON-ready dict."""
        return {"macs": self.macs, "params": self.params, "latency_ms": self.latency_ms}


@dataclass(frozen=True)
class StaticCheck:
    """Outcome of :func:`static_check`: feasibility under the static budgets and the counts behind it."""

    feasible: bool
    macs: int
    params: int
    reason: str | None


def static_check(spec: ArchSpec, budgets: Budgets) -> StaticCheck:
    """Check ``spec`` against the MAC and parameter budgets from the IR alone (no weights).

    The latency budget is not checked here (it needs a measurement).  An invalid spec is
    infeasible, with the validator's message as the reason (``macs = params = 0``).
    """
    from archspec.graph import build_graph  # noqa: PLC0415 - keep module import light

    try:
        graph = build_graph(spec)
    except SpecError as exc:
        return StaticCheck(False, 0, 0, f"invalid spec: {exc.problems[0].message if exc.problems else exc}")
    macs, params = int(graph.graph["macs"]), int(graph.graph["params"])
    reasons = []
    if budgets.macs is not None and macs > budgets.macs:
        reasons.append(f"{human(macs)} MACs > budget {human(budgets.macs)}")
    if budgets.params is not None and params > budgets.params:
        reasons.append(f"{human(params)} params > budget {human(budgets.params)}")
    return StaticCheck(not reasons, macs, params, "; ".join(reasons) or None)


def static_check_rate(space: "SearchSpace", budgets: Budgets, n: int = 200, seed: int = 0) -> float:
    """Candidates per second of sampling (Optuna ``RandomSampler``, in-memory study) plus :func:`static_check`.

    Each candidate is a full ``space.sample`` (which validates the point with ``load_spec``) and a
    static check; a point that fails validation still counts (it was rejected).
    """
    import optuna  # noqa: PLC0415

    if n < 1:
        raise ValueError("n must be >= 1")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        start = time.perf_counter()
        for _ in range(n):
            trial = study.ask()
            try:
                check = static_check(space.sample(trial), budgets)
                value = float(check.macs)
            except SpecError:
                value = float("inf")
            study.tell(trial, value)
        elapsed = time.perf_counter() - start
    finally:
        optuna.logging.set_verbosity(verbosity)
    return n / max(elapsed, 1e-9)
