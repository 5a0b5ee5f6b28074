"""The sharded EmbeddingCollection (per-id lookups) against the unsharded one: every id's row,
in the input's order, and the tables after training, for every sharding type."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from shardkit import EmbeddingCollection, EmbeddingConfig
from shardkit.optim import EmbOptimType
from shardkit.sharding import ShardedEmbeddingCollection
from shardkit.types import ShardingEnv
from tests.devices import CPU_AND_GPU, DEVICE_TIER
from tests.sharding.common import (
    assert_pairs_close,
    global_batch,
    local_part,
    make_plan,
    table_pairs,
)

B = 3
KINDS = [
    "table_wise",
    "row_wise",
    "column_wise",
    "table_row_wise",
    "table_column_wise",
    "grid_shard",
    "data_parallel",
    "mixed",
]


def _configs():
    return [
        EmbeddingConfig(name="t0", embedding_dim=4, num_embeddings=11, feature_names=["a", "b"]),
        EmbeddingConfig(name="t1", embedding_dim=6, num_embeddings=7, feature_names=["c"]),
        EmbeddingConfig(name="t2", embedding_dim=4, num_embeddings=5, feature_names=["d"]),
        EmbeddingConfig(name="t3", embedding_dim=5, num_embeddings=9, feature_names=["e"]),
    ]


def _train(rank, world_size, kind, optimizer, local_size, *, device=None):
    """Loss = mean over the global batch's examples of sum(rows * coefficients), the
    coefficients fixed per global id position; each rank computes its part over its B
    examples (the tables' gradient division makes the sum over ranks the global mean).
    The sharded module on ``device`` (default CPU), the unsharded reference on the CPU; every
    rank returns (on the CPU) its rows of each step and its tables' weights and optimizer state
    after training, each beside the reference's."""
    device = device or torch.device("cpu")
    torch.manual_seed(0)
    fused = {"optimizer": optimizer, "learning_rate": 0.1}
    ec = EmbeddingCollection(tables=_configs(), fused_params=fused)
    reference = copy.deepcopy(ec)
    plan = make_plan(ec, kind, world_size, local_size)
    sharded = ShardedEmbeddingCollection(
        ec,
        plan,
        ShardingEnv.from_process_group(dist.group.WORLD),
        device,
        local_world_size=local_size,
    )
    replicas = [p for n, p in sharded.named_parameters() if n.endswith(".weight")]
    pairs = []
    for step in range(3):
        kjt = global_batch(step, B * world_size, False)
        out = sharded(local_part(kjt, rank, world_size).to(device))
        expected = reference(kjt)
        loss, ref_loss = 0.0, 0.0
        for feature, jt in out.items():
            full = expected[feature].values()
            g = torch.Generator().manual_seed(1000 * step + ord(feature))
            coef = torch.rand(full.shape, generator=g)
            lo = int(kjt[feature].offsets()[rank * B])
            mine = slice(lo, lo + jt.values().shape[0])
            lengths = jt.lengths().cpu()
            assert torch.equal(lengths, local_part(kjt, rank, world_size)[feature].lengths())
            what = f"step {step} rows of '{feature}'"
            pairs.append((what, jt.values().detach().cpu(), full[mine].detach().clone()))
            loss = loss + (jt.values() * coef[mine].to(device)).sum() / B
            ref_loss = ref_loss + (full * coef).sum() / (B * world_size)
        loss.backward()
        ref_loss.backward()
        for p in replicas:  # data-parallel tables: average, then SGD like the fused reference
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            p.data.add_(p.grad, alpha=-0.1)
            p.grad = None
    return pairs + table_pairs(sharded, reference, "embeddings")


@pytest.mark.parametrize("device", CPU_AND_GPU)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_sequence_lookups_match_unsharded(run_ranks, kind, world_size, device):
    results = run_ranks(_train, world_size, kind, EmbOptimType.EXACT_SGD, world_size, device=device)
    assert_pairs_close(results, atol=1e-5)


@pytest.mark.parametrize("device", CPU_AND_GPU)
def test_sequence_two_hosts(run_ranks, device):
    results = run_ranks(
        _train,
        4,
        "table_row_wise",
        EmbOptimType.EXACT_ADAGRAD,
        2,
        local_world_size=2,
        device=device,
    )

    assert_pairs_close(results, atol=1e-5)


@pytest.mark.parametrize("device", DEVICE_TIER)
@pytest.mark.parametrize("kind", KINDS[:-1])
def test_every_sharding_type_on_a_device(run_ranks, kind, device):
    """Forward, backward and the fused update of every sharding type, with the shards on a
    device that is not the CPU (see tests/devices.py), against the unsharded module on the CPU.
    Adagrad keeps state on the device; data-parallel replicas step by SGD (see `_train`)."""
    sgd = kind == "data_parallel"
    optimizer = EmbOptimType.EXACT_SGD if sgd else EmbOptimType.EXACT_ADAGRAD
    results = run_ranks(_train, 4, kind, optimizer, 2, local_world_size=2, device=device)
    assert_pairs_close(results, atol=1e-5)
