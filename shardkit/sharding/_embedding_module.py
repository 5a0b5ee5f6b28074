"""The interface of sharded embedding modules (TorchRec's ``ShardedEmbeddingModule``): the base
of the managed-collision and feature-processed sharded modules; shardkit's sharded collections
(`ShardedEmbeddingBagCollection`, `ShardedEmbeddingCollection`) are registered as such.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from shardkit.sharding._collection._base import ShardedCollection
from shardkit.types import ShardedModule

__all__ = ["FeatureShardingMixIn", "ModuleShardingMixIn", "ShardedEmbeddingModule"]


class FeatureShardingMixIn:
    """Sharding-aware feature metadata of one sharding."""

    def feature_names(self) -> list[str]:
        raise NotImplementedError

    def feature_names_per_rank(self) -> list[list[str]]:
        raise NotImplementedError

    def features_per_rank(self) -> list[int]:
        raise NotImplementedError


class ModuleShardingMixIn:
    """Access to a sharded module's shardings by sharding type."""

    @property
    def shardings(self) -> dict[str, FeatureShardingMixIn]:
        raise NotImplementedError


class ShardedEmbeddingModule(ShardedModule, ModuleShardingMixIn):
    """The interface of model-parallel embedding modules (see `ShardedModule`)."""

    def __init__(self, qcomm_codecs_registry: Mapping[str, Any] | None = None) -> None:
        super().__init__(qcomm_codecs_registry)
        self._input_dists: list[nn.Module] = []
        self._lookups: list[nn.Module] = []
        self._output_dists: list[nn.Module] = []


# shardkit's sharded collections are sharded embedding modules (``isinstance`` says so).
ShardedEmbeddingModule.register(ShardedCollection)
