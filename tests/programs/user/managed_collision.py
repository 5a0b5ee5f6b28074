"""Managed collision as TorchRec's MC modules document it (issue 27): a
ManagedCollisionEmbeddingBagCollection over two tables, each remapped by an
MCHManagedCollisionModule with its default single bucket, sharded row-wise on every rank by
construct_module_sharding_plan and DistributedModelParallel (TorchRec's own MC-EBC sharding
test does the same), fused SGD through apply_optimizer_in_backward. Ids are drawn far beyond
the tables' sizes; the model trains, evicts, is saved (each rank's state_dict), reloaded into a
fresh model, and trains on. Run: torchrun --nproc-per-node 2 managed_collision.py OUT
"""

import json
import sys
import zlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
from torchrec.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ROWS = {"user_table": 16, "item_table": 12}
FEATURES = {"user_table": "user_id", "item_table": "item_id"}
ID_SPACE = 10_000  # raw ids come from here: hundreds of times the tables' sizes
DIM = 8
B = 32  # samples per rank and step


class Model(nn.Module):
    def __init__(self, mc_ebc):
        super().__init__()
        self.mc_ebc = mc_ebc
        self.over = nn.Linear(2 * DIM, 1)

    def forward(self, kjt):
        pooled, remapped = self.mc_ebc(kjt)
        return self.over(pooled.values()).squeeze(1), remapped


def build():
    tables = [
        # a row an id takes afresh (after an eviction) starts at zero, not at a random draw
        EmbeddingBagConfig(name=name, embedding_dim=DIM, num_embeddings=rows,
                           feature_names=[FEATURES[name]], init_fn=torch.nn.init.zeros_)
        for name, rows in ROWS.items()
    ]  # fmt: skip
    mc_modules = {}
    for name, rows in ROWS.items():
        mc_modules[name] = MCHManagedCollisionModule(
            zch_size=rows, device=torch.device("cpu"), eviction_interval=2,
            eviction_policy=DistanceLFU_EvictionPolicy(), input_hash_size=ID_SPACE,
        )  # fmt: skip
    mc_ebc = ManagedCollisionEmbeddingBagCollection(
        EmbeddingBagCollection(tables=tables, device=torch.device("cpu")),
        ManagedCollisionCollection(mc_modules, tables),
        return_remapped_features=True,
    )
    apply_optimizer_in_backward(torch.optim.SGD, mc_ebc.parameters(), {"lr": 0.5})
    model = Model(mc_ebc)
    torch.manual_seed(0)
    model.over.reset_parameters()
    sharder = ManagedCollisionEmbeddingBagCollectionSharder()
    plan = construct_module_sharding_plan(
        mc_ebc, per_param_sharding={name: row_wise() for name in ROWS},
        local_size=world, world_size=world, device_type="cpu", sharder=sharder,
    )  # fmt: skip
    return DistributedModelParallel(
        model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
        plan=ShardingPlan({"mc_ebc": plan}), sharders=[sharder],
    )  # fmt: skip


@torch.no_grad()
def initialise(model):
    """The embedding tables from a generator seeded by their names (shards: their rows)."""
    for key, value in model.state_dict().items():
        if not isinstance(value, ShardedTensor) or not key.endswith(".weight"):
            continue
        g = torch.Generator().manual_seed(zlib.crc32(key.removeprefix("module.").encode()))
        full = torch.randn(tuple(value.size()), generator=g) * 0.1
        for shard in value.local_shards():
            (r, _), (n, _) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
            shard.tensor.copy_(full[r : r + n])


def batch(step):
    """This rank's B samples; popular ids repeat so they keep their slots."""
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(1, 4, (2 * B * world,), generator=g)
    popular = torch.tensor([7, 4_321, 9_999, 5_000, 123, 8_888])
    fresh = torch.randint(0, ID_SPACE, (int(lengths.sum()),), generator=g)
    pick = torch.randint(0, len(popular), (int(lengths.sum()),), generator=g)
    values = torch.where(torch.rand(int(lengths.sum()), generator=g) < 0.5, popular[pick], fresh)
    target = torch.randn(B * world, generator=g)
    # keys-major KJT of the global batch; this rank's samples are B of each key
    per_key = lengths.view(2, B * world)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    mine_values, mine_lengths = [], []
    for k in range(2):
        lo = k * B * world + rank * B
        mine_values.append(values[offsets[lo] : offsets[lo + B]])
        mine_lengths.append(per_key[k, rank * B : rank * B + B])
    kjt = KeyedJaggedTensor(keys=["user_id", "item_id"], values=torch.cat(mine_values),
                            lengths=torch.cat(mine_lengths))  # fmt: skip
    return kjt, target[rank * B : rank * B + B]


def gather(tensor):
    every = [None] * world
    dist.all_gather_object(every, tensor.detach().tolist())
    return every


def train(model, dense, first, count):
    losses, remapped_ids = [], []
    for step in range(first, first + count):
        kjt, target = batch(step)
        prediction, remapped = model(kjt)
        loss = ((prediction - target) ** 2).mean()
        dense.zero_grad()
        loss.backward()
        dense.step()
        losses.append(sum(gather(loss)) / world)
        remapped_ids.append(gather(remapped.values()))
    return losses, remapped_ids


model = build()
initialise(model)
dense = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
losses, remapped = train(model, dense, 0, 5)

# checkpoint: each rank saves its state_dict, a fresh model loads it and trains on
checkpoint = Path(sys.argv[1]).with_suffix(f".rank{rank}.pt")
torch.save(model.state_dict(), checkpoint)
dist.barrier()
state = model.state_dict()
state_figures = {}
for key, value in state.items():
    if "_managed_collision_modules" in key:
        state_figures[key.removeprefix("module.")] = list(value.size())
raw_ids = {}
for name in ROWS:
    key = f"mc_ebc._managed_collision_collection._managed_collision_modules.{name}"
    value = state[f"{key}._mch_sorted_raw_ids"]
    local = torch.cat([s.tensor for s in value.local_shards()])
    raw_ids[name] = sorted(v for part in gather(local) for v in part if v < ID_SPACE)
continued, continued_remapped = train(model, dense, 5, 3)

fresh = build()
fresh.load_state_dict(torch.load(checkpoint, weights_only=False))
fresh_dense = torch.optim.SGD([p for p in fresh.parameters() if p.requires_grad], lr=0.1)
resumed, resumed_remapped = train(fresh, fresh_dense, 5, 3)

if rank == 0:
    figures = {
        "losses": losses,
        "remapped_ids": json.dumps(remapped),
        "remapper_state": json.dumps(state_figures, sort_keys=True),
        "resident_raw_ids": json.dumps(raw_ids, sort_keys=True),
        "continued_losses": continued,
        "resumed_losses": resumed,
        "resumed_remapped_ids": json.dumps(resumed_remapped),
        "continued_remapped_ids": json.dumps(continued_remapped),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(figures, f)
dist.destroy_process_group()
