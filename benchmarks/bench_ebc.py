"""Embedding lookup + fused optimizer step: shardkit (compiled, eager) vs TorchRec + FBGEMM vs naive.

    python benchmarks/bench_ebc.py                      # one point, one thread, no TorchRec
    ~/.cache/shardkit-peers/venv/bin/python benchmarks/bench_ebc.py --sweep \\
        --out benchmarks/results/ebc_sweep.md           # the issue-11 sweep, TorchRec side by side
    python benchmarks/bench_ebc.py --device cuda --sweep --out benchmarks/results/ebc_cuda.md
                                                        # on a GPU: FBGEMM's CUDA kernels
    ~/.cache/shardkit-peers/venv/bin/python benchmarks/bench_ebc.py --quick
                                                        # a new machine's ratios in ~1 minute

``--quick``: four points of the sweep (the base point with uniform and power-law ids, dim 16,
dim 256), both optimizers, shardkit compiled against TorchRec/FBGEMM, 3 rounds: run it on a new
machine before quoting a ratio there (see [Note: a result names its machine] in
shardkit/bench/_machine.py); the report's first lines name the machine.

One training step = forward of all tables for a batch, loss = sum(pooled * fixed random weights),
backward, optimizer step. Contenders, built with the same tables and fed the same batches, take
turns in rounds (so a slow spell of a shared machine hits all alike):
- shardkit compiled / shardkit eager: EmbeddingBagCollection with the optimizer fused into
  backward, on the compiled C++ kernel or the eager torch one (`shardkit.kernels.use_kernel`);
- torchrec: FusedEmbeddingBagCollection (FBGEMM's CPU kernels), when torchrec is importable;
- naive dense: one nn.EmbeddingBag per table + torch.optim on dense gradients (skipped where a
  dense gradient would pass 512 MB).
Row-wise Adagrad's naive version uses shardkit.optim.RowWiseAdagrad (torch has none).

Reported per point: median ms per step and the spread (25th-75th percentile over all timed
steps), the ratio to FBGEMM, and the fractions of two floors reached (floor ms / step ms; see
[Note: the EBC step's floors] in _ebc_floors.py): the copy floor (bytes a step must move /
single-thread copy bandwidth measured here: the ids read in forward and backward, the unique
rows read in forward and read and written in backward, their row-wise state read and written,
the pooled output written and its gradient read) and the gather floor (the same step's random
row reads timed with torch's F.embedding_bag, plus the unique rows' update at copy bandwidth).

Worst points alone, e.g. ``--sweep --match batch=16384`` or ``--sweep --match dim=256``.

``--device cuda`` runs every contender on the current GPU (TorchRec with FBGEMM's CUDA kernels,
shardkit's compiled contender on its CUDA kernel where nvcc built it, else eager), with batches
resident there and a synchronize around each timed step; the floor is then the GPU's own
device-to-device copy bandwidth.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from _ebc_floors import copy_bandwidth, floor_bytes, gather_floor_ms
from _ebc_report import render

from shardkit import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from shardkit.bench import machine_info
from shardkit.kernels import huge_page_bytes, kernel_path, set_huge_pages, use_kernel
from shardkit.optim import EmbOptimType, RowWiseAdagrad

OPTIMIZERS = {
    "rowwise_adagrad": (EmbOptimType.EXACT_ROWWISE_ADAGRAD, RowWiseAdagrad),
    "sgd": (EmbOptimType.EXACT_SGD, torch.optim.SGD),
}
DEFAULT_CONTENDERS = ("shardkit compiled", "shardkit eager", "torchrec (FBGEMM)", "naive dense")
SMALL_PAGES = "shardkit compiled, 4 KiB pages"  # no huge page advice: what 2 MiB pages give
CONTENDERS = (*DEFAULT_CONTENDERS, SMALL_PAGES)
NAIVE_MAX_BYTES = 512 << 20


@dataclass(frozen=True)
class Point:
    """One configuration of the sweep."""

    tables: int = 4
    rows: int = 100_000
    dim: int = 64
    batch: int = 2048
    ids: str = "uniform"  # or "power-law": P(id = k) ~ 1 / (k + 1), hot rows spread by a hash
    optimizer: str = "rowwise_adagrad"


def sweep_points() -> list[Point]:
    """Around the base point (4 x 100k x 64, batch 2048): rows 10k / 100k / 1M / 10M (4, 4, 2, 1
    tables: the largest fit in memory), dim 16 / 256, batch 256 / 16384; each with uniform and
    power-law ids, row-wise Adagrad and SGD."""
    shapes = [Point(tables=t, rows=r) for t, r in ((4, 10_000), (4, 100_000), (2, 1_000_000))]
    shapes += [Point(tables=1, rows=10_000_000)]
    shapes += [Point(dim=16), Point(dim=256), Point(batch=256), Point(batch=16384)]
    return [
        replace(shape, ids=ids, optimizer=optimizer)
        for shape in shapes
        for ids in ("uniform", "power-law")
        for optimizer in OPTIMIZERS
    ]


def quick_points() -> list[Point]:
    """``--quick``: the base point (uniform and power-law ids), dim 16 and dim 256, where the
    ratios to FBGEMM differed most between machines (issue 25), with both optimizers."""
    shapes = [Point(), Point(ids="power-law"), Point(dim=16), Point(dim=256)]
    return [replace(shape, optimizer=optimizer) for shape in shapes for optimizer in OPTIMIZERS]


def make_batches(point: Point, args: argparse.Namespace) -> list[KeyedJaggedTensor]:
    """Distinct batches, made on the CPU from the seed (the same ids on every device)."""
    g = torch.Generator().manual_seed(args.seed)
    keys = [f"f{t}" for t in range(point.tables)]
    batches = []
    for _ in range(args.distinct_batches):
        low, high = max(0, args.ids_per_bag - 10), args.ids_per_bag + 10
        lengths = torch.randint(low, high + 1, (point.tables * point.batch,), generator=g)
        count = int(lengths.sum())
        if point.ids == "uniform":
            values = torch.randint(0, point.rows, (count,), generator=g)
        else:
            u = torch.rand(count, generator=g, dtype=torch.float64)
            values = ((point.rows + 1) ** u).floor().long() - 1  # Zipf-like, row 0 hottest
            values = (values * 2654435761) % point.rows  # hot rows spread over the table
        batches.append(KeyedJaggedTensor(keys=keys, values=values, lengths=lengths))
    return batches


def configs(point: Point) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            name=f"t{t}",
            embedding_dim=point.dim,
            num_embeddings=point.rows,
            feature_names=[f"f{t}"],
        )
        for t in range(point.tables)
    ]


def shardkit_step(point: Point, args, path: str, *, huge_pages: bool = True) -> Callable:
    kind, _ = OPTIMIZERS[point.optimizer]
    advice = set_huge_pages(path == "compiled" and huge_pages)  # (advised when allocated)
    ebc = EmbeddingBagCollection(
        tables=configs(point),
        fused_params={"optimizer": kind, "learning_rate": 0.01},
        validate_ids=not args.no_validate,
        device=torch.device(args.device),
    )
    set_huge_pages(advice)

    def step(kjt: KeyedJaggedTensor, weights: torch.Tensor) -> None:
        advice = path != "compiled" or set_huge_pages(huge_pages)  # (this contender's tables)
        with use_kernel(path):
            pooled = ebc(kjt).values()
        (pooled * weights).sum().backward()
        if path == "compiled":
            set_huge_pages(advice)

    step.tables = [p for p in ebc.parameters() if p.device.type == "cpu"]  # type: ignore[attr-defined]
    return step


def huge_page_share(step: Callable) -> float | None:
    """The share of a shardkit contender's table bytes on 2 MiB pages (None for the others)."""
    tables = getattr(step, "tables", None)
    if not tables:
        return None
    storages = {t.untyped_storage().data_ptr(): t for t in tables}  # tables share a stacked one
    held = sum(t.untyped_storage().nbytes() for t in storages.values())
    return sum(huge_page_bytes(t) for t in storages.values()) / held


