"""FSDP1's choices, with the names, fields and defaults of ``torch.distributed.fsdp.api``.

Used by the wrapper `FullyShardedDataParallel` and its state-dict functions: the sharding
strategy, prefetching, CPU offload, mixed precision, and the state-dict types with their config
classes. ``fully_shard`` (FSDP2) has its own policy classes (`MixedPrecisionPolicy`,
`OffloadPolicy`, `CPUOffloadPolicy`). Every dataclass is frozen and checks itself when built.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

__all__ = [
    "BackwardPrefetch",
    "CPUOffload",
    "FullOptimStateDictConfig",
    "FullStateDictConfig",
    "LocalOptimStateDictConfig",
    "LocalStateDictConfig",
    "MixedPrecision",
    "OptimStateDictConfig",
    "ShardedOptimStateDictConfig",
    "ShardedStateDictConfig",
    "ShardingStrategy",
    "StateDictConfig",
    "StateDictSettings",
    "StateDictType",
]


@enum.unique
class ShardingStrategy(enum.Enum):
    """What each rank keeps between uses (Ψ: parameter count, N: ranks that share a shard).

    FULL_SHARD (ZeRO-3) keeps 1/N of parameters, gradients and optimizer state; each unit gathers
    its parameters before forward and again before backward. SHARD_GRAD_OP (ZeRO-2) keeps the
    gathered parameters from forward to the end of backward. NO_SHARD keeps everything (like DDP:
    gradients are all-reduced). HYBRID_SHARD shards inside a host and replicates across hosts;
    _HYBRID_SHARD_ZERO2 (torch's name) does too, keeping the gathered parameters as SHARD_GRAD_OP.
    """

    FULL_SHARD = "FULL_SHARD"
    SHARD_GRAD_OP = "SHARD_GRAD_OP"
    NO_SHARD = "NO_SHARD"
    HYBRID_SHARD = "HYBRID_SHARD"
    _HYBRID_SHARD_ZERO2 = "_HYBRID_SHARD_ZERO2"


@enum.unique
class BackwardPrefetch(enum.Enum):
    """When a unit starts gathering the parameters of the unit whose backward comes next.

    BACKWARD_PRE: as soon as this unit's backward starts (more overlap, one more unit unsharded).
    BACKWARD_POST: once this unit's gradients are computed, before they are reduce-scattered.
    """

    BACKWARD_PRE = "BACKWARD_PRE"
    BACKWARD_POST = "BACKWARD_POST"


@dataclass(frozen=True)
class CPUOffload:
    """``offload_params=True``: shards and their gradients live in CPU memory, the optimizer steps
    there, and each unit copies its shards to the compute device to gather them (from pinned
    memory where CUDA exists). On a machine with no GPU the compute device is the CPU too, and
    this is what happens anyway."""

    offload_params: bool = False


@dataclass(frozen=True)
class MixedPrecision:
    """Dtypes of the gathered parameters, of gradient reduction and of buffers.

    Shards, their gradients and the optimizer stay in the parameters' own dtype (float32).
    ``reduce_dtype=None`` with a ``param_dtype`` reduces in ``param_dtype`` (as torch's FSDP).
    ``cast_root_forward_inputs`` casts floating inputs of the outermost unit to ``param_dtype``;
    ``cast_forward_inputs`` does it for every unit. ``keep_low_precision_grads=True`` is refused:
    gradients always come back in the parameters' dtype.

    Example::

        MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    buffer_dtype: torch.dtype | None = None
    keep_low_precision_grads: bool = False
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True

    def __post_init__(self) -> None:
        check_dtypes(self, ("param_dtype", "reduce_dtype", "buffer_dtype"))
        if self.keep_low_precision_grads:
            raise ValueError(
                "MixedPrecision(keep_low_precision_grads=True) is not offered by shardkit: "
                "gradients are cast back to the parameters' dtype after reduction; leave it False"
            )


def check_dtypes(policy: object, names: tuple[str, ...]) -> None:
    """Every field in ``names`` of ``policy`` is a floating ``torch.dtype`` or None."""
    for name in names:
        dtype = getattr(policy, name)
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(
                f"{type(policy).__name__}.{name} must be a floating torch.dtype or None, got "
                f"{dtype!r}; use e.g. torch.bfloat16"
            )


@enum.unique
class StateDictType(enum.Enum):
    """What ``state_dict()`` gives inside `state_dict_type` (keys: the unsharded module's).

    FULL_STATE_DICT: plain tensors of the unsharded model. SHARDED_STATE_DICT: one DTensor per
    parameter with its global shape, holding this rank's rows (for torch.distributed.checkpoint,
    which loads it into any world size). LOCAL_STATE_DICT: this rank's rows as plain tensors,
    which load only into the same world size and sharding.
    """

    FULL_STATE_DICT = "FULL_STATE_DICT"
    LOCAL_STATE_DICT = "LOCAL_STATE_DICT"
    SHARDED_STATE_DICT = "SHARDED_STATE_DICT"


@dataclass(frozen=True)
class StateDictConfig:
    """``offload_to_cpu``: state dict tensors are moved to the CPU (one at a time as they are made)."""

    offload_to_cpu: bool = False


@dataclass(frozen=True)
class FullStateDictConfig(StateDictConfig):
    """For FULL_STATE_DICT. ``rank0_only``: only rank 0 gets the entries, the others an empty
    dict."""

    rank0_only: bool = False


@dataclass(frozen=True)
class LocalStateDictConfig(StateDictConfig):
    """For LOCAL_STATE_DICT."""


@dataclass(frozen=True)
class ShardedStateDictConfig(StateDictConfig):
    """For SHARDED_STATE_DICT (the values are always DTensors)."""


@dataclass(frozen=True)
class OptimStateDictConfig:
    """``offload_to_cpu``: optimizer state tensors are moved to the CPU (torch's default: True)."""

    offload_to_cpu: bool = True


@dataclass(frozen=True)
class FullOptimStateDictConfig(OptimStateDictConfig):
    """For FULL_STATE_DICT. ``rank0_only``: only rank 0 gets the state, the others an empty
    dict."""

    rank0_only: bool = False


@dataclass(frozen=True)
class LocalOptimStateDictConfig(OptimStateDictConfig):
    """For LOCAL_STATE_DICT."""

    offload_to_cpu: bool = False


@dataclass(frozen=True)
class ShardedOptimStateDictConfig(OptimStateDictConfig):
    """For SHARDED_STATE_DICT (the values are DTensors)."""


@dataclass(frozen=True)
class StateDictSettings:
    """What `FullyShardedDataParallel.get_state_dict_type` returns: the type and both configs."""

    state_dict_type: StateDictType
    state_dict_config: StateDictConfig
    optim_state_dict_config: OptimStateDictConfig
