"""The shards a rank stores, stacked into batched kernels, and the kernels' inputs.

[Note: kernel groups and output classes]
A rank's shards are stacked into one `BatchedTables` per *shard group* (`ShardGroup`; the
unsharded collection's `TableGroup` is the same idea for whole tables): shards with the same
route, number of columns, dtype and fused optimizer. An output *class* is (route, columns): every rank
takes part in one output collective per class that exists anywhere, in a fixed order, with
empty tensors where it holds nothing, so collectives always pair up. Within a class a rank's
rows are ordered by its groups (sorted by dtype, then optimizer), then by slot order; any rank
can compute that order for any other rank from the layout alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from shardkit.modules import BatchedTables, kernel_input, stack_tables
from shardkit.optim import FusedOptimizerConfig
from shardkit.optim.fused import EmptyFusedOptimizer
from shardkit.sharding._dist._input import Received
from shardkit.sharding._layout import Layout, Route, ShardSlice, Slot

__all__ = [
    "ShardGroup",
    "ShardGroupSpec",
    "class_slots",
    "classes",
    "shard_group_input",
    "shard_group_specs",
]

TableKey = tuple[torch.dtype, FusedOptimizerConfig | None]  # per table: dtype, fused optimizer


@dataclass(frozen=True)
class ShardGroupSpec:
    """A kernel group of one rank: which shards it stacks and which slots it serves."""

    route: Route
    cols: int
    dtype: torch.dtype
    config: FusedOptimizerConfig | None  # None: DENSE kernel (autograd gradients)
    shards: tuple[ShardSlice, ...]
    slots: tuple[Slot, ...]

    @property
    def output_class(self) -> tuple[Route, int]:
        return self.route, self.cols

    def sort_key(self) -> tuple:
        return (self.route.value, self.cols, str(self.dtype), repr(self.config))


def shard_group_specs(
    layout: Layout, rank: int, table_keys: Sequence[TableKey]
) -> list[ShardGroupSpec]:
    """The kernel groups of ``rank``, in the order every rank uses for it."""
    found: dict[tuple, tuple[list[ShardSlice], list[Slot]]] = {}
    for slot in layout.slots_to(rank):
        dtype, config = table_keys[slot.unit.table_index]
        key = (slot.unit.route, slot.shard.cols, dtype, config)
        shards, slots = found.setdefault(key, ([], []))
        if slot.shard not in shards:
            shards.append(slot.shard)
        slots.append(slot)
    specs = [
        ShardGroupSpec(route, cols, dtype, config, tuple(shards), tuple(slots))
        for (route, cols, dtype, config), (shards, slots) in found.items()
    ]
    return sorted(specs, key=ShardGroupSpec.sort_key)


def classes(layout: Layout) -> list[tuple[Route, int]]:
    """Every output class in the job, in the order all ranks run their collectives."""
    found = {(u.route, u.cols) for u in layout.units if u.route != Route.LOCAL}
    return sorted(found, key=lambda c: (c[0].value, c[1]))


def class_slots(specs: Sequence[ShardGroupSpec], output_class: tuple[Route, int]) -> list[Slot]:
    """A rank's slots in ``output_class``, in the order its rows are sent."""
    return [slot for spec in specs if spec.output_class == output_class for slot in spec.slots]


@dataclass
class ShardGroup:
    """A kernel group's storage on this rank: its stacked shards and their Parameters."""

    spec: ShardGroupSpec
    tables: BatchedTables
    params: list[nn.Parameter]

    def row_base(self, shard: ShardSlice) -> int:
        return self.tables.row_starts[self.spec.shards.index(shard)]


