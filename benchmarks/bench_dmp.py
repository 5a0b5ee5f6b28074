"""DistributedModelParallel training step per sharding type: shardkit vs TorchRec, side by side.

    ~/.cache/shardkit-peers/venv/bin/python benchmarks/bench_dmp.py --out benchmarks/results/dmp.md
    python benchmarks/bench_dmp.py          # shardkit only, when torchrec is not installed
    python benchmarks/bench_dmp.py --device cuda --out benchmarks/results/dmp_cuda.md  # GPUs, NCCL

2 ranks on gloo (CPU), ONE thread per rank (``--threads``), 8 tables x 100,000 rows x dim 64,
batch 1,024 per rank, ~20 ids per bag, a dense MLP (512 -> 256 -> 1) over the pooled embeddings,
BCE loss, Adam for the MLP, and for the tables each optimizer of ``--optimizers``:
``rowwise_adagrad`` (fused row-wise Adagrad; data-parallel tables: Adagrad) and ``sgd`` (fused
SGD; data-parallel tables: SGD), which separates FBGEMM's CPU row-wise Adagrad from the DMP
overhead. Data-parallel tables (``data_parallel``): planned by each library's planner, which
plans them DENSE in both (dense gradients, stepped by torch's Adagrad/SGD after the backward);
``data_parallel_fused`` is a second row: shardkit's tables planned FUSED by hand
(``data_parallel(compute_kernel="fused")``: only the touched rows are exchanged and updated,
which trains exactly as the dense Adagrad/SGD, see [Note: sparse data-parallel tables]) against
TorchRec's DENSE ones (TorchRec has no other kernel for them). Column-wise (``column_wise``):
each planner's own column blocks, which differ here: shardkit's are 32 columns wide at least
(the seed tutorial's 64 -> 2 x 32), TorchRec 1.8's 128 (``MIN_CW_DIM``), so TorchRec keeps a
64-column table whole on one rank (table-wise in all but name) while shardkit sends every id
to both ranks and looks up two 32-column halves; ``column_wise_32`` is the same program with
``ParameterConstraints(min_partition=32)`` in both, the same 2 x 32 shards on both sides. Every
sharding type, each library with a plain loop and with its TrainPipelineSparseDist; each
(library, loop, type, optimizer) runs in fresh processes, contenders taking turns round after
round, and each loop kind is compared with the same loop kind of the other library. Writes the
markdown report, its JSON and (with matplotlib) a chart of the ratios beside ``--out``.

``--device cuda``: one GPU per rank on NCCL (TorchRec then needs its CUDA build and FBGEMM's CUDA
kernels), both planners told the device, the batches resident on the GPU before timing (the
pipeline's copy is then a no-op, as for data already there), steps timed after a synchronize.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
from _dmp_report import DEFAULT_LOOPS, LOOPS, chart, render, summarize

from shardkit.bench import machine_info
from shardkit.launch import RankFailedError, current, spawn

TYPES = [
    "table_wise",
    "row_wise",
    "column_wise",
    "column_wise_32",
    "table_row_wise",
    "data_parallel",
    "data_parallel_fused",
    "table_column_wise",
    "grid_shard",
]


def make_batches(rank: int, args) -> list[dict]:
    g = torch.Generator().manual_seed(1000 + rank)
    batches = []
    for _ in range(args.distinct_batches):
        lengths = torch.randint(
            args.ids_per_bag - 10, args.ids_per_bag + 11, (args.tables * args.batch,), generator=g
        )
        values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
        labels = torch.randint(0, 2, (args.batch,), generator=g).float()
        batches.append({"values": values, "lengths": lengths, "labels": labels})
    device = current().device
    return [{k: v.to(device) for k, v in batch.items()} for batch in batches]


class Head(torch.nn.Module):
    """Pooled embeddings [B, T * D] -> logits [B]."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
        )

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.mlp(pooled).squeeze(-1)


