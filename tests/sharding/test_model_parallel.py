"""DistributedModelParallel: a DLRM trained 20 steps under DMP equals its single-process run;
plans, state dicts and the fused optimizer; ranks that disagree fail together, naming why."""

from __future__ import annotations

import copy

import pytest
import torch

from shardkit import EmbeddingBagCollection, KeyedJaggedTensor
from shardkit.distributed import DistributedModelParallel
from shardkit.optim import EmbOptimType
from shardkit.sharding import EmbeddingBagCollectionSharder, InputError
from shardkit.types import ShardingPlan
from tests.devices import CPU_AND_GPU, DEVICE_TIER
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

LOCAL_BATCH = 4


def _train_dlrm(rank: int, world_size: int, kind: str | None, optimizer: str, *, device=None):
    """20 steps of DLRM under DMP on ``device`` (default CPU) and unsharded on the CPU on the
    global batch. With "sgd" (dense SGD, fused SGD tables) every update is proportional to its
    gradient, so a gradient divided by the wrong number shows; "adam" (row-wise Adagrad tables)
    is the usual setting. Returns (on the CPU) this rank's dense parameters and table shards
    beside the reference's, and the reference's first and last five losses."""
    device = device or torch.device("cpu")
    torch.manual_seed(0)
    model = dlrm()
    reference = copy.deepcopy(model)
    table_optimizer = {"sgd": EmbOptimType.EXACT_SGD, "adam": EmbOptimType.EXACT_ROWWISE_ADAGRAD}
    lr = {"sgd": 0.2, "adam": 0.01}[optimizer]
    fused = {"optimizer": table_optimizer[optimizer], "learning_rate": 0.05}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused)]
    plan = None
    if kind is not None:
        plan = ShardingPlan(
            {"sparse_arch.embedding_bag_collection": dlrm_plan(model, kind, world_size)}
        )
    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=sharders)
    dense_optimizer = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam}[optimizer]
    dense_params = [p for n, p in dmp.named_parameters() if "embedding_bags" not in n]
    # data-parallel tables step with the dense optimizer, at the rate of the fused tables
    tables = [(n, p) for n, p in dmp.named_parameters() if "embedding_bags" in n]
    replicas = [p for n, p in tables if ".shards." not in n]
    optim = dense_optimizer([{"params": dense_params}, {"params": replicas, "lr": 0.05}], lr=lr)
    ref_ebc = with_fused(reference, fused)
    ref_optimizer = dense_optimizer(
        [p for n, p in reference.named_parameters() if "embedding_bags" not in n], lr=lr
    )
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses = []
    for step in range(20):
        dense, sparse, labels = dlrm_batch(step, LOCAL_BATCH * world_size)
        mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        features = local_part(sparse, rank, world_size).to(device)
        loss = loss_fn(dmp(dense[mine].to(device), features).squeeze(1), labels[mine].to(device))
        optim.zero_grad()
        loss.backward()
        optim.step()
        ref_loss = loss_fn(reference(dense, sparse).squeeze(1), labels)
        ref_optimizer.zero_grad()
        ref_loss.backward()
        ref_optimizer.step()
        losses.append(ref_loss.item())
    ours = {n: p for n, p in dmp.named_parameters() if "embedding_bags" not in n}
    theirs = {n: p for n, p in reference.named_parameters() if "embedding_bags" not in n}
    assert len(ours) == len(theirs) > 0
    pairs = [
        (f"dense {n}", a.detach().cpu(), b.detach().clone())
        for (n, a), b in zip(ours.items(), theirs.values())
    ]
    sharded = dmp.module.sparse_arch.embedding_bag_collection
    pairs += table_pairs(sharded, ref_ebc, "embedding_bags")
    return pairs, sum(losses[:5]), sum(losses[-5:])


@pytest.mark.parametrize("device", CPU_AND_GPU)
@pytest.mark.parametrize(
    ("world_size", "kind", "optimizer"),
    [
        (2, None, "adam"),
        (2, "row_wise", "sgd"),
        (3, "table_wise", "adam"),
        (3, "column_wise", "sgd"),
        (2, "data_parallel", "sgd"),  # replicas' gradients averaged by DDP, as the dense ones
        (3, "data_parallel_fused", "adam"),  # replicas exchange touched rows, beside DDP
    ],
)
def test_dlrm_under_dmp_matches_single_process(run_ranks, world_size, kind, optimizer, device):
    results = run_ranks(_train_dlrm, world_size, kind, optimizer, device=device)
    assert_pairs_close([pairs for pairs, _, _ in results], atol=1e-4)
    for _, first, last in results:
        assert last < first, "training lowers the loss"


@pytest.mark.parametrize("device", DEVICE_TIER)
@pytest.mark.parametrize("kind", ["row_wise", "table_wise"])
def test_dlrm_under_dmp_on_a_device(run_ranks, kind, device):
    """DMP with its dense part under DDP, both on a device that is not the CPU (see
    tests/devices.py), against the unsharded model on the CPU."""
    results = run_ranks(_train_dlrm, 2, kind, "adam", device=device)
    assert_pairs_close([pairs for pairs, _, _ in results], atol=1e-4)
    for _, first, last in results:
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
    return kinds, out.detach(), expected.detach()


def test_state_dict_carries_shards_with_offsets_and_loads_full_tables(run_ranks):
    for kinds, out, expected in run_ranks(_state_dict_round_trip, 2):
        torch.testing.assert_close(out, expected, rtol=0, atol=1e-6)
        assert kinds == {
            "embedding_bags.t0.weight": "ShardedTensor",
            "embedding_bags.t1.weight": "ShardedTensor",
            "embedding_bags.t2.weight": "ShardedTensor",
            "embedding_bags.t3.weight": "Tensor",  # data-parallel
        }


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
        assert after == pytest.approx([0.05] * len(after), rel=1e-12)
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
        ("keys", [r"rank\(s\) \[1\] refused", r"lacks the module's features \['e'\]"]),
        ("ids", [r"feature 'a' \(table 't0'\): id 99", r"rank\(s\) \[0\] refused"]),
    ],
)
def test_ranks_that_disagree_fail_together(run_ranks, case, expected):
    import re

    for rank, message in enumerate(run_ranks(_disagree, 2, case)):
        assert re.search(expected[rank], message), (rank, message)


def test_ranks_with_different_plans_fail_together(run_ranks):
    assert run_ranks(_disagree, 2, "plan") == ["raised", "raised"]
