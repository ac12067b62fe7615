"""Stopping ``archspec train`` on SIGTERM between two steps, never in the middle of something.

A signal handler that raises runs wherever the main thread happens to be, and Python prints and drops an
exception raised in a ``__del__`` (a DataLoader iterator's shuts its workers down), in an ``os.fork`` hook (the
``logging`` lock's release as the loader starts its workers) or in any other callback: the SIGTERM is lost (the run
goes on) and, worse, a lock can stay held.  So while the step loop runs (:func:`deferred`), SIGTERM only records the
request and the loop raises :class:`Terminated` at its next :func:`check` (before each step and each evaluation
batch); the normal unwinding then shuts the DataLoader workers down.  Outside the loop (setting up, writing the
model) it raises at once.  A second SIGTERM while one is pending raises at once too.

Under ``torchrun`` a SIGTERM may reach the ranks at different steps, or one rank only.  A rank that left alone
would leave the others waiting in DDP's all-reduce, so with several processes the loop stops only where every rank
agrees (:func:`deferred`'s ``together``): before each step (:func:`check_together`) each rank reduces its pending
flag, and all stop before the same step.  Evaluation batches then do not stop a rank (their count differs between
ranks, so no collective can sit there); the block's end is an agreement too.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from contextlib import contextmanager

__all__ = ["Terminated", "sigterm_stops", "deferred", "check", "check_together"]


class Terminated(BaseException):
    """SIGTERM reached ``archspec train`` (raised in the main thread)."""


class _State:
    active = False  # a handler of ours is installed
    deferring = 0  # depth of deferred() blocks
    pending = False  # a SIGTERM came while deferring
    together: Callable[[bool], bool] | None = None  # several processes: whether any has a SIGTERM pending


_state = _State()


def _handler(signum, frame) -> None:
    if _state.deferring and not _state.pending:
        _state.pending = True
        return
    _state.pending = False
    raise Terminated()


@contextmanager
def sigterm_stops():
    """Within the block SIGTERM raises :class:`Terminated` (deferred to a step boundary inside :func:`deferred`).
    Only in the main thread (elsewhere the block changes nothing); the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _handler)
    _state.active, _state.pending = True, False
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _state.active, _state.pending = False, False


@contextmanager
def deferred(together: Callable[[bool], bool] | None = None):
    """Within the block a SIGTERM is raised at the next :func:`check` (or at the end of the block) only.

    ``together`` (several processes, e.g. :meth:`archspec.train.distributed.Processes.any`): a collective telling
    whether a flag holds in any process.  Then only :func:`check_together` stops (every process at the same call),
    and :func:`check` does nothing."""
    _state.deferring += 1
    outer, _state.together = _state.together, together
    try:
        yield
        check_together()  # every process ends the block at the same point
    finally:
        _state.deferring -= 1
        _state.together = outer


def check() -> None:
    """Raise :class:`Terminated` if a SIGTERM is pending; a no-op otherwise (and outside ``archspec train``, and
    inside a ``together`` block: see :func:`check_together`)."""
    if _state.pending and _state.together is None:
        _state.pending = False
        raise Terminated()


def check_together() -> None:
    """:func:`check` at a point every process reaches in the same order (before each step): inside a ``together``
    block it raises :class:`Terminated` in every process if any has a SIGTERM pending."""
    if _state.together is None:
        check()
    elif _state.together(_state.pending):
        _state.pending = False
        raise Terminated()
