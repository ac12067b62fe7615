"""How a candidate fails: readable reasons, the trial deadline, and the ``fail_reason`` a FAIL trial records.

A candidate that raises, runs out of memory, produces a NaN loss or runs past ``--trial-timeout`` (or the
search's ``--timeout``) becomes a FAIL trial whose user attr ``fail_reason`` is :func:`fail_reason` of the
exception; the study goes on.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

from archspec.train.failures import TrainingFailure

__all__ = ["CandidateFailure", "TrialTimeout", "deadline_hook", "fail_reason"]


class CandidateFailure(Exception):
    """A candidate failure with a readable reason (``reason``: what the trial's ``fail_reason`` says)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class TrialTimeout(Exception):
    """Raised from inside the model's forward pass when a candidate's training runs past its deadline.

    Deliberately not a ``RuntimeError``: it must pass through ``train_proxy``'s own error handling.
    """


class deadline_hook:  # noqa: N801 - used like a function
    """``on_model`` for :func:`~archspec.search._evaluation.proxy.train_proxy`: the model's forward raises
    :class:`TrialTimeout`
    after ``deadline`` (``time.perf_counter()`` seconds) while ``active``; set ``active = False`` once training is
    over.  ``describe()`` gives the exception's message."""

    def __init__(self, deadline: float, describe: Callable[[], str]):
        self.deadline, self.describe, self.active = deadline, describe, True

    def __call__(self, model) -> None:
        def check(module, args):
            if self.active and time.perf_counter() > self.deadline:
                raise TrialTimeout(self.describe())
        model.register_forward_pre_hook(check)


def fail_reason(exc: BaseException) -> str:
    """The ``fail_reason`` a trial records for ``exc`` (at most 1,000 characters); frees memory after an OOM."""
    if isinstance(exc, CandidateFailure):
        return exc.reason
    if isinstance(exc, TrialTimeout):
        return str(exc)
    if isinstance(exc, TrainingFailure):
        return str(getattr(exc, "reason", exc))[:1000]
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted (Ctrl-C / SIGINT)"
    if isinstance(exc, MemoryError):
        gc.collect()
        return f"out of memory: {exc}"[:1000]
    text = f"{type(exc).__name__}: {exc}".strip()
    if "out of memory" in text.lower():
        gc.collect()
        text = "out of memory: " + text
    return text[:1000]
