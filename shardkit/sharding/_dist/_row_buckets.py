"""Row bucketing of one feature's ids: which shard holds each id's row, ids grouped by shard.

[Note: row bucketing without a sort]
A row-sharded unit's ids go to the shard whose row range holds them, rebased to shard rows,
grouped by shard and, within a shard, still bag by bag (a stable partition by shard). The
obvious way is ``bucketize`` then a stable ``argsort`` of the shard numbers; the sort is the
dearest op of a row-wise input dist on CPU (about 1 ms for 20k ids on one thread, per feature
per step). With few shards a counting partition does the same in a few passes that each
cost a fraction of that: per shard, a mask of its ids and the mask's running count give every
id its place (shard offset + how many ids of its shard came before it), and the counts at the
bag ends give the ids per (shard, bag). Its cost grows with the number of shards, so beyond
`PARTITION_MAX_SHARDS` the sort runs instead; both give the same tensors (tested equal).
These eager paths are the spec. Where the compiled kernel is in effect (`shardkit.kernels`,
``SHARDKIT_KERNEL``) and the ids are int64 on the CPU, one compiled operator does the same
partition in two passes over the ids (`shardkit.kernels.bucket_rows`, tested equal to both).
Everything stays on the ids' device; the host reads no size here (see
[Note: host-side sizes] in `_input`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import torch

from shardkit import kernels

__all__ = ["PARTITION_MAX_SHARDS", "bucket_rows"]

# The most shards for which the counting partition beats the sort (measured: 2.8x faster at 2
# shards, 2x at 4, 1.25x at 8, for 20k ids on one CPU thread).
PARTITION_MAX_SHARDS = 8


def bucket_rows(
    values: torch.Tensor,
    *,
    lengths: torch.Tensor,
    weights: torch.Tensor | None,
    row_starts: Sequence[int],
    max_partition_shards: int | None = None,
    kernel: kernels.KernelPath | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Group one feature's ids by the shard that holds their row (see [Note: row bucketing
    without a sort]).

    Args:
        values: ``[n]`` int64 global row ids.
        lengths: ``[B]`` int64 (or int32) bag lengths.
        weights: ``[n]`` per-id weights, or None.
        row_starts: the shards' first rows, ascending, the first one 0 (host ints).
        max_partition_shards: the most shards for which the counting partition runs, else the
            sort (default `PARTITION_MAX_SHARDS`); both give the same tensors. The benchmark
            (``benchmarks/bench_row_buckets.py``) times each path through it.
        kernel: ``"eager"`` (the partition or the sort), ``"compiled"`` or ``"auto"``; None: the
            process's kernel (`shardkit.kernels.kernel_path`). The compiled operator serves
            int64 ids on the CPU; other ids run eager whatever is asked.

    Returns:
        ``shard_lengths`` ``[S, B]`` ids per (shard, bag); ``rebased`` ``[n]`` shard-local rows
        grouped by shard; the weights in that order (or None); ``order`` ``[n]``, the
        permutation of ``values`` that groups them.
    """
    _check_starts(row_starts, max_partition_shards)
    if max_partition_shards is None:
        max_partition_shards = PARTITION_MAX_SHARDS
    if _compiled(values, lengths, kernel):
        shard_lengths, rebased, order = kernels.bucket_rows(values, lengths, list(row_starts))
    elif len(row_starts) <= max_partition_shards:
        shard_lengths, rebased, order = _partition(lengths, values, list(row_starts))
    else:
        shard_lengths, rebased, order = _sort(lengths, values, list(row_starts))
    sorted_weights = None if weights is None else weights.index_select(0, order)
    return shard_lengths, rebased, sorted_weights, order


def _compiled(
    values: torch.Tensor, lengths: torch.Tensor, kernel: kernels.KernelPath | str | None
) -> bool:
    """Whether the compiled operator buckets these ids."""
    if values.device.type != "cpu" or values.dtype != torch.int64:
        return False
    if lengths.dtype not in (torch.int64, torch.int32):
        return False
    if kernel is None:
        return kernels.kernel_path() == kernels.KernelPath.COMPILED
    if kernels.KernelPath(kernel) == kernels.KernelPath.EAGER:
        return False  # no scope entered, no library loaded
    with kernels.use_kernel(kernel) as path:  # resolves AUTO, loads the library
        return path == kernels.KernelPath.COMPILED


