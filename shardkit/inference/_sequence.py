"""Quantized sequence tables served across ranks: `ShardedQuantEmbeddingCollection` (TorchRec's
``ShardedQuantEmbeddingCollection``), table-wise.

[Note: sharded quantized sequence serving]
As [Note: sharded quantized serving], but one row per id instead of one per bag. Per batch,
every rank holding its own requests (batch ``B_r`` on rank ``r``):

1. all-gather of the batch sizes (and of a refusal, so that every rank raises alike);
2. all-to-all of each feature's lengths, then of its ids, to the feature's table's rank;
3. each rank looks up ALL ranks' ids of its features in one call of its local quantized
   collection, feature by feature with the sources' ids in rank order, so the rows of source
   ``s`` for feature ``f`` are one contiguous block ``[n_{s,f}, D_f]``;
4. all-to-all of the rows back (in the module's output dtype), rank ``r`` receiving from each
   owner its features' blocks in feature order, which it cuts by its own lengths.

The result equals the unsharded quantized module's (the same stored bytes and operators). No
gradients: serving only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit.inference._requests import agreed_batches
from shardkit.inference._sharded import _check_placement, _exchange, table_wise_placement
from shardkit.quant import EmbeddingCollection as QuantEmbeddingCollection
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = ["ShardedQuantEmbeddingCollection"]

logger = logging.getLogger(__name__)


class ShardedQuantEmbeddingCollection(nn.Module):
    """A quantized `EmbeddingCollection` whose tables are spread over the ranks of ``group``,
    one table per rank (table-wise); see [Note: sharded quantized sequence serving].

    Args:
        module: the unsharded quantized collection (each rank keeps only its tables' rows).
        placement: ``{table: rank}`` (default: `table_wise_placement`, largest tables first).
        group: the ranks (default: the world).
    """

    def __init__(
        self,
        module: QuantEmbeddingCollection,
        placement: Mapping[str, int] | None = None,
        group: dist.ProcessGroup | None = None,
    ) -> None:
        super().__init__()
        self._group = group
        self._world = dist.get_world_size(group)
        self._rank = dist.get_rank(group)
        configs = list(module.embedding_configs())
        placement = dict(placement or table_wise_placement(configs, self._world))
        _check_placement(configs, placement, self._world)
        self._placement = placement
        self._features = [f for c in configs for f in c.feature_names]
        self._dims = {f: c.embedding_dim for c in configs for f in c.feature_names}
        self._rows = {f: c.num_embeddings for c in configs for f in c.feature_names}
        owner = {f: placement[c.name] for c in configs for f in c.feature_names}
        self._features_of = [[f for f in self._features if owner[f] == r]
                             for r in range(self._world)]  # fmt: skip
        self._out_dtype = module.output_dtype()
        mine = [c for c in configs if placement[c.name] == self._rank]
        self._local = _subset(module, mine) if mine else None
        logger.info(
            "rank %d serves quantized sequence tables %s", self._rank, [c.name for c in mine]
        )

    def embedding_configs(self) -> list[Any]:
        """This rank's tables."""
        return [] if self._local is None else self._local.embedding_configs()

    def need_indices(self) -> bool:
        return False  # refused by the quantized collection (floats, not ids, as weights)

    @torch.no_grad()
    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        """``features``: this rank's requests, batch ``B``. Returns ``{feature:
        JaggedTensor(values=[n_f, D_f], lengths=[B])}`` in the unsharded module's order."""
        by_key = dict(features.to_dict())
        batches = agreed_batches(features, by_key, self._rows, group=self._group,
                                 what="sharded quantized sequence tables")  # fmt: skip
        lengths, ids, counts = self._send_ids(by_key, batches)
        rows = self._lookup(lengths, ids)
        return self._send_rows(rows, counts, by_key)

    def _send_ids(self, by_key, batches: list[int]):
        """All sources' bags of this rank's features, sources in rank order: ``(lengths[f]
        [sum_s B_s], ids[f] [sum_s n_{s,f}], counts[f][s] = n_{s,f})``."""
        batch = batches[self._rank]
        sent_lengths, sent_ids = [], []
        for dest in range(self._world):
            for f in self._features_of[dest]:
                sent_lengths.append(by_key[f].lengths().to(torch.int64))
                sent_ids.append(by_key[f].values().to(torch.int64))
        mine = self._features_of[self._rank]
        splits = [len(self._features_of[d]) * batch for d in range(self._world)]
        got = _exchange(torch.cat(sent_lengths), splits, [len(mine) * b for b in batches],
                        self._group).split([len(mine) * b for b in batches])  # fmt: skip
        per_dest, at = [], 0
        for dest in range(self._world):
            n = len(self._features_of[dest])
            per_dest.append(int(sum(int(x.sum()) for x in sent_lengths[at : at + n])))
            at += n
        got_counts = _exchange(torch.tensor(per_dest), None, None, self._group).tolist()
        ids = _exchange(torch.cat(sent_ids), per_dest, got_counts, self._group)
        # per source s: [len(mine), B_s] lengths, then its ids feature by feature
        source_lengths = [g.view(len(mine), b) for g, b in zip(got, batches)]
        source_ids = ids.split(got_counts)
        lengths: dict[str, torch.Tensor] = {}
        values: dict[str, list[torch.Tensor]] = {}
        counts: dict[str, list[int]] = {}
        for i, f in enumerate(mine):
            lengths[f] = torch.cat([sl[i] for sl in source_lengths])
            counts[f] = [int(sl[i].sum()) for sl in source_lengths]
        for s, sl in enumerate(source_lengths):
            for i, piece in enumerate(source_ids[s].split(sl.sum(1).tolist())):
                values.setdefault(mine[i], []).append(piece)
        ids_of = {f: torch.cat(values[f]) if values.get(f) else
                  torch.empty(0, dtype=torch.int64) for f in mine}  # fmt: skip
        return lengths, ids_of, counts

    def _lookup(self, lengths, ids) -> dict[str, torch.Tensor]:
        """``{feature: [sum_s n_{s,f}, D_f]}`` rows of this rank's features, sources in order."""
        mine = self._features_of[self._rank]
        if self._local is None or not mine:
            return {}
        kjt = KeyedJaggedTensor(
            keys=mine,
            values=torch.cat([ids[f] for f in mine]),
            lengths=torch.cat([lengths[f] for f in mine]),
        )
        out = self._local(kjt)
        return {f: out[f].values() for f in mine}

    def _send_rows(self, rows, counts, by_key) -> dict[str, JaggedTensor]:
        mine = self._features_of[self._rank]
        blocks = []
        for s in range(self._world):
            for f in mine:
                start = sum(counts[f][:s])
                blocks.append(rows[f][start : start + counts[f][s]].reshape(-1))
        send = [sum(counts[f][s] * self._dims[f] for f in mine) for s in range(self._world)]
        own = {f: int(by_key[f].lengths().sum()) for f in self._features}
        receive = [sum(own[f] * self._dims[f] for f in self._features_of[r])
                   for r in range(self._world)]  # fmt: skip
        flat = torch.cat(blocks) if blocks else torch.empty(0, dtype=self._out_dtype)
        got = _exchange(flat.to(self._out_dtype), send, receive, self._group)
        out, at = {}, 0
        for r in range(self._world):
            for f in self._features_of[r]:
                size = own[f] * self._dims[f]
                values = got[at : at + size].view(own[f], self._dims[f])
                at += size
                out[f] = JaggedTensor(values=values, lengths=by_key[f].lengths())
        return {f: out[f] for f in self._features}


def _subset(module: QuantEmbeddingCollection, configs: list[Any]) -> QuantEmbeddingCollection:
    """The tables ``configs`` of ``module``, with their stored rows."""
    local = QuantEmbeddingCollection(
        configs, device="cpu", output_dtype=module.output_dtype(),
    )  # fmt: skip
    names = {c.name for c in configs}
    state = module.state_dict()
    local.load_state_dict({k: v for k, v in state.items() if k.split(".")[1] in names})
    return local
