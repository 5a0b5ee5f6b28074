"""Output distribution: pooled rows back to the ranks that own the bags.

One collective (or two for HOST_SUMMED) per output class, in the class order every rank shares
(see [Note: kernel groups and output classes]); backward flows through each (the adjoint of an
all-to-all is the reverse all-to-all, of a reduce-scatter an all-gather; see
[Note: adjoints] in `shardkit.comm`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.sharding._layout import Route
from shardkit.sharding._shard_groups import ShardGroupSpec, class_slots

__all__ = ["HostGroups", "distribute"]

OutputClass = tuple[Route, int]


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
) -> dict[int, torch.Tensor]:
    """Send one class's pooled rows home; returns ``{unit index: [B, cols]}`` for this rank.

    ``rows``: this rank's kernel outputs of the class, one per group in class order, each
    ``[W * S_g * B, cols]`` ordered (source, slot, bag).
    """
    route, cols = output_class
    world = len(specs_per_rank)
    local = _differentiable(_by_source(rows, world, batch_size, cols))  # [W, S * B, cols]
    if route == Route.PLACED:
        return _placed(output_class, local, specs_per_rank, rank, batch_size, group)
    if route == Route.SUMMED:
        return _summed(output_class, local, specs_per_rank[rank], batch_size, group)
    assert hosts is not None
    return _host_summed(output_class, local, specs_per_rank, rank, batch_size, hosts)


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
    rows: Sequence[torch.Tensor], world: int, batch_size: int, cols: int
) -> torch.Tensor:
    if not rows:
        return torch.zeros((world, 0, cols))
    parts = [r.view(world, -1, cols) for r in rows]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _placed(cls, local, specs_per_rank, rank, batch_size, group) -> dict[int, torch.Tensor]:
    world, per_source, cols = local.shape
    receive = [len(class_slots(specs, cls)) * batch_size for specs in specs_per_rank]
    got = comm.all_to_all_single(
        local.reshape(-1, cols),
        input_split_sizes=[per_source] * world,
        output_split_sizes=receive,
        group=group,
    )
    out, offset = {}, 0
    for specs in specs_per_rank:
        for slot in class_slots(specs, cls):
            out[slot.unit.index] = got[offset : offset + batch_size]
            offset += batch_size
    return out


def _summed(cls, local, my_specs, batch_size, group) -> dict[int, torch.Tensor]:
    cols = local.shape[2]
    summed = comm.reduce_scatter_tensor(local.reshape(-1, cols), group=group)
    slots = class_slots(my_specs, cls)
    return {
        slot.unit.index: summed[k * batch_size : (k + 1) * batch_size]
        for k, slot in enumerate(slots)
    }


def _host_summed(cls, local, specs_per_rank, rank, batch_size, hosts) -> dict[int, torch.Tensor]:
    _, per_source, cols = local.shape
    num_local, num_hosts = hosts.local_world_size, hosts.num_hosts
    index = rank % num_local
    mine = class_slots(specs_per_rank[rank], cls)
    if mine:  # the same on every rank of this host: they all hold the host's shards
        # sources i = h * L + l; local rank l of the host gets the sums for sources (*, l)
        by_local = local.view(num_hosts, num_local, per_source, cols).transpose(0, 1)
        stage = comm.reduce_scatter_tensor(by_local.reshape(-1, cols), group=hosts.intra)
    else:
        stage = _differentiable(local.new_zeros((0, cols)))
    peers = [h * num_local + index for h in range(num_hosts)]
    if num_hosts > 1:
        receive = [len(class_slots(specs_per_rank[p], cls)) * batch_size for p in peers]
        stage = comm.all_to_all_single(
            stage,
            input_split_sizes=[len(mine) * batch_size] * num_hosts,
            output_split_sizes=receive,
            group=hosts.cross,
        )
    out, offset = {}, 0
    for peer in peers:
        for slot in class_slots(specs_per_rank[peer], cls):
            out[slot.unit.index] = stage[offset : offset + batch_size]
            offset += batch_size
    return out
