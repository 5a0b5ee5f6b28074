"""Plan once, save the plan, load it in the training job (issue 27): TorchRec's planner with
ParameterConstraints, the plan pickled by rank 0 (torch.save) and loaded by every rank, then
DistributedModelParallel with the loaded plan. Run: torchrun --nproc-per-node 2 plan_loading.py OUT
"""

import json
import os
import sys
import zlib

import torch
import torch.distributed as dist
from program_support import mean_over_ranks  # the folder's helper module
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ShardingEnv, ShardingType
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
PLAN = os.path.join(os.path.dirname(os.path.abspath(sys.argv[1])), "plan.pt")
# the sharding types TorchRec's EBC sharder offers on CPU (row-wise is for GPUs)
KINDS = {"t0": ShardingType.TABLE_WISE, "t1": ShardingType.COLUMN_WISE,
         "t2": ShardingType.DATA_PARALLEL, "t3": ShardingType.TABLE_WISE}  # fmt: skip
tables = [
    EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=100 + 10 * i,
                       feature_names=[f"f{i}"])
    for i in range(4)
]  # fmt: skip
ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.2})
sharders = [EmbeddingBagCollectionSharder()]

if rank == 0:  # the planning job
    constraints = {name: ParameterConstraints(sharding_types=[kind.value])
                   for name, kind in KINDS.items()}  # fmt: skip
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world, compute_device="cpu"), constraints=constraints
    )
    torch.save(planner.plan(ebc, sharders), PLAN)
dist.barrier()
plan = torch.load(PLAN, weights_only=False)  # the training job
model = DistributedModelParallel(
    ebc, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
    plan=plan, sharders=sharders,
)  # fmt: skip
with torch.no_grad():
    for key, value in sorted(model.state_dict().items()):
        g = torch.Generator().manual_seed(zlib.crc32(key.removeprefix("module.").encode()))
        full = torch.randn(tuple(value.size()), generator=g) * 0.1
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                (r, c), (n, m) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.copy_(full[r : r + n, c : c + m])
        else:
            value.copy_(full)
dense = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.2)

losses = []
for step in range(5):
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(0, 4, (4 * 2 * world,), generator=g)
    values = torch.randint(0, 100, (int(lengths.sum()),), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    per_key = [slice(k * 2 * world, (k + 1) * 2 * world) for k in range(4)]
    vals, lens = [], []
    for k in per_key:
        ks = lengths[k]
        first = int(offsets[k.start])
        start = first + int(ks[: rank * 2].sum())
        vals.append(values[start : start + int(ks[rank * 2 : rank * 2 + 2].sum())])
        lens.append(ks[rank * 2 : rank * 2 + 2])
    kjt = KeyedJaggedTensor(keys=[f"f{i}" for i in range(4)], values=torch.cat(vals),
                            lengths=torch.cat(lens))  # fmt: skip
    loss = (model(kjt).values() ** 2).sum(1).mean()
    dense.zero_grad()
    loss.backward()
    dense.step()
    losses.append(mean_over_ranks(loss))

module_plan = plan.get_plan_for_module("")
layout = {
    name: [str(p.sharding_type), str(p.compute_kernel), len(p.ranks),
           None if p.sharding_spec is None else
           [[list(s.shard_offsets), list(s.shard_sizes)] for s in p.sharding_spec.shards]]
    for name, p in sorted(module_plan.items())
}  # fmt: skip
ranks = {name: p.ranks for name, p in sorted(module_plan.items())}
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"losses": losses, "layout": json.dumps(layout), "ranks": json.dumps(ranks)}, f)
dist.destroy_process_group()
