"""DistributedModelParallel training step per sharding type: shardkit vs TorchRec, side by side.

    ~/.cache/shardkit-peers/venv/bin/python benchmarks/bench_dmp.py --out benchmarks/results/dmp.md
    python benchmarks/bench_dmp.py          # shardkit only, when torchrec is not installed
    python benchmarks/bench_dmp.py --device cuda --out benchmarks/results/dmp_cuda.md  # GPUs, NCCL

2 ranks on gloo (CPU), 8 tables x 100,000 rows x dim 64, batch 1,024 per rank, ~20 ids per bag,
a dense MLP (512 -> 256 -> 1) over the pooled embeddings, BCE loss, fused row-wise Adagrad for the
tables (data-parallel tables: their dense gradients are all-reduced and stepped by Adagrad), Adam
for the MLP. Each (library, sharding type) runs in fresh processes so that the peak resident
memory per rank (ru_maxrss) is its own. Reported: median step time after warm-up, global
samples/s, peak RSS per rank. shardkit runs twice: with TrainPipelineSparseDist (the next batch's
ids in flight during the step) and with a plain loop, to show what the overlap buys.

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

from shardkit.bench import machine_info
from shardkit.launch import RankFailedError, current, spawn

TYPES = ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel"]


def make_batches(rank: int, args) -> list[dict]:
    """Distinct batches of this rank, made on the CPU from its seed, then put on its device."""
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


def _optimizers(dmp, fused_marker) -> list[torch.optim.Optimizer]:
    """Adam for the MLP; Adagrad for data-parallel tables' replicas (dense gradients)."""
    head = list(dmp.module.head.parameters())
    replicas = [
        p
        for n, p in dmp.named_parameters()
        if "head" not in n and p.requires_grad and not fused_marker(n, p)
    ]
    optimizers = [torch.optim.Adam(head, lr=1e-3)]
    if replicas:
        optimizers.append(torch.optim.Adagrad(replicas, lr=0.01))
    return optimizers


def run_shardkit(rank: int, world_size: int, args, kind: str, pipelined: bool) -> dict:
    from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from shardkit.distributed import DistributedModelParallel
    from shardkit.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from shardkit.distributed.planner import (
        EmbeddingShardingPlanner,
        ParameterConstraints,
        Topology,
    )
    from shardkit.optim import CombinedOptimizer, EmbOptimType
    from shardkit.sharding import TrainPipelineSparseDist

    torch.set_num_threads(1)
    tables = [
        EmbeddingBagConfig(
            name=f"t{t}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f"f{t}"]
        )
        for t in range(args.tables)
    ]
    ebc = EmbeddingBagCollection(tables=tables, device="meta", validate_ids=False)
    model = Model(ebc, args.tables * args.dim)
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01}
    sharders = [EmbeddingBagCollectionSharder(fused_params=fused)]
    constraints = {f"t{t}": ParameterConstraints(sharding_types=[kind]) for t in range(args.tables)}
    planner = EmbeddingShardingPlanner(
        topology=Topology(
            world_size=world_size, compute_device=args.device, local_world_size=world_size
        ),
        constraints=constraints,
    )
    plan = planner.collective_plan(model, sharders, dist.group.WORLD)
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders)
    optimizers = _optimizers(dmp, lambda name, p: ".shards." in name)
    keys = [f"f{t}" for t in range(args.tables)]

    def batches():
        raw = make_batches(rank, args)
        i = 0
        while True:
            b = raw[i % len(raw)]
            i += 1
            yield Batch(
                KeyedJaggedTensor(keys=keys, values=b["values"], lengths=b["lengths"]), b["labels"]
            )

    it = batches()
    if pipelined:
        combined = CombinedOptimizer([(str(i), o) for i, o in enumerate(optimizers)])
        pipeline = TrainPipelineSparseDist(dmp, combined)

        def step():
            pipeline.progress(it)
    else:

        def step():
            for opt in optimizers:
                opt.zero_grad()
            loss, _ = dmp(next(it))
            loss.backward()
            for opt in optimizers:
                opt.step()

    return _time(step, args, input_wait=True)


