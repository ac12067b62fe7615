"""``archspec train`` / ``archspec.train.fit``: streamed data, run directories, resume after ``kill -9``,
``torchrun`` with two CPU processes, distillation, recipes and progress -- each against an independent
reference (an uninterrupted run, a single-process run, the DeiT formula, a hand-computed loss)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from train_fixtures import TINY, folder, spec_file  # noqa: F401 - pytest fixtures, used by name
from train_fixtures import quick_config as _config

import archspec
from archspec.cli import main
from archspec.errors import SpecError
from archspec.train import Trainer, fit, recipe
from archspec.train.batches import EpochSampler


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def test_fit_streams_an_image_folder_into_a_loadable_run(one_thread, folder, tmp_path):
    result = fit(TINY, folder, _config(steps=30, eval_every=10), out=tmp_path / "run", progress=False)
    run = tmp_path / "run"
    assert {"run.json", "spec.yaml", "checkpoint.pt", "metrics.csv", "metrics.jsonl", "model", "summary.json"} <= set(
        os.listdir(run))
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [10, 20, 30]
    assert rows[-1]["train_loss"] < rows[0]["train_loss"] and result.accuracy > 0.6  # stripes: chance is 0.5
    loaded = archspec.load(run / "model")
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(loaded(x), result.model.eval()(x))
    assert json.loads((run / "summary.json").read_text())["steps"] == 30


def test_epochs_turn_into_steps_and_one_evaluation_per_epoch(one_thread, folder, tmp_path):
    # 48 images, 80/20 split -> 38 train; batch 8 -> 4 steps per epoch (the partial batch dropped)
    result = fit(TINY, folder, _config(epochs=2, warmup_epochs=1), out=None, progress=False)
    assert result.steps == 8 and [s for s, _, _ in result.history] == [4, 8]


def test_out_rules_refuse_what_archspec_did_not_write(folder, tmp_path, spec_file, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    args = ["train", str(spec_file), "--data", str(folder), "--steps", "2", "--batch-size", "4", "--workers", "0"]
    assert main([*args, "--out", str(foreign)]) == 2
    assert "--out" in capsys.readouterr().err and os.listdir(foreign) == ["notes.txt"]
    assert main([*args, "--out", str(tmp_path / "fresh"), "--resume"]) == 2
    assert "--resume" in capsys.readouterr().err and not (tmp_path / "fresh").exists()
    assert main([*args, "--out", str(tmp_path / "run"), "--quiet"]) == 0
    assert main([*args, "--out", str(tmp_path / "run"), "--quiet"]) == 2  # a finished run: --restart or another --out
    assert "--restart" in capsys.readouterr().err
    assert main([*args, "--out", str(tmp_path / "x"), "--lr", "-1"]) == 2  # argparse: must be positive


def _train_cmd(spec_file, folder, out, *extra) -> list[str]:
    return [sys.executable, "-m", "archspec", "train", str(spec_file), "--data", str(folder), "--out", str(out),
            "--batch-size", "8", "--lr", "3e-3", "--workers", "1", "--threads", "1", "--seed", "3",
            "--mixup", "0.4", "--smoothing", "0.1", "--log-every", "5", *extra]


def _checkpoint_step(path: Path) -> int:
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["step"])
    except (OSError, RuntimeError, EOFError, KeyError):
        return 0


@pytest.mark.slow
def test_resume_after_kill_9_is_bit_for_bit(folder, spec_file, tmp_path):
    steps = ["--steps", "40", "--checkpoint-every", "1", "--eval-every", "20"]
    whole = tmp_path / "whole"
    subprocess.run(_train_cmd(spec_file, folder, whole, *steps, "--quiet"), check=True, timeout=300)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(_train_cmd(spec_file, folder, killed, *steps, "--quiet"))
    deadline = time.monotonic() + 240
    while _checkpoint_step(killed / "checkpoint.pt") < 8 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "model").exists()  # killed mid-run
    assert 8 <= _checkpoint_step(killed / "checkpoint.pt") < 40
    subprocess.run(_train_cmd(spec_file, folder, killed, *steps, "--quiet", "--resume"), check=True, timeout=300)
    a, b = _weights(whole / "model"), _weights(killed / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _tail(text, lines: int = 40) -> str:
    text = text.decode(errors="replace") if isinstance(text, bytes) else (text or "")
    return "\n".join(text.splitlines()[-lines:])


def test_a_run_of_several_processes_starts_its_loader_workers_from_a_forkserver():
    """Forking a loader worker from a rank that has the process group's threads can deadlock the worker; several
    processes use forkserver, one process keeps the platform default, no workers need none."""
    from archspec.train.batches import StreamBatches

    def batches(workers, world):
        return StreamBatches(list(range(8)), None, global_batch=4, seed=0, device=torch.device("cpu"),
                             workers=workers, rank=0, world=world)

    assert batches(1, 2).worker_context() == "forkserver"
    assert batches(1, 1).worker_context() is None and batches(0, 2).worker_context() is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pid_of_rank(rank: int, port: int) -> int | None:
    """The pid of torchrun's worker ``rank`` on rendezvous ``port`` (read from /proc's environments)."""
    want = {f"RANK={rank}".encode(), f"MASTER_PORT={port}".encode()}
    for entry in Path("/proc").iterdir():
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and want <= environ:
            return int(entry.name)
    return None


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds torchrun's ranks in /proc (Linux)")
def test_a_sigterm_to_one_torchrun_rank_stops_both_at_the_same_step_and_the_run_resumes(folder, spec_file,
                                                                                         tmp_path):
    """torchrun ranks stop together: a SIGTERM that reaches rank 1 only stops both ranks before the same step (each
    rank reduces its pending flag before every step), where rank 0 used to train on and wait in DDP's all-reduce for
    a rank that had left.  Both exit 143 with the resume hint, no traceback; ``--resume`` under torchrun then ends
    with the weights, evaluations and losses of an uninterrupted single-process run with the same global batch (DDP
    averages the same batches' gradients: equal up to float summation order, 1e-5).

    Until issue 53 an uninterrupted two-process run against one process was a test of its own (28 s, four
    interpreters); this run checks the same equality after a stop and a resume, so that test was folded in here."""
    common = ["--steps", "40", "--eval-every", "20", "--checkpoint-every", "1", "--mixup", "0", "--quiet"]
    subprocess.run(_train_cmd(spec_file, folder, tmp_path / "one", *common), check=True, timeout=300)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def torchrun(*extra) -> subprocess.Popen:
        port = _free_port()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
               "--master_port", str(port), "-m", "archspec",
               *_train_cmd(spec_file, folder, tmp_path / "two", *common, *extra)[3:]]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.port = port
        return proc

    proc = torchrun()
    try:
        deadline = time.monotonic() + 240
        while _checkpoint_step(tmp_path / "two" / "checkpoint.pt") < 4 and proc.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint in 240 s"
            time.sleep(0.05)
        rank1 = _pid_of_rank(1, proc.port)
        assert proc.poll() is None and rank1 is not None, "the run ended before it could be signalled"
        os.kill(rank1, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = err.decode(errors="replace")
    assert err.count("stopped by SIGTERM; continue with --resume") == 2, err
    # the only traceback is torchrun's own ChildFailedError: no frame of a rank (a gloo error in rank 0's all-reduce)
    frames = [line for line in err.splitlines() if line.lstrip().startswith('File "')]
    assert all("torch/distributed" in line or "<frozen" in line for line in frames), err
    stopped = _checkpoint_step(tmp_path / "two" / "checkpoint.pt")
    assert 4 <= stopped < 40 and not (tmp_path / "two" / "model").exists()
    resumed = torchrun("--resume")
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, _tail(out) + "\n" + _tail(err)
    assert json.loads((tmp_path / "two" / "run.json").read_text())["processes"] == 2
    a, b = _weights(tmp_path / "one" / "model"), _weights(tmp_path / "two" / "model")
    # the same batches, gradients averaged by DDP: equal up to float summation order
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    rows = [[json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
            for d in ("one", "two")]
    assert [r["step"] for r in rows[1]] == [20, 40]
    assert rows[1][-1]["train_loss"] < rows[1][0]["train_loss"]  # it learns
    for r1, r2 in zip(*rows):
        assert r1["accuracy"] == r2["accuracy"] and abs(r1["val_loss"] - r2["val_loss"]) < 1e-5


def test_ranks_split_each_global_batch_and_their_union_is_the_single_process_batch():
    one = list(islice(EpochSampler(50, 12, seed=5, epoch=3), 48))
    ranks = [list(islice(EpochSampler(50, 12, seed=5, epoch=3, rank=r, world=3), 16)) for r in range(3)]
    for k in range(50 // 12):
        union = sorted(i for r in ranks for _, i in r[k * 4:(k + 1) * 4])
        assert union == sorted(i for _, i in one[k * 12:(k + 1) * 12])
    resumed = list(islice(EpochSampler(50, 12, seed=5, epoch=3, start=2), 24))
    assert resumed == one[24:48]


def test_the_sampler_runs_on_into_the_next_epochs_orders():
    """Endless: after epoch 3's 4 full batches (2 of 50 images dropped) come epoch 4's, then 5's, each epoch's
    order the permutation seeded ``seed * 1_000_003 + epoch`` (hand-computed here with torch.randperm)."""
    keys = list(islice(EpochSampler(50, 12, seed=5, epoch=3, start=3), 12 + 48 + 48))
    def order(epoch):
        return torch.randperm(50, generator=torch.Generator().manual_seed(5 * 1_000_003 + epoch)).tolist()
    assert keys[:12] == [(3, i) for i in order(3)[36:48]]
    assert keys[12:60] == [(4, i) for i in order(4)[:48]]
    assert keys[60:] == [(5, i) for i in order(5)[:48]]


@pytest.mark.slow  # several short training runs: seconds
def test_one_loader_serves_every_epoch_and_a_resume_lands_on_the_same_batches(folder, monkeypatch):
    """The workers start once per run (not once per epoch), and a StreamBatches restored from the position
    after any step -- an epoch's last batch included -- draws exactly the batches of the uninterrupted one."""
    from archspec.train.batches import StreamBatches
    from archspec.train.streamed_data import make_transforms, open_stream_data

    data = open_stream_data(folder)
    train_tf, _ = make_transforms(3, (16, 16), _config())
    make = lambda: StreamBatches(data.train, train_tf, 8, seed=3, device=torch.device("cpu"), workers=2)  # noqa: E731
    whole = make()
    starts = []
    monkeypatch.setattr(StreamBatches, "_loader", lambda self, f=StreamBatches._loader: starts.append(1) or f(self))
    per_epoch = whole.batches_per_epoch()
    batches, states = [], []
    for _ in range(3 * per_epoch + 1):
        batches.append(next(whole))
        states.append(whole.state_dict())
    whole.close()
    assert len(starts) == 1
    assert states[per_epoch - 1] == {"epoch": 1, "batch_in_epoch": 0}
    for k in (per_epoch - 2, per_epoch - 1, 2 * per_epoch):
        resumed = make()
        resumed.load_state_dict(states[k])
        x, y = next(resumed)
        resumed.close()
        assert torch.equal(x, batches[k + 1][0]) and torch.equal(y, batches[k + 1][1])
    old = make()  # a checkpoint written at an epoch's last batch by an earlier version
    old.load_state_dict({"epoch": 0, "batch_in_epoch": per_epoch})
    assert torch.equal(next(old)[0], batches[per_epoch][0])
    old.close()


def test_deit_recipe_follows_the_paper():
    config = recipe("deit", batch_size=1024)
    assert config.lr == pytest.approx(5e-4 * 1024 / 512)  # DeiT: lr = 5e-4 * batch / 512
    assert (config.epochs, config.warmup_epochs, config.weight_decay, config.smoothing) == (300, 5, 0.05, 0.1)
    assert (config.mixup, config.cutmix, config.reprob, config.auto_augment) == (0.8, 1.0, 0.25, "rand-m9-mstd0.5-inc1")
    assert recipe("levit").epochs == 1000 and recipe("tcnn").epochs == 50
    assert config.resolved(batches_per_epoch=10).steps == 3000 and config.resolved(10).warmup_steps == 50


class _Pair(torch.nn.Module):
    """A stand-in distilled student: returns fixed (cls, dist) logits in train mode."""

    def __init__(self, cls, dist):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))
        self.cls, self.dist = cls, dist

    def forward(self, x):
        return self.cls * self.w, self.dist * self.w


