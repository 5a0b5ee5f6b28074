"""`ShardingEnv`: the ranks a sharded module runs on (TorchRec's name and constructors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

__all__ = ["DMPCollectionConfig", "DMPCollectionContext", "ShardingEnv", "ShardingEnv2D"]


@dataclass(frozen=True)
class ShardingEnv:
    """``world_size`` ranks, this process being ``rank``, joined by process group ``pg``.

    Plain data: building one starts nothing. ``pg`` is None for a local environment (planning,
    or single-host inference).
    """

    world_size: int
    rank: int
    pg: dist.ProcessGroup | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size must be an int >= 1, got {self.world_size!r}")
        if not isinstance(self.rank, int) or not 0 <= self.rank < self.world_size:
            raise ValueError(
                f"rank must be in [0, world_size={self.world_size}), got {self.rank!r}"
            )

    @property
    def process_group(self) -> dist.ProcessGroup | None:
        """TorchRec's name for `pg`."""
        return self.pg

    @classmethod
    def from_process_group(cls, pg: dist.ProcessGroup) -> ShardingEnv:
        """The environment of the calling rank in ``pg``."""
        return cls(dist.get_world_size(pg), dist.get_rank(pg), pg)

    @classmethod
    def from_local(cls, world_size: int, rank: int) -> ShardingEnv:
        """An environment with no process group."""
        return cls(world_size, rank, None)


class ShardingEnv2D(ShardingEnv):
    """TorchRec's environment for 2D parallelism: ranks shard within ``sharding_pg`` and
    replicate across ``replica_pg``.

    Data only: shardkit shards over one group of ranks (`DistributedModelParallel` refuses a
    2D environment by name). ``world_size`` and ``rank`` are those of ``sharding_pg``.
    """

    def __init__(
        self,
        sharding_pg: dist.ProcessGroup,
        replica_pg: dist.ProcessGroup,
        global_pg: dist.ProcessGroup,
        device_mesh: Any,
        node_group_size: int | None = None,
        use_inter_host_allreduce: bool = False,
        sharding_strategy: Any = None,
    ) -> None:
        fields = {
            "world_size": dist.get_world_size(sharding_pg),
            "rank": dist.get_rank(sharding_pg),
            "pg": global_pg,
            "sharding_pg": sharding_pg,
            "replica_pg": replica_pg,
            "device_mesh": device_mesh,
            "global_world_size": dist.get_world_size(global_pg),
            "global_rank": dist.get_rank(global_pg),
            "node_group_size": node_group_size,
            "use_inter_host_allreduce": use_inter_host_allreduce,
            "sharding_strategy": sharding_strategy,
        }
        for name, value in fields.items():
            object.__setattr__(self, name, value)
        self.__post_init__()

    def num_sharding_groups(self) -> int:
        """How many times the model-parallel part is replicated."""
        return self.global_world_size // self.world_size  # type: ignore[attr-defined]


class DMPCollectionConfig:
    """TorchRec's configuration of one module type under 2D parallelism (data only)."""

    def __init__(
        self,
        module: type,
        plan: Any,
        sharding_group_size: int,
        node_group_size: int | None = None,
        use_inter_host_allreduce: bool = False,
        sharding_strategy: Any = None,
    ) -> None:
        self.module = module
        self.plan = plan
        self.sharding_group_size = sharding_group_size
        self.node_group_size = node_group_size
        self.use_inter_host_allreduce = use_inter_host_allreduce
        self.sharding_strategy = sharding_strategy

    def _key(self) -> tuple:
        return (self.module, self.plan, self.sharding_group_size, self.node_group_size,
                self.use_inter_host_allreduce, self.sharding_strategy)  # fmt: skip

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DMPCollectionConfig):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(module={self.module}, sharding_group_size="
            f"{self.sharding_group_size}, node_group_size={self.node_group_size}, "
            f"use_inter_host_allreduce={self.use_inter_host_allreduce}, "
            f"sharding_strategy={self.sharding_strategy})"
        )


class DMPCollectionContext(DMPCollectionConfig):
    """A `DMPCollectionConfig` with the process groups and modules it runs with (data only)."""

    def __init__(self, module: type, plan: Any, sharding_group_size: int, **kwargs: Any) -> None:
        runtime = ("modules_to_sync", "sharded_module", "device_mesh", "sharding_pg",
                   "replica_pg", "weights_by_dtype", "optimizer_tensors_by_dtype",
                   "hash_zch_modules")  # fmt: skip
        state = {name: kwargs.pop(name, None) for name in runtime}
        super().__init__(module, plan, sharding_group_size, **kwargs)
        empty: dict[str, list[Any] | dict[Any, Any]] = {"modules_to_sync": [], "hash_zch_modules": [], "weights_by_dtype": {},
                 "optimizer_tensors_by_dtype": {}}  # fmt: skip
        for name, value in state.items():
            setattr(self, name, empty.get(name) if value is None else value)
