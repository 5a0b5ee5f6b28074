"""Preparing trained models for serving (TorchRec's ``torchrec.inference``), serving
quantized tables across ranks, and programs that serve without shardkit (`export_program`:
`torch.export`; `aoti_package`: AOTInductor)."""

from shardkit.inference._pt2 import (
    FlatInputs,
    FlatSparseInputs,
    aoti_package,
    export_program,
)
from shardkit.inference._sequence import ShardedQuantEmbeddingCollection
from shardkit.inference._sharded import ShardedQuantEmbeddingBagCollection
from shardkit.inference.modules import quantize_embeddings, shard_quant_model

__all__ = [
    "FlatInputs",
    "FlatSparseInputs",
    "ShardedQuantEmbeddingBagCollection",
    "ShardedQuantEmbeddingCollection",
    "aoti_package",
    "export_program",
    "quantize_embeddings",
    "shard_quant_model",
]
