"""Writing plans by hand, TorchRec's way: ``construct_module_sharding_plan`` with one generator
per table (`table_wise`, `row_wise`, `column_wise`, `table_row_wise`, `grid_shard`,
`data_parallel`).

Example::

    plan = construct_module_sharding_plan(
        ebc,
        {"t0": table_wise(rank=1), "t1": row_wise(), "t2": column_wise(ranks=[0, 1, 2])},
        world_size=4,
    )

Rows and columns split as evenly as possible (see [Note: even splits] in the planner), so
every shard layout tiles its table exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from shardkit.launch import local_world_size
from shardkit.sharding._embedding_sharders import (
    EmbeddingBagCollectionSharder,
    EmbeddingCollectionSharder,
)
from shardkit.sharding._fp_embeddingbag import FeatureProcessedEmbeddingBagCollectionSharder
from shardkit.sharding._mc_embedding import (
    ManagedCollisionEmbeddingBagCollectionSharder,
    ManagedCollisionEmbeddingCollectionSharder,
)
from shardkit.types import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ModuleSharder,
    ParameterSharding,
    ShardingType,
    ShardMetadata,
    placement,
    split_evenly,
)

__all__ = [
    "ParameterShardingGenerator",
    "apply_to_all",
    "column_wise",
    "construct_module_sharding_plan",
    "data_parallel",
    "get_default_sharders",
    "grid_shard",
    "row_wise",
    "table_row_wise",
    "table_wise",
]

# (param, local_size, world_size, device_type, sharder) -> ParameterSharding
ParameterShardingGenerator = Callable[
    [nn.Parameter, int, int, str, ModuleSharder], ParameterSharding
]


def get_default_sharders() -> list[ModuleSharder]:
    """A sharder for each of shardkit's embedding collections (TorchRec's defaults)."""
    return [
        EmbeddingBagCollectionSharder(),
        FeatureProcessedEmbeddingBagCollectionSharder(),
        EmbeddingCollectionSharder(),
        ManagedCollisionEmbeddingBagCollectionSharder(),
        ManagedCollisionEmbeddingCollectionSharder(),
    ]


def data_parallel(compute_kernel: str | None = None) -> ParameterShardingGenerator:
    """A full replica of the table on every rank.

    ``compute_kernel``: ``"dense"`` (the default, as TorchRec: dense gradients all-reduced by
    DDP and stepped by your optimizer) or ``"fused"`` (shardkit only: the sharder's fused
    optimizer runs in backward and only the rows a batch touched are exchanged and updated;
    see [Note: sparse data-parallel tables] in `shardkit.sharding._collection._replicas`).
    """
    kernel = EmbeddingComputeKernel.parse(compute_kernel or EmbeddingComputeKernel.DENSE)

    def generate(param, local_size, world_size, device_type, sharder) -> ParameterSharding:
        ranks = list(range(world_size))
        return ParameterSharding(ShardingType.DATA_PARALLEL, kernel, ranks)

    return generate


def table_wise(
    rank: int, device: str | None = None, compute_kernel: str | None = None
) -> ParameterShardingGenerator:
    """The whole table on ``rank`` (on ``device``, default the plan's device type)."""

    def generate(param, local_size, world_size, device_type, sharder) -> ParameterSharding:
        _check_rank("table_wise", rank, world_size)
        rows, cols = param.shape
        blocks = [((0, 0), (rows, cols), rank)]
        return _sharding(
            ShardingType.TABLE_WISE, blocks, local_size, device or device_type, compute_kernel
        )

    return generate


def row_wise(
    sizes_placement: object = None, compute_kernel: str | None = None
) -> ParameterShardingGenerator:
    """Rows split as evenly as possible over all ranks, shard ``i`` on rank ``i``.

    ``sizes_placement`` (TorchRec's uneven placements for inference) is not supported.
    """
    if sizes_placement is not None:
        raise ValueError(
            "row_wise(sizes_placement=...) places uneven shards for inference, which shardkit "
            "does not support; row_wise() splits the rows evenly over all ranks"
        )

    def generate(param, local_size, world_size, device_type, sharder) -> ParameterSharding:
        rows, cols = param.shape
        if rows < world_size:
            raise ValueError(
                f"row_wise sharding needs num_embeddings ({rows}) >= world_size ({world_size}); "
                "use table_wise or table_row_wise"
            )
        blocks = _row_blocks(rows, cols, 0, list(range(world_size)))
        return _sharding(ShardingType.ROW_WISE, blocks, local_size, device_type, compute_kernel)

    return generate


def column_wise(
    ranks: Sequence[int] | None = None,
    size_per_rank: Sequence[int] | None = None,
    compute_kernel: str | None = None,
) -> ParameterShardingGenerator:
    """Columns split over ``ranks`` (as evenly as possible, a rank may repeat), or
    ``size_per_rank[i]`` columns on rank ``i``."""
    if (ranks is None) == (size_per_rank is None):
        raise ValueError("column_wise needs exactly one of ranks=[...] or size_per_rank=[...]")

    def generate(param, local_size, world_size, device_type, sharder) -> ParameterSharding:
        rows, cols = param.shape
        if size_per_rank is not None:
            widths, owners = list(size_per_rank), list(range(len(size_per_rank)))
            if sum(widths) != cols or min(widths) < 1:
                raise ValueError(
                    f"column_wise size_per_rank {widths} must be >= 1 each and sum to the "
                    f"table's {cols} columns"
                )
        else:
            assert ranks is not None, "checked above: exactly one of ranks and size_per_rank"
            owners = list(ranks)
            if not owners or len(owners) > cols:
                raise ValueError(
                    f"column_wise needs 1 to {cols} ranks (one per shard), got {owners}"
                )
            widths = split_evenly(cols, len(owners))
        for rank in owners:
            _check_rank("column_wise", rank, world_size)
        blocks, start = [], 0
        for width, rank in zip(widths, owners):
            blocks.append(((0, start), (rows, width), rank))
            start += width
        return _sharding(ShardingType.COLUMN_WISE, blocks, local_size, device_type, compute_kernel)

    return generate


def table_row_wise(
    host_index: int, compute_kernel: str | None = None
) -> ParameterShardingGenerator:
    """Rows split as evenly as possible over the ranks of host ``host_index``."""

    def generate(param, local_size, world_size, device_type, sharder) -> ParameterSharding:
        rows, cols = param.shape
        owners = _host_ranks("table_row_wise", host_index, local_size, world_size, rows)
        blocks = _row_blocks(rows, cols, 0, owners)
        return _sharding(
            ShardingType.TABLE_ROW_WISE, blocks, local_size, device_type, compute_kernel
        )

    return generate


def grid_shard(
    host_indexes: Sequence[int], compute_kernel: str | None = None
) -> ParameterShardingGenerator:
    """Columns split into one block per host of ``host_indexes``; each block row-wise over
    that host's ranks."""

    def generate(param, local_size, world_size, device_type, sharder) -> ParameterSharding:
        rows, cols = param.shape
        if not host_indexes or len(host_indexes) > cols:
            raise ValueError(
                f"grid_shard needs 1 to {cols} hosts (one per column block), got {host_indexes}"
            )
        blocks, start = [], 0
        for width, host in zip(split_evenly(cols, len(host_indexes)), host_indexes):
            owners = _host_ranks("grid_shard", host, local_size, world_size, rows)
            for offsets, sizes, rank in _row_blocks(rows, width, start, owners):
                blocks.append((offsets, sizes, rank))
            start += width
        return _sharding(ShardingType.GRID_SHARD, blocks, local_size, device_type, compute_kernel)

    return generate


def apply_to_all(
    module: nn.Module,
    parameter_sharding_generator: ParameterShardingGenerator,
    sharder: ModuleSharder | None = None,
) -> dict[str, ParameterShardingGenerator]:
    """The same generator for every table of ``module``."""
    sharder = sharder or _default_sharder(module)
    return {name: parameter_sharding_generator for name in sharder.shardable_parameters(module)}


def construct_module_sharding_plan(
    module: nn.Module,
    per_param_sharding: Mapping[str, ParameterShardingGenerator],
    sharder: ModuleSharder | None = None,
    local_size: int | None = None,
    world_size: int | None = None,
    device_type: str | None = None,
) -> EmbeddingModuleShardingPlan:
    """The plan of one module from a generator per table (every table needs one).

    ``world_size`` and ``local_size`` default to the initialized process group's (and
    `shardkit.launch.local_world_size`); ``device_type`` to ``"cuda"`` with NCCL or an available GPU, else
    ``"cpu"``.
    """
    sharder = sharder or _default_sharder(module)
    if not isinstance(module, sharder.module_type):
        raise TypeError(
            f"{type(sharder).__name__} shards {sharder.module_type.__name__}, not {type(module).__name__}"
        )
    params = sharder.shardable_parameters(module)
    if set(params) != set(per_param_sharding):
        raise ValueError(
            f"per_param_sharding must name every table of the module exactly: missing "
            f"{sorted(set(params) - set(per_param_sharding))}, unknown "
            f"{sorted(set(per_param_sharding) - set(params))}"
        )
    world_size, local_size = _sizes(world_size, local_size)
    device_type = device_type or _device_type()
    plan = EmbeddingModuleShardingPlan()
    for name, param in params.items():
        plan[name] = per_param_sharding[name](param, local_size, world_size, device_type, sharder)
    return plan


def _default_sharder(module: nn.Module) -> ModuleSharder:
    for sharder in get_default_sharders():
        if type(module) is sharder.module_type:
            return sharder
    raise TypeError(f"no default sharder for {type(module).__name__}; pass sharder=...")


def _sizes(world_size: int | None, local_size: int | None) -> tuple[int, int]:
    if world_size is None:
        if not dist.is_initialized():
            raise ValueError(
                "construct_module_sharding_plan needs world_size=... when no process group is "
                "initialized"
            )
        world_size = dist.get_world_size()
        local_size = local_size or local_world_size(world_size)
    local_size = local_size or world_size
    if world_size < 1 or local_size < 1 or world_size % local_size:
        raise ValueError(
            f"world_size ({world_size}) must be a positive multiple of local_size ({local_size})"
        )
    return world_size, local_size


def _device_type() -> str:
    if dist.is_initialized():
        return "cuda" if dist.get_backend() == "nccl" else "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def _check_rank(name: str, rank: int, world_size: int) -> None:
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"{name}: rank {rank!r} is not in [0, world_size={world_size})")


