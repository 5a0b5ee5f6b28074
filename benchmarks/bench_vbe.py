"""Variable batch per feature (VBE): what a deduplicated user feature saves on the wire and in
step time, against the same batch expanded to one bag per example, in a sharded
EmbeddingBagCollection on 2 ranks.

    python benchmarks/bench_vbe.py --out benchmarks/results/vbe.md

Each rank's batch has ``--batch`` examples: ``--user-features`` user features with one bag
(``--user-ids`` ids) per ``--repeat`` examples (a request's candidates share their user), and
``--item-features`` item features with one bag (``--item-ids`` ids) per example. The "vbe"
contender feeds the deduplicated KJT (``stride_per_key_per_rank`` and ``inverse_indices``); the
"expanded" one feeds `expand_variable_batch` of it, the plain batch of the same examples. Both
are built from one seed, train with fused SGD on the same batches and take turns for
``--rounds`` rounds of ``--steps`` steps per sharding type, after one untimed step each. Reported per step, on rank 0: bytes
it sends to the other rank (its own chunk of an all-to-all excluded) in the input dist (header,
lengths, ids), in the output dist's forward (pooled rows) and in its backward (their
gradients); and the median ms per step (forward, backward with the fused update).
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
from shardkit.launch import spawn
from shardkit.modules import EmbeddingBagCollection, EmbeddingBagConfig, expand_variable_batch
from shardkit.optim import EmbOptimType
from shardkit.sharding import (
    ShardedEmbeddingBagCollection,
    column_wise,
    construct_module_sharding_plan,
    row_wise,
    table_row_wise,
    table_wise,
)
from shardkit.types import ShardingEnv

CONTENDERS = ("vbe", "expanded")
PLANS = {
    "table_wise": lambda i, world: table_wise(rank=i % world),
    "row_wise": lambda i, world: row_wise(),
    "column_wise": lambda i, world: column_wise(ranks=list(range(world))),
    "table_row_wise": lambda i, world: table_row_wise(host_index=0),
}


def _keys(args) -> tuple[list[str], list[str]]:
    users = [f"user{i}" for i in range(args.user_features)]
    return users, [f"item{i}" for i in range(args.item_features)]


def _sharded(args, kind: str, world: int) -> ShardedEmbeddingBagCollection:
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(name=f"t_{key}", embedding_dim=args.dim, num_embeddings=args.rows,
                           feature_names=[key])
        for keys in _keys(args) for key in keys
    ]  # fmt: skip
    fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 0.01}
    ebc = EmbeddingBagCollection(tables=tables, fused_params=fused)
    gens = {c.name: PLANS[kind](i, world) for i, c in enumerate(tables)}
    plan = construct_module_sharding_plan(ebc, gens, world_size=world)
    return ShardedEmbeddingBagCollection(ebc, plan, ShardingEnv.from_process_group(None))


def _batch(step: int, rank: int, args) -> KeyedJaggedTensor:
    """The deduplicated (VBE) batch: user bags shared by ``--repeat`` examples each."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    users, items = _keys(args)
    requests = args.batch // args.repeat
    strides = [requests] * len(users) + [args.batch] * len(items)
    means = [args.user_ids] * len(users) + [args.item_ids] * len(items)
    lengths = torch.cat(
        [torch.randint(1, 2 * m, (s,), generator=g) for s, m in zip(strides, means)]
    )
    values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
    request = torch.arange(args.batch) // args.repeat
    inverse = torch.stack([request] * len(users) + [torch.arange(args.batch)] * len(items))
    return KeyedJaggedTensor(
        keys=users + items, values=values, lengths=lengths,
        stride_per_key_per_rank=[[s] for s in strides], inverse_indices=(users + items, inverse),
    )  # fmt: skip


def _step(sharded, features, counter, grad) -> tuple[int, int, int]:
    """One training step; bytes sent by the input dist, the output dist and its backward."""
    start = counter.total
    dist_input = sharded.input_dist(features)
    dist_input.pending.wait()
    sent_in = counter.total - start
    out = sharded.compute_and_output_dist(dist_input).values()
    sent_out = counter.total - start - sent_in
    (out * grad).sum().backward()
    return sent_in, sent_out, counter.total - start - sent_in - sent_out


