"""Plans are plain data: they print as tables (each table's `ParameterSharding` as TorchRec's
tutorials show), round-trip through JSON and pickle, and refuse inconsistent content."""

from __future__ import annotations

import pickle

import pytest

from shardkit.planner import (
    EmbeddingComputeKernel,
    EmbeddingModuleShardingPlan,
    EnumerableShardingSpec,
    ShardingType,
    ShardMetadata,
    ShardPlacement,
    placement,
)
from shardkit.types import ParameterSharding, ShardingPlan, validate_module_plan


def _table_wise(rank: int, device: str = "cpu") -> ParameterSharding:
    shard = ShardMetadata([0, 0], [4096, 64], ShardPlacement(rank, device))
    return ParameterSharding("table_wise", "fused", [rank], EnumerableShardingSpec([shard]))


def test_parameter_sharding_prints_like_the_seed():
    # the seed's repr with TorchRec 1.8's kernel name ('fused'; the seed's TorchRec printed
    # 'batched_fused')
    expected = (
        "ParameterSharding(sharding_type='table_wise', compute_kernel='fused', "
        "ranks=[0], sharding_spec=EnumerableShardingSpec(shards=[ShardMetadata("
        "shard_offsets=[0, 0], shard_sizes=[4096, 64], placement=rank:0/cpu)]))"
    )
    assert repr(_table_wise(0)) == expected
    dp = ParameterSharding(ShardingType.DATA_PARALLEL, EmbeddingComputeKernel.DENSE, [0, 1])
    assert repr(dp) == (
        "ParameterSharding(sharding_type='data_parallel', compute_kernel='dense', "
        "ranks=[0, 1], sharding_spec=None)"
    )


def _two_modules() -> ShardingPlan:
    row_wise = ParameterSharding(
        "row_wise",
        "fused",
        [0, 1, 2],
        EnumerableShardingSpec(
            [
                ShardMetadata([0, 0], [4, 8], "rank:0/cpu"),
                ShardMetadata([4, 0], [4, 8], "rank:1/cpu"),
                ShardMetadata([8, 0], [3, 8], "rank:2/cpu"),
            ]
        ),
    )
    dp = ParameterSharding("data_parallel", "dense", [0, 1, 2])
    return ShardingPlan({"": {"ads": _table_wise(1)}, "sparse.ebc": {"user": row_wise, "x": dp}})


def test_a_plan_made_by_hand_prints_its_layout_module_by_module():
    assert str(_two_modules()).splitlines() == [
        "3 tables in 2 module(s) on 3 ranks",
        "(no memory or cost estimates: the plan was made by hand or read from JSON; plans the "
        "planner makes carry them)",
        "",
        "rank  shards  parameters  replicated tables",
        "   0       1          32                  1",
        "   1       2     262,176                  1",
        "   2       1          24                  1",
        "",
        "table   type           kernel  ranks  shards",
        "module (the model itself)",
        "  ads   table_wise     fused   1      1 x [4096, 64]",
        "module sparse.ebc",
        "  user  row_wise       fused   0-2    2 x [4, 8], 1 x [3, 8]",
        "  x     data_parallel  dense   0-2    a replica on each rank",
    ]


def test_module_plans_print_as_tables_and_reprs_are_short():
    plan = _two_modules()
    module_plan = plan.plan["sparse.ebc"]
    assert module_plan.module_path == "sparse.ebc"
    lines = str(module_plan).splitlines()
    assert lines[0] == "2 tables in 1 module(s) on 3 ranks"
    assert lines[-3:] == [
        "module sparse.ebc",
        "  user  row_wise       fused   0-2    2 x [4, 8], 1 x [3, 8]",
        "  x     data_parallel  dense   0-2    a replica on each rank",
    ]
    alone = EmbeddingModuleShardingPlan(module_plan)  # not in a plan: no path known
    assert "module (path unknown)" in str(alone)
    assert repr(plan) == (
        "ShardingPlan({'': {'ads': table_wise on 1}, "
        "'sparse.ebc': {'user': row_wise on 0-2, 'x': data_parallel on 0-2}})"
    )
    many = EmbeddingModuleShardingPlan({f"t{i}": _table_wise(0) for i in range(10)})
    assert repr(many).endswith("'t5': table_wise on 0, ... 4 more}")
    assert dict(module_plan)["x"] == plan.plan["sparse.ebc"]["x"]  # plain data underneath


