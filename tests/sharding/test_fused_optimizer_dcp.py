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
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.api import CheckpointException

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
        want = expected[key]  # the unsharded module's names are TorchRec's too
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


def _fused_pairs(what: str, module, reference) -> list:
    """An unsharded module's weights and fused state against ``reference``'s, by key."""
    state = module.fused_optimizer.state_dict()["state"]
    expected = reference.fused_optimizer.state_dict()["state"]
    assert {k: sorted(v) for k, v in state.items()} == {k: sorted(v) for k, v in expected.items()}
    pairs = [(f"{what}: {k}", v.detach().clone(), reference.state_dict()[k].detach().clone())
             for k, v in module.state_dict().items()]  # fmt: skip
    for key, entry in expected.items():
        pairs += [
            (f"{what}: {key} {k}", state[key][k].clone(), v.clone()) for k, v in entry.items()
        ]
    return pairs


def _unsharded_and_sharded(rank: int, world_size: int, root: str, case: str) -> list:
    """The unsharded module's DCP checkpoint loads into the sharded one and the other way
    round (the same keys: TorchRec's names); both then train on alike."""
    kind, _, plan = CASES[case]
    reference = _reference(kind, 3)
    unsharded = {"model": reference.state_dict(), "optim": reference.fused_optimizer.state_dict()}
    dcp.save(unsharded, checkpoint_id=f"{root}/unsharded")
    torch.manual_seed(1)
    sharded = _dmp(_ebc(kind), plan, world_size)
    state = {"model": sharded.state_dict(), "optim": sharded.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id=f"{root}/unsharded")
    sharded.load_state_dict(state["model"])
    sharded.fused_optimizer.load_state_dict(state["optim"])
    pairs = [(f"loaded: {w}", a.clone(), b.clone()) for w, a, b in _whole_state(sharded, reference)]
    _train((sharded, reference), rank, world_size, range(3, 4))
    pairs += [
        (f"stepped: {w}", a.clone(), b.clone()) for w, a, b in _whole_state(sharded, reference)
    ]
    state = {"model": sharded.state_dict(), "optim": sharded.fused_optimizer.state_dict()}
    dcp.save(state, checkpoint_id=f"{root}/sharded")
    fresh = _ebc(kind)
    state = {"model": fresh.state_dict(), "optim": fresh.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id=f"{root}/sharded")
    fresh.load_state_dict(state["model"])
    fresh.fused_optimizer.load_state_dict(state["optim"])
    pairs += _fused_pairs("back to unsharded", fresh, reference)
    for module in (fresh, reference):
        module(global_batch(4, GLOBAL_BATCH, False)).values().sum(1).pow(2).mean().backward()
    return pairs + _fused_pairs("and stepped", fresh, reference)


# Adam's names differ from its buffers' (exp_avg is momentum1); row-wise Adagrad (no step
# count, slow tier: the default run's budget) keeps its buffer's name
@pytest.mark.parametrize("case", ["adam", pytest.param("rowwise_adagrad", marks=pytest.mark.slow)])
def test_fused_optimizer_state_of_the_unsharded_module_loads_into_the_sharded_one_by_dcp(
    run_ranks, tmp_path, case
):
    assert_pairs_close(run_ranks(_unsharded_and_sharded, 2, str(tmp_path), case), atol=1e-6)


def _without_step_counts(rank: int, world_size: int, root: str) -> list:
    """A checkpoint in TorchRec's layout of Adam (FBGEMM's GPU kernels; no ``t.step``): a
    strict load names the missing count; a partial load takes the rest, the counts restart
    (as TorchRec's do), and training goes on as the unsharded module's with restarted counts."""
    kind, _, plan = CASES["adam"]
    reference = _reference(kind, 3)
    optim = reference.fused_optimizer.state_dict()
    for entry in optim["state"].values():
        for key in [k for k in entry if k.endswith(".step")]:
            del entry[key]
    dcp.save({"model": reference.state_dict(), "optim": optim}, checkpoint_id=root)
    torch.manual_seed(1)
    sharded = _dmp(_ebc(kind), plan, world_size)
    state = {"model": sharded.state_dict(), "optim": sharded.fused_optimizer.state_dict()}
    missing = r"Missing key in checkpoint state_dict: optim\.state\.embedding_bags\.t\d\.weight\.t\d\.step"
    with pytest.raises(CheckpointException, match=missing):
        dcp.load(state, checkpoint_id=root)
    dcp.load(state, checkpoint_id=root, planner=DefaultLoadPlanner(allow_partial_load=True))
    sharded.load_state_dict(state["model"])
    sharded.fused_optimizer.load_state_dict(state["optim"])
    for entry in reference.fused_optimizer.state.values():
        entry["step"].zero_()  # what the sharded module's counts must be: restarted
    pairs = [(f"loaded: {w}", a.clone(), b.clone()) for w, a, b in _whole_state(sharded, reference)]
    _train((sharded, reference), rank, world_size, range(3, 4))
    return pairs + _whole_state(sharded, reference)


@pytest.mark.slow  # a third load of the same kind; the default run has the strict ones
def test_adam_state_without_step_counts_loads_partially_and_restarts_the_counts(
    run_ranks, tmp_path
):
    assert_pairs_close(run_ranks(_without_step_counts, 2, str(tmp_path)), atol=1e-6)
