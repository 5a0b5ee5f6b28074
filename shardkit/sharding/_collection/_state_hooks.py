"""A sharded collection's tables and state dict: `ShardedTable` holds this rank's shards of one
table; the hooks turn them into one ``ShardedTensor`` per table and back.

See [Note: sharded state dicts] (`_collection._state.py`).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from shardkit.sharding._collection._state import block_of, sharded_tensor
from shardkit.sharding._layout import ShardSlice

__all__ = ["ShardedTable", "load_state_dict_pre_hook", "state_dict_hook"]


class ShardedTable(nn.Module):
    """This rank's shards of one table (``shards[k]`` is a view of a kernel group's stack)."""

    def __init__(self, shards: list[ShardSlice], params: list[nn.Parameter]) -> None:
        super().__init__()
        self.shard_slices = shards
        self.shards = nn.ParameterList(params)

    def extra_repr(self) -> str:
        blocks = [
            f"rows {s.row_start}+{s.rows}, cols {s.col_start}+{s.cols}" for s in self.shard_slices
        ]
        return "; ".join(blocks) or "no shard on this rank"


def load_state_dict_pre_hook(collection: Any, state_dict: dict, prefix: str) -> None:
    """``<tables>.<t>.weight`` -> the replica's key, or this rank's blocks of each shard."""
    tables = collection._TABLES
    for name in collection._local_tables:
        key = f"{prefix}{tables}.{name}.weight"
        if key in state_dict:
            state_dict[f"{prefix}_local.{tables}.{name}.weight"] = state_dict[key]
    for config, table in collection._sharded_tables():
        key = f"{prefix}{tables}.{config.name}.weight"
        if key not in state_dict:
            continue
        value = state_dict.pop(key)
        for k, slice_ in enumerate(table.shard_slices):
            state_dict[f"{prefix}{tables}.{config.name}.shards.{k}"] = block_of(value, slice_, key)


def state_dict_hook(collection: Any, state_dict: dict, prefix: str, _meta: Any) -> None:
    """Each sharded table as one ``<tables>.<t>.weight`` ShardedTensor."""
    # data-parallel tables appear once, as <tables>.<t>.weight (not also under _local)
    for key in [k for k in state_dict if k.startswith(f"{prefix}_local.")]:
        del state_dict[key]
    tables = collection._TABLES
    for config, table in collection._sharded_tables():
        for k in range(len(table.shards)):
            del state_dict[f"{prefix}{tables}.{config.name}.shards.{k}"]
        local = [(s, p.detach()) for s, p in zip(table.shard_slices, table.shards)]
        state_dict[f"{prefix}{tables}.{config.name}.weight"] = sharded_tensor(
            (config.num_embeddings, config.embedding_dim),
            collection.table_shards(config.name),
            local,
            collection._device,
            collection._env.pg,
        )