@pytest.mark.parametrize(
    ("text", "kernel"),
    [
        ("fused", EmbeddingComputeKernel.FUSED),
        ("batched_fused", EmbeddingComputeKernel.FUSED),
        ("FUSED", EmbeddingComputeKernel.FUSED),
        ("dense", EmbeddingComputeKernel.DENSE),
        ("batched_dense", EmbeddingComputeKernel.DENSE),
        (EmbeddingComputeKernel.DENSE, EmbeddingComputeKernel.DENSE),
    ],
)
def test_kernel_accepts_torchrec_18_and_tutorial_values(text, kernel):
    assert EmbeddingComputeKernel.parse(text) is kernel
    assert (
        EmbeddingComputeKernel(text.value if isinstance(text, EmbeddingComputeKernel) else text)
        is kernel
    )


def test_enums_compare_equal_to_torchrec_strings():
    assert ShardingType.ROW_WISE == "row_wise" and ShardingType.ROW_WISE.value == "row_wise"
    assert (
        str(ShardingType.TABLE_WISE) == "table_wise"
        and f"{ShardingType.GRID_SHARD}" == "grid_shard"
    )
    assert ShardingType.parse("TABLE_ROW_WISE") is ShardingType.TABLE_ROW_WISE
    assert str(EmbeddingComputeKernel.FUSED) == "fused" == EmbeddingComputeKernel.FUSED.value
    assert EmbeddingComputeKernel.DENSE.value == "dense"


def test_unknown_enum_values_are_refused():
    with pytest.raises(
        ValueError, match=r"unknown sharding type 'diagonal'; choose one of \['data_parallel'"
    ):
        ShardingType.parse("diagonal")
    with pytest.raises(ValueError, match=r"unknown or unsupported compute kernel 'fused_uvm'.*UVM"):
        EmbeddingComputeKernel.parse("fused_uvm")


def test_json_round_trip_is_exact():
    plan = ShardingPlan(
        {
            "": {"a": _table_wise(1)},
            "sparse.ebc": {
                "b": ParameterSharding("data_parallel", "dense", [0, 1]),
                "c": ParameterSharding(
                    "column_wise",
                    "dense",
                    [1, 0],
                    EnumerableShardingSpec(
                        [
                            ShardMetadata([0, 0], [10, 3], "rank:1/cuda:1"),
                            ShardMetadata([0, 3], [10, 2], "rank:0/cuda:0"),
                        ]
                    ),
                ),
            },
        }
    )
    again = ShardingPlan.from_json(plan.to_json(indent=1))
    assert again == plan and str(again) == str(plan)
    assert list(again.plan) == ["", "sparse.ebc"] and list(again.plan["sparse.ebc"]) == ["b", "c"]
    assert pickle.loads(pickle.dumps(plan)) == plan
    assert (
        again.get_plan_for_module("sparse.ebc")["c"].sharding_spec.shards[1].placement.rank() == 0
    )
    assert again.get_plan_for_module("missing") is None


def test_from_json_refuses_other_documents():
    with pytest.raises(
        ValueError, match=r"not a shardkit sharding plan \(format None.*ShardingPlan.to_json"
    ):
        ShardingPlan.from_json('{"plan": {}}')


