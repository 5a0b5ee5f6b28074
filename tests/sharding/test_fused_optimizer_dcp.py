"""The fused optimizer's state in TorchRec's layout through torch.distributed.checkpoint (issue
27): saved under one plan, loaded into a model sharded by another (every sharding type on one
side or the other), its whole state (weights, row-wise Adagrad's per-row momentum, Adam's
moments and step count) equals the unsharded module's trained alike. See [Note: fused
optimizer state in TorchRec's layout]."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from shardkit import EmbeddingBagCollection
from shardkit.distributed import DistributedModelParallel
from shardkit.optim import EmbOptimType
from shardkit.sharding import (
    EmbeddingBagCollectionSharder,
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from shardkit.types import ShardingPlan
from tests.sharding.common import (
    assert_pairs_close,
    configs,
    global_batch,
    local_part,
    table_pairs,
    torchrec_named,
)

GLOBAL_BATCH = 6  # split over the ranks; the unsharded module trains on all of it
# (rule, the plan saved, the plan loaded): each of TW, RW, CW, TWRW, DP on one side at least.
# Column shards keep their own row-wise accumulators (unlike the unsharded module), so the
# column-wise plans go with Adam, whose state is per element.
CASES = {
    "rowwise_adagrad": (
        EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        {"t0": table_wise(rank=0), "t1": row_wise(), "t2": table_row_wise(host_index=0),
         "t3": data_parallel(compute_kernel="fused")},
        {"t0": row_wise(), "t1": table_row_wise(host_index=0), "t2": table_wise(rank=1),
         "t3": row_wise()},
    ),
    "adam": (
        EmbOptimType.ADAM,
        {"t0": column_wise(ranks=[0, 1]), "t1": table_wise(rank=1), "t2": row_wise(),
         "t3": table_row_wise(host_index=0)},
        {"t0": table_wise(rank=1), "t1": column_wise(ranks=[1, 0]), "t2": column_wise(ranks=[0, 1]),
         "t3": data_parallel(compute_kernel="fused")},
    ),
}  # fmt: skip


def _dmp(ebc, per_table, world_size: int) -> DistributedModelParallel:
    plan = construct_module_sharding_plan(
        ebc, per_table, world_size=world_size, local_size=world_size, device_type="cpu"
    )
    return DistributedModelParallel(
        copy.deepcopy(ebc),
        plan=ShardingPlan({"": plan}),
        sharders=[EmbeddingBagCollectionSharder()],
    )


def _train(models, rank: int, world_size: int, steps: range) -> None:
    """Sharded models on this rank's part of the batch, the unsharded one on all of it, with
    losses whose gradients agree (the sharded tables' are averaged over the ranks)."""
    dmp, reference = models
    for step in steps:
        kjt = global_batch(step, GLOBAL_BATCH, False)
        dmp(local_part(kjt, rank, world_size)).values().sum(1).pow(2).mean().backward()
        reference(kjt).values().sum(1).pow(2).mean().backward()


def _whole_state(dmp, reference) -> list:
    """`table_pairs` (every shard's weights and fused state against the unsharded module's),
    and each data-parallel replica's fused state against the whole table's."""
    pairs = table_pairs(dmp.module, reference, "embedding_bags")
    state = dmp.fused_optimizer.state_dict()["state"]
    expected = reference.fused_optimizer.state_dict()["state"]
    for name, table in dmp.module.embedding_bags.items():
        if hasattr(table, "shard_slices"):
            continue
        key = f"embedding_bags.{name}.weight"
        want = torchrec_named(expected[key], name)
        if f"{name}.step" not in state[key]:
            want.pop(f"{name}.step")
        assert sorted(state[key]) == sorted(want), (sorted(state[key]), sorted(want))
        pairs += [(f"replica {name}: {k}", state[key][k], v) for k, v in want.items()]
    return pairs


def _save_and_reshard(rank: int, world_size: int, case: str, root: str):
    kind, saved_plan, loaded_plan = CASES[case]
    torch.manual_seed(0)
    fused = {"optimizer": kind, "learning_rate": 0.1, "eps": 1e-8}
    ebc = EmbeddingBagCollection(tables=configs(), fused_params=fused)
    reference = copy.deepcopy(ebc)
    saved = _dmp(ebc, saved_plan, world_size)
    _train((saved, reference), rank, world_size, range(3))
    # clones: the pairs hold views of the live state, which trains on below
    trained = [
        (f"trained: {w}", a.clone(), b.clone()) for w, a, b in _whole_state(saved, reference)
    ]
    folder = f"{root}/{case}"
    dcp.save(
        {"model": saved.state_dict(), "optim": saved.fused_optimizer.state_dict()},
        checkpoint_id=folder,
    )
    torch.manual_seed(1)  # other weights: everything must come from the checkpoint
    fresh = EmbeddingBagCollection(tables=configs(), fused_params=fused)
    loaded = _dmp(fresh, loaded_plan, world_size)
    state = {"model": loaded.state_dict(), "optim": loaded.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id=folder)
    loaded.load_state_dict(state["model"])
    loaded.fused_optimizer.load_state_dict(state["optim"])
    dist.barrier()
    pairs = [(f"loaded: {w}", a.clone(), b.clone()) for w, a, b in _whole_state(loaded, reference)]
    _train((loaded, reference), rank, world_size, range(3, 4))  # and it trains on alike
    return trained + pairs + _whole_state(loaded, reference)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_optimizer_state_resharded_by_dcp_equals_the_unsharded_module(
    run_ranks, tmp_path, case
):
    assert_pairs_close(run_ranks(_save_and_reshard, 2, case, str(tmp_path)), atol=1e-6)


def _ebc(kind: EmbOptimType) -> EmbeddingBagCollection:
    return EmbeddingBagCollection(tables=configs(), fused_params={"optimizer": kind, "eps": 1e-8})


def _reference(kind: EmbOptimType, steps: int) -> EmbeddingBagCollection:
    """The unsharded module (seed 0) trained on the first ``steps`` global batches."""
    torch.manual_seed(0)
    reference = _ebc(kind)
    for step in range(steps):
        reference(global_batch(step, GLOBAL_BATCH, False)).values().sum(1).pow(2).mean().backward()
    return reference


def _save_at(rank: int, world_size: int, root: str, case: str) -> None:
    """Trained 3 steps under the case's plan for ``world_size`` ranks (seed 0, as
    `_reference`), saved with DCP."""
    kind = CASES[case][0]
    torch.manual_seed(0)
    ebc = _ebc(kind)
    saved = _dmp(ebc, TWO_AND_ONE[case][2 - world_size], world_size)
    _train((saved, copy.deepcopy(ebc)), rank, world_size, range(3))
    state = {"model": saved.state_dict(), "optim": saved.fused_optimizer.state_dict()}
    dcp.save(state, checkpoint_id=root)


def _load_at(rank: int, world_size: int, root: str, case: str) -> list:
    """The checkpoint loaded by a model of other weights (seed 1) sharded by the case's plan
    for ``world_size`` ranks: its state equals the unsharded module trained on the same global
    batches, after the load and after one more step."""
    kind = CASES[case][0]
    reference = _reference(kind, 3)
    torch.manual_seed(1)
    loaded = _dmp(_ebc(kind), TWO_AND_ONE[case][2 - world_size], world_size)
    state = {"model": loaded.state_dict(), "optim": loaded.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id=root)
    loaded.load_state_dict(state["model"])
    loaded.fused_optimizer.load_state_dict(state["optim"])
    pairs = [(f"loaded: {w}", a.clone(), b.clone()) for w, a, b in _whole_state(loaded, reference)]
    _train((loaded, reference), rank, world_size, range(3, 4))
    return pairs + [(f"stepped: {w}", a, b) for w, a, b in _whole_state(loaded, reference)]


# (the plan at 2 ranks, the plan at 1 rank) of each case: table-wise, row-wise,
# table-row-wise, column-wise (Adam's) and data-parallel on one side at least
TWO_AND_ONE = {
    "rowwise_adagrad": (
        {"t0": row_wise(), "t1": table_wise(rank=1), "t2": row_wise(), "t3": table_wise(rank=0)},
        {"t0": table_wise(rank=0), "t1": row_wise(), "t2": table_row_wise(host_index=0),
         "t3": data_parallel(compute_kernel="fused")},
    ),
    "adam": (
        {"t0": column_wise(ranks=[0, 1]), "t1": table_wise(rank=1), "t2": row_wise(),
         "t3": table_row_wise(host_index=0)},
        {"t0": column_wise(ranks=[0, 0]), "t1": table_wise(rank=0), "t2": row_wise(),
         "t3": data_parallel(compute_kernel="fused")},
    ),
}  # fmt: skip


@pytest.mark.slow  # two rank pools (2, then 1 rank): ~10 s on a loaded 2-core machine
@pytest.mark.parametrize("case", sorted(TWO_AND_ONE))
def test_fused_optimizer_state_saved_by_two_ranks_loads_on_one(run_ranks, tmp_path, case):
    run_ranks(_save_at, 2, str(tmp_path), case)
    assert_pairs_close(run_ranks(_load_at, 1, str(tmp_path), case), atol=1e-6)


@pytest.mark.slow  # two rank pools (1, then 2 ranks)
@pytest.mark.parametrize("case", sorted(TWO_AND_ONE))
def test_fused_optimizer_state_saved_by_one_rank_loads_on_two(run_ranks, tmp_path, case):
    run_ranks(_save_at, 1, str(tmp_path), case)
    assert_pairs_close(run_ranks(_load_at, 2, str(tmp_path), case), atol=1e-6)
