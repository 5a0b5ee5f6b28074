"""TorchRec's way of saving the tables' optimizer: ``dmp.fused_optimizer.state_dict()`` and
``load_state_dict``. The step counter travels with the accumulators, so Adam's bias correction
resumes where it stopped (it once restarted at step 1 after a load, silently)."""

from __future__ import annotations

import copy

import pytest
import torch

from shardkit import EmbeddingBagCollection
from shardkit.distributed import DistributedModelParallel
from shardkit.optim import EmbOptimType
from shardkit.sharding import EmbeddingBagCollectionSharder
from shardkit.types import ShardingPlan
from tests.sharding.common import configs, global_batch, local_part, make_plan

ADAM = {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.1, "eps": 1e-8}


def _dmp(world_size: int, kind: str) -> DistributedModelParallel:
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=configs())
    plan = ShardingPlan({"": make_plan(ebc, kind, world_size, world_size)})
    sharders = [EmbeddingBagCollectionSharder(fused_params=ADAM)]
    return DistributedModelParallel(ebc, plan=plan, sharders=sharders)


def _train(dmp, rank: int, world_size: int, steps: range) -> None:
    for step in steps:
        batch = local_part(global_batch(step, 4 * world_size, False), rank, world_size)
        dmp(batch).values().pow(2).sum().backward()


def _resume(rank: int, world_size: int, kind: str):
    trained = _dmp(world_size, kind)
    _train(trained, rank, world_size, range(3))
    weights = copy.deepcopy(trained.state_dict())
    optimizer = copy.deepcopy(trained.fused_optimizer.state_dict())
    steps = {k: v for k, state in optimizer["state"].items() for k, v in state.items()}
    resumed = _dmp(world_size, kind)
    resumed.load_state_dict(weights)
    resumed.fused_optimizer.load_state_dict(optimizer)
    without_steps = {  # TorchRec's fused state has no step counts: it loads, counts stay
        "state": {
            name: {k: v for k, v in state.items() if not k.endswith("step")}
            for name, state in optimizer["state"].items()
        },
        **{k: v for k, v in optimizer.items() if k != "state"},
    }
    _dmp(world_size, kind).fused_optimizer.load_state_dict(copy.deepcopy(without_steps))
    _train(trained, rank, world_size, range(3, 5))
    _train(resumed, rank, world_size, range(3, 5))
    for (name, want), (_, got) in zip(
        trained.named_parameters(), resumed.named_parameters(), strict=True
    ):  # this rank's shards
        torch.testing.assert_close(got, want, rtol=0, atol=0, msg=name)
    return sorted({int(v) for k, v in steps.items() if k.endswith("step")})


@pytest.mark.parametrize("kind", ["table_wise", "row_wise"])
def test_fused_optimizer_state_dict_resumes_adam_at_its_step(run_ranks, kind):
    for saved_steps in run_ranks(_resume, 2, kind):
        assert saved_steps == [3], "every table's state carries the step count"