class Model(torch.nn.Module):
    def __init__(self, ebc: torch.nn.Module, width: int) -> None:
        super().__init__()
        self.ebc = ebc
        self.head = Head(width)

    def forward(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(self.ebc(batch.sparse_features).values())
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
        return loss, logits


class Batch:
    def __init__(self, sparse_features, labels) -> None:
        self.sparse_features = sparse_features
        self.labels = labels

    def to(self, device, non_blocking=False):
        return Batch(
            self.sparse_features.to(device, non_blocking=non_blocking),
            self.labels.to(device, non_blocking=non_blocking),
        )

    def record_stream(self, stream) -> None:
        pass


class _Optimizers:
    """The head's and the replicas' optimizers as one, for either library's pipeline."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]) -> None:
        self.optimizers = optimizers

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None) -> None:
        for opt in self.optimizers:
            opt.step()


def _stepper(dmp, optimizers, batches, loop: str, pipeline_type):
    """One training step per call: the plain loop, the library's pipeline, or the plain loop
    with the whole DMP model under ``torch.compile`` (as TorchRec users compile it; shardkit's
    sharded collection runs eagerly between the compiled graphs: docs/pt2.md)."""
    if loop == "pipeline":
        pipeline = pipeline_type(dmp, _Optimizers(optimizers), current().device)
        return lambda: pipeline.progress(batches)
    model = torch.compile(dmp, dynamic=True) if loop == "compiled" else dmp

    def step():
        for opt in optimizers:
            opt.zero_grad()
        loss, _ = model(next(batches))
        loss.backward()
        for opt in optimizers:
            opt.step()

    return step


# The tables' optimizer: fused (EmbOptimType name), and torch's for dense data-parallel tables.
OPTIMIZERS = {
    "rowwise_adagrad": ("EXACT_ROWWISE_ADAGRAD", torch.optim.Adagrad),
    "sgd": ("EXACT_SGD", torch.optim.SGD),
}
# What shardkit's FUSED data-parallel tables run: exactly torch's dense Adagrad/SGD (lr 0.01,
# torch's eps) on the rows a batch touched, the others being unchanged by both.
REPLICA_RULES = {"rowwise_adagrad": ("EXACT_ADAGRAD", {"eps": 1e-10}), "sgd": ("EXACT_SGD", {})}


def _constraints(constraint_type, kind: str, tables: int) -> dict:
    """Every table constrained to ``kind``; ``column_wise_32``: column-wise with shards of 32
    columns or more in either library's planner (see the module's docstring)."""
    extra = {}
    if kind == "column_wise_32":
        kind, extra = "column_wise", {"min_partition": 32}
    return {f"t{t}": constraint_type(sharding_types=[kind], **extra) for t in range(tables)}


def _label(kind: str, optimizer: str) -> str:
    """The report's row: the sharding type, with the optimizer unless it is row-wise Adagrad."""
    return kind if optimizer == "rowwise_adagrad" else f"{kind} ({optimizer})"


def _optimizers(dmp, dense_class) -> list[torch.optim.Optimizer]:
    """Adam for the MLP; ``dense_class`` for DENSE data-parallel tables (dense gradients)."""
    head = list(dmp.module.head.parameters())
    replicas = [
        p
        for n, p in dmp.named_parameters()
        if "head" not in n and p.requires_grad and not hasattr(p, "_in_backward_optimizers")
    ]
    optimizers = [torch.optim.Adam(head, lr=1e-3)]
    if replicas:
        optimizers.append(dense_class(replicas, lr=0.01))
    return optimizers


def _cycle(rank: int, args, make_kjt, batch_type=None):
    """The rank's few distinct batches, round and round."""
    batch_type = batch_type or Batch
    raw = make_batches(rank, args)
    i = 0
    while True:
        b = raw[i % len(raw)]
        i += 1
        yield batch_type(make_kjt(b["values"], b["lengths"]), b["labels"])


