"""Which command-line option each library field or parameter is, one table per command.

The library's errors name what a Python caller passed: a parameter (``out``), a field of a config (``config.lr``,
``budgets.macs``), code-quoted in the text (`` `out` ``).  :func:`archspec.cli.main` renames them to the command's
flags with :meth:`archspec.errors.SpecError.with_options` and the table of the command (:func:`options_for`), so
the command line speaks of ``--out`` and ``--lr``.  Torch-free.
"""

from __future__ import annotations

from dataclasses import fields

from archspec.errors import Path
from archspec.train.config import TrainConfig

__all__ = ["TRAIN_CONFIG", "DATA", "CALIBRATE", "INT8", "OUT", "TRAIN", "SEARCH", "SEARCH_MASKS", "TABLE", "BUILD",
           "EXPORT", "INSPECT", "TWO_PHASE", "TCNN", "options_for"]


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


# The data set (:mod:`archspec.io.data_sources`, :func:`archspec.io.datasets.load_data`): ``--data`` and
# ``--max-images`` where a command trains on it; ``build`` and ``export`` calibrate int8 on it (``--calibrate``).
DATA: dict[Path, str] = {("data",): "--data", ("max_images",): "--max-images"}
CALIBRATE: dict[Path, str] = {("data",): "--calibrate"}

# int8 (:mod:`archspec.deploy.int8`): ``quantize``'s ``calibration_batches`` and ``load_calibration``'s ``source`` come
# from ``--calibrate``; a problem of the quantisation itself is at ``int8``; its hints suggest ``fuse``.
INT8: dict[Path, str] = {("int8",): "--int8", ("calibration_batches",): "--calibrate", ("source",): "--calibrate",
                         ("fuse",): "--fuse"}

# An output directory (:mod:`archspec.io.builddir`): ``out``.
OUT: dict[Path, str] = {("out",): "--out"}

# ``fit(config=...)``: each TrainConfig field is the option of the same name but two; four are set by the recipe
# only (no flag: their problems keep the field's name, tests/test_cli_options.py holds every flag to its parser).
_RECIPE_ONLY = ("augmentation", "min_lr", "warmup_lr", "warmup_steps")
TRAIN_CONFIG: dict[Path, str] = {("config", f.name): {"optimizer": "--opt", "auto_augment": "--aa"}.get(
    f.name, _flag(f.name)) for f in fields(TrainConfig) if f.name not in _RECIPE_ONLY}

# ``archspec train``: :func:`archspec.train.run.fit`'s keywords and its config.
TRAIN: dict[Path, str] = {
    **{(name,): _flag(name) for name in ("out", "resume", "restart", "seed", "data", "teacher", "teacher_checkpoint",
                                         "max_images", "sync_bn")},
    **TRAIN_CONFIG,
}

# ``archspec search``: the fields of :class:`archspec.search.SearchConfig` (``run_design``'s keywords), each the
# option of the same name, and those of its budgets, proxy protocol and latency protocol.
SEARCH: dict[Path, str] = {
    **{(name,): _flag(name) for name in (
        "study_name", "out", "storage", "objective", "trials", "timeout", "seed", "sampler", "sampler_startup", "space",
        "data", "max_images", "prune", "fidelity", "eta", "zc_score", "min_steps", "trial_timeout", "oracle",
        "oracle_subset", "verify", "strata")},
    ("budgets", "macs"): "--budget-flops", ("budgets", "params"): "--budget-params",
    ("budgets", "latency_ms"): "--budget-latency", ("budgets", "memory"): "--max-memory",
    **{("protocol", name): option for name, option in (
        ("steps", "--proxy-steps"), ("image_size", "--proxy-size"), ("batch_size", "--proxy-batch"),
        ("lr", "--proxy-lr"), ("threads", "--proxy-threads"), ("score", "--proxy-score"),
        ("min_grid", "--proxy-min-grid"))},
    **{("latency", name): _flag(f"latency_{name}") for name in ("batch", "threads", "repeats")},
    ("latency", "torch_compile"): "--latency-compile",
}

# ``archspec search masks``: :class:`archspec.search.MaskConfig`'s fields besides the search's.
_DESIGN_ONLY = ("--objective", "--space", "--prune", "--fidelity", "--eta", "--zc-score", "--min-steps", "--verify",
                "--strata", "--proxy-score", "--budget-flops", "--budget-params", "--budget-latency", "--max-memory")
SEARCH_MASKS: dict[Path, str] = {
    **{path: option for path, option in SEARCH.items() if option not in _DESIGN_ONLY},
    **{(name,): _flag(name) for name in ("strategy", "rounds", "als_high", "als_low", "window", "windows", "max_masked",
                                         "alpha_threshold")},
}

# ``archspec table``: its proxy's training settings are checked as a TrainConfig (the six it has flags for); its
# storage and data are the search's (its ``protocol.<field>`` problems are renamed by archspec.cli.table itself);
# ``export_table``'s ``out`` is ``--export``, ``import_table``'s ``table`` ``--import``.
TABLE: dict[Path, str] = {
    **{("config", name): _flag(name) for name in ("steps", "warmup_steps", "batch_size", "lr", "weight_decay",
                                                  "augmentation")},
    ("storage",): "--storage", ("data",): "--data", ("seeds",): "--seeds", ("out",): "--export", ("table",): "--import",
}

# ``archspec build`` (OUT; ``--int8``'s calibration data), ``export`` (its calibration data), ``inspect`` (OUT),
# ``two-phase`` (OUT, data) and ``tcnn`` (OUT).
BUILD: dict[Path, str] = {**OUT, **CALIBRATE, **INT8, ("torch_compile",): "--torch-compile"}
EXPORT: dict[Path, str] = {**CALIBRATE, **INT8}
INSPECT: dict[Path, str] = {**OUT}
TWO_PHASE: dict[Path, str] = {**OUT, **DATA}
TCNN: dict[Path, str] = {**OUT}

_TABLES: dict[str, dict[Path, str]] = {"train": TRAIN, "search": SEARCH, "search masks": SEARCH_MASKS,
                                       "table": TABLE, "build": BUILD, "export": EXPORT, "inspect": INSPECT,
                                       "two-phase": TWO_PHASE, "tcnn": TCNN}


def options_for(command: str | None, mode: str | None = None) -> dict[Path, str]:
    """The field -> option table of ``archspec COMMAND [MODE]`` (empty for a command without one)."""
    return _TABLES.get(f"{command} {mode}" if mode else str(command), {})
