"""One DP-SGD job across processes with torch.distributed (``trainer.distributed=true``).

Launch with torchrun (``torchrun --nproc_per_node=2 -m dptrain experiment=mlp
trainer.distributed=true``). On the CPU the process group uses gloo; on GPUs
(``trainer.device=auto|cuda`` on a machine with CUDA) each process takes ``cuda:LOCAL_RANK`` and
the group uses NCCL, the reduction running on the GPUs.

How the mechanism stays exactly the single-process one (docs/privacy.md):

* Rows are split into disjoint shards (rank r holds rows r, r + W, r + 2W, ...). Each rank
  Poisson-samples ITS shard at the job's q = B/N, with a rank-specific random stream: the union
  of independent Bernoulli(q) choices over disjoint shards is Poisson sampling of the whole
  data set at rate q. (Identical streams would make the ranks' choices correlated.)
* Each rank computes the sum of its examples' clipped gradients (the same engines, the fast
  path included). The sums are added across ranks with one ``all_reduce`` of a flat buffer.
* Gaussian noise N(0, sigma^2 C^2) is drawn ONCE per step, by rank 0 only, and added to its
  part of the sum before the reduction; the total is divided by the GLOBAL expected batch size
  B. Every rank then holds the same noisy gradient and takes the same optimiser step, so the
  parameters stay identical without a broadcast after the first one.
* The accountant sees the job's q, sigma and steps: the epsilon equals a single-process run's.
* Only rank 0 writes artifacts (metrics, privacy report, TensorBoard, checkpoints).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dptrain.core.errors import DPTrainError


class DistributedError(DPTrainError):
    """trainer.distributed=true without a usable torch.distributed environment."""


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, flat: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        return flat

    def all_gather_objects(self, obj) -> list:
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def gather_rows(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every rank's ``tensors`` (on CPU) concatenated along dim 0 in rank order, on every rank:
        a sharded read's test outputs and labels (dptrain.data.shards), which each rank holds
        only for its own rows."""
        parts = self.all_gather_objects(tuple(t.detach().cpu() for t in tensors))
        return tuple(torch.cat([p[i] for p in parts]) for i in range(len(tensors)))

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """Start every rank from rank 0's initial parameters."""
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)

    def barrier(self) -> None:
        dist.barrier()


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def env_rank() -> int:
    """This process' rank from the launcher's environment (0 when not launched by torchrun)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def backend_for(device: torch.device | str) -> str:
    """The process-group backend for tensors on ``device``: NCCL on CUDA devices, gloo on the CPU."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def init_from_env(timeout_s: float = 300.0, device: torch.device | str = "cpu") -> DistContext:
    """Join the process group that torchrun set up (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
    with the backend for ``device`` (:func:`backend_for`; on a GPU this process' device is made
    the current one first, as NCCL's collectives use it)."""
    if not launched_by_torchrun():
        raise DistributedError(
            "trainer.distributed=true is not allowed here: the process was not started by torchrun "
            "(RANK / WORLD_SIZE are not set). Launch with: torchrun --nproc_per_node=2 -m dptrain "
            "experiment=mlp trainer.distributed=true"
        )
    backend = backend_for(device)
    if backend == "nccl":
        torch.cuda.set_device(torch.device(device))
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=timeout_s))
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), backend=backend)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
