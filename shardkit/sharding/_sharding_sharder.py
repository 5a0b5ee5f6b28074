"""The sharders that shard: `ModuleSharder` (in `shardkit.types`) describes a module type to
the planner; the sharders DMP and `shard` use also build the sharded module (TorchRec's
``ModuleSharder.shard``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from shardkit.types import ParameterSharding, ShardingEnv

__all__ = ["ShardingSharder"]


@runtime_checkable
class ShardingSharder(Protocol):
    """A sharder with ``shard``: ``module`` -> its sharded version for its plan ``params``."""

    def shard(
        self,
        module: nn.Module,
        params: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | None = None,
        module_fqn: str | None = None,
        *,
        local_world_size: int | None = None,
        gradient_division: bool = True,
    ) -> nn.Module: ...
