"""The sharded EmbeddingBagCollection against the unsharded one (the spec): forward outputs on the
global batch, and every table's rows after several steps of training, for every sharding type.

Each rank builds the same unsharded module (same seed), keeps a copy as the reference, shards the
other, and trains both: the sharded one on its part of each global batch, the reference on the
whole global batch, with loss = mean over examples. Data-parallel tables get dense gradients,
averaged here across ranks as DistributedModelParallel's data-parallel wrapper does, and stepped by
SGD (the reference's fused SGD is the same arithmetic). Tolerance: float32, 1e-5.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from shardkit import EmbeddingBagCollection, PoolingType
from shardkit.optim import EmbOptimType
from shardkit.sharding import ShardedEmbeddingBagCollection
from shardkit.types import ShardingEnv
from tests.devices import CPU_AND_GPU, DEVICE_TIER
from tests.sharding.common import (
    assert_pairs_close,
    configs,
    global_batch,
    local_fused_state,
    local_part,
    make_plan,
    table_pairs,
)

KINDS = [
    "table_wise",
    "row_wise",
    "column_wise",
    "table_column_wise",
    "table_row_wise",
    "data_parallel",
    "mixed",
]
LOCAL_BATCH = 3
STEPS = 3


def _train(rank, world_size, kind, pooling, weighted, optimizer, local_size, *, device=None):
    """The sharded module on ``device`` (default CPU), the unsharded reference on the CPU; every
    rank returns (on the CPU) its pooled output of the first step and its tables' weights and
    optimizer state after training, each beside the reference's (see `_check`)."""
    device = device or torch.device("cpu")
    torch.manual_seed(0)
    fused = {"optimizer": optimizer, "learning_rate": 0.1, "eps": 1e-8}
    ebc = EmbeddingBagCollection(tables=configs(pooling), is_weighted=weighted, fused_params=fused)
    reference = copy.deepcopy(ebc)
    plan = make_plan(ebc, kind, world_size, local_size)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = ShardedEmbeddingBagCollection(ebc, plan, env, device, local_world_size=local_size)
    dense = [
        p
        for name, p in sharded.named_parameters()
        if not getattr(p, "_shardkit_embedding_table", False) or name.endswith("weight")
    ]
    dense_opt = torch.optim.SGD([p for p in dense if p.requires_grad], lr=0.1) if dense else None
    pairs = []
    for step in range(STEPS):
        size = LOCAL_BATCH * world_size
        kjt = global_batch(step, size, weighted)
        scale = torch.rand(size, 23, generator=torch.Generator().manual_seed(100 + step))
        out = sharded(local_part(kjt, rank, world_size).to(device))
        if step == 0:
            expected = reference(kjt).values()[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH]
            pairs.append(("forward", out.values().detach().cpu(), expected.detach().clone()))
        mine = scale[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH].to(device)
        (out.values() * mine).sum(1).mean().backward()
        for p in dense:
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        if dense_opt:
            dense_opt.step()
            dense_opt.zero_grad()
        (reference(kjt).values() * scale).sum(1).mean().backward()
    return pairs + table_pairs(sharded, reference, "embedding_bags")


def _optimizer_for(kind: str) -> EmbOptimType:
    """Data-parallel tables step with SGD (see the module docstring). Column shards keep their
    own row-wise Adagrad accumulators (the mean of g**2 over the shard's columns, as in
    TorchRec), so tables split by columns are compared with elementwise Adagrad here and
    `test_row_wise_adagrad_on_column_shards_keeps_one_accumulator_per_shard` pins the rest."""
    if kind in ("data_parallel", "mixed"):
        return EmbOptimType.EXACT_SGD
    if kind in ("column_wise", "table_column_wise", "grid_shard"):
        return EmbOptimType.EXACT_ADAGRAD
    return EmbOptimType.EXACT_ROWWISE_ADAGRAD


def _check(results):
    """Forward outputs, then every table's weights and optimizer state after training, equal the
    unsharded module's on every rank (NaN never passes)."""
    assert_pairs_close(results, atol=1e-5)


@pytest.mark.parametrize("device", CPU_AND_GPU)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize(
    ("pooling", "weighted"), [(PoolingType.SUM, False), (PoolingType.MEAN, True)]
)
def test_every_sharding_type_matches_unsharded(
    run_ranks, kind, world_size, pooling, weighted, device
):
    optimizer = _optimizer_for(kind)
    local = world_size
    _check(run_ranks(_train, world_size, kind, pooling, weighted, optimizer, local, device=device))


