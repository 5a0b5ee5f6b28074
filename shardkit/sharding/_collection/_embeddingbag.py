"""`ShardedEmbeddingBagCollection`: an `EmbeddingBagCollection` whose tables are spread over ranks.

Forward = input dist (each rank's ids to the shards' ranks, [Note: input exchange]) -> local
lookup (one batched kernel per group of local shards, optimizer fused into backward) -> output
dist (pooled rows back to the bags' ranks, [Note: routes]). The contract is the unsharded
module's: the same KJT in (this rank's part of the global batch), the same KeyedTensor out.
"""

from __future__ import annotations

import torch

from shardkit.modules import EmbeddingBagConfig, lookup
from shardkit.sharding._collection._base import DistributedInput, ShardedCollection
from shardkit.sharding._collection._replicas import replica_lookup
from shardkit.sharding._collection._shard_groups import shard_group_input
from shardkit.sharding._dist._assemble import Block, assemble
from shardkit.sharding._dist._output import distribute
from shardkit.sharding._layout import Route
from shardkit.sparse import KeyedTensor

__all__ = ["ShardedEmbeddingBagCollection"]


class ShardedEmbeddingBagCollection(ShardedCollection):
    """An `EmbeddingBagCollection` sharded by ``plan`` over the ranks of ``env``.

    Args: see `ShardedCollection`; ``module`` is the `EmbeddingBagCollection` to shard.
    """

    _TABLES = "embedding_bags"
    _ACCEPTS_VARIABLE_BATCH = True

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
        sources: list[torch.Tensor] = []
        first_rows = {}
        for output_class in self._classes:
            got, first = distribute(
                output_class,
                rows.get(output_class, []),
                self._specs,
                rank=self._env.rank,
                batch_size=batch_size,
                group=self._env.pg,
                hosts=self._hosts,
                device=self._device,
                codecs=self._qcomm_codecs_registry,
                feature_rows=received.feature_rows,
            )
            if received.feature_rows is not None or dist_input.inverse is not None:
                got, first = self._expanded(got, first, dist_input.inverse, batch_size)
            first_rows.update({unit: (len(sources), row) for unit, row in first.items()})
            sources.append(got)
        scales = [self._gradient_scale] * len(sources)
        local_cols: dict[str, tuple[int, int]] = {}  # data-parallel feature: (source, column)
        if self._local is not None:  # a variable batch's features expanded: see _collection
            full = dist_input.features if dist_input.full is None else dist_input.full
            local = self._local(self._local_features(full))  # KeyedTensor
            local_cols = {
                k: (len(sources), c) for k, c in zip(local.keys(), local.offset_per_key())
            }
            sources.append(local.values())  # [B, D_local]
            scales.append(1.0)
        for group in self._replica_groups:  # See [Note: sparse data-parallel tables]
            dim = group.tables.dim
            for k, feature in enumerate(group.features):
                local_cols[self._feature_names[feature]] = (len(sources), k * dim)
            sources.append(self._replica_rows(group, dist_input, batch_size))  # [B, K * D]
            scales.append(1.0 / self._env.world_size)  # DDP's average, as DENSE replicas
        blocks = self._blocks(first_rows, local_cols)
        values = assemble(sources, scales, blocks, batch_size=batch_size, width=self._width)
        return KeyedTensor(self._feature_names, self._feature_dims, values)

    def _expanded(
        self, got: torch.Tensor, first: dict[int, int], inverse: torch.Tensor | None, size: int
    ) -> tuple[torch.Tensor, dict[int, int]]:
        """A variable batch's pooled rows ``got`` (unit ``u``'s deduplicated bags from row
        ``first[u]``) expanded to ``[B]`` rows per unit by the inverse indices (``[F, B]``;
        None: each example its own bag). One gather per output class; its gradient sums the
        rows' gradients into their bag (index_add). See [Note: variable batch on the wire]."""
        if not first:
            return got, first
        units = sorted(first, key=first.__getitem__)
        own = torch.arange(size, device=got.device)
        index = torch.cat(
            [
                first[u]
                + (own if inverse is None else inverse[self._layout.units[u].feature_index])
                for u in units
            ]
        )
        return got.index_select(0, index), {u: k * size for k, u in enumerate(units)}

    def _replica_rows(self, group, dist_input: DistributedInput, batch_size: int) -> torch.Tensor:
        source = dist_input.source
        assert source is not None
        weights = source.weights_per_feature
        return replica_lookup(
            group,
            [source.lengths_per_feature[f] for f in group.features],
            [source.values_per_feature[f] for f in group.features],
            None if weights is None else [weights[f] for f in group.features],
            batch_size=batch_size,
            process_group=self._env.pg,
        )

    def _blocks(self, first_rows, local_cols: dict[str, tuple[int, int]]) -> list[Block]:
        """Where each unit's ``[B, cols]`` comes from and goes to (see [Note: one-pass assembly])."""
        out_cols = dict(zip(self._feature_names, self._feature_offsets))
        blocks = []
        for unit in self._layout.units:
            out_col = out_cols[unit.feature] + unit.col_start
            if unit.route == Route.LOCAL:
                source, col = local_cols[unit.feature]
                blocks.append(Block(source, 0, col + unit.col_start, unit.cols, out_col))
            else:
                source, row = first_rows[unit.index]
                blocks.append(Block(source, row, 0, unit.cols, out_col))
        return blocks

    @property
    def _feature_names(self) -> list[str]:
        return [f for c in self._configs for f in c.feature_names]

    @property
    def _feature_dims(self) -> list[int]:
        return [c.embedding_dim for c in self._configs for _ in c.feature_names]

    @property
    def _feature_offsets(self) -> list[int]:
        return [sum(self._feature_dims[:k]) for k in range(len(self._feature_dims))]

    @property
    def _width(self) -> int:
        return sum(self._feature_dims)
