"""DistributedModelParallel with its dense part fully sharded (`FullyShardDataParallelWrapper`):
model-parallel tables and `fully_shard` dense layers in one model equal the unsharded model
(losses, dense gradients, parameters and optimizer state after steps) and survive a checkpoint
round trip whole."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.tensor import DTensor

from shardkit import EmbeddingBagCollection, checkpoint
from shardkit.distributed import DistributedModelParallel
from shardkit.fsdp import FSDPModule
from shardkit.optim import EmbOptimType
from shardkit.sharding import EmbeddingBagCollectionSharder, FullyShardDataParallelWrapper
from shardkit.types import ShardingPlan
from tests.sharding.common import (
    assert_pairs_close,
    configs,
    dlrm,
    dlrm_batch,
    dlrm_plan,
    global_batch,
    local_part,
    make_plan,
    table_pairs,
    with_fused,
)

LOCAL_BATCH = 3
STEPS = 6
TABLE_OPTIMIZER = {"sgd": EmbOptimType.EXACT_SGD, "adam": EmbOptimType.EXACT_ROWWISE_ADAGRAD}


def _dense_optimizer(optimizer: str, params):
    if optimizer == "sgd":  # momentum: the optimizer has state to compare
        return torch.optim.SGD(params, lr=0.2, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def _build(world_size: int, kind: str, optimizer: str):
    torch.manual_seed(0)
    model = dlrm()
    reference = copy.deepcopy(model)
    fused = {"optimizer": TABLE_OPTIMIZER[optimizer], "learning_rate": 0.05}
    plan = ShardingPlan(
        {"sparse_arch.embedding_bag_collection": dlrm_plan(model, kind, world_size)}
    )
    dmp = DistributedModelParallel(
        model,
        plan=plan,
        sharders=[EmbeddingBagCollectionSharder(fused_params=fused)],
        data_parallel_wrapper=FullyShardDataParallelWrapper(),
    )
    ref_ebc = with_fused(reference, fused)
    return dmp, reference, ref_ebc


def _dense(named) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in named if "embedding_bags" not in n}


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value, a ShardedTensor's local shards (flattened, in order)."""
    if isinstance(tensor, ShardedTensor):
        return torch.cat([s.tensor.detach().flatten() for s in tensor.local_shards()])
    return (tensor.full_tensor() if isinstance(tensor, DTensor) else tensor).detach().clone()


def _step(dmp, optim, step: int, rank: int, world_size: int) -> float:
    dense, sparse, labels = dlrm_batch(step, LOCAL_BATCH * world_size)
    mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    logits = dmp(dense[mine], local_part(sparse, rank, world_size)).squeeze(1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels[mine])
    optim.zero_grad()
    loss.backward()
    grads = {n: _full(p.grad) for n, p in _dense(dmp.named_parameters()).items()}
    optim.step()
    return loss.detach(), grads


def _ref_step(reference, optim, step: int, world_size: int):
    dense, sparse, labels = dlrm_batch(step, LOCAL_BATCH * world_size)
    logits = reference(dense, sparse).squeeze(1)
    per_example = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, labels, reduction="none"
    )
    loss = per_example.mean()
    optim.zero_grad()
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in _dense(reference.named_parameters()).items()}
    optim.step()
    return per_example.detach(), grads


def _state_pairs(dmp, optim, reference, ref_optim, ref_ebc) -> list:
    """Dense parameters (whole, from the DTensor shards), their optimizer state and the tables
    with their fused state, against the reference's."""
    ours, theirs = _dense(dmp.named_parameters()), _dense(reference.named_parameters())
    assert list(ours) == list(theirs) and ours
    pairs = []
    for (name, param), ref in zip(ours.items(), theirs.values()):
        assert isinstance(param, DTensor), f"{name} is not fully sharded"
        pairs.append((f"dense {name}", _full(param), ref.detach().clone()))
        mine, expected = optim.state[param], ref_optim.state[ref]
        assert sorted(mine) == sorted(expected) and expected, (name, sorted(mine))
        for key, value in expected.items():
            pairs.append((f"{name}: {key}", _full(mine[key]).reshape(value.shape), value.clone()))
    sharded = dmp.module.sparse_arch.embedding_bag_collection
    # data-parallel tables belong to the root unit: read them whole from their DTensor shards
    pairs += [p for p in table_pairs(sharded, ref_ebc, "embedding_bags") if "replica" not in p[0]]
    for name, param in sharded.named_parameters():
        if ".shards." not in name:
            table = name.split(".")[1]
            expected = ref_ebc.embedding_bags[table].weight.detach().clone()
            pairs.append((f"replica of {table}", _full(param), expected))
    return pairs


