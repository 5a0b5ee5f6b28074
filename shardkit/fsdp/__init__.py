"""Fully sharded data parallel: parameters, gradients and optimizer state split over ranks.

The names and semantics of ``torch.distributed.fsdp``, on one implementation (units of
parameters gathered with ``shardkit.comm``), with two faces:

- `fully_shard` (FSDP2): shards a module in place; its parameters become DTensors, configured by
  `MixedPrecisionPolicy` and `OffloadPolicy` / `CPUOffloadPolicy`, controlled through
  `FSDPModule`'s methods;
- `FullyShardedDataParallel` (FSDP1, seed 004): a wrapper with plain shard parameters, FSDP1's
  arguments (`shardkit.fsdp.api`), auto-wrap policies (`shardkit.fsdp.wrap`) and state-dict
  types.

The same code runs on CPUs (gloo) and GPUs (NCCL). See docs/fsdp.md.
"""

from typing import Any

from shardkit.fsdp._fsdp_module import (
    FSDPModule,
    UnshardHandle,
    register_fsdp_forward_method,
    share_comm_ctx,
)
from shardkit.fsdp._fully_shard import fully_shard
from shardkit.fsdp._optim_state_dict import (
    OptimStateKeyType,
    optim_state_dict,
    optim_state_dict_to_load,
)
from shardkit.fsdp._policies import (
    CPUOffloadPolicy,
    DataParallelMeshDims,
    MixedPrecisionPolicy,
    OffloadPolicy,
)
from shardkit.fsdp._refused import refuse
from shardkit.fsdp._state_dict import state_dict_type
from shardkit.fsdp._summon import summon_full_params
from shardkit.fsdp.api import (
    BackwardPrefetch,
    CPUOffload,
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalOptimStateDictConfig,
    LocalStateDictConfig,
    MixedPrecision,
    OptimStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictConfig,
    StateDictSettings,
    StateDictType,
)
from shardkit.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel

__all__ = [
    "BackwardPrefetch",
    "CPUOffload",
    "CPUOffloadPolicy",
    "DataParallelMeshDims",
    "FSDPModule",
    "FullOptimStateDictConfig",
    "FullStateDictConfig",
    "FullyShardedDataParallel",
    "LocalOptimStateDictConfig",
    "LocalStateDictConfig",
    "MixedPrecision",
    "MixedPrecisionPolicy",
    "OffloadPolicy",
    "OptimStateDictConfig",
    "OptimStateKeyType",
    "ShardedOptimStateDictConfig",
    "ShardedStateDictConfig",
    "ShardingStrategy",
    "StateDictConfig",
    "StateDictSettings",
    "StateDictType",
    "UnshardHandle",
    "fully_shard",
    "optim_state_dict",
    "optim_state_dict_to_load",
    "register_fsdp_forward_method",
    "share_comm_ctx",
    "state_dict_type",
    "summon_full_params",
]


def __getattr__(name: str) -> Any:
    raise refuse(__name__, name)
