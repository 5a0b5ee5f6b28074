"""Position-weighted features sharded, against the unsharded `FeatureProcessedEmbeddingBagCollection`
(the spec) on the global batch: outputs, the position weights' gradients at every step, and the
tables after steps, for table-wise, column-wise, data-parallel, row-wise and table-row-wise
tables and a mix. The position weights are replicated: their gradients are averaged
across ranks here as DistributedModelParallel's data-parallel wrapper does."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from shardkit import EmbeddingBagCollection
from shardkit.modules.feature_processor_ import (
    PositionWeightedModule,
    PositionWeightedModuleCollection,
)
from shardkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from shardkit.optim import EmbOptimType
from shardkit.sharding import InputError, ShardedFeatureProcessedEmbeddingBagCollection
from shardkit.types import ShardingEnv
from tests.sharding.common import FEATURES, configs, global_batch, local_part, make_plan

LOCAL_BATCH = 3
STEPS = 3


def _module(kind: str, collection: bool) -> FeatureProcessedEmbeddingBagCollection:
    torch.manual_seed(0)
    optimizer = {
        "data_parallel": EmbOptimType.EXACT_SGD,
        "mixed": EmbOptimType.EXACT_SGD,
        "column_wise": EmbOptimType.EXACT_ADAGRAD,
    }.get(kind, EmbOptimType.EXACT_ROWWISE_ADAGRAD)
    fused = {"optimizer": optimizer, "learning_rate": 0.1, "eps": 1e-8}
    ebc = EmbeddingBagCollection(tables=configs(), is_weighted=True, fused_params=fused)
    if collection:  # feature 'b' has no position weights (weight 1.0)
        processors = PositionWeightedModuleCollection({"a": 3, "c": 3, "d": 4, "e": 3})
    else:
        processors = {f: PositionWeightedModule(3) for f in FEATURES}
    module = FeatureProcessedEmbeddingBagCollection(ebc, processors)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "position_weight" in name:
                param.uniform_(0.5, 1.5)
    return module


def _position_weights(module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in module.named_parameters() if "position_weight" in n}


def _train(rank, world_size, kind, collection):
    reference = _module(kind, collection)
    plan = make_plan(reference._embedding_bag_collection, kind, world_size, world_size)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = ShardedFeatureProcessedEmbeddingBagCollection(copy.deepcopy(reference), plan, env)
    dense = [p for n, p in sharded.named_parameters() if ".shards." not in n]
    ref_dense = [p for n, p in reference.named_parameters() if "position_weight" in n]
    ref_dense += [p for n, p in reference.named_parameters() if n.endswith(".weight")] * (
        kind in ("data_parallel", "mixed")
    )
    for step in range(STEPS):
        size = LOCAL_BATCH * world_size
        kjt = global_batch(step, size, weighted=False)
        scale = torch.rand(size, 23, generator=torch.Generator().manual_seed(100 + step))
        out = sharded(local_part(kjt, rank, world_size))
        ref_out = reference(kjt)
        mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        torch.testing.assert_close(out.values(), ref_out.values()[mine])
        (out.values() * scale[mine]).sum(1).mean().backward()
        (ref_out.values() * scale).sum(1).mean().backward()
        for p in dense:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        ref_weights = _position_weights(reference)
        for name, param in _position_weights(sharded).items():
            torch.testing.assert_close(param.grad, ref_weights[name].grad, msg=name)
        _sgd(dense)
        _sgd([p for n, p in reference.named_parameters() if "position_weight" in n])
    _compare_tables(sharded, reference)


@torch.no_grad()
def _sgd(params) -> None:
    for p in params:
        if p.grad is not None:
            p -= 0.1 * p.grad
            p.grad = None


def _compare_tables(sharded, reference) -> None:
    tables = sharded._embedding_bag_collection.embedding_bags
    for name, table in tables.items():
        full = reference._embedding_bag_collection.embedding_bags[name].weight.detach()
        if not hasattr(table, "shard_slices"):
            torch.testing.assert_close(table.weight.detach(), full, msg=name)
            continue
        for shard, param in zip(table.shard_slices, table.shards):
            block = full[
                shard.row_start : shard.row_start + shard.rows,
                shard.col_start : shard.col_start + shard.cols,
            ]
            torch.testing.assert_close(param.detach(), block, msg=name)


@pytest.mark.parametrize(
    "kind", ["table_wise", "column_wise", "data_parallel", "row_wise", "table_row_wise", "mixed"]
)
def test_position_weighted_sharded_matches_unsharded(run_ranks, kind):
    run_ranks(_train, 2, kind, True)


@pytest.mark.parametrize("world_size", [1, 3])
def test_position_weighted_row_wise_and_dict_processors(run_ranks, world_size):
    run_ranks(_train, world_size, "row_wise", False)


def _too_long_on_one_rank(rank, world_size):
    module = _module("row_wise", True)
    plan = make_plan(module._embedding_bag_collection, "row_wise", world_size, world_size)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = ShardedFeatureProcessedEmbeddingBagCollection(module, plan, env)
    kjt = local_part(global_batch(0, 2 * world_size, weighted=False), rank, world_size)
    if rank == 1:  # feature 'a' allows 3 positions; give a bag of 5
        by_key = kjt.to_dict()
        values = torch.cat(
            [torch.zeros(5, dtype=torch.long)] + [by_key[f].values() for f in FEATURES[1:]]
        )
        lengths = torch.cat([torch.tensor([5, 0])] + [by_key[f].lengths() for f in FEATURES[1:]])
        kjt = type(kjt)(keys=FEATURES, values=values, lengths=lengths)
    try:
        sharded(kjt)
    except InputError as error:
        return str(error)
    return "no error"


def test_a_bag_too_long_on_one_rank_raises_on_every_rank(run_ranks):
    other, own = run_ranks(_too_long_on_one_rank, 2)
    assert "rank 1: position weights of feature 'a': a bag has 5 ids" in own
    assert "rank(s) [1] refused their input to a feature-processed collection" in other


def _dmp(rank, world_size):
    from shardkit.distributed import DistributedModelParallel
    from shardkit.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from shardkit.sharding import get_default_sharders

    reference = _module("row_wise", True)
    constraints = {f"t{i}": ParameterConstraints(sharding_types=["row_wise"]) for i in range(4)}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, compute_device="cpu"), constraints=constraints
    )
    model = copy.deepcopy(reference)
    dmp = DistributedModelParallel(
        model, plan=planner.collective_plan(model, get_default_sharders())
    )
    ref_weights = _position_weights(reference)
    for step in range(STEPS):
        kjt = global_batch(step, LOCAL_BATCH * world_size, weighted=False)
        out = dmp(local_part(kjt, rank, world_size))
        ref_out = reference(kjt)
        mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        torch.testing.assert_close(out.values(), ref_out.values()[mine])
        out.values().pow(2).sum(1).mean().backward()  # DDP averages the position weights' grads
        ref_out.values().pow(2).sum(1).mean().backward()
        for name, param in _position_weights(dmp.module).items():
            torch.testing.assert_close(param.grad, ref_weights[name].grad, msg=name)
        _sgd(_position_weights(dmp.module).values())
        _sgd(ref_weights.values())
    _compare_tables(dmp.module, reference)
    return type(dmp.module).__name__


def test_dmp_shards_position_weighted_tables_row_wise_with_the_default_sharders(run_ranks):
    assert run_ranks(_dmp, 2)[0] == "ShardedFeatureProcessedEmbeddingBagCollection"


class _Trained(torch.nn.Module):
    """A feature-processed collection as a train pipeline calls it: ``(losses, output)``."""

    def __init__(self, fp: FeatureProcessedEmbeddingBagCollection) -> None:
        super().__init__()
        self.fp = fp

    def forward(self, kjt):
        out = self.fp(kjt).values()
        return out.pow(2).sum(1).mean().reshape(1), out.detach()


def _pipelined(rank, world_size, overlap):
    """A DMP trained by `TrainPipelineSparseDist`, step by step equal to the unsharded module
    trained by a plain loop on the global batch: the pipeline prefetches nothing into the
    collection inside the feature-processed module (it sees weighted features)."""
    from shardkit.distributed import DistributedModelParallel
    from shardkit.sharding import TrainPipelineSparseDist
    from shardkit.types import ShardingPlan

    reference = _Trained(_module("row_wise", True))
    plan = make_plan(reference.fp._embedding_bag_collection, "row_wise", world_size, world_size)
    dmp = DistributedModelParallel(copy.deepcopy(reference), plan=ShardingPlan({"fp": plan}))
    weights = list(_position_weights(dmp.module).values())
    pipeline = TrainPipelineSparseDist(dmp, torch.optim.SGD(weights, lr=0.1), overlap=overlap)
    size = LOCAL_BATCH * world_size
    batches = (
        local_part(global_batch(s, size, weighted=False), rank, world_size) for s in range(3)
    )
    mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    for step in range(3):
        out = pipeline.progress(batches)
        ref_loss, ref_out = reference(global_batch(step, size, weighted=False))
        torch.testing.assert_close(out, ref_out[mine])
        ref_loss.sum().backward()
        _sgd(_position_weights(reference).values())
    for name, param in _position_weights(reference).items():
        torch.testing.assert_close(_position_weights(dmp.module)[name], param, msg=name)
    _compare_tables(dmp.module.fp, reference.fp)
    return pipeline._lead is None


@pytest.mark.parametrize("overlap", [False, True], ids=["synchronous", "overlap"])
def test_train_pipeline_trains_a_dmp_like_a_plain_loop(run_ranks, overlap):
    """The model's only collection is inside the feature-processed module: the ranks agree by
    flags (see [Note: deferred agreement])."""
    assert run_ranks(_pipelined, 2, overlap) == [True, True]