def run_torchrec(rank: int, world_size: int, args, kind: str) -> dict:
    import torchrec
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints

    torch.set_num_threads(1)
    tables = [
        torchrec.EmbeddingBagConfig(
            name=f"t{t}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f"f{t}"]
        )
        for t in range(args.tables)
    ]
    ebc = torchrec.EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = Model(ebc, args.tables * args.dim)
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.01}

    class AllTypesSharder(EmbeddingBagCollectionSharder):
        """TorchRec's sharder offers row-wise and table-row-wise only for "cuda"; its CPU
        kernels and collectives run them all the same."""

        def sharding_types(self, compute_device_type: str) -> list[str]:
            types = super().sharding_types("cuda")
            return [t for t in types if t != "grid_shard"]

    sharders = [AllTypesSharder(fused_params=fused)]
    constraints = {f"t{t}": ParameterConstraints(sharding_types=[kind]) for t in range(args.tables)}
    planner = EmbeddingShardingPlanner(
        topology=Topology(
            world_size=world_size, compute_device=args.device, local_world_size=world_size
        ),
        constraints=constraints,
    )
    plan = planner.collective_plan(model, sharders, dist.group.WORLD)
    dmp = DistributedModelParallel(model, plan=plan, sharders=sharders, device=current().device)
    fused = kind != "data_parallel"  # torchrec's sharded tables step inside backward
    optimizers = _optimizers(dmp, lambda name, p: fused and "head" not in name)
    keys = [f"f{t}" for t in range(args.tables)]
    raw = make_batches(rank, args)
    state = {"i": 0}

    def step():
        b = raw[state["i"] % len(raw)]
        state["i"] += 1
        kjt = torchrec.KeyedJaggedTensor(keys=keys, values=b["values"], lengths=b["lengths"])
        for opt in optimizers:
            opt.zero_grad()
        loss, _ = dmp(Batch(kjt, b["labels"]))
        loss.backward()
        for opt in optimizers:
            opt.step()

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
    times = []
    for _ in range(args.iters):
        sync()
        dist.barrier()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = {"ms": statistics.median(slowest.tolist()) * 1e3, "peak_bytes": peak}
    if device.type == "cuda":
        result["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device)
    if input_wait:
        result["input_wait_ms"] = _input_wait_ms(step)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024, help="per rank")
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--distinct-batches", type=int, default=4)
    parser.add_argument("--types", nargs="+", default=TYPES, choices=TYPES)
    parser.add_argument("--rounds", type=int, default=3, help="turns each contender takes")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: one GPU per rank, NCCL")  # fmt: skip
    parser.add_argument("--out", help="write the markdown report here (and .json beside it)")
    args = parser.parse_args()
    try:
        import torchrec  # noqa: F401

        have_torchrec = True
    except ImportError:
        have_torchrec = False
    # Contenders take turns, round after round, so a slow spell of this shared machine does not
    # land on one of them; each reports the median of its rounds' medians and their spread.
    times: dict[tuple[str, str], list[float]] = {}
    peaks: dict[tuple[str, str], float] = {}
    failed: dict[tuple[str, str], str] = {}
    waits: dict[tuple[str, str], list[float]] = {}
    gpu_peaks: dict[tuple[str, str], int] = {}
    for round_ in range(args.rounds):
        for kind in args.types:
            runs = [
                ("shardkit (pipelined)", lambda r, w, k=kind: run_shardkit(r, w, args, k, True)),
                ("shardkit (plain loop)", lambda r, w, k=kind: run_shardkit(r, w, args, k, False)),
            ]
            if have_torchrec:
                runs.append(("torchrec", lambda r, w, k=kind: run_torchrec(r, w, args, k)))
            for name, fn in runs:
                if (kind, name) in failed:
                    continue
                try:
                    results = spawn(
                        fn,
                        world_size=args.world_size,
                        backend="nccl" if args.device == "cuda" else "gloo",
                        timeout=900,
                        threads_per_rank=1,
                    )
                except RankFailedError as exc:
                    failed[(kind, name)] = str(exc).splitlines()[0].split(": ", 2)[-1][:160]
                    print(f"{kind:16} {name:24} failed: {failed[(kind, name)]}", flush=True)
                    continue
                ms = results[0]["ms"]
                peak = max(r["peak_bytes"] for r in results)
                times.setdefault((kind, name), []).append(ms)
                if "input_wait_ms" in results[0]:
                    wait = max(r["input_wait_ms"] for r in results)
                    waits.setdefault((kind, name), []).append(wait)
                peaks[(kind, name)] = max(peaks.get((kind, name), 0), peak)
                if "peak_gpu_bytes" in results[0]:
                    gpu = max(r["peak_gpu_bytes"] for r in results)
                    gpu_peaks[(kind, name)] = max(gpu_peaks.get((kind, name), 0), gpu)
                print(
                    f"round {round_ + 1}: {kind:16} {name:24} {ms:8.1f} ms/step  "
                    f"{peak / 1e9:5.2f} GB",
                    flush=True,
                )
    rows = []
    for kind in args.types:
        for name in ("shardkit (pipelined)", "shardkit (plain loop)", "torchrec"):
            if (kind, name) in failed:
                rows.append({"type": kind, "impl": name, "skipped": failed[(kind, name)]})
            elif (kind, name) in times:
                ms = statistics.median(times[(kind, name)])
                rows.append(
                    {
                        "type": kind,
                        "impl": name,
                        "ms_per_step": ms,
                        "ms_rounds": times[(kind, name)],
                        "samples_per_s": args.batch * args.world_size / (ms / 1e3),
                        "peak_rss_gb": peaks[(kind, name)] / 1e9,
                        "peak_gpu_gb": gpu_peaks[(kind, name)] / 1e9
                        if (kind, name) in gpu_peaks
                        else None,
                        "input_wait_ms": statistics.median(waits[(kind, name)])
                        if (kind, name) in waits
                        else None,
                    }
                )
    if not have_torchrec:
        rows.append({"type": "-", "impl": "torchrec", "skipped": "torchrec is not importable here"})
    report = render(rows, args)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump({"args": vars(args), "machine": machine_info(), "rows": rows}, f, indent=1)


