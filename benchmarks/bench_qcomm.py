"""Compressed communication (`QCommsConfig`): bytes on the wire, step time and
the loss curve of DistributedModelParallel training with its output dists in FP32, FP16, BF16,
FP8 or INT8 (forward and backward; FP8 and INT8 with a scale per row), at 2 and 4 ranks.

    python benchmarks/bench_qcomm.py --out benchmarks/results/qcomm.md

Per rank count in ``--ranks`` (a fresh set of processes each, one thread per rank), the
contenders are built from the same seed (a DLRM, half its tables table-wise and half row-wise,
so both the pooled all-to-all and the row-wise reduce-scatter run) and train on the same
batches, taking turns for ``--rounds`` rounds of ``--steps`` steps. Reported: the bytes per step
that rank 0 sends to other ranks through shardkit.comm's collectives (ids and headers included;
the pooled rows and their gradients are what compression shrinks; DDP's all-reduce of the dense
part, the same for all three, is not counted), the median ms per step over rounds (rank 0's
clock), and the
training loss (mean over ranks) at a few steps with its largest distance from FP32's; and what
one encode and decode of each codec costs alone.
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
from _wire_bytes import WireBytes

from shardkit import KeyedJaggedTensor
from shardkit.bench import machine_info, machine_line
from shardkit.distributed.fbgemm_qcomm_codec import (
    CommType,
    QCommsConfig,
    get_qcomm_codecs,
    get_qcomm_codecs_registry,
)
from shardkit.launch import spawn
from shardkit.models import DLRM
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig
from shardkit.optim import EmbOptimType
from shardkit.sharding import (
    DistributedModelParallel,
    EmbeddingBagCollectionSharder,
    construct_module_sharding_plan,
    row_wise,
    table_wise,
)
from shardkit.types import ShardingPlan

CONTENDERS = {
    "fp32": CommType.FP32,
    "fp16": CommType.FP16,
    "bf16": CommType.BF16,
    "fp8": CommType.FP8,
    "int8": CommType.INT8,
}
PATH = "sparse_arch.embedding_bag_collection"


def _model(args) -> DLRM:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=args.dim, num_embeddings=args.rows,
                           feature_names=[f"f{i}"])
        for i in range(args.tables)
    ]  # fmt: skip
    return DLRM(
        EmbeddingBagCollection(tables=tables),
        dense_in_features=8,
        dense_arch_layer_sizes=[64, args.dim],
        over_arch_layer_sizes=[64, 1],
    )


def _dmp(args, precision: CommType, world_size: int) -> DistributedModelParallel:
    torch.manual_seed(0)
    model = _model(args)
    half = args.tables // 2
    gens = {f"t{i}": table_wise(rank=i % world_size) if i < half else row_wise()
            for i in range(args.tables)}  # fmt: skip
    ebc = model.sparse_arch.embedding_bag_collection
    plan = ShardingPlan({PATH: construct_module_sharding_plan(ebc, gens, world_size=world_size)})
    registry = get_qcomm_codecs_registry(QCommsConfig(precision, precision))
    fused = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}
    sharder = EmbeddingBagCollectionSharder(fused_params=fused, qcomm_codecs_registry=registry)
    return DistributedModelParallel(model, plan=plan, sharders=[sharder])


def _batch(step: int, rank: int, args):
    """Learnable labels: a fixed function of dense[0] and of the first id of table 0's bags."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    lengths = torch.randint(1, 4, (args.tables * args.batch,), generator=g)
    values = (torch.rand(int(lengths.sum()), generator=g) ** 2 * args.rows).long()
    keys = [f"f{i}" for i in range(args.tables)]
    sparse = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)
    dense = torch.randn(args.batch, 8, generator=g)
    starts = torch.cumsum(lengths[: args.batch], 0) - lengths[: args.batch]
    low_id = values[starts] < args.rows // 8  # table 0's first id in each bag: popular or not
    labels = (dense[:, 0] + 1.5 * low_id.float() - 0.75 > 0).float()
    return dense, sparse, labels


