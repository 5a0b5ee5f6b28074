"""``torchrec.distributed.mc_modules``: the sharded `ManagedCollisionCollection` (each rank
keeps the remapper of its rows)."""

from shardkit.sharding import ShardedManagedCollisionCollection

__all__ = ["ShardedManagedCollisionCollection"]
