"""Embedding lookup + fused optimizer step: shardkit vs the naive way vs TorchRec + FBGEMM.

    python benchmarks/bench_ebc.py                      # defaults of the issue, 2 threads
    ~/.cache/shardkit-peers/venv/bin/python benchmarks/bench_ebc.py --out benchmarks/results/ebc.md
                                                        # the same with TorchRec side by side

One training step = forward of all tables for a batch, loss = sum(pooled * fixed random weights),
backward, optimizer step. Implementations:
- shardkit: EmbeddingBagCollection with the optimizer fused into backward (batched kernel);
- naive dense: one nn.EmbeddingBag per table + torch.optim on dense gradients;
- naive sparse: one nn.EmbeddingBag(sparse=True) per table + torch.optim on sparse gradients;
- torchrec: FusedEmbeddingBagCollection (FBGEMM's CPU kernels), when torchrec is importable.
Row-wise Adagrad's naive versions use shardkit.optim.RowWiseAdagrad (torch has none; it takes
only dense gradients). Reported: median step time after warm-up, samples/s, lookups/s, and the
effective memory bandwidth = bytes that must move per step / step time, where bytes =
forward gather (N x D x 4) + backward gather of output gradients (N x D x 4) + read and write of
the touched rows (2 x U x D x 4) + their optimizer state (N ids, U unique rows, D dim, fp32).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable

import torch

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.bench import machine_info
from shardkit.optim import EmbOptimType, RowWiseAdagrad

OPTIMIZERS = {
    "rowwise_adagrad": (EmbOptimType.EXACT_ROWWISE_ADAGRAD, RowWiseAdagrad),
    "sgd": (EmbOptimType.EXACT_SGD, torch.optim.SGD),
}


def make_batches(args: argparse.Namespace) -> list[KeyedJaggedTensor]:
    g = torch.Generator().manual_seed(args.seed)
    keys = [f"f{t}" for t in range(args.tables)]
    batches = []
    for _ in range(args.distinct_batches):
        low, high = max(0, args.ids_per_bag - 10), args.ids_per_bag + 10
        lengths = torch.randint(low, high + 1, (args.tables * args.batch,), generator=g)
        values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
        batches.append(KeyedJaggedTensor(keys=keys, values=values, lengths=lengths))
    return batches


def configs(args: argparse.Namespace) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"t{t}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f"f{t}"]
        )
        for t in range(args.tables)
    ]


def shardkit_step(args, optimizer: str) -> Callable[[KeyedJaggedTensor, torch.Tensor], None]:
    kind, _ = OPTIMIZERS[optimizer]
    ebc = EmbeddingBagCollection(
        tables=configs(args),
        fused_params={"optimizer": kind, "learning_rate": 0.01},
        validate_ids=not args.no_validate,
    )

    def step(kjt: KeyedJaggedTensor, weights: torch.Tensor) -> None:
        (ebc(kjt).values() * weights).sum().backward()

    return step


def naive_step(args, optimizer: str, sparse: bool) -> Callable | None:
    _, optimizer_class = OPTIMIZERS[optimizer]
    if sparse and optimizer_class is RowWiseAdagrad:
        return None  # torch has no sparse row-wise Adagrad
    bags = torch.nn.ModuleDict(
        {
            f"f{t}": torch.nn.EmbeddingBag(args.rows, args.dim, mode="sum", sparse=sparse)
            for t in range(args.tables)
        }
    )
    opt = optimizer_class(bags.parameters(), lr=0.01)

    def step(kjt: KeyedJaggedTensor, weights: torch.Tensor) -> None:
        opt.zero_grad()
        pooled = [bags[k](jt.values(), jt.offsets()[:-1]) for k, jt in kjt.to_dict().items()]
        (torch.cat(pooled, dim=1) * weights).sum().backward()
        opt.step()

    return step


def torchrec_step(args, optimizer: str) -> Callable | None:
    try:
        import torchrec
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
        from torchrec.optim import RowWiseAdagrad as TorchRecRowWiseAdagrad
    except ImportError:
        return None
    tables = [
        torchrec.EmbeddingBagConfig(
            name=f"t{t}", embedding_dim=args.dim, num_embeddings=args.rows, feature_names=[f"f{t}"]
        )
        for t in range(args.tables)
    ]
    optimizer_class = {"rowwise_adagrad": TorchRecRowWiseAdagrad, "sgd": torch.optim.SGD}[optimizer]
    ebc = FusedEmbeddingBagCollection(
        tables=tables,
        optimizer_type=optimizer_class,
        optimizer_kwargs={"lr": 0.01},
        device=torch.device("cpu"),
    )

    def step(kjt: KeyedJaggedTensor, weights: torch.Tensor) -> None:
        theirs = torchrec.KeyedJaggedTensor(
            keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths()
        )
        (ebc(theirs).values() * weights).sum().backward()

    return step


def measure(steps: dict[str, Callable], batches, weights, args) -> dict[str, list[float]]:
    """Step times of every contender, taken in interleaved rounds so that a slow spell of a
    shared machine hits all contenders alike rather than whichever ran during it."""
    for step in steps.values():
        for i in range(args.warmup):
            step(batches[i % len(batches)], weights)
    times: dict[str, list[float]] = {name: [] for name in steps}
    per_round = -(-args.iters // args.rounds)
    for first in range(0, args.iters, per_round):
        for name, step in steps.items():
            for i in range(first, min(first + per_round, args.iters)):
                start = time.perf_counter()
                step(batches[i % len(batches)], weights)
                times[name].append(time.perf_counter() - start)
    return times


def run_optimizer(optimizer: str, batches, weights, num_ids: float, unique: float, args) -> list:
    """Build every contender for ``optimizer``, time them, and return one result row each."""
    candidates = {
        "shardkit (fused, batched)": shardkit_step(args, optimizer),
        "naive dense (nn.EmbeddingBag x T + torch.optim)": naive_step(args, optimizer, False),
        "naive sparse (nn.EmbeddingBag(sparse) x T + torch.optim)": naive_step(
            args, optimizer, True
        ),
        "torchrec FusedEmbeddingBagCollection (FBGEMM)": torchrec_step(args, optimizer),
    }
    steps = {name: step for name, step in candidates.items() if step is not None}
    times = measure(steps, batches, weights, args)
    rows = []
    for name in candidates:
        if name not in steps:
            rows.append({"optimizer": optimizer, "impl": name, "skipped": True})
            continue
        ms = statistics.median(times[name]) * 1e3
        state_bytes = 4 * unique * (1 if optimizer == "rowwise_adagrad" else 0) * 2
        moved = 4 * args.dim * (2 * num_ids + 2 * unique) + state_bytes
        rows.append(
            {
                "optimizer": optimizer,
                "impl": name,
                "ms_per_step": ms,
                "samples_per_s": args.batch / (ms / 1e3),
                "lookups_per_s": num_ids / (ms / 1e3),
                "effective_gb_per_s": moved / (ms / 1e3) / 1e9,
                "times_ms": [t * 1e3 for t in times[name]],
            }
        )
        print(f"{optimizer:16} {name:58} {ms:8.1f} ms/step", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=30, help="timed steps per contender")
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleave contenders in this many rounds"
    )
    parser.add_argument("--distinct-batches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--optimizers", nargs="+", default=list(OPTIMIZERS), choices=list(OPTIMIZERS)
    )
    parser.add_argument("--no-validate", action="store_true", help="skip shardkit's id range check")
    parser.add_argument("--out", help="write a markdown report here (and .json beside it)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batches = make_batches(args)
    weights = torch.randn(
        args.batch, args.tables * args.dim, generator=torch.Generator().manual_seed(1)
    )
    num_ids = statistics.mean(b.values().numel() for b in batches)
    unique = statistics.mean(
        (
            b.values()
            + torch.repeat_interleave(
                torch.arange(args.tables) * args.rows, torch.tensor(b.length_per_key())
            )
        )
        .unique()
        .numel()
        for b in batches
    )
    rows = []
    for optimizer in args.optimizers:
        rows += run_optimizer(optimizer, batches, weights, num_ids, unique, args)
        gc.collect()  # free this optimizer's contenders before building the next ones
    report = render(rows, args, num_ids, unique)
    print(report)
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump({"args": vars(args), "machine": machine_info(), "rows": rows}, f, indent=1)


def render(rows: list[dict], args: argparse.Namespace, num_ids: float, unique: float) -> str:
    lines = [
        "# Embedding lookup + fused optimizer step (bench_ebc.py)",
        "",
        f"Config: {args.tables} tables x {args.rows:,} rows x dim {args.dim}, batch {args.batch}, "
        f"~{args.ids_per_bag} ids per bag ({num_ids:,.0f} ids, {unique:,.0f} unique rows per step), "
        f"{args.threads} threads, median of {args.iters} steps after {args.warmup} warm-up, contenders interleaved in "
        f"{args.rounds} rounds.",
        f"Machine: {json.dumps(machine_info())}",
        "",
        "| optimizer | implementation | ms/step | samples/s | lookups/s | effective GB/s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row.get("skipped"):
            lines.append(f"| {row['optimizer']} | {row['impl']} | skipped (not available) | | | |")
            continue
        lines.append(
            f"| {row['optimizer']} | {row['impl']} | {row['ms_per_step']:.1f} | "
            f"{row['samples_per_s']:,.0f} | {row['lookups_per_s'] / 1e6:.2f} M | "
            f"{row['effective_gb_per_s']:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
