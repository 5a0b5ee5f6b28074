"""Input distribution: each rank's KJT -> the ids every shard must look up, from every rank.

[Note: input exchange]
Three all-to-alls per batch, all ranks in step:
1. a header per destination: ``[batch size, status, ids of each slot bound for it, bags of
   each feature]`` int64 (the bags: ``B`` each, except in a variable batch, see
   [Note: variable batch on the wire]).
   Every rank learns every other rank's batch size and whether its input was valid, so a bad
   input or a mismatch makes all ranks raise the same error instead of leaving some waiting;
   and how many ids it receives per (source, slot), on the host (see [Note: host-side sizes]).
   A train pipeline's rank that has run out of batches sends a header alone, with status
   "exhausted" (`exchange_status`), and every rank raises `RanksExhaustedError` naming it
   before the ids' all-to-all: the ranks' agreement on data costs no collective of its own
   ([Note: deferred agreement] in `_data_agreement`).
2. int64 lengths then ids: for each slot bound for the destination (see [Note: routes]) its
   ``B`` bag lengths, then all the slots' ids.
3. float32 per-id weights, when the collection has any (weighted input or MEAN pooling, whose
   ``1 / bag length`` is applied at the source, where whole bags are still known).
Row-wise ids are bucketed by row range at the source and sent rebased to shard-local rows.
The receiver gets, from each source in rank order, the same slot list: lengths ``[W, S, B]``.

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

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.comm import Handle, label
from shardkit.sharding._layout import Layout, Route, Slot, Unit
from shardkit.sharding._row_buckets import bucket_rows

__all__ = [
    "InputError",
    "RanksExhaustedError",
    "Received",
    "SourceBatch",
    "exchange_start",
    "exchange_status",
]

# Header status codes (see [Note: input exchange]): input sent; input refused; no batch left;
# a batch, but no input for this collection (a header alone, see `exchange_status`).
_OK, _BAD_INPUT, _EXHAUSTED, _NO_INPUT = 0, 1, 2, 3


class InputError(ValueError):
    """Some rank's input to a sharded collection was refused; raised on every rank."""


class RanksExhaustedError(RuntimeError):
    """Some ranks sent an "exhausted" header while others sent a batch; raised on every rank.

    ``ranks``: the ranks that ran out (the train pipeline names them in `DataExhaustedError`).
    """

    def __init__(self, ranks: list[int]) -> None:
        super().__init__(f"rank(s) {ranks} have no batch left while the others have one")
        self.ranks = ranks


class OtherRankInputError(InputError):
    """Raised on the ranks whose own input was fine, when another rank's was refused."""

    reports_other_rank = True


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


@dataclass
class Received:
    """What this rank received for its slots, source by source (see [Note: input exchange])."""

    slots: list[Slot]
    lengths: torch.Tensor  # [W, S, B] int64
    values: torch.Tensor  # [N] int64 shard-local rows, ordered (source, slot, bag)
    weights: torch.Tensor | None  # [N] float32
    batch_size: int
    counts: list[list[int]]  # [W][S] ids per (source, slot), on the host
    # A variable batch ([Note: variable batch on the wire]): bags per feature, the most any
    # rank sent, and ``lengths`` is [W, sum of its slots' bags], padded with empty bags.
    feature_rows: list[int] | None = None

    def slot_rows(self) -> list[int]:
        """Bags per slot from each source (``batch_size`` each unless a variable batch)."""
        if self.feature_rows is None:
            return [self.batch_size] * len(self.slots)
        return [self.feature_rows[s.unit.feature_index] for s in self.slots]


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
) -> PendingInput:
    """Send this rank's ids to the shards' ranks; returns a handle on what it receives.

    ``device`` is where the collection computes: the batch's tensors are there, and so is
    everything sent and received (NCCL carries only GPU tensors).
    """
    world = layout.world_size
    payload: list[_Payload] | None = None
    sent_counts = [[0] * len(layout.slots_to(d)) for d in range(world)]
    orders: dict[int, torch.Tensor] = {}
    if batch.error is None:
        payload, sent_counts, orders = _payload(batch, layout, world, with_weights, device)
    header = _exchange_headers(batch, sent_counts, layout, rank, group, device)
    _check_headers(header, batch, rank)
    size = header[0][0]
    slots = layout.slots_to(rank)
    counts = [row[2 : 2 + len(slots)] for row in header]  # [W][S]
    strides = [row[2 + len(slots) :] for row in header]  # [W][F] bags per feature
    received_ids = [sum(per_slot) for per_slot in counts]
    sent_ids = [sum(per_slot) for per_slot in sent_counts]
    bags = [[per_rank[s.unit.feature_index] for s in slots] for per_rank in strides]  # [W][S]
    ints_out = [sum(per_slot) + n for per_slot, n in zip(bags, received_ids)]
    assert payload is not None
    ints = torch.cat([torch.cat([p.lengths, p.ids]) for p in payload])
    ints_in = [p.lengths.numel() + p.ids.numel() for p in payload]
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
            return _unpack_variable(ints_handle, weights_handle, slots, counts, size, strides)
        return _unpack(ints_handle, weights_handle, slots, counts, world, size)

    return PendingInput(finish, sent_counts, orders)


