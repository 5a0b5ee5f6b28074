"""FSDP2's policies for ``fully_shard``, with the names, fields and defaults of torch's.

The wrapper `FullyShardedDataParallel` takes FSDP1's classes instead (`shardkit.fsdp.api`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardkit.fsdp.api import check_dtypes

__all__ = ["CPUOffloadPolicy", "DataParallelMeshDims", "MixedPrecisionPolicy", "OffloadPolicy"]


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """Mixed precision of one `fully_shard` unit.

    ``param_dtype``: dtype the unit gathers its parameters in (the shards, their gradients and
    the optimizer stay in the parameters' own dtype). ``reduce_dtype``: dtype gradients are
    reduced in (None: ``param_dtype``). ``output_dtype``: floating outputs of the unit's forward
    are cast to it. ``cast_forward_inputs``: floating inputs of the unit's forward are cast to
    ``param_dtype``.

    Example::

        fully_shard(block, mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                          reduce_dtype=torch.float32))
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True

    def __post_init__(self) -> None:
        check_dtypes(self, ("param_dtype", "reduce_dtype", "output_dtype"))


@dataclass(frozen=True)
class OffloadPolicy:
    """No offloading: shards live on the compute device (``fully_shard``'s default)."""


@dataclass(frozen=True)
class CPUOffloadPolicy(OffloadPolicy):
    """Shards, their gradients and the optimizer state live in CPU memory and the optimizer steps
    there; each unit copies its shards to the compute device to gather them. ``pin_memory``:
    the shards are in pinned memory, for faster copies to a GPU (only where CUDA exists: on a
    CPU-only machine the compute device is the CPU and nothing is copied)."""

    pin_memory: bool = True


@dataclass(frozen=True)
class DataParallelMeshDims:
    """FSDP2's names of the data-parallel dimensions of a full SPMD mesh whose parameters are
    already DTensors (tensor parallel plus FSDP). shardkit's ``fully_shard`` shards plain
    parameters only and refuses ``dp_mesh_dims``: pass the data-parallel mesh as ``mesh``."""

    shard: str | tuple[str, ...] | None = None
    replicate: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.shard is None and self.replicate is None:
            raise ValueError(
                "DataParallelMeshDims needs shard or replicate (a mesh dimension name), got "
                "neither; e.g. DataParallelMeshDims(shard='dp')"
            )
