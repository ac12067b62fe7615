"""Batch sources of the training loop: the in-memory fast path and a streaming ``DataLoader``.

Both are iterators of ``(x, y)`` on the training device (``x`` ``(B, C, H, W)`` float, ``y`` ``(B,)`` int64)
with a ``state_dict`` for checkpoints, so a resumed run draws exactly the batches an uninterrupted run would.

* :class:`TensorBatches` -- the fast path for small built-in sets held as tensors (the search's proxy,
  ``two-phase``): seeded epoch permutations and seeded tensor augmentation from one CPU generator.
* :class:`StreamBatches` -- any map-style dataset of ``(PIL image, label)`` (torchvision ``ImageFolder``,
  ``FashionMNIST``, ``CIFAR10``) through a timm transform, read by ``torch.utils.data.DataLoader`` workers with
  pinned memory.  The order of epoch ``e`` is a permutation seeded by ``(seed, e)``; each global batch of
  ``B`` is split into ``world`` consecutive slices of ``B / world`` (rank ``r`` takes slice ``r``), so the union
  over ranks of step ``k``'s batches is the single-process batch ``k``.  Each sample's augmentation is
  seeded by ``(seed, epoch, index)`` (:class:`SeededSamples`): it does not depend on the worker count, the
  rank, or where a run was resumed.  One ``DataLoader`` iterator serves the whole run: its sampler runs on from
  epoch to epoch, so the workers neither restart nor drain their prefetch queue at an epoch's end (timm's
  loader keeps its workers, ``persistent_workers``, but still drains and refills at every epoch).
"""

from __future__ import annotations

import multiprocessing
import random
import signal
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Sampler

from archspec.train.failures import TrainingFailure

__all__ = ["SeededSamples", "EpochSampler", "StreamBatches", "TensorBatches", "augment", "quiet_worker"]


