"""Collectives measured and fitted for the profile's links (``latency + bytes / bandwidth`` per
kind and world size), and the wait a collective adds when ranks share cores (see [Note:
oversubscribed cores])."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.bench._fit import fit_nonnegative, median_by
from shardkit.bench._machine import cores
from shardkit.launch import current
from shardkit.planner import COLLECTIVE_KINDS, LinkFit

__all__ = [
    "FRESH_BUFFERS",
    "SCHEDULING_WAIT",
    "collective_rank",
    "fit_links",
    "fit_switch_wait",
    "measure_collectives",
    "scheduling_wait",
    "sync",
]

SCHEDULING_WAIT = "scheduling_wait"  # the rows of `scheduling_wait`, beside the collectives'


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _collective(
    kind: str, nbytes: int, world: int, device: torch.device, group: dist.ProcessGroup | None
) -> Callable[[], object]:
    count = max(world, nbytes // 4 // world * world)
    x = torch.ones(count, device=device)
    if kind == "all_to_all":
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x, group=group)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(x, group=group)
    if kind == "reduce_scatter":  # as the sharded modules run it (gloo: all-to-all + sum)
        return lambda: comm.reduce_scatter_tensor(x, group=group)
    part = x[: count // world].clone()
    return lambda: dist.all_gather_single(x, part, group=group)


def measure_collectives(
    sizes: Sequence[int], repeats: int, group: dist.ProcessGroup | None = None
) -> list[dict]:
    """Each collective at each size among ``group``'s ranks (default: the world; call on each
    of them): the slowest rank's fastest loop, ms per call."""
    world = dist.get_world_size(group)
    device = current().device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    rows = []
    for kind in COLLECTIVE_KINDS:
        for nbytes in sizes:
            call = _collective(kind, nbytes, world, device, group)
            call()
            samples = []
            calls = 1 if nbytes >= (16 << 20) else 3 if nbytes >= (1 << 20) else 10
            for _ in range(repeats):
                dist.barrier(group)
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                sync(device)
                samples.append((time.perf_counter() - start) * 1e3 / calls)
            ms = torch.tensor([min(samples)], dtype=torch.float64, device=device)
            dist.all_reduce(ms, op=dist.ReduceOp.MAX, group=group)
            rows.append({"kind": kind, "bytes": nbytes, "world_size": world, "ms": float(ms)})
    return rows


