#!/usr/bin/env python3
"""A sequence model over TorchRec's EmbeddingCollection: a user's history of items (a variable
number of ids per example, one embedding each, no pooling in the collection) is averaged into a
user vector that scores a candidate item. The item table is sharded column-wise; the model
trains through the sparse-dist pipeline. Synthetic data: items belong to clusters, a history
stays in one cluster, and the candidate is clicked when it shares the history's cluster.

    shardkit run --nproc-per-node 2 examples/torchrec/sequence_model.py

(or after the README's import rewrite, under torchrun). Prints ``RESULT`` lines the tests read.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed import TrainPipelineSparseDist
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan
from torchrec.distributed.types import ShardingPlan
from torchrec.modules.mlp import MLP
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter


def parse_args(argv):
    parser = argparse.ArgumentParser(description="sequence model over EmbeddingCollection")
    parser.add_argument("--num_items", type=int, default=96)
    parser.add_argument("--num_clusters", type=int, default=6)
    parser.add_argument("--embedding_dim", type=int, default=16)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--learning_rate", type=float, default=0.1)
    return parser.parse_args(argv)


def batches(args, seed, steps):
    g = torch.Generator().manual_seed(seed)
    per_cluster = args.num_items // args.num_clusters
    for _ in range(steps):
        clusters = torch.randint(0, args.num_clusters, (args.batch_size,), generator=g)
        lengths = torch.randint(2, 7, (args.batch_size,), generator=g)
        history = torch.cat(
            [
                torch.randint(0, per_cluster, (int(n),), generator=g) * args.num_clusters + int(c)
                for c, n in zip(clusters, lengths)
            ]
        )
        clicked = torch.rand(args.batch_size, generator=g) < 0.5
        other = (
            clusters + torch.randint(1, args.num_clusters, (args.batch_size,), generator=g)
        ) % args.num_clusters
        target_cluster = torch.where(clicked, clusters, other)
        target = (
            torch.randint(0, per_cluster, (args.batch_size,), generator=g) * args.num_clusters
            + target_cluster
        )
        yield Batch(
            dense_features=torch.zeros(args.batch_size, 1),
            sparse_features=KeyedJaggedTensor.from_lengths_sync(
                keys=["history", "target"],
                values=torch.cat([history, target]),
                lengths=torch.cat([lengths, torch.ones(args.batch_size, dtype=torch.int64)]),
            ),
            labels=clicked.float(),
        )


class SequenceModel(nn.Module):
    def __init__(self, ec, dim):
        super().__init__()
        self.ec = ec
        self.over = MLP(in_size=3 * dim, layer_sizes=[dim, 1])

    def forward(self, kjt):
        embeddings = self.ec(kjt)  # {"history": JaggedTensor [N, D], "target": JaggedTensor [B, D]}
        history = embeddings["history"]
        lengths = history.lengths()
        segment = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
        summed = torch.zeros(len(lengths), history.values().shape[1]).index_add(
            0, segment, history.values()
        )
        user = summed / lengths.clamp(min=1).unsqueeze(1)  # [B, D] mean of the history
        target = embeddings["target"].values()  # [B, D]
        return self.over(torch.cat([user, target, user * target], dim=1)).squeeze(-1)


class SequenceTrain(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, batch):
        logits = self.model(batch.sparse_features)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach(), batch.labels)


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

    ec = EmbeddingCollection(
        tables=[
            EmbeddingConfig(
                name="items",
                embedding_dim=args.embedding_dim,
                num_embeddings=args.num_items,
                feature_names=["history", "target"],
            )
        ],
        device=torch.device("meta"),
    )
    train_model = SequenceTrain(SequenceModel(ec, args.embedding_dim))
    sharder = EmbeddingCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": args.learning_rate}
    )
    module_plan = construct_module_sharding_plan(
        ec,
        # the fused kernel by name: TorchRec's generators give DENSE (fused_params unused)
        # unless the table has an optimizer applied in backward
        {
            "items": column_wise(
                ranks=list(range(world_size)), compute_kernel=EmbeddingComputeKernel.FUSED.value
            )
        },
        sharder=sharder,
        world_size=world_size,
        local_size=world_size,
        device_type=device.type,
    )
    model = DistributedModelParallel(
        train_model, device=device, plan=ShardingPlan({"model.ec": module_plan}), sharders=[sharder]
    )
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adam(params, lr=0.01),
    )
    optimizer = CombinedOptimizer([model.fused_optimizer, dense])
    pipeline = TrainPipelineSparseDist(model, optimizer, device)
    data = batches(args, seed=rank, steps=args.steps)
    losses = []
    while True:
        try:
            loss, _, _ = pipeline.progress(data)
        except StopIteration:
            break
        losses.append(loss.item())

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in batches(args, seed=1000 + rank, steps=4):
            _, (_, logits, labels) = model(batch)
            correct += int(((logits > 0).float() == labels).sum())
            total += len(labels)
    counts = torch.tensor([correct, total], dtype=torch.float64)
    dist.all_reduce(counts)
    if rank == 0:
        print(f"RESULT steps {len(losses)} first_loss {losses[0]:.4f} last_loss {losses[-1]:.4f}")
        print(f"RESULT accuracy {float(counts[0] / counts[1]):.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
