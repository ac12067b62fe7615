"""``archspec train`` as safe as ``build`` (issue #33): fine-tuning from a build keeps its weights, bad options and
damaged files are exit 2 with a message naming the option or file and nothing written, and no run directory is
left that archspec can neither resume nor replace."""

from __future__ import annotations

import fcntl
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from train_fixtures import TINY, folder, spec_file  # noqa: F401 - pytest fixtures, used by name
from train_fixtures import image_folder as _image_folder
from train_fixtures import quick_config as _config

import archspec
from archspec.cli import main
from archspec.io.artifact import save
from archspec.io.builddir import write_build
from archspec.train import fit

QUICK = ["--steps", "2", "--max-images", "40", "--batch-size", "8", "--workers", "0", "--quiet"]


def _train(spec, folder, out, *extra) -> list[str]:
    return ["train", str(spec), "--data", str(folder), "--out", str(out), *QUICK, *extra]


def _snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` (relative name -> bytes): "left as it was" is equality of two of these."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _filled_build(path: Path, value: float = 0.0123) -> Path:
    model = archspec.compile(TINY)
    with torch.no_grad():
        for p in model.state_dict().values():
            if p.is_floating_point():
                p.fill_(value)
    write_build(path, lambda d: save(model, d), {"test": True})
    return path


# ------------------------------------------------------------------ 1. fine-tuning keeps the build's weights
def _kept(model_dir: Path, value: float = 0.0123) -> tuple[int, int]:
    from safetensors.torch import load_file

    weights = {k: v for k, v in load_file(str(model_dir / "model.safetensors")).items() if v.is_floating_point()}
    return sum(bool((v - value).abs().max() <= 1e-6) for v in weights.values()), len(weights)


def test_train_on_a_build_dir_fine_tunes_its_weights_through_the_cli(one_thread, folder, tmp_path):
    build = _filled_build(tmp_path / "b")
    assert main(["train", str(build), "--data", str(folder), "--out", str(tmp_path / "r"), "--steps", "1",
                 "--lr", "1e-9", "--max-images", "40", "--batch-size", "8", "--workers", "0", "--quiet"]) == 0
    kept, total = _kept(tmp_path / "r" / "model")
    assert total > 5 and kept == total  # every tensor still 0.0123 after a step at lr 1e-9


def test_fit_on_a_build_dir_fine_tunes_its_weights(one_thread, folder, tmp_path):
    build = _filled_build(tmp_path / "b")
    fit(build, folder, _config(steps=1, lr=1e-9, warmup_steps=0, eval_every=1), out=tmp_path / "r",
        max_images=40, progress=False)
    kept, total = _kept(tmp_path / "r" / "model")
    assert total > 5 and kept == total


def test_a_build_with_truncated_weights_is_refused(folder, tmp_path, capsys):
    build = _filled_build(tmp_path / "b")
    weights = build / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    assert main(_train(build, folder, tmp_path / "r")) == 2
    assert "model.safetensors" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_a_240_character_out_trains_and_restarts_leaving_no_staging(one_thread, folder, tmp_path, spec_file):
    run = tmp_path / "runs" / ("r" * 240)  # legal (NAME_MAX is 255 bytes); its staging siblings must fit too
    assert main(_train(spec_file, folder, run)) == 0
    assert main(_train(spec_file, folder, run, "--restart")) == 0
    assert os.listdir(run.parent) == [run.name]
    assert not [p for p in run.rglob(".*")]  # no staging directory or temporary file left inside
    assert archspec.load(run / "model") is not None


# ------------------------------------------------------------------ 1. resume only what can be resumed
def _interrupted_run(spec_file, folder, out: Path) -> Path:
    """A run with a checkpoint that did not finish: what ``kill -9`` after a checkpoint leaves."""
    assert main(_train(spec_file, folder, out, "--steps", "4", "--checkpoint-every", "1")) == 0
    import shutil

    shutil.rmtree(out / "model")
    (out / "summary.json").unlink()
    return out


def test_resume_with_another_spec_is_refused(one_thread, folder, tmp_path, spec_file, capsys):
    run = _interrupted_run(spec_file, folder, tmp_path / "r")
    other = tmp_path / "other.yaml"
    other.write_text(TINY.replace("mlp_ratio: 2", "mlp_ratio: 2, qkv_bias: false"))
    before = _snapshot(run)
    assert main(_train(other, folder, run, "--resume")) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "spec.yaml" in err and "differs" in err
    assert _snapshot(run) == before
    assert main(_train(spec_file, folder, run, "--steps", "4", "--resume")) == 0  # its own spec continues
    assert (run / "model" / "model.safetensors").is_file()


def test_resume_of_a_finished_run_is_refused_and_changes_nothing(one_thread, folder, tmp_path, spec_file, capsys):
    run = tmp_path / "r"
    assert main(_train(spec_file, folder, run)) == 0
    before = _snapshot(run)
    assert main(_train(spec_file, folder, run, "--resume")) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "finished" in err and "--restart" in err
    assert _snapshot(run) == before


def test_a_second_run_into_a_locked_out_is_refused(folder, tmp_path, spec_file, capsys):
    out = tmp_path / "r"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running `archspec train` holds
    try:
        assert main(_train(spec_file, folder, out)) == 2
    finally:
        os.close(fd)
    assert "another `archspec train`" in capsys.readouterr().err and os.listdir(out) == []


@pytest.mark.parametrize(("option", "value", "words"), [
    ("--warmup-epochs", "-2", ">= 0"), ("--warmup-epochs", "inf", ">= 0"), ("--warmup-epochs", "nan", ">= 0"),
    ("--layer-decay", "nan", "(0, 1]"), ("--layer-decay", "-0.5", "(0, 1]"),
    ("--aa", "rand-garbage-xyz", "garbage"), ("--epochs", "inf", "positive"), ("--opt", "adamw9000", "timm"),
    ("--seed", "-1", "2^31"),
])
def test_bad_options_are_refused_before_anything_is_written(tmp_path, spec_file, option, value, words, capsys):
    out = tmp_path / "r"
    assert main(["train", str(spec_file), "--out", str(out), "--steps", "2", option, value]) == 2
    err = capsys.readouterr().err
    assert option in err and words in err and "Traceback" not in err and not out.exists()


def test_the_levit_recipe_needs_a_teacher(tmp_path, capsys):
    assert main(["train", "levit_128s", "--recipe", "levit", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "--recipe" in err and "--teacher" in err and not (tmp_path / "r").exists()


def test_a_one_class_image_folder_is_refused(tmp_path, spec_file, capsys):
    data = _image_folder(tmp_path / "data", per_class=6)
    import shutil

    shutil.rmtree(data / "vertical")
    assert main(_train(spec_file, data, tmp_path / "r")) == 2
    err = capsys.readouterr().err
    assert "at least 2" in err and str(data) in err and not (tmp_path / "r").exists()


# ------------------------------------------------------------------ 2. no run directory is ever stuck
def test_a_run_stopped_before_its_first_checkpoint_is_replaced_with_restart(one_thread, folder, tmp_path,
                                                                             spec_file, monkeypatch, capsys):
    from archspec.train.loop import Trainer

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt  # Ctrl-C during the first step

    run = tmp_path / "r"
    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "step", interrupted)
        assert main(_train(spec_file, folder, run)) == 130
    assert {"run.json", "spec.yaml"} <= set(os.listdir(run)) and not (run / "checkpoint.pt").exists()
    capsys.readouterr()
    assert main(_train(spec_file, folder, run, "--resume")) == 2
    assert "before its first checkpoint" in (err := capsys.readouterr().err) and "--restart" in err
    assert main(_train(spec_file, folder, run)) == 2
    assert "--restart" in capsys.readouterr().err
    assert main(_train(spec_file, folder, run, "--restart")) == 0
    assert archspec.load(run / "model").num_classes == 2


def test_restart_replaces_a_finished_run_but_never_what_archspec_did_not_write(one_thread, folder, tmp_path,
                                                                                spec_file, capsys):
    run = tmp_path / "r"
    assert main(_train(spec_file, folder, run)) == 0
    first = (run / "run.json").stat().st_mtime_ns
    assert main(_train(spec_file, folder, run, "--restart", "--seed", "5")) == 0
    assert (run / "run.json").stat().st_mtime_ns != first and '"seed": 5' in (run / "run.json").read_text()
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main(_train(spec_file, folder, foreign, "--restart")) == 2
    assert os.listdir(foreign) == ["notes.txt"]
    (run / "notes.txt").write_text("mine")  # a user's file inside a run directory: not archspec's any more
    assert main(_train(spec_file, folder, run, "--restart")) == 2
    assert (run / "notes.txt").read_text() == "mine" and (run / "model").is_dir()
    assert main(_train(spec_file, folder, run, "--restart", "--resume")) == 2
    assert "--restart" in capsys.readouterr().err


def test_a_bad_option_with_restart_leaves_the_earlier_run(one_thread, folder, tmp_path, spec_file):
    run = tmp_path / "r"
    assert main(_train(spec_file, folder, run)) == 0
    before = _snapshot(run)
    assert main(_train(spec_file, folder, run, "--restart", "--teacher", "nope")) == 2  # no distillation head
    assert _snapshot(run) == before


# ------------------------------------------------------------------ 3. damaged inputs
def _png_header(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height`` (PIL refuses it at open: a decompression bomb)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IEND", b""))


def test_damaged_images_are_skipped_with_a_warning_naming_each(one_thread, tmp_path, spec_file, capsys):
    data = _image_folder(tmp_path / "data", per_class=12)
    rng = np.random.default_rng(0)
    (data / "horizontal" / "random.jpg").write_bytes(rng.bytes(2000))
    (data / "horizontal" / "empty.png").write_bytes(b"")
    (data / "vertical" / "bomb.png").write_bytes(_png_header(15000, 15000))
    os.mkfifo(data / "vertical" / "pipe.png")  # opening it would hang the reader
    out = tmp_path / "r"
    assert main(["train", str(spec_file), "--data", str(data), "--out", str(out), "--steps", "6",
                 "--batch-size", "8", "--workers", "0", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "left out 2 file(s)" in err and "pipe.png (not a regular file)" in err and "empty.png (empty)" in err
    assert "Traceback" not in err
    # 26 files, 24 images and 2 damaged ones: the 6 steps of 8 read the training split (80%) at least once
    assert "random.jpg" in err and "bomb.png" in err and "DecompressionBombError" in err


def _damage_all(data: Path) -> dict[Path, bytes]:
    """Overwrite every image under ``data`` with random bytes; return the originals (to repair them)."""
    rng = np.random.default_rng(1)
    originals = {p: p.read_bytes() for p in sorted(data.rglob("*.png"))}
    for path in originals:
        path.write_bytes(rng.bytes(300))
    return originals


@pytest.mark.parametrize("workers", ["0", pytest.param("2", marks=pytest.mark.slow)])
def test_20_damaged_images_in_a_row_stop_the_run_at_data_and_restart_replaces_it(one_thread, tmp_path, spec_file,
                                                                                   capsys, workers):
    data = _image_folder(tmp_path / "data", per_class=12)
    originals = _damage_all(data)
    out = tmp_path / "r"
    argv = ["train", str(spec_file), "--data", str(data), "--out", str(out), "--steps", "2", "--batch-size", "8",
            "--workers", workers, "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "RuntimeError" not in err
    message = err[err.index("error"):]  # after the warnings naming each damaged file
    assert "--data" in message and str(data) in message and "20 damaged images in a row" in message
    assert "--restart" in message and "Caught" not in message  # torch's worker wrapping is not shown
    for path, raw in originals.items():
        path.write_bytes(raw)
    assert main([*argv, "--restart"]) == 0  # the stopped run is archspec's: replaced
    assert (out / "model" / "model.safetensors").is_file()


def test_damaged_images_after_a_checkpoint_leave_the_run_resumable(one_thread, folder, tmp_path, spec_file, capsys):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(folder, data)
    run = _interrupted_run(spec_file, data, tmp_path / "r")  # a checkpoint at step 4 of 4, no model yet
    originals = _damage_all(data)
    capsys.readouterr()
    assert main(_train(spec_file, data, run, "--steps", "8", "--resume")) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--data" in err and "20 damaged images in a row" in err and "--resume" in err
    for path, raw in originals.items():
        path.write_bytes(raw)
    assert main(_train(spec_file, data, run, "--steps", "8", "--resume")) == 0
    assert (run / "model" / "model.safetensors").is_file()


def test_out_that_cannot_be_created_is_refused(tmp_path, spec_file, folder, monkeypatch, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(_train(spec_file, folder, tmp_path / "afile" / "run")) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "not a directory" in err and (tmp_path / "afile").read_text() == "x"

    def refused(self, *args, **kwargs):
        raise PermissionError(1, "Operation not permitted", str(self))  # an immutable (chattr +i) parent

    monkeypatch.setattr(Path, "mkdir", refused)
    assert main(_train(spec_file, folder, tmp_path / "locked" / "run")) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "cannot create the run directory: Operation not permitted" in err


def _unwritable(directory: Path) -> str | None:
    """Make ``directory`` unwritable to this process: ``chattr +i`` (root ignores modes), else mode 0o555; how, or
    ``None`` where neither works here."""
    if subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode == 0:
        return "chattr"
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return "chmod"
    return None


def _writable_again(directory: Path, how: str | None) -> None:
    if how == "chattr":
        subprocess.run(["chattr", "-i", str(directory)], check=True)
    elif how == "chmod":
        directory.chmod(0o755)


@pytest.mark.parametrize("where", ["out", "parent"])
def test_an_unwritable_out_is_refused_naming_it(tmp_path, spec_file, folder, capsys, where):
    """Issue 57: `archspec train SPEC --out DIR` on an existing immutable (or read-only) DIR was a PermissionError
    traceback; now exit 2 naming DIR before anything is read or written.  A new --out under such a directory too."""
    locked = tmp_path / "locked"
    locked.mkdir()
    how = _unwritable(locked)
    if how is None:
        pytest.skip("no way to make a directory unwritable here (root without chattr)")
    try:
        out = locked if where == "out" else locked / "run"
        assert main(_train(spec_file, folder, out)) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and f"{out}: --out:" in err and "not writable" in err
        assert list(locked.iterdir()) == []
    finally:
        _writable_again(locked, how)


class _NotACheckpoint:
    pass


def _wider_checkpoint(tmp_path, folder) -> bytes:
    wide = tmp_path / "wide.yaml"
    wide.write_text(TINY.replace("dim: 16", "dim: 32"))
    assert main(_train(wide, folder, tmp_path / "wide")) == 0
    return (tmp_path / "wide" / "checkpoint.pt").read_bytes()


@pytest.mark.parametrize("damage", ["truncated", "random", "pickle", "no model", "wider spec"])
def test_a_damaged_checkpoint_is_refused_naming_it_and_the_run_is_kept(one_thread, folder, tmp_path, spec_file,
                                                                       damage, capsys):
    run = _interrupted_run(spec_file, folder, tmp_path / "r")
    good = (run / "checkpoint.pt").read_bytes()
    damaged = {"truncated": lambda: good[: len(good) // 2],
               "random": lambda: np.random.default_rng(0).bytes(5000),
               "pickle": lambda: pickle.dumps(_NotACheckpoint()),
               "no model": lambda: _torch_bytes({"step": 1, "trainer": {}}),
               "wider spec": lambda: _wider_checkpoint(tmp_path, folder)}[damage]()
    (run / "checkpoint.pt").write_bytes(damaged)
    before = _snapshot(run)
    capsys.readouterr()
    assert main(_train(spec_file, folder, run, "--steps", "4", "--resume")) == 2
    err = capsys.readouterr().err
    assert "checkpoint.pt" in err and "--resume" in err and "Traceback" not in err
    assert _snapshot(run) == before


def _torch_bytes(obj) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


# ------------------------------------------------------------------ 4. files follow the umask
def test_run_files_follow_the_umask(one_thread, folder, tmp_path, spec_file):
    old = os.umask(0o022)
    try:
        assert main(_train(spec_file, folder, tmp_path / "r")) == 0
    finally:
        os.umask(old)
    for name in ("checkpoint.pt", "run.json", "spec.yaml", "summary.json", "metrics.csv"):
        assert (tmp_path / "r" / name).stat().st_mode & 0o777 == 0o644, name


# ------------------------------------------------------------------ 3. SIGTERM with DataLoader workers
def _first_line(proc: subprocess.Popen, starts: str, deadline: float) -> str | None:
    """The first stdout line of ``proc`` starting with ``starts`` (None: it ended or ``deadline`` passed)."""
    buffer = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if not ready:
            if proc.poll() is not None:
                return None
            continue
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            return None
        buffer += chunk
        for line in buffer.decode(errors="replace").splitlines():
            if line.startswith(starts):
                return line
    return None


@pytest.mark.slow
def test_sigterm_with_dataloader_workers_exits_143_quietly(folder, tmp_path, spec_file):
    """SIGTERM while two DataLoader workers run: the run stops at the next step, the loader shuts its workers down,
    exit 143; no traceback (a worker's ConnectionResetError / EOFError from a queue its parent closed, or the main
    process's "Exception ignored" when the signal lands in the loader's __del__ or a fork hook, where it was lost
    and the run went on).  The failure was intermittent, so 5 runs (at once, to save time), each signalled at
    another moment after its first step (4 steps an epoch: workers start and stop every few steps)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    delays = [0.0, 0.05, 0.15, 0.3, 0.6]
    procs = [subprocess.Popen([sys.executable, "-m", "archspec", "train", str(spec_file), "--data", str(folder),
                               "--out", str(tmp_path / f"run{i}"), "--steps", "100000", "--max-images", "40",
                               "--batch-size", "8", "--workers", "2", "--threads", "1", "--log-every", "1",
                               "--eval-every", "100000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for i in range(len(delays))]
    try:
        deadline = time.monotonic() + 180
        for proc, delay in zip(procs, delays):
            line = _first_line(proc, "step ", deadline)
            assert line is not None, proc.communicate(timeout=30)[1].decode()
            time.sleep(delay)
            proc.send_signal(signal.SIGTERM)
        errors = [proc.communicate(timeout=60)[1].decode(errors="replace") for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for proc, delay, err in zip(procs, delays, errors):
        assert proc.returncode == 143, (delay, err)
        assert "stopped by SIGTERM" in err, (delay, err)
        for word in ("Traceback", "ConnectionResetError", "EOFError", "Exception ignored"):
            assert word not in err, (delay, err)


def test_ranks_stop_where_they_agree_and_evaluation_batches_do_not_stop_one_alone():
    """With several processes (``deferred(together=...)``) a rank's own SIGTERM is only a flag it offers to the
    agreement before each step: :func:`check` (an evaluation batch, whose count differs between ranks) does not
    raise, ``check_together`` raises in every rank when any has one pending -- here the other rank's, simulated by
    a reduction that answers True -- and the block's end is an agreement too.  One process: ``check`` raises."""
    from archspec.train.stop import Terminated, check, check_together, deferred, sigterm_stops

    offered: list[bool] = []

    def others_pending(answer: bool):
        def together(pending: bool) -> bool:
            offered.append(pending)
            return pending or answer
        return together

    with sigterm_stops():
        with pytest.raises(Terminated), deferred(together=others_pending(False)):
            os.kill(os.getpid(), signal.SIGTERM)
            check()  # an evaluation batch: no stop of this rank alone
            assert offered == []
            check_together()  # before the next step: every rank stops here
        assert offered == [True]
        with pytest.raises(Terminated), deferred(together=others_pending(True)):
            check_together()  # no SIGTERM here, but another rank has one
        assert offered == [True, False]
        with pytest.raises(Terminated), deferred(together=others_pending(True)):
            pass  # the block's end agrees too
        with pytest.raises(Terminated), deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            check()


def test_a_forked_worker_does_not_keep_the_run_lock(tmp_path):
    """kill -9 of a run leaves its DataLoader workers alive for a moment; a forked child shares the flock's open
    file description, so it must close its copy, or the next `--resume` finds the directory locked."""
    from archspec.train.run import _RunLock

    out = tmp_path / "r"
    out.mkdir()
    lock = _RunLock(out)
    ready_r, ready_w = os.pipe()
    child = os.fork()
    if child == 0:  # a worker: alive while the parent dies and the next run starts
        os.write(ready_w, b"1")  # after the fork handlers ran, as a DataLoader worker that has started
        time.sleep(3)
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        lock.release()  # what the killed parent's death does to its own descriptor
        _RunLock(out).release()  # the resumed run takes the lock while the child still lives
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(ready_r)
        os.close(ready_w)
