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
"""

from __future__ import annotations

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
        device: where batches go (``batch.to(device)``).
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
        self._device = device
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
        if features is not None:
            for sharded in self._sharded:
                sharded.prefetch(features)
        return batch


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
