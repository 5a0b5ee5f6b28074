"""Managed-collision collections sharded row-wise and table-wise against the unsharded module
(the spec) on the global batch: remapped ids and outputs at every step, and tables, fused
optimizer state and remapper state after steps with evictions; checkpoints resharded into
another world size and sharding type."""

from __future__ import annotations

import copy

import pytest
import torch

from shardkit import checkpoint
from shardkit.modules.mc_modules import ManagedCollisionModule
from shardkit.sharding import (
    EmbeddingBagCollectionSharder,
    InputError,
    ManagedCollisionEmbeddingBagCollectionSharder,
    ShardedManagedCollisionEmbeddingBagCollection,
    ShardedManagedCollisionEmbeddingCollection,
    column_wise,
    construct_module_sharding_plan,
    row_wise,
)
from shardkit.types import ShardingEnv, ShardingPlan
from tests.sharding.common import local_part
from tests.sharding.mc import (
    LOCAL_BATCH,
    compare_state,
    env,
    local_output,
    local_remapped,
    loss,
    mc_module,
    plan_for,
    raw_batch,
)

STEPS = 5  # evictions at steps 2 and 4


def _sharded(module, kind, world_size):
    plan = plan_for(module, kind, world_size)
    cls = (
        ShardedManagedCollisionEmbeddingBagCollection
        if hasattr(module, "_embedding_bag_collection")
        else ShardedManagedCollisionEmbeddingCollection
    )
    return cls(module, plan, env())


def _step(sharded, reference, rank, world_size, step, bags):
    kjt = raw_batch(step, LOCAL_BATCH * world_size)
    out, remapped = sharded(local_part(kjt, rank, world_size))
    ref_out, ref_remapped = reference(kjt)
    torch.testing.assert_close(remapped.values(), local_remapped(ref_remapped, rank, world_size))
    mine = out.values() if bags else torch.cat([out[f].values() for f in ("u", "v", "i")])
    torch.testing.assert_close(mine, local_output(ref_out, rank, bags, world_size, kjt))
    loss(out, rank, step, world_size, bags, local=True).backward()
    loss(ref_out, rank, step, world_size, bags, local=False).backward()


def _train(rank, world_size, kind, bags):
    reference = mc_module(bags)
    sharded = _sharded(copy.deepcopy(reference), kind, world_size)
    for step in range(STEPS):
        _step(sharded, reference, rank, world_size, step, bags)
    compare_state(sharded, reference)
    evicted = int((reference._managed_collision_collection.open_slots()["users"] < 7).sum())
    return evicted