def quiet_worker(worker_id: int) -> None:
    """A DataLoader worker's start: SIGTERM ends it silently (the default action) instead of running the handler
    it inherited from ``archspec train`` (which stops the main process and then shuts its workers down)."""

    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def augment(x: torch.Tensor, mode: str, gen: torch.Generator) -> torch.Tensor:
    """Seeded random crop (zero pad ``H // 8``) and/or horizontal flip of ``(B, C, H, W)``; random numbers come
    from ``gen`` (a CPU generator) so a run is reproducible on any device."""
    b, _, h, w = x.shape
    if "crop" in mode:
        pad = max(h // 8, 1)
        padded = F.pad(x, (pad, pad, pad, pad))
        dy = torch.randint(0, 2 * pad + 1, (b,), generator=gen).to(x.device)
        dx = torch.randint(0, 2 * pad + 1, (b,), generator=gen).to(x.device)
        rows = torch.arange(h, device=x.device)[None, :] + dy[:, None]  # (B, h)
        cols = torch.arange(w, device=x.device)[None, :] + dx[:, None]  # (B, w)
        x = padded[torch.arange(b, device=x.device)[:, None, None, None],
                   torch.arange(x.shape[1], device=x.device)[None, :, None, None],
                   rows[:, None, :, None], cols[:, None, None, :]]
    if "flip" in mode:
        flip = (torch.rand(b, generator=gen) < 0.5).to(x.device)
        x = torch.where(flip[:, None, None, None], x.flip(-1), x)
    return x


class TensorBatches:
    """Endless batches from a ``TensorDataset`` held in memory (moved to ``device`` once).

    Epoch permutations (the last partial batch dropped) and augmentation draw from one CPU generator
    seeded with ``seed``.

    Raises:
        TrainingFailure: an empty training set.
    """

    def __init__(self, split: Any, batch_size: int, augmentation: str, seed: int, device: torch.device):
        images, labels = split.tensors
        if len(labels) == 0:
            raise TrainingFailure("the training set is empty")
        self.images, self.labels = images.to(device), labels.to(device)  # once: no host-to-device copy per step
        self.n, self.batch, self.augmentation = len(labels), min(batch_size, len(labels)), augmentation
        self.device = device
        self.gen = torch.Generator().manual_seed(seed)
        self.order, self.cursor = torch.randperm(self.n, generator=self.gen), 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cursor + self.batch > self.n:
            self.order, self.cursor = torch.randperm(self.n, generator=self.gen), 0
        idx = self.order[self.cursor:self.cursor + self.batch].to(self.device)
        self.cursor += self.batch
        x = self.images[idx]
        if self.augmentation != "none":
            x = augment(x, self.augmentation, self.gen)
        return x, self.labels[idx]

    def state_dict(self) -> dict:
        """Generator state, current permutation and position."""
        return {"gen": self.gen.get_state(), "order": self.order, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`'s output."""
        self.gen.set_state(state["gen"])
        self.order, self.cursor = state["order"], int(state["cursor"])


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """The augmentation seed of sample ``index`` in ``epoch`` (a 63-bit mix; same inputs, same seed)."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(2, np.uint32).astype(np.uint64)
               .dot([1, 1 << 31])) & ((1 << 63) - 1)


class SeededSamples(torch.utils.data.Dataset):
    """``dataset[index]`` through ``transform`` with torch's, numpy's and Python's RNGs seeded by
    :func:`sample_seed` ``(seed, epoch, index)``: indices arrive as ``(epoch, index)`` from
    :class:`EpochSampler`.  Returns ``(x (C, H, W), label)``."""

    def __init__(self, dataset: Any, transform: Any, seed: int):
        self.dataset, self.transform, self.seed = dataset, transform, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int]:
        epoch, index = key
        image, label = self.dataset[index]
        s = sample_seed(self.seed, epoch, index)
        # The CPU generator alone: torch.manual_seed also seeds every accelerator's generators (118 us a call,
        # most of the seeding's cost), and a loader worker's transforms draw only from the CPU one.
        torch.default_generator.manual_seed(s)
        random.seed(s)
        np.random.seed(s & 0xFFFFFFFF)
        return self.transform(image), int(label)


class EpochSampler(Sampler):
    """``(epoch, index)`` keys of this rank's share of every epoch from ``epoch`` on (endless), starting at
    global batch ``start`` of the first.

    Epoch ``e``'s order is ``torch.randperm(n)`` from a generator seeded ``seed * 1_000_003 + e``; the last
    partial global batch of each epoch is dropped; batch ``k`` of rank ``r`` is slice ``r`` of global batch
    ``k``.  Endless, so one ``DataLoader`` iterator runs on across epochs (:class:`StreamBatches`).
    """

    def __init__(self, n: int, global_batch: int, seed: int, epoch: int, rank: int = 0, world: int = 1,
                 start: int = 0):
        self.n, self.global_batch, self.seed, self.epoch = n, global_batch, seed, epoch
        self.rank, self.world, self.start = rank, world, start
        self.local = global_batch // world

    def batches_per_epoch(self) -> int:
        """Full global batches in one epoch."""
        return self.n // self.global_batch

    def epoch_keys(self, epoch: int, start: int = 0) -> Iterator[tuple[int, int]]:
        """This rank's keys of ``epoch`` from global batch ``start`` on."""
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))
        for k in range(start, self.batches_per_epoch()):
            first = k * self.global_batch + self.rank * self.local
            for index in order[first:first + self.local].tolist():
                yield epoch, index

    def __iter__(self) -> Iterator[tuple[int, int]]:
        yield from self.epoch_keys(self.epoch, self.start)
        epoch = self.epoch + 1
        while True:
            yield from self.epoch_keys(epoch)
            epoch += 1


class StreamBatches:
    """Endless batches of a map-style dataset of ``(PIL image, label)`` through ``transform`` (timm
    ``create_transform``), read by a ``DataLoader`` (``workers`` processes, pinned memory on CUDA).

    Args:
        dataset: e.g. torchvision ``ImageFolder``.
        global_batch: images per optimizer step over all ranks (divisible by ``world``).
        seed: seeds the epoch orders and each sample's augmentation.
        rank: this process's rank.
        world: the number of processes.
        on_device: applied to each batch of images once on ``device`` (e.g.
            :class:`archspec.train.streamed_data.DeviceTransform`: uint8 -> normalised float, random erasing).

    Raises:
        ValueError: ``global_batch`` not divisible by ``world`` or larger than the dataset.
    """

    def __init__(self, dataset: Any, transform: Any, global_batch: int, seed: int, device: torch.device,
                 workers: int = 2, rank: int = 0, world: int = 1,
                 on_device: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if global_batch % world:
            raise ValueError(f"the batch size {global_batch} is not divisible by the {world} processes")
        if global_batch > len(dataset):
            raise ValueError(f"the batch size {global_batch} is larger than the {len(dataset)} training images")
        self.samples = SeededSamples(dataset, transform, seed)
        self.global_batch, self.seed, self.device = global_batch, seed, device
        self.workers, self.rank, self.world = workers, rank, world
        self.on_device = on_device
        self.epoch, self.batch_in_epoch = 0, 0
        self._it: Iterator | None = None

    def batches_per_epoch(self) -> int:
        """Optimizer steps per epoch (full global batches)."""
        return len(self.samples) // self.global_batch

    def _loader(self) -> Iterator:
        sampler = EpochSampler(len(self.samples), self.global_batch, self.seed, self.epoch, self.rank, self.world,
                               self.batch_in_epoch)
        loader = DataLoader(self.samples, batch_size=self.global_batch // self.world, sampler=sampler,
                            num_workers=self.workers, pin_memory=self.device.type == "cuda", drop_last=True,
                            persistent_workers=False, generator=torch.Generator().manual_seed(self.seed),
                            worker_init_fn=quiet_worker if self.workers else None,
                            multiprocessing_context=self.worker_context())
        return iter(loader)

    def worker_context(self) -> str | None:
        """How the loader starts its workers: ``"forkserver"`` in a run of several processes, else the platform's
        default (``None``: fork on Linux; also where forkserver does not exist, Windows).  A rank has the process
        group's threads (gloo's, NCCL's) by the time its loader starts, and a worker forked from a threaded process
        can inherit a lock some other thread held and wait on it forever -- the rank then waits for its batch, and
        every other rank in the next collective (a torchrun test hung that way once in CI, the forked worker in a
        futex wait).  forkserver starts workers from a clean process; its cost, a torch import per worker, is paid
        once per loader.  Raises nothing."""
        several = self.workers and self.world > 1
        return "forkserver" if several and "forkserver" in multiprocessing.get_all_start_methods() else None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._it is None:
            self._it = self._loader()
        x, y = next(self._it)
        self.batch_in_epoch += 1
        if self.batch_in_epoch == self.batches_per_epoch():  # the sampler runs on into the next epoch
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        return (self.on_device(x) if self.on_device is not None else x), y

    def close(self) -> None:
        """Shut the loader's workers down now (a run's end, a resume), in this frame, not in the iterator's
        ``__del__``: an exception raised meanwhile (``archspec train``'s SIGTERM) then propagates instead of being
        printed and ignored, as Python does with one raised in ``__del__``; the workers are terminated either way
        (torch's ``_shutdown_workers`` ends in a ``finally``).  Raises nothing of its own."""
        it, self._it = self._it, None
        shutdown = getattr(it, "_shutdown_workers", None)  # torch's multi-process iterator; None: no workers
        if shutdown is not None:
            shutdown()

    def state_dict(self) -> dict:
        """Epoch and batch position (everything else follows from the seed)."""
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`'s position."""
        self.close()
        self.epoch, self.batch_in_epoch = int(state["epoch"]), int(state["batch_in_epoch"])
        if self.batch_in_epoch >= self.batches_per_epoch():  # an epoch's last batch, as earlier versions wrote it
            self.epoch, self.batch_in_epoch = self.epoch + 1, 0
