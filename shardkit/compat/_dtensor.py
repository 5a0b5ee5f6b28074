"""DTensor on demand: importing `shardkit.fsdp`, `shardkit.checkpoint`, `shardkit.train` or the
CLI does not import ``torch.distributed.tensor``.

[Note: DTensor on demand]
Importing ``torch.distributed.tensor`` (DTensor, and sympy under it) takes 0.7 s on a quiet Zen 3
core and 2.5-5 s on a busy one, in a program's parent and in every rank, and FSDP1
(`FullyShardedDataParallel`) with plain shards and DMP without ``fully_shard`` never need it.
So the code that makes DTensors or placements (`shardkit.fsdp.fully_shard`'s parameters, DTensor
state dicts) imports it when it runs, `shardkit.checkpoint` imports torch's DCP (which imports
DTensor) when it saves or loads, not at import (nor, through it, `shardkit.train` and the CLI),
and the code that only asks whether a value is one uses `is_dtensor`: a value can be a DTensor
only once ``torch.distributed.tensor`` is imported (by anyone: the program, torch's DCP,
``fully_shard``), so while it is not, no value is, and nothing needs importing to say so.
``torch.compile`` traces `is_dtensor` whole (``fullgraph=True``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, TypeGuard

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

__all__ = ["is_dtensor"]


def is_dtensor(value: object) -> TypeGuard[DTensor]:
    """``isinstance(value, DTensor)``, without importing DTensor ([Note: DTensor on demand])."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)