@pytest.mark.parametrize("kind", ["row_wise", "table_wise"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sharded_mc_ebc_matches_unsharded(run_ranks, kind, world_size):
    assert all(r == 1 for r in run_ranks(_train, world_size, kind, True))


@pytest.mark.parametrize("kind", ["row_wise", "table_wise"])
def test_sharded_mc_ec_matches_unsharded(run_ranks, kind):
    run_ranks(_train, 2, kind, False)


# -- checkpoints: saved at an eviction, loaded into another world size and sharding type --------

SAVED_AT = 4  # the 4th iteration evicts, so no recorded ids are lost (see the docs)


def _save(rank, world_size, kind, root):
    sharded = _sharded(mc_module(), kind, world_size)
    for step in range(SAVED_AT):
        kjt = raw_batch(step, LOCAL_BATCH * world_size)
        out, _ = sharded(local_part(kjt, rank, world_size))
        loss(out, rank, step, world_size, True, local=True).backward()
    checkpoint.save(root, step=SAVED_AT, model=sharded)


def _resume(rank, world_size, kind, root, saved_world_size):
    reference = mc_module()
    sharded = _sharded(copy.deepcopy(reference), kind, world_size)
    out, _ = sharded(local_part(raw_batch(99, LOCAL_BATCH * world_size), rank, world_size))
    out.values().sum().backward()  # a used model: its remappers' caches must not survive the load
    for step in range(SAVED_AT):  # the reference trains as the saving job did
        ref_out, _ = reference(raw_batch(step, LOCAL_BATCH * saved_world_size))
        loss(ref_out, rank, step, saved_world_size, True, local=False).backward()
    checkpoint.load(root, model=sharded)
    compare_state(sharded, reference)
    for step in range(SAVED_AT, SAVED_AT + 3):
        _step(sharded, reference, rank, world_size, step, True)
    compare_state(sharded, reference)


@pytest.mark.parametrize(
    ("saved", "loaded"), [(("row_wise", 2), ("row_wise", 3)), (("table_wise", 3), ("row_wise", 2))]
)
def test_checkpoint_reshards_tables_with_their_remappers(run_ranks, tmp_path, saved, loaded):
    run_ranks(_save, saved[1], saved[0], str(tmp_path))
    run_ranks(_resume, loaded[1], loaded[0], str(tmp_path), saved[1])


# -- one bucket (MCH's default) row-wise: one bucket per rank, as TorchRec (issue 27) ---------


def _one_bucket(rank, world_size, root):
    # the spec: the unsharded module with a bucket per rank (TorchRec's sharded remappers get
    # buckets = the number of row shards)
    reference = mc_module(buckets=world_size)
    sharded = _sharded(mc_module(buckets=1), "row_wise", world_size)
    for step in range(SAVED_AT):
        _step(sharded, reference, rank, world_size, step, True)
    compare_state(sharded, reference)
    checkpoint.save(root, step=SAVED_AT, model=sharded)
    resumed = _sharded(mc_module(buckets=1), "row_wise", world_size)
    checkpoint.load(root, model=resumed)
    compare_state(resumed, reference)
    for step in range(SAVED_AT, SAVED_AT + 3):
        _step(resumed, reference, rank, world_size, step, True)
    compare_state(resumed, reference)
    return resumed._managed_collision_collection._managed_collision_modules["users"].buckets()


def test_one_bucket_row_wise_gets_a_bucket_per_rank_and_checkpoints(run_ranks, tmp_path):
    assert run_ranks(_one_bucket, 2, str(tmp_path)) == [2, 2]


def test_a_one_bucket_remapper_that_holds_ids_is_not_split():
    module = mc_module(buckets=1)
    module(raw_batch(0, 4))  # trained: its bucket holds ids now
    plan = plan_for(module, "row_wise", 2)
    with pytest.raises(
        ValueError,
        match=r"table 'users': its remapper \(1 bucket\) already holds ids, and row-wise over 2 "
        r"ranks it needs one bucket per rank.*shard it before training",
    ):
        ShardedManagedCollisionEmbeddingBagCollection(module, plan, ShardingEnv(2, 0, None))


# -- DistributedModelParallel, the planner, and a dense layer (DDP must leave remappers alone) --


class _Model(torch.nn.Module):
    def __init__(self, mc):
        super().__init__()
        self.mc = mc
        self.over = torch.nn.Linear(11, 1)

    def forward(self, kjt):
        pooled, _ = self.mc(kjt)
        return self.over(pooled.values())


def _dmp(rank, world_size):
    from shardkit.distributed import DistributedModelParallel
    from shardkit.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    reference = _Model(mc_module())
    constraints = {
        name: ParameterConstraints(sharding_types=["row_wise"]) for name in ("users", "goods")
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, compute_device="cpu"), constraints=constraints
    )
    sharders = [ManagedCollisionEmbeddingBagCollectionSharder()]
    model = copy.deepcopy(reference)
    plan = planner.collective_plan(model, sharders)
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders)
    dense = torch.optim.SGD(dmp.module.over.parameters(), lr=0.1)
    ref_dense = torch.optim.SGD(reference.over.parameters(), lr=0.1)
    for step in range(STEPS):
        kjt = raw_batch(step, LOCAL_BATCH * world_size)
        out = dmp(local_part(kjt, rank, world_size))
        ref_out = reference(kjt)
        mine = ref_out[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH]
        torch.testing.assert_close(out, mine)
        out.pow(2).mean().backward()
        ref_out.pow(2).mean().backward()
        for optimizer in (dense, ref_dense):
            optimizer.step()
            optimizer.zero_grad()
    compare_state(dmp.module.mc, reference.mc)
    torch.testing.assert_close(dmp.module.over.weight, reference.over.weight)
    return [s.shard_offsets[0] for s in plan.plan["mc"]["users"].sharding_spec.shards]


def test_dmp_plans_shards_and_trains_with_a_dense_layer(run_ranks):
    # the planner splits 13 rows evenly (7 + 6); the sharder moves the bound to the bucket
    # bound (6) and the module matches the unsharded one all the same
    assert run_ranks(_dmp, 2)[0] == [0, 7]


class _Trained(_Model):
    """`_Model` as a train pipeline calls it: ``(losses, output)``."""

    def forward(self, kjt):
        out = super().forward(kjt)
        return out.pow(2).mean().reshape(1), out.detach()


