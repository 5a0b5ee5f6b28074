"""The planner end to end: modules in, plans that tile every table and fit memory out;
deterministic; balanced; explained when nothing fits."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import torch

from shardkit.modules import EmbeddingBagConfig
from shardkit.optim import EmbOptimType
from shardkit.planner import (
    EmbeddingShardingPlanner,
    HeuristicalStorageReservation,
    ParameterConstraints,
    PlannerError,
    PlannerErrorType,
    ShardingType,
    Topology,
    estimate_plan,
    plan_tables,
)
from shardkit.sharding import EmbeddingBagCollectionSharder
from tests.planner._helpers import (
    Model,
    assert_tiles,
    meta_ebc,
    seed_tables,
)

MIB, GIB = 1024**2, 1024**3


def random_tables(count: int, seed: int = 0) -> list[EmbeddingBagConfig]:
    """Awkward sizes: row and column counts that divide nothing, from tiny to large."""
    rng = random.Random(seed)
    return [
        EmbeddingBagConfig(
            name=f"t{i}",
            num_embeddings=rng.choice([3, 7, 100, 1001, 65_537, 1_000_003]),
            embedding_dim=rng.choice([4, 33, 64, 100, 128, 257]),
            feature_names=[f"f{i}"],
        )
        for i in range(count)
    ]


def test_plan_walks_submodules_and_reserves_the_dense_model():
    model = Model(seed_tables()[:2], seed_tables()[2:])
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"))
    plan = planner.plan(model, [EmbeddingBagCollectionSharder()])
    assert list(plan.plan) == ["sparse.ebc", "sparse.other"]
    assert list(plan.plan["sparse.ebc"]) == ["large_table_0", "large_table_1"]
    assert planner.stats.dense == 1_001_000 * 4 * 6  # the Linear's parameters, 6x
    assert [t.table for t in planner.stats.tables][:1] == ["sparse.ebc.large_table_0"]
    assert_tiles(plan, seed_tables(), 2)


def test_a_module_without_tables_gets_an_empty_plan():
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu"))
    assert planner.plan(Model([], []).dense, [EmbeddingBagCollectionSharder()]).plan == {}


@pytest.mark.parametrize(("world", "local"), [(1, 1), (2, 2), (3, 3), (4, 2), (8, 4), (12, 4)])
def test_every_plan_tiles_every_table(world, local):
    tables = random_tables(24, seed=world)
    topology = Topology(world_size=world, compute_device="cuda", local_world_size=local)
    result = plan_tables(tables, topology)
    assert_tiles(result.plan, tables, world, local)
    assert result.stats.max_memory <= result.stats.available


@pytest.mark.parametrize("sharding_type", list(ShardingType))
def test_every_forced_sharding_type_tiles_uneven_tables(sharding_type):
    tables = [
        EmbeddingBagConfig(name="odd", num_embeddings=1001, embedding_dim=100, feature_names=["a"]),
        EmbeddingBagConfig(
            name="even", num_embeddings=4096, embedding_dim=128, feature_names=["b"]
        ),
    ]
    constraints = {t.name: ParameterConstraints(sharding_types=[sharding_type]) for t in tables}
    topology = Topology(world_size=6, compute_device="cuda", local_world_size=3)
    plan = plan_tables(tables, topology, constraints=constraints).plan
    assert {s.sharding_type for s in plan.plan[""].values()} == {sharding_type}
    assert_tiles(plan, tables, 6, 3)


def test_uneven_rows_split_four_three_three():
    table = EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=8, feature_names=["f"])
    constraints = {"t": ParameterConstraints(sharding_types=["row_wise"])}
    plan = plan_tables(
        [table], Topology(world_size=3, compute_device="cpu"), constraints=constraints
    )
    shards = plan.plan.plan[""]["t"].sharding_spec.shards
    assert [s.shard_sizes for s in shards] == [[4, 8], [3, 8], [3, 8]]
    assert [s.shard_offsets for s in shards] == [[0, 0], [4, 0], [7, 0]]


def test_same_inputs_same_plan():
    tables = random_tables(40, seed=3)
    topology = Topology(world_size=16, compute_device="cuda", local_world_size=8)
    first = plan_tables(tables, topology)
    second = plan_tables(list(tables), topology)
    assert first.plan.to_json() == second.plan.to_json() and first.stats == second.stats


_PLAN_IN_SUBPROCESS = """
import random, sys
from shardkit.modules import EmbeddingBagConfig
from shardkit.planner import Topology, plan_tables
rng = random.Random(5)
tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=rng.randint(10, 10**6),
          embedding_dim=rng.choice([16, 64, 128]), feature_names=[f"f{i}"]) for i in range(60)]
