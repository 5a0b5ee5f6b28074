"""shardkit: model-parallel embeddings and fully sharded data parallel in plain PyTorch."""

# `shardkit.distributed.DistributedModelParallel` must work after a bare `import shardkit`,
# as `torchrec.distributed.DistributedModelParallel` does after `import torchrec` (seed 002).
from shardkit import distributed  # noqa: F401 (see above)
from shardkit.modules import (
    DataType,
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    PoolingType,
)
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from shardkit.streamable import Multistreamable, Pipelineable

# TorchRec's KJT, JT and KT are Pipelineable: so are ours (a train pipeline moves them).
for _cls in (JaggedTensor, KeyedJaggedTensor, KeyedTensor):
    Pipelineable.register(_cls)
del _cls

__version__ = "0.1.0"

__all__ = [
    "DataType",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "EmbeddingCollection",
    "EmbeddingConfig",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "Multistreamable",
    "Pipelineable",
    "PoolingType",
    "__version__",
]