def build_shard_group(
    spec: ShardGroupSpec,
    device: torch.device,
    initial: Callable[[ShardSlice, torch.Tensor], None],
) -> ShardGroup:
    """Allocate the stacked shards on ``device``; ``initial(shard, view)`` fills each shard."""
    rows = [shard.rows for shard in spec.shards]
    tables = stack_tables(rows, spec.cols, dtype=spec.dtype, device=device, optimizer=spec.config)
    params = []
    for shard, view in zip(spec.shards, tables.table_views()):
        with torch.no_grad():
            initial(shard, view)
        param = nn.Parameter(view, requires_grad=True)
        param._shardkit_embedding_table = True  # type: ignore[attr-defined]
        if spec.config is not None:
            # TorchRec's marker: in_backward_optimizer_filter leaves this shard to the fused
            # optimizer (See [Note: in-backward markers] in shardkit.optim).
            param._in_backward_optimizers = [EmptyFusedOptimizer()]  # type: ignore[attr-defined]
        params.append(param)
    return ShardGroup(spec, tables, params)


def shard_group_input(
    shard_group: ShardGroup, received: Received
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The kernel's ``(ids, offsets, per-sample weights)`` for ``shard_group``'s slots, bags ordered
    (source, slot, bag): ids shifted from shard rows to rows of the group's stack."""
    slots = received.slots
    positions = [slots.index(s) for s in shard_group.spec.slots]
    if received.feature_rows is None:
        lengths = received.lengths[:, positions, :]  # [W, S_g, B]
    else:  # [W, bags of the S_g slots]: see [Note: variable batch on the wire]
        columns = _columns(received.slot_rows(), positions)
        if isinstance(columns, torch.Tensor):
            columns = columns.to(received.lengths.device, non_blocking=True)
        lengths = received.lengths[:, columns]
    counts = received.counts  # [W][S] ids per (source, slot), host-side
    bases = [shard_group.row_base(s.shard) for s in shard_group.spec.slots]
    chosen_counts = [per_source[p] for per_source in counts for p in positions]  # [W * S_g]
    if len(positions) == len(slots):
        values = received.values
        weights = received.weights
    else:
        index = _segments(counts, positions, received.values.device)
        values = received.values.index_select(0, index)
        weights = None if received.weights is None else received.weights.index_select(0, index)
    # one segment per (source, slot), each shifted by its shard's first row in the stack
    ids, offsets = kernel_input(
        values, lengths.reshape(-1), bases * lengths.shape[0], chosen_counts
    )
    return ids, offsets, weights


def _columns(rows: list[int], positions: list[int]) -> torch.Tensor | slice:
    """The bags of slots ``positions`` among slots of ``rows`` bags each, laid side by side:
    one ``arange`` per chosen slot, never one host entry per bag."""
    if positions == list(range(len(rows))):
        return slice(None)
    starts = [sum(rows[:p]) for p in range(len(rows))]
    pieces = [torch.arange(starts[p], starts[p] + rows[p]) for p in positions]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)


def _segments(counts: list[list[int]], positions: list[int], device: torch.device) -> torch.Tensor:
    """Indices into the received ids of the (source, slot) segments whose slot is in
    ``positions``, source by source, slot by slot. Sizes come from the host; only the index
    itself is built on ``device`` (see [Note: host-side sizes])."""
    flat = [n for per_source in counts for n in per_source]
    starts = [0]
    for n in flat[:-1]:
        starts.append(starts[-1] + n)
    num_slots = len(counts[0]) if counts else 0
    chosen = [w * num_slots + p for w in range(len(counts)) for p in positions]
    seg_counts = [flat[c] for c in chosen]
    # each segment's offset from its first id: its start in the received ids minus its start
    # in the output
    shifts, out_start = [], 0
    for c, n in zip(chosen, seg_counts):
        shifts.append(starts[c] - out_start)
        out_start += n
    total = out_start
    shift = torch.tensor(shifts, dtype=torch.int64).to(device, non_blocking=True)
    sizes = torch.tensor(seg_counts, dtype=torch.int64).to(device, non_blocking=True)
    within = torch.arange(total, dtype=torch.int64, device=device)
    return within + torch.repeat_interleave(shift, sizes, output_size=total)
