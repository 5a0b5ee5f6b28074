"""``torchrec.distributed.shard``: the composable `shard` and `shard_modules`."""

from shardkit.sharding import (
    shard,
    shard_modules,
)

__all__ = [
    "shard",
    "shard_modules",
]
