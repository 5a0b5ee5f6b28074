"""``torchrec.distributed.planner.partitioners``: placing a proposal's shards on ranks."""

from shardkit.planner import (
    GreedyPerfPartitioner,
    MemoryBalancedPartitioner,
    OrderedDeviceHardware,
    ShardingOptionGroup,
    SortBy,
)

__all__ = [
    "GreedyPerfPartitioner",
    "MemoryBalancedPartitioner",
    "OrderedDeviceHardware",
    "ShardingOptionGroup",
    "SortBy",
]
