"""Quantized tables served across ranks: `ShardedQuantEmbeddingBagCollection` and
`shard_quant_model` (TorchRec's ``torchrec.inference.modules.shard_quant_model``), table-wise
and row-wise.

[Note: sharded quantized serving]
Each table of a quantized `EmbeddingBagCollection` lives on one rank (table-wise; the tables are
dealt to the ranks by size, largest first, onto the rank with the fewest bytes). Per batch, with
every rank holding its own requests (batch ``B_r`` on rank ``r``):

1. all-gather of the batch sizes;
2. all-to-all of each feature's lengths, then of its ids (and per-id weights), to the feature's
   table's rank;
3. each rank looks up ALL ranks' bags of its tables in one call of its local quantized
   collection (bags of rank 0 first): ``[sum_r B_r, D_local]``;
4. all-to-all of the pooled rows back, in the module's output dtype ([Note: pooled rows on
   the wire]): rank ``r`` gets ``[B_r, D_local]`` from each rank and puts the columns in the
   unsharded module's feature order.

The result equals the unsharded quantized module's on the same bags (the same stored bytes and
the same operators). No gradients: serving only. A table too large for one rank is served
row-wise through the same steps ([Note: row-wise quantized serving]).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from shardkit import comm
from shardkit.inference._pooled import PooledGroup, pooled_groups
from shardkit.inference._requests import agreed_batches
from shardkit.inference._row_wise import (
    block_state,
    bucketize,
    combine,
    place_by_budget,
    split_tables,
)
from shardkit.quant import EmbeddingBagCollection as QuantEmbeddingBagCollection
from shardkit.sparse import KeyedJaggedTensor, KeyedTensor

__all__ = ["ShardedQuantEmbeddingBagCollection", "shard_quant_model", "table_wise_placement"]

logger = logging.getLogger(__name__)


def table_wise_placement(configs: Sequence[Any], world_size: int) -> dict[str, int]:
    """``{table: rank}``: largest tables first, each onto the rank with the fewest rows x dims."""
    load = [0] * world_size
    placement = {}
    for config in sorted(configs, key=lambda c: -c.num_embeddings * c.embedding_dim):
        rank = load.index(min(load))
        placement[config.name] = rank
        load[rank] += config.num_embeddings * config.embedding_dim
    return placement


class ShardedQuantEmbeddingBagCollection(nn.Module):
    """A quantized `EmbeddingBagCollection` whose tables are spread over the ranks of
    ``group``, table-wise or row-wise; see [Note: sharded quantized serving].

    Args:
        module: the unsharded quantized collection (each rank keeps only its tables' rows).
        placement: ``{table: rank}`` of the table-wise tables (default: `table_wise_placement`,
            or by bytes with ``budget_bytes``).
        group: the ranks (default: the world).
        row_wise: tables cut into one block of rows per rank ([Note: row-wise quantized
            serving]).
        budget_bytes: with neither ``placement`` nor ``row_wise``: one rank's share of stored
            bytes; a table over it goes row-wise, the others are dealt table-wise by bytes.
    """

    def __init__(
        self,
        module: QuantEmbeddingBagCollection,
        placement: Mapping[str, int] | None = None,
        group: dist.ProcessGroup | None = None,
        *,
        row_wise: Sequence[str] = (),
        budget_bytes: int | None = None,
    ) -> None:
        super().__init__()
        self._group = group
        self._world = dist.get_world_size(group)
        self._rank = dist.get_rank(group)
        configs = list(module.embedding_bag_configs())
        placement, row_wise = _placement(module, configs, placement, row_wise, budget_bytes,
                                         self._world)  # fmt: skip
        self._placement, self._row_wise = placement, list(row_wise)
        self._out_features = [f for c in configs for f in c.feature_names]
        self._out_dims = [c.embedding_dim for c in configs for _ in c.feature_names]
        self._rows = {f: c.num_embeddings for c in configs for f in c.feature_names}
        self._out_dtype = module.output_dtype()
        configs, self._blocks = split_tables(configs, row_wise, self._world)
        placement = {**placement, **{b.part(t, r): r for t, b in self._blocks.items()
                                     for r in range(self._world)}}  # fmt: skip
        self._is_weighted = module.is_weighted()
        self._features = [f for c in configs for f in c.feature_names]
        self._dims = [c.embedding_dim for c in configs for _ in c.feature_names]
        self._owner = {f: placement[c.name] for c in configs for f in c.feature_names}
        self._features_of = [[f for f in self._features if self._owner[f] == r] for r in
                             range(self._world)]  # fmt: skip
        mine = [c for c in configs if placement[c.name] == self._rank]
        self._groups = pooled_groups(
            configs,
            placement=placement,
            partial={b.part(t, r) for t, b in self._blocks.items() for r in range(self._world)},
            output_dtype=self._out_dtype,
            state=block_state(module.state_dict(), self._blocks, self._rank),
            weighted=self._is_weighted,
            rank=self._rank,
            world=self._world,
        )
        # Registered, so state_dict, buffers and .to() see this rank's tables
        self._local = nn.ModuleList([g.local for g in self._groups if g.local is not None])
        served = {c.name: c for g in self._groups if g.local is not None
                  for c in g.local.embedding_bag_configs()}  # fmt: skip
        self._local_configs = [served[c.name] for c in mine]  # in table order
        logger.info("rank %d serves quantized tables %s", self._rank, [c.name for c in mine])

    @property
    def row_wise_tables(self) -> list[str]:
        """The tables served row-wise (a block of rows on every rank)."""
        return list(self._row_wise)

    def embedding_bag_configs(self) -> list[Any]:
        return list(self._local_configs)

    @torch.no_grad()
    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """``features``: this rank's requests, batch ``B``. Returns ``[B, sum(dims)]`` in the
        unsharded module's feature order."""
        by_key = dict(features.to_dict())  # a copy: `bucketize` edits it, the KJT caches it
        batches = agreed_batches(features, by_key, self._rows, group=self._group,
                                 what="sharded quantized tables")  # fmt: skip
        lengths = {f: by_key[f].lengths() for b in self._blocks.values() for f in b.features}
        bucketize(by_key, self._blocks)
        received = self._send_ids(by_key, batches)
        columns: dict[str, torch.Tensor] = {}
        for group in self._groups:
            columns.update(self._send_rows(group, self._lookup(group, received, batches), batches))
        return combine(columns, self._out_features, self._out_dims, lengths, self._blocks,
                       self._out_dtype)  # fmt: skip

    def _send_ids(self, by_key, batches: list[int]) -> list[dict[str, Any]]:
        """From each rank, its bags of this rank's features: ``{feature: (lengths, ids,
        weights)}``."""
        batch = batches[self._rank]
        lengths, ids, weights = [], [], []
        for dest in range(self._world):
            for f in self._features_of[dest]:
                lengths.append(by_key[f].lengths().to(torch.int64))
                ids.append(by_key[f].values().to(torch.int64))
                if self._is_weighted:
                    weights.append(by_key[f].weights().float())
        splits = [len(self._features_of[d]) * batch for d in range(self._world)]
        back = [len(self._features_of[self._rank]) * b for b in batches]
        got_lengths = _exchange(torch.cat(lengths), splits, back, self._group)
        sent_ids = [int(sum(x.sum() for x in lengths[_span(self._features_of, d)]))
                    for d in range(self._world)]  # fmt: skip
        counts = torch.tensor(sent_ids)
        got_counts = _exchange(counts, None, None, self._group).tolist()
        got_ids = _exchange(torch.cat(ids), sent_ids, got_counts, self._group)
        got_weights = None
        if self._is_weighted:
            got_weights = _exchange(torch.cat(weights), sent_ids, got_counts, self._group)
        return _per_source(self._features_of[self._rank], batches, got_lengths, got_ids,
                           got_weights)  # fmt: skip

    def _lookup(
        self, group: PooledGroup, received: list[dict[str, Any]], batches: list[int]
    ) -> torch.Tensor:
        """``[sum(batches), D_local]`` pooled rows, in ``group.dtype``, of this rank's features
        of ``group``, all ranks' bags."""
        names = group.features_of[self._rank]
        if group.local is None or not names:
            return torch.empty(sum(batches), 0, dtype=group.dtype)
        lengths, values, weights = [], [], []
        for f in names:
            for source in received:
                lengths.append(source[f][0])
                values.append(source[f][1])
                if self._is_weighted:
                    weights.append(source[f][2])
        kjt = KeyedJaggedTensor(
            keys=names,
            values=torch.cat(values),
            lengths=torch.cat(lengths),
            weights=torch.cat(weights) if self._is_weighted else None,
        )
        return group.local(kjt).values()

    def _send_rows(
        self, group: PooledGroup, pooled: torch.Tensor, batches: list[int]
    ) -> dict[str, torch.Tensor]:
        """``{feature: [B, D]}`` of ``group``'s features, from the ranks that pooled them."""
        width = pooled.shape[1]
        widths = [sum(self._dims[self._features.index(f)] for f in group.features_of[r])
                  for r in range(self._world)]  # fmt: skip
        batch = batches[self._rank]
        flat = pooled.reshape(-1)
        got = _exchange(flat, [b * width for b in batches], [batch * w for w in widths],
                        self._group)  # fmt: skip
        blocks = got.split([batch * w for w in widths])
        columns: dict[str, torch.Tensor] = {}
        for rank, block in enumerate(blocks):
            block = block.view(batch, widths[rank])
            start = 0
            for f in group.features_of[rank]:
                dim = self._dims[self._features.index(f)]
                columns[f] = block[:, start : start + dim]
                start += dim
        return columns


def _span(features_of: list[list[str]], dest: int) -> slice:
    """The positions, in the per-feature lists, of the features bound for ``dest``."""
    start = sum(len(f) for f in features_of[:dest])
    return slice(start, start + len(features_of[dest]))


def _exchange(
    x: torch.Tensor, send: list[int] | None, receive: list[int] | None, group
) -> torch.Tensor:
    out = comm.all_to_all_single(x, input_split_sizes=send, output_split_sizes=receive, group=group)
    assert isinstance(out, torch.Tensor)  # synchronous
    return out


def _per_source(names, batches, lengths, ids, weights) -> list[dict[str, Any]]:
    """Split what every rank sent (in rank order, each its features' bags) per source."""
    out = []
    length_at = id_at = 0
    for batch in batches:
        source = {}
        for f in names:
            bag_lengths = lengths[length_at : length_at + batch]
            count = int(bag_lengths.sum())
            source[f] = (
                bag_lengths,
                ids[id_at : id_at + count],
                None if weights is None else weights[id_at : id_at + count],
            )
            length_at += batch
            id_at += count
        out.append(source)
    return out


def _placement(module, configs, placement, row_wise, budget_bytes, world):
    """``({table: rank}, row-wise tables)`` from what the caller gave, checked."""
    if placement is None and not row_wise and budget_bytes is not None:
        sizes = {c.name: _stored_bytes(module, c.name) for c in configs}
        placement, row_wise = place_by_budget(sizes, world, budget_bytes)
    rest = [c for c in configs if c.name not in row_wise]
    placement = dict(placement or table_wise_placement(rest, world))
    both = sorted(set(placement) & set(row_wise))
    unknown = sorted(set(row_wise) - {c.name for c in configs})
    if both or unknown:
        raise ValueError(
            f"row_wise={list(row_wise)}: tables {both} also have a rank in placement and "
            f"{unknown} are not tables of the collection; name each table once, in placement "
            "(table-wise) or in row_wise"
        )
    _check_placement(rest, placement, world)
    return placement, list(row_wise)


def _stored_bytes(module: QuantEmbeddingBagCollection, table: str) -> int:
    weight = module.embedding_bags[table].weight
    assert isinstance(weight, torch.Tensor)  # a quantized table's buffer
    return weight.numel() * weight.element_size()


def _check_placement(configs, placement: Mapping[str, int], world: int) -> None:
    names = [c.name for c in configs]
    wrong = {t: r for t, r in placement.items() if t not in names or not 0 <= r < world}
    missing = [n for n in names if n not in placement]
    if wrong or missing:
        raise ValueError(
            f"placement {dict(placement)} must give every table {names} a rank in "
            f"[0, {world}): unknown tables or ranks {wrong}, tables without a rank {missing}"
        )


def shard_quant_model(
    model: nn.Module,
    world_size: int = 1,
    compute_device: str = "cpu",
    sharding_device: str = "cpu",
    sharders: object | None = None,
    device_memory_size: int | None = None,
    constraints: Mapping[str, Any] | None = None,
    ddr_cap: int | None = None,
    sharding_plan: object | None = None,
    *,
    placement: Mapping[str, int] | None = None,
    group: dist.ProcessGroup | None = None,
) -> tuple[nn.Module, dict[str, dict[str, int]]]:
    """Spread every quantized `EmbeddingBagCollection` of ``model`` over the ranks
    (TorchRec's name; its ``world_size`` devices are shardkit's ranks, one process each).
    ``device_memory_size`` is one rank's budget of stored bytes: a table over it is served
    row-wise ([Note: row-wise quantized serving]), the others are dealt table-wise by bytes.
    ``sharders``, ``constraints`` and ``ddr_cap`` are TorchRec's planner inputs: ignored.

    Call it on every rank of ``group`` with the same model. Returns (the model, in place, with
    `ShardedQuantEmbeddingBagCollection`\\ s; ``{module path: {table: rank}}`` of the
    table-wise tables; the row-wise ones are each collection's ``row_wise_tables``).
    """
    if sharding_plan is not None:
        raise ValueError(
            "shard_quant_model(sharding_plan=...): quantized tables are placed table-wise; "
            "give placement={table: rank} instead"
        )
    if compute_device != "cpu" or sharding_device not in ("cpu", "meta"):
        raise ValueError(
            f"shard_quant_model(compute_device={compute_device!r}, sharding_device="
            f"{sharding_device!r}): quantized tables are served on CPU (torch's quantized "
            "operators are CPU-only); pass 'cpu'"
        )
    ranks = dist.get_world_size(group)
    if world_size not in (1, ranks):
        raise ValueError(
            f"shard_quant_model(world_size={world_size}): shardkit serves with one process per "
            f"rank; start {world_size} ranks (this group has {ranks}) and pass world_size={ranks}"
        )
    plans: dict[str, dict[str, int]] = {}
    targets = [(p, m) for p, m in model.named_modules() if type(m) is QuantEmbeddingBagCollection]
    for path, child in targets:
        sharded = ShardedQuantEmbeddingBagCollection(
            child, placement, group, budget_bytes=device_memory_size
        )
        plans[path] = dict(sharded._placement)
        if path == "":
            return sharded, plans
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, sharded)
    return model, plans
