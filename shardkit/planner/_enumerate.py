"""Every way to shard each table (sharding type x kernel x shard sizes), with its estimates.

An `Option` describes its shards run-length encoded (`Kind`: ``count`` shards of ``rows x
cols``; `Groups`: ``count`` shards of ``size`` rows or columns, from `split_evenly`, see
[Note: even splits]), so a row-wise option over 1,024 ranks is two kinds, not 1,024 shards.
Options that cannot work are not enumerated; the reason is kept for error messages.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from shardkit.planner._errors import format_bytes
from shardkit.planner._estimate import ShardCost, estimate_shard
from shardkit.planner._inputs import Topology
from shardkit.planner._tables import TableSpec
from shardkit.types import EmbeddingComputeKernel, ShardingType

__all__ = [
    "TYPE_ORDER",
    "Groups",
    "Kind",
    "Option",
    "Partition",
    "Rejection",
    "enumerate_options",
    "expand",
    "offsets_of",
    "size_groups",
    "table_options",
]


# Run-length encoded sizes: ((count, size), ...), in shard order, counts > 0.
Groups = tuple[tuple[int, int], ...]


class Partition(enum.Enum):
    """How an option's shards are placed on ranks."""

    DEVICE = "device"  # each shard on some rank, a table's shards on distinct ranks (TW, CW)
    HOST = "host"  # all shards on ranks of one host (TWRW: local rank i gets shard i; TWCW)
    GRID = "grid"  # each column block row-wise over one host, blocks on distinct hosts
    UNIFORM = "uniform"  # shard i on rank i, every rank (RW, DP)


_PARTITION = {
    ShardingType.TABLE_WISE: Partition.DEVICE,
    ShardingType.COLUMN_WISE: Partition.DEVICE,
    ShardingType.TABLE_COLUMN_WISE: Partition.HOST,
    ShardingType.TABLE_ROW_WISE: Partition.HOST,
    ShardingType.GRID_SHARD: Partition.GRID,
    ShardingType.ROW_WISE: Partition.UNIFORM,
    ShardingType.DATA_PARALLEL: Partition.UNIFORM,
}
# Preference among options of equal cost: simpler layouts first.
TYPE_ORDER = {t: i for i, t in enumerate(_PARTITION)}
_KERNEL_ORDER = {EmbeddingComputeKernel.FUSED: 0, EmbeddingComputeKernel.DENSE: 1}


@dataclass(frozen=True, slots=True)
class Kind:
    """``count`` consecutive shards of ``rows x cols``, each estimated at ``cost``."""

    count: int
    rows: int
    cols: int
    cost: ShardCost


@dataclass(frozen=True, slots=True)
class Option:
    """One way to shard table number ``table``: its shards (in order) and their estimates."""

    table: int
    sharding_type: ShardingType
    kernel: EmbeddingComputeKernel
    partition: Partition
    row_groups: Groups
    col_groups: Groups
    kinds: tuple[Kind, ...]
    num_shards: int
    total_cost: float
    max_cost: float
    max_memory: int
    total_memory: int

    @property
    def tiebreak(self) -> tuple[int, int, int]:
        return (TYPE_ORDER[self.sharding_type], _KERNEL_ORDER[self.kernel], self.num_shards)

    def shards(self) -> list[Kind]:
        """One entry per shard, in shard order."""
        return [kind for kind in self.kinds for _ in range(kind.count)]


@dataclass(frozen=True)
class Rejection:
    """A (sharding type, kernel) that cannot work for a table, and why."""

    sharding_type: ShardingType
    reason: str
    needs: int | None = None  # bytes per rank of its smallest shard layout, when memory is why


def enumerate_options(
    tables: Sequence[TableSpec], topology: Topology, available: int
) -> tuple[list[list[Option]], list[list[Rejection]]]:
    """Per table: its options, cheapest total cost first, and what was rejected."""
    options, rejections = [], []
    for index, table in enumerate(tables):
        kept, rejected = table_options(index, table, topology, available, table.choices)
        kept.sort(key=lambda o: (o.total_cost, o.tiebreak))
        options.append(kept)
        rejections.append(rejected)
    return options, rejections


