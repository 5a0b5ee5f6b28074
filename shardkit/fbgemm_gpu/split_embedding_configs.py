"""``fbgemm_gpu.split_embedding_configs``: `EmbOptimType` (shardkit's fused optimizers, with
FBGEMM's names) and `SparseType` (FBGEMM's names of table and output precisions)."""

from shardkit.optim import EmbOptimType
from shardkit.types import SparseType

__all__ = ["EmbOptimType", "SparseType"]
