"""Data-parallel tables with the FUSED kernel (see [Note: sparse data-parallel tables]): trained
on 1-3 ranks they equal the unsharded module trained on the global batch (outputs, weights,
optimizer state and step counters), replicas stay bitwise equal across ranks, they equal DENSE
replicas stepped by torch's SGD/Adagrad, and a checkpoint round trip resumes exactly. DENSE
replicas of bag collections (see [Note: dense data-parallel tables by exchange]) get the global
batch's gradient from the exchange, without DDP."""

from __future__ import annotations

import pytest
import torch

from shardkit import (
    EmbeddingBagCollection,
    EmbeddingCollection,
    EmbeddingConfig,
    PoolingType,
    kernels,
)
from shardkit.distributed import DistributedModelParallel
from shardkit.sharding import (
    EmbeddingBagCollectionSharder,
    EmbeddingCollectionSharder,
    construct_module_sharding_plan,
    data_parallel,
    fused_state,
    row_wise,
    table_wise,
)
from shardkit.types import ShardingPlan
from tests.sharding.common import (
    assert_pairs_close,
    configs,
    global_batch,
    local_part,
)

LOCAL_BATCH = 3
RULES = {
    "sgd": {"optimizer": "exact_sgd", "learning_rate": 0.3},
    "adagrad": {"optimizer": "exact_adagrad", "learning_rate": 0.2, "eps": 1e-10},
    "rowwise_adagrad": {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.2},
}


def _plan(ebc, world_size: int, mixed: bool):
    """Every table replicated with the FUSED kernel; ``mixed``: t1 row-wise and t3 table-wise."""
    gens = {f"t{i}": data_parallel(compute_kernel="fused") for i in range(4)}
    if mixed:
        gens["t1"] = row_wise()
        gens["t3"] = table_wise(rank=world_size - 1)
    plan = construct_module_sharding_plan(ebc, gens, world_size=world_size, device_type="cpu")
    return ShardingPlan({"": plan})


def _loss(out: torch.Tensor, step: int) -> torch.Tensor:
    """A loss whose gradient differs per column and example: mean over the examples."""
    g = torch.Generator().manual_seed(100 + step)
    target = torch.randn(out.shape[1], generator=g)
    return (out * target + 0.5 * out * out).sum(1).mean()


def _dmp(rule: str, world_size: int, mixed: bool, pooling=PoolingType.SUM, seed: int = 0):
    torch.manual_seed(seed)
    ebc = EmbeddingBagCollection(tables=configs(pooling), is_weighted=False)
    sharders = [EmbeddingBagCollectionSharder(fused_params=RULES[rule])]
    dmp = DistributedModelParallel(ebc, plan=_plan(ebc, world_size, mixed), sharders=sharders)
    return dmp, ebc


def _train(rank: int, world_size: int, rule: str, mixed: bool, pooling: str, kernel: str):
    with kernels.use_kernel(kernel):
        return _train_with(rank, world_size, rule, mixed, PoolingType[pooling.upper()])


def _train_with(rank: int, world_size: int, rule: str, mixed: bool, pooling: PoolingType):
    dmp, ebc = _dmp(rule, world_size, mixed, pooling)
    reference = EmbeddingBagCollection(tables=configs(pooling), fused_params=RULES[rule])
    reference.load_state_dict(ebc.state_dict())
    pairs = []
    for step in range(4):  # feature 'e' (table t3) has no ids in even steps
        kjt = global_batch(step, LOCAL_BATCH * world_size, False)
        out = dmp(local_part(kjt, rank, world_size)).values()
        _loss(out, step).backward()
        expected = reference(kjt).values()
        _loss(expected, step).backward()
        mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        pairs.append((f"output of step {step}", out.detach(), expected[mine].detach()))
    pairs += _replica_pairs(dmp.module, reference)
    weights = {n: t.weight.detach().clone() for n, t in _replicas(dmp.module).items()}
    return pairs, weights


def _replicas(sharded) -> dict:
    return {n: t for n, t in sharded.embedding_bags.items() if not hasattr(t, "shard_slices")}


def _replica_pairs(sharded, reference) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """Each replica's weight and fused optimizer state (step counter included) against the
    unsharded module's."""
    state = sharded.fused_optimizer.state_dict()["state"]
    ref_state = reference.fused_optimizer.state_dict()["state"]
    pairs = []
    for name, table in _replicas(sharded).items():
        key = f"embedding_bags.{name}.weight"
        pairs.append(
            (
                f"replica {name}",
                table.weight.detach(),
                reference.embedding_bags[name].weight.detach(),
            )
        )
        expected = ref_state[key]  # the unsharded module's names are TorchRec's too
        assert sorted(state[key]) == sorted(expected)
        pairs += [(f"{name}: {k}", state[key][k], v) for k, v in expected.items()]
    return pairs


