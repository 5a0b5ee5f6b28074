"""Fully sharded data parallel: parameters, gradients and optimizer state split over ranks.

Two faces on one implementation (units of parameters gathered with ``shardkit.comm``):

- `FullyShardedDataParallel`, the wrapper of torch's FSDP1 (seed 004), with its helpers in
  ``shardkit.fsdp.fully_sharded_data_parallel`` and auto-wrap policies in ``shardkit.fsdp.wrap``;
- `fully_shard`, FSDP2's in-place style, configured by the policy dataclasses.

The same code runs on CPUs (gloo) and GPUs (NCCL). See docs/fsdp.md.
"""

from shardkit.fsdp._api import (
    BackwardPrefetch,
    CPUOffload,
    CPUOffloadPolicy,
    FullStateDictConfig,
    MixedPrecision,
    MixedPrecisionPolicy,
    OffloadPolicy,
    PrefetchPolicy,
    ShardedStateDictConfig,
    ShardingStrategy,
    StateDictType,
)
from shardkit.fsdp._fully_shard import FSDPModule, fully_shard
from shardkit.fsdp._optim_state_dict import optim_state_dict, optim_state_dict_to_load
from shardkit.fsdp._state_dict import state_dict_type
from shardkit.fsdp._summon import summon_full_params
from shardkit.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel

__all__ = [
    "BackwardPrefetch",
    "CPUOffload",
    "CPUOffloadPolicy",
    "FSDPModule",
    "FullStateDictConfig",
    "FullyShardedDataParallel",
    "MixedPrecision",
    "MixedPrecisionPolicy",
    "OffloadPolicy",
    "PrefetchPolicy",
    "ShardedStateDictConfig",
    "ShardingStrategy",
    "StateDictType",
    "fully_shard",
    "optim_state_dict",
    "optim_state_dict_to_load",
    "state_dict_type",
    "summon_full_params",
]
