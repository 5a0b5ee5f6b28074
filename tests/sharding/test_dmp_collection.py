"""`DMPCollection` (2-D parallelism, issue 27) on 4 CPU ranks: 2 sharding groups of 2 ranks,
synced after every step with SGD, train exactly as the single-group model on the global batch
(the unsharded DLRM, as a single-group DMP does); synced every 2 steps, the replicas of a shard
differ between syncs and agree after; a checkpoint saved by the 4 ranks loads back and training
goes on as the reference's."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from shardkit import checkpoint
from shardkit.distributed.model_parallel import DMPCollection
from shardkit.optim import EmbOptimType
from shardkit.sharding import EmbeddingBagCollectionSharder
from shardkit.types import ShardingPlan
from tests.sharding.common import (
    assert_pairs_close,
    dlrm,
    dlrm_batch,
    dlrm_plan,
    local_part,
    table_pairs,
    with_fused,
)

LOCAL_BATCH = 2
GROUP = 2  # sharding group size
LR = 0.2
FUSED = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.05}


def _collection(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    model = dlrm()
    reference = copy.deepcopy(model)
    plan = ShardingPlan({"sparse_arch.embedding_bag_collection": dlrm_plan(model, kind, GROUP)})
    dmpc = DMPCollection(
        module=model, device=torch.device("cpu"), plan=plan, world_size=dist.get_world_size(),
        sharding_group_size=GROUP, global_pg=dist.group.WORLD,
        sharders=[EmbeddingBagCollectionSharder(fused_params=FUSED)],
    )  # fmt: skip
    tables = [p for n, p in dmpc.named_parameters() if "embedding_bags" in n]
    replicas = [p for p in tables if not hasattr(p, "_shardkit_replica") and p.requires_grad]
    dense = [p for n, p in dmpc.named_parameters() if "embedding_bags" not in n]
    groups = [{"params": dense}]
    if kind == "data_parallel":  # dense-kernel replicas: DDP over every rank, the fused rate
        groups.append({"params": replicas, "lr": FUSED["learning_rate"]})
    optimizer = torch.optim.SGD(groups, lr=LR)
    return dmpc, optimizer, reference


def _reference_optimizer(reference, kind: str):
    ref_ebc = with_fused(reference, FUSED)
    dense = [p for n, p in reference.named_parameters() if "embedding_bags" not in n]
    groups = [{"params": dense}]
    if kind == "data_parallel":
        groups = [{"params": list(reference.parameters())}]
        ref_ebc = reference.sparse_arch.embedding_bag_collection
        groups = [
            {"params": dense},
            {"params": list(ref_ebc.parameters()), "lr": FUSED["learning_rate"]},
        ]
    return torch.optim.SGD(groups, lr=LR), ref_ebc


def _step(model, optimizer, step, rank, world_size, *, local: bool) -> float:
    loss_fn = torch.nn.BCEWithLogitsLoss()
    dense, sparse, labels = dlrm_batch(step, LOCAL_BATCH * world_size)
    if local:
        mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        dense, sparse, labels = dense[mine], local_part(sparse, rank, world_size), labels[mine]
    loss = loss_fn(model(dense, sparse).squeeze(1), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def _pairs(dmpc, reference, ref_ebc):
    ours = {n: p for n, p in dmpc.named_parameters() if "embedding_bags" not in n}
    theirs = {n: p for n, p in reference.named_parameters() if "embedding_bags" not in n}
    pairs = [(f"dense {n}", a.detach(), theirs[n].detach().clone()) for n, a in ours.items()]
    sharded = dmpc.module.sparse_arch.embedding_bag_collection
    return pairs + table_pairs(sharded, ref_ebc, "embedding_bags")


def _synced_every_step(rank, world_size, kind, root):
    dmpc, optimizer, reference = _collection(kind)
    ref_optimizer, ref_ebc = _reference_optimizer(reference, kind)
    losses = []
    for step in range(4):
        _step(dmpc, optimizer, step, rank, world_size, local=True)
        dmpc.sync()
        losses.append(_step(reference, ref_optimizer, step, rank, world_size, local=False))
    before = _pairs(dmpc, reference, ref_ebc)
    checkpoint.save(root, step=4, model=dmpc, optimizer=optimizer)
    resumed, resumed_optimizer, _ = _collection(kind, seed=7)
    checkpoint.load(root, model=resumed, optimizer=resumed_optimizer)
    for step in range(4, 6):
        _step(resumed, resumed_optimizer, step, rank, world_size, local=True)
        resumed.sync()
        losses.append(_step(reference, ref_optimizer, step, rank, world_size, local=False))
    ranks = [s.placement.rank() for s in next(iter(resumed.plan.plan.values()))["t0"].sharding_spec.shards] if kind != "data_parallel" else []  # fmt: skip
    return before, _pairs(resumed, reference, ref_ebc), losses, ranks


@pytest.mark.parametrize("kind", ["row_wise", "table_wise", "data_parallel"])
def test_synced_every_step_trains_as_one_group_and_checkpoints(run_ranks, tmp_path, kind):
    results = run_ranks(_synced_every_step, 4, kind, str(tmp_path))
    assert_pairs_close([before for before, _, _, _ in results], atol=1e-5)
    assert_pairs_close([after for _, after, _, _ in results], atol=1e-5)
    losses = results[0][2]
    assert losses[-1] < losses[0], losses
    if kind == "row_wise":  # the plan as TorchRec shows it: this group's global ranks
        assert [r[3] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]


def _synced_every_other_step(rank, world_size):
    dmpc, optimizer, _ = _collection("row_wise")
    sharded = dmpc.module.sparse_arch.embedding_bag_collection
    replica = dmpc._replica_pg  # ranks holding the same shards: [0, 1] and [2, 3]

    def spread() -> float:  # how far this shard is from its replica's
        mine = torch.cat([p.detach().reshape(-1) for p in sharded.parameters()])
        both = [torch.empty_like(mine) for _ in range(2)]
        dist.all_gather(both, mine, group=replica)
        return float((both[0] - both[1]).abs().max())

    spreads = []
    for step in range(4):
        _step(dmpc, optimizer, step, rank, world_size, local=True)
        spreads.append(spread())
        if step % 2 == 1:
            dmpc.sync()
            spreads.append(spread())
    return spreads


def test_replicas_drift_between_syncs_and_agree_after(run_ranks):
    for spreads in run_ranks(_synced_every_other_step, 4):
        drifted, synced = spreads[0::3] + spreads[1::3], spreads[2::3]
        assert min(drifted) > 0 and max(synced) == 0, spreads


def test_sharding_group_size_must_divide_the_world(run_ranks):
    assert run_ranks(_bad_group, 4) == ["raised"] * 4


def _bad_group(rank, world_size):
    with pytest.raises(ValueError, match=r"sharding_group_size=3 must divide world_size=4"):
        DMPCollection(module=dlrm(), device=torch.device("cpu"), plan=ShardingPlan({}),
                      world_size=4, sharding_group_size=3, global_pg=dist.group.WORLD)  # fmt: skip
    return "raised"