@pytest.mark.parametrize(
    ("world_size", "rule", "mixed", "pooling", "kernel"),
    [
        (1, "adagrad", False, "sum", "compiled"),
        (2, "sgd", False, "sum", "compiled"),
        (2, "adagrad", True, "mean", "compiled"),
        (2, "rowwise_adagrad", False, "mean", "eager"),
        (3, "rowwise_adagrad", True, "sum", "compiled"),
        (3, "sgd", True, "mean", "eager"),
    ],
)
def test_fused_replicas_train_as_the_unsharded_module(
    run_ranks, world_size, rule, mixed, pooling, kernel
):
    results = run_ranks(_train, world_size, rule, mixed, pooling, kernel)
    assert_pairs_close([pairs for pairs, _ in results], atol=1e-5)
    first = results[0][1]
    assert first, "no replicas: the test would compare nothing"
    for _, weights in results[1:]:  # every rank applied the same update in the same order
        for name, weight in weights.items():
            assert torch.equal(weight, first[name]), name


def _against_dense(rank: int, world_size: int, rule: str):
    """FUSED replicas against DENSE ones (DDP's all-reduce, then torch's own optimizer)."""
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=configs())
    fused_dmp, _ = _dmp(rule, world_size, False)
    gens = {f"t{i}": data_parallel() for i in range(4)}
    plan = construct_module_sharding_plan(ebc, gens, world_size=world_size, device_type="cpu")
    dense_dmp = DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}))
    lr = RULES[rule]["learning_rate"]
    optimizer = {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad}[rule]
    optim = optimizer(dense_dmp.parameters(), lr=lr)
    for step in range(3):
        kjt = local_part(global_batch(step, LOCAL_BATCH * world_size, False), rank, world_size)
        for dmp in (fused_dmp, dense_dmp):
            _loss(dmp(kjt).values(), step).backward()
        optim.step()
        optim.zero_grad()
    pairs = []
    for name, table in _replicas(fused_dmp.module).items():
        dense = dense_dmp.module.embedding_bags[name].weight.detach()
        pairs.append((f"replica {name}", table.weight.detach(), dense))
        if rule == "adagrad":
            state = fused_dmp.module.fused_optimizer.state_dict()["state"]
            ours = state[f"embedding_bags.{name}.weight"][f"{name}.momentum1"]
            dense_param = dense_dmp.module.embedding_bags[name].weight
            pairs.append((f"accumulator {name}", ours, optim.state[dense_param]["sum"]))
    return pairs


@pytest.mark.parametrize("rule", ["sgd", "adagrad"])
def test_fused_replicas_equal_dense_replicas_with_torch_optimizers(run_ranks, rule):
    results = run_ranks(_against_dense, 2, rule)
    assert_pairs_close(results, atol=1e-5)


def _dense_gradients(rank: int, world_size: int, weighted: bool):
    """DENSE replicas (as the planner plans data-parallel tables): after backward each table's
    .grad is the unsharded module's gradient of the global batch's mean loss (what DDP's
    average gives), computed from the exchanged ids; DDP is told to leave them alone."""
    torch.manual_seed(0)
    reference = EmbeddingBagCollection(tables=configs(), is_weighted=weighted)
    ebc = EmbeddingBagCollection(tables=configs(), is_weighted=weighted)
    ebc.load_state_dict(reference.state_dict())
    gens = {f"t{i}": data_parallel() for i in range(4)}
    plan = construct_module_sharding_plan(ebc, gens, world_size=world_size, device_type="cpu")
    dmp = DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}))
    kjt = global_batch(0, LOCAL_BATCH * world_size, weighted)
    _loss(dmp(local_part(kjt, rank, world_size)).values(), 0).backward()
    _loss(reference(kjt).values(), 0).backward()
    pairs = []
    for name, table in _replicas(dmp.module).items():
        want = reference.embedding_bags[name].weight.grad
        pairs.append((f"grad {name}", table.weight.grad, want))
    ignored = set(dmp.sharded_parameter_names())
    return pairs, sorted(n for n in ignored if n.startswith("embedding_bags."))