def test_hard_distillation_loss_is_deits():
    torch.manual_seed(0)
    cls, dist, teacher_logits = torch.randn(4, 3), torch.randn(4, 3), torch.randn(4, 3)
    y = torch.tensor([0, 1, 2, 1])
    teacher = torch.nn.Linear(1, 1)
    teacher.forward = lambda x: teacher_logits
    trainer = Trainer(_Pair(cls, dist), _config(distill_alpha=0.5), torch.device("cpu"), teacher=teacher)
    expected = 0.5 * F.cross_entropy(cls, y) + 0.5 * F.cross_entropy(dist, teacher_logits.argmax(1))
    assert torch.allclose(trainer.loss(torch.zeros(4, 1), y), expected)


def test_distillation_needs_a_distilled_spec_and_a_local_teacher(folder, tmp_path):
    with pytest.raises(SpecError) as info:
        fit(TINY, folder, _config(), teacher="resnet18", progress=False)
    assert info.value.problems[0].path == ("teacher",) and "distillation head" in info.value.problems[0].message
    from archspec.train.teacher import load_teacher

    with pytest.raises(SpecError) as info:
        load_teacher("resnet18", None, 2)
    problem = info.value.problems[0]
    assert problem.path == ("teacher_checkpoint",) and "downloads nothing" in problem.hint
    assert "--teacher" not in str(info.value) and "`teacher_checkpoint` FILE" in problem.hint
    with pytest.raises(SpecError, match="neither a directory nor a timm model"):
        load_teacher("no_such_net_xyz", tmp_path / "w.pth", 2)