def run_shardkit(rank: int, world_size: int, args, case: tuple, loop: str) -> dict:
    from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from shardkit.distributed import DistributedModelParallel
    from shardkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from shardkit.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
    )
    from shardkit.optim import EmbOptimType
    from shardkit.sharding import (
        TrainPipelineSparseDist,
        construct_module_sharding_plan,
        data_parallel,
        grid_shard,
    )
    from shardkit.types import ShardingPlan

    kind, optimizer = case
    torch.set_num_threads(args.threads)
    tables = [
        EmbeddingBagConfig(
            name=f"t{t}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f"f{t}"]
        )
        for t in range(args.tables)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device="meta", validate_ids=False)
    model = Model(ebc, args.tables * args.dim)
    rule, extra = OPTIMIZERS[optimizer][0], {}
    if kind == "data_parallel_fused":
        rule, extra = REPLICA_RULES[optimizer]
    fused = {"optimizer": EmbOptimType[rule], "learning_rate": 0.01, **extra}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused)]
    # By hand: FUSED replicas (the planner plans data-parallel tables DENSE, as TorchRec's), and
    # grid (planned only over 2 or more hosts; on one host grid is one column block row-wise
    # over its ranks).
    by_hand = {
        "data_parallel_fused": lambda: data_parallel(compute_kernel="fused"),
        "grid_shard": lambda: grid_shard(host_indexes=[0]),
    }
    if kind in by_hand:
        gens = {f"t{t}": by_hand[kind]() for t in range(args.tables)}
        module_plan = construct_module_sharding_plan(
            ebc, gens, world_size=world_size, device_type=args.device
        )
        plan = ShardingPlan({"ebc": module_plan})
    else:
        constraints = _constraints(ParameterConstraints, kind, args.tables)
        planner = EmbeddingShardingPlanner(
            topology=Topology(
                world_size=world_size, compute_device=args.device, local_world_size=world_size
            ),
            constraints=constraints,
        )
        plan = planner.collective_plan(model, sharders, dist.group.WORLD)
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders)
    optimizers = _optimizers(dmp, OPTIMIZERS[optimizer][1])
    keys = [f"f{t}" for t in range(args.tables)]
    batches = _cycle(rank, args, lambda v, n: KeyedJaggedTensor(keys=keys, values=v, lengths=n))
    step = _stepper(dmp, optimizers, batches, loop, TrainPipelineSparseDist)
    return _time(step, args, input_wait=True)


def run_torchrec(rank: int, world_size: int, args, case: tuple, loop: str) -> dict:
    import torchrec
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
    from torchrec.streamable import Pipelineable

    class PipelineableBatch(Batch, Pipelineable):
        """TorchRec's pipeline checks for its interface by type."""

    kind, optimizer = case
    kind = kind.removesuffix("_fused")  # TorchRec's data-parallel tables are DENSE only
    torch.set_num_threads(args.threads)
    tables = [
        torchrec.EmbeddingBagConfig(
            name=f"t{t}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f"f{t}"]
        )
        for t in range(args.tables)
    ]
    ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = Model(ebc, args.tables * args.dim)
    fused = {"optimizer": getattr(EmbOptimType, OPTIMIZERS[optimizer][0]), "learning_rate": 0.01}

    class AllTypesSharder(EmbeddingBagCollectionSharder):
        """TorchRec's sharder offers row-wise, table-row-wise and grid only for "cuda"; its CPU
        kernels and collectives run them all the same."""

        def sharding_types(self, compute_device_type: str) -> list[str]:
            return super().sharding_types("cuda")

    sharders = [AllTypesSharder(fused_params=fused)]
    constraints = _constraints(ParameterConstraints, kind, args.tables)
    planner = EmbeddingShardingPlanner(
        topology=Topology(
            world_size=world_size, compute_device=args.device, local_world_size=world_size
        ),
        constraints=constraints,
    )
    plan = planner.collective_plan(model, sharders, dist.group.WORLD)
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders, device=current().device)
    # torchrec's sharded tables step inside backward; its data-parallel ones (DENSE) do not
    dense_class = OPTIMIZERS[optimizer][1]
    if kind == "data_parallel":
        optimizers = _optimizers(dmp, dense_class)
    else:
        optimizers = [torch.optim.Adam(dmp.module.head.parameters(), lr=1e-3)]
    keys = [f"f{t}" for t in range(args.tables)]
    batches = _cycle(
        rank,
        args,
        lambda v, n: torchrec.KeyedJaggedTensor(keys=keys, values=v, lengths=n),
        PipelineableBatch,
    )
    step = _stepper(dmp, optimizers, batches, loop, TrainPipelineSparseDist)
    return _time(step, args)