@pytest.mark.parametrize("world_size", [1, 2, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_dense_replicas_give_the_global_batch_gradient_without_ddp(run_ranks, world_size, weighted):
    results = run_ranks(_dense_gradients, world_size, weighted)
    assert_pairs_close([pairs for pairs, _ in results], atol=1e-6)
    assert all(len(pairs) == 4 for pairs, _ in results), "every table a replica by exchange"
    for _, ignored in results:
        assert ignored == [f"embedding_bags.t{i}.weight" for i in range(4)], ignored


def _round_trip(rank: int, world_size: int):
    """Train 2 steps, save model and fused optimizer state, load them into a DMP made from
    other weights, then train both 2 more steps: everything equal."""
    dmp, _ = _dmp("adagrad", world_size, True)
    other, _ = _dmp("adagrad", world_size, True, seed=7)
    batches = [global_batch(step, LOCAL_BATCH * world_size, False) for step in range(4)]
    for step in range(2):
        _loss(dmp(local_part(batches[step], rank, world_size)).values(), step).backward()
    other.load_state_dict(dmp.state_dict())
    other.fused_optimizer.load_state_dict(dmp.fused_optimizer.state_dict())
    for step in range(2, 4):
        for model in (dmp, other):
            _loss(model(local_part(batches[step], rank, world_size)).values(), step).backward()
    pairs = []
    state, loaded = (
        dmp.module.fused_optimizer.state_dict()["state"],
        other.module.fused_optimizer.state_dict()["state"],
    )
    for name, table in _replicas(dmp.module).items():
        pairs.append(
            (
                f"replica {name}",
                other.module.embedding_bags[name].weight.detach(),
                table.weight.detach(),
            )
        )
        key = f"embedding_bags.{name}.weight"
        pairs += [(f"{key}: {k}", loaded[key][k], v) for k, v in state[key].items()]
        assert f"{name}.step" not in state[key]  # Adagrad does not read it: TorchRec's layout
    return pairs


def test_fused_replicas_checkpoint_round_trip(run_ranks):
    assert_pairs_close(run_ranks(_round_trip, 2), atol=0)


def test_data_parallel_kernel_must_be_dense_or_fused():
    with pytest.raises(ValueError, match=r"unsupported compute kernel 'quant'"):
        data_parallel(compute_kernel="quant")


def _sequence_collection(rank: int, world_size: int) -> None:
    ec = EmbeddingCollection(
        tables=[EmbeddingConfig(name="s", embedding_dim=4, num_embeddings=8, feature_names=["x"])]
    )
    gens = {"s": data_parallel(compute_kernel="fused")}
    plan = construct_module_sharding_plan(ec, gens, world_size=world_size, device_type="cpu")
    DistributedModelParallel(
        ec, plan=ShardingPlan({"": plan}), sharders=[EmbeddingCollectionSharder()]
    )


def test_fused_replicas_of_sequence_tables_are_refused(run_ranks):
    with pytest.raises(Exception, match=r"data-parallel tables \['s'\] of a EmbeddingCollection"):
        run_ranks(_sequence_collection, 1)


def _through_checkpoint(rank: int, world_size: int, root: str):
    """As `_round_trip`, through `shardkit.checkpoint` files (torch.distributed.checkpoint)."""
    from shardkit import checkpoint as ckpt

    dmp, _ = _dmp("rowwise_adagrad", world_size, True)
    other, _ = _dmp("rowwise_adagrad", world_size, True, seed=7)
    batches = [global_batch(step, LOCAL_BATCH * world_size, False) for step in range(3)]
    for step in range(2):
        _loss(dmp(local_part(batches[step], rank, world_size)).values(), step).backward()
    ckpt.save(root, step=2, model=dmp)
    ckpt.load(root, model=other)
    for model in (dmp, other):
        _loss(model(local_part(batches[2], rank, world_size)).values(), 2).backward()
    state = dmp.module.fused_optimizer.state_dict()["state"]
    loaded = other.module.fused_optimizer.state_dict()["state"]
    pairs = []
    for name, table in _replicas(dmp.module).items():
        theirs = other.module.embedding_bags[name].weight.detach()
        pairs.append((f"replica {name}", theirs, table.weight.detach()))
        key = f"embedding_bags.{name}.weight"
        pairs += [(f"{key}: {k}", loaded[key][k], v) for k, v in state[key].items()]
        # the step counter (not in TorchRec's layout for row-wise Adagrad) travels too
        step = fused_state(other.module)[f"{name}.step"]
        pairs.append((f"{name} step", step, torch.tensor(3.0)))
    return pairs


def test_fused_replicas_through_checkpoint_files(run_ranks, tmp_path):
    assert_pairs_close(run_ranks(_through_checkpoint, 2, str(tmp_path)), atol=0)


def _logged(rank: int, world_size: int) -> list[str]:
    import logging

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger = logging.getLogger("shardkit.sharding._collection._replicas")
    handler, level = Keep(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        torch.manual_seed(0)
        ebc = EmbeddingBagCollection(tables=configs())
        gens = {f"t{i}": data_parallel(compute_kernel="fused" if i < 2 else None) for i in range(4)}
        plan = construct_module_sharding_plan(ebc, gens, world_size=world_size, device_type="cpu")
        adam = {"optimizer": "adam", "learning_rate": 0.01}
        sharders = [EmbeddingBagCollectionSharder(fused_params=adam)]
        DistributedModelParallel(ebc, plan=ShardingPlan({"": plan}), sharders=sharders)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return records


def test_the_log_says_which_replicas_are_fused_and_where_that_differs_from_dense(run_ranks):
    records = run_ranks(_logged, 1)[0]
    assert "data-parallel tables: ['t0', 't1'] FUSED" in records[0]
    assert "['t2', 't3'] DENSE with dense gradients from exchanged ids" in records[0]
    lazy = [r for r in records if "updates only the rows a batch touched" in r]
    assert lazy and "fused adam" in lazy[0], records


def _meta_init(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(rank)  # each rank would draw other values
    ebc = EmbeddingBagCollection(tables=configs(), device="meta")
    dmp = DistributedModelParallel(ebc, plan=_plan(ebc, world_size, True))
    return {n: t.weight.detach().clone() for n, t in _replicas(dmp.module).items()}


def test_replicas_made_on_meta_start_equal_on_every_rank(run_ranks):
    first, *others = run_ranks(_meta_init, 3)
    assert first
    for weights in others:
        for name, weight in weights.items():
            assert torch.equal(weight, first[name]), name
