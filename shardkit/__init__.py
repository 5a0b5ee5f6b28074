"""shardkit: model-parallel embeddings and fully sharded data parallel in plain PyTorch."""

from shardkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

__version__ = "0.1.0"

__all__ = ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor", "__version__"]
