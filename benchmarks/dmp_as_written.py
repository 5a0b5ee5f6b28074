"""A DistributedModelParallel training program written as a TorchRec user writes it (issue 25):
TorchRec's imports only, run unchanged on TorchRec (``torchrun``) and on shardkit
(``shardkit run``) by ``bench_dmp_as_written.py``, which compares the step times.

    torchrun --nproc-per-node 2 dmp_as_written.py OUT.json --type row_wise --loop pipeline

8 tables x 100,000 rows x dim 64, batch 1,024 per rank, ~20 ids per bag (uniform ids), a dense
MLP (512 -> 256 -> 1) over the pooled embeddings, BCE loss; the tables' optimizer fused into the
backward through the sharder's ``fused_params`` (row-wise Adagrad or SGD), Adam for the dense part
(and for data-parallel tables, which TorchRec plans with the DENSE kernel) through
``KeyedOptimizerWrapper`` over ``in_backward_optimizer_filter``, combined with the fused optimizer
as TorchRec's examples do. The plan: ``construct_module_sharding_plan`` with one generator per table
for the type asked (``--plan constructed``, the same shards in both libraries), or TorchRec's
``EmbeddingShardingPlanner`` with ``ParameterConstraints(sharding_types=[type])`` per table
(``--plan planner``; each library's planner then chooses the ranks and blocks). Loops: ``plain``
(zero_grad, forward, backward, step) or ``pipeline`` (``TrainPipelineSparseDist.progress``).

Rank 0 writes OUT.json: the median and quartiles over the timed steps of the slower rank's wall
time per step, each rank's CPU time per step, the losses of the first steps (the two libraries
must train alike), and the plan's sharding types and kernels.
"""

import argparse
import json
import resource
import statistics
import time

import torch
import torch.distributed as dist
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.datasets.utils import Batch
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.distributed.types import ShardingEnv, ShardingPlan
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

TYPES = ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel"]

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--type", choices=TYPES, default="table_wise")
parser.add_argument("--loop", choices=["plain", "pipeline"], default="plain")
parser.add_argument("--plan", choices=["constructed", "planner"], default="constructed")
parser.add_argument("--optimizer", choices=["rowwise_adagrad", "sgd"], default="rowwise_adagrad")
parser.add_argument("--tables", type=int, default=8)
parser.add_argument("--rows", type=int, default=100_000)
parser.add_argument("--dim", type=int, default=64)
parser.add_argument("--batch", type=int, default=1024)
parser.add_argument("--warmup", type=int, default=3)
parser.add_argument("--steps", type=int, default=10)
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
features = [f"f{t}" for t in range(args.tables)]


class Model(torch.nn.Module):
    def __init__(self, ebc):
        super().__init__()
        self.ebc = ebc
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(args.tables * args.dim, 512),
            torch.nn.ReLU(),
            torch.nn.Linear(512, 256),
            torch.nn.ReLU(),
            torch.nn.Linear(256, 1),
        )

    def forward(self, batch):
        pooled = self.ebc(batch.sparse_features).values()
        logits = self.mlp(pooled).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, (loss.detach(), logits.detach())  # as DLRMTrain: (loss, output)


def plan_for(ebc, sharders):
    if args.plan == "planner":
        constraints = {
            f"t{t}": ParameterConstraints(sharding_types=[args.type]) for t in range(args.tables)
        }
        planner = EmbeddingShardingPlanner(
            topology=Topology(world_size=world, compute_device="cpu"), constraints=constraints
        )
        return planner.collective_plan(model, sharders, dist.group.WORLD)
    make = {
        "table_wise": lambda t: table_wise(rank=t % world),
        "row_wise": lambda t: row_wise(),
        "column_wise": lambda t: column_wise(ranks=list(range(world))),
        "table_row_wise": lambda t: table_row_wise(host_index=0),
        "data_parallel": lambda t: data_parallel(),
    }[args.type]
    per_table = {f"t{t}": make(t) for t in range(args.tables)}
    module_plan = construct_module_sharding_plan(
        ebc, per_param_sharding=per_table, local_size=world, world_size=world, device_type="cpu"
    )
    # TorchRec's generators give the DENSE kernel unless the table has an optimizer applied in
    # backward; the fused one (what the planner chooses, and what fused_params configure) by an
    # edit of the plan, as users do.
    for sharding in module_plan.values():
        if sharding.sharding_type != "data_parallel":
            sharding.compute_kernel = EmbeddingComputeKernel.FUSED.value
    return ShardingPlan({"ebc": module_plan})


