"""Two-tower retrieval as TorchRec's examples/retrieval trains it (issue 27): query and candidate
towers over one EmbeddingBagCollection, tables planned by EmbeddingShardingPlanner
(collective_plan), fused row-wise Adagrad through apply_optimizer_in_backward, the dense part in
a KeyedOptimizerWrapper, both combined in a CombinedOptimizer.
Run: torchrun --nproc-per-node 2 two_tower.py OUT
"""

import json
import sys

import torch
import torch.distributed as dist
from program_support import initialise, mean_over_ranks  # the folder's helper module
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.types import ShardingEnv
from torchrec.modules.mlp import MLP
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
USERS, ITEMS, DIM = 300, 200, 16


class TwoTower(nn.Module):
    def __init__(self, ebc):
        super().__init__()
        self.ebc = ebc
        self.query_proj = MLP(in_size=DIM, layer_sizes=[32, 16], device=torch.device("cpu"))
        self.candidate_proj = MLP(in_size=DIM, layer_sizes=[32, 16], device=torch.device("cpu"))

    def forward(self, kjt):
        pooled = self.ebc(kjt)
        query = self.query_proj(pooled["user_id"])
        candidate = self.candidate_proj(pooled["item_id"])
        return (query * candidate).sum(dim=1)


tables = [
    EmbeddingBagConfig(name="user_table", embedding_dim=DIM, num_embeddings=USERS,
                       feature_names=["user_id"]),
    EmbeddingBagConfig(name="item_table", embedding_dim=DIM, num_embeddings=ITEMS,
                       feature_names=["item_id"]),
]  # fmt: skip
model = TwoTower(EmbeddingBagCollection(tables=tables, device=torch.device("cpu")))
apply_optimizer_in_backward(RowWiseAdagrad, model.ebc.parameters(), {"lr": 0.05})
sharders = [EmbeddingBagCollectionSharder()]
planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"))
plan = planner.collective_plan(model, sharders, dist.group.WORLD)
model = DistributedModelParallel(
    model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
    plan=plan, sharders=sharders,
)  # fmt: skip


initialise(model, scale=0.1)
dense = KeyedOptimizerWrapper(
    dict(in_backward_optimizer_filter(model.named_parameters())),
    lambda params: torch.optim.Adam(params, lr=0.01),
)
optimizer = CombinedOptimizer([model.fused_optimizer, dense])


def batch(step):
    g = torch.Generator().manual_seed(step)
    users = torch.randint(0, USERS, (8 * world,), generator=g)
    items = (users * 7 + torch.randint(0, 3, (8 * world,), generator=g)) % ITEMS
    labels = torch.randint(0, 2, (8 * world,), generator=g).float()
    items = torch.where(labels > 0, items, torch.randint(0, ITEMS, (8 * world,), generator=g))
    mine = slice(rank * 8, (rank + 1) * 8)
    kjt = KeyedJaggedTensor(keys=["user_id", "item_id"],
                            values=torch.cat([users[mine], items[mine]]),
                            lengths=torch.ones(16, dtype=torch.int64))  # fmt: skip
    return kjt, labels[mine]


losses = []
for step in range(8):
    kjt, labels = batch(step)
    loss = nn.functional.binary_cross_entropy_with_logits(model(kjt), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(mean_over_ranks(loss))

kjt, _ = batch(1000)
scores = model(kjt).detach()
every = [torch.zeros_like(scores) for _ in range(world)]
dist.all_gather(every, scores)
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"losses": losses, "scores": torch.cat(every).tolist(),
                   "optimizer_keys": len(optimizer.state_dict()["state"])}, f)  # fmt: skip
dist.destroy_process_group()
