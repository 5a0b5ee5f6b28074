"""Peak memory and step time per rank of DistributedModelParallel with its dense part under DDP
(every rank holds the whole MLPs, their gradients and Adam state) or fully sharded with
`FullyShardDataParallelWrapper` (each rank holds 1/W of them), on a DLRM whose dense part is
large and whose tables are small.

    python benchmarks/bench_dmp_dense.py --out benchmarks/results/dmp_dense.md

Each contender runs in fresh rank processes (peak RSS is a process's high-water mark), one
thread per rank, the contenders taking turns for ``--rounds`` rounds. Reported per contender
(median over rounds, the largest rank): the peak RSS (``ru_maxrss``: torch itself, the model
as built, and everything the steps touch), the same less the process's RSS before the model was
built, the bytes this rank holds in dense parameters, gradients and optimizer state after the
steps (exact, not noisy), and the median ms per step (forward, backward, Adam step).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import torch
from _command import argv
from torch.distributed.tensor import DTensor

from shardkit import KeyedJaggedTensor
from shardkit.bench import machine_info, machine_line
from shardkit.launch import spawn
from shardkit.models import DLRM
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.sharding import DistributedModelParallel, FullyShardDataParallelWrapper

CONTENDERS = ("ddp", "fsdp")
TABLES = 4


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _model(args) -> DLRM:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=args.dim, num_embeddings=args.rows,
                           feature_names=[f"f{i}"])
        for i in range(TABLES)
    ]  # fmt: skip
    hidden = [args.hidden] * args.layers
    return DLRM(
        EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
        dense_in_features=args.dense_in,
        dense_arch_layer_sizes=[*hidden, args.dim],
        over_arch_layer_sizes=[*hidden, 1],
    )


def _batch(step: int, rank: int, args):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    lengths = torch.randint(0, 4, (TABLES * args.batch,), generator=g)
    values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
    keys = [f"f{i}" for i in range(TABLES)]
    sparse = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)
    dense = torch.randn(args.batch, args.dense_in, generator=g)
    return dense, sparse, torch.randint(0, 2, (args.batch,), generator=g).float()


def _held_bytes(dmp, optimizer) -> int:
    """Bytes of dense parameters, their gradients and optimizer state on this rank."""
    total = 0
    for name, param in dmp.named_parameters():
        if ".shards." in name or "embedding_bags" in name:
            continue
        local = [param, param.grad, *optimizer.state.get(param, {}).values()]
        for t in local:
            if isinstance(t, torch.Tensor) and t.dim() > 0:
                t = t.to_local() if isinstance(t, DTensor) else t
                total += t.numel() * t.element_size()
    return total


def _rank(rank: int, world_size: int, contender: str, args) -> dict:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    before = _rss_mb()
    wrapper = FullyShardDataParallelWrapper() if contender == "fsdp" else None
    dmp = DistributedModelParallel(_model(args), data_parallel_wrapper=wrapper)
    dense = [p for n, p in dmp.named_parameters() if ".shards." not in n]
    optimizer = torch.optim.Adam(dense, lr=1e-4)
    times = []
    for step in range(args.warmup + args.steps):
        features, sparse, labels = _batch(step, rank, args)
        start = time.perf_counter()
        logits = dmp(features, sparse).squeeze(1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        optimizer.zero_grad(set_to_none=False)
        loss.backward()
        optimizer.step()
        times.append((time.perf_counter() - start) * 1000)
    return {
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "before_model_mb": before,
        "held_mb": _held_bytes(dmp, optimizer) / 2**20,
        "ms_per_step": statistics.median(times[args.warmup :]),
        "dense_params": sum(p.numel() for p in dmp.module.over_arch.parameters())
        + sum(p.numel() for p in dmp.module.dense_arch.parameters()),
    }


def measure(args) -> dict[str, dict]:
    runs: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    for _ in range(args.rounds):
        for contender in CONTENDERS:
            ranks = spawn(_rank, world_size=args.ranks, args=(contender, args))
            runs[contender].append(
                {
                    key: max(r[key] for r in ranks)
                    for key in ("peak_rss_mb", "before_model_mb", "held_mb", "ms_per_step")
                }
                | {"dense_params": ranks[0]["dense_params"]}
            )
    return {
        c: {key: statistics.median(run[key] for run in rs) for key in rs[0]}
        | {"ms_range": [min(r["ms_per_step"] for r in rs), max(r["ms_per_step"] for r in rs)]}
        for c, rs in runs.items()
    }


def report(args, rows: dict[str, dict]) -> str:
    params = rows["ddp"]["dense_params"]
    lines = [
        f"# DMP: dense part under DDP or fully sharded ({args.ranks} ranks)",
        "",
        f"`python benchmarks/bench_dmp_dense.py {' '.join(argv(args))}`",
        "",
        f"Machine: {machine_line(threads=1)}.",
        "",
        f"DLRM, {params / 1e6:.1f} M dense parameters, {TABLES} tables of {args.rows} x "
        f"{args.dim} (planned, default sharders), Adam on the dense part, batch {args.batch}.",
        "",
        "| dense part | peak RSS MB | peak less the bare process MB | dense params + grads + "
        "Adam state held MB | ms/step (median) | range over rounds |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['peak_rss_mb']:.0f} | {row['peak_rss_mb'] - row['before_model_mb']:.0f}"
            f" | {row['held_mb']:.1f} | {row['ms_per_step']:.1f} | {row['ms_range'][0]:.1f}-"
            f"{row['ms_range'][1]:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--dense-in", type=int, default=256)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", help="write a markdown report here (and .json beside it)")
    args = parser.parse_args()
    rows = measure(args)
    text = report(args, rows)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(
            json.dumps(
                {"args": vars(args), "rows": rows, "machine": machine_info(threads=1)}, indent=1
            )
        )


if __name__ == "__main__":
    main()
