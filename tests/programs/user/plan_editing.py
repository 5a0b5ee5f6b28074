"""A TorchRec user edits a plan before sharding (issue 27): from TorchRec's sharding tutorial and
its `construct_module_sharding_plan` docs. Run: torchrun --nproc-per-node 2 plan_editing.py OUT

Four tables; the plan puts them row-wise, table-wise, column-wise and data-parallel, then the user
moves the table-wise one to rank 1, runs one row-wise table with the dense kernel (its gradient
stepped by the dense optimizer), and checks the kernel names against TorchRec's enum values.
"""

import json
import sys

import torch
import torch.distributed as dist
from program_support import mean_over_ranks  # the folder's helper module
from torch.distributed import _remote_device
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_wise,
)
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)

tables = [
    EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=rows, feature_names=[f"f{i}"])
    for i, rows in enumerate([40, 30, 20, 10])
]
ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
# fused tables, as TorchRec's docs ask for them: an optimizer applied in backward
apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.1})
g = torch.Generator().manual_seed(1)
FULL = {f"embedding_bags.t{i}.weight": torch.randn(rows, 8, generator=g) * 0.1
        for i, rows in enumerate([40, 30, 20, 10])}  # fmt: skip

plan = construct_module_sharding_plan(
    ebc,
    per_param_sharding={"t0": row_wise(), "t1": table_wise(rank=0),
                        "t2": column_wise(ranks=[0, 1]), "t3": data_parallel()},
    local_size=world, world_size=world, device_type="cpu",
)  # fmt: skip
# the edits users make
plan["t1"].ranks = [1]
plan["t1"].sharding_spec.shards[0].placement = _remote_device("rank:1/cpu")
plan["t0"].compute_kernel = EmbeddingComputeKernel.DENSE.value
kernels = {name: str(p.compute_kernel) for name, p in sorted(plan.items())}

sharder = EmbeddingBagCollectionSharder()
model = DistributedModelParallel(
    ebc, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
    plan=ShardingPlan({"": plan}), sharders=[sharder],
)  # fmt: skip


@torch.no_grad()
def load_pretrained(model, full):
    """Copy full tables into this rank's shards, as TorchRec's docs load pretrained tables."""
    for key, value in model.state_dict().items():
        table = full[key.removeprefix("module.")]
        if isinstance(value, ShardedTensor):
            for shard in value.local_shards():
                (r, c), (nr, nc) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                shard.tensor.copy_(table[r : r + nr, c : c + nc])
        else:
            value.copy_(table)


load_pretrained(model, FULL)
dense_params = [p for n, p in model.named_parameters() if p.requires_grad]
dense = torch.optim.SGD(dense_params, lr=0.1)


def batch(step):
    gen = torch.Generator().manual_seed(100 + step)
    lengths = torch.randint(0, 3, (4 * 2 * world,), generator=gen)
    limits = torch.tensor([40, 30, 20, 10]).repeat_interleave(2 * world)
    values = torch.cat([torch.randint(0, int(lim), (int(n),), generator=gen)
                        for n, lim in zip(lengths, limits)])  # fmt: skip
    kjt = KeyedJaggedTensor(keys=["f0", "f1", "f2", "f3"], values=values, lengths=lengths)
    return kjt, torch.randn(2 * world, 32, generator=gen)


def local(kjt):
    per = kjt.stride() // world
    parts = {}
    for key, jt in kjt.to_dict().items():
        off = jt.offsets()
        lo, hi = int(off[rank * per]), int(off[(rank + 1) * per])
        parts[key] = (jt.values()[lo:hi], jt.lengths()[rank * per : (rank + 1) * per])
    keys = list(parts)
    return KeyedJaggedTensor(keys=keys, values=torch.cat([parts[k][0] for k in keys]),
                             lengths=torch.cat([parts[k][1] for k in keys]))  # fmt: skip


losses = []
for step in range(6):
    kjt, target = batch(step)
    out = model(local(kjt)).values()
    loss = ((out - target[rank * 2 : rank * 2 + 2]) ** 2).mean()
    dense.zero_grad()
    loss.backward()
    dense.step()
    losses.append(mean_over_ranks(loss))

kjt, _ = batch(99)
final = model(local(kjt)).values().detach()
outs = [torch.zeros_like(final) for _ in range(world)]
dist.all_gather(outs, final)
if rank == 0:
    figures = {
        "losses": losses,
        "final_outputs": torch.cat(outs).tolist(),
        "kernels": json.dumps(kernels, sort_keys=True),
        "fused_is_fused": EmbeddingComputeKernel.FUSED.value == "fused",
        "t1_ranks": json.dumps(model.plan.plan[""]["t1"].ranks),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(figures, f)
dist.destroy_process_group()
