"""Driving TrainPipelineSparseDist as TorchRec's docs describe it (issue 27): ``progress()`` over
an iterator until it raises StopIteration, ``detach()`` to get the plain model back for an eval
pass and a checkpoint ("inflight batches are kept so pipeline.progress(data_iter) can be
resumed normally"), then ``attach()`` and training goes on: once in the middle of an epoch
(batches in flight) and once at its end, then a second epoch over a fresh iterator. DLRM in
DLRMTrain, planned collectively, fused SGD plus a dense SGD in a CombinedOptimizer.
Run: torchrun --nproc-per-node 2 pipeline_control.py OUT
"""

import json
import sys

import torch
import torch.distributed as dist
from program_support import initialise  # the folder's helper module
from program_support import mean_over_ranks as mean
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingEnv
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ROWS = [30, 20, 50]
FEATURES = ["cat_0", "cat_1", "cat_2"]

tables = [
    EmbeddingBagConfig(name=f"t_{f}", embedding_dim=8, num_embeddings=rows, feature_names=[f])
    for f, rows in zip(FEATURES, ROWS)
]
ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
model = DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=4,
                       dense_arch_layer_sizes=[16, 8], over_arch_layer_sizes=[16, 1]))  # fmt: skip
apply_optimizer_in_backward(torch.optim.SGD, ebc.parameters(), {"lr": 0.1})
sharders = [EmbeddingBagCollectionSharder()]
planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"))
plan = planner.collective_plan(model, sharders, dist.group.WORLD)
model = DistributedModelParallel(
    model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
    plan=plan, sharders=sharders,
)  # fmt: skip


def batches(seed, count):
    for step in range(count):
        g = torch.Generator().manual_seed(seed * 1000 + step * world + rank)
        lengths = torch.randint(0, 3, (len(FEATURES) * 8,), generator=g)
        limits = torch.tensor(ROWS).repeat_interleave(8).repeat_interleave(lengths)
        values = (torch.rand(int(lengths.sum()), generator=g) * limits).long()
        dense = torch.randn(8, 4, generator=g)
        labels = (dense[:, 0] + dense[:, 1] > 0).float()
        yield Batch(dense_features=dense,
                    sparse_features=KeyedJaggedTensor(keys=FEATURES, values=values,
                                                      lengths=lengths),
                    labels=labels)  # fmt: skip


def evaluate(plain):
    """An eval pass on the detached (plain) model: mean loss and the logits of every rank."""
    plain.eval()
    losses, logits = [], []
    with torch.no_grad():
        for batch in batches(seed=99, count=3):
            loss, (_, out, _) = plain(batch)
            losses.append(mean(loss))
            every = [torch.zeros_like(out) for _ in range(world)]
            dist.all_gather(every, out)
            logits.append(torch.cat(every).tolist())
    plain.train()
    return losses, logits


def checksums(plain):
    """The checkpoint's figures: each state-dict tensor's sum over the whole model."""
    sums = {}
    for key, value in sorted(plain.state_dict().items()):
        if isinstance(value, ShardedTensor):
            local = sum(
                (s.tensor.double().sum() for s in value.local_shards()),
                torch.zeros((), dtype=torch.float64),
            )
            dist.all_reduce(local)
            sums[key] = float(local)
        elif value.is_floating_point():
            sums[key] = float(value.double().sum())
    return sums


initialise(model, scale=0.2)
dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                              lambda params: torch.optim.SGD(params, lr=0.1))  # fmt: skip
optimizer = CombinedOptimizer([model.fused_optimizer, dense])
pipeline = TrainPipelineSparseDist(model, optimizer, torch.device("cpu"))
figures = {}

# epoch 1: 4 steps, then a look at the model mid-epoch (batches in flight), then the rest
data = iter(batches(seed=1, count=8))
losses = [mean(pipeline.progress(data)[0]) for _ in range(4)]
plain = pipeline.detach()
figures["mid_epoch_eval_losses"], figures["mid_epoch_eval_logits"] = evaluate(plain)
pipeline.attach(plain)
while True:
    try:
        losses.append(mean(pipeline.progress(data)[0]))
    except StopIteration:
        break
figures["epoch_1_losses"] = losses

# end of epoch: eval and checkpoint on the plain model
plain = pipeline.detach()
figures["epoch_1_eval_losses"], figures["epoch_1_eval_logits"] = evaluate(plain)
figures["checkpoint_sums"] = checksums(plain)
pipeline.attach(plain)

# epoch 2 over a fresh iterator
data = iter(batches(seed=2, count=6))
losses = []
while True:
    try:
        losses.append(mean(pipeline.progress(data)[0]))
    except StopIteration:
        break
figures["epoch_2_losses"] = losses
plain = pipeline.detach()
figures["epoch_2_eval_losses"], _ = evaluate(plain)

if rank == 0:
    sums = figures.pop("checkpoint_sums")
    figures["checkpoint_keys"] = json.dumps(sorted(sums))
    figures["checkpoint_sums"] = [sums[k] for k in sorted(sums)]
    with open(sys.argv[1], "w") as f:
        json.dump(figures, f)
dist.destroy_process_group()
