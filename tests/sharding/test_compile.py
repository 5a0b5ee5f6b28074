"""A DMP model under `torch.compile` (the whole model, as TorchRec users compile it) trains to
the eager DMP's losses and parameters, every sharding type, with one log line for the graph
break at the sharded collection (see [Note: sharded collections under torch.compile])."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from shardkit.distributed import DistributedModelParallel
from shardkit.optim import EmbOptimType
from shardkit.sharding import EmbeddingBagCollectionSharder
from shardkit.types import ShardingPlan
from tests.sharding.common import dlrm, dlrm_batch, dlrm_plan, local_part, make_plan

LOCAL_BATCH = 4
STEPS = 3
BACKEND = "aot_eager"  # AOTAutograd as Inductor runs it, without its C++ build


def _dmp(model, kind: str, world_size: int):
    """DMP over 2 "hosts" of one rank each, so the two-level types have hosts to span."""
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}
    ebc = model.sparse_arch.embedding_bag_collection
    if kind.startswith("data_parallel"):
        module_plan = dlrm_plan(model, kind, world_size)
    else:
        module_plan = make_plan(ebc, kind, world_size, 1)
    plan = ShardingPlan({"sparse_arch.embedding_bag_collection": module_plan})
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused)]
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan,
                                   sharders=sharders, local_world_size=1)  # fmt: skip
    dense = [
        p for n, p in dmp.named_parameters() if "embedding_bags" not in n or ".shards." not in n
    ]
    return dmp, torch.optim.SGD(dense, lr=0.1)


def _train(rank: int, world_size: int, kind: str):
    """The same DLRM under DMP twice, eager and compiled: losses and every parameter after
    ``STEPS`` steps; and what the sharded collection logged."""
    torch.manual_seed(0)
    model = dlrm()
    twin = copy.deepcopy(model)  # DMP shards a model in place
    eager, eager_opt = _dmp(model, kind, world_size)
    compiled, compiled_opt = _dmp(twin, kind, world_size)
    runner = torch.compile(compiled, backend=BACKEND, dynamic=True)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("shardkit.sharding._collection")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    losses = []
    torch._dynamo.reset()
    try:
        for step in range(STEPS):
            dense, sparse, labels = dlrm_batch(step, LOCAL_BATCH * world_size)
            mine = slice(rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH)
            features = local_part(sparse, rank, world_size)
            pair = []
            for net, opt in ((eager, eager_opt), (runner, compiled_opt)):
                loss = loss_fn(net(dense[mine], features).squeeze(1), labels[mine])
                opt.zero_grad()
                loss.backward()
                opt.step()
                pair.append(loss.detach())
            losses.append(pair)
    finally:
        logger.removeHandler(handler)
    params = [(n, a.detach().clone(), b.detach().clone()) for (n, a), (_, b)
              in zip(eager.named_parameters(), compiled.named_parameters())]  # fmt: skip
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return losses, params, records, graphs


KINDS = ["table_wise", "row_wise", "column_wise", "table_row_wise", "table_column_wise",
         "grid_shard", "data_parallel", "data_parallel_fused"]  # fmt: skip


@pytest.mark.pt2_grid  # 2 ranks compiling twice: ~20 s each on 2 quiet cores
@pytest.mark.parametrize("kind", KINDS)
def test_compiled_dmp_trains_as_eager(run_ranks, kind):
    for losses, params, records, graphs in run_ranks(_train, 2, kind):
        assert graphs >= 2, "the dense part before and after the sharded collection compiled"
        for eager_loss, compiled_loss in losses:
            torch.testing.assert_close(compiled_loss, eager_loss)
        assert params
        for name, eager, compiled in params:
            torch.testing.assert_close(compiled, eager, msg=name)
        said = [r for r in records if r.startswith("torch.compile:")]
        assert said == ["torch.compile: ShardedEmbeddingBagCollection runs eagerly between "
                        "compiled graphs (a graph break): its input and output dists are "
                        "collectives; the model around it compiles"]  # fmt: skip