def _input_wait_ms(step, steps: int = 6) -> float:
    """Milliseconds per step this rank waits for its ids (shardkit's ``input_dist.wait`` span):
    what the pipeline's overlap hides, measured in a short profiled run after the timed one."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    spans = [e for e in prof.key_averages() if e.key == "shardkit::input_dist.wait"]
    return sum(e.cpu_time_total for e in spans) / 1e3 / steps


def _time(step, args, input_wait: bool = False) -> dict:
    device = current().device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    times, cpu = [], []
    for _ in range(args.iters):
        sync()
        dist.barrier()
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        sync()
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    # CPU seconds of all ranks' processes (gloo's threads included): the work a step costs,
    # which a loaded machine inflates far less than wall time.
    total_cpu = torch.tensor(cpu, dtype=torch.float64, device=device)
    dist.all_reduce(total_cpu)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {
        "ms": statistics.median(slowest.tolist()) * 1e3,
        "cpu_ms": statistics.median(total_cpu.tolist()) * 1e3,
        "peak_bytes": peak,
    }
    if device.type == "cuda":
        result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device)
    if input_wait:
        result["input_wait_ms"] = _input_wait_ms(step)
    if args.profile:
        result["profile"] = _profile(step, args.profile)
    return result


def _profile(step, steps: int) -> str:
    """The ops that cost this rank the most CPU time over ``steps`` steps (``--profile``): what
    a step spends beside its kernels and its wire time (Python, copies, host reads)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    return f"(over {steps} steps)\n{table}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024, help="per rank")
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--distinct-batches", type=int, default=4)
    parser.add_argument("--types", nargs="+", default=TYPES, choices=TYPES)
    parser.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS,
                        help="the tables' optimizers, each a separate case")  # fmt: skip
    parser.add_argument("--loops", nargs="+", default=list(DEFAULT_LOOPS), choices=LOOPS,
                        help="compiled: the plain loop, the DMP model under torch.compile")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="turns each contender takes")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU per rank, NCCL")  # fmt: skip
    parser.add_argument("--out", help="write the markdown report here (.json, .png beside it)")
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="also print each contender's top ops by CPU time over STEPS "
                        "profiled steps (rank 0)")  # fmt: skip
    args = parser.parse_args()
    try:
        import torchrec  # noqa: F401

        libraries = {"shardkit": run_shardkit, "torchrec": run_torchrec}
    except ImportError:
        libraries = {"shardkit": run_shardkit}
    # Contenders take turns, round after round, so a slow spell of this shared machine does not
    # land on one of them; each reports the median of its rounds and their spread.
    times: dict[tuple, list[float]] = {}
    cpu_times: dict[tuple, list[float]] = {}
    failed: dict[tuple, str] = {}
    waits: dict[tuple, list[float]] = {}
    cases = [(kind, optimizer) for optimizer in args.optimizers for kind in args.types]
    labels = [_label(*case) for case in cases]
    for round_ in range(args.rounds):
        for case, label in zip(cases, labels):
            for loop in args.loops:
                for library, fn in libraries.items():
                    key = (label, library, loop)
                    if key in failed:
                        continue
                    result = _run_one(fn, args, case, loop, failed, key)
                    if result is None:
                        continue
                    times.setdefault(key, []).append(result["ms"])
                    cpu_times.setdefault(key, []).append(result["cpu_ms"])
                    if result.get("input_wait_ms") is not None:
                        waits.setdefault(key, []).append(result["input_wait_ms"])
                    print(
                        f"round {round_ + 1}: {label:24} {library:9} {loop:9} "
                        f"{result['ms']:8.1f} ms/step  {result['cpu_ms']:8.1f} CPU ms/step",
                        flush=True,
                    )
                    if "profile" in result:
                        print(f"profile of {label} {library} {loop} {result['profile']}")
    report = {
        "args": vars(args),
        "machine": machine_info(threads=args.threads),
        **summarize(times, failed, labels),
    }
    report["cpu"] = summarize(cpu_times, failed, labels)
    report["cases"] = labels
    report["input_wait_ms"] = [
        {"type": k[0], "library": k[1], "loop": k[2], "ms": statistics.median(v)}
        for k, v in waits.items()
    ]
    if "torchrec" not in libraries:
        report["rows"].append(
            {"type": "-", "library": "torchrec", "loop": "-", "skipped": "torchrec not importable"}
        )
    text = render(report)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump(report, f, indent=1)
        chart(report, os.path.splitext(args.out)[0] + ".png")


def _run_one(fn, args, case: tuple, loop: str, failed: dict, key: tuple) -> dict | None:
    """One contender's turn on fresh ranks; its result from rank 0 (the slower rank's times)."""
    try:
        results = spawn(
            lambda r, w: fn(r, w, args, case, loop),
            world_size=args.world_size,
            backend="nccl" if args.device == "cuda" else "gloo",
            timeout=900,
            threads_per_rank=args.threads,
        )
    except RankFailedError as exc:
        failed[key] = str(exc).splitlines()[0].split(": ", 2)[-1][:160]
        print(f"{' '.join(key)} failed: {failed[key]}", flush=True)
        return None
    result = dict(results[0])
    result["peak_bytes"] = max(r["peak_bytes"] for r in results)
    if "input_wait_ms" in results[0]:
        result["input_wait_ms"] = max(r["input_wait_ms"] for r in results)
    return result


if __name__ == "__main__":
    main()
