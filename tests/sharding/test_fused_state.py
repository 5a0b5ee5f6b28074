"""`load_fused_state` writes every optimizer state and the step counter of every fused shard.

A load through torch.distributed.checkpoint writes most of it in place (2-D state blocks of
`fused_state` are views of the live state), so the checkpoint tests alone cannot tell whether
`load_fused_state` writes them all: here it is given whole tables (plain tensors, as an unsharded
checkpoint holds them) and must put each shard's block where it belongs."""

from __future__ import annotations

import pytest
import torch

from shardkit import EmbeddingBagCollection
from shardkit.distributed import DistributedModelParallel
from shardkit.optim import EmbOptimType
from shardkit.sharding import EmbeddingBagCollectionSharder, fused_state, load_fused_state
from shardkit.types import ShardingPlan
from tests.sharding.common import configs, global_batch, local_part, make_plan

STATES = {
    EmbOptimType.ADAM: ("exp_avg", "exp_avg_sq"),
    EmbOptimType.EXACT_ADAGRAD: ("momentum1",),
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: ("momentum1",),
    EmbOptimType.PARTIAL_ROWWISE_ADAM: ("momentum1", "momentum2"),
    EmbOptimType.LAMB: ("momentum1", "momentum2"),
}
# State with one value per row (as `fused_state` shows it: repeated across the columns).
PER_ROW = {(EmbOptimType.EXACT_ROWWISE_ADAGRAD, "momentum1"),
           (EmbOptimType.PARTIAL_ROWWISE_ADAM, "momentum2")}  # fmt: skip


def _wanted(optimizer: EmbOptimType, agree: bool) -> dict[str, torch.Tensor]:
    """Whole-table state unlike anything training makes; row-wise Adagrad's one value per row
    repeated across the columns, as `fused_state` lays it out (``agree``), or differing from
    column to column, as column shards' accumulators do."""
    g = torch.Generator().manual_seed(1)
    out = {}
    for config in configs():
        rows, dim = config.num_embeddings, config.embedding_dim
        for state in STATES[optimizer]:
            cols = 1 if (optimizer, state) in PER_ROW and agree else dim
            value = torch.rand(rows, cols, generator=g)
            out[f"{config.name}.{state}"] = value.expand(rows, dim).contiguous()
        out[f"{config.name}.step"] = torch.tensor(7.0)
    return out


def _load(rank: int, world_size: int, kind: str, optimizer: EmbOptimType, agree: bool = True):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=configs())
    plan = ShardingPlan({"": make_plan(ebc, kind, world_size, world_size)})
    fused = {"optimizer": optimizer, "learning_rate": 0.1}
    dmp = DistributedModelParallel(
        ebc, plan=plan, sharders=[EmbeddingBagCollectionSharder(fused_params=fused)]
    )
    for step in range(2):  # live state that differs from what is loaded
        kjt = local_part(global_batch(step, 2 * world_size, False), rank, world_size)
        dmp(kjt).values().sum().backward()
    wanted = _wanted(optimizer, agree)
    load_fused_state(dmp.module, wanted)
    got = fused_state(dmp.module)
    assert sorted(got) == sorted(wanted)
    for key, value in got.items():
        if key.endswith(".step"):
            assert value.item() == 7, key
            continue
        for shard in value.local_shards():
            (row, col), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            block = wanted[key][row : row + rows, col : col + cols]
            per_row = (optimizer, key.rsplit(".", 1)[1]) in PER_ROW
            if not agree and per_row:  # a row-wise shard keeps the mean of its columns' values
                block = block.mean(1, keepdim=True).expand(-1, cols)
            torch.testing.assert_close(shard.tensor, block, rtol=0, atol=0, msg=key)
    return sum(len(v.local_shards()) for k, v in got.items() if not k.endswith(".step"))


@pytest.mark.parametrize(
    ("kind", "optimizer", "agree"),
    [
        ("row_wise", EmbOptimType.ADAM, True),
        ("column_wise", EmbOptimType.ADAM, True),
        ("row_wise", EmbOptimType.EXACT_ADAGRAD, True),
        ("column_wise", EmbOptimType.EXACT_ROWWISE_ADAGRAD, True),  # each column shard's own
        ("row_wise", EmbOptimType.EXACT_ROWWISE_ADAGRAD, False),  # column shards' into whole rows
        ("column_wise", EmbOptimType.PARTIAL_ROWWISE_ADAM, True),
        ("row_wise", EmbOptimType.PARTIAL_ROWWISE_ADAM, False),
        ("row_wise", EmbOptimType.LAMB, True),  # column shards refuse LAMB (row norms)
    ],
)
def test_load_fused_state_writes_every_state_and_step(run_ranks, kind, optimizer, agree):
    assert sum(run_ranks(_load, 2, kind, optimizer, agree)) > 0
