"""What a training run shows and logs: a progress bar on a terminal, one line per log interval otherwise,
and the metrics of every evaluation in ``metrics.csv`` and ``metrics.jsonl`` (plus TensorBoard scalars when
asked for and ``tensorboard`` is installed).  Only the main process (rank 0) shows or writes anything.

A progress line: ``step 120/3000  epoch 2.4  loss 1.234  lr 1.20e-03  312.5 img/s  ETA 5m12s`` (images/s over the
last interval, all processes together; the loss is the last step's on rank 0).
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as Bar

__all__ = ["Progress", "format_seconds"]


def format_seconds(seconds: float) -> str:
    """``75`` -> ``1m15s``; ``3700`` -> ``1h01m``."""
    seconds = max(int(round(seconds)), 0)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    """Progress of steps ``start + 1 .. total``.

    Args:
        images_per_step: the global batch (for images/s).
        steps_per_epoch: for the epoch column (``None``: no epochs, e.g. the in-memory fast path).
        run_dir: where ``metrics.csv`` / ``metrics.jsonl`` go (``None``: nowhere).
        enabled: show progress (rank 0; ``--quiet`` on the command line turns it off); the metrics files are
            written whenever ``run_dir`` is set.
        bar: a rich progress bar (default: when stdout is a terminal) instead of log lines.
        tensorboard: also write TensorBoard scalars into ``run_dir/tensorboard`` (needs ``tensorboard``).
        stream: where lines go (default stdout).
        label: a prefix of every line (``phase 1: step 50/200 ...``).
        log_seconds: also a line when this many seconds passed since the last one (``None``: by steps only); the
            search's trainings use it, so a slow first candidate shows its pace before its 50th step.
    """

    def __init__(self, total: int, start: int, images_per_step: int, *, steps_per_epoch: int | None = None,
                 log_every: int = 50, run_dir: Path | None = None, enabled: bool = True, bar: bool | None = None,
                 tensorboard: bool = False, stream: Any = None, label: str = "", log_seconds: float | None = None):
        self.total, self.start, self.images_per_step = total, start, images_per_step
        self.steps_per_epoch, self.log_every, self.run_dir, self.enabled = steps_per_epoch, log_every, run_dir, enabled
        self.log_seconds = log_seconds
        self.stream = stream or sys.stdout
        self.bar = self.stream.isatty() if bar is None else bar
        self.t0 = self.t_last = time.perf_counter()
        self.step_last = start
        self.prefix = f"{label}: " if label else ""
        self._rich = self._task = self._tb = None
        if enabled and self.bar:
            self._start_bar()
        if tensorboard and run_dir is not None:
            self._tb = _tensorboard(run_dir)

    def _start_bar(self) -> None:
        self._rich = Bar(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                         TimeRemainingColumn(), console=Console(file=self.stream), transient=False)
        self._rich.start()
        self._task = self._rich.add_task("train", total=self.total, completed=self.start, info="")

    def line(self, step: int, loss: float, lr: float) -> str:
        """The progress line of ``step`` (and restarts the images/s interval)."""
        now = time.perf_counter()
        rate = (step - self.step_last) * self.images_per_step / max(now - self.t_last, 1e-9)
        eta = (self.total - step) * (now - self.t0) / max(step - self.start, 1)
        self.t_last, self.step_last = now, step
        epoch = f"  epoch {step / self.steps_per_epoch:.1f}" if self.steps_per_epoch else ""
        return (f"{self.prefix}step {step}/{self.total}{epoch}  loss {loss:.4f}  lr {lr:.2e}  {rate:.1f} img/s  "
                f"ETA {format_seconds(eta)}")

    def on_step(self, step: int, loss: Any, lr: float) -> None:
        """After step ``step``: advance the bar; every ``log_every`` steps (and the last, and after ``log_seconds``
        without one) a line."""
        if not self.enabled:
            return
        if self._rich is not None:
            self._rich.update(self._task, completed=step)
        overdue = self.log_seconds is not None and time.perf_counter() - self.t_last >= self.log_seconds
        if step % self.log_every and step != self.total and not overdue:
            return
        text = self.line(step, float(loss), lr)
        if self._rich is not None:
            self._rich.update(self._task, info=text.split("  ", 1)[1].rsplit("  ETA", 1)[0])
        else:
            print(text, file=self.stream, flush=True)

    def on_eval(self, record: dict) -> None:
        """Print and append the metrics of one evaluation (``step``, ``accuracy``, ``val_loss``, ...)."""
        if self.enabled:
            shown = "  ".join(_show(k, v) for k, v in record.items())
            if self._rich is not None:
                self._rich.console.print(f"eval  {shown}")
            else:
                print(f"{self.prefix}eval  {shown}", file=self.stream, flush=True)
        if self.run_dir is not None:
            _append(self.run_dir, record)
        if self._tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, record["step"])

    def close(self) -> None:
        """Stop the bar and flush TensorBoard."""
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
        if self._tb is not None:
            self._tb.close()


def _show(key: str, value: Any) -> str:
    if isinstance(value, float):
        return f"{key} {value:.2e}" if key == "lr" else f"{key} {value:.4f}"
    return f"{key} {value}"


def _append(run_dir: Path, record: dict) -> None:
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps(record) + "\n")
    path = run_dir / "metrics.csv"
    new = not path.exists()
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(record))
        if new:
            writer.writeheader()
        writer.writerow(record)


def _tensorboard(run_dir: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - tensorboard is optional
    except ImportError:  # tensorboard is optional
        print("note: --tensorboard needs `pip install tensorboard`; metrics go to metrics.csv only", file=sys.stderr)
        return None
    return SummaryWriter(str(run_dir / "tensorboard"))
