"""The stats table: per rank memory, cost and shards; per table layout; imbalance. Logged at
INFO after planning, and available as a string and as data."""

from __future__ import annotations

import json
import logging

import pytest

from shardkit.planner import EmbeddingShardingPlanner, ShardingType, Topology, plan_tables
from shardkit.planner._stats import format_ranks
from shardkit.sharding import EmbeddingBagCollectionSharder
from tests.planner._helpers import gen_constraints, meta_ebc, seed_tables


def test_stats_table_has_ranks_tables_and_imbalance():
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu"),
        constraints=gen_constraints(ShardingType.ROW_WISE),
    )
    planner.plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    stats = planner.stats
    text = str(stats)
    lines = text.splitlines()
    assert (
        lines[0]
        == "sharding plan: 4 tables on 2 ranks (1 host(s) x 2), cpu, batch size 512 per rank"
    )
    assert lines[1].startswith(
        "memory per rank: 128 GiB ddr, of which 19.2 GiB margin, 0 B dense model"
    )
    assert lines[2].startswith("imbalance (max/mean): cost 1.000, memory 1.000; max cost")
    header = next(i for i, line in enumerate(lines) if line.startswith("rank"))
    assert lines[header].split() == [
        "rank",
        "host",
        "memory",
        "%",
        "avail",
        "cost",
        "ms",
        "compute",
        "comms",
        "shards",
    ]
    assert [line.split()[0] for line in lines[header + 1 : header + 3]] == ["0", "1"]
    assert all(line.split()[-1] == "4" for line in lines[header + 1 : header + 3])  # 4 shards each
    table_rows = [line for line in lines if line.startswith(("large_table", "small_table"))]
    assert table_rows[0].split()[:10] == [
        "large_table_0", "4096", "x", "64", "row_wise", "batched_fused", "0-1", "2", "x", "[2048,",
    ]  # fmt: skip
    assert stats.cost_imbalance == pytest.approx(1.0) and stats.memory_imbalance == pytest.approx(
        1.0
    )
    assert [r.num_shards for r in stats.ranks] == [4, 4]
    assert stats.tables[2].shards == ((2, 512, 64),) and stats.tables[2].ranks == (0, 1)


def test_stats_are_logged_at_info(caplog):
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"))
    with caplog.at_level(logging.INFO, logger="shardkit.planner"):
        planner.plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    messages = [r.getMessage() for r in caplog.records if r.name.startswith("shardkit.planner")]
    assert len(messages) == 1 and "planned 4 tables on 2 ranks" in messages[0]
    assert str(planner.stats) in messages[0]


def test_debug_false_logs_nothing(caplog):
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu"), debug=False
    )
    with caplog.at_level(logging.INFO, logger="shardkit.planner"):
        planner.plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    assert not [r for r in caplog.records if r.name.startswith("shardkit.planner")]
    assert planner.stats is not None


def test_imbalance_is_max_over_mean():
    tables = seed_tables()[:1]
    constraints = {"large_table_0": gen_constraints(ShardingType.TABLE_WISE)["large_table_0"]}
    stats = plan_tables(
        tables, Topology(world_size=4, compute_device="cuda"), constraints=constraints
    ).stats
    costs = [r.cost for r in stats.ranks]
    assert (
        stats.cost_imbalance == pytest.approx(max(costs) / (sum(costs) / 4)) == pytest.approx(4.0)
    )
    assert sum(r.num_shards for r in stats.ranks) == 1


def test_stats_serialize_to_json():
    stats = plan_tables(seed_tables(), Topology(world_size=2, compute_device="cpu")).stats
    data = json.loads(json.dumps(stats.to_dict()))
    assert data["world_size"] == 2 and len(data["ranks"]) == 2 and len(data["tables"]) == 4
    assert data["available"] == stats.available and data["cost_imbalance"] == stats.cost_imbalance


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([0], "0"),
        ([0, 1, 2, 3], "0-3"),
        ([0, 1, 3, 5, 6, 7], "0-1,3,5-7"),
        ([2, 0], "2,0"),
        ([], ""),
    ],
)
def test_rank_lists_are_compact(ranks, text):
    assert format_ranks(ranks) == text
