"""collective_plan: plan on rank 0, broadcast; every rank gets the same plan, or the same error."""

from __future__ import annotations

from shardkit.planner import (
    EmbeddingShardingPlanner,
    ParameterConstraints,
    PlannerError,
    ShardingType,
    Topology,
)
from shardkit.sharding import EmbeddingBagCollectionSharder
from tests.planner._helpers import gen_constraints, meta_ebc, seed_tables


def _collective(rank, world_size, constraints, with_topology):
    topology = Topology(world_size=world_size, compute_device="cpu") if with_topology else None
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints, debug=False)
    try:
        plan = planner.collective_plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    except (PlannerError, ValueError) as exc:
        return type(exc).__name__, str(exc), getattr(exc, "error_type", None)
    return plan.to_json(), str(plan), planner.stats


def test_every_rank_gets_rank_zeros_plan(run_ranks):
    results = run_ranks(_collective, 2, gen_constraints(ShardingType.COLUMN_WISE), True)
    assert results[0] == results[1]
    plan_json, text, stats = results[0]
    assert "column_wise" in text and stats.world_size == 2
    expected = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu"),
        constraints=gen_constraints(ShardingType.COLUMN_WISE),
    ).plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    assert plan_json == expected.to_json()


def test_topology_defaults_to_the_process_group(run_ranks):
    results = run_ranks(_collective, 2, None, False)
    assert results[0] == results[1] and results[0][2].world_size == 2
    assert results[0][2].compute_device == "cpu"


def test_a_planning_error_reaches_every_rank(run_ranks):
    constraints = {"large_table_0": ParameterConstraints(sharding_types=["grid_shard"])}
    results = run_ranks(_collective, 2, constraints, True)
    assert results[0] == results[1]
    name, message, error_type = results[0]
    assert name == "PlannerError" and "grid_shard needs" in message and error_type is not None


def _mismatch(rank, world_size):
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=4, compute_device="cpu"))
    try:
        planner.collective_plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    except ValueError as exc:
        return str(exc)
    return "planned"


def test_a_topology_for_other_ranks_is_refused_on_every_rank(run_ranks):
    results = run_ranks(_mismatch, 2)
    assert results == [results[0]] * 2
    assert results[0].startswith(
        "topology.world_size (4) differs from the process group's size (2)"
    )


def test_collective_plan_without_a_process_group_says_so():
    import pytest

    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"))
    with pytest.raises(
        RuntimeError,
        match=r"collective_plan needs a process group: call torch.distributed.init_process_group\(\)",
    ):
        planner.collective_plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])


def _no_sharders(rank, world_size):
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"))
    try:
        planner.collective_plan(meta_ebc(seed_tables()))
    except ValueError as exc:
        return str(exc)
    return "planned"


def test_missing_sharders_are_refused_on_every_rank(run_ranks):
    results = run_ranks(_no_sharders, 2)
    assert results == [results[0]] * 2 and results[0].startswith("collective_plan needs sharders")