def _rank(rank: int, world_size: int, args) -> dict:
    torch.set_num_threads(1)
    counter = WireBytes()
    models = {name: _dmp(args, p, world_size) for name, p in CONTENDERS.items()}
    optims = {n: torch.optim.Adam([p for k, p in m.named_parameters() if ".shards." not in k],
                                  lr=3e-3) for n, m in models.items()}  # fmt: skip
    steps = {n: 0 for n in models}
    times: dict[str, list[float]] = {n: [] for n in models}
    losses: dict[str, list[float]] = {n: [] for n in models}
    wire: dict[str, list[int]] = {n: [] for n in models}
    for _ in range(args.rounds):
        for name, dmp in models.items():
            dist.barrier()
            start, sent = time.perf_counter(), counter.total
            for _ in range(args.steps):
                dense, sparse, labels = _batch(steps[name], rank, args)
                steps[name] += 1
                loss = torch.nn.functional.binary_cross_entropy_with_logits(
                    dmp(dense, sparse).squeeze(1), labels
                )
                optims[name].zero_grad()
                loss.backward()
                optims[name].step()
                losses[name].append(loss.item())
            times[name].append((time.perf_counter() - start) / args.steps * 1000)
            wire[name].append((counter.total - sent) // args.steps)
    return {"times": times, "losses": losses, "wire": wire}


def measure(args, world_size: int) -> dict[str, dict]:
    ranks = spawn(_rank, world_size=world_size, args=(args,))
    rows = {}
    for name in CONTENDERS:
        curve = [statistics.fmean(r["losses"][name][i] for r in ranks)
                 for i in range(len(ranks[0]["losses"][name]))]  # fmt: skip
        rows[name] = {
            "bytes_per_step": statistics.median(ranks[0]["wire"][name]),
            "ms_per_step": statistics.median(ranks[0]["times"][name]),
            "ms_range": [min(ranks[0]["times"][name]), max(ranks[0]["times"][name])],
            "loss_curve": curve,
        }
    base = rows["fp32"]["loss_curve"]
    for row in rows.values():
        row["max_loss_diff"] = max(abs(a - b) for a, b in zip(row["loss_curve"], base))
    return rows


def codec_ms(args, repeats: int = 5) -> dict[str, float]:
    """Median ms of one encode and decode of a ``[4 * batch * tables / 2, dim]`` float32 block
    (about what one rank sends per step at 4 ranks), one thread, the contenders interleaved;
    forward and backward codecs averaged (FP8's 1-4-3 and 1-5-2 differ)."""
    torch.set_num_threads(1)
    x = torch.randn(4 * args.batch * max(args.tables // 2, 1), args.dim)
    codecs = {n: get_qcomm_codecs(QCommsConfig(p, p)) for n, p in CONTENDERS.items()}
    times: dict[str, list[float]] = {n: [] for n in codecs}
    for _ in range(repeats):
        for name, pair in codecs.items():
            start = time.perf_counter()
            for codec in (pair.forward, pair.backward):
                codec.decode(codec.encode(x))
            times[name].append((time.perf_counter() - start) / 2 * 1000)
    return {n: statistics.median(t) for n, t in times.items()}


def report(args, results: dict[int, dict], codec_times: dict[str, float]) -> str:
    lines = [
        "# Compressed communication: output dists in FP32, FP16, BF16, FP8, INT8",
        "",
        f"`python benchmarks/bench_qcomm.py {' '.join(argv(args))}`",
        "",
        f"Machine: {machine_line(threads=1)}.",
        "",
        f"DLRM, {args.tables} tables of {args.rows} x {args.dim} (half table-wise, half "
        f"row-wise), batch {args.batch} per rank, {args.rounds * args.steps} steps per contender.",
        "",
        "| ranks | comms | bytes sent/step/rank | vs fp32 | ms/step (median) | "
        "range over rounds | loss at steps 1 / mid / last | max loss diff vs fp32 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for world_size, rows in results.items():
        base = rows["fp32"]["bytes_per_step"]
        for name, row in rows.items():
            curve = row["loss_curve"]
            mid = len(curve) // 2
            lines.append(
                f"| {world_size} | {name} | {row['bytes_per_step']:,.0f} | "
                f"{row['bytes_per_step'] / base:.2f}x | {row['ms_per_step']:.1f} | "
                f"{row['ms_range'][0]:.1f}-{row['ms_range'][1]:.1f} | {curve[0]:.4f} / "
                f"{curve[mid]:.4f} / {curve[-1]:.4f} | {row['max_loss_diff']:.2e} |"
            )
    rows = 4 * args.batch * max(args.tables // 2, 1)
    lines += ["", f"Encode + decode of a [{rows}, {args.dim}] float32 block, one thread (ms):", "",
              "| " + " | ".join(codec_times) + " |", "|" + "---|" * len(codec_times),
              "| " + " | ".join(f"{v:.2f}" for v in codec_times.values()) + " |"]  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="write a markdown report here (and .json beside it)")
    args = parser.parse_args()
    codec_times = codec_ms(args)
    results = {world_size: measure(args, world_size) for world_size in args.ranks}
    text = report(args, results, codec_times)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(
            json.dumps(
                {
                    "args": vars(args),
                    "results": results,
                    "codec_ms": codec_times,
                    "machine": machine_info(threads=1),
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
