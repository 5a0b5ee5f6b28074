"""The sharded EmbeddingBagCollection takes a batch size per feature (VBE, with
``inverse_indices``) for every sharding type. Its outputs, and the tables and fused optimizer
state after a few steps, equal the unsharded module's on the plain global batch. The
deduplicated bags travel as they are (see [Note: variable batch on the wire]): the receiver
gets each feature's most bags of any rank, not the full batch's, and ranks may deduplicate
differently (a key with one bag, another with several, a plain batch beside a VBE one).
Also: the sequence collection (every key's full batch of bags), TorchRec's own sharded
collections on the same batch, position weights and managed collision in front, and bad
inverse indices on one rank failing every rank."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from shardkit import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    KeyedJaggedTensor,
    PoolingType,
)
from shardkit.modules.feature_processor_ import PositionWeightedModuleCollection
from shardkit.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection
from shardkit.optim import EmbOptimType
from shardkit.sharding import (
    InputError,
    ShardedEmbeddingBagCollection,
    ShardedEmbeddingCollection,
    ShardedFeatureProcessedEmbeddingBagCollection,
    ShardedManagedCollisionEmbeddingBagCollection,
    construct_module_sharding_plan,
    data_parallel,
)
from shardkit.types import ShardingEnv
from tests.compat.peers import run_in_torchrec
from tests.sharding.common import FEATURES, assert_pairs_close, configs, make_plan, table_pairs
from tests.sharding.mc import BIG as MC_BIG
from tests.sharding.mc import FEATURES as MC_FEATURES
from tests.sharding.mc import LOCAL_BATCH as MC_BATCH
from tests.sharding.mc import compare_state, mc_module
from tests.sharding.mc import env as mc_env
from tests.sharding.mc import loss as mc_loss
from tests.sharding.mc import plan_for as mc_plan
from tests.sharding.vbe import kjt_of, vbe_batch

LOCAL_BATCH = 3
STEPS = 2


def _unique(rank: int) -> dict[str, int] | None:
    """Rank r's deduplicated features: "a" to 1 + r bags, "c" to one; the last rank of three
    sends a plain batch (every key B bags, identity inverse indices)."""
    return {} if rank == 2 else {"a": 1 + rank, "c": 1}


def _sent(rank: int, batch) -> KeyedJaggedTensor:
    """What rank r sends of ``vbe_batch``'s ``(vbe, plain bags)``: rank 1 its VBE batch with
    int32 lengths and inverse indices, rank 3 a truly plain KJT (no per-key strides at all)."""
    vbe, bags = batch
    if rank == 3:
        return kjt_of(bags)
    if rank == 1:
        keys, index = vbe.inverse_indices()
        return KeyedJaggedTensor(
            keys=vbe.keys(),
            values=vbe.values(),
            lengths=vbe.lengths().int(),
            stride_per_key_per_rank=vbe.stride_per_key_per_rank(),
            inverse_indices=(keys, index.int()),
        )
    return vbe


def _batches(step: int, world_size: int, **kwargs) -> tuple[list, KeyedJaggedTensor]:
    """Each rank's ``vbe_batch`` ``(vbe, plain bags)`` of step ``step``, and the plain global
    batch: every rank's examples in turn."""
    batches = [
        vbe_batch(10 * step + r, LOCAL_BATCH, unique=_unique(r), **kwargs)
        for r in range(world_size)
    ]
    return batches, kjt_of({k: [b for _, bags in batches for b in bags[k]] for k in FEATURES})


def _backward_both(out, expected, rank: int, world_size: int, seed: int) -> None:
    """Backward of this rank's ``out`` ``[B, D]`` and of the reference's ``expected``
    ``[W * B, D]`` (mean over ranks, as DDP) under the same random output gradient."""
    grad = torch.randn(
        LOCAL_BATCH * world_size, out.shape[1], generator=torch.Generator().manual_seed(seed)
    )
    (out * grad[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH]).sum().backward()
    (expected * grad).sum().div(world_size).backward()


