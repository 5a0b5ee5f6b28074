"""`shard_modules` on a collection its plan leaves out: left unsharded, as a child would be;
sharders that cannot build a sharded module are refused before any planning, where the model
holds their module type."""

from __future__ import annotations

import pytest
import torch

from shardkit import EmbeddingBagCollection
from shardkit.sharding import DistributedModelParallel, row_wise, shard, shard_modules
from shardkit.types import ShardingEnv, ShardingPlan
from tests.sharding.common import configs


def test_a_root_collection_the_plan_leaves_out_stays_unsharded():
    ebc = EmbeddingBagCollection(tables=configs())
    out = shard_modules(ebc, ShardingEnv(1, 0, None), torch.device("cpu"), plan=ShardingPlan({}))
    assert out is ebc


class _PlannerOnlySharder:
    """A sharder the planner can read but that cannot build the sharded module."""

    module_type = EmbeddingBagCollection


@pytest.mark.parametrize("entry", ["shard", "shard_modules", "dmp"])
def test_a_sharder_without_shard_is_refused(entry):
    ebc = EmbeddingBagCollection(tables=configs())
    env = ShardingEnv(1, 0, None)
    match = r"sharder <.*_PlannerOnlySharder.*> \(for EmbeddingBagCollection\) has no shard\("
    with pytest.raises(TypeError, match=match + r".*Subclass one of shardkit's sharders"):
        if entry == "shard":
            shard(ebc, row_wise(), env, sharder=_PlannerOnlySharder())
        elif entry == "shard_modules":
            shard_modules(ebc, env, sharders=[_PlannerOnlySharder()], plan=ShardingPlan({}))
        else:
            DistributedModelParallel(ebc, env, sharders=[_PlannerOnlySharder()])


@pytest.mark.parametrize("entry", ["shard_modules", "dmp"])
def test_a_sharder_without_shard_for_a_type_the_model_lacks_is_never_used(entry):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    env = ShardingEnv(1, 0, None)
    if entry == "shard_modules":
        out = shard_modules(model, env, sharders=[_PlannerOnlySharder()], plan=ShardingPlan({}))
        assert out is model
    else:
        sharders = [_PlannerOnlySharder()]
        dmp = DistributedModelParallel(model, env, sharders=sharders, plan=ShardingPlan({}))
        torch.testing.assert_close(dmp(torch.ones(1, 2)), model(torch.ones(1, 2)))
