"""FBGEMM's enums that TorchRec's vocabulary names (precisions, pooling modes, where a table
lives, cache algorithms, bounds checks), with FBGEMM's members and values.

``shardkit.fbgemm_gpu`` re-exports them at FBGEMM's paths. shardkit keeps every table whole in
its rank's memory (`EmbeddingLocation.DEVICE`), pools by the tables' ``PoolingType``, has no
cache and checks ids itself: these are values, and the FBGEMM settings that name the others
(UVM caching, ``bounds_check_mode``) are refused where they are given.
"""

from __future__ import annotations

import enum

import torch

__all__ = ["BoundsCheckMode", "CacheAlgorithm", "EmbeddingLocation", "PoolingMode", "SparseType"]


@enum.unique
class SparseType(enum.Enum):
    """A precision of embedding weights, outputs or communication (FBGEMM's members)."""

    FP32 = "fp32"
    FP16 = "fp16"
    FP8 = "fp8"
    NFP8 = "nfp8"
    INT8 = "int8"
    INT4 = "int4"
    INT2 = "int2"
    BF16 = "bf16"
    MX4 = "mx4"

    def bit_rate(self) -> int:
        """Bits per value."""
        return _BITS[self]

    def is_float(self) -> bool:
        return self in (SparseType.FP32, SparseType.FP16, SparseType.FP8, SparseType.NFP8,
                        SparseType.BF16, SparseType.MX4)  # fmt: skip

    def as_dtype(self) -> torch.dtype:
        """The torch dtype holding one value (``torch.uint8`` for the packed integer types)."""
        return _DTYPES.get(self, torch.uint8)

    @staticmethod
    def from_dtype(dtype: torch.dtype) -> SparseType:
        for sparse_type, candidate in _DTYPES.items():
            if candidate == dtype:
                return sparse_type
        raise ValueError(f"SparseType.from_dtype: no SparseType for {dtype}; use float32, "
                         "float16, bfloat16 or uint8 (INT8)")  # fmt: skip


_BITS = {SparseType.FP32: 32, SparseType.FP16: 16, SparseType.BF16: 16, SparseType.FP8: 8,
         SparseType.NFP8: 8, SparseType.INT8: 8, SparseType.INT4: 4, SparseType.INT2: 2,
         SparseType.MX4: 4}  # fmt: skip
_DTYPES = {SparseType.FP32: torch.float32, SparseType.FP16: torch.float16,
           SparseType.BF16: torch.bfloat16, SparseType.INT8: torch.uint8}  # fmt: skip


@enum.unique
class EmbeddingLocation(enum.IntEnum):
    DEVICE = 0
    MANAGED = 1
    MANAGED_CACHING = 2
    HOST = 3
    MTIA = 4


@enum.unique
class PoolingMode(enum.IntEnum):
    SUM = 0
    MEAN = 1
    NONE = 2


@enum.unique
class CacheAlgorithm(enum.Enum):
    LRU = 0
    LFU = 1


@enum.unique
class BoundsCheckMode(enum.IntEnum):
    FATAL = 0
    WARNING = 1
    IGNORE = 2
    NONE = 3
    V2_IGNORE = 4
    V2_WARNING = 5
    V2_FATAL = 6
