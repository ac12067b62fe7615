"""Tabulate a finite space on an Optuna storage: ``archspec table SPACE`` (issue 52).

A NAS-benchmark table in the manner of NAS-Bench-201 / JAHS-Bench-201: every point of a finite space is trained
once per seed under one written-down protocol (:func:`table_protocol`), and everything a search could ask of it
is kept (:mod:`archspec.search._tabulation.rows`), so that search methods can be compared on the table in seconds
(``archspec search --oracle``).

The work is an Optuna study (``table.<space>``), one trial per (point, seed):

* the first worker enqueues every pair it is asked for (``study.enqueue_trial`` with the point's parameters and
  the seed as user attributes), in a fixed order: the points of a seeded permutation of the space (seed 0), so
  that the first ``designs`` are that many points spread at random over the space (the seed check's), then the
  space's named points (:data:`NAMED_POINTS`), then the rest; the seeds of a point back to back;
* any number of workers on the same storage take WAITING trials the way Optuna's own ``ask`` does (the storage
  moves a trial from WAITING to RUNNING for one process only); two that enqueued the same pair at the same
  moment both see it, and the later trial steps back (``duplicate_of``), so no pair is trained twice;
* a worker killed mid-pair leaves a RUNNING trial: the next worker to look marks it failed (its process is gone
  on this host, or, on PostgreSQL, its Optuna heartbeat is stale:
  :func:`archspec.search._storage.fail_zombie_trials`)
  and enqueues the pair again -- Optuna's ``RetryFailedTrialCallback`` idea, done on the same storage;
* the protocol is a study user attribute: a worker whose protocol differs is refused before it writes anything.

A table's rows go out and in through :mod:`archspec.search._tabulation.exchange`: ``export_table`` writes the
COMPLETE trials' rows as the JSON lines + ``.meta.json`` sidecar that :func:`archspec.search.load_table` reads;
``import_table`` puts an existing table's rows into a study (``levit_small``'s, written by
``bench/space_table.py`` before this module existed), so that export gives the
same rows, byte for byte, in the same order.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import random
import statistics
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState
from pydantic import ValidationError

from archspec._util.urls import hide_password
from archspec.errors import SpecError
from archspec.families.attention.heads import MaskSpec
from archspec.io.builddir import uncreatable
from archspec.ir.analysis import analyze
from archspec.search._evaluation.latency_cache import architecture_key
from archspec.search._space.language import SearchSpace, load_space
from archspec.search._storage import (
    HEARTBEAT_INTERVAL_S,
    StorageInfo,
    check_storage,
    fail_zombie_trials,
    mark_worker,
    resolve_storage,
)
from archspec.train.config import AUGMENTATIONS
from archspec.train.failures import stored_name

__all__ = ["REFERENCE_PROTOCOL", "NAMED_POINTS", "SEED_CHECK_DESIGNS", "GIVE_UP_AFTER", "STATUS_ATTR", "table_protocol",
           "protocol_id", "ordered_points", "tabulate", "TableProgress", "default_storage", "open_table_study",
           "trial_pair", "machine", "git_commit"]

# The reference protocol of the levit_small table (why each choice: research/search-works-notebook.md): Fashion-MNIST
# at 28 px, a class-stratified 2,000-image subset, AdamW 2e-3 / 0.05, batch 64, 938 steps (30 epochs) with 47 warm-up
# steps then cosine, crop and flip, one torch thread; curve points geometric plus the end.  Its hash is the shipped
# table's protocol_id (355be66f46fc with space "levit_small"): keep the keys and values as they are.
REFERENCE_PROTOCOL: dict[str, Any] = {
    "data": "fashion-mnist",
    "image_size": 28,
    "train_images": 2_000,
    "curve_val_images": 2_000,
    "final_val_images": 10_000,
    "batch_size": 64,
    "steps": 938,
    "warmup_steps": 47,
    "lr": 2e-3,
    "weight_decay": 0.05,
    "optimizer": "adamw",
    "augmentation": "flip+crop",
    "curve_steps": [25, 50, 100, 200, 400, 800, 938],
    "zero_cost_batch": 64,
    "threads": 1,
}
# Mask-placement spaces (kind: masks) also record MaiT's ALS (eq. 3) per layer and head at every curve step.
ALS_PROTOCOL = {"window": "3x3", "images": 128}

# Named points of the shipped spaces (the seed papers' designs scaled into the space), by Optuna parameters.
NAMED_POINTS: dict[str, dict[str, dict[str, Any]]] = {
    "levit_small": {
        name: {"stages": "narrow", "stages.0.depth": 2, "stages.0.heads_mix": s0, "stages.1.depth": 2,
               "stages.1.heads_mix": s1}
        for name, (s0, s1) in {"LeViT-128S-like": ("levit_bias", "levit_bias"), "ConViT-Ti-like": ("gpsa", "mhsa"),
                               "DeiT-Ti-like": ("mhsa", "mhsa"), "MaiT-Sch2-like": ("mask3_mhsa", "mhsa"),
                               "CMHSA-like": ("signed_bias", "signed_bias")}.items()
    },
    "mait_small": {
        name: dict(zip(("stages.0.heads_mix.masked.0-1", "stages.0.heads_mix.masked.2-3",
                        "stages.0.heads_mix.masked.4-5"), counts))
        for name, counts in {"no masks": (0, 0, 0), "every head masked": (3, 3, 3), "Sch.1-like": (1, 1, 1),
                             "Sch.2-like": (2, 1, 0)}.items()
    },
}
SEED_CHECK_DESIGNS = 24  # the first points of the fixed order: the seed check's (six seeds each)
GIVE_UP_AFTER = 4  # a worker whose first this many tries all failed stops: its input is wrong, not one pair
STATUS_ATTR = "status"       # trial user attr: "claimed" -> "training" -> "trained"


def protocol_id(protocol: dict) -> str:
    """The first 12 hex digits of the SHA-256 of the protocol as sorted JSON: rows of two protocols with different
    ids are not comparable.  Raises nothing."""
    return hashlib.sha256(json.dumps(protocol, sort_keys=True).encode()).hexdigest()[:12]


_INT_FIELDS = ("image_size", "train_images", "curve_val_images", "final_val_images", "batch_size", "steps",
               "warmup_steps", "zero_cost_batch", "threads")


def table_protocol(space: SearchSpace, **overrides: Any) -> dict[str, Any]:
    """The protocol a table of ``space`` is written under: :data:`REFERENCE_PROTOCOL` with ``space`` set, the
    ALS record for mask-placement spaces, then the space file's own ``protocol:`` fields (mait_small trains 1,876
    steps: docs/search-works.md), then ``overrides`` (``None`` values ignored).

    Raises:
        SpecError: an unknown field, a non-positive count, curve steps that are not increasing or do not end at
            ``steps``, a learning rate or weight decay that is not finite and >= 0 -- located at the space file's
            ``protocol.<field>`` when the space's own fields are at fault, at ``protocol.<field>`` otherwise.
    """
    protocol: dict[str, Any] = {"space": space.name, **REFERENCE_PROTOCOL}
    if space.kind == "masks":
        protocol["als"] = dict(ALS_PROTOCOL)
    try:
        _apply(protocol, space.protocol)
    except SpecError as exc:
        raise space.locate(exc) from None
    _apply(protocol, overrides)
    return protocol


def _apply(protocol: dict[str, Any], fields: dict[str, Any]) -> None:
    """Set ``fields`` (``None`` values ignored) in ``protocol`` and check the result; raises SpecError."""
    for key, value in fields.items():
        if value is None:
            continue
        if key not in protocol or key == "space":
            raise SpecError.single(("protocol", key), f"unknown protocol field {key!r}",
                                   f"fields: {', '.join(sorted(k for k in protocol if k != 'space'))}")
        protocol[key] = value
    _check_protocol(protocol)


def _positive_int(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def _check_protocol(p: dict) -> None:
    for key in _INT_FIELDS:
        if not _positive_int(p[key]):
            raise SpecError.single(("protocol", key), f"{key} must be a positive integer, got {p[key]!r}")
    _check_words(p)
    for key in ("lr", "weight_decay"):
        if not isinstance(p[key], int | float) or not math.isfinite(p[key]) or p[key] < 0:
            raise SpecError.single(("protocol", key), f"{key} must be a finite number >= 0, got {p[key]!r}")
    steps = p["curve_steps"]
    if (not isinstance(steps, list) or not steps or any(isinstance(s, bool) or not isinstance(s, int) for s in steps)
            or steps != sorted(set(steps)) or steps[0] < 1 or steps[-1] != p["steps"]):
        raise SpecError.single(("protocol", "curve_steps"), f"curve steps must be increasing positive step numbers "
                               f"ending at steps ({p['steps']}), got {steps!r}", "e.g. 25 50 100 200 400 800 938")


def _check_words(p: dict) -> None:
    """The protocol's text fields and its ALS record by type (a number where a name belongs failed every pair, or
    was a TypeError): ``data`` and ``optimizer`` text (whether timm has the optimizer is the torch half's check,
    :func:`_real_trainer`), ``augmentation`` one of the training loop's, ``als`` ``{window: RxC with odd sides,
    images: N}``."""
    if not isinstance(p["data"], str) or not p["data"].strip():
        raise SpecError.single(("protocol", "data"), f"data must be a data set's name or a path (text), got "
                               f"{p['data']!r}", "e.g. fashion-mnist, digits or a directory of images")
    if not isinstance(p["optimizer"], str) or not p["optimizer"].strip():
        raise SpecError.single(("protocol", "optimizer"), f"optimizer must be a timm optimizer's name (text), got "
                               f"{p['optimizer']!r}", "e.g. adamw or sgd")
    if p["augmentation"] not in AUGMENTATIONS:
        raise SpecError.single(("protocol", "augmentation"), f"augmentation must be one of "
                               f"{', '.join(AUGMENTATIONS)}, got {p['augmentation']!r}")
    if "als" in p:
        _check_als(p["als"])


def _check_als(als: Any) -> None:
    """A mask table's ALS record: ``{window: "RxC", images: N}`` (the window of MaiT eq. 3, odd sides)."""
    if not isinstance(als, dict) or set(als) != set(ALS_PROTOCOL):
        raise SpecError.single(("protocol", "als"), f"als must be a mapping {{window: RxC, images: N}}, got {als!r}",
                               "e.g. als: {window: 3x3, images: 128}")
    if not _positive_int(als["images"]):
        raise SpecError.single(("protocol", "als", "images"), f"als.images must be a positive integer, got "
                               f"{als['images']!r}")
    try:
        MaskSpec(window=als["window"])
    except ValidationError as exc:
        message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise SpecError.single(("protocol", "als", "window"), f"als.window {als['window']!r}: {message}",
                               "e.g. 3x3 (odd sides: the window is centred on its query)") from None


