"""`TrainPipelineSparseDist`: batch i+1's ids travel while batch i computes (TorchRec's name).

[Note: pipelined input dist]
Each `progress` call first fetches the next batch and starts its input dist (the header
all-to-all, then the ids all-to-alls left in flight) on every sharded collection of the model,
then runs forward, backward and the optimizer step of the current batch, whose ids arrived
during the previous step. The prefetched input is used by the forward that receives the very
same KeyedJaggedTensor object (``batch.sparse_features``), which is how DLRM-style models pass
it; a collection fed another KJT runs its input dist in its forward, correct but not overlapped.

Every fetch also agrees across ranks on whether each rank still has a batch: if some rank ran
out while others did not, all raise, naming the ranks, instead of some ranks waiting forever in
a collective the others never call.

[Note: pipeline streams]
On a GPU the fetch runs on two side streams, as TorchRec's pipeline does: the host-to-device
copy of batch i+1 on a copy stream, then its input dist (and the agreement on data) on a
data-dist stream that waits only for that copy. So the input dist's host reads (see
[Note: host-side sizes]) wait for the copy and the ids' exchange, not for batch i's forward and
backward queued on the main stream, and the host runs ahead. Before batch i+1's forward, the
main stream waits for the data-dist stream, and every tensor made on a side stream is marked
as used by the main stream (``record_stream``) so that the caching allocator does not reuse its
memory early. Copies overlap compute only from pinned host memory (``batch.pin_memory()``, or
a DataLoader with ``pin_memory=True``). On the CPU, or any other device, everything runs in
order on the one stream and none of this applies.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit import comm
from shardkit.sharding._embeddingbag import ShardedEmbeddingBagCollection

__all__ = ["DataExhaustedError", "TrainPipelineSparseDist"]

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
        device: where batches go (``batch.to(device, non_blocking=True)``; None: left where
            they are). On a GPU, the copy and the input dist run on side streams (see
            [Note: pipeline streams]).
        group: the process group the ranks agree through (default: the world).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        device: torch.device | None = None,
        *,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        self._model = model
        self._optimizer = optimizer
        self._device = None if device is None else torch.device(device)
        self._streams = _SideStreams.on(self._device)
        self._group = group
        self._sharded = [m for m in model.modules() if isinstance(m, ShardedEmbeddingBagCollection)]
        self._next: Any = None
        self._started = False
        self._batches = 0

    def progress(self, dataloader_iter: Iterator[Any]) -> Any:
        """One training step on the next batch; raises StopIteration when every rank is done."""
        if not self._started:
            self._next = self._fetch(dataloader_iter)
            self._started = True
        batch = self._next
        if batch is None:
            raise StopIteration
        self._next = self._fetch(dataloader_iter)  # See [Note: pipelined input dist]
        if self._streams is not None:
            self._streams.hand_over(batch)
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
        streams = self._streams
        with streams.copying() if streams else contextlib.nullcontext():
            if batch is not None and self._device is not None and hasattr(batch, "to"):
                batch = batch.to(self._device, non_blocking=True)
        with streams.distributing() if streams else contextlib.nullcontext():
            _agree_on_data(batch is not None, self._batches, self._group)
            if batch is None:
                return None
            self._batches += 1
            features = getattr(batch, "sparse_features", None)
            if features is not None:
                for sharded in self._sharded:
                    sharded.prefetch(features)
        return batch


class _SideStreams:
    """The copy and data-dist streams of a GPU pipeline. See [Note: pipeline streams]."""

    def __init__(self, device: torch.device) -> None:
        self.copy = torch.cuda.Stream(device=device)
        self.dist = torch.cuda.Stream(device=device)
        self.device = device
        self._ready: list[torch.cuda.Event] = []  # per fetched batch: its input dist is queued

    @classmethod
    def on(cls, device: torch.device | None) -> _SideStreams | None:
        return cls(device) if device is not None and device.type == "cuda" else None

    @contextlib.contextmanager
    def copying(self) -> Iterator[None]:
        with torch.cuda.stream(self.copy):  # new memory only: no need to wait for the main
            yield

    @contextlib.contextmanager
    def distributing(self) -> Iterator[None]:
        self.dist.wait_stream(self.copy)
        with torch.cuda.stream(self.dist):
            yield
        ready = torch.cuda.Event()
        ready.record(self.dist)
        self._ready.append(ready)

    def hand_over(self, batch: Any) -> None:
        """The main stream takes the oldest fetched batch: it waits for that batch's input dist
        (not for the newer one just started) and keeps the batch's memory alive; the
        prefetched ids are marked by `PendingInput.wait`, which runs on the main stream."""
        main = torch.cuda.current_stream(self.device)
        main.wait_event(self._ready.pop(0))
        if hasattr(batch, "record_stream"):
            batch.record_stream(main)


def _agree_on_data(have: bool, count: int, group: dist.ProcessGroup | None) -> None:
    """All ranks learn which ranks have a batch; raise on every rank if only some do. The
    flags travel on the device the group carries (a GPU's for NCCL)."""
    flags = comm.all_gather_sizes(int(have), group=group)
    if all(flags) or not any(flags):
        return
    empty = [r for r, f in enumerate(flags) if not f]
    raise DataExhaustedError(
        f"rank(s) {empty} ran out of data after {count} batch(es) while the others have more; "
        "every rank must see the same number of batches (drop the last partial batch, or "
        "split the data evenly across ranks)"
    )
