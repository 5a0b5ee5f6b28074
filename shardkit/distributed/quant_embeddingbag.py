"""``torchrec.distributed.quant_embeddingbag``: quantized tables served across ranks.

shardkit's `ShardedQuantEmbeddingBagCollection` (from `shardkit.inference`) places whole
quantized tables on ranks, one process each; build it with ``shard_quant_model(model)``. Its
constructor is shardkit's (``(module, placement)``), not TorchRec's sharder-built one; TorchRec's
quantized sharders, which run FBGEMM's inference kernels on the devices of one process, are
refused by name.
"""

from shardkit.compat import refuse
from shardkit.inference import ShardedQuantEmbeddingBagCollection

__all__ = ["ShardedQuantEmbeddingBagCollection"]

_SHARDER = (
    "TorchRec's quantized sharders build FBGEMM inference kernels on the devices of one process; "
    "shardkit.inference.shard_quant_model(model) spreads quantized tables table-wise over ranks"
)
__getattr__ = refuse(
    __name__,
    {
        name: _SHARDER
        for name in (
            "QuantEmbeddingBagCollectionSharder",
            "QuantFeatureProcessedEmbeddingBagCollectionSharder",
            "QuantManagedCollisionEmbeddingBagCollectionSharder",
            "ShardedQuantFeatureProcessedEmbeddingBagCollection",
            "ShardedQuantManagedCollisionEmbeddingBagCollection",
        )
    },
)