def ordered_points(space: SearchSpace) -> list[tuple[int, dict, Any]]:
    """``(index, params, spec)`` of every point: a seeded permutation (seed 0) of the space's points, the named
    points (:data:`NAMED_POINTS`) moved to just after the first :data:`SEED_CHECK_DESIGNS` (the seed check's
    points stay a random draw).  ``index`` is the point's place in :meth:`SearchSpace.points`.  Raises
    SpecError for a space that is not finite (:meth:`SearchSpace.points`)."""
    points = [(i, p, s) for i, (p, s) in enumerate(space.points(limit=2_000))]
    random.Random(0).shuffle(points)
    named = list(NAMED_POINTS.get(space.name, {}).values())
    head, rest = points[:SEED_CHECK_DESIGNS], points[SEED_CHECK_DESIGNS:]
    moved = [pt for pt in rest if pt[1] in named]
    return head + moved + [pt for pt in rest if pt[1] not in named]


def _label(space: SearchSpace, params: dict) -> str:
    """A point's label: levit_small's ``narrow 2x mask3_bias / 1x gpsa``, else ``param=value`` pairs by the last
    part of each name (``masked.0-1=2 masked.2-3=1 masked.4-5=0``)."""
    if space.name == "levit_small":
        return (f"{params['stages']} {params['stages.0.depth']}x {params['stages.0.heads_mix']} / "
                f"{params['stages.1.depth']}x {params['stages.1.heads_mix']}")
    return " ".join(f"{'.'.join(k.split('.')[-2:])}={v}" for k, v in params.items())