def render(rows, args) -> str:
    lines = [
        "# DistributedModelParallel training step (bench_dmp.py)",
        "",
        f"{args.world_size} ranks on {'NCCL, one GPU each' if args.device == 'cuda' else 'gloo'}, {args.tables} tables x {args.rows:,} x {args.dim}, batch {args.batch} per rank, "
        f"~{args.ids_per_bag} ids per bag, MLP 512-256-1, BCE, fused row-wise Adagrad; median of {args.iters} steps "
        f"after {args.warmup} warm-up, 1 thread per rank; contenders take turns in {args.rounds} "
        "rounds: the median over rounds, and the rounds' range. *Waiting for ids*: the slower rank's time per step in shardkit's input-dist wait, from a short profiled run after the timed one (what the pipeline hides).",
        f"Machine: {json.dumps(machine_info())}",
        "",
        "| sharding type | implementation | ms/step | rounds (ms) | waiting for ids (ms/step) | samples/s (global) | peak RSS per rank (GB) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if "skipped" in row:
            lines.append(f"| {row['type']} | {row['impl']} | skipped: {row['skipped']} | | | | |")
            continue
        spread = f"{min(row['ms_rounds']):.1f}-{max(row['ms_rounds']):.1f}"
        wait = "-" if row.get("input_wait_ms") is None else f"{row['input_wait_ms']:.2f}"
        lines.append(
            f"| {row['type']} | {row['impl']} | {row['ms_per_step']:.1f} | {spread} | {wait} | {row['samples_per_s']:,.0f} | {row['peak_rss_gb']:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
