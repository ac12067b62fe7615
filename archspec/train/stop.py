"""Stopping ``archspec train`` on SIGTERM between two steps, never in the middle of something.

A signal handler that raises runs wherever the main thread happens to be, and Python prints and drops an
exception raised in a ``__del__`` (a DataLoader iterator's shuts its workers down), in an ``os.fork`` hook (the
``logging`` lock's release as the loader starts its workers) or in any other callback: the SIGTERM is lost (the run
goes on) and, worse, a lock can stay held.  So while the step loop runs (:func:`deferred`), SIGTERM only records the
request and the loop raises :class:`Terminated` at its next :func:`check` (before each step and each evaluation
batch); the normal unwinding then shuts the DataLoader workers down.  Outside the loop (setting up, writing the
model) it raises at once.  A second SIGTERM while one is pending raises at once too.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

__all__ = ["Terminated", "sigterm_stops", "deferred", "check"]


class Terminated(BaseException):
    """SIGTERM reached ``archspec train`` (raised in the main thread)."""


class _State:
    active = False  # a handler of ours is installed
    deferring = 0  # depth of deferred() blocks
    pending = False  # a SIGTERM came while deferring


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
def deferred():
    """Within the block a SIGTERM is raised at the next :func:`check` (or at the end of the block) only."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
    check()


def check() -> None:
    """Raise :class:`Terminated` if a SIGTERM is pending; a no-op otherwise (and outside ``archspec train``)."""
    if _state.pending:
        _state.pending = False
        raise Terminated()
