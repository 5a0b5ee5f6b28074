#!/usr/bin/env python3
"""DeepFM on local Criteo files (Kaggle's tab-separated format), written for TorchRec: the TSV
files become TorchRec's ``.npy`` files, ``InMemoryBinaryCriteoIterDataPipe`` gives each rank its
batches, ``SimpleDeepFMNN`` trains with its tables sharded, and ``AUCMetric`` reports validation
AUC over all ranks. It imports only TorchRec names:

    shardkit run --nproc-per-node 2 examples/torchrec/deepfm_criteo.py \\
        --train_tsv day_0.tsv --val_tsv day_1.tsv

(or after the README's import rewrite, under torchrun). Prints ``RESULT`` lines the tests read.
"""

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torch import nn
from torchrec.datasets.criteo import (
    CAT_FEATURE_COUNT,
    DEFAULT_CAT_NAMES,
    INT_FEATURE_COUNT,
    BinaryCriteoUtils,
    InMemoryBinaryCriteoIterDataPipe,
)
from torchrec.distributed import EvalPipelineSparseDist, TrainPipelineSparseDist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.metrics.auc import AUCMetric
from torchrec.metrics.metrics_config import RecTaskInfo
from torchrec.models.deepfm import SimpleDeepFMNN
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter


def parse_args(argv):
    parser = argparse.ArgumentParser(description="DeepFM on Criteo TSV files")
    parser.add_argument("--train_tsv", required=True)
    parser.add_argument("--val_tsv", required=True)
    parser.add_argument("--num_embeddings", type=int, default=200)
    parser.add_argument("--embedding_dim", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--learning_rate", type=float, default=0.2)
    return parser.parse_args(argv)


class DeepFMTrain(nn.Module):
    """(loss, (loss, probabilities, labels)) for a batch, as TorchRec's pipelines expect
    (SimpleDeepFMNN ends in a sigmoid: it outputs click probabilities)."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.loss_fn = nn.BCELoss()

    def forward(self, batch):
        probabilities = self.model(batch.dense_features, batch.sparse_features).squeeze(-1)
        loss = self.loss_fn(probabilities, batch.labels.float())
        return loss, (loss.detach(), probabilities.detach(), batch.labels.detach())


def to_npys(tsv, out_dir, stage):
    paths = [os.path.join(out_dir, f"{stage}_{kind}.npy") for kind in ("dense", "sparse", "labels")]
    BinaryCriteoUtils.tsv_to_npys(tsv, *paths)  # labelled rows (criteo_1tb: no "test" rule)
    return [[p] for p in paths]


def loader(npys, args, rank, world_size, stage):
    dense, sparse, labels = npys
    return InMemoryBinaryCriteoIterDataPipe(
        stage=stage,
        dense_paths=dense,
        sparse_paths=sparse,
        labels_paths=labels,
        batch_size=args.batch_size,
        rank=rank,
        world_size=world_size,
        drop_last=True,
        hashes=[args.num_embeddings] * CAT_FEATURE_COUNT,
    )


def main(argv):
    args = parse_args(argv)
    rank = int(os.environ["RANK"])
    if torch.cuda.is_available():
        device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}")
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend)
    world_size = dist.get_world_size()
    torch.manual_seed(0)

    scratch = tempfile.mkdtemp(prefix=f"criteo_rank{rank}_")
    train_npys = to_npys(args.train_tsv, scratch, "train")
    val_npys = to_npys(args.val_tsv, scratch, "val")

    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name=f"t_{name}",
                embedding_dim=args.embedding_dim,
                num_embeddings=args.num_embeddings,
                feature_names=[name],
            )
            for name in DEFAULT_CAT_NAMES
        ],
        device=torch.device("meta"),
    )
    deepfm = SimpleDeepFMNN(
        num_dense_features=INT_FEATURE_COUNT,
        embedding_bag_collection=ebc,
        hidden_layer_size=16,
        deep_fm_dimension=8,
    )
    sharder = EmbeddingBagCollectionSharder(
        fused_params={
            "optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            "learning_rate": args.learning_rate,
        }
    )
    model = DistributedModelParallel(DeepFMTrain(deepfm), device=device, sharders=[sharder])
    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adam(params, lr=args.learning_rate / 10),
    )
    optimizer = CombinedOptimizer([("fused", model.fused_optimizer), ("dense", dense)])

    pipeline = TrainPipelineSparseDist(model, optimizer, device)
    steps = 0
    for epoch in range(args.epochs):
        data = iter(loader(train_npys, args, rank, world_size, "train"))
        pipeline.reset()
        while True:
            try:
                loss, _, _ = pipeline.progress(data)
            except StopIteration:
                break
            steps += 1
        if rank == 0:
            print(f"epoch {epoch}: last loss {loss.item():.4f}", flush=True)

    model.eval()
    auc = AUCMetric(
        world_size=world_size,
        my_rank=rank,
        batch_size=args.batch_size,
        tasks=[RecTaskInfo(name="ctr")],
        window_size=1_000_000,
        compute_on_all_ranks=True,
    )
    evaluation = EvalPipelineSparseDist(model, optimizer, device)
    data = iter(loader(val_npys, args, rank, world_size, "val"))
    while True:
        try:
            _, probabilities, labels = evaluation.progress(data)
        except StopIteration:
            break
        auc.update(
            predictions={"ctr": probabilities},
            labels={"ctr": labels.float()},
            weights={"ctr": torch.ones_like(probabilities)},
        )
    value = next(v for k, v in auc.compute().items() if "auc" in k)
    if rank == 0:
        print(f"RESULT steps {steps} val_auc {float(value):.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
