"""A torch.distributed.checkpoint flow for a DMP model (issue 27), as torch's DCP recipe and
TorchRec's docs put it together: the model's sharded state dict and its fused optimizer's
(KeyedOptimizer) state saved with ``dcp.save`` on 2 ranks, then loaded in place with
``dcp.load`` into a fresh model sharded by ANOTHER plan (table-wise tables become row-wise and
the other way round: DCP reshards on load), and training goes on. Fused RowWiseAdagrad through
apply_optimizer_in_backward, so the optimizer state is sharded too (``--model-only``: the
model's state dict alone, the optimizer starting afresh after the load).
Run: torchrun --nproc-per-node 2 dcp_reshard.py OUT [--model-only]
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from program_support import initialise, mean_over_ranks  # the folder's helper module
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ROWS = {"t0": 40, "t1": 30, "t2": 50}
FEATURES = ["f0", "f1", "f2"]
WITH_OPTIMIZER = "--model-only" not in sys.argv


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        tables = [
            EmbeddingBagConfig(name=name, embedding_dim=8, num_embeddings=rows,
                               feature_names=[f"f{name[1]}"])
            for name, rows in ROWS.items()
        ]  # fmt: skip
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
        self.over = nn.Linear(24, 1)

    def forward(self, kjt):
        return self.over(self.ebc(kjt).values()).squeeze(1)


def build(per_table):
    model = Model()
    apply_optimizer_in_backward(RowWiseAdagrad, model.ebc.parameters(), {"lr": 0.1})
    plan = construct_module_sharding_plan(
        model.ebc, per_param_sharding=per_table, local_size=world, world_size=world,
        device_type="cpu",
    )  # fmt: skip
    return DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
        plan=ShardingPlan({"ebc": plan}), sharders=[EmbeddingBagCollectionSharder()],
    )  # fmt: skip


def batch(step):
    g = torch.Generator().manual_seed(step * world + rank)
    lengths = torch.randint(0, 4, (len(FEATURES) * 8,), generator=g)
    limits = torch.tensor(list(ROWS.values())).repeat_interleave(8).repeat_interleave(lengths)
    values = (torch.rand(int(lengths.sum()), generator=g) * limits).long()
    kjt = KeyedJaggedTensor(keys=FEATURES, values=values, lengths=lengths)
    return kjt, torch.randn(8, generator=g)


def train(model, first, count):
    dense = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    losses = []
    for step in range(first, first + count):
        kjt, target = batch(step)
        loss = ((model(kjt) - target) ** 2).mean()
        dense.zero_grad()
        loss.backward()
        dense.step()
        losses.append(mean_over_ranks(loss))
    return losses


def local_sum(value):
    """This rank's part of a tensor's sum: its shards of a sharded tensor, all of a replicated
    one on rank 0 only."""
    if isinstance(value, ShardedTensor):
        return sum(float(shard.tensor.double().sum()) for shard in value.local_shards())
    return float(value.double().sum()) if rank == 0 else 0.0


def checksums(model):
    """Parameter checksums and the fused optimizer state's, by key, over the whole model (a
    rank's fused optimizer holds only the tables it has shards of)."""
    mine = {f"model/{k}": local_sum(v) for k, v in model.state_dict().items()}
    optimizer_state = model.fused_optimizer.state_dict()["state"] if WITH_OPTIMIZER else {}
    for param, state in optimizer_state.items():
        for name, value in state.items():
            mine[f"optim/{param}/{name}"] = local_sum(value)
    every = [None] * world
    dist.all_gather_object(every, mine)
    keys = sorted({k for part in every for k in part})
    return {k: sum(part.get(k, 0.0) for part in every) for k in keys}


def shardings(model):
    return {name: p.sharding_type for name, p in sorted(model.plan.plan["ebc"].items())}


first_plan = {"t0": table_wise(rank=0), "t1": table_wise(rank=1), "t2": row_wise()}
second_plan = {"t0": row_wise(), "t1": row_wise(), "t2": table_wise(rank=1)}

model = build(first_plan)
initialise(model, scale=0.1)
losses = train(model, 0, 4)
saved_sums = checksums(model)
folder = Path(sys.argv[1]).with_suffix(".checkpoint")
to_save = {"model": model.state_dict()}
if WITH_OPTIMIZER:
    to_save["optim"] = model.fused_optimizer.state_dict()
dcp.save(to_save, checkpoint_id=folder)
continued = train(model, 4, 3)

fresh = build(second_plan)  # another plan: DCP reshards on load
state = {"model": fresh.state_dict()}
if WITH_OPTIMIZER:
    state["optim"] = fresh.fused_optimizer.state_dict()
dcp.load(state, checkpoint_id=folder)
fresh.load_state_dict(state["model"])
if WITH_OPTIMIZER:
    fresh.fused_optimizer.load_state_dict(state["optim"])
loaded_sums = checksums(fresh)
resumed = train(fresh, 4, 3)

if rank == 0:
    figures = {
        "losses": losses,
        "continued_losses": continued,
        "resumed_losses": resumed,
        "checksum_keys": json.dumps(sorted(saved_sums)),
        "saved_checksums": [saved_sums[k] for k in sorted(saved_sums)],
        "loaded_checksums": [loaded_sums.get(k) for k in sorted(saved_sums)],
        "shardings_saved": json.dumps(shardings(model)),
        "shardings_loaded": json.dumps(shardings(fresh)),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(figures, f)
dist.destroy_process_group()
