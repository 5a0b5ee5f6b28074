"""torch's older sharded type, ``ShardedTensor``, read as a full tensor.

torch's FSDP1 checkpoints hold ``ShardedTensor`` values, and so does what torch's documented
FSDP1 reload hands back: ``load_sharded_optimizer_state_dict`` (``torch.distributed.checkpoint``)
returns each optimizer state tensor as a ``ShardedTensor`` chunked over dim 0, ``torch.chunk``
style, on its process group. shardkit's FSDP lays rows out its own way, so `full_of` gathers such
a value to its full shape (one collective on the value's group, which every rank of it reaches
in the same order: state dicts are loaded on every rank alike); the caller takes its rows.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor

from shardkit import comm

__all__ = ["ShardedTensor", "full_of"]


def _key(offsets: list[int]) -> tuple[int, ...]:
    return tuple(offsets)


def full_of(value: ShardedTensor) -> torch.Tensor:
    """The whole ``value`` on every rank of its group (a collective on that group)."""
    metadata = value.metadata()
    group = value._process_group
    num_ranks = dist.get_world_size(group)
    by_rank: list[list] = [[] for _ in range(num_ranks)]
    for shard in sorted(metadata.shards_metadata, key=lambda m: _key(m.shard_offsets)):
        placement = shard.placement
        rank = None if placement is None else placement.rank()
        assert rank is not None, "a ShardedTensor's shards are placed on ranks"
        by_rank[rank].append(shard)
    local = sorted(value.local_shards(), key=lambda s: _key(s.metadata.shard_offsets))
    dtype = metadata.tensor_properties.dtype
    device = local[0].tensor.device if local else torch.device("cpu")
    flat = [s.tensor.detach().reshape(-1) for s in local]
    mine = torch.cat(flat) if flat else torch.empty(0, dtype=dtype, device=device)
    sizes = [sum(_numel(m.shard_sizes) for m in shards) for shards in by_rank]
    gathered = comm.all_gather_into_tensor(
        mine.reshape(-1, 1), output_split_sizes=sizes, group=group
    )
    assert isinstance(gathered, torch.Tensor)
    parts = gathered.reshape(-1).split(sizes)
    full = torch.empty(tuple(metadata.size), dtype=dtype, device=device)
    for part, shards in zip(parts, by_rank):
        start = 0
        for shard in shards:
            count = _numel(shard.shard_sizes)
            block = full
            for dim, (offset, size) in enumerate(zip(shard.shard_offsets, shard.shard_sizes)):
                block = block.narrow(dim, offset, size)
            block.copy_(part[start : start + count].view(shard.shard_sizes))
            start += count
    return full


def _numel(sizes: list[int]) -> int:
    count = 1
    for size in sizes:
        count *= size
    return count
