"""The sharders of `EmbeddingBagCollection` and `EmbeddingCollection`, as the planner needs
them: which module type, which tables, which sharding types and kernels, which fused optimizer.

Sharding a module (``shard()``) comes with the sharded modules; these classes describe.
"""

from __future__ import annotations

from torch import nn

from shardkit.planner import BaseEmbeddingSharder

__all__ = ["EmbeddingBagCollectionSharder", "EmbeddingCollectionSharder"]


class EmbeddingBagCollectionSharder(BaseEmbeddingSharder):
    """Shards an `EmbeddingBagCollection` (TorchRec's name and arguments).

    Args:
        fused_params: the fused kernel's parameters, e.g.
            ``{"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}``; the
            planner counts that optimizer's state (default row-wise Adagrad).
        shardable_params: names of the tables to shard (default: all).
    """

    @property
    def module_type(self) -> type[nn.Module]:
        from shardkit.modules.embedding_modules import EmbeddingBagCollection

        return EmbeddingBagCollection


class EmbeddingCollectionSharder(BaseEmbeddingSharder):
    """Shards an `EmbeddingCollection` (TorchRec's name and arguments; see
    `EmbeddingBagCollectionSharder`)."""

    @property
    def module_type(self) -> type[nn.Module]:
        from shardkit.modules.embedding_modules import EmbeddingCollection

        return EmbeddingCollection
