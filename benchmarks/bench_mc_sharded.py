"""Step time of a managed-collision table sharded row-wise, against the same table sharded
without managed collision (``id % rows``): what the remapping costs per training step.

    python benchmarks/bench_mc_sharded.py --out benchmarks/results/mc_sharded.md

Each of ``--ranks`` ranks (one thread each) holds both contenders: a `ShardedEmbeddingBagCollection`
and a `ShardedManagedCollisionEmbeddingBagCollection`, 2 tables of ``--rows`` rows x ``--dim``,
row-wise, fused row-wise Adagrad, ``--buckets`` buckets, evicting every ``--eviction-interval``
steps. Raw ids are 40-bit, power law over ``--vocab`` ids per feature, ``--batch`` examples per
rank with one id per feature. The contenders take turns for ``--rounds`` rounds of ``--steps``
steps (forward, backward); the report gives each one's median ms/step over the rounds (rank 0's
clock; every step ends in collectives, so all ranks take the same time) and the spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from _command import argv

from shardkit import KeyedJaggedTensor
from shardkit.bench import machine_info, machine_line
from shardkit.launch import spawn
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
from shardkit.modules.mc_modules import (
    DistanceLFU_EvictionPolicy,
    ManagedCollisionCollection,
    MCHManagedCollisionModule,
)
from shardkit.sharding import (
    ShardedEmbeddingBagCollection,
    ShardedManagedCollisionEmbeddingBagCollection,
    construct_module_sharding_plan,
    row_wise,
)
from shardkit.types import ShardingEnv

FEATURES = ["user", "item"]


def _modules(args):
    configs = [
        EmbeddingBagConfig(name=f, num_embeddings=args.rows, embedding_dim=args.dim,
                           feature_names=[f])
        for f in FEATURES
    ]  # fmt: skip
    fused = {"optimizer": "exact_row_wise_adagrad", "learning_rate": 0.05}
    mcc = ManagedCollisionCollection(
        {
            f: MCHManagedCollisionModule(args.rows, "cpu", DistanceLFU_EvictionPolicy(),
                                         args.eviction_interval, buckets=args.buckets, name=f)
            for f in FEATURES
        },
        configs,
    )  # fmt: skip
    ebc = EmbeddingBagCollection(tables=configs, fused_params=fused)
    mc = ManagedCollisionEmbeddingBagCollection(ebc, mcc)
    return EmbeddingBagCollection(tables=configs, fused_params=fused), mc


def _batch(step: int, rank: int, args) -> tuple[KeyedJaggedTensor, KeyedJaggedTensor]:
    g = torch.Generator().manual_seed(step * 1000 + rank)
    popular = (torch.rand(2 * args.batch, generator=g) ** 3 * args.vocab).long()
    raw = popular * 2_654_435_761 % 2**40  # 40-bit ids
    lengths = torch.ones(2 * args.batch, dtype=torch.long)
    mc = KeyedJaggedTensor(keys=FEATURES, values=raw, lengths=lengths)
    plain = KeyedJaggedTensor(keys=FEATURES, values=raw % args.rows, lengths=lengths)
    return plain, mc


def _rank(rank: int, world_size: int, args) -> dict:
    torch.set_num_threads(1)
    env = ShardingEnv.from_process_group(dist.group.WORLD)
    plain, mc = _modules(args)
    plans = {
        name: construct_module_sharding_plan(
            module, {f: row_wise() for f in FEATURES}, world_size=world_size, device_type="cpu"
        )
        for name, module in (("plain", plain), ("mc", mc))
    }
    models = {
        "id % rows": ShardedEmbeddingBagCollection(plain, plans["plain"], env),
        "managed collision": ShardedManagedCollisionEmbeddingBagCollection(mc, plans["mc"], env),
    }
    times: dict[str, list[float]] = {name: [] for name in models}
    step = 0
    for _ in range(args.rounds):
        for name, model in models.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.steps):
                plain_kjt, mc_kjt = _batch(step, rank, args)
                step += 1
                out = model(mc_kjt if name == "managed collision" else plain_kjt)
                values = out[0].values() if isinstance(out, tuple) else out.values()
                values.sum().backward()
            times[name].append((time.perf_counter() - start) / args.steps * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--buckets", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--eviction-interval", type=int, default=10)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="write a markdown report here (and .json beside it)")
    args = parser.parse_args()
    times = spawn(_rank, world_size=args.ranks, args=(args,))[0]
    rows = [
        {"contender": name, "median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}
        for name, t in times.items()
    ]
    base = rows[0]["median_ms"]
    lines = [
        f"# Sharded managed collision: step time ({args.ranks} ranks, row-wise)",
        "",
        f"`python benchmarks/bench_mc_sharded.py {' '.join(argv(args))}`",
        "",
        f"Machine: {machine_line(threads=1)}.",
        "",
        "| contender | ms/step (median) | range over rounds | vs id % rows |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['contender']} | {row['median_ms']:.2f} | {row['min_ms']:.2f}-"
            f"{row['max_ms']:.2f} | {row['median_ms'] / base:.2f}x |"
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
        Path(args.out).with_suffix(".json").write_text(
            json.dumps(
                {"args": vars(args), "rows": rows, "machine": machine_info(threads=1)}, indent=1
            )
        )


if __name__ == "__main__":
    main()
