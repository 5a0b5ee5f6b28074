"""The stats table: per rank memory, cost and shards; per table layout; imbalance. Logged at
INFO after planning, and available as a string and as data."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from shardkit.planner import EmbeddingShardingPlanner, ShardingType, Topology, _machine, plan_tables
from shardkit.planner._errors import format_bytes
from shardkit.sharding import EmbeddingBagCollectionSharder
from shardkit.types import format_ranks
from tests.planner._helpers import gen_constraints, meta_ebc, seed_tables

GIB = 1024**3


def test_stats_table_has_ranks_tables_and_imbalance():
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu", ddr_cap=128 * GIB),
        constraints=gen_constraints(ShardingType.ROW_WISE),
    )
    plan = planner.plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    stats = planner.stats
    text = str(stats)
    assert str(plan) == text and plan.stats is stats  # the plan prints its stats
    lines = text.splitlines()
    assert lines[0] == (
        "4 tables in 1 module(s) on 2 ranks (1 host(s) x 2), cpu, batch size 512 per rank"
    )
    assert lines[1] == "memory per rank: 128 GiB ddr (given)"
    assert lines[2].startswith("  of which 19.2 GiB margin, 0 B dense model")
    assert lines[3].startswith("imbalance (max/mean): cost 1.000, memory 1.000; max cost")
    header = next(i for i, line in enumerate(lines) if line.startswith("rank"))
    assert lines[header].split() == [
        "rank", "host", "memory", "%", "avail", "free", "cost", "ms", "compute", "comms", "shards",
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[header + 1 : header + 3]] == ["0", "1"]
    assert all(line.split()[-1] == "4" for line in lines[header + 1 : header + 3])  # 4 shards each
    assert "module (the model itself)" in lines
    table_rows = [line.split() for line in lines if line.startswith(("  large", "  small"))]
    assert table_rows[0][:10] == [
        "large_table_0", "4096", "x", "64", "row_wise", "fused", "0-1", "2", "x", "[2048,",
    ]  # fmt: skip
    assert len(table_rows) == 4
    assert stats.cost_imbalance == pytest.approx(1.0) and stats.memory_imbalance == pytest.approx(
        1.0
    )
    assert [r.num_shards for r in stats.ranks] == [4, 4]
    assert stats.tables[2].shards == ((2, 512, 64),) and stats.tables[2].ranks == (0, 1)


def test_stats_show_the_machines_memory_and_the_headroom(monkeypatch):
    """A 3 GiB machine, 2 ranks: 1.5 GiB each, 15% margin, the input batches; the rest is for
    tables, and each rank's row says how much of it its shards take and how much is left."""
    monkeypatch.setattr(_machine, "host_memory", lambda: 3 * GIB)
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"))
    plan = planner.plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    stats = planner.stats
    assert stats.capacity == 3 * GIB // 2 and stats.memory_source.startswith("this machine's 3 GiB")
    lines = str(plan).splitlines()
    assert lines[1] == "memory per rank: 1.5 GiB ddr (this machine's 3 GiB / 2 local ranks)"
    header = next(i for i, line in enumerate(lines) if line.startswith("rank"))
    for rank, line in zip(stats.ranks, lines[header + 1 : header + 3]):
        cells = line.split()
        share = 100 * rank.memory / stats.available
        assert float(cells[4]) == pytest.approx(share, rel=0.05) and share > 0.1
        free = stats.available - rank.memory
        assert " ".join(cells[5:7]) == format_bytes(free)
    assert f"({100 * stats.max_memory / stats.available:.2g}% of the memory for tables)" in lines[3]


def test_stats_of_a_module_plan_show_only_its_tables():
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu", ddr_cap=GIB), debug=False
    )
    model = torch.nn.ModuleDict(
        {"one": meta_ebc(seed_tables()[:2]), "two": meta_ebc(seed_tables()[2:])}
    )
    plan = planner.plan(model, [EmbeddingBagCollectionSharder()])
    text = str(plan)
    assert "4 tables in 2 module(s)" in text.splitlines()[0]
    assert text.index("module one") < text.index("  large_table_1") < text.index("module two")
    assert [t.module for t in planner.stats.tables] == ["one", "one", "two", "two"]
    assert [t.name for t in planner.stats.tables][:1] == ["large_table_0"]
    two = str(plan.plan["two"])
    assert "module two" in two and "module one" not in two and "large_table_0" not in two
    assert "  small_table_1" in two and two.splitlines()[0] == text.splitlines()[0]


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