def scheduling_wait(repeats: int, group: dist.ProcessGroup | None = None) -> float:
    """ms one small collective waits for its ranks to be scheduled when they compute between
    collectives: a loop of compute bursts (a few ms of matmuls) each followed by an
    all-to-all, minus the bursts alone and the all-to-alls alone, per collective; every part
    timed on all ranks at once (the slowest rank's fastest repeat). Call on every rank of
    ``group``; 0 when the ranks have cores enough (nothing to wait for)."""
    a = torch.randn(192, 192)
    small = torch.ones(1024 * dist.get_world_size(group))
    out = torch.empty_like(small)
    loops = 8

    def burst() -> None:
        for _ in range(8):
            torch.mm(a, a)

    def exchange() -> None:
        dist.all_to_all_single(out, small, group=group)

    def both() -> None:
        for _ in range(loops):
            burst()
            exchange()

    def bursts() -> None:
        for _ in range(loops):
            burst()

    def exchanges() -> None:
        for _ in range(loops):
            exchange()

    contenders = (both, bursts, exchanges)
    best = [float("inf")] * 3
    for fn in contenders:
        fn()  # warm up
    for _ in range(repeats):
        for i, fn in enumerate(contenders):  # in turns: a busy spell falls on all three
            dist.barrier(group)
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], (time.perf_counter() - start) * 1e3)
    slowest = torch.tensor(best, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    together, apart, alone = slowest.tolist()
    return max(0.0, (together - apart - alone) / loops)


def fit_switch_wait(rows: Sequence[dict]) -> float:
    """The profile's ``switch_wait_ms`` from `scheduling_wait` rows (``ms`` at an
    ``oversubscription`` above 1): the median of ``ms / (oversubscription - 1)``, 0 without
    any (see [Note: oversubscribed cores])."""
    rows = median_by(rows, ("world_size", "oversubscription"))  # one world's samples: median
    per_rank = [r["ms"] / (r["oversubscription"] - 1) for r in rows if r["oversubscription"] > 1]
    return statistics.median(per_rank) if per_rank else 0.0


# Buffers of a message's size that a calibrated collective allocates afresh per call (on gloo,
# as `measure_collectives` calls it): the reduce-scatter's all-to-all receives into a new one,
# gloo's all-gather gathers into a flat one of its own before the output.
FRESH_BUFFERS = {"all_to_all": 0, "all_reduce": 0, "reduce_scatter": 1, "all_gather": 1}


def fit_links(
    rows: Sequence[dict], scope: str, fresh: tuple[int, float] = (0, 0.0), share: float = 1.0
) -> list[LinkFit]:
    """``latency + bytes / bandwidth`` per (kind, world size) of measured rows.

    ``fresh``: the profile's (``fresh_buffer_bytes``, ``fresh_page_ms_per_byte``). A size at
    least that large was timed with the page faults of the buffers the collective allocated
    (`FRESH_BUFFERS`), which the prediction charges apart (see [Note: fresh pages]): they are
    taken out of its time first, at ``share`` (ranks x threads / cores, when more than 1 rank
    shares a core: their faults are computed in turns) per world size, so that the fit is the
    wire's alone and nothing is charged twice."""
    threshold, per_byte = fresh
    if threshold > 0:
        adjusted = []
        for r in rows:
            if r["bytes"] >= threshold and r.get("world_size", 1) > 1:
                ranks_share = max(1.0, share * r["world_size"])
                faults = FRESH_BUFFERS.get(r["kind"], 0) * r["bytes"] * per_byte * ranks_share
                r = {**r, "ms": max(r["ms"] - faults, 0.1 * r["ms"])}  # kept > 0
            adjusted.append(r)
        rows = adjusted
    # a point timed in several samples (calibrate's rounds): their median
    rows = median_by(rows, ("scope", "kind", "world_size", "bytes"))
    fits = []
    keys = sorted(
        {(r["kind"], r["world_size"]) for r in rows},
        key=lambda k: (COLLECTIVE_KINDS.index(k[0]), k[1]),
    )
    for kind, world in keys:
        mine = [r for r in rows if r["kind"] == kind and r["world_size"] == world]
        latency, per_byte = fit_nonnegative(
            [[1.0, r["bytes"]] for r in mine], [r["ms"] for r in mine]
        )
        if per_byte <= 0:  # all sizes cost the same: no bandwidth limit seen; the largest size
            biggest = max(mine, key=lambda r: r["bytes"])
            per_byte = biggest["ms"] / biggest["bytes"]
            latency = 0.0
        fits.append(LinkFit(kind, world, latency, 1.0 / per_byte, scope))
    return fits


def collective_rank(
    rank: int, world_size: int, sizes: tuple[int, ...], repeats: int, sample: int = 0
) -> list[dict]:
    """One sample of this world's collectives at ``sizes`` and, when its ranks share cores,
    the wait for scheduling (`scheduling_wait`): rows tagged ``sample``. calibrate calls it
    in a `RankPool` kept up over its run, a sample at a time between its other points."""
    rows = measure_collectives(sizes, repeats)
    share = world_size * torch.get_num_threads() / cores()
    if share > 1:  # more ranks than cores: what their collectives wait to be scheduled
        wait = scheduling_wait(repeats)
        rows.append({"kind": SCHEDULING_WAIT, "world_size": world_size, "ms": wait,
                     "oversubscription": share})  # fmt: skip
    return [{**row, "sample": sample} for row in rows]
