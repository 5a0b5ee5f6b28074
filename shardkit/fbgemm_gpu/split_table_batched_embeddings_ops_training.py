"""``fbgemm_gpu.split_table_batched_embeddings_ops_training``: `ComputeDevice` and
`SplitTableBatchedEmbeddingBagsCodegen` / `DenseTableBatchedEmbeddingBagsCodegen` (FBGEMM's
constructors and forward over shardkit's kernel, CPU; fused optimizer / dense gradients)."""

from __future__ import annotations

import enum

from shardkit.fbgemm_gpu._tbe import (
    DenseTableBatchedEmbeddingBagsCodegen,
    SplitTableBatchedEmbeddingBagsCodegen,
)

__all__ = [
    "ComputeDevice",
    "DenseTableBatchedEmbeddingBagsCodegen",
    "SplitTableBatchedEmbeddingBagsCodegen",
]


@enum.unique
class ComputeDevice(enum.Enum):
    CPU = 0
    CUDA = 1
    MTIA = 2
