"""The plan of a managed-collision collection's tables, made fit for their remappers: row-wise
shards on bucket bounds, and remappers the sharded collection can drive (see [Note: sharded
managed collision] in `_mc_collection`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import nn

from shardkit.modules.mc_modules import ManagedCollisionModule, MCHManagedCollisionModule
from shardkit.types import ParameterSharding, ShardingType, validate_module_plan

__all__ = ["aligned_plan", "rebucketed"]

logger = logging.getLogger(__name__)


def aligned_plan(
    modules: Mapping[str, nn.Module], plan: Mapping[str, ParameterSharding], world_size: int
) -> dict[str, ParameterSharding]:
    """The plan with each row-wise table's shards moved onto its bucket bounds; refuses a
    sharding type managed collision cannot take, naming the table and what works."""
    validate_module_plan(plan)  # plans are mutable: an edited one is checked where applied
    out = {}
    for name, module in modules.items():
        sharding = plan[name]
        kind = sharding.sharding_type
        if kind not in (ShardingType.TABLE_WISE, ShardingType.ROW_WISE):
            raise ValueError(
                f"managed-collision table '{name}' cannot be sharded {kind.value}: its remapper "
                "must see every id of a row range on the rank that holds those rows; use "
                "row_wise or table_wise"
            )
        _check_remapper(name, module, kind)
        out[name] = sharding
        if kind == ShardingType.ROW_WISE:
            out[name] = _on_bucket_bounds(name, module, sharding, world_size)
    return out


def rebucketed(
    modules: Mapping[str, nn.Module], plan: Mapping[str, ParameterSharding], world_size: int
) -> dict[str, nn.Module]:
    """``modules`` with each row-wise MCH remapper of ONE bucket (the default) rebuilt with one
    bucket per rank, as TorchRec does (its sharded remappers get ``buckets = `` the number of
    row shards): each rank then remaps the ids of its bucket into its own rows. The sharded
    table then behaves as the unsharded module with ``buckets=world_size`` (ids compete for the
    rows of their rank's bucket, not for all rows). A remapper that already holds ids cannot be
    split so (its ids are not in the rows of their new buckets): that is refused."""
    out = dict(modules)
    for name, module in modules.items():
        kind = plan[name].sharding_type
        if (
            kind != ShardingType.ROW_WISE
            or world_size == 1
            or not isinstance(module, MCHManagedCollisionModule)
            or module.buckets() != 1
        ):
            continue
        if module.holds_ids():
            raise ValueError(
                f"managed-collision table '{name}': its remapper (1 bucket) already holds ids, "
                f"and row-wise over {world_size} ranks it needs one bucket per rank, which moves "
                "ids to other rows; shard it before training, or build its "
                f"MCHManagedCollisionModule with buckets= a multiple of {world_size}"
            )
        out[name] = module.rebuild_with_buckets(world_size)
        logger.info(
            "managed-collision table '%s': 1 bucket, row-wise over %d ranks: one bucket per rank "
            "(as TorchRec; the table behaves as with buckets=%d)",
            name, world_size, world_size,
        )  # fmt: skip
    return out


def _check_remapper(name: str, module: Any, kind: ShardingType) -> None:
    """Refuse a remapper the sharded collection cannot drive, before any collective: it calls
    a `ManagedCollisionModule`'s methods, and row-wise an MCH module's buckets."""
    if not isinstance(module, ManagedCollisionModule):
        raise TypeError(
            f"managed-collision table '{name}' has a {type(module).__name__} remapper, not a "
            "ManagedCollisionModule; the sharded collection rebuilds it per shard and calls "
            "its preprocess/profile/remap: subclass shardkit.modules.ManagedCollisionModule "
            "(e.g. MCHManagedCollisionModule)"
        )
    if kind == ShardingType.ROW_WISE and not isinstance(module, MCHManagedCollisionModule):
        raise TypeError(
            f"managed-collision table '{name}' is sharded row_wise, which splits its remapper's "
            f"buckets across ranks, but its {type(module).__name__} has no buckets; use an "
            "MCHManagedCollisionModule, or shard the table table_wise"
        )


def _on_bucket_bounds(
    name: str, module: Any, sharding: ParameterSharding, world_size: int
) -> ParameterSharding:
    buckets = module.buckets()
    if buckets % world_size:
        raise ValueError(
            f"managed-collision table '{name}' has {buckets} bucket(s), which {world_size} "
            "ranks cannot share row-wise (each rank holds whole buckets); build its "
            f"MCHManagedCollisionModule with buckets= a multiple of {world_size}, or shard it "
            "table_wise"
        )
    segments = module.output_segments()
    assert sharding.sharding_spec is not None, "row-wise shardings have a spec"
    shards = sorted(sharding.sharding_spec.shards, key=lambda s: s.shard_offsets[0])
    step = buckets // world_size
    moved = []
    for index, shard in enumerate(shards):
        start, end = segments[index * step], segments[(index + 1) * step]
        moved.append(type(shard)([start, 0], [end - start, shard.shard_sizes[1]], shard.placement))
    if [s.shard_offsets for s in moved] != [s.shard_offsets for s in shards]:
        logger.info(
            "managed-collision table '%s': row-wise shards start at rows %s (its bucket bounds) "
            "instead of %s",
            name, [s.shard_offsets[0] for s in moved], [s.shard_offsets[0] for s in shards],
        )  # fmt: skip
    spec = type(sharding.sharding_spec)(moved)
    return ParameterSharding(
        sharding.sharding_type, sharding.compute_kernel, [s.placement.rank() for s in moved], spec
    )
