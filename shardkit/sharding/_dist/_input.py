"""Input distribution: each rank's KJT -> the ids every shard must look up, from every rank.

[Note: input exchange]
Three all-to-alls per batch, all ranks in step:
1. a header per destination: ``[batch size, status, ids of each slot bound for it, bags of
   each feature]`` int64 (the bags: ``B`` each, except in a variable batch, see
   [Note: variable batch on the wire] in `_unpack`). `_header` exchanges and
   checks the headers.
   Every rank learns every other rank's batch size and whether its input was valid, so a bad
   input or a mismatch makes all ranks raise the same error instead of leaving some waiting;
   and how many ids it receives per (source, slot), on the host (see [Note: host-side sizes]).
   A train pipeline's rank that has run out of batches sends a header alone, with status
   "exhausted" (`exchange_status`), and every rank raises `RanksExhaustedError` naming it
   before the ids' all-to-all: the ranks' agreement on data costs no collective of its own
   ([Note: deferred agreement] in `_pipeline._agreement`).
2. int64 lengths then ids: for each slot bound for the destination (see [Note: routes]) its
   ``B`` bag lengths, then all the slots' ids.
3. float32 per-id weights, when the collection has any (weighted input or MEAN pooling, whose
   ``1 / bag length`` is applied at the source, where whole bags are still known).
Row-wise ids are bucketed by row range at the source and sent rebased to shard-local rows.
The receiver gets, from each source in rank order, the same slot list: lengths ``[W, S, B]``
(`_unpack`).

[Note: host-side sizes]
An all-to-all needs its split sizes on the host, and how many ids a rank sends to each shard
depends on the ids (row-wise bucketing). Everything else lives on the device of the batch. So
the host learns sizes at exactly two points per batch, each one device-to-host copy (a sync on
a GPU): the sender reads the ids per shard of all its bucketed units at once, after bucketing;
the receiver reads the header, which carries the ids per (source, slot). Every later split
(per kernel group, per output class, per source) is computed from those host lists, never by
reading the device again. Small host lists the device needs (row starts, header) go over with
``non_blocking=True``, which does not wait for the GPU's queue.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.comm import label
from shardkit.sharding._dist._header import (
    BAD_INPUT,
    EXHAUSTED,
    HEADER_FIELDS,
    NO_INPUT,
    OK,
    InputError,
    RanksExhaustedError,
    check_headers,
    exchange_headers,
)
from shardkit.sharding._dist._row_buckets import bucket_rows
from shardkit.sharding._dist._unpack import Received, unpack, unpack_variable
from shardkit.sharding._layout import Layout, Route, Unit

# InputError, RanksExhaustedError and Received live in `_header` and `_unpack`;
# they are named here too, where the collections and the train pipeline import them.
__all__ = [
    "InputError",
    "RanksExhaustedError",
    "Received",
    "SourceBatch",
    "exchange_start",
    "exchange_status",
]


@dataclass(frozen=True)
class SourceBatch:
    """This rank's batch in the collection's feature order.

    ``lengths_per_feature[f]`` ``[B]``, ``values_per_feature[f]`` ``[n_f]`` int64 table ids,
    ``weights_per_feature[f]`` ``[n_f]`` float32 or None. ``error`` is this rank's validation
    error, if any: it still takes part in the header exchange, then every rank raises.
    ``strides[f]``: the bags of feature ``f`` (a variable batch, [Note: variable batch on the
    wire]); None: ``batch_size`` for every feature.
    """

    batch_size: int
    lengths_per_feature: list[torch.Tensor]
    values_per_feature: list[torch.Tensor]
    weights_per_feature: list[torch.Tensor] | None
    error: str | None = None
    strides: list[int] | None = None


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
            _used_here(self._result, self.orders)
        return self._result


def _used_here(received: Received, orders: dict[int, torch.Tensor]) -> None:
    """On a GPU, mark the tensors made by an input dist that ran on another stream (the train
    pipeline's, [Note: pipeline streams]) as used by the current one, the stream that computes
    with them, so that the caching allocator keeps their memory until it is done."""
    if not received.values.is_cuda:
        return
    stream = torch.cuda.current_stream(received.values.device)
    for tensor in (received.lengths, received.values, received.weights, *orders.values()):
        if tensor is not None:
            tensor.record_stream(stream)


def exchange_start(
    batch: SourceBatch,
    layout: Layout,
    rank: int,
    group: dist.ProcessGroup | None,
    *,
    with_weights: bool,
    device: torch.device,
    tag: int = 0,
) -> PendingInput:
    """Send this rank's ids to the shards' ranks; returns a handle on what it receives.

    ``device`` is where the collection computes: the batch's tensors are there, and so is
    everything sent and received (NCCL carries only GPU tensors). ``tag``: the number every
    rank must send alike in its header (see `_header`).
    """
    world = layout.world_size
    payload: list[_Payload] | None = None
    sent_counts = [[0] * len(layout.slots_to(d)) for d in range(world)]
    orders: dict[int, torch.Tensor] = {}
    if batch.error is None:
        payload, sent_counts, orders = _payload(batch, layout, world, with_weights, device)
    header = exchange_headers(
        sent_counts, layout, rank, group, device,
        batch_size=batch.batch_size, strides=batch.strides,
        status=OK if batch.error is None else BAD_INPUT, tag=tag,
    )  # fmt: skip
    check_headers(header, error=batch.error)
    size = header[0][0]
    slots = layout.slots_to(rank)
    first = HEADER_FIELDS
    counts = [row[first : first + len(slots)] for row in header]  # [W][S]
    strides = [row[first + len(slots) :] for row in header]  # [W][F] bags per feature
    received_ids = [sum(per_slot) for per_slot in counts]
    sent_ids = [sum(per_slot) for per_slot in sent_counts]
    bags = [[per_rank[s.unit.feature_index] for s in slots] for per_rank in strides]  # [W][S]
    ints_out = [sum(per_slot) + n for per_slot, n in zip(bags, received_ids)]
    assert payload is not None
    # one copy of every id into the int64 send buffer: per destination its slots' lengths,
    # then their ids
    pieces = [[*p.lengths, *p.ids] for p in payload]
    ints_in = [sum(t.numel() for t in per_rank) for per_rank in pieces]
    ints = torch.empty(sum(ints_in), dtype=torch.int64, device=device)
    flat = [t for per_rank in pieces for t in per_rank]
    if flat:
        torch.cat(flat, out=ints)
    ints_handle = comm.all_to_all_single(
        ints, input_split_sizes=ints_in, output_split_sizes=ints_out, group=group, async_op=True
    )
    assert isinstance(ints_handle, comm.Handle)
    weights_handle: comm.Handle | None = None
    if with_weights:
        weights = torch.cat([_weights_of(p) for p in payload])
        sent = comm.all_to_all_single(
            weights,
            input_split_sizes=sent_ids,
            output_split_sizes=received_ids,
            group=group,
            async_op=True,
        )
        assert isinstance(sent, comm.Handle)
        weights_handle = sent

    variable = any(n != size for per_rank in strides for n in per_rank)

    def finish() -> Received:
        if variable:
            return unpack_variable(ints_handle, weights_handle, slots, counts, size, strides)
        return unpack(ints_handle, weights_handle, slots, counts, world, size)

    return PendingInput(finish, sent_counts, orders)


def exchange_status(
    layout: Layout,
    rank: int,
    group: dist.ProcessGroup | None,
    *,
    exhausted: bool,
    device: torch.device,
    tag: int = 0,
) -> None:
    """Take part in a collection's header exchange without input: this rank has no batch left
    (``exhausted``) or its batch has nothing for this collection. Returns when every rank sent
    the same status; raises `RanksExhaustedError` (some ranks have batches, some not) or
    `InputError` otherwise, as every other rank does (see [Note: input exchange])."""
    status = EXHAUSTED if exhausted else NO_INPUT
    sent_counts = [[0] * len(layout.slots_to(d)) for d in range(layout.world_size)]
    header = exchange_headers(
        sent_counts, layout, rank, group, device,
        batch_size=0, strides=None, status=status, tag=tag,
    )  # fmt: skip
    check_headers(header, error=None)


@dataclass(frozen=True)
class _Payload:
    """What goes to one destination, slot by slot, not yet copied into the send buffer."""

    lengths: list[torch.Tensor]  # per slot [B]: S_d * B in all
    ids: list[torch.Tensor]  # per slot: n_d in all
    weights: torch.Tensor | None  # [n_d]


def _weights_of(payload: _Payload) -> torch.Tensor:
    """A payload's weights, which `_payload` fills whenever the collection is weighted."""
    assert payload.weights is not None
    return payload.weights


def _payload(
    batch: SourceBatch, layout: Layout, world: int, with_weights: bool, device: torch.device
) -> tuple[list[_Payload], list[list[int]], dict[int, torch.Tensor]]:
    """Per destination rank: its slots' lengths, ids and weights (see [Note: routes]); the ids
    sent per slot; each bucketed unit's sort order."""
    units = [u for u in layout.units if u.route != Route.LOCAL]
    split = [_split_unit(u, *_feature(batch, u)) for u in units]
    # One read of every bucketed unit's ids per shard. See [Note: host-side sizes]
    bucketed = [s.shard_lengths.sum(1) for s in split if s.order is not None]
    host = torch.cat(bucketed).tolist() if bucketed else []
    per_rank: list[list[tuple]] = [[] for _ in range(world)]
    orders: dict[int, torch.Tensor] = {}
    for unit, part in zip(units, split):
        if part.order is None:
            counts = [part.ids.numel()]
        else:
            counts, host = host[: len(unit.shards)], host[len(unit.shards) :]
            orders[unit.index] = part.order
        ids = torch.split(part.ids, counts)
        ws = [None] * len(counts) if part.weights is None else torch.split(part.weights, counts)
        for shard, lengths, shard_ids, w, n in zip(
            unit.shards, part.shard_lengths, ids, ws, counts
        ):
            per_rank[shard.rank].append((lengths, shard_ids, w, n))
    empty_w = torch.empty(0, dtype=torch.float32, device=device)
    out = []
    for parts in per_rank:
        out.append(
            _Payload(
                lengths=[p[0] for p in parts],
                ids=[p[1] for p in parts],
                weights=(torch.cat([p[2] for p in parts]) if parts else empty_w)
                if with_weights
                else None,
            )
        )
    sent_counts = [[part[3] for part in parts] for parts in per_rank]
    return out, sent_counts, orders


def _feature(batch: SourceBatch, unit: Unit) -> tuple:
    """The unit's feature in ``batch``: lengths ``[B]``, ids ``[n]``, weights ``[n]`` or None."""
    feature = unit.feature_index
    weights = batch.weights_per_feature[feature] if batch.weights_per_feature else None
    return batch.lengths_per_feature[feature], batch.values_per_feature[feature], weights


@dataclass(frozen=True)
class _SplitUnit:
    """A unit's ids ordered by shard: ``shard_lengths[k]`` ``[B]`` are shard k's bag lengths;
    ``order`` (None for PLACED) the permutation that sorted the feature's ids by shard."""

    shard_lengths: torch.Tensor  # [num_shards, B]
    ids: torch.Tensor  # [n] rebased to shard-local rows
    weights: torch.Tensor | None  # [n]
    order: torch.Tensor | None  # [n]


def _split_unit(
    unit: Unit, lengths: torch.Tensor, values: torch.Tensor, weights: torch.Tensor | None
) -> _SplitUnit:
    """A unit's ids per shard: all of them for PLACED; bucketed and rebased by row range else.
    Device work only: the host reads the sizes later, for all units at once."""
    if unit.route == Route.PLACED:
        return _SplitUnit(lengths.unsqueeze(0), values, weights, None)
    row_starts = [shard.row_start for shard in unit.shards]
    return _SplitUnit(*bucket_rows(values, lengths=lengths, weights=weights, row_starts=row_starts))
