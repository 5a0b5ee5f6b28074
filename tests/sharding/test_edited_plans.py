"""Plans are edited as TorchRec users edit them (issue 27): fields of a `ParameterSharding` made
by `construct_module_sharding_plan` are assigned, and DMP shards with the edited plan; an edit
that leaves a sharding inconsistent is refused where the plan is applied, on every rank."""

from __future__ import annotations

import copy

import pytest
import torch

from shardkit import EmbeddingBagCollection
from shardkit.distributed import DistributedModelParallel
from shardkit.planner import (
    EmbeddingComputeKernel,
    EnumerableShardingSpec,
    ShardingType,
    ShardMetadata,
)
from shardkit.sharding import shard
from shardkit.types import ShardingEnv, ShardingPlan
from tests.sharding.common import configs, global_batch, local_part, make_plan


def _edited(rank: int, world_size: int):
    """t0 row-wise with the dense kernel, t1 moved to rank 1 whole: both by assignment."""
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=configs())
    reference = copy.deepcopy(ebc)
    plan = make_plan(ebc, "row_wise", world_size, world_size)
    plan["t0"].compute_kernel = EmbeddingComputeKernel.DENSE.value  # "dense", as in TorchRec
    moved = plan["t1"]
    moved.sharding_type = ShardingType.TABLE_WISE.value
    moved.ranks = [1]
    moved.sharding_spec = EnumerableShardingSpec([ShardMetadata([0, 0], [7, 6], "rank:1/cpu")])
    dmp = DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}))
    kjt = global_batch(3, 2 * world_size, False)
    out = dmp(local_part(kjt, rank, world_size)).values()
    out.mean().backward()
    expected = reference(kjt).values()
    expected.mean().backward()
    rows = slice(rank * 2, rank * 2 + 2)
    torch.testing.assert_close(out, expected[rows])
    sharded = dmp.module
    t0 = sharded.embedding_bags["t0"]
    (slice_,) = t0.shard_slices
    grad = t0.shards[0].grad  # the dense kernel: a gradient autograd made, for your optimizer
    assert grad is not None, "t0's edited kernel is dense: its shard has a gradient"
    full = reference.embedding_bags["t0"].weight.grad
    torch.testing.assert_close(grad, full[slice_.row_start : slice_.row_start + slice_.rows])
    t1_ranks = [s.rank for s in sharded.embedding_bags["t1"].shard_slices]
    return t1_ranks


def test_an_edited_plan_is_the_plan_dmp_applies(run_ranks):
    assert run_ranks(_edited, 2) == [[], [1]]


def _wrongly_edited(rank: int, world_size: int):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=configs())
    plan = make_plan(ebc, "table_wise", world_size, world_size)
    if rank == 1:  # an edit on one rank only: every rank still fails, none waits
        plan["t2"].ranks = [0]  # its shard stays on rank 1
    with pytest.raises(ValueError) as info:
        DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}))
    return str(info.value)


def test_an_inconsistent_edit_fails_every_rank_with_the_rule(run_ranks):
    expected = (
        "rank 1's plan: table 't2': ranks [0] do not match the ranks of the shards' placements "
        "[1]; list one rank per shard, in shard order"
    )
    assert run_ranks(_wrongly_edited, 2) == [expected, expected]


def test_shard_refuses_an_inconsistent_edit():
    ebc = EmbeddingBagCollection(tables=configs())
    plan = make_plan(ebc, "row_wise", 1, 1)
    plan["t3"].sharding_type = "data_parallel"  # but its row-wise spec stays
    with pytest.raises(
        ValueError,
        match=r"table 't3': data_parallel replicates the table: its sharding_spec is None; set",
    ):
        shard(ebc, dict(plan), ShardingEnv(1, 0, None), "cpu")