def test_a_timm_teacher_loads_the_users_checkpoint(tmp_path):
    import timm

    from archspec.train.teacher import load_teacher

    source = timm.create_model("resnet10t", pretrained=False, num_classes=2)
    torch.save(source.state_dict(), tmp_path / "w.pth")
    teacher = load_teacher("resnet10t", tmp_path / "w.pth", 2)
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(teacher(x), source.eval()(x)) and not any(p.requires_grad for p in teacher.parameters())
    with pytest.raises(SpecError) as info:
        load_teacher("resnet10t", tmp_path / "w.pth", 5)  # a 2-class checkpoint into a 5-class head
    assert info.value.problems[0].path == ("teacher_checkpoint",)


def test_fashion_mnist_streams_grey_images_into_an_rgb_model(one_thread, tmp_path, monkeypatch):
    from archspec.io import data_sources as data_module  # where FASHION_MNIST_DIR lives
    from tests.test_search_data import _write_idx

    monkeypatch.setattr(data_module, "FASHION_MNIST_DIR", _write_idx(tmp_path / "fm"))
    spec = TINY.replace("num_classes: 2", "num_classes: 10")
    result = fit(spec, "fashion-mnist", _config(steps=2, eval_every=2), progress=False)
    assert result.steps == 2 and result.model.spec.head.num_classes == 10


