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
from shardkit.sharding._grad import scale_grad
from shardkit.sharding._groups import group_input
from shardkit.sharding._layout import Route
from shardkit.sharding._output_dist import distribute
from shardkit.sparse import KeyedTensor

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
        for group in self._groups:
            ids, offsets, weights = group_input(group, received)
            out = lookup(group.tables, ids, offsets, weights, group.params)
            rows.setdefault(group.spec.output_class, []).append(out)
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

    def _assemble(self, units: dict[int, torch.Tensor], features) -> KeyedTensor:
        local = None
        if self._local is not None:
            local = self._local(self._local_features(features)).to_dict()
        per_feature: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for unit in self._layout.units:
            if unit.route == Route.LOCAL:
                assert local is not None
                out = local[unit.feature]
            else:
                out = scale_grad(units[unit.index], self._gradient_scale)
            per_feature.setdefault(unit.feature, []).append((unit.col_start, out))
        names, dims, values = [], [], []
        for config in self._configs:
            for feature in config.feature_names:
                blocks = [t for _, t in sorted(per_feature[feature], key=lambda b: b[0])]
                values.append(blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=1))
                names.append(feature)
                dims.append(config.embedding_dim)
        return KeyedTensor(names, dims, torch.cat(values, dim=1))
