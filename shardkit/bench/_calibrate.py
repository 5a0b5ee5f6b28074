"""``shardkit bench calibrate``: measure this machine and write the `MachineProfile` the planner
predicts step times from (see [Note: calibrated kernel model] and
[Note: calibrated collective model] in the planner).

What it times, each point the fastest of a few repeats after a warm-up (other processes only
add time), one rank's own work in its thread's CPU time when it runs one thread on a CPU.
The noisy points (memory bandwidth, matmul, bucketing, the step overhead, the collectives and
their scheduling wait) are taken as ``samples`` short samples at moments spread over the run
(between the kernel's points, which it walks in as many pieces; the ranks that time
collectives and the step overhead stay up in a `RankPool` between samples): the profile keeps
each point's median and records the samples' spread (`MachineProfile.spread`). On a shared
VM one calibration taken back to back is one sample of the machine's state: issue 29 found
the step overhead 1.6-2.3x apart, matmul 61-78 GFLOP/s and the collective wait 0.9-2.3 ms
between calibrations of one hour.

- the embedding kernel (`BatchedTables` + `lookup`, the kernel the sharded modules run), forward
  and backward with the fused update, per optimizer, at ``ids x rows x dim`` points chosen so
  that ids, bags, touched rows, columns and table size (inside or far outside the cache) vary
  apart; then a least-squares fit per optimizer (`fit_nonnegative`), and the cache size the
  kernel effectively has (`fit_kernels`); then at tables of a few sizes between, what a missed
  row costs there (the fit's ``miss_curve``, see [Note: calibrated kernel model]). A point
  whose pooled output is large enough to get fresh pages has their cost (measured first) taken
  out of its forward: the prediction charges those apart;
- memory bandwidth (a large tensor copied), dense float32 throughput (an MLP-sized linear
  layer's forward and backward), the row-wise input distribution's bucketing per id
  (`bucket_cost`), and what a buffer too large for the allocator to keep costs
  in page faults each time it is allocated (`fresh_pages`; see [Note: fresh pages] in the
  planner);
- each collective (all-to-all, all-reduce, reduce-scatter, all-gather) at a few sizes in fresh
  ranks of each world size, on the backend they will train on, as the sharded modules call it
  (`shardkit.comm`: on gloo a reduce-scatter is an all-to-all and a local sum), fitted to
  ``latency + bytes / bandwidth``. Run under ``torchrun`` on several hosts, the world's own
  ranks are measured as well, as the links between hosts (``scope="inter"``);
- at a world size whose ranks x threads exceed the cores, what a collective waits for its ranks
  to be scheduled (`scheduling_wait`), per extra rank sharing a core: the profile's
  ``switch_wait_ms`` (see [Note: oversubscribed cores] in the planner);
- the sharded step's own overhead: one rank trains a DistributedModelParallel of tiny tables
  (1 and 16 features, batch 128 and 1,024) and what its step takes beyond the fitted kernel is
  fitted to ``per step + per feature + per bag`` (the modules' Python, KJT handling, autograd).

Everything runs with the threads per rank training will use (``threads_per_rank``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shardkit.bench._fit import median_by, spread
from shardkit.bench._kernel_fit import fit_kernels, kernel_line
from shardkit.bench._links import (
    SCHEDULING_WAIT,
    collective_rank,
    fit_links,
    fit_switch_wait,
    measure_collectives,
)
from shardkit.bench._machine import cache_bytes, cores, machine_identity, memory_bytes
from shardkit.bench._overhead import fit_overhead, overhead_rank
from shardkit.bench._timing import best_ms, best_pair
from shardkit.bench._together import kernel_call_ms, together_rank
from shardkit.kernels import steady_heap
from shardkit.launch import RankPool
from shardkit.modules import (
    BatchedTables,
    lookup,
    stack_tables,
)
from shardkit.optim import EmbOptimType, FusedOptimizerConfig
from shardkit.planner import MachineProfile
from shardkit.sharding import bucket_rows

__all__ = [
    "CalibrationConfig",
    "calibrate",
    "format_profile",
]

_MIB = 1 << 20


@dataclass(frozen=True, kw_only=True)
class CalibrationConfig:
    """What ``shardkit bench calibrate`` measures (the defaults take well under a minute).

    Args:
        optimizers: fused rules to time the kernel with (`EmbOptimType` values).
        dims: embedding dims of the kernel points.
        ids: ids per call of the kernel points.
        big_table_bytes: the table far outside the cache (the small one: ids / 4 rows, many
            repeats, inside it); at most 8 times the cache is used.
        miss_sizes: the tables between, as fractions of that big table, timed at the middle
            dim and the most ids, 20 ids per bag, for the miss curve.
        world_sizes: ranks to time the collectives among (each spawned fresh on this host; 1:
            what one rank's collectives, copies of its own bytes, take).
        sizes: collective message sizes, bytes.
        threads_per_rank: intra-op threads each rank trains with.
        repeats: timed repeats per point (the fastest is kept); a sampled point's samples
            split them (at least one each).
        samples: samples of each noisy point, spread over the run (the median is kept).
        copy_bytes: the tensor copied to measure memory bandwidth.
        device: ``"cpu"`` or ``"cuda"``.
    """

    optimizers: tuple[str, ...] = ("exact_row_wise_adagrad", "exact_sgd", "exact_adagrad", "adam")
    dims: tuple[int, ...] = (16, 64, 128)
    ids: tuple[int, ...] = (16_384, 131_072)
    big_table_bytes: int = 256 * _MIB
    # 4, 16, 32, 64, 128 and 256 MiB tables with a 32 MiB last-level cache
    miss_sizes: tuple[float, ...] = (1 / 64, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
    world_sizes: tuple[int, ...] = (1, 2, 4)
    # up to 32 MiB: a step's output distributions reach tens of MiB, past the last-level cache
    sizes: tuple[int, ...] = (16 << 10, 512 << 10, 4 << 20, 32 << 20)
    threads_per_rank: int = 1
    repeats: int = 5
    samples: int = 5
    copy_bytes: int = 128 * _MIB
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("dims", "ids", "sizes", "optimizers"):
            if not getattr(self, name):
                raise ValueError(f"CalibrationConfig.{name} is empty; give at least one value")
        for opt in self.optimizers:
            EmbOptimType.parse(opt)
        bad = [w for w in self.world_sizes if not (isinstance(w, int) and w >= 1)]
        if bad:
            raise ValueError(f"world_sizes must be ints >= 1, got {bad}")
        if self.threads_per_rank < 1 or self.repeats < 1 or self.samples < 1:
            raise ValueError(
                f"threads_per_rank, repeats and samples must be >= 1, got "
                f"{self.threads_per_rank}, {self.repeats} and {self.samples}"
            )
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if not all(0 < f <= 1 for f in self.miss_sizes):
            raise ValueError(
                f"miss_sizes are fractions of the big table, in (0, 1], got {self.miss_sizes}"
            )

    @property
    def sample_repeats(self) -> int:
        """Timed repeats of one sample of a sampled point."""
        return max(1, self.repeats // self.samples)


def memory_bandwidth(config: CalibrationConfig, device: torch.device) -> float:
    """Copy bandwidth, bytes/ms (bytes read plus bytes written)."""
    n = config.copy_bytes // 4
    src = torch.ones(n, device=device)
    dst = torch.empty_like(src)
    ms = best_ms(lambda: dst.copy_(src), config.repeats, device)
    return 2 * n * 4 / ms


# glibc's largest threshold for serving a buffer from memory it keeps (DEFAULT_MMAP_THRESHOLD_MAX
# on 64-bit): a buffer this large or larger (with its header, above the threshold) is mapped
# afresh at each allocation and unmapped when freed.
# Smaller ones are kept or not by its history (it raises the threshold to the largest buffer
# freed so far); a training loop's repeated sizes are mostly kept.
FRESH_BUFFER_BYTES = 32 * _MIB
_FRESH_PROBE_BYTES = 48 * _MIB


def fresh_pages(config: CalibrationConfig, device: torch.device) -> tuple[int, float]:
    """(the smallest buffer that gets fresh pages each time it is allocated, the ms per byte
    those add), or (0, 0.0) where the allocator keeps freed memory (GPUs' caching allocator,
    or a CPU allocator that does): a new 48 MiB buffer written and dropped against a kept one
    written as much, in turns. See [Note: fresh pages]."""
    if device.type != "cpu":
        return 0, 0.0
    n = _FRESH_PROBE_BYTES // 4
    src = torch.ones(n)
    kept = torch.empty(n)
    new, old = best_pair(
        lambda: torch.empty(n).copy_(src), lambda: kept.copy_(src), config.repeats, device
    )
    if new - old < 0.25 * old:  # within a copy's noise: the allocator kept the memory
        return 0, 0.0
    return FRESH_BUFFER_BYTES, (new - old) / _FRESH_PROBE_BYTES


def bucket_cost(config: CalibrationConfig, device: torch.device) -> float:
    """ms per id of the row-wise input distribution's bucketing (`bucket_rows`: each id grouped
    by the shard holding its row, 4 shards of a 100,000-row table): 1,024 bags of 40 ids against
    1,024 bags of 4, so the bags' and the call's cost cancel."""
    rows, bags, shards = 100_000, 1024, 4
    starts = [rows * i // shards for i in range(shards)]
    g = torch.Generator().manual_seed(7)
    times = []
    for pooling in (4, 40):
        lengths = torch.full((bags,), pooling, dtype=torch.int64, device=device)
        ids = torch.randint(0, rows, (bags * pooling,), generator=g).to(device)

        def bucket(ids: torch.Tensor = ids, lengths: torch.Tensor = lengths) -> None:
            bucket_rows(ids, lengths=lengths, weights=None, row_starts=starts)

        times.append(best_ms(bucket, max(5, config.repeats), device))
    return max(0.0, (times[1] - times[0]) / (bags * 36))


def matmul_throughput(config: CalibrationConfig, device: torch.device) -> float:
    """A float32 linear layer's forward and backward (``[1024, 512] -> [1024, 256]``, an MLP
    layer's shape: three matmuls, two of them on transposes), flop/ms."""
    m, k, n = 1024, 512, 256
    x = torch.randn(m, k, device=device, requires_grad=True)
    w = torch.randn(n, k, device=device, requires_grad=True)
    grad = torch.randn(m, n, device=device)

    def layer() -> None:
        (x @ w.t()).backward(grad)

    ms = best_ms(layer, max(3, config.repeats), device)
    return 3 * 2 * m * k * n / ms


