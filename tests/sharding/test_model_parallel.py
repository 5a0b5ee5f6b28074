"""DistributedModelParallel: a DLRM trained 20 steps under DMP equals its single-process run;
plans, state dicts and the fused optimizer; ranks that disagree fail together, naming why."""

from __future__ import annotations

import copy

import pytest
import torch

from shardkit import EmbeddingBagCollection, KeyedJaggedTensor
from shardkit.distributed import DistributedModelParallel
from shardkit.models import DLRM
from shardkit.optim import EmbOptimType
from shardkit.planner import ShardingPlan
from shardkit.sharding import EmbeddingBagCollectionSharder, InputError
from tests.sharding.common import (
    configs,
    dlrm,
    dlrm_batch,
    global_batch,
    local_part,
    make_plan,
)

LOCAL_BATCH = 4


def _train_dlrm(rank: int, world_size: int, kind: str | None):
    torch.manual_seed(0)
    model = dlrm()
    reference = copy.deepcopy(model)
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused)]
    plan = None
    if kind is not None:
        plan = ShardingPlan(
            {"sparse_arch.embedding_bag_collection": _plan_of(model, kind, world_size)}
        )
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders)
    dense_params = [p for n, p in dmp.named_parameters() if ".shards." not in n]
    optimizer = torch.optim.Adam(dense_params, lr=0.01)
    ref_ebc = reference.sparse_arch.embedding_bag_collection
    ref_ebc = _with_fused(reference, fused)
    ref_optimizer = torch.optim.Adam(
        [p for n, p in reference.named_parameters() if "embedding_bags" not in n], lr=0.01
    )
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses = []
    for step in range(20):
        dense, sparse, labels = dlrm_batch(step, LOCAL_BATCH * world_size)
        mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        loss = loss_fn(
            dmp(dense[mine], local_part(sparse, rank, world_size)).squeeze(1), labels[mine]
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ref_loss = loss_fn(reference(dense, sparse).squeeze(1), labels)
        ref_optimizer.zero_grad()
        ref_loss.backward()
        ref_optimizer.step()
        losses.append(ref_loss.item())
    dense_diff = max(
        (a - b).abs().max().item()
        for (n, a), (_, b) in zip(
            ((n, p) for n, p in dmp.named_parameters() if "embedding_bags" not in n),
            ((n, p) for n, p in reference.named_parameters() if "embedding_bags" not in n),
        )
    )
    table_diff = 0.0
    sharded = dmp.module.sparse_arch.embedding_bag_collection
    for name, table in sharded.embedding_bags.items():
        full = ref_ebc.embedding_bags[name].weight.detach()
        for shard, param in zip(table.shard_slices, table.shards):
            block = full[
                shard.row_start : shard.row_start + shard.rows,
                shard.col_start : shard.col_start + shard.cols,
            ]
            table_diff = max(table_diff, (param.detach() - block).abs().max().item())
    return dense_diff, table_diff, sum(losses[:5]), sum(losses[-5:])


def _with_fused(reference: DLRM, fused) -> EmbeddingBagCollection:
    """Give the reference's tables the same fused optimizer the sharder gives the DMP's."""
    old = reference.sparse_arch.embedding_bag_collection
    new = EmbeddingBagCollection(tables=old.embedding_bag_configs(), fused_params=fused)
    new.load_state_dict(old.state_dict())
    reference.sparse_arch.embedding_bag_collection = new
    return new


def _plan_of(model: DLRM, kind: str, world_size: int):
    ebc = model.sparse_arch.embedding_bag_collection
    from shardkit.sharding import column_wise, construct_module_sharding_plan, row_wise, table_wise

    gens = {
        "table_wise": lambda i: table_wise(rank=i % world_size),
        "row_wise": lambda i: row_wise(),
        "column_wise": lambda i: column_wise(ranks=list(range(world_size))),
    }[kind]
    return construct_module_sharding_plan(
        ebc, {f"t{i}": gens(i) for i in range(4)}, world_size=world_size, device_type="cpu"
    )


@pytest.mark.parametrize(("world_size", "kind"), [(2, None), (2, "row_wise"), (3, "table_wise")])
def test_dlrm_under_dmp_matches_single_process(run_ranks, world_size, kind):
    for rank, (dense, tables, first, last) in enumerate(run_ranks(_train_dlrm, world_size, kind)):
        assert dense < 1e-4, f"rank {rank}: dense parameters differ by {dense}"
        assert tables < 1e-4, f"rank {rank}: tables differ by {tables}"
        assert last < first, "training lowers the loss"


def _state_dict_round_trip(rank: int, world_size: int):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=configs())
    full = {k: v.clone() for k, v in ebc.state_dict().items()}
    plan = make_plan(ebc, "mixed", world_size, world_size)
    dmp = DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}))
    state = dmp.state_dict()
    kinds = {k: type(v).__name__ for k, v in state.items()}
    # every shard carries its global offsets and equals that block of the unsharded table
    for key, value in state.items():
        if type(value).__name__ == "ShardedTensor":
            assert list(value.size()) == list(full[key].shape)
            for shard in value.local_shards():
                (row, col), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                assert torch.equal(shard.tensor, full[key][row : row + rows, col : col + cols])
        else:
            assert torch.equal(value, full[key])
    # loading the unsharded tables (full tensors) puts each block where it belongs
    changed = {k: v + 1.0 for k, v in full.items()}
    dmp.load_state_dict(changed)
    kjt = global_batch(1, 2 * world_size, False)
    reference = EmbeddingBagCollection(tables=configs())
    reference.load_state_dict(changed)
    out = dmp(local_part(kjt, rank, world_size)).values()
    expected = reference(kjt).values()[rank * 2 : (rank + 1) * 2]
    return kinds, (out - expected).abs().max().item()


