"""The sharded EmbeddingBagCollection takes a batch size per feature (VBE, with
``inverse_indices``) for every sharding type: its output, and the tables and fused optimizer
state after a step, equal the unsharded module's on the plain global batch. (Repeated bags are
expanded at the source and sent once per use: no saving yet.)"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from shardkit import EmbeddingBagCollection
from shardkit.optim import EmbOptimType
from shardkit.planner import ShardingEnv
from shardkit.sharding import InputError, ShardedEmbeddingBagCollection
from tests.sharding.common import assert_pairs_close, configs, make_plan, table_pairs
from tests.sharding.vbe import kjt_of, vbe_batch

LOCAL_BATCH = 3


def _step(rank, world_size, kind, local_size):
    torch.manual_seed(0)
    fused = {"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": 0.1}  # shard-invariant
    ebc = EmbeddingBagCollection(tables=configs(), fused_params=fused)
    reference = copy.deepcopy(ebc)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    plan = make_plan(ebc, kind, world_size, local_size)
    sharded = ShardedEmbeddingBagCollection(ebc, plan, env, local_world_size=local_size)
    batches = [vbe_batch(10 + r, LOCAL_BATCH) for r in range(world_size)]
    plain = kjt_of({k: [b for _, bags in batches for b in bags[k]] for k in batches[0][1]})
    out = sharded(batches[rank][0]).values()
    grad = torch.randn(
        LOCAL_BATCH * world_size, out.shape[1], generator=torch.Generator().manual_seed(1)
    )
    mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
    (out * grad[mine]).sum().backward()
    expected = reference(plain).values()  # the global batch, every rank's examples in turn
    (expected * grad).sum().div(world_size).backward()
    pairs = [("output", out.detach(), expected[mine].detach())]
    pairs += [p for p in table_pairs(sharded, reference, "embedding_bags") if "replica" not in p[0]]
    return pairs


@pytest.mark.parametrize(
    ("world_size", "kind", "local_size"),
    [
        (1, "table_wise", 1),
        (2, "table_wise", 2),
        (2, "row_wise", 2),
        (3, "row_wise", 3),
        (3, "column_wise", 3),
        (2, "table_column_wise", 2),
        (4, "table_row_wise", 2),
        (4, "grid_shard", 2),
        (2, "data_parallel", 2),
        (3, "mixed", 3),
    ],
)
def test_vbe_input_equals_the_unsharded_module(run_ranks, world_size, kind, local_size):
    results = run_ranks(_step, world_size, kind, local_size, local_world_size=local_size)
    assert_pairs_close(results, atol=1e-5)


def _without_inverse(rank, world_size):
    ebc = EmbeddingBagCollection(tables=configs())
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = ShardedEmbeddingBagCollection(
        ebc, make_plan(ebc, "row_wise", world_size, world_size), env
    )
    vbe, bags = vbe_batch(1, LOCAL_BATCH)
    if rank == 1:  # one rank's VBE batch lacks inverse_indices: both ranks fail, neither hangs
        vbe = kjt_of({k: bags[k] if k not in ("a", "c") else bags[k][:1] for k in bags},
                     strides=[[1 if k in ("a", "c") else LOCAL_BATCH] for k in bags])  # fmt: skip
    try:
        sharded(vbe)
    except InputError as error:
        return str(error)
    return None


def test_vbe_without_inverse_indices_on_one_rank_fails_every_rank(run_ranks):
    mine, other = run_ranks(_without_inverse, 2)
    assert other is not None and "one batch size for all keys" in other
    assert mine is not None