def _check_starts(row_starts: Sequence[int], max_partition_shards: int | None) -> None:
    """Refuse shard starts the two paths would read differently (host ints: no device read)."""
    starts = list(row_starts)
    if not starts or starts[0] != 0 or any(b < a for a, b in pairwise(starts)):
        raise ValueError(
            f"row_starts must be the shards' first rows, ascending from 0, got "
            f"{starts}; give one start per shard, e.g. [0, 50, 100] for 3 shards of 150 rows"
        )
    if max_partition_shards is not None and max_partition_shards < 0:
        raise ValueError(
            f"max_partition_shards must be >= 0 (0: always the sort), got {max_partition_shards}"
        )


def _partition(
    lengths: torch.Tensor, values: torch.Tensor, row_starts: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The counting partition: a few passes over the ids per shard, no sort."""
    num_shards, n, device = len(row_starts), values.numel(), values.device
    if n == 0:
        zeros = torch.zeros((num_shards, lengths.numel()), dtype=torch.int64, device=device)
        return zeros, values.clone(), torch.empty(0, dtype=torch.int64, device=device)
    at_least = [values >= start for start in row_starts[1:]]  # at_least[k]: in shard > k
    shifted = values.clone()
    for k, above in enumerate(at_least):
        shifted.sub_(above * (row_starts[k + 1] - row_starts[k]))
    bag_ends = torch.cumsum(lengths, 0)
    bag_begins = bag_ends - lengths
    place = torch.zeros(n, dtype=torch.int64, device=device)
    offset = torch.zeros(1, dtype=torch.int64, device=device)  # ids of the shards before
    per_shard = []
    for k in range(num_shards):
        mask = _in_shard(at_least, k, values)
        count = torch.cumsum(mask, 0, dtype=torch.int64)  # [n] inclusive running count
        place.add_(mask * (count + (offset - 1)))
        padded = torch.cat([count.new_zeros(1), count])
        per_shard.append(padded.index_select(0, bag_ends) - padded.index_select(0, bag_begins))
        offset = offset + count[-1:]
    order = torch.empty_like(place).scatter_(0, place, torch.arange(n, device=device))
    return torch.stack(per_shard), shifted.index_select(0, order), order


def _in_shard(at_least: list[torch.Tensor], k: int, values: torch.Tensor) -> torch.Tensor:
    """``[n]`` bool: the ids whose row shard ``k`` holds."""
    if not at_least:
        return torch.ones_like(values, dtype=torch.bool)
    if k == 0:
        return ~at_least[0]
    if k == len(at_least):
        return at_least[-1]
    return at_least[k - 1] & ~at_least[k]


def _sort(
    lengths: torch.Tensor, values: torch.Tensor, row_starts: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``bucketize`` and a stable sort by shard: for many shards."""
    batch, num_shards, device = lengths.numel(), len(row_starts), values.device
    starts = torch.tensor(row_starts, dtype=torch.int64)
    starts = starts.to(device, non_blocking=True)  # See [Note: host-side sizes] in `_input`
    bucket = torch.bucketize(values, starts[1:], right=True)  # [n]: shard of each id
    bag = torch.repeat_interleave(
        torch.arange(batch, device=device), lengths, output_size=values.numel()
    )
    # ids per (shard, bag); scatter_add, not bincount, which reads its input's max on a GPU
    key = bucket * batch + bag
    shard_lengths = torch.zeros(num_shards * batch, dtype=torch.int64, device=device)
    shard_lengths.scatter_add_(0, key, torch.ones_like(key))
    order = torch.argsort(bucket, stable=True)  # by shard; within a shard still bag by bag
    rebased = values[order] - starts[bucket[order]]
    return shard_lengths.view(num_shards, batch), rebased, order
