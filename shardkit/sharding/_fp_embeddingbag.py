"""`ShardedFeatureProcessedEmbeddingBagCollection` and its sharder (TorchRec's
``torchrec.distributed.fp_embeddingbag``): feature processors (position weights) in front of a
sharded weighted `EmbeddingBagCollection`.

The processors run where the bags are whole: on each rank, over its own batch, before the
input dist; the per-id weights they give travel with the ids (the weighted input dist) and
their gradients come back by the adjoint all-to-all. So every sharding type works, row-wise
too, with no special case (a row-wise shard sees bags cut into pieces, but their weights were
computed from the whole bags). The position weights are dense parameters,
replicated: `DistributedModelParallel`'s data-parallel wrapper averages their gradients.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from shardkit import comm
from shardkit.modules.fp_embedding_modules import (
    FeatureProcessedEmbeddingBagCollection,
    apply_feature_processors_to_kjt,
)
from shardkit.sharding._collection._embeddingbag import ShardedEmbeddingBagCollection
from shardkit.sharding._collection._fused_optimizer import ShardedFusedOptimizer
from shardkit.sharding._dist._input import InputError
from shardkit.sharding._embedding_module import ShardedEmbeddingModule
from shardkit.sparse import KeyedJaggedTensor, KeyedTensor
from shardkit.types import BaseEmbeddingSharder, ParameterSharding, ShardingEnv

__all__ = [
    "FeatureProcessedEmbeddingBagCollectionSharder",
    "ShardedFeatureProcessedEmbeddingBagCollection",
]


class ShardedFeatureProcessedEmbeddingBagCollection(nn.Module):
    """A `FeatureProcessedEmbeddingBagCollection` whose tables are sharded by ``plan`` (any
    sharding type); its processors replicated on every rank.

    Args: as `ShardedEmbeddingBagCollection`; ``module`` is the unsharded
    `FeatureProcessedEmbeddingBagCollection` (its processors' weights are copied).
    """

    def __init__(
        self,
        module: FeatureProcessedEmbeddingBagCollection,
        plan: Mapping[str, ParameterSharding],
        env: ShardingEnv,
        device: torch.device | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        device = torch.device(device) if device is not None else torch.device("cpu")
        self._env = env
        self._feature_processors = module._feature_processors.to(device)
        self._feature_names = list(module._feature_names)
        self._embedding_bag_collection = ShardedEmbeddingBagCollection(
            module._embedding_bag_collection, plan, env, device, **kwargs
        )

    @property
    def fused_optimizer(self) -> ShardedFusedOptimizer | None:
        return self._embedding_bag_collection.fused_optimizer

    def is_weighted(self) -> bool:
        return True

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """``features``: this rank's ids (batch ``B``). Returns ``[B, sum(dims)]``, as the
        unsharded module does on this rank's examples."""
        try:
            processed, error = self._process(features), None
        except ValueError as refused:  # e.g. a bag longer than max_feature_length
            processed, error = features, refused
        failed = torch.zeros(self._env.world_size)
        failed[self._env.rank] = float(error is not None)
        agreed = comm.all_reduce(failed, group=self._env.pg)  # the ranks agree first
        assert isinstance(agreed, torch.Tensor)
        failed = agreed
        if error is not None:
            raise InputError(f"rank {self._env.rank}: {error}") from error
        if bool(failed.any()):
            ranks = failed.nonzero().squeeze(1).tolist()
            raise InputError(
                f"rank(s) {ranks} refused their input to a feature-processed collection (their "
                "error names the problem); every rank stops"
            )
        return self._embedding_bag_collection(self._undivided(processed))

    def _undivided(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The weights' gradient un-divided for sharded tables. The sharded collection divides
        its outputs' gradients by the world size (for its tables, see `ShardedCollection`);
        the position weights are replicated dense parameters whose gradients the data-parallel
        wrapper averages, so they must get this rank's gradient itself (data-parallel tables
        are not divided: nothing to undo)."""
        collection = self._embedding_bag_collection
        factor = 1.0 / collection._gradient_scale
        weights = features.weights_or_none()
        if factor == 1.0 or weights is None or not weights.requires_grad:
            return features
        replicated = set(collection._local_or_replicated())
        local = {f for c in collection._configs if c.name in replicated
                 for f in c.feature_names}  # fmt: skip
        keys: list[str] = features.keys()
        per_key = [1.0 if key in local else factor for key in keys]
        scale = torch.repeat_interleave(
            torch.tensor(per_key, dtype=weights.dtype, device=weights.device),
            torch.tensor(features.length_per_key(), device=weights.device),
        )  # [N]
        weights = weights + (weights - weights.detach()) * (scale - 1)  # same value, grad * scale
        variable = features.variable_stride_per_key()  # a VBE batch stays one
        return KeyedJaggedTensor(
            keys=features.keys(),
            values=features.values(),
            weights=weights,
            lengths=features.lengths(),
            stride=None if variable else features.stride(),
            stride_per_key_per_rank=features.stride_per_key_per_rank() if variable else None,
            inverse_indices=features.inverse_indices_or_none(),
            length_per_key=features.length_per_key(),
        )

    def _process(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        processors = self._feature_processors
        if not isinstance(processors, nn.ModuleDict):
            return processors(features)
        keys = features.keys()
        if any(f not in keys for f in self._feature_names):
            return features  # the input dist refuses it on every rank, naming the keys
        order = [keys.index(f) for f in self._feature_names]
        return apply_feature_processors_to_kjt(features.permute(order), processors)


# A sharded module (TorchRec's is): the train pipelines prefetch into none of the collections
# inside it, which see processed features (see [Note: pipelined input dist]).
ShardedEmbeddingModule.register(ShardedFeatureProcessedEmbeddingBagCollection)


class FeatureProcessedEmbeddingBagCollectionSharder(BaseEmbeddingSharder):
    """Shards a `FeatureProcessedEmbeddingBagCollection` (TorchRec's name and arguments): every
    sharding type, row-wise included.

    Args:
        ebc_sharder: an `EmbeddingBagCollectionSharder` whose ``fused_params`` and
            ``shardable_params`` to use (default: none).
    """

    def __init__(self, ebc_sharder: BaseEmbeddingSharder | None = None, **kwargs: Any) -> None:
        if ebc_sharder is not None:
            kwargs.setdefault("fused_params", ebc_sharder.fused_params)
            kwargs.setdefault("shardable_params", ebc_sharder._shardable_params)
        super().__init__(**kwargs)

    @property
    def module_type(self) -> type[nn.Module]:
        return FeatureProcessedEmbeddingBagCollection

    def shardable_parameters(self, module: nn.Module) -> dict[str, nn.Parameter]:
        return super().shardable_parameters(module._embedding_bag_collection)  # type: ignore[arg-type]

    def table_configs(self, module: nn.Module) -> list[Any]:
        return super().table_configs(module._embedding_bag_collection)  # type: ignore[arg-type]

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
        return ShardedFeatureProcessedEmbeddingBagCollection(
            module,  # type: ignore[arg-type]
            params,
            env,
            device,
            fused_params=self.fused_params,
            local_world_size=local_world_size,
            gradient_division=gradient_division,
            qcomm_codecs_registry=self.qcomm_codecs_registry,
        )
