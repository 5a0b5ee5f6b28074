"""The sharders that shard: `ModuleSharder` (in `shardkit.types`) describes a module type to
the planner; the sharders DMP and `shard` use also build the sharded module (TorchRec's
``ModuleSharder.shard``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from shardkit.types import ParameterSharding, ShardingEnv

__all__ = ["ShardingSharder", "sharders_by_type", "sharding_sharders"]


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


def sharding_sharders(
    sharders: Iterable[Any], *, module: nn.Module | None = None
) -> list[ShardingSharder]:
    """``sharders`` as they are, each checked to build its sharded module (``shard``); given
    ``module``, only those for a module type it contains (the others never shard).

    Raises:
        TypeError: naming a sharder without ``shard`` (a planner-only `ModuleSharder`).
    """
    types = None if module is None else {type(m) for m in module.modules()}
    checked = []
    for sharder in sharders:
        used = types is None or getattr(sharder, "module_type", None) in types
        if used and not isinstance(sharder, ShardingSharder):
            kind = getattr(getattr(sharder, "module_type", None), "__name__", "?")
            raise TypeError(
                f"sharder {sharder!r} (for {kind}) has no shard(module, params, env, device, "
                "module_fqn) method, which builds the sharded module; a ModuleSharder alone "
                "only describes a module type to the planner. Subclass one of shardkit's "
                "sharders (e.g. EmbeddingBagCollectionSharder) or give it shard()"
            )
        checked.append(sharder)
    return checked


def sharders_by_type(
    sharders: Iterable[Any], *, module: nn.Module | None = None
) -> dict[type, ShardingSharder]:
    """Module type -> its sharder (checked by `sharding_sharders`, for ``module``)."""
    given = list(sharders)
    checked = sharding_sharders(given, module=module)
    return {s.module_type: c for s, c in zip(given, checked)}