def batches(count):
    generator = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(count):
        lengths = torch.randint(0, 41, (args.tables * args.batch,), generator=generator)
        values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=generator)
        labels = torch.randint(0, 2, (args.batch,), generator=generator).float()
        kjt = KeyedJaggedTensor(keys=features, values=values, lengths=lengths)
        out.append(
            Batch(dense_features=torch.zeros(args.batch, 1), sparse_features=kjt, labels=labels)
        )
    return out


tables = [
    EmbeddingBagConfig(
        name=f"t{t}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f]
    )
    for t, f in enumerate(features)
]
model = Model(EmbeddingBagCollection(tables=tables, device=torch.device("meta")))
rule = {"rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "sgd": EmbOptimType.EXACT_SGD}
sharders = [
    EmbeddingBagCollectionSharder(
        fused_params={"optimizer": rule[args.optimizer], "learning_rate": 0.01}
    )
]
plan = plan_for(model.ebc, sharders)
dmp = DistributedModelParallel(
    model,
    env=ShardingEnv.from_process_group(dist.group.WORLD),
    device=torch.device("cpu"),
    plan=plan,
    sharders=sharders,
)
dense = KeyedOptimizerWrapper(
    dict(in_backward_optimizer_filter(dmp.named_parameters())),
    lambda params: torch.optim.Adam(params, lr=1e-3),
)
optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])
data = batches(4)
total = args.warmup + args.steps
losses, times, cpu = [], [], []


def usage():
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


if args.loop == "plain":

    def step(i):
        batch = data[i % len(data)]
        optimizer.zero_grad()
        loss, _ = dmp(batch)
        loss.backward()
        optimizer.step()
        return loss
else:
    pipeline = TrainPipelineSparseDist(dmp, optimizer, torch.device("cpu"))
    stream = iter([data[i % len(data)] for i in range(total + 2)])

    def step(i):
        loss, _ = pipeline.progress(stream)  # progress returns the model's output
        return loss


dist.barrier()
for i in range(total):
    start, start_cpu = time.perf_counter(), usage()
    loss = step(i)
    times.append(time.perf_counter() - start)
    cpu.append(usage() - start_cpu)
    losses.append(float(loss.detach()))

timed = torch.tensor(times[args.warmup :], dtype=torch.float64)
dist.all_reduce(timed, op=dist.ReduceOp.MAX)  # each step as long as its slower rank
cpu_ms = torch.tensor([1000 * statistics.median(cpu[args.warmup :])], dtype=torch.float64)
every_cpu = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
dist.all_gather(every_cpu, cpu_ms)
if rank == 0:
    ms = sorted(1000 * t for t in timed.tolist())
    quartiles = statistics.quantiles(ms, n=4)
    sharded = dmp.plan.plan["ebc"]
    with open(args.out, "w") as f:
        json.dump(
            {
                "median_ms": statistics.median(ms),
                "q1_ms": quartiles[0],
                "q3_ms": quartiles[2],
                "cpu_ms_per_rank": [float(c) for c in every_cpu],
                "losses": losses[:4],
                "types": sorted({p.sharding_type for p in sharded.values()}),
                "kernels": sorted({p.compute_kernel for p in sharded.values()}),
            },
            f,
        )
dist.destroy_process_group()
