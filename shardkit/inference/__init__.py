"""Preparing trained models for serving (TorchRec's ``torchrec.inference``), and serving
quantized tables across ranks."""

from shardkit.inference._sequence import ShardedQuantEmbeddingCollection
from shardkit.inference._sharded import ShardedQuantEmbeddingBagCollection
from shardkit.inference.modules import quantize_embeddings, shard_quant_model

__all__ = [
    "ShardedQuantEmbeddingBagCollection",
    "ShardedQuantEmbeddingCollection",
    "quantize_embeddings",
    "shard_quant_model",
]
