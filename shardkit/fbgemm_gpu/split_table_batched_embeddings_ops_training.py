"""``fbgemm_gpu.split_table_batched_embeddings_ops_training``: `ComputeDevice`; FBGEMM's training
kernels are refused (shardkit's collections are the kernel)."""

from __future__ import annotations

import enum

from shardkit.compat import refuse

__all__ = ["ComputeDevice"]

_KERNEL = (
    "FBGEMM's table-batched embedding kernel; shardkit's EmbeddingBagCollection batches its "
    "tables itself: use it (with fused_params or apply_optimizer_in_backward)"
)
__getattr__ = refuse(__name__, {"SplitTableBatchedEmbeddingBagsCodegen": _KERNEL,
                                "DenseTableBatchedEmbeddingBagsCodegen": _KERNEL})  # fmt: skip


@enum.unique
class ComputeDevice(enum.Enum):
    CPU = 0
    CUDA = 1
    MTIA = 2
