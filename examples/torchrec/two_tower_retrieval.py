#!/usr/bin/env python3
"""A two-tower retrieval model written for TorchRec: a query tower (user id) and a candidate
tower (item id) over one sharded EmbeddingBagCollection, trained with in-batch softmax through
the sparse-dist pipeline, then scored by recall@10 over every item. Synthetic data with a
structure to learn: users and items belong to clusters, and a user clicks items of its cluster.

    shardkit run --nproc-per-node 2 examples/torchrec/two_tower_retrieval.py

(or after the README's import rewrite, under torchrun). Prints ``RESULT`` lines the tests read.
"""

import argparse
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.distributed import TrainPipelineSparseDist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ShardingType
from torchrec.modules.mlp import MLP
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.streamable import Pipelineable


def parse_args(argv):
    parser = argparse.ArgumentParser(description="two-tower retrieval")
    parser.add_argument("--num_users", type=int, default=256)
    parser.add_argument("--num_items", type=int, default=128)
    parser.add_argument("--num_clusters", type=int, default=8)
    parser.add_argument("--embedding_dim", type=int, default=16)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--learning_rate", type=float, default=0.1)
    return parser.parse_args(argv)


@dataclass
class Clicks(Pipelineable):
    """One rank's batch: each example a (user, clicked item) pair, keyed "user", "item"."""

    sparse_features: KeyedJaggedTensor

    def to(self, device, non_blocking=False):
        return Clicks(self.sparse_features.to(device, non_blocking=non_blocking))

    def record_stream(self, stream):
        self.sparse_features.record_stream(stream)

    def pin_memory(self):
        return self


def clicks(args, seed, steps):
    """Users and items in clusters (id % num_clusters); a user clicks an item of its cluster."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        users = torch.randint(0, args.num_users, (args.batch_size,), generator=g)
        per_cluster = args.num_items // args.num_clusters
        picks = torch.randint(0, per_cluster, (args.batch_size,), generator=g)
        items = picks * args.num_clusters + users % args.num_clusters
        yield Clicks(
            KeyedJaggedTensor.from_lengths_sync(
                keys=["user", "item"],
                values=torch.cat([users, items]),
                lengths=torch.ones(2 * args.batch_size, dtype=torch.int64),
            )
        )


class TwoTower(nn.Module):
    def __init__(self, ebc, dim):
        super().__init__()
        self.ebc = ebc
        self.query_proj = MLP(in_size=dim, layer_sizes=[dim, dim])
        self.candidate_proj = MLP(in_size=dim, layer_sizes=[dim, dim])

    def forward(self, kjt):
        pooled = self.ebc(kjt)
        return self.query_proj(pooled["user"]), self.candidate_proj(pooled["item"])


class TwoTowerTrain(nn.Module):
    """In-batch softmax: each user's clicked item against the other items of the batch."""

    def __init__(self, two_tower):
        super().__init__()
        self.two_tower = two_tower

    def forward(self, batch):
        query, candidate = self.two_tower(batch.sparse_features)
        logits = query @ candidate.T
        loss = nn.functional.cross_entropy(logits, torch.arange(len(logits)))
        return loss, (loss.detach(), logits.detach())


def recall_at_10(model, args):
    """Of every user, the share whose top 10 items (of all) hold an item of its cluster's."""
    tower = model.module.two_tower
    users = torch.arange(args.num_users)
    items = torch.arange(args.num_items)
    n = max(len(users), len(items))  # one batch of n examples; the shorter key's end empty
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["user", "item"],
        values=torch.cat([users, items]),
        lengths=torch.cat(
            [
                torch.ones(len(users)),
                torch.zeros(n - len(users)),
                torch.ones(len(items)),
                torch.zeros(n - len(items)),
            ]
        ).long(),
    )
    with torch.no_grad():
        query, candidate = tower(kjt)
    scores = query[: len(users)] @ candidate[: len(items)].T
    top = scores.topk(10, dim=1).indices
    hit = (top % args.num_clusters) == (users % args.num_clusters).unsqueeze(1)
    return hit.float().mean().item()


def main(argv):
    args = parse_args(argv)
    rank = int(os.environ["RANK"])
    device = (
        torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    world_size = dist.get_world_size()
    torch.manual_seed(0)

    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name="user_table",
                embedding_dim=args.embedding_dim,
                num_embeddings=args.num_users,
                feature_names=["user"],
            ),
            EmbeddingBagConfig(
                name="item_table",
                embedding_dim=args.embedding_dim,
                num_embeddings=args.num_items,
                feature_names=["item"],
            ),
        ],
        device=torch.device("meta"),
    )
    sharder = EmbeddingBagCollectionSharder(
        fused_params={
            "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            "learning_rate": args.learning_rate,
        }
    )
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=world_size, compute_device=device.type),
        constraints={
            "user_table": ParameterConstraints(sharding_types=[ShardingType.ROW_WISE.value]),
            "item_table": ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value]),
        },
    )
    train_model = TwoTowerTrain(TwoTower(ebc, args.embedding_dim))
    plan = planner.collective_plan(train_model, [sharder], dist.GroupMember.WORLD)
    model = DistributedModelParallel(train_model, device=device, plan=plan, sharders=[sharder])
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adam(params, lr=0.01),
    )
    optimizer = CombinedOptimizer([model.fused_optimizer, dense])
    before = recall_at_10(model, args)
    pipeline = TrainPipelineSparseDist(model, optimizer, device)
    data = clicks(args, seed=rank, steps=args.steps)
    losses = []
    while True:
        try:
            loss, _ = pipeline.progress(data)
        except StopIteration:
            break
        losses.append(loss.item())
    after = recall_at_10(model, args)
    if rank == 0:
        kinds = {t: p.sharding_type for m in model.plan.plan.values() for t, p in m.items()}
        print(f"RESULT plan {' '.join(f'{t}={k}' for t, k in sorted(kinds.items()))}")
        print(f"RESULT steps {len(losses)} first_loss {losses[0]:.4f} last_loss {losses[-1]:.4f}")
        print(f"RESULT recall_at_10 before {before:.4f} after {after:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