def _step(rank, world_size, kind, local_size, optimizer, pooling):
    torch.manual_seed(0)
    fused = {"optimizer": optimizer, "learning_rate": 0.1}
    ebc = EmbeddingBagCollection(tables=configs(pooling), fused_params=fused)
    reference = copy.deepcopy(ebc)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    if kind == "fused_replicas":  # data-parallel, stepped in backward: no DDP needed
        gens = {f"t{i}": data_parallel(compute_kernel="fused") for i in range(4)}
        plan = construct_module_sharding_plan(ebc, gens, world_size=world_size)
    else:
        plan = make_plan(ebc, kind, world_size, local_size)
    sharded = ShardedEmbeddingBagCollection(ebc, plan, env, local_world_size=local_size)
    pairs = []
    # DENSE replicas are stepped by DDP and a dense optimizer, outside the collection: 1 step
    for step in range(1 if kind in ("data_parallel", "mixed") else STEPS):
        # under Adam, a bag no example uses (see [Note: bags no example uses])
        batches, plain = _batches(step, world_size, unused=optimizer is ADAM)
        sent = [_sent(r, b) for r, b in enumerate(batches)]
        dist_input = sharded.input_dist(sent[rank])
        out = sharded.compute_and_output_dist(dist_input).values()
        rows = dist_input.pending.wait().feature_rows
        expected = reference(plain).values()
        _backward_both(out, expected, rank, world_size, seed=step)
        mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        pairs.append((f"step {step} output", out.detach(), expected[mine].detach()))
        if kind not in ("data_parallel", "fused_replicas", "mixed"):  # mixed: "c" is DP
            most = {k: max(len(b.to_dict()[k].lengths()) for b in sent) for k in FEATURES}
            pairs.append((f"step {step} bags received", torch.tensor(rows), torch.tensor(
                [most[k] for k in FEATURES])))  # fmt: skip
    dense_replicas = kind in ("data_parallel", "mixed")
    pairs += [
        p
        for p in table_pairs(sharded, reference, "embedding_bags")
        if not (dense_replicas and "replica" in p[0])
    ]
    return pairs


SGD, ADAGRAD = EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ADAGRAD  # both shard-invariant
ADAM = EmbOptimType.ADAM  # moves a row on a zero gradient: unused bags must not be looked up
SUM, MEAN = PoolingType.SUM, PoolingType.MEAN  # MEAN: 1/len folded into weights at the source


@pytest.mark.parametrize(
    ("world_size", "kind", "local_size", "optimizer", "pooling"),
    [
        (1, "table_wise", 1, SGD, SUM),
        (2, "table_wise", 2, SGD, SUM),
        (2, "row_wise", 2, SGD, SUM),
        (3, "row_wise", 3, ADAGRAD, SUM),
        (2, "row_wise", 2, ADAM, SUM),
        (3, "column_wise", 3, SGD, MEAN),
        (2, "table_column_wise", 2, SGD, SUM),
        (4, "table_row_wise", 2, SGD, MEAN),
        (4, "grid_shard", 2, SGD, SUM),
        (2, "data_parallel", 2, SGD, SUM),
        (2, "fused_replicas", 2, ADAGRAD, SUM),
        (3, "mixed", 3, ADAGRAD, SUM),
    ],
)
def test_vbe_input_equals_the_unsharded_module(
    run_ranks, world_size, kind, local_size, optimizer, pooling
):
    results = run_ranks(
        _step, world_size, kind, local_size, optimizer, pooling, local_world_size=local_size
    )
    assert_pairs_close(results, atol=1e-5)