def _rank(rank: int, world_size: int, args) -> dict:
    torch.set_num_threads(1)
    counter = WireBytes()
    results: dict = {}
    for kind in args.sharding:
        models = {name: _sharded(args, kind, world_size) for name in CONTENDERS}
        steps = {name: 0 for name in CONTENDERS}
        rows = {n: {"ms": [], "input": [], "output": [], "backward": []} for n in CONTENDERS}
        width = args.dim * (args.user_features + args.item_features)
        grad = torch.randn(args.batch, width, generator=torch.Generator().manual_seed(rank))
        for name, sharded in models.items():  # warm-up (kernel loading, first allocations)
            first = _batch(10**6, rank, args)
            _step(sharded, first if name == "vbe" else expand_variable_batch(first), counter, grad)
        for _ in range(args.rounds):
            for name, sharded in models.items():
                batches = [_batch(steps[name] + k, rank, args) for k in range(args.steps)]
                if name == "expanded":
                    batches = [expand_variable_batch(b) for b in batches]
                steps[name] += args.steps
                dist.barrier()
                begin, sent = time.perf_counter(), []
                for features in batches:
                    sent.append(_step(sharded, features, counter, grad))
                rows[name]["ms"].append((time.perf_counter() - begin) / args.steps * 1000)
                for k, part in enumerate(("input", "output", "backward")):
                    rows[name][part].append(statistics.median(s[k] for s in sent))
        results[kind] = rows
    return results


def measure(args) -> dict:
    ranks = spawn(_rank, world_size=2, args=(args,))
    out = {}
    for kind in args.sharding:
        out[kind] = {}
        for name in CONTENDERS:
            row = ranks[0][kind][name]
            out[kind][name] = {
                **{part: statistics.median(row[part]) for part in ("input", "output", "backward")},
                "ms_per_step": statistics.median(row["ms"]),
                "ms_range": [min(row["ms"]), max(row["ms"])],
            }
    return out


def report(args, results: dict) -> str:
    lines = [
        "# Variable batch (VBE): deduplicated user features against the expanded batch",
        "",
        f"`python benchmarks/bench_vbe.py {' '.join(argv(args))}`",
        "",
        f"Machine: {machine_line(threads=1)}.",
        "",
        f"2 ranks x 1 thread; per rank a batch of {args.batch} examples: {args.user_features} "
        f"user features with one bag (about {args.user_ids} ids) per {args.repeat} examples, "
        f"{args.item_features} item features with one bag (about {args.item_ids} ids) per "
        f"example; tables of {args.rows} x {args.dim}, fused SGD; "
        f"{args.rounds} rounds of {args.steps} steps per contender, taking turns.",
        "",
        "| sharding | input | bytes sent/step: input dist | output dist | its backward | "
        "total | vs expanded | ms/step (median) | range | vs expanded |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, rows in results.items():
        base = rows["expanded"]
        for name, row in rows.items():
            total = row["input"] + row["output"] + row["backward"]
            base_total = base["input"] + base["output"] + base["backward"]
            lines.append(
                f"| {kind} | {name} | {row['input']:,.0f} | {row['output']:,.0f} | "
                f"{row['backward']:,.0f} | {total:,.0f} | {total / base_total:.2f}x | "
                f"{row['ms_per_step']:.1f} | {row['ms_range'][0]:.1f}-{row['ms_range'][1]:.1f} | "
                f"{row['ms_per_step'] / base['ms_per_step']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sharding", nargs="+", default=list(PLANS), choices=list(PLANS))
    parser.add_argument("--user-features", type=int, default=4)
    parser.add_argument("--item-features", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=32)
    parser.add_argument("--user-ids", type=int, default=20)
    parser.add_argument("--item-ids", type=int, default=3)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="write a markdown report here (and .json beside it)")
    args = parser.parse_args()
    if args.batch % args.repeat:
        parser.error(f"--batch {args.batch} must be a multiple of --repeat {args.repeat}")
    results = measure(args)
    text = report(args, results)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(
            json.dumps(
                {"args": vars(args), "results": results, "machine": machine_info(threads=1)},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
