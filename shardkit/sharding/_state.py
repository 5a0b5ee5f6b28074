"""State dicts of sharded collections: each table as one ShardedTensor with global offsets.

[Note: sharded state dicts]
``state_dict()`` shows table ``t`` as ``embedding_bags.t.weight``: a ShardedTensor of the whole
table's shape whose local shards are views of this rank's shard Parameters and whose metadata
lists every shard (offsets, sizes, rank). ``torch.distributed.checkpoint`` saves each rank's
shards in parallel and loads them into any other sharding (it writes in place into the views),
which is how checkpoints are resharded. ``load_state_dict`` takes that key with either a
ShardedTensor whose shards match this rank's, or a full tensor (e.g. an unsharded checkpoint),
from which each rank copies its blocks. Data-parallel tables are plain tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard.metadata import ShardMetadata as TorchShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
from torch.distributed._shard.sharded_tensor.metadata import (
    ShardedTensorMetadata,
    TensorProperties,
)

from shardkit.sharding._layout import ShardSlice

__all__ = ["block_of", "sharded_tensor"]


def _metadata(shard: ShardSlice, device: torch.device) -> TorchShardMetadata:
    where = "cpu" if device.type == "cpu" else f"{device.type}:{device.index or 0}"
    return TorchShardMetadata(
        shard_offsets=[shard.row_start, shard.col_start],
        shard_sizes=[shard.rows, shard.cols],
        placement=f"rank:{shard.rank}/{where}",
    )


def sharded_tensor(
    shape: tuple[int, int],
    all_shards: Sequence[ShardSlice],
    local: Sequence[tuple[ShardSlice, torch.Tensor]],
    device: torch.device,
    group: dist.ProcessGroup | None,
) -> ShardedTensor:
    """One table as a ShardedTensor: ``local`` are (slice, tensor) of this rank's shards."""
    shards = [s for s in all_shards if s.rows and s.cols]  # empty shards hold nothing
    if not local:
        dtype = torch.float32
    else:
        dtype = local[0][1].dtype
    metadata = ShardedTensorMetadata(
        shards_metadata=[_metadata(s, device) for s in shards],
        size=torch.Size(shape),
        tensor_properties=TensorProperties(dtype=dtype, layout=torch.strided, requires_grad=False),
    )
    local_shards = [
        Shard(tensor=tensor, metadata=_metadata(slice_, device))
        for slice_, tensor in local
        if slice_.rows and slice_.cols
    ]
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        local_shards, metadata, process_group=group
    )


def block_of(value: Any, shard: ShardSlice, key: str) -> torch.Tensor:
    """This shard's block of a saved table: from a full tensor, or from a ShardedTensor whose
    local shard has the same offsets and sizes."""
    if isinstance(value, ShardedTensor):
        for local in value.local_shards():
            meta = local.metadata
            if list(meta.shard_offsets) == [shard.row_start, shard.col_start] and list(
                meta.shard_sizes
            ) == [shard.rows, shard.cols]:
                return local.tensor
        raise ValueError(
            f"{key}: the ShardedTensor given has no local shard at rows {shard.row_start}+"
            f"{shard.rows}, columns {shard.col_start}+{shard.cols} (this rank's shard); to load "
            "another sharding, load with torch.distributed.checkpoint into this module's "
            "state_dict(), which reshards"
        )
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{key}: expected a tensor or ShardedTensor, got {type(value).__name__}")
    rows, cols = shard.row_start + shard.rows, shard.col_start + shard.cols
    if value.dim() != 2 or value.shape[0] < rows or value.shape[1] < cols:
        raise ValueError(
            f"{key}: a table of shape {tuple(value.shape)} cannot hold this rank's shard "
            f"(rows {shard.row_start}:{rows}, columns {shard.col_start}:{cols})"
        )
    return value[shard.row_start : rows, shard.col_start : cols]