def test_placement_text_and_methods():
    assert str(placement("cpu", 3, 2)) == "rank:3/cpu"
    assert str(placement("cuda", 3, 2)) == "rank:3/cuda:1"
    parsed = ShardPlacement.parse("rank:3/cuda:1")
    assert parsed == placement("cuda", 3, 2) and parsed.rank() == 3 and parsed.device().index == 1
    with pytest.raises(
        ValueError, match=r"placement 'cuda:0' is not of the form 'rank:<r>/<device>'"
    ):
        ShardPlacement.parse("cuda:0")
    with pytest.raises(ValueError, match=r"a placement's rank must be an int >= 0, got -1"):
        ShardPlacement(-1, "cpu")


def test_inconsistent_shardings_are_refused_when_validated():
    # plans are mutable (issue 27): inconsistent ones are built, and refused where applied
    spec = EnumerableShardingSpec([ShardMetadata([0, 0], [4, 4], "rank:1/cpu")])
    with pytest.raises(
        ValueError,
        match=r"table 't': ranks \[0\] do not match the ranks of the shards' placements \[1\]",
    ):
        ParameterSharding("table_wise", "fused", [0], spec).validate("t")
    with pytest.raises(
        ValueError,
        match="data_parallel replicates the table: its sharding_spec is None; set sharding_spec",
    ):
        ParameterSharding("data_parallel", "dense", [0], spec).validate()
    with pytest.raises(ValueError, match="row_wise sharding needs a sharding_spec of shards"):
        ParameterSharding("row_wise", "fused", [0, 1]).validate()
    with pytest.raises(
        ValueError, match=r"table 'a' of module 'sparse': stochastic_rounding=True: shardkit's"
    ):
        ShardingPlan(
            {"sparse": {"a": ParameterSharding("data_parallel", "dense", stochastic_rounding=True)}}
        ).validate()
    with pytest.raises(
        TypeError, match=r"the plan of table 'a' is a dict, not a ParameterSharding"
    ):
        validate_module_plan({"a": {"sharding_type": "table_wise"}})
    with pytest.raises(
        ValueError, match=r"shard_sizes must be two ints >= 0 \(rows, columns\), got \[4\]"
    ):
        ShardMetadata([0, 0], [4], "rank:0/cpu")


def test_shardings_are_edited_in_place_as_torchrecs():
    sharding = _table_wise(0)
    sharding.compute_kernel = "dense"  # TorchRec's EmbeddingComputeKernel.DENSE.value
    assert sharding.compute_kernel is EmbeddingComputeKernel.DENSE
    sharding.sharding_type = ShardingType.TABLE_WISE.value
    assert sharding.sharding_type is ShardingType.TABLE_WISE
    sharding.sharding_spec.shards[0].placement = "rank:3/cpu"  # a torch ShardMetadata is mutable
    sharding.ranks = (3,)
    sharding.validate()
    assert sharding.ranks == [3] and sharding.sharding_spec.shards[0].placement.rank() == 3
    with pytest.raises(ValueError, match=r"unknown or unsupported compute kernel 'fused_uvm'"):
        sharding.compute_kernel = "fused_uvm"
    with pytest.raises(ValueError, match=r"shard_offsets must be two ints >= 0"):
        sharding.sharding_spec.shards[0].shard_offsets = [0, -1]


def test_plans_written_with_the_old_kernel_names_still_load():
    text = (
        '{"format": "shardkit.sharding_plan", "version": 1, "plan": {"": {"t": {"sharding_type":'
        ' "data_parallel", "compute_kernel": "batched_dense", "ranks": [0, 1], "shards": null}, '
        '"u": {"sharding_type": "table_wise", "compute_kernel": "batched_fused", "ranks": [1], '
        '"shards": [{"offsets": [0, 0], "sizes": [4, 2], "placement": "rank:1/cpu"}]}}}}'
    )
    plan = ShardingPlan.from_json(text)
    assert plan.plan[""]["t"].compute_kernel is EmbeddingComputeKernel.DENSE
    assert plan.plan[""]["u"].compute_kernel is EmbeddingComputeKernel.FUSED
    assert '"compute_kernel": "fused"' in plan.to_json()  # written with TorchRec 1.8's names