def test_state_dict_carries_shards_with_offsets_and_loads_full_tables(run_ranks):
    for kinds, diff in run_ranks(_state_dict_round_trip, 2):
        assert kinds == {
            "embedding_bags.t0.weight": "ShardedTensor",
            "embedding_bags.t1.weight": "ShardedTensor",
            "embedding_bags.t2.weight": "ShardedTensor",
            "embedding_bags.t3.weight": "Tensor",  # data-parallel
        }
        assert diff < 1e-6


def _fused_optimizer_lr(rank: int, world_size: int):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=configs())
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.5}
    dmp = DistributedModelParallel(
        ebc, sharders=[EmbeddingBagCollectionSharder(fused_params=fused)]
    )
    optimizer = dmp.fused_optimizer
    lrs = [g["lr"] for g in optimizer.param_groups]
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)
    optimizer.step()
    scheduler.step()
    state = optimizer.state_dict()
    return lrs, [g["lr"] for g in optimizer.param_groups], sorted(state["state"])[:1]


def test_fused_optimizer_learning_rate_changes(run_ranks):
    for lrs, after, keys in run_ranks(_fused_optimizer_lr, 2):
        assert set(lrs) == {0.5}
        assert all(abs(lr - 0.05) < 1e-12 for lr in after)
        assert not keys or keys[0].startswith("embedding_bags.")


def _disagree(rank: int, world_size: int, case: str):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=configs())
    if case == "plan":
        kinds = ["table_wise", "row_wise"]
        plan = make_plan(ebc, kinds[rank], world_size, world_size)
        with pytest.raises(
            ValueError,
            match=r"ranks hold different sharding plans: rank\(s\) \[1\] differ from rank 0",
        ):
            DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}))
        return "raised"
    dmp = DistributedModelParallel(ebc, plan=ShardingPlan({"": make_plan(ebc, "row_wise", 2, 2)}))
    kjt = global_batch(0, 4, False)
    mine = local_part(kjt, rank, world_size)
    if case == "batch size" and rank == 1:
        mine = local_part(global_batch(0, 6, False), 0, 2)
    if case == "keys" and rank == 1:
        mine = mine.permute([0, 1, 2, 3])  # drops 'e'
    if case == "ids" and rank == 0:
        values = mine.values().clone()
        values[0] = 99
        mine = KeyedJaggedTensor(keys=mine.keys(), values=values, lengths=mine.lengths())
    with pytest.raises(InputError) as info:
        dmp(mine)
    return str(info.value)


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("batch size", [r"ranks disagree on the batch size: \{0: 2, 1: 3\}"] * 2),
        ("keys", [r"rank\(s\) \[1\] refused", r"missing \['e'\], extra \[\]"]),
        ("ids", [r"feature 'a' \(table 't0'\): id 99", r"rank\(s\) \[0\] refused"]),
    ],
)
def test_ranks_that_disagree_fail_together(run_ranks, case, expected):
    import re

    for rank, message in enumerate(run_ranks(_disagree, 2, case)):
        assert re.search(expected[rank], message), (rank, message)


def test_ranks_with_different_plans_fail_together(run_ranks):
    assert run_ranks(_disagree, 2, "plan") == ["raised", "raised"]
