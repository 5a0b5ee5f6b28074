"""Quantized embedding collections for serving on CPU (TorchRec's ``torchrec.quant``): tables
stored row-wise in INT8, INT4, INT2 or FP16, looked up with torch's own quantized operators."""

from shardkit.quant._state import quantize_table_weights
from shardkit.quant._weights import TableWeights, assign_table_weights, table_weights
from shardkit.quant.embedding_modules import (
    EmbeddingBagCollection,
    EmbeddingCollection,
    quantize_state_dict,
)

__all__ = [
    "EmbeddingBagCollection",
    "EmbeddingCollection",
    "TableWeights",
    "assign_table_weights",
    "quantize_state_dict",
    "quantize_table_weights",
    "table_weights",
]
