"""A sharded EmbeddingBagCollection on the compiled kernel, 2 ranks, against the unsharded module
on the eager kernel (the spec): forward outputs, and every table's rows after several steps.

As tests/sharding/test_sharded_ebc.py (whose helpers this uses), but each side's kernel is forced
with `use_kernel`, so the compiled kernel runs on every rank's shards (row-, column- and
table-wise with a fused optimizer; data-parallel with dense gradients).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from shardkit import EmbeddingBagCollection, PoolingType
from shardkit.kernels import KernelPath, use_kernel
from shardkit.optim import EmbOptimType
from shardkit.sharding import ShardedEmbeddingBagCollection
from shardkit.types import ShardingEnv
from tests.sharding.common import configs, global_batch, local_part, make_plan

LOCAL_BATCH = 3
STEPS = 3
OPTIMIZER = {
    "table_wise": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
    "row_wise": EmbOptimType.ADAM,
    "column_wise": EmbOptimType.EXACT_ADAGRAD,
    "data_parallel": EmbOptimType.EXACT_SGD,
}


def _train(rank, world_size, kind):
    torch.manual_seed(0)
    fused = {"optimizer": OPTIMIZER[kind], "learning_rate": 0.1, "eps": 1e-8}
    ebc = EmbeddingBagCollection(
        tables=configs(PoolingType.MEAN), is_weighted=True, fused_params=fused
    )
    reference = copy.deepcopy(ebc)
    plan = make_plan(ebc, kind, world_size, world_size)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = ShardedEmbeddingBagCollection(ebc, plan, env, local_world_size=world_size)
    dense = [p for p in sharded.parameters() if p.requires_grad]
    dense_opt = torch.optim.SGD(dense, lr=0.1) if dense else None
    outputs = []
    for step in range(STEPS):
        kjt = global_batch(step, LOCAL_BATCH * world_size, weighted=True)
        scale = torch.rand(kjt.stride(), 23, generator=torch.Generator().manual_seed(100 + step))
        mine = scale[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH]
        with use_kernel("compiled") as path:
            assert path is KernelPath.COMPILED
            out = sharded(local_part(kjt, rank, world_size)).values()
        (out * mine).sum(1).mean().backward()
        for p in dense:
            if p.grad is not None:
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        if dense_opt:
            dense_opt.step()
            dense_opt.zero_grad()
        with use_kernel("eager"):
            expected = reference(kjt).values()
        (expected * scale).sum(1).mean().backward()
        outputs.append(
            (out.detach(), expected.detach()[rank * LOCAL_BATCH : (rank + 1) * LOCAL_BATCH])
        )
    return outputs, _table_pairs(sharded, reference)


def _table_pairs(sharded, reference) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, this rank's rows of the table, the same rows of the reference)."""
    pairs = []
    for name, table in sharded.embedding_bags.items():
        full = reference.embedding_bags[name].weight.detach()
        if hasattr(table, "shard_slices"):
            for shard, param in zip(table.shard_slices, table.shards):
                rows = slice(shard.row_start, shard.row_start + shard.rows)
                cols = slice(shard.col_start, shard.col_start + shard.cols)
                pairs.append((name, param.detach(), full[rows, cols]))
        else:
            pairs.append((name, table.weight.detach(), full))
    return pairs


@pytest.mark.parametrize("kind", list(OPTIMIZER))
def test_compiled_sharded_matches_eager_unsharded(run_ranks, kind):
    for rank, (outputs, tables) in enumerate(run_ranks(_train, 2, kind)):
        for step, (actual, expected) in enumerate(outputs):
            torch.testing.assert_close(actual, expected, msg=f"rank {rank}, step {step}")
        for name, actual, expected in tables:
            torch.testing.assert_close(actual, expected, msg=f"rank {rank}, table {name}")
