"""Collective bandwidth in the nccl-tests convention, and shardkit's overhead over torch.

For each operation and message size, shardkit's collective and the same torch.distributed call
run alternately in timed loops; each loop's time is the slowest rank's. Reported per size:
median time per call, algorithm bandwidth (bytes / time) and bus bandwidth (algbw scaled by the
fraction of the data each link carries in a ring: ``2(n-1)/n`` for all-reduce, ``(n-1)/n`` for
all-gather, reduce-scatter and all-to-all, ``1`` for broadcast), and shardkit's extra time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from shardkit import comm

__all__ = ["OPS", "CommBenchConfig", "CommBenchRow", "format_table", "run_comm_bench"]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
_BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


@dataclass(frozen=True)
class CommBenchConfig:
    """What to measure.

    Args:
        ops: operations, a subset of `OPS`.
        sizes: message sizes in bytes (the full tensor: all-gather's output, reduce-scatter's
            input, all-to-all's input per rank).
        dtype: element type.
        repeats: timed loops per size and implementation (the median is reported).
        min_loop_s: each loop runs enough calls to take at least this long.
    """

    ops: tuple[str, ...] = OPS
    sizes: tuple[int, ...] = tuple(1 << s for s in range(10, 27, 2))  # 1 KiB .. 64 MiB
    dtype: torch.dtype = torch.float32
    repeats: int = 7
    min_loop_s: float = 0.02

    def __post_init__(self) -> None:
        unknown = [op for op in self.ops if op not in OPS]
        if unknown:
            raise ValueError(f"unknown ops {unknown}; choose from {list(OPS)}")
        if not self.sizes or min(self.sizes) <= 0:
            raise ValueError(f"sizes must be positive byte counts, got {list(self.sizes)}")
        if self.repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {self.repeats}")


@dataclass(frozen=True)
class CommBenchRow:
    """One measured (operation, size): times in microseconds, bandwidths in GB/s."""

    op: str
    bytes: int
    count: int
    dtype: str
    calls_per_loop: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    torch_time_us: float
    overhead_pct: float
    samples_us: list[float] = field(default_factory=list)
    torch_samples_us: list[float] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def run_comm_bench(rank: int, world_size: int, config: CommBenchConfig) -> list[CommBenchRow]:
    """Measure every (op, size) of ``config`` on this rank; call it on every rank together."""
    device = _device()
    rows = []
    for op in config.ops:
        for size in config.sizes:
            rows.append(_measure(op, size, world_size, config, device))
    return rows


def _measure(
    op: str, size: int, world_size: int, config: CommBenchConfig, device: torch.device
) -> CommBenchRow:
    element = torch.empty((), dtype=config.dtype).element_size()
    count = max(world_size, size // element // world_size * world_size)
    ours, theirs = _callables(op, count, world_size, config.dtype, device)
    ours()
    theirs()  # warm up both (allocations, connections)
    calls = _calls_per_loop(ours, config.min_loop_s)
    ours_us, theirs_us = [], []
    for _ in range(config.repeats):  # alternate, so drift hits both alike
        ours_us.append(_timed_loop(ours, calls))
        theirs_us.append(_timed_loop(theirs, calls))
    t_ours = statistics.median(ours_us)
    t_theirs = statistics.median(theirs_us)
    nbytes = count * element
    algbw = nbytes / (t_ours * 1e-6) / 1e9
    return CommBenchRow(
        op=op,
        bytes=nbytes,
        count=count,
        dtype=str(config.dtype).removeprefix("torch."),
        calls_per_loop=calls,
        time_us=t_ours,
        algbw_gbps=algbw,
        busbw_gbps=algbw * _BUS_FACTOR[op](world_size),
        torch_time_us=t_theirs,
        overhead_pct=100.0 * (t_ours - t_theirs) / t_theirs,
        samples_us=ours_us,
        torch_samples_us=theirs_us,
    )


def _callables(
    op: str, count: int, world_size: int, dtype: torch.dtype, device: torch.device
) -> tuple[Callable[[], object], Callable[[], object]]:
    """(shardkit call, torch.distributed call) doing the same work on the same buffers."""
    x = torch.ones(count, dtype=dtype, device=device)
    chunk = count // world_size
    if op == "all_reduce":
        return (lambda: comm.all_reduce(x, inplace=True)), (lambda: dist.all_reduce(x))
    if op == "all_gather":
        part = x[:chunk].clone()
        return (
            lambda: comm.all_gather_into_tensor(part),
            lambda: dist.all_gather_single(torch.empty_like(x), part),
        )
    if op == "reduce_scatter":
        return (
            lambda: comm.reduce_scatter_tensor(x),
            lambda: dist.reduce_scatter_single(x.new_empty(chunk), x),
        )
    if op == "all_to_all":
        return (
            lambda: comm.all_to_all_single(x),
            lambda: dist.all_to_all_single(torch.empty_like(x), x),
        )
    return (lambda: comm.broadcast(x, src=0, inplace=True)), (lambda: dist.broadcast(x, src=0))


def _calls_per_loop(call: Callable[[], object], min_loop_s: float) -> int:
    """Agree on one call count for all ranks, sized from the slowest rank's single call."""
    start = time.perf_counter()
    call()
    _sync()
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=_device())
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return int(min(1000, max(3, min_loop_s / max(elapsed.item(), 1e-7))))


def _timed_loop(call: Callable[[], object], calls: int) -> float:
    """Microseconds per call of the slowest rank over ``calls`` back-to-back calls."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    _sync()
    per_call_us = (time.perf_counter() - start) / calls * 1e6
    elapsed = torch.tensor([per_call_us], dtype=torch.float64, device=_device())  # NCCL: a GPU
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def _device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _sync() -> None:
    if torch.cuda.is_available() and dist.get_backend() == "nccl":
        torch.cuda.synchronize()


def format_table(rows: Sequence[CommBenchRow], *, world_size: int, backend: str) -> str:
    """The rows as a fixed-width table, nccl-tests style."""
    header = (
        f"{'op':<15}{'size':>10}{'count':>12}{'type':>10}{'time(us)':>12}{'algbw(GB/s)':>13}"
        f"{'busbw(GB/s)':>13}{'torch(us)':>12}{'overhead':>10}"
    )
    lines = [f"# {world_size} ranks, {backend}", header, "-" * len(header)]
    for row in rows:
        lines.append(
            f"{row.op:<15}{_human(row.bytes):>10}{row.count:>12}{row.dtype:>10}"
            f"{row.time_us:>12.1f}{row.algbw_gbps:>13.3f}{row.busbw_gbps:>13.3f}"
            f"{row.torch_time_us:>12.1f}{row.overhead_pct:>+9.1f}%"
        )
    return "\n".join(lines)


def _human(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:g} {unit}" if unit == "B" else f"{nbytes:.0f} {unit}"
        nbytes /= 1024  # type: ignore[assignment]
    raise AssertionError
