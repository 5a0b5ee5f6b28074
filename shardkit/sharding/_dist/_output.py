"""Output distribution: pooled rows back to the ranks that own the bags.

One collective (or two for HOST_SUMMED) per output class, in the class order every rank shares
(see [Note: kernel groups and output classes]); backward flows through each (the adjoint of an
all-to-all is the reverse all-to-all, of a reduce-scatter an all-gather; see
[Note: adjoints] in `shardkit.comm`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from shardkit.sharding._collection._shard_groups import ShardGroupSpec, class_slots
from shardkit.sharding._dist._qcomm import all_to_all, codecs_of, reduce_scatter
from shardkit.sharding._layout import Route, Slot
from shardkit.types import CommOp

__all__ = ["HostGroups", "distribute"]

OutputClass = tuple[Route, int]
ClassRows = tuple[torch.Tensor, dict[int, int]]  # rows [R, cols], {unit index: first row}


class HostGroups:
    """The process groups of table-row-wise sharding: one per host (its ranks) and one per
    local rank index (the ranks with that index, one per host). Every rank creates all of them,
    in the same order, as torch requires."""

    def __init__(self, world_size: int, local_world_size: int, rank: int) -> None:
        hosts = [
            list(range(h * local_world_size, (h + 1) * local_world_size))
            for h in range(world_size // local_world_size)
        ]
        across = [list(range(i, world_size, local_world_size)) for i in range(local_world_size)]
        self.intra, _ = dist.new_subgroups_by_enumeration(hosts)
        self.cross, _ = dist.new_subgroups_by_enumeration(across)
        self.local_world_size = local_world_size
        self.num_hosts = len(hosts)
        self.rank = rank


def distribute(
    output_class: OutputClass,
    rows: Sequence[torch.Tensor],
    specs_per_rank: Sequence[Sequence[ShardGroupSpec]],
    *,
    rank: int,
    batch_size: int,
    group: dist.ProcessGroup | None,
    hosts: HostGroups | None,
    device: torch.device,
    codecs: Mapping[str, Any] | None = None,
    feature_rows: Sequence[int] | None = None,
) -> ClassRows:
    """Send one class's pooled rows home.

    Returns ``[R, cols]`` rows for this rank and ``{unit index: first row}``: unit ``u``'s pooled
    rows are ``[first, first + B)`` (handed whole to `assemble`, which slices them in one pass).

    ``rows``: this rank's kernel outputs of the class, one per group in class order, each
    ``[W * S_g * B, cols]`` ordered (source, slot, bag). ``device``: where a rank with no rows
    in the class makes its empty contribution. ``codecs``: the collection's
    ``qcomm_codecs_registry`` (see [Note: compressed collectives]). ``feature_rows``: a
    variable batch's bags per feature, in place of ``B`` (see [Note: variable batch on the
    wire]); a unit's rows are then ``[first, first + feature_rows[f])``.
    """
    sizes = _SlotRows(batch_size, feature_rows)
    route, cols = output_class
    world = len(specs_per_rank)
    local = _differentiable(_by_source(rows, world, cols, device))  # [W, S * B, cols]
    a2a = codecs_of(codecs, CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL)
    summed = codecs_of(codecs, CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER)
    if route == Route.PLACED:
        return _placed(output_class, local, specs_per_rank, rank, sizes, group, a2a)
    if route == Route.SUMMED:
        return _summed(output_class, local, specs_per_rank[rank], sizes, group, summed)
    assert hosts is not None
    return _host_summed(output_class, local, specs_per_rank, rank, sizes, hosts, (a2a, summed))


def _differentiable(x: torch.Tensor) -> torch.Tensor:
    """Make ``x`` take part in autograd even when this rank contributes nothing to it.

    A rank with no rows in a class still joins the class's collective in forward; it must also
    join the adjoint collective in backward, which autograd only runs for inputs that require
    grad. Otherwise the other ranks would wait for it there.
    """
    if torch.is_grad_enabled() and not x.requires_grad:
        return x.detach().requires_grad_()
    return x


def _by_source(
    rows: Sequence[torch.Tensor], world: int, cols: int, device: torch.device
) -> torch.Tensor:
    if not rows:
        return torch.zeros((world, 0, cols), device=device)
    parts = [r.view(world, -1, cols) for r in rows]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _placed(cls, local, specs_per_rank, rank, sizes, group, codecs) -> ClassRows:
    world, per_source, cols = local.shape
    receive = [sizes.total(class_slots(specs, cls)) for specs in specs_per_rank]
    got = all_to_all(
        local.reshape(-1, cols),
        codecs,
        input_split_sizes=[per_source] * world,
        output_split_sizes=receive,
        group=group,
    )
    first, offset = {}, 0
    for specs in specs_per_rank:
        for slot in class_slots(specs, cls):
            first[slot.unit.index] = offset
            offset += sizes.of(slot)
    return got, first


def _summed(cls, local, my_specs, sizes, group, codecs) -> ClassRows:
    cols = local.shape[2]
    summed = reduce_scatter(local.reshape(-1, cols), codecs, group=group)
    slots = class_slots(my_specs, cls)
    starts = [sizes.total(slots[:k]) for k in range(len(slots))]
    return summed, {slot.unit.index: start for slot, start in zip(slots, starts)}


def _host_summed(cls, local, specs_per_rank, rank, sizes, hosts, codecs) -> ClassRows:
    _, per_source, cols = local.shape
    num_local, num_hosts = hosts.local_world_size, hosts.num_hosts
    index = rank % num_local
    mine = class_slots(specs_per_rank[rank], cls)
    if mine:  # the same on every rank of this host: they all hold the host's shards
        # sources i = h * L + l; local rank l of the host gets the sums for sources (*, l)
        by_local = local.view(num_hosts, num_local, per_source, cols).transpose(0, 1)
        stage = reduce_scatter(by_local.reshape(-1, cols), codecs[1], group=hosts.intra)
    else:
        stage = _differentiable(local.new_zeros((0, cols)))
    peers = [h * num_local + index for h in range(num_hosts)]
    if num_hosts > 1:
        receive = [sizes.total(class_slots(specs_per_rank[p], cls)) for p in peers]
        stage = all_to_all(
            stage,
            codecs[0],
            input_split_sizes=[sizes.total(mine)] * num_hosts,
            output_split_sizes=receive,
            group=hosts.cross,
        )
    first, offset = {}, 0
    for peer in peers:
        for slot in class_slots(specs_per_rank[peer], cls):
            first[slot.unit.index] = offset
            offset += sizes.of(slot)
    return stage, first


class _SlotRows:
    """Pooled rows per slot: ``batch_size``, or a variable batch's ``feature_rows`` of the
    slot's feature (see [Note: variable batch on the wire])."""

    def __init__(self, batch_size: int, feature_rows: Sequence[int] | None) -> None:
        self.batch_size = batch_size
        self.feature_rows = None if feature_rows is None else list(feature_rows)

    def of(self, slot: Slot) -> int:
        if self.feature_rows is None:
            return self.batch_size
        return self.feature_rows[slot.unit.feature_index]

    def total(self, slots: Sequence[Slot]) -> int:
        if self.feature_rows is None:
            return len(slots) * self.batch_size
        return sum(self.of(slot) for slot in slots)