def table_options(
    index: int,
    table: TableSpec,
    topology: Topology,
    available: int,
    choices: Sequence[tuple[ShardingType, Sequence[EmbeddingComputeKernel]]],
) -> tuple[list[Option], list[Rejection]]:
    kept: list[Option] = []
    rejected: list[Rejection] = []
    for sharding_type, kernels in choices:
        layouts = _layouts(table, sharding_type, topology)
        if isinstance(layouts, str):
            rejected.append(Rejection(sharding_type, layouts))
            continue
        kernels, refused = _row_norm_kernels(table, sharding_type, kernels)
        if not kernels:
            rejected.append(Rejection(sharding_type, refused))
            continue
        for kernel in kernels:
            built = [
                _option(index, table, sharding_type, kernel, rg, cg, topology) for rg, cg in layouts
            ]
            fits = [o for o in built if o.max_memory <= available]
            kept.extend(fits)
            if not fits:
                least = min(o.max_memory for o in built)
                rejected.append(
                    Rejection(sharding_type, _too_big(sharding_type, least, available), least)
                )
    return kept, rejected


def _too_big(sharding_type: ShardingType, needs: int, available: int) -> str:
    return (
        f"{sharding_type.value} needs {format_bytes(needs)} on a rank, more than the "
        f"{format_bytes(available)} a rank has for tables"
    )


def _row_norm_kernels(
    table: TableSpec, sharding_type: ShardingType, kernels: Sequence[EmbeddingComputeKernel]
) -> tuple[list[EmbeddingComputeKernel], str]:
    """The kernels ``sharding_type`` may use for ``table``, and why any was dropped.

    The FUSED kernel steps with the table's fused optimizer; where that rule scales a row's step
    by norms over the whole row (LAMB, LARS_SGD, PARTIAL_ROWWISE_LAMB), a shard holding part of
    each row's columns would step unlike the unsharded table, so column-splitting types lose the
    FUSED kernel. The DENSE kernel's optimizer is the user's, not the fused rule: it stays (a
    dense LAMB over column shards is refused by that optimizer itself, see
    [Note: layer-wise rules per row]).
    """
    if not (table.optimizer.scales_by_row_norms and sharding_type in _SPLIT_COLUMNS):
        return list(kernels), ""
    kept: list[EmbeddingComputeKernel] = [k for k in kernels if k != EmbeddingComputeKernel.FUSED]
    return kept, (
        f"{sharding_type.value} splits each row's columns over shards, and the fused "
        f"optimizer {table.optimizer.name} scales a row's step by norms over the whole row "
        "(the DENSE kernel, whose optimizer is yours, may split them: allow it with "
        "compute_kernels=['dense'])"
    )


def _layouts(table: TableSpec, sharding_type: ShardingType, topology: Topology) -> list | str:
    """[(row_groups, col_groups), ...] this type can use for the table, or why none."""
    rows, dim = table.num_embeddings, table.embedding_dim
    world, local, hosts = topology.world_size, topology.intra_group_size, topology.num_hosts
    whole_rows, whole_cols = ((1, rows),), ((1, dim),)
    widest = dim // table.min_partition  # most column shards of >= min_partition columns
    if sharding_type in (ShardingType.TABLE_WISE, ShardingType.DATA_PARALLEL):
        return [(whole_rows, whole_cols)]
    if sharding_type == ShardingType.ROW_WISE:
        if rows < world:
            return f"row_wise needs num_embeddings ({rows}) >= world_size ({world})"
        return [(size_groups(rows, world), whole_cols)]
    if sharding_type == ShardingType.COLUMN_WISE:
        most = min(world, widest)
        if most < 2:  # TorchRec's rule: shards of min(min_partition, dim) columns, so one
            return [(whole_rows, whole_cols)]
        return [(whole_rows, size_groups(dim, k)) for k in range(2, most + 1)]
    if local < 2:
        return f"{sharding_type.value} needs local_world_size >= 2 ranks per host, got {local}"
    if sharding_type == ShardingType.TABLE_COLUMN_WISE:
        most = min(local, widest)
        if most < 2:
            return _cw_reason("table_column_wise", table, "local_world_size", local)
        return [(whole_rows, size_groups(dim, k)) for k in range(2, most + 1)]
    if rows < local:
        return f"{sharding_type.value} needs num_embeddings ({rows}) >= local_world_size ({local})"
    if sharding_type == ShardingType.TABLE_ROW_WISE:
        return [(size_groups(rows, local), whole_cols)]
    assert sharding_type == ShardingType.GRID_SHARD
    most = min(hosts, widest)
    if most < 2:
        return _cw_reason("grid_shard", table, "num_hosts", hosts)
    return [(size_groups(rows, local), size_groups(dim, k)) for k in range(2, most + 1)]


