"""``shardkit bench comm``: collective bandwidth and shardkit's overhead over torch.distributed;
``shardkit bench calibrate``: measure this machine for the planner's predictions."""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

from shardkit.bench import CalibrationConfig, calibrate, format_profile, machine_info
from shardkit.bench.comm import OPS, CommBenchConfig, format_table, run_comm_bench
from shardkit.launch import current, spawn

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def add_parser(commands: Any) -> None:
    bench = commands.add_parser("bench", help="run a benchmark", allow_abbrev=False)
    kinds = bench.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    parser = kinds.add_parser(
        "comm",
        allow_abbrev=False,
        help="time collectives over message sizes (nccl-tests style)",
        description="For each operation and size: time per call, algorithm and bus bandwidth, "
        "and shardkit's overhead over calling torch.distributed directly.",
    )
    parser.add_argument("--world-size", type=int, default=2, help="ranks to start (default 2)")
    parser.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default=None,
        help="default: nccl with GPUs, else gloo",
    )
    parser.add_argument("--ops", nargs="+", choices=OPS, default=list(OPS), help="operations")
    parser.add_argument("--min-bytes", type=_size, default="1K", help="smallest message (1K, 4M..)")
    parser.add_argument("--max-bytes", type=_size, default="64M", help="largest message")
    parser.add_argument("--step", type=int, default=4, help="size multiplier between rows")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="float32")
    parser.add_argument("--repeats", type=int, default=7, help="timed loops per size (median)")
    parser.add_argument("--json", metavar="PATH", help="also write rows and machine info here")
    parser.set_defaults(run=_run, parser=parser)
    _add_calibrate(kinds)


def _add_calibrate(kinds: Any) -> None:
    defaults = CalibrationConfig()
    parser = kinds.add_parser(
        "calibrate",
        allow_abbrev=False,
        help="measure this machine and write the profile the planner predicts step times from",
        description="Times the embedding kernel (forward, backward + fused update, per "
        "optimizer), memory bandwidth, float32 matmul, the collectives per world size and the "
        "sharded step's own overhead, fits them, prints what it measured and writes a JSON "
        "profile for `shardkit plan --profile` and Topology.from_profile. Under torchrun on "
        "several hosts it also measures the links between hosts.",
    )
    parser.add_argument("--out", default="profile.json", help="where to write the profile")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None,
                        help="default: cuda with a GPU, else cpu")  # fmt: skip
    parser.add_argument("--threads", type=int, default=defaults.threads_per_rank,
                        help="intra-op threads per rank, as training will run")  # fmt: skip
    parser.add_argument("--world-sizes", type=int, nargs="+", default=list(defaults.world_sizes),
                        help="ranks to time the collectives among, on this host")  # fmt: skip
    parser.add_argument("--optimizers", nargs="+", default=list(defaults.optimizers),
                        help="fused optimizers to time the kernel with")  # fmt: skip
    parser.add_argument("--dims", type=int, nargs="+", default=list(defaults.dims))
    parser.add_argument("--ids", type=int, nargs="+", default=list(defaults.ids),
                        help="ids per kernel call at the kernel's points")  # fmt: skip
    parser.add_argument("--sizes", type=_size, nargs="+", default=list(defaults.sizes),
                        help="collective message sizes (16K, 4M..)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
    parser.add_argument("--samples", type=int, default=defaults.samples,
                        help="samples of each noisy point (matmul, bucketing, the step "
                        "overhead, the collectives), spread over the run; the median is kept")  # fmt: skip
    parser.add_argument("--copy-bytes", type=_size, default=defaults.copy_bytes,
                        help="tensor copied to time memory bandwidth")  # fmt: skip
    parser.add_argument("--big-table-bytes", type=_size, default=defaults.big_table_bytes,
                        help="the kernel's table outside the cache")  # fmt: skip
    parser.set_defaults(run=_run_calibrate, parser=parser)


def _run_calibrate(args: argparse.Namespace) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    config = CalibrationConfig(
        optimizers=tuple(args.optimizers),
        dims=tuple(args.dims),
        ids=tuple(args.ids),
        world_sizes=tuple(args.world_sizes),
        sizes=tuple(args.sizes),
        threads_per_rank=args.threads,
        repeats=args.repeats,
        samples=args.samples,
        copy_bytes=args.copy_bytes,
        big_table_bytes=args.big_table_bytes,
        device=device,
    )
    profile = calibrate(config, log=print)
    if profile is None:  # a rank other than 0 under torchrun
        return 0
    print(format_profile(profile))
    profile.save(args.out)
    print(f"wrote {args.out}")
    return 0


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def _sizes(low: int, high: int, step: int) -> tuple[int, ...]:
    if step < 2:
        raise SystemExit(f"--step must be >= 2, got {step}")
    sizes = []
    size = low
    while size <= high:
        sizes.append(size)
        size *= step
    return tuple(sizes)


def _bench_rank(rank: int, world_size: int, config: CommBenchConfig) -> Any:
    rows = run_comm_bench(rank, world_size, config)
    return rows, current().backend


def _run(args: argparse.Namespace) -> int:
    config = CommBenchConfig(
        ops=tuple(args.ops),
        sizes=_sizes(args.min_bytes, args.max_bytes, args.step),
        dtype=_DTYPES[args.dtype],
        repeats=args.repeats,
    )
    results = spawn(
        _bench_rank, world_size=args.world_size, args=(config,), backend=args.backend, timeout=600
    )
    rows, backend = results[0]
    print(format_table(rows, world_size=args.world_size, backend=backend))
    if args.json:
        report = {"machine": machine_info(), "world_size": args.world_size, "backend": backend}
        report["rows"] = [row.to_dict() for row in rows]
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json}")
    return 0
