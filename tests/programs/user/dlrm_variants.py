"""DLRM and its variants as TorchRec's models module offers them (issue 27): DLRM, DLRM_DCN and
DLRM_Projection, each wrapped in DLRMTrain, planned collectively, trained by
TrainPipelineSparseDist.progress over a dataloader of Batch objects (the DLRM example's loop). Run: torchrun --nproc-per-node 2 dlrm_variants.py OUT
"""

import json
import sys

import torch
import torch.distributed as dist
from program_support import initialise  # the folder's helper module
from program_support import mean_over_ranks as mean
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingEnv
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRM_Projection, DLRMTrain
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ROWS = [23, 17, 40]
FEATURES = ["cat_0", "cat_1", "cat_2"]


def build(kind):
    tables = [
        EmbeddingBagConfig(name=f"t_{f}", embedding_dim=8, num_embeddings=rows, feature_names=[f])
        for f, rows in zip(FEATURES, ROWS)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    common = {"embedding_bag_collection": ebc, "dense_in_features": 4,
              "dense_arch_layer_sizes": [16, 8], "over_arch_layer_sizes": [16, 1]}  # fmt: skip
    if kind == "dcn":
        model = DLRM_DCN(**common, dcn_num_layers=2, dcn_low_rank_dim=4)
    elif kind == "projection":
        model = DLRM_Projection(**common, interaction_branch1_layer_sizes=[12, 8],
                                interaction_branch2_layer_sizes=[12, 8])  # fmt: skip
    else:
        model = DLRM(**common)
    train_model = DLRMTrain(model)
    apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.1})
    sharders = [EmbeddingBagCollectionSharder()]
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"))
    plan = planner.collective_plan(train_model, sharders, dist.group.WORLD)
    return DistributedModelParallel(
        train_model, env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"), plan=plan, sharders=sharders,
    )  # fmt: skip


def batches(first, count):
    for step in range(first, first + count):
        g = torch.Generator().manual_seed(step)
        lengths = torch.randint(0, 3, (len(FEATURES) * 4,), generator=g)
        limits = torch.tensor(ROWS).repeat_interleave(4).repeat_interleave(lengths)
        values = (torch.rand(int(lengths.sum()), generator=g) * limits).long()
        dense = torch.randn(4, 4, generator=g) + rank
        labels = (dense[:, 0] > rank).float()
        yield Batch(dense_features=dense,
                    sparse_features=KeyedJaggedTensor(keys=FEATURES, values=values,
                                                      lengths=lengths),
                    labels=labels)  # fmt: skip


figures = {}
for kind in ("dlrm", "dcn", "projection"):
    model = build(kind)
    initialise(model, scale=0.2)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                  lambda params: torch.optim.SGD(params, lr=0.1))  # fmt: skip
    optimizer = CombinedOptimizer([model.fused_optimizer, dense])
    pipeline = TrainPipelineSparseDist(model, optimizer, torch.device("cpu"))
    data = iter(batches(0, 6))
    losses = []
    while True:
        try:
            output = pipeline.progress(data)
        except StopIteration:
            break
        losses.append(mean(output[0]))
    # (calling the model outside the pipeline needs pipeline.detach() in TorchRec 1.8)
    figures[f"{kind}_losses"] = losses
    figures[f"{kind}_logits"] = output[1][1].tolist()

if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(figures, f)
dist.destroy_process_group()
