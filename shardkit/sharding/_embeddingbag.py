"""`ShardedEmbeddingBagCollection`: an `EmbeddingBagCollection` whose tables are spread over ranks.

Forward = input dist (each rank's ids to the shards' ranks, [Note: input exchange]) -> local
lookup (one batched kernel per group of local shards, optimizer fused into backward) -> output
dist (pooled rows back to the bags' ranks, [Note: routes]). The contract is the unsharded
module's: the same KJT in (this rank's part of the global batch), the same KeyedTensor out.
"""

from __future__ import annotations

import torch

from shardkit.modules import EmbeddingBagConfig, lookup
from shardkit.sharding._collection import DistributedInput, ShardedCollection
from shardkit.sharding._output_dist import distribute
from shardkit.sharding._shard_groups import shard_group_input
from shardkit.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = ["ShardedEmbeddingBagCollection"]


class ShardedEmbeddingBagCollection(ShardedCollection):
    """An `EmbeddingBagCollection` sharded by ``plan`` over the ranks of ``env``.

    Args: see `ShardedCollection`; ``module`` is the `EmbeddingBagCollection` to shard.
    """

    _TABLES = "embedding_bags"

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return list(self._configs)  # type: ignore[arg-type]

    def is_weighted(self) -> bool:
        return self._is_weighted

    def compute_and_output_dist(self, dist_input: DistributedInput) -> KeyedTensor:
        """Look up the received ids, pool, and send the pooled rows home."""
        received = dist_input.pending.wait()
        batch_size = received.batch_size
        rows: dict[tuple, list[torch.Tensor]] = {}
        for shard_group in self._shard_groups:
            ids, offsets, weights = shard_group_input(shard_group, received)
            out = lookup(shard_group.tables, ids, offsets, weights, shard_group.params)
            rows.setdefault(shard_group.spec.output_class, []).append(out)
        units: dict[int, torch.Tensor] = {}
        for output_class in self._classes:
            units.update(
                distribute(
                    output_class,
                    rows.get(output_class, []),
                    self._specs,
                    rank=self._env.rank,
                    batch_size=batch_size,
                    group=self._env.pg,
                    hosts=self._hosts,
                )
            )
        return self._assemble(units, dist_input.features)

    def _local_rows(self, features: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        assert self._local is not None
        return self._local(self._local_features(features)).to_dict()

    def _assemble(self, units: dict[int, torch.Tensor], features) -> KeyedTensor:
        rows = self._feature_rows(features, lambda unit: units[unit.index])
        names = [f for c in self._configs for f in c.feature_names]
        dims = [c.embedding_dim for c in self._configs for _ in c.feature_names]
        return KeyedTensor(names, dims, torch.cat([rows[f] for f in names], dim=1))
