"""`ShardedEmbeddingCollection`: an `EmbeddingCollection` whose tables are spread over ranks.

Input dist as for bags; each shard looks its ids up one by one (no pooling); the rows travel
back by all-to-all and are put back in the input's order (see `_sequence_dist`). The contract
is the unsharded module's: a dict of JaggedTensors, one per feature, with the KJT's lengths.
"""

from __future__ import annotations

import torch

from shardkit.modules import EmbeddingConfig, lookup
from shardkit.sharding._collection import DistributedInput, ShardedCollection
from shardkit.sharding._grad import scale_grad
from shardkit.sharding._groups import group_input
from shardkit.sharding._layout import Route, Unit
from shardkit.sharding._sequence_dist import distribute_rows
from shardkit.sparse import JaggedTensor

__all__ = ["ShardedEmbeddingCollection"]


class ShardedEmbeddingCollection(ShardedCollection):
    """An `EmbeddingCollection` sharded by ``plan`` over the ranks of ``env``.

    Args: see `ShardedCollection`; ``module`` is the `EmbeddingCollection` to shard.
    """

    _TABLES = "embeddings"

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return list(self._configs)  # type: ignore[arg-type]

    def compute_and_output_dist(self, dist_input: DistributedInput) -> dict[str, JaggedTensor]:
        """Look up every received id and send each row home."""
        pending = dist_input.pending
        received = pending.wait()
        rows: dict[tuple, list] = {}
        for group in self._groups:
            ids, _, _ = group_input(group, received)
            out = lookup(group.tables, ids, None, None, group.params)  # [N_g, cols]
            rows.setdefault(group.spec.output_class, []).append((group.spec, out))
        blocks: dict[tuple[int, int], torch.Tensor] = {}
        for output_class in self._classes:
            blocks.update(
                distribute_rows(
                    output_class,
                    rows.get(output_class, []),
                    self._specs,
                    received,
                    pending,
                    self._layout,
                    rank=self._env.rank,
                    group=self._env.pg,
                )
            )
        return self._assemble(blocks, dist_input)

    def _unit_rows(self, unit: Unit, blocks, pending) -> torch.Tensor:
        pieces = [blocks[(unit.index, k)] for k in range(len(unit.shards))]
        rows = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        order = pending.orders.get(unit.index)
        if order is not None:  # undo the bucketing: row i of `rows` belongs to id order[i]
            rows = rows.index_select(0, torch.argsort(order))
        return scale_grad(rows, self._gradient_scale)

    def _assemble(self, blocks, dist_input: DistributedInput) -> dict[str, JaggedTensor]:
        features = dist_input.features
        local = None
        if self._local is not None:
            local = self._local(self._local_features(features))
        per_feature: dict[str, list[tuple[int, torch.Tensor]]] = {}
        for unit in self._layout.units:
            if unit.route == Route.LOCAL:
                assert local is not None
                rows = local[unit.feature].values()
            else:
                rows = self._unit_rows(unit, blocks, dist_input.pending)
            per_feature.setdefault(unit.feature, []).append((unit.col_start, rows))
        by_key = features.to_dict()
        out = {}
        for config in self._configs:
            for feature in config.feature_names:
                parts = [t for _, t in sorted(per_feature[feature], key=lambda b: b[0])]
                values = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
                out[feature] = JaggedTensor(values=values, lengths=by_key[feature].lengths())
        return out