def kernel_shapes(config: CalibrationConfig, cache_bytes: int) -> list[tuple]:
    """`kernel_points`' (ids, rows, dim, ids per bag, on the miss curve) in the order timed."""
    big_bytes = min(config.big_table_bytes, 8 * cache_bytes)
    shapes = []
    for d, dim in enumerate(config.dims):
        for i, num_ids in enumerate(config.ids):
            # 20 ids per bag, or 2: bags vary apart from ids, so the fit can tell them apart
            pooling = 20 if (d + i) % 2 == 0 else 2
            for rows in (max(16, num_ids // 4), max(16, big_bytes // (4 * dim))):
                shapes.append((num_ids, rows, dim, pooling, False))
    dim, num_ids = config.dims[len(config.dims) // 2], config.ids[-1]
    for fraction in config.miss_sizes:
        shapes.append((num_ids, max(16, int(big_bytes * fraction) // (4 * dim)), dim, 20, True))
    return shapes


def _kernel_point(
    config: CalibrationConfig,
    optimizer: str,
    device: torch.device,
    num_ids: int,
    rows: int,
    dim: int,
    pooling: int,
    fresh: tuple[int, float],
) -> dict:
    rule = FusedOptimizerConfig(optimizer=EmbOptimType.parse(optimizer), learning_rate=0.01)
    g = torch.Generator().manual_seed(rows * 131 + num_ids)
    tables = stack_tables([rows], dim, dtype=torch.float32, device=device, optimizer=rule)
    tables.weight.uniform_(-0.01, 0.01)
    params = [torch.nn.Parameter(v) for v in tables.table_views()]
    # fresh ids every call: rows a previous call touched would still be in cache
    batches = [
        torch.randint(0, rows, (num_ids,), generator=g).to(device)
        for _ in range(2 * config.repeats + 2)
    ]
    fresh_ids = iter(batches)
    bags = max(1, num_ids // pooling)
    offsets = torch.linspace(0, num_ids, bags + 1).long().to(device)
    grad = torch.full((bags, dim), 1e-3, device=device)

    def forward() -> None:
        with torch.no_grad():
            lookup(tables, next(fresh_ids), offsets, None, params)

    def step() -> None:
        lookup(tables, next(fresh_ids), offsets, None, params).backward(grad)

    fwd, total = best_pair(forward, step, config.repeats, device)
    threshold, cost = fresh
    output = bags * dim * 4
    faults = output * cost if threshold and output >= threshold else 0.0
    return {
        "ids": num_ids, "rows": rows, "unique": int(torch.unique(batches[0]).numel()),
        "bags": bags, "dim": dim, "touched": _touched(tables, bags),
        "forward_ms": max(fwd - faults, 1e-4), "backward_ms": max(total - fwd, 1e-4),
        "fresh_ms": faults,
    }  # fmt: skip


def _touched(tables: BatchedTables, bags: int) -> int:
    """Bytes a kernel call touches: the table, its optimizer state and the pooled rows."""
    state = tables.optimizer.state.values() if tables.optimizer is not None else ()
    weights = tables.weight.numel() * tables.weight.element_size()
    return weights + sum(t.numel() * t.element_size() for t in state) + bags * tables.dim * 4


def calibrate(
    config: CalibrationConfig, *, log: Callable[[str], None] = lambda _: None
) -> MachineProfile | None:
    """Measure this machine (see the module docstring) and return its profile. Under torchrun
    (``WORLD_SIZE`` > 1 in the environment) every rank joins, the world's and each host's
    collectives are measured, and rank 0 returns the profile (the others None)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return _calibrate_world(config, log)
    return _calibrate_host(config, log, [], local_links=True)


def _backend(config: CalibrationConfig) -> str:
    return "nccl" if config.device == "cuda" else "gloo"


def _sampled_collectives(
    config: CalibrationConfig, group: dist.ProcessGroup | None = None
) -> list[dict]:
    """``config.samples`` rounds of every collective at every size among ``group`` (call on
    each of its ranks), rows tagged by round."""
    rows = []
    for k in range(config.samples):
        rows += [
            {**row, "sample": k}
            for row in measure_collectives(config.sizes, config.sample_repeats, group)
        ]
    return rows


def _calibrate_world(
    config: CalibrationConfig, log: Callable[[str], None]
) -> MachineProfile | None:
    """Under torchrun: the world's collectives (between hosts when there are several), each
    host's among its ranks, then rank 0 measures its own host as `calibrate` does alone."""
    from shardkit.launch import init_from_env, shutdown

    info = init_from_env(backend=_backend(config), timeout=900)
    try:
        torch.set_num_threads(config.threads_per_rank)
        world, local = info.world_size, info.local_world_size
        hosts = world // local
        rows = _sampled_collectives(config)
        for row in rows:
            row["scope"] = "inter" if hosts > 1 else "intra"
        if hosts > 1 and local > 1:
            mine, _ = dist.new_subgroups_by_enumeration(
                [list(range(h * local, (h + 1) * local)) for h in range(hosts)]
            )
            for row in _sampled_collectives(config, mine):
                rows.append({**row, "scope": "intra"})
        profile = None
        if info.rank == 0:
            log(f"measured the collectives of {world} ranks in {hosts} host(s) of {local}")
            # inside one host, in fresh ranks
            profile = _calibrate_host(config, log, rows, local_links=local < 2 or hosts == 1)
        dist.barrier()  # the others wait while rank 0 measures its host
        return profile
    finally:
        shutdown()


class _Ranks:
    """The rank processes calibrate samples from over its run, kept up between samples (so
    each sample costs its timing, not a process start): one rank for the step overhead, and
    with ``local_links`` fresh ranks of each of ``config.world_sizes`` for the collectives."""

    def __init__(self, config: CalibrationConfig, local_links: bool) -> None:
        self.config = config
        options = dict(backend=_backend(config), threads_per_rank=config.threads_per_rank,
                       timeout=300)  # fmt: skip
        self.overhead_pool = RankPool(1, **options)  # type: ignore[arg-type]
        worlds = config.world_sizes if local_links else ()
        self.link_pools = [RankPool(w, **options) for w in worlds]  # type: ignore[arg-type]
        # as many ranks as the cores hold, for the kernel run by all at once (none on GPUs)
        at_once = cores() // config.threads_per_rank if config.device == "cpu" else 1
        reuse = [pool for pool in self.link_pools if pool.world_size == at_once]
        self.together_pool = (
            None if at_once < 2 else reuse[0] if reuse else RankPool(at_once, **options)  # type: ignore[arg-type]
        )

    def __enter__(self) -> _Ranks:
        return self

    def __exit__(self, *exc_info: object) -> None:
        for pool in {self.overhead_pool, *self.link_pools, self.together_pool}:
            if pool is not None:
                pool.close()

    def kernels_together(self) -> float | None:
        """The kernel call's time with the host's cores' worth of ranks running it at once
        (their mean), or None where fewer than 2 ranks fit the cores."""
        if self.together_pool is None:
            return None
        args = (self.config.optimizers[0], max(2, self.config.sample_repeats))
        return statistics.mean(self.together_pool.run(together_rank, *args))

    def overhead(self, sample: int) -> list[dict]:
        args = (self.config.threads_per_rank, self.config.repeats, sample)
        return self.overhead_pool.run(overhead_rank, *args)[0]

    def collectives(self, sample: int) -> list[dict]:
        rows: list[dict] = []
        for pool in self.link_pools:
            args = (tuple(self.config.sizes), self.config.sample_repeats, sample)
            rows += [{**row, "scope": "intra"} for row in pool.run(collective_rank, *args)[0]]
        return rows


def _calibrate_host(
    config: CalibrationConfig, log: Callable[[str], None], rows: list[dict], *, local_links: bool
) -> MachineProfile:
    """This host's kernels, memory, matmul and step overhead, with the collectives ``rows``
    (and, with ``local_links``, those of fresh ranks of each of ``config.world_sizes`` on this
    host), the noisy points sampled over the run (see the module docstring)."""
    torch.set_num_threads(config.threads_per_rank)
    device = torch.device(config.device, 0) if config.device == "cuda" else torch.device("cpu")
    if device.type == "cpu":
        # the kernels are timed under the heap a CPU DMP step runs with (it sets the same), so
        # that no trim of glibc's adds page faults here that the step does not pay
        steady_heap()
    started = time.perf_counter()
    nominal = cache_bytes(config.device)
    fresh_bytes, fresh_cost = fresh_pages(config, device)
    if fresh_bytes:
        log(
            f"buffers of {fresh_bytes >> 20} MiB or more get fresh pages each time: "
            f"{fresh_cost * _MIB:.2f} ms per MiB more than writing a buffer already mapped"
        )
    work = [(name, shape) for name in config.optimizers for shape in kernel_shapes(config, nominal)]
    measured: dict[str, list[dict]] = {name: [] for name in config.optimizers}
    scalars: dict[str, list[float]] = {"memory_bw": [], "matmul_flops": [], "bucket_ms_per_id": []}
    steps: list[dict] = []
    rows = list(rows)
    with _Ranks(config, local_links) as ranks:
        for k in range(config.samples):
            # one sample of every noisy point, then the next piece of the kernel's points
            scalars["memory_bw"].append(memory_bandwidth(config, device))
            scalars["matmul_flops"].append(matmul_throughput(config, device))
            scalars["bucket_ms_per_id"].append(bucket_cost(config, device))
            steps += ranks.overhead(k)
            rows += ranks.collectives(k)
            at_once = ranks.kernels_together()
            if at_once is not None:  # [Note: ranks computing at once]
                alone = kernel_call_ms(config.optimizers[0], max(2, config.sample_repeats))
                scalars.setdefault("kernels_together", []).append(max(1.0, at_once / alone))
            piece = work[k * len(work) // config.samples : (k + 1) * len(work) // config.samples]
            for name, (num_ids, table_rows, dim, pooling, curve) in piece:
                point = _kernel_point(
                    config, name, device, num_ids, table_rows, dim, pooling,
                    (fresh_bytes, fresh_cost),
                )  # fmt: skip
                measured[name].append({**point, "curve": curve})
    profile = fit_profile(
        config=config, nominal_cache=nominal, fresh=(fresh_bytes, fresh_cost), kernel_rows=measured,
        collectives=rows, steps=steps, scalars=scalars, log=log,
    )  # fmt: skip
    log(f"calibrated in {time.perf_counter() - started:.1f} s ({config.samples} samples)")
    return profile


def fit_profile(
    *,
    config: CalibrationConfig,
    nominal_cache: int,
    fresh: tuple[int, float],
    kernel_rows: dict[str, list[dict]],
    collectives: list[dict],
    steps: list[dict],
    scalars: dict[str, list[float]],
    log: Callable[[str], None] = lambda _: None,
) -> MachineProfile:
    """The profile of what calibrate measured on this machine: the kernel's points per
    optimizer, the collectives' and scheduling waits' rows, the step overhead's tiny steps
    (rows of one point sampled several times count as their median) and the samples of
    ``memory_bw``, ``matmul_flops`` and ``bucket_ms_per_id`` (their median is kept, their
    spread recorded). Says what it fitted through ``log``."""
    fresh_bytes, fresh_cost = fresh
    rows, nominal, measured = collectives, nominal_cache, kernel_rows
    spreads = {name: spread(values) for name, values in scalars.items()}
    bandwidth, flops, bucketing = (
        statistics.median(scalars[name])
        for name in ("memory_bw", "matmul_flops", "bucket_ms_per_id")
    )
    together = statistics.median(scalars.get("kernels_together") or [1.0])
    log(f"memory copy bandwidth: {bandwidth / 1e6:.2f} GB/s{_over(spreads['memory_bw'], 1e-6)}")
    log(
        f"float32 linear layer, forward and backward: {flops / 1e6:.1f} GFLOP/s"
        f"{_over(spreads['matmul_flops'], 1e-6, '.1f')}"
    )
    log(
        f"row-wise bucketing of the ids: {bucketing * 1e6:.1f} ns per id"
        f"{_over(spreads['bucket_ms_per_id'], 1e6, '.1f')}"
    )
    if "kernels_together" in scalars:
        log(
            f"the kernel with {cores() // config.threads_per_rank} ranks running it at once: "
            f"{together:.2f}x its time alone{_over(spreads['kernels_together'], 1.0)}"
        )
    cache, kernels = fit_kernels(measured, nominal)
    log(f"last-level cache: {nominal >> 20} MiB, of which the kernel sees {cache >> 20} MiB")
    points: dict[str, Any] = {f"kernel:{name}": done for name, done in measured.items()}
    for fit in kernels:
        log(f"kernel {fit.optimizer}: {kernel_line(fit, measured[fit.optimizer], cache)}")
    waits = [r for r in rows if r["kind"] == SCHEDULING_WAIT]
    links = [
        link
        for scope in ("intra", "inter")
        for link in fit_links(
            [r for r in rows if r["scope"] == scope and r["kind"] != SCHEDULING_WAIT],
            scope,
            (fresh_bytes, fresh_cost),
            config.threads_per_rank / cores(),
        )
    ]
    switch_wait = fit_switch_wait(waits)
    spreads.update(_collective_spreads(rows))
    points["collectives"] = rows
    overhead = fit_overhead(steps, kernels[0], links)
    points["step_overhead"] = steps
    tiny = [r["ms"] for r in steps if _same_point(r, steps[0])]  # its smallest model
    spreads["tiny_step_ms"] = spread(tiny)
    log(
        f"sharded step overhead: {overhead[0]:.2f} ms + {overhead[1] * 1e3:.0f} us per feature + "
        f"{overhead[2] * 1e6:.0f} ns per bag + {overhead[3] * 1e9:.0f} ps per bag x column "
        f"(its smallest model's step {statistics.median(tiny):.2f} ms"
        f"{_over(spreads['tiny_step_ms'], 1.0)})"
    )
    for row in median_waits(waits):
        log(
            f"{row['world_size']} ranks on {cores()} cores: each collective waits "
            f"{row['ms']:.2f} ms to be scheduled"
        )
    if waits:
        log(
            f"collective wait per extra rank sharing a core: {switch_wait:.2f} ms"
            f"{_over(spreads.get('switch_wait_ms'), 1.0)}"
        )
    for link in links:
        log(
            f"{link.kind} x {link.world_size} ({link.scope}): {link.latency_ms * 1e3:.0f} us + "
            f"bytes / {link.bytes_per_ms / 1e6:.2f} GB/s"
        )
    profile = MachineProfile(
        identity=tuple(
            {**machine_identity(config.device, _backend(config)), "llc_bytes": str(nominal)}.items()
        ),
        compute_device=config.device,
        backend=_backend(config),
        threads_per_rank=config.threads_per_rank,
        cores=cores(),
        memory_bytes=memory_bytes(config.device),
        cache_bytes=cache,
        memory_bw=bandwidth,
        matmul_flops=flops,
        kernels=tuple(kernels),
        links=tuple(links),
        step_overhead=overhead,
        switch_wait_ms=switch_wait,
        fresh_buffer_bytes=fresh_bytes,
        fresh_page_ms_per_byte=fresh_cost,
        bucket_ms_per_id=bucketing,
        kernels_together=together,
        spread=spreads,
        points=points,
    )
    return profile


def _same_point(row: dict, first: dict) -> bool:
    return all(row[k] == first[k] for k in ("features", "batch", "dim"))


def median_waits(waits: Sequence[dict]) -> list[dict]:
    """The scheduling-wait rows, one per world size (its samples' median)."""
    return median_by(waits, ("world_size", "oversubscription"))


def _collective_spreads(rows: Sequence[dict]) -> dict[str, tuple[float, float, int]]:
    """The spread of what varies most between samples of the collectives: the wait for
    scheduling (per extra rank sharing a core, as `fit_switch_wait` gives it) and each
    link's smallest size (its latency, mostly)."""
    out: dict[str, tuple[float, float, int]] = {}
    waits = [r for r in rows if r["kind"] == SCHEDULING_WAIT]
    per_sample: dict[int, list[dict]] = {}
    for row in waits:
        per_sample.setdefault(row.get("sample", 0), []).append(row)
    if waits:
        out["switch_wait_ms"] = spread([fit_switch_wait(r) for r in per_sample.values()])
    timed = [r for r in rows if r["kind"] != SCHEDULING_WAIT]
    for scope, kind, world in sorted({(r["scope"], r["kind"], r["world_size"]) for r in timed}):
        mine = [
            r for r in timed if (r["scope"], r["kind"], r["world_size"]) == (scope, kind, world)
        ]
        smallest = min(r["bytes"] for r in mine)
        out[f"{kind} x {world} ({scope}) latency_ms"] = spread(
            [r["ms"] for r in mine if r["bytes"] == smallest]
        )
    return out


def _over(samples: tuple[float, float, int] | None, scale: float, fmt: str = ".2f") -> str:
    """`` (low-high over N samples)`` in the unit ``scale`` turns the field into, or ""."""
    if not samples or samples[2] < 2:
        return ""
    low, high, count = samples
    return f" ({low * scale:{fmt}}-{high * scale:{fmt}} over {count} samples)"


def format_profile(profile: MachineProfile) -> str:
    """The profile in a few lines, for people."""
    lines = [f"machine: {profile.name} ({profile.compute_device}, {profile.backend}, "
             f"{profile.threads_per_rank} thread(s) per rank, {profile.cores} cores)"]  # fmt: skip
    sampled = profile.spread
    lines.append(
        f"  memory bandwidth {profile.memory_bw / 1e6:.2f} GB/s"
        f"{_over(sampled.get('memory_bw'), 1e-6)}, matmul "
        f"{profile.matmul_flops / 1e6:.1f} GFLOP/s{_over(sampled.get('matmul_flops'), 1e-6, '.1f')}"
    )
    per_step, per_feature, per_bag, per_value = profile.step_overhead
    lines.append(
        f"  step overhead {per_step:.2f} ms + {per_feature * 1e3:.0f} us per feature + "
        f"{per_bag * 1e6:.0f} ns per bag + {per_value * 1e9:.0f} ps per bag x column"
        + (
            f" (its smallest model's step over {sampled['tiny_step_ms'][2]} samples: "
            f"{sampled['tiny_step_ms'][0]:.2f}-{sampled['tiny_step_ms'][1]:.2f} ms)"
            if "tiny_step_ms" in sampled
            else ""
        )
    )
    for k in profile.kernels:
        lines.append(
            f"  kernel {k.optimizer}: forward {k.forward[0] * 1e3:.0f} us/call + "
            f"{k.forward[2] * 1e9:.0f} ps per id x col ({(k.forward[2] + k.forward[5]) * 1e9:.0f} "
            f"missing the cache); backward {k.backward[0] * 1e3:.0f} us/call + "
            f"{k.backward[1] * 1e6:.1f} ns per id + {k.backward[3] * 1e9:.0f} ps per row x col "
            f"({(k.backward[3] + k.backward[5]) * 1e9:.0f} missing)"
        )
    for link in profile.links:
        lines.append(
            f"  {link.kind} x {link.world_size} ({link.scope}): {link.latency_ms * 1e3:.0f} us + "
            f"bytes / {link.bytes_per_ms / 1e6:.2f} GB/s"
        )
    if profile.fresh_buffer_bytes > 0:
        lines.append(
            f"  buffers of {profile.fresh_buffer_bytes >> 20} MiB or more: fresh pages, "
            f"{profile.fresh_page_ms_per_byte * _MIB:.2f} ms per MiB"
        )
    if profile.bucket_ms_per_id > 0:
        lines.append(
            f"  row-wise bucketing: {profile.bucket_ms_per_id * 1e6:.1f} ns per id"
            f"{_over(sampled.get('bucket_ms_per_id'), 1e6, '.1f')}"
        )
    if profile.kernels_together > 1:
        lines.append(
            f"  the kernel with the host's ranks at once: {profile.kernels_together:.2f}x alone"
            f"{_over(sampled.get('kernels_together'), 1.0)}"
        )
    if profile.switch_wait_ms > 0:
        lines.append(
            f"  ranks beyond the {profile.cores} cores: each collective waits "
            f"{profile.switch_wait_ms:.2f} ms per extra rank sharing a core"
            f"{_over(sampled.get('switch_wait_ms'), 1.0)}"
        )
    return "\n".join(lines)