def naive_step(point: Point, args) -> Callable | str:
    if point.tables * point.rows * point.dim * 4 > NAIVE_MAX_BYTES:
        return f"skipped: its dense gradient would pass {NAIVE_MAX_BYTES >> 20} MB per step"
    _, optimizer_class = OPTIMIZERS[point.optimizer]
    bags = torch.nn.ModuleDict(
        {
            f"f{t}": torch.nn.EmbeddingBag(point.rows, point.dim, mode="sum")
            for t in range(point.tables)
        }
    )
    bags.to(args.device)
    opt = optimizer_class(bags.parameters(), lr=0.01)

    def step(kjt: KeyedJaggedTensor, weights: torch.Tensor) -> None:
        opt.zero_grad()
        pooled = [bags[k](jt.values(), jt.offsets()[:-1]) for k, jt in kjt.to_dict().items()]
        (torch.cat(pooled, dim=1) * weights).sum().backward()
        opt.step()

    return step


def torchrec_step(point: Point, args) -> Callable | str:
    try:
        import torchrec
        from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection
        from torchrec.optim import RowWiseAdagrad as TorchRecRowWiseAdagrad
    except ImportError:
        return "skipped: torchrec is not importable (use the peers venv)"
    tables = [
        torchrec.EmbeddingBagConfig(name=c.name, embedding_dim=c.embedding_dim,
                                    num_embeddings=c.num_embeddings, feature_names=c.feature_names)
        for c in configs(point)
    ]  # fmt: skip
    optimizer_class = {"rowwise_adagrad": TorchRecRowWiseAdagrad, "sgd": torch.optim.SGD}
    ebc = FusedEmbeddingBagCollection(
        tables=tables,
        optimizer_type=optimizer_class[point.optimizer],
        optimizer_kwargs={"lr": 0.01},
        device=torch.device(args.device),
    )

    def step(kjt: KeyedJaggedTensor, weights: torch.Tensor) -> None:
        theirs = torchrec.KeyedJaggedTensor(
            keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths()
        )
        (ebc(theirs).values() * weights).sum().backward()

    return step