def _named(space: SearchSpace, params: dict) -> str | None:
    return next((name for name, p in NAMED_POINTS.get(space.name, {}).items() if p == params), None)


def default_storage(space_name: str) -> str:
    """``journal:runs/tables/<space>.journal``: a lock-protected append-only file any number of processes on this
    machine share (PostgreSQL spreads one table over machines: ``storage="postgresql://..."``)."""
    return f"journal:{Path('runs') / 'tables' / f'{space_name}.journal'}"


def study_name(space_name: str) -> str:
    return f"table.{space_name}"


# ----------------------------------------------------------------------------------------------- the study
def open_table_study(space: SearchSpace, protocol: dict, storage: str | None,
                     create: bool) -> tuple[optuna.Study, StorageInfo]:
    """Open (or, with ``create``, create) the table study; refuse another protocol before writing anything.

    Raises:
        SpecError: a bad storage (:func:`archspec.search._storage.check_storage`), no such study
            (``create=False``), a study written under another protocol.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # a worker's own lines say what it does
    url = _table_url(space.name, storage)
    if not create and not _exists(url):
        raise SpecError.single(("storage",), f"no table of {space.name} in {hide_password(url)}",
                               f"tabulate it first: archspec table {space.name}")
    if storage is None and create:  # the default storage's folder is archspec's own (runs/tables)
        _default_folder(make=True)
    check_storage(url)
    info = resolve_storage(url)
    name = study_name(space.name)
    summaries = {s.study_name: s for s in optuna.get_all_study_summaries(info.storage, include_best_trial=False)}
    if name in summaries:
        old = summaries[name].user_attrs.get("protocol")
        if old is not None and old != protocol:
            diff = sorted(k for k in set(old) | set(protocol) if old.get(k) != protocol.get(k))
            raise SpecError.single(("protocol",), f"the table of {space.name} in {info.url} was written under another "
                                   f"protocol (fields {', '.join(diff)} differ: "
                                   + "; ".join(f"{k} {old.get(k)!r} there, {protocol.get(k)!r} here" for k in diff)
                                   + ")", "resume it with the same options, or use another `storage`", info.url)
    elif not create:
        raise SpecError.single(("storage",), f"no table of {space.name} in {info.url}",
                               f"tabulate it first: archspec table {space.name}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(study_name=name, storage=info.storage, direction="maximize", load_if_exists=True)
    if name not in summaries:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ExperimentalWarning
            study.set_metric_names(["final val top-1"])
        study.set_user_attr("protocol", protocol)
        study.set_user_attr("protocol_id", protocol_id(protocol))
        # Two workers creating the study at once: both wrote; a different protocol would show here.
        if study.user_attrs.get("protocol") != protocol:
            raise SpecError.single(("protocol",), f"another worker created the table of {space.name} in {info.url} "
                                   "under another protocol at the same moment", "use the same options", info.url)
    return study, info


def _table_url(space_name: str, storage: str | None) -> str:
    """The table's storage URL (:func:`default_storage` for ``None``).

    Raises:
        SpecError: at ``storage``: ``memory``, where a table is lost when its worker ends (no export, report or other
            worker can read its rows).
    """
    if storage is not None and storage.strip() == "memory":
        raise SpecError.single(("storage",), "a table in memory is lost when this worker ends: no export, report or "
                               "other worker could read its rows",
                               "give `storage` journal:PATH (workers on one machine) or postgresql://... (several)")
    return storage or default_storage(space_name)


def _default_folder(make: bool) -> None:
    """Check (and with ``make`` create) ``runs/tables``, the default storage's folder, in the working directory.

    Raises:
        SpecError: at ``storage``: a file on the way (a file named ``runs``), or a directory this process may not
            write (a read-only working directory) -- before anything is trained.
    """
    folder = Path.cwd() / "runs" / "tables"
    blocked = uncreatable(folder)
    if blocked is None and make:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            blocked = exc.strerror or str(exc)
    if blocked is not None:
        raise SpecError.single(("storage",), f"cannot create runs/tables, the default storage's folder: {blocked}",
                               "give a `storage` elsewhere (journal:PATH)")


def check_table_storage(space_name: str, storage: str | None) -> None:
    """What :func:`open_table_study` refuses of ``storage`` before it connects, checked without creating anything
    (:func:`tabulate` runs it before it loads the data).  Raises SpecError at ``storage``."""
    url = _table_url(space_name, storage)
    if storage is None:
        _default_folder(make=False)
        if not (Path.cwd() / "runs" / "tables").is_dir():
            return  # made by the study's first worker: nothing there yet to check
    check_storage(url)


def _exists(url: str) -> bool:
    if url.startswith("journal:"):
        return Path(url[len("journal:"):]).expanduser().is_file()
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///"):]).expanduser().is_file()
    return True


def trial_pair(trial: optuna.trial.FrozenTrial) -> tuple[str, int] | None:
    key, seed = trial.user_attrs.get("key"), trial.user_attrs.get("seed")
    return (key, seed) if isinstance(key, str) and isinstance(seed, int) else None


def _completed(trials: Iterable[optuna.trial.FrozenTrial]) -> set[tuple[str, int]]:
    """Pairs with a COMPLETE trial (a row in the table)."""
    return {p for t in trials if t.state == TrialState.COMPLETE and (p := trial_pair(t)) is not None}


def _covered(trials: Iterable[optuna.trial.FrozenTrial]) -> set[tuple[str, int]]:
    """Pairs with a trial that is done, running or queued."""
    return {p for t in trials if t.state in (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING)
            and (p := trial_pair(t)) is not None}


def _given_up(trials: Iterable[optuna.trial.FrozenTrial], limit: int = 2) -> set[tuple[str, int]]:
    """Pairs whose training failed ``limit`` times by itself (a diverged loss), not by a dead worker."""
    counts: dict[tuple[str, int], int] = {}
    for t in trials:
        if t.state == TrialState.FAIL and t.user_attrs.get("failure") == "training" and (p := trial_pair(t)):
            counts[p] = counts.get(p, 0) + 1
    return {p for p, n in counts.items() if n >= limit}


def _enqueue(study: optuna.Study, todo: Sequence[tuple[int, dict, str, int]]) -> None:
    for index, params, key, seed in todo:
        # the seed is a parameter too (the dashboard shows it), fixed like the point's
        study.enqueue_trial({**params, "seed": seed}, user_attrs={"key": key, "seed": seed, "index": index})


def _pop(study: optuna.Study, wanted: set[tuple[str, int]]) -> optuna.Trial | None:
    """Move one WAITING trial of a wanted pair to RUNNING for this process only (what ``Study.ask`` does with its
    queue, restricted to this worker's pairs); ``None`` when there is none."""
    storage = study._storage
    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if trial_pair(t) not in wanted:
            continue
        try:
            if not storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        return optuna.Trial(study, t._trial_id)
    return None


def _duplicate_of(study: optuna.Study, trial: optuna.Trial, pair: tuple[str, int]) -> int | None:
    """Another trial that holds ``pair``: COMPLETE, RUNNING and training, or RUNNING, claimed, and older.  Two
    workers that claim a pair at the same instant see each other; the newer steps back."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)):
        if t.number == trial.number or trial_pair(t) != pair:
            continue
        status = t.user_attrs.get(STATUS_ATTR)
        if t.state == TrialState.COMPLETE or status in ("training", "trained") or (
                status == "claimed" and t.number < trial.number):
            return t.number
    return None


class _Heartbeat:
    """Optuna's heartbeat for one trial on an RDB storage (what ``Study.optimize`` runs in a thread), so that a
    worker on another machine can tell this one died (``optuna.storages.fail_stale_trials``)."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial):
        self.storage, self.trial_id = study._storage, trial._trial_id
        self.stop = threading.Event()
        self.thread = None
        if isinstance(self.storage, optuna.storages.RDBStorage) and self.storage.is_heartbeat_enabled():
            self.storage.record_heartbeat(self.trial_id)
            self.thread = threading.Thread(target=self._beat, daemon=True)
            self.thread.start()

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT_INTERVAL_S):
            self.storage.record_heartbeat(self.trial_id)

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()


