"""Tables and modules the planner tests share.

Modules are shardkit's `EmbeddingBagCollection` on the meta device (no memory); `StandInEBC`
is a module type with the same interface that no default sharder knows.
"""

from __future__ import annotations

import torch
from torch import nn

from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.planner import BaseEmbeddingSharder, ParameterConstraints, ShardingType

SEED_TABLE_NAMES = ["large_table_0", "large_table_1", "small_table_0", "small_table_1"]


def seed_tables() -> list[EmbeddingBagConfig]:
    """Seed 000/001: two 4096 x 64 and two 1024 x 64 tables."""
    large = [
        EmbeddingBagConfig(
            name=f"large_table_{i}",
            embedding_dim=64,
            num_embeddings=4096,
            feature_names=[f"large_table_feature_{i}"],
        )
        for i in range(2)
    ]
    small = [
        EmbeddingBagConfig(
            name=f"small_table_{i}",
            embedding_dim=64,
            num_embeddings=1024,
            feature_names=[f"small_table_feature_{i}"],
        )
        for i in range(2)
    ]
    return large + small


def gen_constraints(sharding_type: ShardingType) -> dict[str, ParameterConstraints]:
    """The seed's gen_constraints: one sharding type for every table."""
    return {
        name: ParameterConstraints(sharding_types=[sharding_type.value])
        for name in SEED_TABLE_NAMES
    }


def meta_ebc(tables, **kwargs) -> EmbeddingBagCollection:
    """An `EmbeddingBagCollection` of ``tables`` that allocates nothing."""
    return EmbeddingBagCollection(tables=tables, device="meta", **kwargs)


class _Bag(nn.Module):
    def __init__(self, config: EmbeddingBagConfig, device: str) -> None:
        super().__init__()
        shape = (config.num_embeddings, config.embedding_dim)
        self.weight = nn.Parameter(torch.empty(shape, device=device))


class StandInEBC(nn.Module):
    """The planner-facing interface of an EmbeddingBagCollection, as another module type."""

    def __init__(self, tables, is_weighted: bool = False, device: str = "meta") -> None:
        super().__init__()
        self._configs = list(tables)
        self._is_weighted = is_weighted
        self.embedding_bags = nn.ModuleDict({t.name: _Bag(t, device) for t in tables})

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return list(self._configs)

    def is_weighted(self) -> bool:
        return self._is_weighted


class StandInSharder(BaseEmbeddingSharder):
    @property
    def module_type(self) -> type[nn.Module]:
        return StandInEBC


class Model(nn.Module):
    """A dense layer and two embedding collections in submodules."""

    def __init__(self, first, second) -> None:
        super().__init__()
        self.dense = nn.Linear(1000, 1000, device="meta")  # 1,001,000 parameters, 4 MB
        self.sparse = nn.ModuleDict({"ebc": meta_ebc(first), "other": meta_ebc(second)})


def assert_tiles(plan, tables, world_size: int, local_world_size: int | None = None) -> None:
    """Every table's shards cover it exactly once, on valid ranks, laid out as their type says."""
    local = local_world_size or world_size
    for path_plan in plan.plan.values():
        assert set(path_plan) <= {t.name for t in tables}
    by_name = {t.name: t for t in tables}
    found = {name for module in plan.plan.values() for name in module}
    assert found == set(by_name), f"tables missing from the plan: {set(by_name) - found}"
    for module in plan.plan.values():
        for name, sharding in module.items():
            _assert_table_tiles(by_name[name], sharding, world_size, local)


def _assert_table_tiles(table, sharding, world_size, local) -> None:
    rows, cols = table.num_embeddings, table.embedding_dim
    kind = sharding.sharding_type
    if kind == ShardingType.DATA_PARALLEL:
        assert sharding.sharding_spec is None and sharding.ranks == list(range(world_size))
        return
    shards = sharding.sharding_spec.shards
    covered = set()
    area = 0
    for shard in shards:
        (r0, c0), (nr, nc) = shard.shard_offsets, shard.shard_sizes
        assert nr > 0 and nc > 0 and r0 + nr <= rows and c0 + nc <= cols, (table.name, shard)
        assert 0 <= shard.placement.rank() < world_size
        covered.add((r0, c0))
        area += nr * nc
    assert area == rows * cols, f"{table.name}: shards cover {area} of {rows * cols} cells"
    assert len(covered) == len(shards), f"{table.name}: two shards start at the same cell"
    _assert_disjoint(table.name, shards)
    ranks = sharding.ranks
    if kind == ShardingType.TABLE_WISE:
        assert len(shards) == 1
    elif kind == ShardingType.ROW_WISE:
        assert ranks == list(range(world_size))
    elif kind in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        assert len(set(ranks)) == len(ranks) and all(s.shard_sizes[0] == rows for s in shards)
    if kind in (ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE):
        assert len({r // local for r in ranks}) == 1, f"{table.name}: one host only, got {ranks}"


def _assert_disjoint(name, shards) -> None:
    boxes = sorted(
        (s.shard_offsets[0], s.shard_offsets[1], s.shard_sizes[0], s.shard_sizes[1]) for s in shards
    )
    for i, (r0, c0, nr, nc) in enumerate(boxes):
        for r1, c1, mr, mc in boxes[i + 1 :]:
            overlap = r0 < r1 + mr and r1 < r0 + nr and c0 < c1 + mc and c1 < c0 + nc
            assert not overlap, f"{name}: shards at {(r0, c0)} and {(r1, c1)} overlap"