topology = Topology(world_size=32, compute_device="cuda", local_world_size=8)
sys.stdout.write(plan_tables(tables, topology).plan.to_json())
"""


def test_plan_does_not_depend_on_hash_seed():
    # the three processes at once: each is mostly start-up, and a test uses one core of two
    runs = [
        subprocess.Popen(
            [sys.executable, "-W", "ignore", "-c", _PLAN_IN_SUBPROCESS],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        )
        for seed in ("0", "1", "12345")
    ]
    plans = set()
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        plans.add(out)
    assert len(plans) == 1


def test_a_hot_table_is_split_instead_of_overloading_one_rank():
    tables = random_tables(16, seed=1)
    hot = EmbeddingBagConfig(
        name="hot", num_embeddings=100_000, embedding_dim=128, feature_names=["h"]
    )
    constraints = {"hot": ParameterConstraints(pooling_factors=[200.0])}
    topology = Topology(world_size=8, compute_device="cuda")
    result = plan_tables([*tables, hot], topology, constraints=constraints)
    assert result.plan.plan[""]["hot"].sharding_type != ShardingType.TABLE_WISE
    all_tw = {t.name: ParameterConstraints(sharding_types=["table_wise"]) for t in [*tables, hot]}
    all_tw["hot"] = ParameterConstraints(sharding_types=["table_wise"], pooling_factors=[200.0])
    naive = plan_tables([*tables, hot], topology, constraints=all_tw)
    assert result.stats.max_cost < 0.8 * naive.stats.max_cost


def test_a_table_too_big_for_one_rank_is_split():
    big = EmbeddingBagConfig(
        name="big", num_embeddings=10_000_000, embedding_dim=64, feature_names=["b"]
    )
    topology = Topology(world_size=4, compute_device="cuda", hbm_cap=2 * GIB)
    result = plan_tables([big], topology)  # 2.4 GiB of weights and state
    assert result.plan.plan[""]["big"].sharding_type not in (
        ShardingType.TABLE_WISE,
        ShardingType.DATA_PARALLEL,
    )
    assert result.stats.max_memory <= result.stats.available


def test_the_fused_optimizer_sets_the_state_counted():
    tables = seed_tables()
    topology = Topology(world_size=2, compute_device="cpu")
    planner = EmbeddingShardingPlanner(topology=topology, debug=False)
    planner.plan(meta_ebc(tables), [EmbeddingBagCollectionSharder()])
    rowwise = planner.stats.tables[0].memory
    planner.plan(
        meta_ebc(tables),
        [EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.ADAM})],
    )
    adam = planner.stats.tables[0].memory
    assert planner.stats.tables[0].sharding_type == "table_wise"
    assert adam - rowwise == 2 * 4096 * 64 * 4 - 4096 * 4


def test_stats_match_an_independent_estimate_of_the_plan():
    tables = random_tables(30, seed=7)
    topology = Topology(world_size=8, compute_device="cuda", local_world_size=4)
    result = plan_tables(tables, topology)
    again = estimate_plan(result.plan, tables, topology)
    for mine, theirs in zip(result.stats.ranks, again.ranks):
        assert mine.memory == theirs.memory and mine.num_shards == theirs.num_shards
        assert mine.cost == pytest.approx(theirs.cost, rel=1e-9, abs=1e-12)
    assert [t.shards for t in result.stats.tables] == [t.shards for t in again.tables]


def test_errors_name_the_missing_topology_and_unknown_tables():
    with pytest.raises(
        ValueError, match=r"plan\(\) needs a topology, e.g. EmbeddingShardingPlanner"
    ):
        EmbeddingShardingPlanner().plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu"),
        constraints={"nope": ParameterConstraints(sharding_types=["row_wise"])},
    )
    with pytest.raises(
        ValueError, match=r"constraints name tables \['nope'\] that the sharded modules do not have"
    ):
        planner.plan(meta_ebc(seed_tables()), [EmbeddingBagCollectionSharder()])
    with pytest.raises(
        ValueError, match=r"two sharders for EmbeddingBagCollection; pass one per module type"
    ):
        planner.plan(
            meta_ebc(seed_tables()),
            [EmbeddingBagCollectionSharder(), EmbeddingBagCollectionSharder()],
        )

    class NoKernel(EmbeddingBagCollectionSharder):
        def compute_kernels(self, sharding_type, compute_device_type):
            return []

    with pytest.raises(
        ValueError, match=r"table 'large_table_0': NoKernel gives no compute kernel for any of"
    ):
        EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu")).plan(
            meta_ebc(seed_tables()), [NoKernel()]
        )

    class NoType(EmbeddingBagCollectionSharder):
        def sharding_types(self, compute_device_type):
            return []

    with pytest.raises(
        ValueError, match=r"'large_table_0': NoType offers no sharding type .* it offers \[\] \("
    ):
        EmbeddingShardingPlanner(topology=Topology(world_size=2, compute_device="cpu")).plan(
            meta_ebc(seed_tables()), [NoType()]
        )
    with pytest.raises(
        ValueError, match=r"batch_size must be an int >= 1 \(examples per rank\), got 0"
    ):
        plan_tables(seed_tables(), Topology(world_size=1, compute_device="cpu"), batch_size=0)


def test_a_table_too_small_for_row_wise_is_explained():
    tiny = EmbeddingBagConfig(name="tiny", num_embeddings=3, embedding_dim=8, feature_names=["f"])
    constraints = {"tiny": ParameterConstraints(sharding_types=["row_wise"])}
    with pytest.raises(
        PlannerError,
        match=r"table 'tiny' \(3 x 8, 4 B per weight\): row_wise needs num_embeddings \(3\) >= world_size \(4\)",
    ) as info:
        plan_tables([tiny], Topology(world_size=4, compute_device="cpu"), constraints=constraints)
    assert info.value.error_type == PlannerErrorType.STRICT_CONSTRAINTS
    assert "would fit: table_wise" in str(info.value) and "which the constraints exclude" in str(
        info.value
    )


def test_a_table_narrower_than_two_column_shards_gets_one_as_torchrecs_planner_gives():
    # TorchRec cuts column-wise shards of min(min_partition, dim) columns: an 8-wide table
    # forced to column_wise gets one shard of 8 columns, placed on one rank.
    narrow = EmbeddingBagConfig(name="t", num_embeddings=110, embedding_dim=8, feature_names=["f"])
    constraints = {"t": ParameterConstraints(sharding_types=["column_wise"])}
    topology = Topology(world_size=2, compute_device="cpu")
    result = plan_tables([narrow], topology, constraints=constraints)
    (sharding,) = result.plan.get_plan_for_module("").values()
    assert sharding.sharding_type == "column_wise" and len(sharding.ranks) == 1
    shards = sharding.sharding_spec.shards
    assert [(s.shard_offsets, s.shard_sizes) for s in shards] == [([0, 0], [110, 8])]


def test_constraints_that_exclude_everything_name_table_and_constraint():
    table = seed_tables()[:1]
    topology = Topology(world_size=2, compute_device="cpu")
    only_dp_fused = {
        "large_table_0": ParameterConstraints(
            sharding_types=["data_parallel"], compute_kernels=["fused"]
        )
    }
    with pytest.raises(
        PlannerError,
        match=r"table 'large_table_0': constraint compute_kernels=\['fused'\] leaves no kernel for its sharding types; an embedding collection offers \{'data_parallel': \['dense'\]\}",
    ):
        plan_tables(table, topology, constraints=only_dp_fused)
    grid = {"large_table_0": ParameterConstraints(sharding_types=["grid_shard"])}
    with pytest.raises(
        PlannerError, match=r"grid_shard needs local_world_size >= 2 ranks per host, got 1"
    ):
        plan_tables(
            table,
            Topology(world_size=2, compute_device="cpu", local_world_size=1),
            constraints=grid,
        )


def test_a_table_too_big_for_every_option_says_what_each_needs():
    big = EmbeddingBagConfig(
        name="big", num_embeddings=80_000_000, embedding_dim=128, feature_names=["b"]
    )
    topology = Topology(world_size=4, compute_device="cuda", local_world_size=2, hbm_cap=8 * GIB)
    with pytest.raises(PlannerError) as info:
        plan_tables([big], topology)
    message = str(info.value)
    assert info.value.error_type == PlannerErrorType.INSUFFICIENT_STORAGE
    assert (
        "1 of 1 tables have no way to be sharded on 4 ranks with 6.8 GiB for tables each" in message
    )
    assert (
        "each layout needs more than the 6.8 GiB a rank has for tables (data_parallel 76.6 GiB, "
        "table_wise 38.4 GiB, column_wise 9.84 GiB, row_wise 9.61 GiB, table_row_wise 19.2 GiB, "
        "table_column_wise 19.4 GiB on a rank)" in message
    )
    assert "would fit: 8 ranks (world_size 4 now) for this table alone" in message


def test_when_tables_do_not_fit_together_the_error_names_each_and_what_would_fit():
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", num_embeddings=4_000_000, embedding_dim=64, feature_names=[f"f{i}"]
        )
        for i in range(12)
    ]
    constraints = {t.name: ParameterConstraints(sharding_types=["table_wise"]) for t in tables}
    topology = Topology(world_size=4, compute_device="cuda", hbm_cap=3 * GIB)
    with pytest.raises(PlannerError) as info:
        plan_tables(tables, topology, constraints=constraints)
    message = str(info.value)
    assert info.value.error_type == PlannerErrorType.PARTITION
    assert message.startswith(
        "no sharding plan fits: 4 of 12 tables cannot be placed on 4 ranks with 2.55 GiB"
    )
    assert "at least 5 ranks of this size" in message
    for line in [line for line in message.splitlines() if line.startswith("  table ")]:
        assert "table_wise needs 992 MiB on one rank; the most any rank has left is" in line
    assert message.count("would fit: column_wise (504 MiB per rank) or ") == 4
    assert "row_wise (248 MiB per rank), which the constraints exclude" in message


def test_a_smaller_batch_is_suggested_when_buffers_are_what_does_not_fit():
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}", num_embeddings=100, embedding_dim=128, feature_names=[f"f{i}"]
        )
        for i in range(3)
    ]
    constraints = {t.name: ParameterConstraints(sharding_types=["table_wise"]) for t in tables}
    topology = Topology(world_size=2, compute_device="cpu", ddr_cap=4 * MIB)
    reservation = HeuristicalStorageReservation(percentage=0.0)
    with pytest.raises(
        PlannerError, match=r"would fit: batch_size <= \d+ \(its input/output buffers take"
    ):
        plan_tables(
            tables,
            topology,
            constraints=constraints,
            batch_size=2048,
            storage_reservation=reservation,
        )


def test_nothing_left_after_the_reservation_is_explained():
    with pytest.raises(
        PlannerError,
        match=r"no hbm memory is left for embedding tables: each rank has 1 GiB, minus a 15% margin \(154 MiB\), the dense model \(2 GiB\)",
    ):
        plan_tables(
            seed_tables(),
            Topology(world_size=2, compute_device="cuda", hbm_cap=GIB),
            storage_reservation=HeuristicalStorageReservation(dense_tensor_estimate=2 * GIB),
        )


def test_grid_shard_splits_columns_over_hosts_and_rows_inside_each():
    table = EmbeddingBagConfig(name="g", num_embeddings=1000, embedding_dim=96, feature_names=["f"])
    constraints = {"g": ParameterConstraints(sharding_types=["grid_shard"])}
    topology = Topology(world_size=6, compute_device="cuda", local_world_size=2)
    sharding = plan_tables([table], topology, constraints=constraints).plan.plan[""]["g"]
    shards = sharding.sharding_spec.shards
    blocks = {}
    for shard, rank in zip(shards, sharding.ranks):
        blocks.setdefault(shard.shard_offsets[1], []).append(rank)
    assert len(blocks) >= 2 and all(len({r // 2 for r in ranks}) == 1 for ranks in blocks.values())
    assert len({ranks[0] // 2 for ranks in blocks.values()}) == len(blocks)  # distinct hosts
    assert_tiles(plan_tables([table], topology, constraints=constraints).plan, [table], 6, 2)


def test_planning_a_hundred_tables_on_128_ranks_is_quick():
    import time

    tables = random_tables(100, seed=11)
    start = time.perf_counter()
    plan_tables(tables, Topology(world_size=128, compute_device="cuda", local_world_size=8))
    assert time.perf_counter() - start < 5.0


def test_local_search_spreads_equal_tables_that_greedy_leaves_uneven():
    # 26 equal tables on 8 ranks: greedy table-wise placement gives two ranks 4 tables
    # (max/mean 4 / 3.25 = 1.23); splitting a few of them evens the ranks out.
    tables = [
        EmbeddingBagConfig(
            name=f"cat_{i}", num_embeddings=10_000, embedding_dim=128, feature_names=[f"c{i}"]
        )
        for i in range(26)
    ]
    result = plan_tables(tables, Topology(world_size=8, compute_device="cuda"))
    types = {s.sharding_type for s in result.plan.plan[""].values()}
    assert ShardingType.TABLE_WISE in types and len(types) > 1
    assert result.stats.cost_imbalance < 1.1
    all_tw = {t.name: ParameterConstraints(sharding_types=["table_wise"]) for t in tables}
    greedy = plan_tables(tables, Topology(world_size=8, compute_device="cuda"), constraints=all_tw)
    assert greedy.stats.cost_imbalance == pytest.approx(4 / 3.25)
    assert result.stats.max_cost < 0.9 * greedy.stats.max_cost


def test_optimizer_priority_is_the_tables_then_the_sharders_then_the_modules():
    from shardkit.optim import apply_optimizer_in_backward

    topology = Topology(world_size=2, compute_device="cpu")
    planner = EmbeddingShardingPlanner(topology=topology, debug=False)

    def memory_of(module, sharder):
        planner.plan(module, [sharder])
        return {t.table: t.memory for t in planner.stats.tables}

    plain = memory_of(meta_ebc(seed_tables()), EmbeddingBagCollectionSharder())
    module_adam = memory_of(
        meta_ebc(seed_tables(), fused_params={"optimizer": "adam"}), EmbeddingBagCollectionSharder()
    )
    adam_minus_rowwise = 2 * 4096 * 64 * 4 - 4096 * 4
    assert module_adam["large_table_0"] - plain["large_table_0"] == adam_minus_rowwise
    sharder_sgd = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD})
    module = meta_ebc(seed_tables(), fused_params={"optimizer": "adam"})
    assert plain["large_table_0"] - memory_of(module, sharder_sgd)["large_table_0"] == 4096 * 4
    apply_optimizer_in_backward(
        torch.optim.Adagrad, [module.embedding_bags["large_table_1"].weight], {"lr": 0.1}
    )
    mixed = memory_of(module, sharder_sgd)
    assert mixed["large_table_1"] - plain["large_table_1"] == 4096 * 64 * 4 - 4096 * 4


def test_sequence_tables_of_an_embedding_collection():
    from shardkit.modules import EmbeddingCollection, EmbeddingConfig
    from shardkit.sharding import EmbeddingCollectionSharder

    tables = [
        EmbeddingConfig(
            name=f"s{i}", num_embeddings=1000 * (i + 1), embedding_dim=32, feature_names=[f"f{i}"]
        )
        for i in range(4)
    ]
    ec = EmbeddingCollection(tables=tables, device="meta")
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=4, compute_device="cpu"), debug=False
    )
    plan = planner.plan(ec, [EmbeddingCollectionSharder()])
    assert_tiles(plan, tables, 4)
    bag = EmbeddingBagConfig(name="s0", num_embeddings=1000, embedding_dim=32, feature_names=["f0"])
    pooled = {"s0": ParameterConstraints(pooling_factors=[10.0], sharding_types=["table_wise"])}
    sequence = plan_tables(
        [tables[0]], Topology(world_size=4, compute_device="cpu"), constraints=pooled
    )
    bags = plan_tables([bag], Topology(world_size=4, compute_device="cpu"), constraints=pooled)
    # every id of a sequence table is an output row: 10x the output buffer of the pooled table
    assert sequence.stats.tables[0].memory - bags.stats.tables[0].memory == 9 * 512 * 4 * 32 * 4


def test_a_plain_module_sharder_gets_data_parallel_plans():
    from shardkit.planner import ModuleSharder
    from tests.planner._helpers import StandInEBC

    class Replicated(ModuleSharder):
        @property
        def module_type(self):
            return StandInEBC

    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu"), debug=False
    )
    plan = planner.plan(StandInEBC(seed_tables()), [Replicated()])
    names = [
        f"embedding_bags.{n}.weight"
        for n in ["large_table_0", "large_table_1", "small_table_0", "small_table_1"]
    ]
    assert list(plan.plan[""]) == names
    assert {s.sharding_type for s in plan.plan[""].values()} == {ShardingType.DATA_PARALLEL}


_SPLIT_COLUMNS = (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE, ShardingType.GRID_SHARD)


@pytest.mark.parametrize(
    "optimizer", [EmbOptimType.LAMB, EmbOptimType.LARS_SGD, EmbOptimType.PARTIAL_ROWWISE_LAMB]
)
def test_tables_stepped_by_row_norms_never_get_column_shards(optimizer):
    """LAMB-like rules take norms over a whole row: a column shard would step otherwise."""
    tables = random_tables(12, seed=3)  # row-wise Adagrad plans 4 of them column-wise
    topology = Topology(world_size=4, compute_device="cuda", local_world_size=2)

    def types(fused: EmbOptimType) -> list[ShardingType]:
        plan = plan_tables(tables, topology, fused_params={"optimizer": fused}).plan
        return [ShardingType(s.sharding_type) for s in plan.plan[""].values()]

    assert any(t in _SPLIT_COLUMNS for t in types(EmbOptimType.EXACT_ROWWISE_ADAGRAD))
    assert not any(t in _SPLIT_COLUMNS for t in types(optimizer))
    forced = {"t0": ParameterConstraints(sharding_types=["column_wise"])}
    with pytest.raises(PlannerError, match=(
        rf"column_wise splits each row's columns over shards, and the fused optimizer "
        rf"{optimizer.name} scales a row's step by norms over the whole row \(the DENSE kernel, "
        r"whose optimizer is yours, may split them: allow it with compute_kernels=\['dense'\]\)"
    )):  # fmt: skip
        plan_tables(tables, topology, fused_params={"optimizer": optimizer}, constraints=forced)
    # a DENSE table's optimizer is the user's, not the fused rule: its columns may be split
    for kernels in (["dense"], ["fused", "dense"]):
        dense = {
            "t0": ParameterConstraints(sharding_types=["column_wise"], compute_kernels=kernels)
        }
        plan = plan_tables(
            tables, topology, fused_params={"optimizer": optimizer}, constraints=dense
        )
        t0 = plan.plan.plan[""]["t0"]
        assert (t0.sharding_type, t0.compute_kernel) == ("column_wise", "dense")
