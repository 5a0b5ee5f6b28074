"""The choices a user makes: sharding strategy, prefetching, offload, mixed precision, state dicts.

Enums and frozen dataclasses with FSDP1's names and defaults, shared by both faces
(`FullyShardedDataParallel` and `fully_shard`). Each dataclass checks itself when built.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

__all__ = [
    "BackwardPrefetch",
    "CPUOffload",
    "CPUOffloadPolicy",
    "FullStateDictConfig",
    "MixedPrecision",
    "MixedPrecisionPolicy",
    "OffloadPolicy",
    "PrefetchPolicy",
    "ShardedStateDictConfig",
    "ShardingStrategy",
    "StateDictType",
]


@enum.unique
class ShardingStrategy(enum.Enum):
    """What each rank keeps between uses (Ψ: parameter count, N: ranks that share a shard).

    FULL_SHARD (ZeRO-3) keeps 1/N of parameters, gradients and optimizer state; each unit gathers
    its parameters before forward and again before backward. SHARD_GRAD_OP (ZeRO-2) keeps the
    gathered parameters from forward to the end of backward. NO_SHARD keeps everything (like DDP:
    gradients are all-reduced). HYBRID_SHARD shards inside a host and replicates across hosts.
    """

    FULL_SHARD = "FULL_SHARD"
    SHARD_GRAD_OP = "SHARD_GRAD_OP"
    NO_SHARD = "NO_SHARD"
    HYBRID_SHARD = "HYBRID_SHARD"


@enum.unique
class BackwardPrefetch(enum.Enum):
    """When a unit starts gathering the parameters of the unit whose backward comes next.

    BACKWARD_PRE: as soon as this unit's backward starts (more overlap, one more unit unsharded).
    BACKWARD_POST: once this unit's gradients are computed, before they are reduce-scattered.
    """

    BACKWARD_PRE = "BACKWARD_PRE"
    BACKWARD_POST = "BACKWARD_POST"


@enum.unique
class StateDictType(enum.Enum):
    """FULL_STATE_DICT: plain tensors of the unsharded module. SHARDED_STATE_DICT: one DTensor per
    parameter holding this rank's rows, for `torch.distributed.checkpoint`."""

    FULL_STATE_DICT = "FULL_STATE_DICT"
    SHARDED_STATE_DICT = "SHARDED_STATE_DICT"


@dataclass(frozen=True)
class CPUOffload:
    """``offload_params=True``: shards and their gradients live in CPU memory, the optimizer steps
    there, and each unit copies its shards to the compute device to gather them. On a machine
    with no GPU the compute device is the CPU too and this is the default behaviour."""

    offload_params: bool = False


@dataclass(frozen=True)
class MixedPrecision:
    """Dtypes of the gathered parameters, of gradient reduction and of buffers.

    Shards, their gradients and the optimizer stay in the parameters' own dtype (float32).
    ``reduce_dtype=None`` with a ``param_dtype`` reduces in ``param_dtype`` (as torch's FSDP).
    ``cast_root_forward_inputs`` casts floating inputs of the outermost unit to ``param_dtype``;
    ``cast_forward_inputs`` does it for every unit.

    Example::

        MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    buffer_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = False
    cast_root_forward_inputs: bool = True

    def __post_init__(self) -> None:
        for name in ("param_dtype", "reduce_dtype", "buffer_dtype"):
            dtype = getattr(self, name)
            if dtype is not None and not (
                isinstance(dtype, torch.dtype) and dtype.is_floating_point
            ):
                raise ValueError(
                    f"MixedPrecision.{name} must be a floating torch.dtype or None, got {dtype!r}; "
                    "use e.g. torch.bfloat16"
                )

    @property
    def effective_reduce_dtype(self) -> torch.dtype | None:
        return self.reduce_dtype if self.reduce_dtype is not None else self.param_dtype


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """FSDP2's name for mixed precision (``fully_shard(mp_policy=...)``), so FSDP2 code runs
    after its imports are rewritten; `fully_shard` turns it into `MixedPrecision`.
    ``output_dtype`` (casting the module's outputs) is not supported and refused."""

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True

    def to_mixed_precision(self) -> MixedPrecision:
        if self.output_dtype is not None:
            raise ValueError(
                f"MixedPrecisionPolicy(output_dtype={self.output_dtype}) is not supported by "
                "shardkit's fully_shard; cast the outputs in the module, or leave it None"
            )
        return MixedPrecision(
            param_dtype=self.param_dtype,
            reduce_dtype=self.reduce_dtype,
            cast_forward_inputs=self.cast_forward_inputs and self.param_dtype is not None,
        )


@dataclass(frozen=True)
class OffloadPolicy:
    """FSDP2's "no offload" (``fully_shard(offload_policy=OffloadPolicy())``)."""

    def to_cpu_offload(self) -> CPUOffload:
        return CPUOffload(offload_params=False)


@dataclass(frozen=True)
class CPUOffloadPolicy(OffloadPolicy):
    """FSDP2's CPU offload: `CPUOffload(offload_params=True)`; shards on a GPU machine are
    offloaded to pinned memory whatever ``pin_memory`` says."""

    pin_memory: bool = True

    def to_cpu_offload(self) -> CPUOffload:
        return CPUOffload(offload_params=True)


@dataclass(frozen=True)
class PrefetchPolicy:
    """Overlap of the next unit's all-gather with this unit's compute.

    ``forward``: start gathering the next unit (in the previous iteration's order) when a unit's
    forward starts. ``backward``: see `BackwardPrefetch`; None gathers each unit only when its
    backward starts. Either way at most two units besides the root are unsharded at once.
    """

    forward: bool = True
    backward: BackwardPrefetch | None = BackwardPrefetch.BACKWARD_PRE

    def __post_init__(self) -> None:
        if self.backward is not None and not isinstance(self.backward, BackwardPrefetch):
            raise TypeError(
                f"PrefetchPolicy.backward must be a BackwardPrefetch or None, got "
                f"{self.backward!r}; use BackwardPrefetch.BACKWARD_PRE"
            )


@dataclass(frozen=True)
class FullStateDictConfig:
    """``rank0_only``: only rank 0 gets the entries (others get an empty dict).
    ``offload_to_cpu``: gathered tensors are moved to the CPU one by one as they are gathered."""

    offload_to_cpu: bool = False
    rank0_only: bool = False


@dataclass(frozen=True)
class ShardedStateDictConfig:
    """``offload_to_cpu``: the DTensors' local shards are CPU copies."""

    offload_to_cpu: bool = False