def exchange_status(
    layout: Layout,
    rank: int,
    group: dist.ProcessGroup | None,
    *,
    exhausted: bool,
    device: torch.device,
) -> None:
    """Take part in a collection's header exchange without input: this rank has no batch left
    (``exhausted``) or its batch has nothing for this collection. Returns when every rank sent
    the same status; raises `RanksExhaustedError` (some ranks have batches, some not) or
    `InputError` otherwise, as every other rank does (see [Note: input exchange])."""
    status = _EXHAUSTED if exhausted else _NO_INPUT
    empty = SourceBatch(0, [], [], None, error=None)
    sent_counts = [[0] * len(layout.slots_to(d)) for d in range(layout.world_size)]
    header = _exchange_headers(empty, sent_counts, layout, rank, group, device, status=status)
    _check_headers(header, empty, rank)


def _exchange_headers(
    batch: SourceBatch,
    sent_counts: list[list[int]],
    layout: Layout,
    rank: int,
    group: dist.ProcessGroup | None,
    device: torch.device,
    *,
    status: int | None = None,
) -> list[list[int]]:
    """Every source's header to this rank, read on the host: ``[W][2 + S + F]`` (see
    [Note: input exchange]); the one device-to-host read of the receiver. ``status``: a
    header alone (`exchange_status`), with no bags."""
    num_features = 1 + max((u.feature_index for u in layout.units), default=-1)
    strides = batch.strides or [batch.batch_size] * num_features
    if status is None:
        status = _OK if batch.error is None else _BAD_INPUT
    if status != _OK:
        strides = [0] * num_features
    rows = [[batch.batch_size, status, *per_slot, *strides] for per_slot in sent_counts]
    flat = torch.tensor([v for row in rows for v in row], dtype=torch.int64)
    width = 2 + len(layout.slots_to(rank)) + num_features
    got = comm.all_to_all_single(
        flat.to(device, non_blocking=True),  # See [Note: host-side sizes]
        input_split_sizes=[len(row) for row in rows],
        output_split_sizes=[width] * layout.world_size,
        group=group,
    )
    assert isinstance(got, torch.Tensor)
    values = got.tolist()
    return [values[r * width : (r + 1) * width] for r in range(layout.world_size)]


@dataclass(frozen=True)
class _Payload:
    lengths: torch.Tensor  # [S_d * B]
    ids: torch.Tensor  # [n_d]
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
    empty_ids = torch.empty(0, dtype=torch.int64, device=device)
    empty_w = torch.empty(0, dtype=torch.float32, device=device)
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


