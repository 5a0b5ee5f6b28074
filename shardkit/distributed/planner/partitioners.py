"""``torchrec.distributed.planner.partitioners``: placing a proposal's shards on ranks."""

from shardkit.distributed.planner._partitioners import (
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
