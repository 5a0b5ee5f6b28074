"""A torch.distributed.checkpoint written by one library and loaded by the other (issue 27): a
DMP model whose EmbeddingBagCollection has its optimizer fused through the sharder's
``fused_params`` (FBGEMM's row-wise Adagrad, or Adam with ``--adam``), as TorchRec's docs put it
together. ``--save CKPT``: 4 steps under a table-wise plan, the model's and
``dmp.fused_optimizer``'s state dicts saved with ``dcp.save``, then 3 more steps (the continued
losses). ``--load CKPT``: a fresh model under another plan (row-wise and table-wise on other
ranks) loads CKPT in place with ``dcp.load`` and trains the same 3 steps (the resumed losses).
The test runs ``--save`` on one library and ``--load`` on the other.
Run: torchrun --nproc-per-node 2 dcp_across_libraries.py OUT (--save | --load) CKPT [--adam]
"""

import json
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from program_support import initialise, mean_over_ranks  # the folder's helper module
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ROWS = {"t0": 24, "t1": 17, "t2": 30}
FEATURES = ["f0", "f1", "f2"]
FUSED_KERNEL = EmbeddingComputeKernel.FUSED.value  # the plan generators' default is dense
SAVE = "--save" in sys.argv
CHECKPOINT = sys.argv[sys.argv.index("--save" if SAVE else "--load") + 1]
if "--adam" in sys.argv:
    FUSED = {"optimizer": EmbOptimType.ADAM, "learning_rate": 0.05, "eps": 1e-8}
else:
    FUSED = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1, "eps": 1e-8}


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        tables = [
            EmbeddingBagConfig(name=name, embedding_dim=4, num_embeddings=rows,
                               feature_names=[f"f{name[1]}"])
            for name, rows in ROWS.items()
        ]  # fmt: skip
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
        self.over = nn.Linear(12, 1)

    def forward(self, kjt):
        return self.over(self.ebc(kjt).values()).squeeze(1)


def build(per_table):
    model = Model()
    sharder = EmbeddingBagCollectionSharder(fused_params=dict(FUSED))
    plan = construct_module_sharding_plan(
        model.ebc, per_param_sharding=per_table, local_size=world, world_size=world,
        device_type="cpu", sharder=sharder,
    )  # fmt: skip
    return DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
        plan=ShardingPlan({"ebc": plan}), sharders=[sharder],
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


def state_layout(model):
    """Every key of what is saved, with its global shape, over the ranks (a rank's fused
    optimizer holds only its tables): the two libraries' must agree for a checkpoint of one
    to load into the other."""
    state = {"model": model.state_dict(), "optim": model.fused_optimizer.state_dict()["state"]}
    flat = {f"model/{k}": v for k, v in state["model"].items()}
    for param, entries in state["optim"].items():
        flat.update({f"optim/{param}/{name}": value for name, value in entries.items()})
    mine = {k: list(v.size()) if isinstance(v, ShardedTensor) else list(v.shape)
            for k, v in flat.items()}  # fmt: skip
    every = [None] * world
    dist.all_gather_object(every, mine)
    return json.dumps({k: v for part in every for k, v in sorted(part.items())}, sort_keys=True)


if SAVE:
    model = build({"t0": table_wise(rank=0, compute_kernel=FUSED_KERNEL),
                   "t1": table_wise(rank=1, compute_kernel=FUSED_KERNEL),
                   "t2": row_wise(compute_kernel=FUSED_KERNEL)})  # fmt: skip
    initialise(model, scale=0.1)
    figures = {"losses": train(model, 0, 4), "layout": state_layout(model)}
    dcp.save(
        {"model": model.state_dict(), "optim": model.fused_optimizer.state_dict()},
        checkpoint_id=CHECKPOINT,
    )
    figures["continued_losses"] = train(model, 4, 3)
else:
    model = build({"t0": row_wise(compute_kernel=FUSED_KERNEL),
                   "t1": table_wise(rank=0, compute_kernel=FUSED_KERNEL),
                   "t2": table_wise(rank=1, compute_kernel=FUSED_KERNEL)})  # fmt: skip
    state = {"model": model.state_dict(), "optim": model.fused_optimizer.state_dict()}
    dcp.load(state, checkpoint_id=CHECKPOINT)
    model.load_state_dict(state["model"])
    model.fused_optimizer.load_state_dict(state["optim"])
    figures = {"resumed_losses": train(model, 4, 3), "layout": state_layout(model)}

if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(figures, f)
dist.destroy_process_group()
