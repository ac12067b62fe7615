"""Budgets (MACs, parameters, latency) and the static feasibility check of a candidate.

``static_check`` needs only the IR's plan (:func:`archspec.ir.plan.build_plan`): no weights are built, so a
search rejects an over-budget candidate in about a millisecond, before any training.  Latency is
not static; the orchestrator measures it with :func:`archspec.search._evaluation.latency.measure_latency`.

Quantities on the command line are written with SI suffixes: ``1G`` = 1e9, ``500M``, ``2.5k``,
``1.5e9``; a trailing unit word (``MACs``, ``FLOPs``, ``ms``, ``params``) is ignored, so
``--budget-flops 1GFLOPs`` reads as 1e9 (the papers' "FLOPs" are multiply-accumulates).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from archspec._util.memory import format_bytes
from archspec._util.units import human
from archspec.errors import SpecError
from archspec.ir.plan import DEFAULT_MAX_MEMORY, Plan, build_plan, check_memory
from archspec.spec import ArchSpec

__all__ = ["parse_quantity", "Budgets", "StaticCheck", "static_check", "training_memory",
           "TRAINING_STATE_FACTOR"]

# A training step holds, per parameter, the weight, its gradient and AdamW's two moments.
TRAINING_STATE_FACTOR = 4

_SUFFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
_UNITS = ("macs", "mac", "flops", "flop", "params", "param", "ms")
_QUANTITY_RE = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([kKMGT]?)$")


def parse_quantity(text: str | float | int, option: str | tuple) -> float:
    """``"1G" -> 1e9``, ``"500M" -> 5e8``, ``"2.5k" -> 2500``, ``"1.5e9"``, ``"300"``, ``"1GMACs"``, ``"20ms"``.

    Args:
        text: the quantity (a number passes through after the positivity check).
        option: where it came from, the error's field path: a command-line option (``"--budget-flops"``) or a
            field path (``("budgets", "macs")``).

    Raises:
        SpecError: unparseable text, a non-finite, zero or negative value.
    """
    option = option if isinstance(option, tuple) else (option,)
    hint = ("write a positive number with an optional SI suffix: 300, 2.5k, 500M, 1G, 1.5e9 "
            "(units MACs/FLOPs/ms are ignored)")
    if isinstance(text, bool):
        raise SpecError.single(option, f"expected a quantity, got {text!r}", hint)
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
            raise SpecError.single(option, f"cannot read {text!r} as a quantity", hint)
        value = float(match.group(1)) * _SUFFIX[match.group(2)]
    else:
        raise SpecError.single(option, f"expected a quantity, got a {type(text).__name__}", hint)
    if not math.isfinite(value):
        raise SpecError.single(option, f"{text!r} is not a finite quantity", hint)
    if value <= 0:
        raise SpecError.single(option, f"a budget must be positive, got {text!r}", hint)
    return value


@dataclass(frozen=True)
class Budgets:
    """Upper bounds of a search; ``None`` = unconstrained.  MACs per image at the spec's input size.

    ``memory`` (bytes) bounds both a batch-1 inference forward at the spec's size and a proxy training
    step (:func:`training_memory`); ``None`` takes :data:`archspec.ir.plan.DEFAULT_MAX_MEMORY` (8 GiB).
    """

    macs: float | None = None
    params: float | None = None
    latency_ms: float | None = None
    memory: float | None = None

    def describe(self) -> dict:
        """JSON-ready dict."""
        out = {"macs": self.macs, "params": self.params, "latency_ms": self.latency_ms}
        return out if self.memory is None else {**out, "memory": self.memory}  # resumed older studies compare equal


@dataclass(frozen=True)
class StaticCheck:
    """Outcome of :func:`static_check`: feasibility under the static budgets and the counts behind it."""

    feasible: bool
    macs: int
    params: int
    reason: str | None


def training_memory(plan: Plan, batch: int) -> int:
    """Estimated bytes of one training step of the IR ``plan`` (:func:`archspec.ir.plan.build_plan`) at ``batch``
    images.

    Training keeps every node's intermediates for the backward pass, so activations are the *sum*
    over nodes of ``saved_bytes`` (per image; :mod:`archspec.ir.plan`), times the batch -- where
    inference takes only the largest node's peak; parameters count :data:`TRAINING_STATE_FACTOR`
    times (weight, gradient, AdamW's two moments); buffers once.
    """
    totals = plan.totals
    return (batch * totals["saved_activation_bytes"] + TRAINING_STATE_FACTOR * totals["weight_bytes"]
            + totals["buffer_bytes"])


def _memory_reasons(plan: Plan, budgets: Budgets, data, protocol) -> list[str]:
    """Over-limit reasons: the batch-1 inference forward at the spec's size, and the proxy training batch."""

    limit = DEFAULT_MAX_MEMORY if budgets.memory is None else budgets.memory
    reasons = [p.message for p in check_memory(plan, limit)]
    if data is None or protocol is None:
        return reasons
    from archspec.search._evaluation.proxy import proxy_spec  # noqa: PLC0415 - torch-side module

    try:
        proxy = build_plan(proxy_spec(plan.spec, data, protocol))
    except SpecError:  # not adaptable to the proxy: train_proxy reports why
        return reasons
    need = training_memory(proxy, protocol.batch_size)
    if need > limit:
        per_image = proxy.totals["saved_activation_bytes"]
        reasons.append(f"a proxy training step (batch {protocol.batch_size} at {protocol.image_size} px) needs an "
                       f"estimated {format_bytes(need)} (activations kept for backward {protocol.batch_size} x "
                       f"{format_bytes(per_image)}, weights with gradients and AdamW state "
                       f"{TRAINING_STATE_FACTOR} x {format_bytes(proxy.totals['weight_bytes'])}), over the memory "
                       f"limit of {format_bytes(limit)} (--max-memory)")
    return reasons


def static_check(spec: ArchSpec, budgets: Budgets, data=None, protocol=None) -> StaticCheck:
    """Check ``spec`` against the MAC, parameter and memory budgets from the IR alone (no weights).

    Memory: a batch-1 inference forward at the spec's size and, when ``data`` (a
    :class:`~archspec.io.datasets.Dataset`) and ``protocol`` (a
    :class:`~archspec.search._evaluation.proxy.ProxyProtocol`)
    are given, one proxy training step of ``protocol.batch_size`` images (:func:`training_memory`),
    against ``budgets.memory``.  The latency budget is not checked here (it needs a measurement).
    An invalid spec is infeasible, with the validator's message as the reason (``macs = params = 0``).
    """
    try:
        plan = build_plan(spec)
    except SpecError as exc:
        return StaticCheck(False, 0, 0, f"invalid spec: {exc.problems[0].message if exc.problems else exc}")
    macs, params = int(plan.totals["macs"]), int(plan.totals["params"])
    reasons = []
    if budgets.macs is not None and macs > budgets.macs:
        reasons.append(f"{human(macs)} MACs > budget {human(budgets.macs)}")
    if budgets.params is not None and params > budgets.params:
        reasons.append(f"{human(params)} params > budget {human(budgets.params)}")
    reasons += _memory_reasons(plan, budgets, data, protocol)
    return StaticCheck(not reasons, macs, params, "; ".join(reasons) or None)
