"""The input dist's receiving side: what a rank got for its slots, source by source, out of
the ids all-to-all (see [Note: input exchange] in `_input`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from shardkit.comm import Handle
from shardkit.sharding._layout import Slot

__all__ = ["Received", "unpack", "unpack_variable"]


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


def unpack(
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


def unpack_variable(ints_handle, weights_handle, slots, counts, size, strides) -> Received:
    """`unpack` for a variable batch: ``strides[w][f]`` lengths from source ``w`` for each
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
