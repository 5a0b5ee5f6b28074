"""shardkit: model-parallel embeddings and fully sharded data parallel in plain PyTorch."""

__version__ = "0.1.0"

__all__ = ["__version__"]
