"""What a search shows while it runs: :func:`progress_line` (one line per finished trial when stdout is not a
terminal) and :class:`ProgressDisplay` (a ``rich`` bar on stderr otherwise).
"""

from __future__ import annotations

import sys
import time

from optuna.trial import TrialState
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column

from archspec._util.units import human

__all__ = ["progress_line", "state_label", "ProgressDisplay"]


def state_label(trial) -> str:
    """COMPLETE / REUSED / PRUNED / FAIL, with why for the last two (infeasible, duplicate, reason)."""
    ua = trial.user_attrs
    if trial.state == TrialState.COMPLETE:
        return f"REUSED (trial {ua['reused_from']})" if "reused_from" in ua else "COMPLETE"
    why = ua.get("infeasible_reason") or (f"duplicate of trial {ua['duplicate_of']}" if "duplicate_of" in ua else None)
    why = why or ua.get("fail_reason") or ua.get("status")
    return f"{trial.state.name} ({str(why)[:80]})" if why else trial.state.name


def progress_line(trial, elapsed: float, attempted: int, total: int, timeout: float | None, width: int = 80) -> str:
    """One log line for a finished trial (the progress report when stdout is not a terminal), at most ``width``.

    ``trial 3 COMPLETE acc=0.912 ms=12.80 macs=807.2M 35s eta 130s trained 5/16``: state (with why,
    cut to fit), proxy accuracy, latency in ms, MACs, the stage plan where a stage is conv (``plan=C-C-T-T``), ETA;
    a value the trial does not have is ``-``.  ETA
    (seconds): the pace so far (elapsed / trained) times the candidates still to train, capped by what is
    left of ``timeout``; ``-`` before the first trained one without a timeout.  The full
    reasons are in ``trials.csv`` and the summary.  Raises nothing.  Source: archspec.
    """
    ua = trial.user_attrs
    acc, lat, macs = ua.get("accuracy"), ua.get("latency_ms"), ua.get("macs")
    left = [elapsed / attempted * max(total - attempted, 0)] if attempted else []
    if timeout is not None:
        left.append(max(timeout - elapsed, 0.0))
    plan = ua.get("plan") or ""
    facts = (f" acc={'-' if acc is None else f'{acc:.3f}'} ms={'-' if lat is None else f'{lat:.2f}'} "
             f"macs={'-' if macs is None else human(macs)}{f' plan={plan}' if 'C' in plan else ''} {elapsed:.0f}s "
             f"eta {f'{min(left):.0f}s' if left else '-'} trained {attempted}/{total}")
    head = f"trial {trial.number} {state_label(trial)}"
    room = max(width - len(facts), 12)
    if len(head) > room:
        head = head[:room - 1] + "…"
    return head + facts


def _rich_bar(total: int, info: str, console=None):
    """A started-later ``rich`` progress bar on stderr and its task id: ``(progress, task)``."""
    # Fits an 80-column terminal: a short bar, and the status text cut with an ellipsis, never wrapped.
    progress = Progress(
        BarColumn(bar_width=10), MofNCompleteColumn(), TextColumn("trained"), TimeElapsedColumn(), TextColumn("ETA"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[info]}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
        console=console or Console(stderr=True, highlight=False), transient=False, refresh_per_second=4,
        expand=True)
    return progress, progress.add_task("search", total=total, info=info)


class ProgressDisplay:
    """Progress of a search: a rich bar on stderr when stdout is a terminal, else one line per finished
    trial on stdout (:func:`progress_line`; logs and pipes get a readable record).

    Use as a context manager around the optimisation; :meth:`status` shows what the running trial does,
    :meth:`done` records a finished trial (``attempted``: candidates that reached training so far, of ``total``).
    ``timeout`` is the search's limit in seconds (``None``: none), for the ETA.
    """

    def __init__(self, total: int, enabled: bool, n_objectives: int, timeout: float | None):
        self.enabled = enabled
        self.lines = enabled and not sys.stdout.isatty()
        self.timeout = timeout
        self.start = time.perf_counter()
        self.total = total
        self.n_objectives = n_objectives
        self.best_acc: float | None = None
        self.best_lat: float | None = None
        self.failed = 0
        self.infeasible = 0
        self.progress = None
        if enabled and not self.lines:
            self.progress, self.task = _rich_bar(total, self._info("starting"))

    def _info(self, status: str) -> str:
        parts = []
        if self.best_acc is not None:
            parts.append(f"best acc {self.best_acc:.3f}")
        if self.best_lat is not None and self.n_objectives > 1:
            parts.append(f"fastest {self.best_lat:.1f} ms")
        if self.infeasible:
            parts.append(f"{self.infeasible} infeasible")
        if self.failed:
            parts.append(f"{self.failed} failed")
        parts.append(status)
        return " | ".join(parts)

    def __enter__(self):
        self.start = time.perf_counter()
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.stop()
        return False

    def status(self, text: str) -> None:
        """Show ``text`` (e.g. ``trial 3: training``) on the bar; in line mode a line on stderr (stdout keeps one line
        per finished trial), so a log shows what a trial of minutes is doing."""
        if self.progress is not None:
            self.progress.update(self.task, info=self._info(text))
        elif self.lines:
            print(text, file=sys.stderr, flush=True)

    def done(self, trial, attempted: int) -> None:
        """Record a finished trial: best accuracy, fastest latency, failures; print its line in line mode."""
        ua = trial.user_attrs
        if trial.state == TrialState.COMPLETE:
            acc = ua.get("accuracy")
            lat = ua.get("latency_ms")
            if acc is not None:
                self.best_acc = acc if self.best_acc is None else max(self.best_acc, acc)
            if lat is not None:
                self.best_lat = lat if self.best_lat is None else min(self.best_lat, lat)
        elif trial.state == TrialState.FAIL:
            self.failed += 1
        elif ua.get("status") == "infeasible":
            self.infeasible += 1
        if self.lines:
            elapsed = time.perf_counter() - self.start
            print(progress_line(trial, elapsed, attempted, self.total, self.timeout), flush=True)
        if self.progress is not None:
            self.progress.update(self.task, completed=min(attempted, self.total),
                                 info=self._info(f"#{trial.number} done"))
