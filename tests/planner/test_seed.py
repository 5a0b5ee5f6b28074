"""Seeds 000/001: four tables on two ranks, one sharding type forced per run, print exactly as
the tutorial shows."""

from __future__ import annotations

import pytest

from shardkit.planner import EmbeddingShardingPlanner, ShardingType, Topology
from shardkit.sharding import EmbeddingBagCollectionSharder
from tests.planner._helpers import gen_constraints, meta_ebc, seed_tables
from tests.planner._seed_plans import SEED_PLANS, check_readable, tutorial_text


def _plan(sharding_type: ShardingType, device: str, world_size: int = 2, local: int | None = None):
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, compute_device=device, local_world_size=local),
        constraints=gen_constraints(sharding_type),
    )
    return planner.plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])


@pytest.mark.parametrize("name", sorted(SEED_PLANS))
def test_forced_sharding_type_prints_the_seed_plan_on_gpus(name):
    plan = _plan(ShardingType[name], "cuda")
    assert tutorial_text(plan) == SEED_PLANS[name]
    check_readable(plan)


@pytest.mark.parametrize("name", sorted(SEED_PLANS))
def test_forced_sharding_type_prints_the_seed_plan_on_cpus(name):
    expected = SEED_PLANS[name].replace("/cuda:0", "/cpu").replace("/cuda:1", "/cpu")
    plan = _plan(ShardingType[name], "cpu")
    assert tutorial_text(plan) == expected
    check_readable(plan)


def test_table_wise_puts_one_large_and_one_small_table_on_each_rank():
    plan = _plan(ShardingType.TABLE_WISE, "cpu").plan[""]
    by_rank = {0: [], 1: []}
    for name, sharding in plan.items():
        by_rank[sharding.ranks[0]].append(name.split("_")[0])
    assert sorted(by_rank[0]) == sorted(by_rank[1]) == ["large", "small"]


def test_table_row_wise_keeps_each_table_inside_one_host():
    plan = _plan(ShardingType.TABLE_ROW_WISE, "cuda", world_size=4, local=2).plan[""]
    hosts = set()
    for name, sharding in plan.items():
        rows = 4096 if name.startswith("large") else 1024
        shards = sharding.sharding_spec.shards
        assert [s.shard_sizes for s in shards] == [[rows // 2, 64]] * 2
        assert [s.shard_offsets for s in shards] == [[0, 0], [rows // 2, 0]]
        assert sharding.ranks in ([0, 1], [2, 3])
        hosts.add(sharding.ranks[0] // 2)
    assert hosts == {0, 1}  # the four tables are spread over both hosts