def test_progress_lines_off_a_terminal(one_thread, folder, tmp_path, capsys):
    fit(TINY, folder, _config(steps=8, eval_every=8, log_every=4), out=tmp_path / "run", bar=False)
    lines = capsys.readouterr().out.splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["4/8", "8/8"]
    assert all(k in steps[0] for k in ("epoch", "loss", "lr", "img/s", "ETA"))
    assert (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0].startswith("epoch,step,train_loss,lr")


def test_ema_is_evaluated_and_saved(one_thread, folder, tmp_path):
    result = fit(TINY, folder, _config(steps=6, eval_every=6, ema_decay=0.9), out=tmp_path / "run", progress=False)
    assert result.ema_accuracy is not None and (tmp_path / "run" / "model_ema" / "model.safetensors").is_file()


def test_a_tcnn_build_fine_tunes_from_its_weights_with_the_gating_at_lr_0_1(one_thread, folder, tmp_path):
    """T-CNN sec. 3: fine-tuning starts from the transferred weights; the gating trains at lr 0.1, no decay."""
    from archspec.io.artifact import save
    from archspec.io.builddir import write_build
    from archspec.train.run import _initial_model, _load, _param_groups
    from tests.test_tcnn_spec import _small

    model = archspec.compile(_small())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)  # weights no seed would give
    write_build(tmp_path / "t", lambda d: save(model, d), {"test": True})
    spec = _load(tmp_path / "t", 2)
    start = _initial_model(tmp_path / "t", spec)
    kept = {k: v for k, v in model.state_dict().items() if not k.startswith("head")}
    assert all(torch.equal(start.state_dict()[k], v) for k, v in kept.items()) and start.num_classes == 2
    groups = _param_groups(start, _config(lr=1e-3))
    assert [g["lr"] for g in groups] == [1e-3, 1e-3, 0.1] and groups[2]["weight_decay"] == 0.0
    assert _param_groups(archspec.compile(TINY), _config()) is None  # no T-CNN layers: timm's groups
    result = fit(tmp_path / "t", folder, _config(steps=2, eval_every=2, batch_size=4), progress=False)
    assert result.steps == 2