def _bad_inverse(rank, world_size, how):
    ebc = EmbeddingBagCollection(tables=configs())
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = ShardedEmbeddingBagCollection(
        ebc, make_plan(ebc, "row_wise", world_size, world_size), env
    )
    vbe, bags = vbe_batch(1, LOCAL_BATCH)
    strides = [[len(bags[k]) if k not in ("a", "c") else 1] for k in FEATURES]
    dedup = {k: bags[k] if k not in ("a", "c") else bags[k][:1] for k in bags}
    if rank == 1 and how == "missing":  # a VBE batch without inverse_indices
        vbe = kjt_of(dedup, strides=strides)
    if rank == 1 and how == "out of range":  # "a" has 1 bag; index 1 points past it
        index = torch.zeros(len(FEATURES), LOCAL_BATCH, dtype=torch.int64)
        index[1] = index[3] = index[4] = torch.arange(LOCAL_BATCH)
        index[0, 2] = 1
        vbe = kjt_of(dedup, strides=strides, inverse_indices=(FEATURES, index))
    if rank == 1 and how in ("key missing", "empty"):  # no row for "e"; no rows (the KJT takes it)
        index = torch.zeros(len(FEATURES) - 1, LOCAL_BATCH, dtype=torch.int64)
        index = (FEATURES[:-1], index) if how == "key missing" else (FEATURES, index[:0, 0])
        vbe = kjt_of(dedup, strides=strides, inverse_indices=index)
    try:
        sharded(vbe)
    except InputError as error:
        return str(error)
    return None


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("missing", r"one batch size for all keys, or inverse_indices saying which bag"),
        ("out of range", r"must pick a bag of their own key \(0 <= index < bags \[1, 3, 1, 3, 3\]\)"
         r"; got indices from \[0, 0, 0, 0, 0\] to \[1, 2, 0, 2, 2\]"),
        ("key missing", r"inverse_indices must be \(keys, \[len\(keys\), B\]\) with a row for "
         r"every feature.*got keys \['a', 'b', 'c', 'd'\], shape \[4, 3\], missing \['e'\]"),
        ("empty", r"inverse_indices must be \(keys, \[len\(keys\), B\]\).*got keys "
         r"\['a', 'b', 'c', 'd', 'e'\], shape \[0\], missing \[\]"),
    ],
)  # fmt: skip
def test_a_bad_vbe_batch_on_one_rank_fails_every_rank(run_ranks, how, message):
    other, mine = run_ranks(_bad_inverse, 2, how)
    with pytest.raises(InputError, match=message):
        raise InputError(mine)
    assert other is not None and "refused their input" in other


def _ec_configs() -> list[EmbeddingConfig]:
    return [
        EmbeddingConfig(name="t0", embedding_dim=4, num_embeddings=11, feature_names=["a", "b"]),
        EmbeddingConfig(name="t1", embedding_dim=6, num_embeddings=7, feature_names=["c"]),
        EmbeddingConfig(name="t2", embedding_dim=4, num_embeddings=5, feature_names=["d"]),
        EmbeddingConfig(name="t3", embedding_dim=5, num_embeddings=9, feature_names=["e"]),
    ]


def _ec_steps(rank, world_size, kind, local_size):
    """The sequence collection: every feature's JaggedTensor for this rank's examples (the
    full batch's bags, as TorchRec's sharded EmbeddingCollection gives) against the unsharded
    module's on the plain global batch, then the tables after SGD steps."""
    torch.manual_seed(0)
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    ec = EmbeddingCollection(tables=_ec_configs(), fused_params=fused)
    reference = copy.deepcopy(ec)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    plan = make_plan(ec, kind, world_size, local_size)
    sharded = ShardedEmbeddingCollection(ec, plan, env, local_world_size=local_size)
    pairs, mine = [], slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    for step in range(1 if kind == "mixed" else STEPS):  # DENSE replicas: see _step
        batches, plain = _batches(step, world_size)
        out, expected = sharded(_sent(rank, batches[rank])), reference(plain)
        loss, ref_loss = 0.0, 0.0
        for feature in FEATURES:
            full = expected[feature]
            lo, hi = full.offsets()[rank * LOCAL_BATCH], full.offsets()[mine.stop]
            coef = torch.rand(full.values().shape, generator=torch.Generator().manual_seed(step))
            pairs.append(
                (
                    f"step {step} {feature} lengths",
                    out[feature].lengths().long(),
                    full.lengths()[mine],
                )
            )
            pairs.append((f"step {step} {feature} rows", out[feature].values().detach(),
                          full.values()[lo:hi].detach()))  # fmt: skip
            loss = loss + (out[feature].values() * coef[lo:hi]).sum()
            ref_loss = ref_loss + (full.values() * coef).sum() / world_size
        loss.backward()
        ref_loss.backward()
    pairs += [p for p in table_pairs(sharded, reference, "embeddings") if "replica" not in p[0]]
    return pairs


