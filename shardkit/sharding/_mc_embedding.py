"""Managed-collision embedding collections sharded row-wise or table-wise, and their sharders
(TorchRec's ``ShardedManagedCollisionEmbeddingBagCollection``, ``...EmbeddingCollection`` and
``ManagedCollisionEmbeddingBagCollectionSharder``, ``...EmbeddingCollectionSharder``).

Forward: the raw ids go to the ranks of their buckets and come back as rows (see
[Note: sharded managed collision]); the rows then go through the sharded collection as any
input does. The state dict has the unsharded module's keys: the tables as ShardedTensors over
rows, the remappers' ``_mch_*`` buffers as ShardedTensors over slots laid out like the rows, so
``shardkit.checkpoint`` saves them together and reshards them together.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from shardkit.modules import EmbeddingBagCollection, EmbeddingCollection
from shardkit.modules.mc_embedding_modules import (
    ManagedCollisionEmbeddingBagCollection,
    ManagedCollisionEmbeddingCollection,
)
from shardkit.sharding._collection._base import ShardedCollection
from shardkit.sharding._collection._embedding import ShardedEmbeddingCollection
from shardkit.sharding._collection._embeddingbag import ShardedEmbeddingBagCollection
from shardkit.sharding._collection._fused_optimizer import ShardedFusedOptimizer
from shardkit.sharding._collection._state import reset_rows
from shardkit.sharding._embedding_module import ShardedEmbeddingModule
from shardkit.sharding._embedding_sharders import _CollectionSharder
from shardkit.sharding._mc_collection import ShardedManagedCollisionCollection
from shardkit.sharding._mc_plan import aligned_plan, rebucketed
from shardkit.sparse import KeyedJaggedTensor
from shardkit.types import BaseEmbeddingSharder, ParameterSharding, ShardingEnv, ShardingType

__all__ = [
    "ManagedCollisionEmbeddingBagCollectionSharder",
    "ManagedCollisionEmbeddingCollectionSharder",
    "ShardedManagedCollisionEmbeddingBagCollection",
    "ShardedManagedCollisionEmbeddingCollection",
]


class _ShardedMc(nn.Module):
    """A managed-collision collection sharded by ``plan`` (row-wise or table-wise tables).

    Args: as `ShardedCollection`; ``module`` is the unsharded managed-collision collection.
    """

    sharded: type[ShardedCollection]

    def __init__(
        self,
        module: Any,
        plan: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        device = torch.device(device) if device is not None else torch.device("cpu")
        mcc = module._managed_collision_collection
        remappers = dict(mcc._managed_collision_modules.items())
        remappers = rebucketed(remappers, plan, env.world_size)  # 1 bucket: 1 per rank
        plan = aligned_plan(remappers, plan, env.world_size)
        self._managed_collision_collection = ShardedManagedCollisionCollection(
            mcc, plan, env, device, remappers=remappers
        )
        self._embedding_module = self.sharded(module._embedding_module, plan, env, device, **kwargs)
        self._return_remapped_features = module._return_remapped_features
        self._configs = {c.name: c for c in mcc.embedding_configs()}

    @property
    def fused_optimizer(self) -> ShardedFusedOptimizer | None:
        return self._embedding_module.fused_optimizer

    def forward(self, features: KeyedJaggedTensor) -> tuple[Any, KeyedJaggedTensor | None]:
        """``features``: raw ids. Returns (the sharded collection's output, the remapped KJT
        if ``return_remapped_features`` else None), as the unsharded module does."""
        remapped = self._managed_collision_collection(features, self._reset)
        embeddings = self._embedding_module(remapped)
        return embeddings, (remapped if self._return_remapped_features else None)

    @torch.no_grad()
    def _reset(self, table: str, rows: torch.Tensor) -> None:
        reset_rows(self._embedding_module, self._configs[table], rows)


# A sharded module (TorchRec's are): the train pipelines prefetch into none of the collections
# inside it, which see remapped ids (see [Note: pipelined input dist]).
ShardedEmbeddingModule.register(_ShardedMc)


class ShardedManagedCollisionEmbeddingBagCollection(_ShardedMc):
    """A `ManagedCollisionEmbeddingBagCollection` sharded row-wise or table-wise."""

    sharded = ShardedEmbeddingBagCollection

    @property
    def _embedding_bag_collection(self) -> ShardedEmbeddingBagCollection:
        return self._embedding_module  # type: ignore[return-value]


class ShardedManagedCollisionEmbeddingCollection(_ShardedMc):
    """A `ManagedCollisionEmbeddingCollection` sharded row-wise or table-wise."""

    sharded = ShardedEmbeddingCollection

    @property
    def _embedding_collection(self) -> ShardedEmbeddingCollection:
        return self._embedding_module  # type: ignore[return-value]


class _McSharder(_CollectionSharder):
    """Shards a managed-collision collection: its tables as the inner collection's sharder
    would, row-wise or table-wise only (see [Note: sharded managed collision])."""

    inner: type[nn.Module]
    sharded: type[_ShardedMc]

    def __init__(
        self,
        e_sharder: BaseEmbeddingSharder | None = None,
        mc_sharder: object | None = None,
        qcomm_codecs_registry: object | None = None,
    ) -> None:
        if qcomm_codecs_registry is not None:
            raise ValueError(
                f"{type(self).__name__}(qcomm_codecs_registry=...): compressed communication is "
                "not supported for managed-collision tables; leave it None"
            )
        if e_sharder is None:
            super().__init__()
        else:
            super().__init__(e_sharder.fused_params, shardable_params=e_sharder._shardable_params)

    def sharding_types(self, compute_device_type: str) -> list[ShardingType]:
        return [ShardingType.TABLE_WISE, ShardingType.ROW_WISE]

    def shardable_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:
        return super().shardable_parameters(module._embedding_module)  # type: ignore[arg-type]

    def table_configs(self, module: nn.Module) -> list[Any]:
        return super().table_configs(module._embedding_module)  # type: ignore[arg-type]


class ManagedCollisionEmbeddingBagCollectionSharder(_McSharder):
    """Shards a `ManagedCollisionEmbeddingBagCollection` (TorchRec's name; ``fused_params`` and
    ``shardable_params`` as `EmbeddingBagCollectionSharder`)."""

    unsharded = ManagedCollisionEmbeddingBagCollection
    inner = EmbeddingBagCollection
    sharded = ShardedManagedCollisionEmbeddingBagCollection


class ManagedCollisionEmbeddingCollectionSharder(_McSharder):
    """Shards a `ManagedCollisionEmbeddingCollection` (TorchRec's name; arguments as
    `EmbeddingCollectionSharder`)."""

    unsharded = ManagedCollisionEmbeddingCollection
    inner = EmbeddingCollection
    sharded = ShardedManagedCollisionEmbeddingCollection
