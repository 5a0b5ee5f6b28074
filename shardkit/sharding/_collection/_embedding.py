"""`ShardedEmbeddingCollection`: an `EmbeddingCollection` whose tables are spread over ranks.

Input dist as for bags; each shard looks its ids up one by one (no pooling); the rows travel
back by all-to-all and are put back in the input's order (see `_dist._sequence`). The contract
is the unsharded module's: a dict of JaggedTensors, one per feature, with the KJT's lengths.
"""

from __future__ import annotations

import torch

from shardkit.modules import EmbeddingConfig, expand_bags, lookup
from shardkit.sharding._collection._base import DistributedInput, ShardedCollection
from shardkit.sharding._collection._shard_groups import shard_group_input
from shardkit.sharding._dist._sequence import distribute_rows
from shardkit.sharding._layout import Unit
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = ["ShardedEmbeddingCollection"]


class ShardedEmbeddingCollection(ShardedCollection):
    """An `EmbeddingCollection` sharded by ``plan`` over the ranks of ``env``.

    Args: see `ShardedCollection`; ``module`` is the `EmbeddingCollection` to shard.
    """

    _TABLES = "embeddings"
    _FUSED_REPLICAS = False
    _ACCEPTS_VARIABLE_BATCH = True

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return list(self._configs)  # type: ignore[arg-type]

    def compute_and_output_dist(self, dist_input: DistributedInput) -> dict[str, JaggedTensor]:
        """Look up every received id and send each row home."""
        pending = dist_input.pending
        received = pending.wait()
        rows: dict[tuple, list] = {}
        for shard_group in self._shard_groups:
            ids, _, _ = shard_group_input(shard_group, received)
            out = lookup(shard_group.tables, ids, None, None, shard_group.params)  # [N_g, cols]
            rows.setdefault(shard_group.spec.output_class, []).append((shard_group.spec, out))
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
                    device=self._device,
                    codecs=self._qcomm_codecs_registry,
                )
            )
        return self._assemble(blocks, dist_input)

    def _local_rows(self, features: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        assert self._local is not None
        local = self._local(self._local_features(features))
        return {feature: jt.values() for feature, jt in local.items()}

    def _unit_rows(self, unit: Unit, blocks, pending) -> torch.Tensor:
        pieces = [blocks[(unit.index, k)] for k in range(len(unit.shards))]
        rows = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        order = pending.orders.get(unit.index)
        if order is not None:  # undo the bucketing: row i of `rows` belongs to id order[i]
            rows = rows.index_select(0, torch.argsort(order))
        return rows

    def _assemble(self, blocks, dist_input: DistributedInput) -> dict[str, JaggedTensor]:
        """Each feature's rows as a JaggedTensor. A variable batch's sharded features came back
        as their deduplicated bags' rows and are expanded here by the inverse indices; its
        data-parallel ones were looked up from the expanded batch (see [Note: variable batch
        on the wire])."""
        pending = dist_input.pending
        full = dist_input.full
        rows = self._feature_rows(
            dist_input.features if full is None else full,
            lambda unit: self._unit_rows(unit, blocks, pending),
        )
        by_key = dist_input.features.to_dict()
        expanded = {} if full is None else full.to_dict()
        inverse = dist_input.inverse
        out = {}
        for index, feature in enumerate(self.feature_names()):
            if feature in expanded:
                out[feature] = JaggedTensor(rows[feature], lengths=expanded[feature].lengths())
                continue
            if inverse is None:
                out[feature] = JaggedTensor(rows[feature], lengths=by_key[feature].lengths())
                continue
            # the bags as sent: those no example uses were emptied ([Note: bags no example uses])
            assert dist_input.source is not None
            sent = dist_input.source.lengths_per_feature[index]
            out[feature] = expand_bags(JaggedTensor(rows[feature], lengths=sent), inverse[index])
        return out