@pytest.mark.slow
def test_archspec_train_trains_a_shipped_spec_on_an_image_folder(folder, tmp_path, capsys):
    """levit_128s at its own 224 px from 16 px PNGs (timm's transforms resize), 2 steps, a loadable model."""
    out = tmp_path / "levit"
    args = ["train", "levit_128s", "--data", str(folder), "--steps", "2", "--batch-size", "4", "--workers", "0",
            "--threads", "1", "--out", str(out), "--json"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 2 and summary["images_per_second"] > 0
    model = archspec.load(out / "model")
    assert model.spec.name == "levit_128s" and model.num_classes == 2


def test_steps_keep_the_recipes_warm_up_share():
    from archspec.cli.train import config_from_args

    parser = __import__("argparse").ArgumentParser()
    sub = parser.add_subparsers()
    from archspec.cli.train import add_train_parser

    add_train_parser(sub)
    short = config_from_args(parser.parse_args(["train", "x", "--steps", "200"]))
    deit = config_from_args(parser.parse_args(["train", "x", "--steps", "600", "--recipe", "deit"]))
    assert (short.steps, short.warmup_steps, short.epochs) == (200, 20, None)  # 1 of 10 epochs
    assert (deit.steps, deit.warmup_steps) == (600, 10)  # 5 of 300 epochs


def test_clip_grad_bounds_the_update(one_thread):
    """timm dispatch_clip_grad: with plain SGD (lr 1, no momentum) the first update is the clipped gradient."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    before = [p.detach().clone() for p in model.parameters()]
    config = _config(optimizer="sgd", lr=1.0, weight_decay=0.0, warmup_steps=0, clip_grad=0.01, steps=2)
    trainer = Trainer(model, config, torch.device("cpu"))
    for group in trainer.optimizer.param_groups:
        group["momentum"], group["nesterov"] = 0.0, False
    trainer.step(torch.randn(16, 8) * 100, torch.randint(0, 3, (16,)), 1)
    change = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])
    assert 0.0099 < change.norm().item() <= 0.0100001


def test_adamw_is_torchs_fused_kernel_with_adamws_first_update(one_thread):
    """AdamW runs as torch's fused kernel (``fused=True``) and its first update is Loshchilov & Hutter's by hand:
    with bias correction ``m / sqrt(v) = g / |g|``, so ``p <- p (1 - lr wd) - lr g / (|g| + eps)``, and timm's
    groups keep the 1-d bias out of the weight decay."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    before = [p.detach().clone() for p in model.parameters()]
    lr, wd, eps = 0.01, 0.05, 1e-8
    trainer = Trainer(model, _config(optimizer="adamw", lr=lr, weight_decay=wd, warmup_steps=0, steps=2),
                      torch.device("cpu"))
    assert all(group["fused"] for group in trainer.optimizer.param_groups)
    x, y = torch.randn(16, 8), torch.randint(0, 3, (16,))
    reference = torch.nn.Linear(8, 3)
    reference.load_state_dict(dict(zip(("weight", "bias"), before)))
    trainer.loss(x, y).backward()  # the same loss on the same weights: the gradient the step will use
    grads = [p.grad.detach().clone() for p in model.parameters()]
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.step(x, y, 1)
    for p, b, g, decay in zip(model.parameters(), before, grads, (wd, 0.0)):
        expected = b * (1 - lr * decay) - lr * g / (g.abs() + eps)
        assert torch.allclose(p.detach(), expected, atol=1e-7)


def test_device_transform_normalises_as_timm_and_erases_only_in_training():
    """uint8 255 / 0 become (1 - mean) / std and -mean / std per channel (ImageNet's for RGB, 0.5 for grey: timm's
    ToTensor + Normalize by hand); reprob 1.0 erases part of every image, reprob 0 nothing."""
    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    from archspec.train.streamed_data import DeviceTransform

    x = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    x[0] = 255
    out = DeviceTransform(3, "cpu")(x)
    for c, (m, s) in enumerate(zip(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD)):
        assert torch.allclose(out[0, c], torch.full((8, 8), (1 - m) / s))
        assert torch.allclose(out[1, c], torch.full((8, 8), -m / s))
    grey = DeviceTransform(1, "cpu")(torch.full((1, 1, 4, 4), 255, dtype=torch.uint8))
    assert torch.allclose(grey, torch.ones_like(grey))
    torch.manual_seed(0)
    erased = DeviceTransform(3, "cpu", reprob=1.0)(x)
    assert (erased != out).any(dim=(1, 2, 3)).all()


def test_yaml_text_longer_than_a_file_name_is_a_spec_not_a_build_directory():
    """``fit`` takes a spec's YAML text: a text longer than the file system's name limit is not asked about as a path
    (it raised ``OSError: File name too long``)."""
    from archspec.train.run import is_build_dir

    text = TINY + "".join(f"# a comment line {i} to pass the file name limit\n" for i in range(10))
    assert len(text) > 300 and not is_build_dir(text)
