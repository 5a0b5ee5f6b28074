"""Seed 002, "Introduction to TorchRec", run with shardkit on one rank.

    python examples/seed_002_introduction.py

The tutorial's code, unchanged but for the mechanical rewrite the README documents
(`torchrec` -> `shardkit`, "nccl" -> "gloo", `.cuda()`/"cuda" -> CPU).
"""

import os

import torch
import torch.distributed as dist

import shardkit

os.environ["RANK"] = "0"
os.environ["WORLD_SIZE"] = "1"
os.environ["MASTER_ADDR"] = "localhost"
os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "29500")

# Note - you will need a V100 or A100 to run tutorial as as!
# If using an older GPU (such as colab free K80),
# you will need to compile fbgemm with the appripriate CUDA architecture
# or run with "gloo" on CPUs
dist.init_process_group(backend="gloo")

ebc = shardkit.EmbeddingBagCollection(
    device="meta",
    tables=[
        shardkit.EmbeddingBagConfig(
            name="product_table",
            embedding_dim=64,
            num_embeddings=4096,
            feature_names=["product"],
            pooling=shardkit.PoolingType.SUM,
        ),
        shardkit.EmbeddingBagConfig(
            name="user_table",
            embedding_dim=64,
            num_embeddings=4096,
            feature_names=["user"],
            pooling=shardkit.PoolingType.SUM,
        ),
    ],
)

model = shardkit.distributed.DistributedModelParallel(ebc, device=torch.device("cpu"))
print(model)
print(model.plan)

product_eb = torch.nn.EmbeddingBag(4096, 64)
product_eb(input=torch.tensor([101, 202, 303]), offsets=torch.tensor([0, 2, 2]))

mb = shardkit.KeyedJaggedTensor(
    keys=["product", "user"],
    values=torch.tensor([101, 202, 303, 404, 505, 606]).cpu(),
    lengths=torch.tensor([2, 0, 1, 1, 1, 1], dtype=torch.int64).cpu(),
)

print(mb.to(torch.device("cpu")))

pooled_embeddings = model(mb)
print(pooled_embeddings)