@pytest.mark.parametrize("device", DEVICE_TIER)
@pytest.mark.parametrize("kind", [*KINDS[:-1], "grid_shard"])
def test_every_sharding_type_on_a_device(run_ranks, kind, device):
    """Forward, backward and the fused update of every sharding type, with the shards on a
    device that is not the CPU (see tests/devices.py), against the unsharded module on the CPU."""
    optimizer = _optimizer_for(kind)
    results = run_ranks(
        _train, 4, kind, PoolingType.MEAN, True, optimizer, 2, local_world_size=2, device=device
    )
    _check(results)


@pytest.mark.parametrize("device", CPU_AND_GPU)
@pytest.mark.parametrize("optimizer", list(EmbOptimType))
@pytest.mark.parametrize("kind", ["row_wise", "table_wise", "table_row_wise"])
def test_every_fused_optimizer(run_ranks, optimizer, kind, device):
    _check(run_ranks(_train, 2, kind, PoolingType.SUM, True, optimizer, 2, device=device))


@pytest.mark.parametrize("device", CPU_AND_GPU)
@pytest.mark.parametrize("kind", ["table_row_wise", "grid_shard", "mixed", "row_wise"])
def test_two_hosts_of_two(run_ranks, kind, device):
    optimizer = _optimizer_for(kind)
    results = run_ranks(
        _train, 4, kind, PoolingType.SUM, False, optimizer, 2, local_world_size=2, device=device
    )
    _check(results)


def _cw_rowwise(rank: int, world_size: int):
    """Column shards of a row-wise Adagrad table each keep their own per-row accumulator: the
    mean of g**2 over the shard's columns (as FBGEMM/TorchRec do). Check it against that
    formula applied to the unsharded table's dense gradients, block by block."""
    from shardkit.sharding import column_wise, construct_module_sharding_plan

    torch.manual_seed(0)
    lr, eps = 0.1, 1e-8
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": lr, "eps": eps}
    ebc = EmbeddingBagCollection(tables=configs()[:1], fused_params=fused)
    dense = EmbeddingBagCollection(tables=configs()[:1])  # dense gradients, stepped by hand
    dense.load_state_dict(ebc.state_dict())
    plan = construct_module_sharding_plan(
        ebc, {"t0": column_wise(ranks=[0, 1])}, world_size=2, device_type="cpu"
    )
    sharded = ShardedEmbeddingBagCollection(
        ebc, plan, ShardingEnv.from_process_group(dist.group.WORLD)
    )
    weight = dense.embedding_bags["t0"].weight
    blocks = [(0, 2), (2, 4)]
    acc = [torch.zeros(11), torch.zeros(11)]
    for step in range(3):
        kjt = global_batch(step, LOCAL_BATCH * 2, False)
        part = kjt.permute([0, 1])  # features a, b of table t0
        mine = local_part(part, rank, 2)
        scale = torch.rand(LOCAL_BATCH * 2, 8, generator=torch.Generator().manual_seed(step))
        (sharded(mine).values() * scale[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH]).sum(
            1
        ).mean().backward()
        (dense(part).values() * scale).sum(1).mean().backward()
        with torch.no_grad():
            for k, (lo, hi) in enumerate(blocks):
                g = weight.grad[:, lo:hi]
                acc[k] += g.pow(2).mean(1)
                weight[:, lo:hi] -= lr * g / (acc[k].sqrt() + eps).unsqueeze(1)
            weight.grad = None
    shard = sharded.embedding_bags["t0"]
    (lo, hi) = blocks[rank]
    accumulators = sharded.fused_optimizer.state_dict()["state"]["embedding_bags.t0.weight"]
    # TorchRec's layout: one block of rows per column shard, [rows * shards], in column order
    momentum = accumulators["t0.momentum1"]
    rows = weight.shape[0]
    assert list(momentum.size()) == [rows * len(blocks)]
    assert [s.metadata.shard_offsets for s in momentum.local_shards()] == [[rank * rows]]
    state = local_fused_state(accumulators, shard)[0]
    return [
        ("t0 columns", shard.shards[0].detach().clone(), weight.detach()[:, lo:hi].clone()),
        ("t0 accumulator", state["t0.momentum1"].clone(), acc[rank].clone()),
    ]


def test_row_wise_adagrad_on_column_shards_keeps_one_accumulator_per_shard(run_ranks):
    assert_pairs_close(run_ranks(_cw_rowwise, 2), atol=1e-5)
