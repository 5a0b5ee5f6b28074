"""`TrainPipelineSparseDist`: batch i+1's ids travel while batch i computes (TorchRec's name).

[Note: pipelined input dist]
Each `progress` call first fetches the next batch and starts its input dist (the header
all-to-all, then the ids all-to-alls left in flight) on every sharded collection of the model,
then runs forward, backward and the optimizer step of the current batch, whose ids arrived
during the previous step. The prefetched input is used by the forward that receives the very
same KeyedJaggedTensor object (``batch.sparse_features``), which is how DLRM-style models pass
it; a collection fed another KJT runs its input dist in its forward, correct but not overlapped.

[Note: when the pipeline overlaps]
Overlap only pays when the ids can travel while the step computes: on a GPU (NCCL runs beside
the kernels), or on CPU when each rank has a core its compute threads leave free for gloo's
transfer. Two single-threaded ranks on two cores have none: gloo's work lands on the core the
other rank computes on, and starting the next batch's input dist early only adds a second
synchronisation point per step (measured slower than the plain loop, `bench_dmp.py`). There the
pipeline runs synchronously: each batch's input dist runs in its own forward, exactly a plain
loop. `choose_overlap` decides once, at construction, with one INFO line; ``overlap=`` forces it.

Every fetch also agrees across ranks on whether each rank still has a batch: if some rank ran
out while others did not, all raise, naming the ranks, instead of some ranks waiting forever in
a collective the others never call.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit import comm, launch
from shardkit.sharding._embeddingbag import ShardedEmbeddingBagCollection

__all__ = ["DataExhaustedError", "TrainPipelineSparseDist", "choose_overlap"]

logger = logging.getLogger(__name__)


class DataExhaustedError(RuntimeError):
    """Some ranks ran out of batches while others had more."""


class TrainPipelineSparseDist:
    """Train ``model`` batch by batch with the input dist of the next batch overlapped.

    ``model(batch)`` must return ``(loss, output)`` (like `shardkit.models.DLRMTrain`); the
    pipeline runs ``loss.backward()`` and ``optimizer.step()`` (the sharded tables' optimizers
    run inside backward).

    Args:
        model: usually a `DistributedModelParallel`.
        optimizer: the dense parameters' optimizer.
        device: where batches go (``batch.to(device)``).
        group: the process group the ranks agree through (default: the world).
        overlap: start each batch's input dist one step ahead (True) or in its own forward
            (False); default: overlap where it can help (see [Note: when the pipeline overlaps]).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device | None = None,
        *,
        group: dist.ProcessGroup | None = None,
        overlap: bool | None = None,
    ) -> None:
        self._model = model
        self._optimizer = optimizer
        self._device = device
        self._group = group
        self._sharded = [m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection)]
        self._next: Any = None
        self._started = False
        self._batches = 0
        if overlap is None:
            where = device if device is not None else getattr(model, "device", None)
            overlap, why = choose_overlap(
                torch.device(where if where is not None else "cpu"),
                cores=_cores(),
                local_ranks=_local_ranks(group),
                threads=torch.get_num_threads(),
            )
        else:
            why = "as asked (overlap=)"
        self._overlap = overlap
        logger.info(
            "train pipeline: %s (%s)",
            "next batch's input dist overlaps this step" if overlap else "synchronous",
            why,
        )

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """One training step on the next batch; raises StopIteration when every rank is done."""
        if not self._started:
            self._next = self._fetch(dataloader_iter)
            self._started = True
        batch = self._next
        if batch is None:
            raise StopIteration
        self._next = self._fetch(dataloader_iter)  # See [Note: pipelined input dist]
        self._model.train()
        self._optimizer.zero_grad()
        loss, output = self._model(batch)
        loss.backward()
        self._optimizer.step()
        return output

    def _fetch(self, dataloader_iter: Iterator[Any]) -> Any:
        try:
            batch = next(dataloader_iter)
        except StopIteration:
            batch = None
        _agree_on_data(batch is not None, self._batches, self._group)
        if batch is None:
            return None
        self._batches += 1
        if self._device is not None and hasattr(batch, "to"):
            batch = batch.to(self._device, non_blocking=True)
        features = getattr(batch, "sparse_features", None)
        if features is not None and self._overlap:
            for sharded in self._sharded:
                sharded.prefetch(features)
        return batch


def choose_overlap(
    device: torch.device, *, cores: int, local_ranks: int, threads: int
) -> tuple[bool, str]:
    """Whether overlapping the input dist can help, and why (see [Note: when the pipeline
    overlaps]): on an accelerator always; on CPU when this rank's share of the host's ``cores``
    leaves at least one core beside its ``threads`` compute threads."""
    if device.type != "cpu":
        return True, f"{device.type}: collectives run beside the computation"
    share = cores // max(local_ranks, 1)
    spare = share - threads
    why = (
        f"{cores} core(s) for {local_ranks} rank(s) of {threads} thread(s): {max(spare, 0)} "
        "spare core(s) per rank for the transfer"
    )
    return spare >= 1, why


def _cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup CPU quota."""
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def _local_ranks(group: dist.ProcessGroup | None) -> int:
    if launch.is_initialized():
        return launch.current().local_world_size
    return dist.get_world_size(group) if dist.is_initialized() else 1


def _agree_on_data(have: bool, count: int, group: dist.ProcessGroup | None) -> None:
    """All ranks learn which ranks have a batch; raise on every rank if only some do."""
    flags = comm.all_gather_into_tensor(torch.tensor([int(have)]), group=group).tolist()
    if all(flags) or not any(flags):
        return
    empty = [r for r, f in enumerate(flags) if not f]
    raise DataExhaustedError(
        f"rank(s) {empty} ran out of data after {count} batch(es) while the others have more; "
        "every rank must see the same number of batches (drop the last partial batch, or "
        "split the data evenly across ranks)"
    )
