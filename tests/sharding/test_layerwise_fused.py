"""FBGEMM's LAMB, LARS-SGD and partial row-wise Adam/LAMB fused into a sharded
EmbeddingBagCollection, 2 ranks, against the unsharded module (the spec): outputs, and each
shard's rows and optimizer state after several steps.

Table-wise and row-wise shards hold whole rows, so the per-row norms of these rules ([Note:
layer-wise rules per row]) are the unsharded ones. A shard with part of each row's columns would
take them over its own columns (as TorchRec's column shards do) and step unlike the unsharded
module: LAMB, LARS_SGD and PARTIAL_ROWWISE_LAMB are refused there, on every rank, up front.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from shardkit import EmbeddingBagCollection
from shardkit.optim import LAMB, EmbOptimType, LarsSGD, PartialRowWiseAdam, PartialRowWiseLAMB
from shardkit.sharding import (
    ShardedEmbeddingBagCollection,
    column_wise,
    construct_module_sharding_plan,
    table_wise,
)
from shardkit.types import ShardingEnv
from tests.sharding.common import (
    assert_pairs_close,
    configs,
    global_batch,
    local_part,
    make_plan,
    table_pairs,
)

LOCAL_BATCH = 3
FUSED = {
    EmbOptimType.LAMB: {"learning_rate": 0.05, "weight_decay": 0.01},
    EmbOptimType.LARS_SGD: {"learning_rate": 0.5, "momentum": 0.5, "eta": 0.1},
    EmbOptimType.PARTIAL_ROWWISE_ADAM: {"learning_rate": 0.05, "beta1": 0.8},
    EmbOptimType.PARTIAL_ROWWISE_LAMB: {"learning_rate": 0.05, "eps": 1e-6},
}


def _train(rank, world_size, kind, optimizer):
    torch.manual_seed(0)
    fused = {"optimizer": optimizer, **FUSED[optimizer]}
    ebc = EmbeddingBagCollection(tables=configs(), fused_params=fused)
    reference = copy.deepcopy(ebc)
    plan = make_plan(ebc, kind, world_size, world_size)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    sharded = ShardedEmbeddingBagCollection(ebc, plan, env, local_world_size=world_size)
    pairs = []
    for step in range(3):
        kjt = global_batch(step, LOCAL_BATCH * world_size, weighted=False)
        out = sharded(local_part(kjt, rank, world_size)).values()
        out.pow(2).sum(1).mean().backward()  # gradients average over ranks, as DDP
        expected = reference(kjt).values()
        expected.pow(2).sum(1).mean().backward()
        mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
        pairs.append((f"output {step}", out.detach(), expected.detach()[mine]))
    return pairs + table_pairs(sharded, reference, "embedding_bags")


@pytest.mark.parametrize("optimizer", list(FUSED))
@pytest.mark.parametrize("kind", ["table_wise", "row_wise"])
def test_sharded_layerwise_rules_match_the_unsharded_module(run_ranks, kind, optimizer):
    assert_pairs_close(run_ranks(_train, 2, kind, optimizer), atol=1e-5)


def _column_split(rank, world_size, kind, optimizer):
    fused = {"optimizer": optimizer, **FUSED[optimizer]}
    ebc = EmbeddingBagCollection(tables=configs(), fused_params=fused)
    plan = make_plan(ebc, kind, world_size, world_size)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    with pytest.raises(ValueError) as info:
        ShardedEmbeddingBagCollection(ebc, plan, env, local_world_size=world_size)
    # The DENSE kernel's optimizer is the user's: the plan is taken; a dense rule with row
    # norms is refused on its column shards, on every rank, and one without row norms is not.
    dense = {f"t{i}": table_wise(rank=i % 2) for i in range(4)}
    dense["t0"] = column_wise(ranks=[0, 1], compute_kernel="dense")
    dense_plan = construct_module_sharding_plan(
        ebc, dense, world_size=world_size, local_size=world_size, device_type="cpu"
    )
    sharded = ShardedEmbeddingBagCollection(ebc, dense_plan, env, local_world_size=world_size)
    dense_params = [p for p in sharded.parameters() if not hasattr(p, "_in_backward_optimizers")]
    PartialRowWiseAdam(dense_params)
    rule = {EmbOptimType.LAMB: LAMB, EmbOptimType.LARS_SGD: LarsSGD}.get(
        optimizer, PartialRowWiseLAMB
    )
    with pytest.raises(ValueError) as dense_info:
        rule(dense_params)
    return str(info.value), str(dense_info.value)


@pytest.mark.parametrize(
    ("kind", "optimizer"),
    [("column_wise", EmbOptimType.LAMB), ("table_column_wise", EmbOptimType.LARS_SGD),
     ("column_wise", EmbOptimType.PARTIAL_ROWWISE_LAMB)],
)  # fmt: skip
def test_row_norm_rules_on_column_shards_are_refused_on_every_rank(run_ranks, kind, optimizer):
    for message, dense in run_ranks(_column_split, 2, kind, optimizer):
        with pytest.raises(ValueError, match=(
            r"(LAMB|LarsSGD|PartialRowWiseLAMB) scales each row's step by norms over the whole "
            r"row, but it was given the dense parameters of a sharded collection whose DENSE "
            r"tables \['t0'\] are split by columns \(each shard would take the norms of its own "
            r"columns, unlike the unsharded module\); plan those tables table_wise, row_wise, "
            r"table_row_wise or data_parallel, or step them with a rule without row norms \(e.g. "
            r"PartialRowWiseAdam or torch.optim.Adam\)"
        )):  # fmt: skip
            raise ValueError(dense)
        with pytest.raises(ValueError, match=(
            rf"table 't0' has the fused optimizer {optimizer.name}, which scales each row's "
            rf"step by norms over the whole row, but its {kind} plan splits its 4 columns into "
            r"shards of \[2, 2\] .*; plan it table_wise, row_wise or table_row_wise, or use a "
            r"rule without row norms \(e.g. EXACT_ROWWISE_ADAGRAD\)"
        )):  # fmt: skip
            raise ValueError(message)
