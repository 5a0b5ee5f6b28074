"""A BERT4Rec-like sequential recommender as TorchRec's bert4rec example builds it (issue 27): an
EmbeddingCollection of item ids (one vector per id, JaggedTensor per feature), a transformer
encoder over each user's padded history, masked-item prediction against the item table; the
collection sharded row-wise with a fused row-wise Adagrad (FBGEMM has no fused Adam on CPU),
the rest data-parallel; the sharded state dict's keys and the item table gathered on rank 0.
Run: torchrun --nproc-per-node 2 bert4rec_like.py OUT
"""

import json
import sys

import torch
import torch.distributed as dist
from program_support import initialise, mean_over_ranks  # the folder's helper module
from torch import nn
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ITEMS, DIM, LEN = 60, 16, 6
MASK = ITEMS - 1  # the last item id is the mask token


class Bert4RecLike(nn.Module):
    def __init__(self):
        super().__init__()
        self.ec = EmbeddingCollection(
            tables=[
                EmbeddingConfig(
                    name="item_table",
                    embedding_dim=DIM,
                    num_embeddings=ITEMS,
                    feature_names=["item"],
                )
            ],
            device=torch.device("cpu"),
        )
        self.position = nn.Embedding(LEN, DIM)
        self.encoder = nn.TransformerEncoderLayer(DIM, 2, 32, dropout=0.0, batch_first=True)
        self.out = nn.Linear(DIM, ITEMS)

    def forward(self, kjt):
        jt = self.ec(kjt)["item"]
        padded = jt.to_padded_dense(desired_length=LEN)  # [B, LEN, DIM]
        x = padded + self.position.weight
        return self.out(self.encoder(x))  # [B, LEN, ITEMS]


model = Bert4RecLike()
apply_optimizer_in_backward(RowWiseAdagrad, model.ec.parameters(), {"lr": 0.05})
sharders = [EmbeddingCollectionSharder()]
plan = construct_module_sharding_plan(model.ec, {"item_table": row_wise()}, local_size=world,
                                      world_size=world, device_type="cpu")  # fmt: skip
model = DistributedModelParallel(
    model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
    plan=ShardingPlan({"ec": plan}), sharders=sharders,
)  # fmt: skip


initialise(model, scale=0.1)
dense = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01)


def batch(step):
    g = torch.Generator().manual_seed(step)
    lengths = torch.randint(2, LEN + 1, (3 * world,), generator=g)
    items = torch.randint(0, MASK, (int(lengths.sum()),), generator=g)
    masked = torch.rand(items.shape, generator=g) < 0.3
    inputs = torch.where(masked, torch.full_like(items, MASK), items)
    mine = slice(rank * 3, (rank + 1) * 3)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    lo, hi = int(offsets[mine.start]), int(offsets[mine.stop])
    kjt = KeyedJaggedTensor(keys=["item"], values=inputs[lo:hi], lengths=lengths[mine])
    return kjt, items[lo:hi], masked[lo:hi], lengths[mine]


losses = []
for step in range(6):
    kjt, targets, masked, lengths = batch(step)
    logits = model(kjt)
    valid = torch.arange(LEN) < lengths[:, None]  # [B, LEN]: the positions of real items
    picked = logits[valid]  # [N, ITEMS], in the jagged order of the items
    loss = nn.functional.cross_entropy(picked[masked], targets[masked]) if masked.any() else (
        picked.sum() * 0)  # fmt: skip
    dense.zero_grad()
    loss.backward()
    dense.step()
    losses.append(mean_over_ranks(loss))

state = model.state_dict()
table = state[next(k for k in state if k.endswith("ec.embeddings.item_table.weight"))]
full = torch.empty(ITEMS, DIM) if rank == 0 else None
table.gather(dst=0, out=full)
if rank == 0:
    figures = {
        "losses": losses,
        "item_table_abs_sum": float(full.abs().sum()),
        "item_table_row_norms": full.norm(dim=1).tolist(),
        "state_dict_keys": json.dumps(sorted(k.removeprefix("module.") for k in state)),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(figures, f)
dist.destroy_process_group()
