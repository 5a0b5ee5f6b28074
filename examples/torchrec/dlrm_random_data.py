#!/usr/bin/env python3
"""DLRM on random data, written for TorchRec: model-parallel tables with row-wise Adagrad fused
into backward, Adagrad for the dense part, and the sparse-dist train pipeline; then the eval
pipeline over held-out batches. It imports only TorchRec names: run it unchanged on shardkit,

    shardkit run --nproc-per-node 2 examples/torchrec/dlrm_random_data.py

or after the README's import rewrite under torchrun (``torchrun --nproc-per-node 2 ...``).
Prints the training loss every few steps and ``RESULT`` lines the tests read.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torchrec.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES
from torchrec.datasets.random import RandomRecDataset
from torchrec.distributed import EvalPipelineSparseDist, TrainPipelineSparseDist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad


def parse_args(argv):
    parser = argparse.ArgumentParser(description="DLRM on random data")
    parser.add_argument("--num_embeddings", type=int, default=1000)
    parser.add_argument("--embedding_dim", type=int, default=8)
    parser.add_argument("--num_tables", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--train_batches", type=int, default=20)
    parser.add_argument("--eval_batches", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=0.05)
    return parser.parse_args(argv)


def batches(args, seed, count):
    dataset = RandomRecDataset(
        keys=DEFAULT_CAT_NAMES[: args.num_tables],
        batch_size=args.batch_size,
        hash_size=args.num_embeddings,
        ids_per_feature=2,
        num_dense=len(DEFAULT_INT_NAMES),
        num_batches=count,
        manual_seed=seed,
    )
    return iter(dataset)


def main(argv):
    args = parse_args(argv)
    rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device(f"cuda:{rank}")
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(backend=backend)
    torch.manual_seed(0)

    tables = [
        EmbeddingBagConfig(
            name=f"t_{name}",
            embedding_dim=args.embedding_dim,
            num_embeddings=args.num_embeddings,
            feature_names=[name],
        )
        for name in DEFAULT_CAT_NAMES[: args.num_tables]
    ]
    dlrm = DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
        dense_in_features=len(DEFAULT_INT_NAMES),
        dense_arch_layer_sizes=[16, args.embedding_dim],
        over_arch_layer_sizes=[16, 1],
        dense_device=device,
    )
    train_model = DLRMTrain(dlrm)
    apply_optimizer_in_backward(
        RowWiseAdagrad, train_model.model.sparse_arch.parameters(), {"lr": args.learning_rate}
    )
    model = DistributedModelParallel(
        module=train_model, device=device, sharders=[EmbeddingBagCollectionSharder()]
    )
    dense_optimizer = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adagrad(params, lr=args.learning_rate),
    )
    optimizer = CombinedOptimizer([model.fused_optimizer, dense_optimizer])

    pipeline = TrainPipelineSparseDist(model, optimizer, device)
    data = batches(args, seed=rank, count=args.train_batches)
    losses = []
    for step in range(args.train_batches):
        loss, _, _ = pipeline.progress(data)
        losses.append(loss.item())
        if rank == 0 and step % 5 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)

    model.eval()
    evaluation = EvalPipelineSparseDist(model, optimizer, device)
    held_out = batches(args, seed=100 + rank, count=args.eval_batches)
    eval_losses = []
    while True:
        try:
            loss, _, _ = evaluation.progress(held_out)
        except StopIteration:
            break
        eval_losses.append(loss.item())

    if rank == 0:
        kinds = {p.sharding_type for m in model.plan.plan.values() for p in m.values()}
        print(f"RESULT sharding_types {' '.join(sorted(str(k) for k in kinds))}")
        print(f"RESULT train_losses {' '.join(f'{x:.6f}' for x in losses)}")
        print(
            f"RESULT eval_batches {len(eval_losses)} eval_loss {sum(eval_losses) / len(eval_losses):.6f}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