def _train(rank: int, world_size: int, kind: str, optimizer: str):
    dmp, reference, ref_ebc = _build(world_size, kind, optimizer)
    assert isinstance(dmp.module.over_arch, FSDPModule) and isinstance(dmp.module, FSDPModule)
    dmp.init_data_parallel()  # again: nothing changes
    dense = list(_dense(dmp.named_parameters()).values())
    # data-parallel tables step with the dense optimizer, as the reference's fused SGD does
    replicas = [
        p for n, p in dmp.named_parameters() if "embedding_bags" in n and ".shards." not in n
    ]
    assert replicas or kind != "data_parallel"
    optim = _dense_optimizer(optimizer, dense)
    if replicas:
        optim.add_param_group({"params": replicas, "lr": 0.05, "momentum": 0.0})
    ref_optim = _dense_optimizer(optimizer, list(_dense(reference.named_parameters()).values()))
    pairs = []
    for step in range(STEPS):
        loss, grads = _step(dmp, optim, step, rank, world_size)
        per_example, ref_grads = _ref_step(reference, ref_optim, step, world_size)
        mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        pairs.append((f"step {step} loss", loss, per_example[mine].mean()))
        pairs += [(f"step {step} grad {n}", g, ref_grads[n]) for n, g in grads.items()]
    return pairs + _state_pairs(dmp, optim, reference, ref_optim, ref_ebc)


@pytest.mark.parametrize(
    ("world_size", "kind", "optimizer"),
    [(2, "row_wise", "sgd"), (3, "table_wise", "adam"), (2, "data_parallel", "sgd")],
)
def test_dense_fully_sharded_matches_single_process(run_ranks, world_size, kind, optimizer):
    assert_pairs_close(run_ranks(_train, world_size, kind, optimizer), atol=1e-4)


def _round_trip(rank: int, world_size: int, root: str):
    """Train, save, load into a fresh model: the whole state (dense shards, dense optimizer
    state with its step counters, tables, fused state) equals the saved one, and the next step
    of both equals too."""
    dmp, _, _ = _build(world_size, "row_wise", "adam")
    optim = _dense_optimizer("adam", list(dmp.parameters()))
    for step in range(3):
        _step(dmp, optim, step, rank, world_size)
    checkpoint.save(root, step=3, model=dmp, optimizer=optim)
    fresh, _, _ = _build(world_size, "row_wise", "adam")
    fresh_optim = _dense_optimizer("adam", list(fresh.parameters()))
    checkpoint.load(root, model=fresh, optimizer=fresh_optim)
    pairs = _whole_state_pairs(dmp, optim, fresh, fresh_optim)
    loss, _ = _step(dmp, optim, 3, rank, world_size)
    fresh_loss, _ = _step(fresh, fresh_optim, 3, rank, world_size)
    pairs.append(("loss after loading", fresh_loss, loss))
    return pairs + _whole_state_pairs(dmp, optim, fresh, fresh_optim)


def _whole_state_pairs(saved, saved_optim, loaded, loaded_optim) -> list:
    pairs = []
    for (name, a), (_, b) in zip(saved.named_parameters(), loaded.named_parameters()):
        pairs.append((name, _full(b), _full(a)))
        for key, value in saved_optim.state.get(a, {}).items():
            pairs.append((f"{name}: {key}", _full(loaded_optim.state[b][key]), _full(value)))
    fused, fresh = saved.fused_optimizer.state_dict(), loaded.fused_optimizer.state_dict()
    assert fused["state"] and sorted(fused["state"]) == sorted(fresh["state"])
    for name, entries in fused["state"].items():
        for key, value in entries.items():
            pairs.append((f"fused {name}: {key}", _full(fresh["state"][name][key]), _full(value)))
    return pairs


def test_checkpoint_round_trip_keeps_the_whole_state(run_ranks, tmp_path):
    assert_pairs_close(run_ranks(_round_trip, 2, str(tmp_path / "ckpt")), atol=0)


def _collection_only(rank: int, world_size: int):
    """A model that is one sharded collection: nothing to fully shard; its data-parallel
    table's gradient is still averaged over the ranks (as DDP does)."""
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=configs())
    reference = copy.deepcopy(ebc)
    plan = ShardingPlan({"": make_plan(ebc, "mixed", world_size, world_size)})
    dmp = DistributedModelParallel(
        ebc, plan=plan, data_parallel_wrapper=FullyShardDataParallelWrapper()
    )
    assert not isinstance(dmp.module, FSDPModule)
    kjt = global_batch(1, 2 * world_size, False)
    dmp(local_part(kjt, rank, world_size)).values().sum().backward()
    reference(kjt).values().sum().div(world_size).backward()
    replica = dict(dmp.named_parameters())["embedding_bags.t3.weight"]
    return replica.grad.clone(), reference.embedding_bags["t3"].weight.grad.clone()


def test_a_model_that_is_one_collection_averages_its_replicas(run_ranks):
    for grad, expected in run_ranks(_collection_only, 2):
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-6)
