"""Several training processes with ``torch.distributed``, started by ``torchrun``.

``torchrun --nproc_per_node N -m archspec train ...`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the
rendezvous address; :func:`init_processes` joins the group (gloo on CPU, NCCL on CUDA, one GPU per local rank)
and the model is wrapped in ``DistributedDataParallel``, which averages gradients over the ranks.  Each rank
takes ``batch / N`` images of every global batch (:class:`archspec.train.batches.EpochSampler`), evaluates a
``1/N`` share of the validation set, and the sums are reduced; only rank 0 writes files or prints.

BatchNorm normalises with each rank's own batch statistics (as under timm's ``train.py`` without
``sync_bn``); ``sync_bn`` (``--sync-bn`` on the command line) converts them to ``torch.nn.SyncBatchNorm`` (CUDA only).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

__all__ = ["Processes", "init_processes", "shutdown"]


@dataclass(frozen=True)
class Processes:
    """This process's ``rank`` among ``world`` and its ``device``; ``control``: a gloo process group for host-side
    agreements (:meth:`any`), so that NCCL runs do not synchronise the GPU for them (``None``: the default group)."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")
    control: object = None

    @property
    def main(self) -> bool:
        """Whether this process writes files and prints (rank 0)."""
        return self.rank == 0

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over every process (``t`` itself with one process)."""
        if self.world == 1:
            return t
        out = t.to(self.device if self.device.type == "cuda" else "cpu").clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.cpu()

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds in any process (a collective: every process calls it at the same point)."""
        if self.world == 1:
            return flag
        out = torch.tensor([int(flag)], dtype=torch.int32)
        dist.all_reduce(out, op=dist.ReduceOp.MAX, group=self.control)
        return bool(out.item())

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` in ``DistributedDataParallel`` (itself with one process)."""
        if self.world == 1:
            return model

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def barrier(self) -> None:
        """Wait for every process."""
        if self.world > 1:
            dist.barrier()


def init_processes(device: torch.device) -> Processes:
    """Join the ``torchrun`` process group when ``WORLD_SIZE > 1`` (else a single process on ``device``).

    Raises:
        ValueError: CUDA asked for with fewer GPUs than local ranks.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Processes(0, 1, device)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise ValueError(f"local rank {local} has no GPU ({torch.cuda.device_count()} visible)")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    # host-side agreements (a SIGTERM pending anywhere) over gloo: a CPU flag through NCCL would sync the GPU
    control = dist.new_group(backend="gloo") if device.type == "cuda" else None
    return Processes(rank, world, device, control)


def shutdown(processes: Processes) -> None:
    """Leave the process group (after the last collective)."""
    if processes.world > 1 and dist.is_initialized():
        dist.destroy_process_group()