@pytest.mark.parametrize(
    ("world_size", "kind", "local_size"),
    [(1, "table_wise", 1), (2, "row_wise", 2), (3, "column_wise", 3), (4, "table_row_wise", 2),
     (3, "mixed", 3)],
)  # fmt: skip
def test_vbe_into_the_sequence_collection_equals_the_unsharded_module(
    run_ranks, world_size, kind, local_size
):
    results = run_ranks(_ec_steps, world_size, kind, local_size, local_world_size=local_size)
    assert_pairs_close(results, atol=1e-5)


_TORCHREC = """
import torch.distributed as dist
from torchrec import (EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection,
                      EmbeddingConfig, KeyedJaggedTensor)
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
dist.init_process_group("gloo", init_method=inputs["init"], rank=0, world_size=1)
keys, cpu = inputs["keys"], torch.device("cpu")
kjt = KeyedJaggedTensor(keys=keys, values=inputs["values"], lengths=inputs["lengths"],
                        stride_per_key_per_rank=inputs["strides"],
                        inverse_indices=(keys, inputs["inverse"]))
for name, module, sharder in [
    ("ebc", EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=f"t_{k}", embedding_dim=4,
        num_embeddings=11, feature_names=[k]) for k in keys], device=cpu),
     EmbeddingBagCollectionSharder()),
    ("ec", EmbeddingCollection(tables=[EmbeddingConfig(name=f"t_{k}", embedding_dim=4,
        num_embeddings=11, feature_names=[k]) for k in keys], device=cpu),
     EmbeddingCollectionSharder()),
]:
    module.load_state_dict(inputs[name])
    constraints = {f"t_{k}": ParameterConstraints(sharding_types=["table_wise"]) for k in keys}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=1, compute_device="cpu"), constraints=constraints)
    plan = planner.collective_plan(module, [sharder], dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module, device=cpu, plan=plan, sharders=[sharder])
    for key, value in dmp.state_dict().items():  # DMP initialises its shards anew
        value.local_shards()[0].tensor.copy_(inputs[name][key.split("module.")[-1]])
    out = dmp(kjt)
    out = out.wait() if hasattr(out, "wait") else out
    if name == "ebc":
        outputs[name] = out.values().detach()
    else:
        outputs[name] = {k: (jt.lengths(), jt.values().detach()) for k, jt in out.items()}
"""


def test_vbe_outputs_equal_torchrecs_sharded_collections(tmp_path):
    """TorchRec's sharded EBC and EC (table-wise, one CPU rank) on a VBE batch give what
    shardkit's give: the bag collection's pooled rows expanded, the sequence collection's
    every key's full batch of bags."""
    keys = ["a", "b"]
    tables = [EmbeddingBagConfig(name=f"t_{k}", embedding_dim=4, num_embeddings=11,
                                 feature_names=[k]) for k in keys]  # fmt: skip
    ebc = EmbeddingBagCollection(tables=tables)
    ec = EmbeddingCollection(tables=[EmbeddingConfig(name=f"t_{k}", embedding_dim=4,
                                     num_embeddings=11, feature_names=[k]) for k in keys])  # fmt: skip
    batch = {"lengths": torch.tensor([2, 3, 1, 0, 2, 1, 1]),  # "a": 2 bags, "b": 5
             "values": torch.tensor([1, 2, 3, 4, 5, 6, 7, 8, 9, 1]),
             "inverse": torch.tensor([[0, 1, 1, 0, 1], [0, 1, 2, 3, 4]]),
             "strides": [[2], [5]], "keys": keys}  # fmt: skip
    sent = {**batch, "ebc": ebc.state_dict(), "ec": ec.state_dict()}
    got = run_in_torchrec(_TORCHREC, {**sent, "init": f"file://{tmp_path / 'pg'}"}, tmp_path)
    kjt = KeyedJaggedTensor(keys=keys, values=batch["values"], lengths=batch["lengths"],
                            stride_per_key_per_rank=batch["strides"],
                            inverse_indices=(keys, batch["inverse"]))  # fmt: skip
    torch.testing.assert_close(ebc(kjt).values().detach(), got["ebc"], rtol=0, atol=1e-6)
    for key, jt in ec(kjt).items():
        lengths, values = got["ec"][key]
        torch.testing.assert_close(jt.lengths(), lengths.to(jt.lengths().dtype), rtol=0, atol=0)
        torch.testing.assert_close(jt.values().detach(), values, rtol=0, atol=1e-6)