# Types whose shards hold part of each row's columns.
_SPLIT_COLUMNS = (
    ShardingType.COLUMN_WISE,
    ShardingType.TABLE_COLUMN_WISE,
    ShardingType.GRID_SHARD,
)


def _cw_reason(name: str, table: TableSpec, over: str, count: int) -> str:
    return (
        f"{name} needs 2 or more column shards of >= min_partition ({table.min_partition}) "
        f"columns over {over} ({count}) ranks; embedding_dim is {table.embedding_dim}"
    )


def _option(
    index: int,
    table: TableSpec,
    sharding_type: ShardingType,
    kernel: EmbeddingComputeKernel,
    row_groups: Groups,
    col_groups: Groups,
    topology: Topology,
) -> Option:
    runs = _runs(sharding_type, row_groups, col_groups, topology.world_size)
    memo: dict[tuple[int, int], ShardCost] = {}
    kinds = []
    for count, rows, cols in runs:
        cost = memo.get((rows, cols))
        if cost is None:
            cost = memo[rows, cols] = estimate_shard(
                table, sharding_type, kernel, rows, cols, topology
            )
        kinds.append(Kind(count, rows, cols, cost))
    return Option(
        table=index,
        sharding_type=sharding_type,
        kernel=kernel,
        partition=_PARTITION[sharding_type],
        row_groups=row_groups,
        col_groups=col_groups,
        kinds=tuple(kinds),
        num_shards=sum(k.count for k in kinds),
        total_cost=sum(k.count * k.cost.total for k in kinds),
        max_cost=max(k.cost.total for k in kinds),
        max_memory=max(k.cost.memory for k in kinds),
        total_memory=sum(k.count * k.cost.memory for k in kinds),
    )


def _runs(
    sharding_type: ShardingType, row_groups: Groups, col_groups: Groups, world_size: int
) -> list[tuple[int, int, int]]:
    """(count, rows, cols) runs in shard order: column blocks, each cut into its row shards."""
    if sharding_type == ShardingType.DATA_PARALLEL:
        return [(world_size, row_groups[0][1], col_groups[0][1])]
    runs: list[tuple[int, int, int]] = []
    for num_blocks, cols in col_groups:
        for _ in range(num_blocks if len(row_groups) > 1 else 1):
            for count, rows in row_groups:
                count = count if len(row_groups) > 1 else count * num_blocks
                if runs and runs[-1][1:] == (rows, cols):
                    runs[-1] = (runs[-1][0] + count, rows, cols)
                else:
                    runs.append((count, rows, cols))
    return runs


def size_groups(total: int, parts: int) -> Groups:
    """`split_evenly` as run-length groups: 10 on 3 -> ((1, 4), (2, 3))."""
    base, extra = divmod(total, parts)
    groups = ((extra, base + 1), (parts - extra, base))
    return tuple(group for group in groups if group[0] > 0)


def expand(groups: Groups) -> list[int]:
    """((1, 4), (2, 3)) -> [4, 3, 3]."""
    return [size for count, size in groups for _ in range(count)]


def offsets_of(sizes: list[int]) -> list[int]:
    """Where each shard starts: [4, 3, 3] -> [0, 4, 7]."""
    offsets, running = [], 0
    for size in sizes:
        offsets.append(running)
        running += size
    return offsets
