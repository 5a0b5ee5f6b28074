"""Input distribution: each rank's KJT -> the ids every shard must look up, from every rank.

[Note: input exchange]
Three all-to-alls per batch, all ranks in step:
1. a header per destination: ``[batch size, ids sent, status]`` int64. Every rank learns every
   other rank's batch size and whether its input was valid, so a bad input or a mismatch makes
   all ranks raise the same error instead of leaving some waiting.
2. int64 lengths then ids: for each slot bound for the destination (see [Note: routes]) its
   ``B`` bag lengths, then all the slots' ids.
3. float32 per-id weights, when the collection has any (weighted input or MEAN pooling, whose
   ``1 / bag length`` is applied at the source, where whole bags are still known).
Row-wise ids are bucketed by row range at the source and sent rebased to shard-local rows.
The receiver gets, from each source in rank order, the same slot list: lengths ``[W, S, B]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.comm import Handle, label
from shardkit.sharding._layout import Layout, Route, Slot, Unit

__all__ = ["InputError", "Received", "SourceBatch", "exchange_start"]

# Header status codes (see [Note: input exchange]).
_OK, _BAD_INPUT = 0, 1


class InputError(ValueError):
    """Some rank's input to a sharded collection was refused; raised on every rank."""


class OtherRankInputError(InputError):
    """Raised on the ranks whose own input was fine, when another rank's was refused."""

    reports_other_rank = True


@dataclass(frozen=True)
class SourceBatch:
    """This rank's batch in the collection's feature order.

    ``lengths_per_feature[f]`` ``[B]``, ``values_per_feature[f]`` ``[n_f]`` int64 table ids,
    ``weights_per_feature[f]`` ``[n_f]`` float32 or None. ``error`` is this rank's validation
    error, if any: it still takes part in the header exchange, then every rank raises.
    """

    batch_size: int
    lengths_per_feature: list[torch.Tensor]
    values_per_feature: list[torch.Tensor]
    weights_per_feature: list[torch.Tensor] | None
    error: str | None = None


@dataclass
class Received:
    """What this rank received for its slots, source by source (see [Note: input exchange])."""

    slots: list[Slot]
    lengths: torch.Tensor  # [W, S, B] int64
    values: torch.Tensor  # [N] int64 shard-local rows, ordered (source, slot, bag)
    weights: torch.Tensor | None  # [N] float32
    batch_size: int


class PendingInput:
    """The ids all-to-alls in flight; `wait` returns the `Received`.

    Also what this rank sent, which sequence lookups need to put returned rows back in order:
    ``sent_counts[d][k]`` ids for the k-th slot bound for rank d, and ``orders[unit index]``, the
    permutation that sorted a row-bucketed unit's ids by shard.
    """

    def __init__(self, finish, sent_counts: list[list[int]], orders: dict) -> None:
        self._finish = finish
        self._result: Received | None = None
        self.sent_counts = sent_counts
        self.orders = orders

    def wait(self) -> Received:
        if self._result is None:
            # The span shows how long a step waits for its ids: the train pipeline's overlap
            # is this span shrinking (benchmarks/bench_dmp.py measures it).
            with label("shardkit::input_dist.wait"):
                self._result = self._finish()
        return self._result


def exchange_start(
    batch: SourceBatch,
    layout: Layout,
    rank: int,
    group: dist.ProcessGroup | None,
    *,
    with_weights: bool,
) -> PendingInput:
    """Send this rank's ids to the shards' ranks; returns a handle on what it receives."""
    world = layout.world_size
    payload, sent_counts, orders = None, [], {}
    if batch.error is None:
        payload, sent_counts, orders = _payload(batch, layout, world, with_weights)
    sent_ids = [0] * world if payload is None else [p.ids.numel() for p in payload]
    status = _OK if batch.error is None else _BAD_INPUT
    header = torch.tensor([[batch.batch_size, n, status] for n in sent_ids], dtype=torch.int64)
    got = comm.all_to_all_single(header.view(-1), group=group).view(world, 3)
    _check_headers(got, batch, rank)
    size = int(got[0, 0])
    slots = layout.slots_to(rank)
    received_ids = got[:, 1].tolist()
    ints_out = [len(slots) * size + n for n in received_ids]
    assert payload is not None
    ints = torch.cat([torch.cat([p.lengths, p.ids]) for p in payload])
    ints_in = [p.lengths.numel() + p.ids.numel() for p in payload]
    ints_handle = comm.all_to_all_single(
        ints, input_split_sizes=ints_in, output_split_sizes=ints_out, group=group, async_op=True
    )
    weights_handle = None
    if with_weights:
        weights = torch.cat([p.weights for p in payload])
        weights_handle = comm.all_to_all_single(
            weights,
            input_split_sizes=sent_ids,
            output_split_sizes=received_ids,
            group=group,
            async_op=True,
        )

    def finish() -> Received:
        return _unpack(ints_handle, weights_handle, slots, received_ids, world, size)

    return PendingInput(finish, sent_counts, orders)


