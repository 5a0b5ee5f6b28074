"""Output distribution of sequence lookups: each id's row back to the rank that sent the id.

Every route ends in an all-to-all here (one per output class, in the shared class order): an id
is looked up in exactly one shard of each column block, so there is nothing to add up. Rows come
back in the order the ids were sent; for row-bucketed units the source then undoes the bucketing
permutation (see `PendingInput.orders`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from shardkit.sharding._collection._shard_groups import ShardGroupSpec, class_slots
from shardkit.sharding._dist._input import PendingInput, Received
from shardkit.sharding._dist._qcomm import all_to_all, codecs_of
from shardkit.sharding._layout import Layout, Route, Slot
from shardkit.types import CommOp

__all__ = ["distribute_rows"]


def distribute_rows(
    output_class: tuple[Route, int],
    rows: Sequence[tuple[ShardGroupSpec, torch.Tensor]],
    specs_per_rank: Sequence[Sequence[ShardGroupSpec]],
    received: Received,
    pending: PendingInput,
    layout: Layout,
    *,
    rank: int,
    group: dist.ProcessGroup | None,
    device: torch.device,
    codecs: Mapping[str, Any] | None = None,
) -> dict[tuple[int, int], torch.Tensor]:
    """Send one class's looked-up rows home; returns ``{(unit index, shard index): rows}`` with
    the rows of this rank's ids sent to that shard, in the order they were sent.

    ``rows``: this rank's kernel outputs in the class, with their group, each ``[N_g, cols]``
    ordered (source, slot, id). ``device``: where a rank with no rows in the class makes its
    empty contribution. ``codecs``: the collection's ``qcomm_codecs_registry`` (see
    [Note: compressed collectives]).
    """
    cols = output_class[1]
    world = len(specs_per_rank)
    counts = received.counts  # [W][S] ids per (source, slot), host-side
    per_source: list[list[torch.Tensor]] = [[] for _ in range(world)]
    for spec, looked_up in rows:
        positions = [received.slots.index(s) for s in spec.slots]
        pieces = torch.split(
            looked_up, [sum(per_slot[p] for p in positions) for per_slot in counts]
        )
        for source in range(world):
            per_source[source].append(pieces[source])
    send_sizes = [sum(p.shape[0] for p in parts) for parts in per_source]
    send = torch.cat([p for parts in per_source for p in parts]) if rows else None
    if send is None:
        send = torch.zeros((0, cols), device=device, requires_grad=torch.is_grad_enabled())
    expected = _expected(output_class, specs_per_rank, layout, pending)
    got = all_to_all(
        send,
        codecs_of(codecs, CommOp.SEQUENCE_EMBEDDINGS_ALL_TO_ALL),
        input_split_sizes=send_sizes,
        output_split_sizes=[sum(n for _, n in per_rank) for per_rank in expected],
        group=group,
    )
    out: dict[tuple[int, int], torch.Tensor] = {}
    offset = 0
    for per_rank in expected:
        for slot, n in per_rank:
            out[(slot.unit.index, slot.unit.shards.index(slot.shard))] = got[offset : offset + n]
            offset += n
    return out


def _expected(
    output_class: tuple[Route, int],
    specs_per_rank: Sequence[Sequence[ShardGroupSpec]],
    layout: Layout,
    pending: PendingInput,
) -> list[list[tuple[Slot, int]]]:
    """Per rank r: (slot, ids this rank sent it) in the order r returns them."""
    expected = []
    for r, specs in enumerate(specs_per_rank):
        order = layout.slots_to(r)
        expected.append(
            [
                (slot, pending.sent_counts[r][order.index(slot)])
                for slot in class_slots(specs, output_class)
            ]
        )
    return expected
