"""The sharders of `EmbeddingBagCollection` and `EmbeddingCollection`: what the planner needs
(which module type, tables, sharding types and kernels, fused optimizer) and ``shard()``, which
builds the sharded module for a plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from shardkit.modules import EmbeddingBagCollection, EmbeddingCollection
from shardkit.sharding._collection._embedding import ShardedEmbeddingCollection
from shardkit.sharding._collection._embeddingbag import ShardedEmbeddingBagCollection
from shardkit.types import BaseEmbeddingSharder, ParameterSharding, ShardingEnv

__all__ = ["EmbeddingBagCollectionSharder", "EmbeddingCollectionSharder"]


class _CollectionSharder(BaseEmbeddingSharder):
    """Shards ``unsharded`` modules into ``sharded`` ones."""

    unsharded: type[nn.Module]
    sharded: type[nn.Module]  # a ShardedCollection, or a managed-collision one around it

    @property
    def module_type(self) -> type[nn.Module]:
        return self.unsharded

    def shard(
        self,
        module: nn.Module,
        params: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | None = None,
        module_fqn: str | None = None,
        *,
        local_world_size: int | None = None,
        gradient_division: bool = True,
    ) -> nn.Module:
        """The sharded version of ``module`` for its plan ``params`` on ``env``."""
        return self.sharded(
            module,
            params,
            env,
            device,
            fused_params=self.fused_params,
            local_world_size=local_world_size,
            gradient_division=gradient_division,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
        )


class EmbeddingBagCollectionSharder(_CollectionSharder):
    """Shards an `EmbeddingBagCollection` (TorchRec's name and arguments).

    Args:
        fused_params: the fused kernel's parameters, e.g.
            ``{"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}``; the
            planner counts that optimizer's state (default row-wise Adagrad). FBGEMM settings
            shardkit cannot honour (``cache_load_factor``...) are refused by name when sharding.
        qcomm_codecs_registry: codecs of the output dists (FP16/BF16 casts, forward and
            backward; see [Note: compressed collectives]); None sends float32.
        sharded_module_order_overwrite: None (see `BaseEmbeddingSharder`).
        shardable_params: names of the tables to shard (default: all).
    """

    unsharded = EmbeddingBagCollection
    sharded = ShardedEmbeddingBagCollection


class EmbeddingCollectionSharder(_CollectionSharder):
    """Shards an `EmbeddingCollection` (TorchRec's name and arguments; see
    `EmbeddingBagCollectionSharder`). ``use_index_dedup`` is TorchRec's deduplication of ids
    before the input dist, a speed knob: outputs are the same, and shardkit sends ids as they
    are."""

    unsharded = EmbeddingCollection
    sharded = ShardedEmbeddingCollection

    def __init__(
        self,
        fused_params: Mapping[str, Any] | None = None,
        qcomm_codecs_registry: Mapping[str, Any] | None = None,
        use_index_dedup: bool = False,
        *,
        shardable_params: Sequence[str] | None = None,
    ) -> None:
        super().__init__(fused_params, qcomm_codecs_registry, shardable_params=shardable_params)
        self.use_index_dedup = use_index_dedup
