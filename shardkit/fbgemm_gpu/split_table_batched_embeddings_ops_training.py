"""``fbgemm_gpu.split_table_batched_embeddings_ops_training``: `ComputeDevice` and
`SplitTableBatchedEmbeddingBagsCodegen` (FBGEMM's constructor and forward over shardkit's kernel,
CPU); the dense-gradient variant is refused."""

from __future__ import annotations

import enum

from shardkit.compat import refuse
from shardkit.fbgemm_gpu._tbe import SplitTableBatchedEmbeddingBagsCodegen

__all__ = ["ComputeDevice", "SplitTableBatchedEmbeddingBagsCodegen"]

_KERNEL = (
    "FBGEMM's table-batched embedding kernel; shardkit's EmbeddingBagCollection batches its "
    "tables itself: use it (with fused_params or apply_optimizer_in_backward)"
)
__getattr__ = refuse(__name__, {"DenseTableBatchedEmbeddingBagsCodegen": _KERNEL})


@enum.unique
class ComputeDevice(enum.Enum):
    CPU = 0
    CUDA = 1
    MTIA = 2