# ----------------------------------------------------------------------------------------------- the worker
@dataclass
class TableProgress:
    """What a worker did: pairs trained here, pairs of its request not yet done by any worker (``left``, read from
    the storage after each pair, so that a line counts the other workers' pairs too), failures, and its seconds
    per pair."""

    wanted: int
    trained: int = 0
    failed: int = 0
    left: int = 0
    seconds: list[float] = field(default_factory=list)
    given_up: list[tuple[str, int]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why each failed pair failed, in order
    stopped: bool = False  # gave up: :data:`GIVE_UP_AFTER` failures and nothing trained
    pending: set[tuple[str, int]] = field(default_factory=set, repr=False)  # the request less given-up pairs

    def eta_s(self, workers: int) -> float | None:
        """Seconds until the request is done at this worker's median seconds per pair, shared by ``workers``
        workers.  The median, not the mean: one pair whose worker was stopped for an hour (SIGSTOP, a suspended
        laptop) would otherwise multiply the ETA of every later line (a pilot's went from 2 h 40 min to 13 h)."""
        if not self.seconds:
            return None
        return self.left * statistics.median(self.seconds) / max(1, workers)


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "ETA after the first pair"
    h, m = divmod(int(seconds) // 60, 60)
    return f"ETA {h} h {m:02d} min"


def tabulate(space: str | SearchSpace, *, seeds: Sequence[int] = (0, 1, 2), designs: int | None = None,
             storage: str | None = None, protocol: dict | None = None, max_pairs: int | None = None,
             log: Callable[[str], None] = print, train: Callable | None = None) -> TableProgress:
    """Train the pairs (point, seed) of a finite space that its table study lacks, as one worker among any number.

    Args:
        space: a space name, file or :class:`~archspec.search.SearchSpace` (finite: a few hundred points).
        seeds: the seeds of every point (the reference is the mean of seeds 0, 1, 2; the seed check adds 3-5).
        designs: only the first N points of the fixed order (:func:`ordered_points`; the seed check: 24).
        storage: an Optuna storage URL (``journal:PATH``, ``sqlite:///PATH``, ``postgresql://...``); default
            :func:`default_storage`.
        protocol: the table protocol (default :func:`table_protocol` of the space).
        max_pairs: stop after training this many pairs (``None``: until nothing of the request is left).
        log: where progress lines go (one per pair, with an ETA).
        train: ``(spec, seed) -> row fields`` in place of :mod:`archspec.search._tabulation.rows` (tests).

    Returns:
        :class:`TableProgress` of this worker; ``stopped`` when its first :data:`GIVE_UP_AFTER` tries all failed
        and it trained nothing (a wrong input fails every pair: stopped, not tried on every pair twice).

    Raises:
        SpecError: a bad storage (``memory``; the default one's ``runs/tables`` that cannot be made), a space that
            is not finite, a study written under another protocol, a bad seed (negative or over 2**32 - 1), a data
            set that is not installed, a protocol the data or the space's proxies cannot train (a subset the data
            cannot give, another image size, an optimizer timm lacks: :func:`_real_trainer`) -- all before any
            trial is written; a field the space file set is located there.
    """
    space = space if isinstance(space, SearchSpace) else load_space(space)
    protocol = protocol or table_protocol(space)
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**32:
            raise SpecError.single(("seeds",), f"a seed must be an integer in 0..4294967295, got {s!r}")
    points = ordered_points(space)
    if designs is not None:
        points = points[:designs]
    keyed = [(i, p, architecture_key(spec), spec) for i, p, spec in points]
    specs = {key: (i, p, spec) for i, p, key, spec in keyed}
    check_table_storage(space.name, storage)  # cheap, before the data are read
    try:  # data and settings checked before the study is touched
        train = train or _real_trainer(protocol, [(p, spec) for _, p, _, spec in keyed])
    except SpecError as exc:
        raise _in_space_file(space, protocol, exc) from None
    study, info = open_table_study(space, protocol, storage, create=True)
    wanted = [(i, p, key, s) for i, p, key, _ in keyed for s in dict.fromkeys(seeds)]
    wanted_pairs = {(key, s) for _, _, key, s in wanted}
    progress = TableProgress(wanted=len(wanted))
    commit = git_commit()  # the code this worker runs: read once, before a later commit can change HEAD
    log(f"table of {space.name} in {info.url}: {len(keyed)} points x {len(set(seeds))} seeds "
        f"(protocol {protocol_id(protocol)})")
    while max_pairs is None or progress.trained < max_pairs:
        if progress.failed >= GIVE_UP_AFTER and not progress.trained:
            progress.stopped = True  # every pair failing is the input's fault, not one pair's: say so, stop
            break
        fail_zombie_trials(study)
        trials = study.get_trials(deepcopy=False)
        done = _completed(trials)
        skip = _given_up(trials) - done
        covered = _covered(trials)
        _enqueue(study, [w for w in wanted if (w[2], w[3]) not in covered | skip])
        progress.pending = wanted_pairs - skip
        progress.left = len(progress.pending - done)
        progress.given_up = sorted(skip & wanted_pairs)
        trial = _pop(study, progress.pending)
        if trial is None:
            break
        _run_pair(study, trial, space, specs, protocol, train, progress, log, commit)
    return progress


def _real_trainer(protocol: dict, points: Sequence[tuple[dict, Any]]) -> Callable:
    """``(spec, seed) -> row fields`` with the protocol's training settings checked and its data loaded now, before
    the worker writes anything: a missing data set, a bad ``augmentation`` or optimizer, a subset the data cannot
    give, an ``image_size`` the ``(params, spec)`` points' proxies do not train at -- each is exit 2 once, not a
    failed trial for every pair.

    Raises:
        SpecError: the data set is not installed, or a protocol field is invalid (at ``protocol.<field>``).
    """
    import torch  # noqa: PLC0415 - the torch half, loaded when pairs are to be trained

    from archspec.search._tabulation import rows as table_rows  # noqa: PLC0415 - as above

    table_rows.check_training(protocol)
    torch.set_num_threads(protocol["threads"])
    data = table_rows.reference_data(protocol)
    problem = table_rows.proxy_size_problem(points, data[0], protocol)
    if problem is not None:
        raise SpecError.single(("protocol", "image_size"), problem, "the data are decoded at image_size: give the "
                               "size the proxy trains at")

    def train(spec, seed: int) -> dict:
        data_curve, data_final = data
        row = table_rows.zero_cost_row(spec, data_curve, protocol, seed)
        row.update(table_rows.train_row(spec, data_curve, data_final, protocol, seed))
        return row

    return train


def _in_space_file(space: SearchSpace, protocol: dict, exc: SpecError) -> SpecError:
    """``exc`` with each problem of a ``protocol.<field>`` whose value is the space file's own (its ``protocol:``)
    located there, as :func:`table_protocol` locates the fields it checks; the others stay at ``protocol.<field>``
    (the command line names their flags)."""
    problems = []
    for p in exc.problems:
        path = tuple(p.path)
        own = len(path) >= 2 and path[0] == "protocol" and path[1] in space.protocol
        if own and space.protocol[path[1]] == protocol.get(path[1]) and p.file is None:
            p = space.locate(SpecError([p])).problems[0]
        problems.append(p)
    return SpecError(problems)


def _run_pair(study: optuna.Study, trial: optuna.Trial, space: SearchSpace, specs: dict, protocol: dict,
              train: Callable, progress: TableProgress, log: Callable[[str], None], commit: str) -> None:
    mark_worker(trial)
    key, seed = trial.user_attrs["key"], trial.user_attrs["seed"]
    trial.set_user_attr(STATUS_ATTR, "claimed")
    other = _duplicate_of(study, trial, (key, seed))
    if other is not None:
        trial.set_user_attr("duplicate_of", other)
        trial.set_user_attr("fail_reason", f"duplicate of trial {other}")
        study.tell(trial, state=TrialState.FAIL)
        return
    trial.set_user_attr(STATUS_ATTR, "training")
    index, params, spec = specs[key]
    space.sample(trial)  # records the point's parameters (the enqueued values) for the dashboard
    trial.suggest_int("seed", 0, 2**32 - 1)
    beat = _Heartbeat(study, trial)
    start = time.perf_counter()
    try:
        fields = train(spec, seed)
    except KeyboardInterrupt:
        trial.set_user_attr("failure", "interrupted")
        study.tell(trial, state=TrialState.FAIL)
        raise
    except Exception as exc:  # noqa: BLE001 - a diverged training fails its pair (tried twice), not the worker
        trial.set_user_attr("failure", "training")
        trial.set_user_attr("fail_reason", f"{stored_name(exc)}: {str(exc)[:300]}")
        study.tell(trial, state=TrialState.FAIL)
        progress.failed += 1
        progress.reasons.append(f"{stored_name(exc)}: {str(exc)[:200]}")
        log(f"pair {index} seed {seed}: failed ({progress.reasons[-1]})")
        return
    finally:
        beat.close()
    row = _row(space, protocol, index, params, key, seed, spec, fields, commit)
    trial.set_user_attr("row", row)
    trial.set_user_attr(STATUS_ATTR, "trained")
    study.tell(trial, row["final_accuracy"])
    progress.trained += 1
    progress.seconds.append(time.perf_counter() - start)
    # Counted from the storage, not this worker's last look: the others finished pairs meanwhile (two workers
    # that counted down on their own both printed [27/48] for the 28th pair).
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
    done = _completed(trials)
    progress.left = len(progress.pending - done)
    workers = 1 + sum(1 for t in trials if t.state == TrialState.RUNNING)
    log(f"[{progress.wanted - progress.left}/{progress.wanted}] {index:3d} seed {seed} {row['label']}: "
        f"{row['final_accuracy']:.4f} ({row['train_seconds']:.0f} s train, {row['eval_seconds']:.0f} s eval); "
        f"{progress.left} left, {_fmt_eta(progress.eta_s(workers))} with {workers} worker(s)")


def _row(space, protocol, index, params, key, seed, spec, fields: dict, commit: str) -> dict:
    """A table row in the shipped format's field order (``bench/space_table.py``'s)."""
    counts = analyze(spec)
    host = machine()
    row = {"protocol_id": protocol_id(protocol), "key": key, "index": index, "params": params,
           "label": _label(space, params), "hand": _named(space, params), "seed": seed, "macs": counts.macs,
           "n_params": counts.params}
    row.update(fields)
    row["commit"] = commit
    row["machine"] = f"{host['cpu']}, {host['cores']} cores, torch {host['torch']}"
    return row


def git_commit() -> str:
    """``abc1234`` (``+dirty`` with uncommitted changes to tracked files other than the tables) of the archspec
    checkout that runs, else ``$ARCHSPEC_COMMIT`` or ``unknown`` (an installed copy, a lent machine's tree without
    ``.git``)."""
    root = Path(__file__).resolve().parents[3]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        # the tables themselves are data that workers append to, not the code that trains: not "dirty"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)archspec/search/tables"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("ARCHSPEC_COMMIT", "unknown")


def machine() -> dict[str, Any]:
    """``{"cpu", "cores", "python", "torch"}`` of this machine (torch's version without importing it)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "none"
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "torch": torch_version}