def _position_weighted(rank, world_size):
    """Position weights (a feature processor) before a sharded bag collection: the processed
    deduplicated bags travel as any VBE batch's."""
    torch.manual_seed(0)
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.1}
    ebc = EmbeddingBagCollection(tables=configs(), is_weighted=True, fused_params=fused)
    processors = PositionWeightedModuleCollection({"a": 3, "c": 3, "d": 4})
    module = FeatureProcessedEmbeddingBagCollection(ebc, processors)
    reference = copy.deepcopy(module)
    plan = make_plan(ebc, "row_wise", world_size, world_size)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = ShardedFeatureProcessedEmbeddingBagCollection(module, plan, env)
    batches, plain = _batches(0, world_size)
    out = sharded(batches[rank][0]).values()
    expected = reference(plain).values()
    _backward_both(out, expected, rank, world_size, seed=1)
    mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    pairs = [("output", out.detach(), expected[mine].detach())]
    inner = sharded._embedding_bag_collection
    pairs += table_pairs(inner, reference._embedding_bag_collection, "embedding_bags")
    return pairs


def test_vbe_with_position_weights_equals_the_unsharded_module(run_ranks):
    assert_pairs_close(run_ranks(_position_weighted, 2), atol=1e-5)


def _mc_batch(step: int, rank: int) -> tuple[KeyedJaggedTensor, list]:
    """Raw ids for managed collision: user "u" deduplicated to one bag per rank, "v" and "i"
    a bag per example. ``(this rank's VBE batch, its bags per key)``."""
    g = torch.Generator().manual_seed(100 * step + rank)
    bags = []
    for count in (1, MC_BATCH, MC_BATCH):
        lengths = torch.randint(1, 4, (count,), generator=g).tolist()
        bags.append([MC_BIG + 7919 * torch.randint(0, 30, (n,), generator=g) for n in lengths])
    return _mc_kjt(bags, [0] * MC_BATCH), bags


def _mc_kjt(bags: list, user_inverse: list[int]) -> KeyedJaggedTensor:
    size = len(user_inverse)
    inverse = torch.tensor([user_inverse, list(range(size)), list(range(size))])
    return KeyedJaggedTensor(
        keys=MC_FEATURES,
        values=torch.cat([b for per_key in bags for b in per_key]),
        lengths=torch.tensor([len(b) for per_key in bags for b in per_key]),
        stride_per_key_per_rank=[[len(per_key)] for per_key in bags],
        inverse_indices=(MC_FEATURES, inverse),
    )


def _managed_collision(rank, world_size):
    """Managed-collision ids before a sharded bag collection: the remapper sees each rank's
    deduplicated ids, as the unsharded module does on the global VBE batch."""
    reference = mc_module(True)
    sharded = ShardedManagedCollisionEmbeddingBagCollection(
        copy.deepcopy(reference), mc_plan(reference, "row_wise", world_size), mc_env()
    )
    for step in range(2):
        per_rank = [_mc_batch(step, r) for r in range(world_size)]
        merged = [[b for _, bags in per_rank for b in bags[k]] for k in range(3)]
        user = [r for r in range(world_size) for _ in range(MC_BATCH)]  # rank r's: its bag
        out, _ = sharded(per_rank[rank][0])
        ref_out, _ = reference(_mc_kjt(merged, user))
        mine = slice(rank * MC_BATCH, (rank + 1) * MC_BATCH)
        torch.testing.assert_close(out.values(), ref_out.values()[mine])
        mc_loss(out, rank, step, world_size, True, local=True).backward()
        mc_loss(ref_out, rank, step, world_size, True, local=False).backward()
    compare_state(sharded, reference)


def test_vbe_with_managed_collision_equals_the_unsharded_module(run_ranks):
    run_ranks(_managed_collision, 2)