def _host_ranks(name: str, host: int, local_size: int, world_size: int, rows: int) -> list[int]:
    num_hosts = world_size // local_size
    if not isinstance(host, int) or not 0 <= host < num_hosts:
        raise ValueError(
            f"{name}: host_index {host!r} is not in [0, {num_hosts}) ({num_hosts} hosts of {local_size} ranks)"
        )
    if rows < local_size:
        raise ValueError(
            f"{name} needs num_embeddings ({rows}) >= ranks per host ({local_size}); use table_wise"
        )
    return list(range(host * local_size, (host + 1) * local_size))


def _row_blocks(rows: int, cols: int, col_offset: int, owners: list[int]) -> list:
    blocks, start = [], 0
    for size, rank in zip(split_evenly(rows, len(owners)), owners):
        blocks.append(((start, col_offset), (size, cols), rank))
        start += size
    return blocks


def _sharding(
    sharding_type: ShardingType,
    blocks: list,
    local_size: int,
    device_type: str,
    compute_kernel: str | None,
) -> ParameterSharding:
    kernel = EmbeddingComputeKernel.parse(compute_kernel or EmbeddingComputeKernel.FUSED)
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    shards = [
        ShardMetadata(list(offsets), list(sizes), placement(device_type, rank, local_size))
        for offsets, sizes, rank in blocks
    ]
    ranks = [rank for _, _, rank in blocks]
    return ParameterSharding(sharding_type, kernel, ranks, EnumerableShardingSpec(shards))
