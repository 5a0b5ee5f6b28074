"""`ShardingEnv`: the ranks a sharded module runs on (TorchRec's name and constructors)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

__all__ = ["ShardingEnv"]


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