def _pipelined(rank, world_size, overlap):
    """A DMP trained by `TrainPipelineSparseDist`, step by step equal to the unsharded module
    trained by a plain loop on the global batch: the pipeline prefetches nothing into the
    collection inside the managed-collision module (it sees remapped ids, not the batch's)."""
    from shardkit.distributed import DistributedModelParallel
    from shardkit.sharding import TrainPipelineSparseDist

    reference = _Trained(mc_module())
    sharders = [ManagedCollisionEmbeddingBagCollectionSharder()]
    model = copy.deepcopy(reference)
    plan = {"mc": plan_for(model.mc, "row_wise", world_size)}
    dmp = DistributedModelParallel(model, plan=ShardingPlan(plan), sharders=sharders)
    pipeline = TrainPipelineSparseDist(
        dmp, torch.optim.SGD(dmp.module.over.parameters(), lr=0.1), overlap=overlap
    )
    ref_dense = torch.optim.SGD(reference.over.parameters(), lr=0.1)
    batches = (
        local_part(raw_batch(s, LOCAL_BATCH * world_size), rank, world_size) for s in range(3)
    )
    for step in range(3):
        out = pipeline.progress(batches)
        ref_loss, ref_out = reference(raw_batch(step, LOCAL_BATCH * world_size))
        torch.testing.assert_close(out, ref_out[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH])
        ref_loss.sum().backward()
        ref_dense.step()
        ref_dense.zero_grad()
    with pytest.raises(StopIteration):
        pipeline.progress(batches)
    compare_state(dmp.module.mc, reference.mc)
    torch.testing.assert_close(dmp.module.over.weight, reference.over.weight)
    return pipeline._lead is None


@pytest.mark.parametrize("overlap", [False, True], ids=["synchronous", "overlap"])
def test_train_pipeline_trains_a_dmp_like_a_plain_loop(run_ranks, overlap):
    """The model's only collection is inside the managed-collision module: the ranks agree by
    flags (see [Note: deferred agreement])."""
    assert run_ranks(_pipelined, 2, overlap) == [True, True]


# -- bad input ------------------------------------------------------------------------------


def test_a_sharding_type_managed_collision_cannot_take_is_refused():
    module = mc_module()
    plan = plan_for(module, "row_wise", 1)
    plan["goods"] = construct_module_sharding_plan(
        module, {"users": row_wise(), "goods": column_wise(ranks=[0])}, world_size=1
    )["goods"]
    with pytest.raises(ValueError, match=r"table 'goods' cannot be sharded column_wise.*row_wise"):
        ShardedManagedCollisionEmbeddingBagCollection(module, plan, ShardingEnv(1, 0, None))


def test_buckets_that_ranks_cannot_share_are_refused():
    module = mc_module()
    plan = plan_for(module, "row_wise", 4)
    with pytest.raises(ValueError, match=r"table 'users' has 6 bucket.*4 ranks.*buckets="):
        ShardedManagedCollisionEmbeddingBagCollection(module, plan, ShardingEnv(4, 0, None))


class _PlainRemapper(ManagedCollisionModule):
    """A remapper without buckets (not an MCH module)."""

    def __init__(self) -> None:
        super().__init__("cpu", [0, 20])


@pytest.mark.parametrize(
    ("remapper", "kind", "match"),
    [
        (
            torch.nn.Identity,
            "table_wise",
            r"'users' has a Identity remapper, not a Managed.*subclass",
        ),
        (_PlainRemapper, "row_wise", r"'users' is sharded row_wise.*_PlainRemapper has no bucket"),
    ],
    ids=["not_managed_collision", "row_wise_without_buckets"],
)
def test_a_remapper_the_sharded_collection_cannot_drive_is_refused(remapper, kind, match):
    module = mc_module()
    module._managed_collision_collection._managed_collision_modules["users"] = remapper()
    with pytest.raises(TypeError, match=match):
        ShardedManagedCollisionEmbeddingBagCollection(
            module, plan_for(module, kind, 1), ShardingEnv(1, 0, None)
        )


def test_unknown_compressed_comms_are_refused():
    with pytest.raises(ValueError, match=r"qcomm_codecs_registry.*leave it None"):
        ManagedCollisionEmbeddingBagCollectionSharder(qcomm_codecs_registry={})


def test_a_sharder_built_from_an_inner_sharder_keeps_its_tables_and_no_codecs():
    inner = EmbeddingBagCollectionSharder({"learning_rate": 0.5}, shardable_params=["goods"])
    sharder = ManagedCollisionEmbeddingBagCollectionSharder(inner)
    assert sharder.qcomm_codecs_registry is None
    assert sharder.fused_params == {"learning_rate": 0.5}
    assert list(sharder.shardable_parameters(mc_module())) == ["goods"]


def _missing_key_on_one_rank(rank, world_size):
    sharded = _sharded(mc_module(), "row_wise", world_size)
    kjt = local_part(raw_batch(0, LOCAL_BATCH * world_size), rank, world_size)
    if rank == 1:
        kjt = kjt.permute([0, 1])  # drops feature 'i'
    try:
        sharded(kjt)
    except InputError as error:
        return str(error)
    return "no error"


def test_a_bad_input_on_one_rank_raises_on_every_rank(run_ranks):
    own, other = reversed(run_ranks(_missing_key_on_one_rank, 2))
    assert "rank 1: ManagedCollisionCollection: features ['i']" in own
    assert "rank(s) [1] refused their input" in other
