"""Plans written by hand (TorchRec's construct_module_sharding_plan and its generators)."""

from __future__ import annotations

import pytest

from shardkit.modules import EmbeddingBagConfig
from shardkit.planner import ShardingType
from shardkit.sharding import (
    EmbeddingBagCollectionSharder,
    apply_to_all,
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    grid_shard,
    row_wise,
    table_row_wise,
    table_wise,
)
from shardkit.types import ShardingPlan
from tests.planner._helpers import StandInEBC, assert_tiles, meta_ebc, seed_tables
from tests.planner._seed_plans import SEED_PLANS, check_readable, tutorial_text

TABLES = [
    EmbeddingBagConfig(
        name=f"t{i}", num_embeddings=rows, embedding_dim=dim, feature_names=[f"f{i}"]
    )
    for i, (rows, dim) in enumerate([(10, 8), (1001, 100), (64, 7), (500, 33), (100, 96), (3, 4)])
]


def _construct(per_table, world_size=4, local_size=2, device_type="cuda"):
    return construct_module_sharding_plan(
        meta_ebc(TABLES), per_table,
        local_size=local_size, world_size=world_size, device_type=device_type,
    )  # fmt: skip


def test_every_generator_tiles_its_table():
    plan = _construct(
        {
            "t0": row_wise(),
            "t1": column_wise(ranks=[0, 1, 3]),
            "t2": table_wise(rank=3),
            "t3": table_row_wise(host_index=1),
            "t4": grid_shard(host_indexes=[0, 1]),
            "t5": data_parallel(),
        }
    )
    assert_tiles(ShardingPlan({"": plan}), TABLES, 4, 2)
    assert [s.shard_sizes for s in plan["t0"].sharding_spec.shards] == [
        [3, 8],
        [3, 8],
        [2, 8],
        [2, 8],
    ]
    assert [s.shard_sizes[1] for s in plan["t1"].sharding_spec.shards] == [34, 33, 33]
    assert plan["t1"].ranks == [0, 1, 3] and plan["t3"].ranks == [2, 3]
    assert str(plan["t2"].sharding_spec.shards[0].placement) == "rank:3/cuda:1"
    assert plan["t4"].ranks == [0, 1, 2, 3]
    assert plan["t4"].sharding_spec.shards[2].shard_offsets == [0, 48]
    assert (
        plan["t5"].sharding_type == ShardingType.DATA_PARALLEL and plan["t5"].sharding_spec is None
    )


def test_apply_to_all_reproduces_the_seeds_row_wise_plan():
    ebc = meta_ebc(seed_tables())
    sharder = EmbeddingBagCollectionSharder()
    plan = construct_module_sharding_plan(
        ebc, apply_to_all(ebc, row_wise(), sharder), sharder=sharder, local_size=2, world_size=2,
        device_type="cuda",
    )  # fmt: skip
    assert tutorial_text(ShardingPlan({"": plan})) == SEED_PLANS["ROW_WISE"]
    check_readable(ShardingPlan({"": plan}))


def test_column_wise_sizes_per_rank():
    plan = _construct({**_all_dp(), "t1": column_wise(size_per_rank=[50, 25, 25])})
    shards = plan["t1"].sharding_spec.shards
    assert [(s.shard_offsets, s.shard_sizes) for s in shards] == [
        ([0, 0], [1001, 50]), ([0, 50], [1001, 25]), ([0, 75], [1001, 25]),
    ]  # fmt: skip


def _all_dp():
    return {t.name: data_parallel() for t in TABLES}


@pytest.mark.parametrize(
    ("generator", "message"),
    [
        (lambda: table_wise(rank=4), r"table_wise: rank 4 is not in \[0, world_size=4\)"),
        (lambda: row_wise(), r"row_wise sharding needs num_embeddings \(3\) >= world_size \(4\)"),
        (
            lambda: column_wise(ranks=[0, 1, 2, 3, 0]),
            r"column_wise needs 1 to 4 ranks \(one per shard\)",
        ),
        (
            lambda: column_wise(size_per_rank=[2, 1]),
            r"column_wise size_per_rank \[2, 1\] must be >= 1 each and sum to the table's 4 columns",
        ),
        (
            lambda: table_row_wise(host_index=2),
            r"table_row_wise: host_index 2 is not in \[0, 2\) \(2 hosts of 2 ranks\)",
        ),
        (lambda: grid_shard(host_indexes=[0, 1, 0, 1, 0]), r"grid_shard needs 1 to 4 hosts"),
    ],
)
def test_generator_errors(generator, message):
    with pytest.raises(ValueError, match=message):
        _construct({**_all_dp(), "t5": generator()}, world_size=4)


def test_row_wise_sizes_placement_is_refused():
    with pytest.raises(
        ValueError, match=r"row_wise\(sizes_placement=...\) places uneven shards for inference"
    ):
        row_wise(([5, 5], "cpu"))
    with pytest.raises(
        ValueError, match=r"column_wise needs exactly one of ranks=\[...\] or size_per_rank=\[...\]"
    ):
        column_wise()


def test_construct_checks_tables_and_sizes():
    with pytest.raises(
        ValueError,
        match=r"per_param_sharding must name every table of the module exactly: missing \['t5'\], unknown \['x'\]",
    ):
        _construct({**{k: v for k, v in _all_dp().items() if k != "t5"}, "x": data_parallel()})
    with pytest.raises(
        ValueError, match=r"world_size \(6\) must be a positive multiple of local_size \(4\)"
    ):
        _construct(_all_dp(), world_size=6, local_size=4)
    with pytest.raises(
        ValueError,
        match=r"construct_module_sharding_plan needs world_size=... when no process group is initialized",
    ):
        construct_module_sharding_plan(meta_ebc(TABLES), _all_dp())


def test_modules_without_a_default_sharder_need_one():
    with pytest.raises(TypeError, match=r"no default sharder for StandInEBC; pass sharder=..."):
        construct_module_sharding_plan(StandInEBC(TABLES), _all_dp(), world_size=2)
