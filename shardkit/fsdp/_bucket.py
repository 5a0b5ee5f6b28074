"""What a unit's parameters are gathered, freed and reduced through: one protocol, two kinds.

[Note: one bucket protocol]
A unit's sharded parameters go through flat buckets (one per dtype, see [Note: flat buckets]):
one all-gather and one reduce-scatter each. A parameter kept whole on every rank (see
[Note: shard layout]) goes through a `WholeBucket` of its own: a cast/copy instead of a gather,
an all-reduce instead of a reduce-scatter, nothing at all when the shard and the gathered
parameter are one Parameter (*aliased*). `ParamGroup` drives both through `Bucket`, in one loop.
"""

from __future__ import annotations

from typing import Protocol

import torch

from shardkit.fsdp._memory import BufferPool
from shardkit.fsdp._param import ShardedParam

__all__ = ["Bucket", "WholeBucket"]


class Bucket(Protocol):
    """Parameters gathered, freed and reduced together. See [Note: one bucket protocol]."""

    params: list[ShardedParam]
    direct: list[bool]  # parameter i's gradient is reduced straight from its tensor

    @property
    def is_unsharded(self) -> bool: ...

    def load(self, index: int, full: torch.Tensor) -> None: ...

    def is_stale(self) -> bool: ...

    def mark_stale(self) -> None: ...

    def start_unshard(self) -> None: ...

    def finish_unshard(self) -> None: ...

    def free(self, *, keep_memory: bool = False) -> None: ...

    def has_new_grads(self) -> bool: ...

    def start_reduce(self, reduce_dtype: torch.dtype | None, pool: BufferPool) -> None: ...

    def finish_reduce(self, pool: BufferPool) -> int: ...


class WholeBucket:
    """One parameter kept whole on every rank, as a `Bucket` (see [Note: one bucket protocol])."""

    def __init__(self, param: ShardedParam) -> None:
        assert param.whole
        self.params = [param]
        self.direct = [False]
        self.param = param

    @property
    def is_unsharded(self) -> bool:
        """Whether the gathered copy holds memory or is being made (never, when it shares the
        shard's storage)."""
        param = self.param
        return not param.shares_storage and (param.is_unsharded or param._gather is not None)

    def load(self, index: int, full: torch.Tensor) -> None:
        """The shard is ``full`` itself or a copy of it."""
        self.param.set_shard(self.param.make_whole_shard(full))

    def is_stale(self) -> bool:
        return self.param.is_stale()

    def mark_stale(self) -> None:
        self.param.mark_stale()

    def start_unshard(self) -> None:
        if not self.param.aliased:
            self.param.start_unshard_whole()

    def finish_unshard(self) -> None:
        if self.param.aliased:
            self.param.sync_requires_grad()
        else:
            self.param.finish_unshard_whole()

    def free(self, *, keep_memory: bool = False) -> None:
        self.param.free_whole()

    def has_new_grads(self) -> bool:
        return self.param.has_new_grad()

    def start_reduce(self, reduce_dtype: torch.dtype | None, pool: BufferPool) -> None:
        self.param.start_reduce_whole(reduce_dtype)

    def finish_reduce(self, pool: BufferPool) -> int:
        """Wait for the all-reduce and add the gradient; releases nothing counted."""
        self.param.finish_reduce_whole()
        return 0
