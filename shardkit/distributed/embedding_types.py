"""``torchrec.distributed.embedding_types``: compute kernels and the embedding sharder base."""

from shardkit.types import BaseEmbeddingSharder, EmbeddingComputeKernel

__all__ = ["BaseEmbeddingSharder", "EmbeddingComputeKernel"]