def _check_headers(headers: list[list[int]], batch: SourceBatch, rank: int) -> None:
    """Raise the same error on every rank if any rank's input was bad or batch sizes differ,
    or some ranks ran out of batches; return quietly where every rank sent a header alone."""
    statuses = [row[1] for row in headers]
    exhausted = [r for r, s in enumerate(statuses) if s == _EXHAUSTED]
    if exhausted and len(exhausted) < len(statuses):
        raise RanksExhaustedError(exhausted)
    if len(set(statuses)) == 1 and statuses[0] in (_EXHAUSTED, _NO_INPUT):
        return
    absent = [r for r, s in enumerate(statuses) if s == _NO_INPUT]
    if absent:
        raise InputError(
            f"rank(s) {absent} fed no input to this sharded collection while the others did; "
            "every rank's batches must hold the same KeyedJaggedTensor features"
        )
    bad = [r for r, s in enumerate(statuses) if s != _OK]
    if bad:
        if batch.error is not None:
            raise InputError(batch.error)
        raise OtherRankInputError(
            f"rank(s) {bad} refused their input to the sharded collection (their error says "
            "why); every rank stops here instead of waiting for them"
        )
    sizes = [row[0] for row in headers]
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
    counts: list[list[int]],
    world: int,
    size: int,
) -> Received:
    ints = ints_handle.wait()
    num_lengths = len(slots) * size
    pieces = torch.split(ints, [num_lengths + sum(per_slot) for per_slot in counts])
    lengths = torch.stack([p[:num_lengths] for p in pieces]) if pieces else ints[:0]
    values = torch.cat([p[num_lengths:] for p in pieces])
    weights = weights_handle.wait() if weights_handle is not None else None
    return Received(
        slots=list(slots),
        lengths=lengths.view(world, len(slots), size),
        values=values,
        weights=weights,
        batch_size=size,
        counts=counts,
    )


# [Note: variable batch on the wire]
# A variable batch (VBE) sends each feature's own, deduplicated bags: source ``w`` sends
# ``strides[w][f]`` bag lengths for each slot of feature ``f`` (the header carries every
# rank's strides, so every rank knows them all). The receiver pads each slot to the most bags
# any source sent for its feature (``feature_rows[f]``), with empty bags, so that the lookup
# and the output dist see the same number of rows per slot from every source (an even
# reduce-scatter, one offset per unit); the bags' home rank expands its rows by
# ``inverse_indices`` after the output dist. The padding costs one empty bag (a zero row on
# the way back) per bag another rank has more of: nothing when the ranks deduplicate alike.


def _unpack_variable(ints_handle, weights_handle, slots, counts, size, strides) -> Received:
    """`_unpack` for a variable batch: ``strides[w][f]`` lengths from source ``w`` for each
    slot of feature ``f``, padded to ``[W, sum(feature_rows of the slots)]``."""
    ints = ints_handle.wait()
    feature_rows = [max(column) for column in zip(*strides)]
    bags = [[per_rank[s.unit.feature_index] for s in slots] for per_rank in strides]  # [W][S]
    widest = [feature_rows[s.unit.feature_index] for s in slots]
    pieces = torch.split(ints, [sum(b) + sum(c) for b, c in zip(bags, counts)])
    got = torch.cat([p[: sum(b)] for p, b in zip(pieces, bags)])
    lengths = _pad_bags(got, bags, widest)  # [W, sum(widest)]
    values = torch.cat([p[sum(b) :] for p, b in zip(pieces, bags)])
    weights = weights_handle.wait() if weights_handle is not None else None
    return Received(list(slots), lengths, values, weights, size, counts, feature_rows)


def _pad_bags(got: torch.Tensor, bags: list[list[int]], widest: list[int]) -> torch.Tensor:
    """Lengths ``got`` (source, slot, bag) padded to ``[W, sum(widest)]`` with empty bags.

    The host builds ``O(W * S)`` sizes, never one entry per bag: each (source, slot) segment
    of ``got`` moves by one shift, spread over its bags on the device.
    """
    num_sources, num_slots = len(bags), len(widest)
    width = torch.tensor(widest, dtype=torch.int64)  # [S]
    sent = torch.tensor(bags, dtype=torch.int64).view(num_sources * num_slots)  # [W * S]
    total = int(width.sum())
    first = (torch.cumsum(width, 0) - width)[None, :] + torch.arange(num_sources)[:, None] * total
    shift = first.view(-1) - (torch.cumsum(sent, 0) - sent)  # [W * S] padded minus packed start
    device = got.device
    shift, sent = shift.to(device, non_blocking=True), sent.to(device, non_blocking=True)
    where = torch.arange(got.numel(), device=device)
    where += torch.repeat_interleave(shift, sent, output_size=got.numel())
    lengths = torch.zeros(num_sources * total, dtype=got.dtype, device=device)
    return lengths.index_copy_(0, where, got).view(num_sources, total)
