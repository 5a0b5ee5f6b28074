"""The planner's steps one at a time, for code that composes a planner of its own.

`shardkit.planner` offers the whole pipeline (`plan_tables`, `EmbeddingShardingPlanner`); this
module offers its parts, in the order the pipeline runs them: find the tables of a model
(`module_sources`) and resolve them with their constraints (`resolve_tables`, one `TableSpec`
each), enumerate the ways to shard each (`enumerate_options`, one `Option` each, estimated
shard by shard with `estimate_shard`), lay an option's shards out (`shard_layout`), and plan on
rank 0 for every rank (`plan_on_rank_zero`, over `process_group`). TorchRec's planner
components at the compatibility edge (``shardkit.distributed.planner``) are built from these.
"""

from shardkit.planner._collective import plan_on_rank_zero, process_group
from shardkit.planner._constants import NUM_POOLINGS
from shardkit.planner._enumerate import Option, enumerate_options
from shardkit.planner._estimate import estimate_shard
from shardkit.planner._partition import shard_layout
from shardkit.planner._tables import TableSpec, module_sources, resolve_tables

__all__ = [
    "NUM_POOLINGS",
    "Option",
    "TableSpec",
    "enumerate_options",
    "estimate_shard",
    "module_sources",
    "plan_on_rank_zero",
    "process_group",
    "resolve_tables",
    "shard_layout",
]