def build(point: Point, args) -> dict[str, Callable | str]:
    """Every contender asked for: a step function, or why it is skipped."""
    makers = {
        "shardkit compiled": lambda: shardkit_step(point, args, "compiled"),
        "shardkit eager": lambda: shardkit_step(point, args, "eager"),
        "torchrec (FBGEMM)": lambda: torchrec_step(point, args),
        "naive dense": lambda: naive_step(point, args),
        SMALL_PAGES: lambda: shardkit_step(point, args, "compiled", huge_pages=False),
    }
    return {name: makers[name]() for name in args.contenders}


def measure(steps: dict[str, Callable], batches, weights, args) -> dict[str, list[list[float]]]:
    """Step times (ms) per contender and round; contenders take turns within every round."""
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for step in steps.values():
        for i in range(args.warmup):
            step(batches[i % len(batches)], weights)
    times: dict[str, list[list[float]]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            round_times = []
            for i in range(args.iters):
                sync()
                start = time.perf_counter()
                step(batches[i % len(batches)], weights)
                sync()
                round_times.append((time.perf_counter() - start) * 1e3)
            times[name].append(round_times)
    return times


def batch_stats(point: Point, batches: list[KeyedJaggedTensor]) -> tuple[float, float]:
    """Mean ids and mean unique (table, row) pairs per batch."""
    ids = statistics.mean(b.values().numel() for b in batches)
    unique = []
    for b in batches:
        shift = torch.repeat_interleave(
            torch.arange(point.tables) * point.rows, torch.tensor(b.length_per_key())
        )
        unique.append((b.values() + shift).unique().numel())
    return ids, statistics.mean(unique)


def summarize(times: list[list[float]]) -> dict:
    flat = sorted(t for round_times in times for t in round_times)
    quartiles = statistics.quantiles(flat, n=4) if len(flat) > 1 else [flat[0]] * 3
    return {
        "ms": statistics.median(flat),
        "p25": quartiles[0],
        "p75": quartiles[2],
        "round_medians": [statistics.median(r) for r in times],
        "times_ms": flat,
    }


def run_point(point: Point, args, bandwidth: float) -> dict:
    batches = make_batches(point, args)
    weights = torch.randn(
        point.batch, point.tables * point.dim, generator=torch.Generator().manual_seed(1)
    )
    num_ids, unique = batch_stats(point, batches)
    gather_ms = None  # measured before the contenders' tables exist (memory), CPU only
    if args.device == "cpu":
        gather_ms = gather_floor_ms(point, batches[0], unique, bandwidth)
    batches = [kjt.to(torch.device(args.device)) for kjt in batches]
    weights = weights.to(args.device)
    contenders = build(point, args)
    steps = {name: step for name, step in contenders.items() if callable(step)}
    times = measure(steps, batches, weights, args)
    floor_ms = floor_bytes(point, num_ids, unique) / (bandwidth * 1e9) * 1e3
    results = {}
    for name, step in contenders.items():
        results[name] = summarize(times[name]) if callable(step) else {"skipped": step}
        if callable(step):
            results[name]["huge_page_share"] = huge_page_share(step)
            results[name]["floor_fraction"] = floor_ms / results[name]["ms"]
            if gather_ms is not None:
                results[name]["gather_fraction"] = gather_ms / results[name]["ms"]
    reference = results.get("torchrec (FBGEMM)", {}).get("ms")
    for result in results.values():
        if reference and "ms" in result:
            result["ratio_to_fbgemm"] = result["ms"] / reference
    del contenders, steps
    gc.collect()
    line = "  ".join(f"{n}: {r['ms']:.2f} ms" for n, r in results.items() if "ms" in r)
    print(f"{point}: {line}", flush=True)
    return {"point": asdict(point), "num_ids": num_ids, "unique_rows": unique,
            "floor_ms": floor_ms, "gather_floor_ms": gather_ms, "results": results}  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    base = Point()
    parser.add_argument("--sweep", action="store_true", help="run every point of sweep_points()")
    parser.add_argument("--quick", action="store_true",
                        help="quick_points(), compiled and FBGEMM only, 3 rounds of 3 steps: a "
                        "new machine's ratios in about a minute")  # fmt: skip
    parser.add_argument(
        "--match", nargs="+", default=[], help="keep sweep points whose repr contains all of these"
    )
    parser.add_argument(
        "--exclude",
        nargs="+",
        default=[],
        help="drop sweep points whose repr contains any of these",
    )
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply rows and batch (smoke runs)"
    )
    parser.add_argument("--tables", type=int, default=base.tables)
    parser.add_argument("--rows", type=int, default=base.rows)
    parser.add_argument("--dim", type=int, default=base.dim)
    parser.add_argument("--batch", type=int, default=base.batch)
    parser.add_argument("--ids", choices=("uniform", "power-law"), default=base.ids)
    parser.add_argument(
        "--optimizers", nargs="+", default=list(OPTIMIZERS), choices=list(OPTIMIZERS)
    )
    parser.add_argument(
        "--contenders", nargs="+", default=list(DEFAULT_CONTENDERS), choices=CONTENDERS
    )
    parser.add_argument("--ids-per-bag", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: every contender on the current GPU")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=5, help="timed steps per contender per round")
    parser.add_argument(
        "--rounds", type=int, default=6, help="rounds in which contenders take turns"
    )
    parser.add_argument("--distinct-batches", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-validate", action="store_true", help="skip shardkit's id range check")
    parser.add_argument("--out", help="write a markdown report here (.json and .png beside it)")
    args = parser.parse_args()
    if args.quick:
        args.contenders = [c for c in args.contenders if c in QUICK_CONTENDERS]
        args.rounds, args.iters, args.warmup = 3, 3, 2
    return args


QUICK_CONTENDERS = ("shardkit compiled", "torchrec (FBGEMM)")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    kernel_path()  # build (or load) the compiled kernel before any timing
    if args.quick:
        points = quick_points()
    elif args.sweep:
        points = sweep_points()
    else:
        one = Point(args.tables, args.rows, args.dim, args.batch, args.ids)
        points = [replace(one, optimizer=o) for o in args.optimizers]
    points = [
        replace(p, rows=max(10, int(p.rows * args.scale)), batch=max(1, int(p.batch * args.scale)))
        for p in points
        if p.optimizer in args.optimizers
        and all(m in repr(p) for m in args.match)
        and not any(x in repr(p) for x in args.exclude)
    ]
    bandwidth = copy_bandwidth(args.device)
    print(f"{args.device} copy bandwidth: {bandwidth:.1f} GB/s", flush=True)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else None
    report = {"args": vars(args), "machine": machine_info(), "threads": torch.get_num_threads(), "gpu": gpu,
              "copy_gb_per_s": bandwidth, "points": [run_point(p, args, bandwidth) for p in points]}  # fmt: skip
    markdown = render(report)
    print(markdown)
    if args.out:
        with open(args.out, "w") as f:
            f.write(markdown)
        with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
            json.dump(report, f, indent=1)
        from _ebc_report import chart

        chart(report, os.path.splitext(args.out)[0] + ".png")


if __name__ == "__main__":
    main()