@dataclass(frozen=True)
class _Payload:
    lengths: torch.Tensor  # [S_d * B]
    ids: torch.Tensor  # [n_d]
    weights: torch.Tensor | None  # [n_d]


def _payload(
    batch: SourceBatch, layout: Layout, world: int, with_weights: bool
) -> tuple[list[_Payload], list[list[int]], dict[int, torch.Tensor]]:
    """Per destination rank: its slots' lengths, ids and weights (see [Note: routes]); the ids
    sent per slot; each bucketed unit's sort order."""
    per_rank: list[list[tuple]] = [[] for _ in range(world)]
    orders: dict[int, torch.Tensor] = {}
    for unit in layout.units:
        if unit.route == Route.LOCAL:
            continue
        feature = unit.feature_index
        lengths = batch.lengths_per_feature[feature]
        values = batch.values_per_feature[feature]
        weights = batch.weights_per_feature[feature] if batch.weights_per_feature else None
        parts, order = _split_unit(unit, lengths, values, weights)
        if order is not None:
            orders[unit.index] = order
        for shard, part in zip(unit.shards, parts):
            per_rank[shard.rank].append(part)
    empty_ids = torch.empty(0, dtype=torch.int64)
    empty_w = torch.empty(0, dtype=torch.float32)
    out = []
    for parts in per_rank:
        out.append(
            _Payload(
                lengths=torch.cat([p[0] for p in parts]) if parts else empty_ids,
                ids=torch.cat([p[1] for p in parts]) if parts else empty_ids,
                weights=(torch.cat([p[2] for p in parts]) if parts else empty_w)
                if with_weights
                else None,
            )
        )
    sent_counts = [[part[1].numel() for part in parts] for parts in per_rank]
    return out, sent_counts, orders


def _split_unit(
    unit: Unit, lengths: torch.Tensor, values: torch.Tensor, weights: torch.Tensor | None
) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]], torch.Tensor | None]:
    """A unit's ids per shard: all of them for PLACED; bucketed and rebased by row range else
    (then also the permutation that sorted the ids by shard)."""
    if unit.route == Route.PLACED:
        return [(lengths, values, weights)], None
    batch = lengths.numel()
    starts = torch.tensor([s.row_start for s in unit.shards], dtype=torch.int64)
    bucket = torch.bucketize(values, starts[1:], right=True)  # [n]: shard of each id
    bag = torch.repeat_interleave(torch.arange(batch), lengths, output_size=values.numel())
    num_shards = len(unit.shards)
    shard_lengths = torch.bincount(bucket * batch + bag, minlength=num_shards * batch)
    shard_lengths = shard_lengths.view(num_shards, batch)
    order = torch.argsort(bucket, stable=True)  # by shard; within a shard still bag by bag
    rebased = values[order] - starts[bucket[order]]
    counts = shard_lengths.sum(1).tolist()
    ids = torch.split(rebased, counts)
    ws = torch.split(weights[order], counts) if weights is not None else [None] * num_shards
    return list(zip(shard_lengths, ids, ws)), order


def _check_headers(headers: torch.Tensor, batch: SourceBatch, rank: int) -> None:
    """Raise the same error on every rank if any rank's input was bad or batch sizes differ."""
    status = headers[:, 2].tolist()
    bad = [r for r, s in enumerate(status) if s != _OK]
    if bad:
        if batch.error is not None:
            raise InputError(batch.error)
        raise OtherRankInputError(
            f"rank(s) {bad} refused their input to the sharded collection (their error says "
            "why); every rank stops here instead of waiting for them"
        )
    sizes = headers[:, 0].tolist()
    if len(set(sizes)) > 1:
        raise InputError(
            f"ranks disagree on the batch size: {dict(enumerate(sizes))} (rank: size). Every "
            "rank must feed the same batch size to a sharded collection; drop or pad the last "
            "partial batch (e.g. drop_last=True)"
        )


def _unpack(
    ints_handle: Handle,
    weights_handle: Handle | None,
    slots: Sequence[Slot],
    received_ids: list[int],
    world: int,
    size: int,
) -> Received:
    ints = ints_handle.wait()
    num_lengths = len(slots) * size
    pieces = torch.split(ints, [num_lengths + n for n in received_ids])
    lengths = torch.stack([p[:num_lengths] for p in pieces]) if pieces else ints[:0]
    values = torch.cat([p[num_lengths:] for p in pieces])
    weights = weights_handle.wait() if weights_handle is not None else None
    return Received(
        slots=list(slots),
        lengths=lengths.view(world, len(slots), size),
        values=values,
        weights=weights,
        batch_size=size,
    )
