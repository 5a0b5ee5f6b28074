"""``fbgemm_gpu.split_embedding_configs``: `EmbOptimType` (shardkit's fused optimizers, with
FBGEMM's names) and `SparseType` (FBGEMM's names of table and output precisions)."""

from __future__ import annotations

import enum

import torch

from shardkit.optim import EmbOptimType

__all__ = ["EmbOptimType", "SparseType"]


@enum.unique
class SparseType(enum.Enum):
    """A precision of embedding weights or outputs (FBGEMM's members)."""

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
