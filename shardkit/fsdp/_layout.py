"""Where each parameter's rows sit in a unit's flat shard. See [Note: flat buckets] and
[Note: direct parameters] in `_flat`."""

from __future__ import annotations

from shardkit.fsdp._param import ShardedParam

__all__ = ["DIRECT_MIN_NUMEL", "is_direct", "shard_offsets"]

# A parameter of at least this many elements whose rows split equally over the ranks is
# gathered and reduced on its own, in place. See [Note: direct parameters].
DIRECT_MIN_NUMEL = 1 << 16


def is_direct(param: ShardedParam, num_ranks: int) -> bool:
    rows = param.rows_per_rank
    return len(set(rows)) == 1 and rows[0] * param.row_numel * num_ranks >= DIRECT_MIN_NUMEL


def shard_offsets(
    params: list[ShardedParam], direct: list[bool], num_ranks: int
) -> tuple[list[list[int]], int, int]:
    """``offsets[k][i]``: where parameter i's rows start in rank k's flat shard; the packed
    region's size (the largest rank's, the others end in padding); and the flat shard's size.
    See [Note: direct parameters]."""
    offsets, totals = [], []
    for rank in range(num_ranks):
        offset, starts = 0, []
        for param, alone in zip(params, direct):
            starts.append(offset)
            offset += 0 if alone else param.rows_per_rank[rank] * param.row_numel
        offsets.append(starts)
        totals.append(offset)
    packed = max(totals)
    offset = packed
    for index, (param, alone) in enumerate(zip(params, direct)):
        if alone:
            for starts in offsets:
                starts[index] = offset
            offset += param.rows_per_rank[0] * param.row_numel
    return offsets, packed, offset
