"""A machine's measured speeds (`MachineProfile`), written by ``shardkit bench calibrate`` and
read by the planner through `Topology.from_profile`: plain data, so planning with a profile stays
a pure function of its inputs (see [Note: the planner is a pure function]).

[Note: calibrated kernel model]
The batched embedding kernel's time on one rank, per call of one shard group (tables stacked
with the same columns and optimizer), is linear in what it touches, with the rows that miss the
last-level cache costing extra:

- forward: ``f0 + f1 * ids + f2 * ids * cols + f3 * bags * cols + m * (f4 * ids + f5 * ids *
  cols)`` ms (a call's fixed cost, the id handling, the rows read, the pooled rows written, and
  what a row read from memory rather than cache adds);
- backward and the fused update: ``b0 + b1 * ids + b2 * ids * cols + b3 * unique * cols + m *
  (b4 * unique + b5 * unique * cols) + b6 * bags * cols`` ms (a call's fixed cost, sorting the
  ids, scattering the output gradient, updating each touched row with its optimizer state, the
  misses, and reading the output gradient).

``m`` weighs what a row read from memory rather than cache adds, by the group's working set
(the tables with their optimizer state and the pooled rows the call writes (forward) or reads
(backward), which pass through the same cache). Its first form, ``m = max(0, 1 - cache_bytes /
working_set)``, is the chance that a row drawn uniformly from the group's tables is not in a
cache of ``cache_bytes`` (the profile's last-level cache): 0 for a call that fits, near 1 for
one many times larger. ``shardkit bench calibrate`` times the kernel at a few points per
optimizer (tables inside and far outside the cache) and fits the coefficients (least squares
on relative error, none negative). What a missed row costs is not that simple between those
two sizes (a table a few times the cache still hits partly in it, prefetchers and pages help
some sizes more than others), so calibration also times the kernel at tables of a few sizes
between (``miss_curve``: per working set, the ``m`` each direction measured there, against
the fitted coefficients) and the prediction interpolates ``m`` between them in log size (see
`KernelFit.miss`). A profile without that curve uses the first form. The working set is the
group's, though the kernel walks a group table by table: each table's own working set matches
the kernel timed alone better, but issue 29's measured steps follow the group's (the rest of a
step evicts what a kernel call leaves in the cache; benchmarks/results/predict_12ranks_miss_curve.md).

The backward also reads the output gradient's rows, one per bag: ``b6 * bags * cols`` (a
profile written before it was fitted has ``b6 = 0``). ``unique`` is the number of
distinct rows a step touches; the planner knows only how many ids a shard gets and how many rows
it holds, so it takes the ids as drawn uniformly: ``unique = rows * (1 - exp(-ids / rows))``
(skewed ids touch fewer rows, mostly cached ones; then the prediction is high).

[Note: calibrated collective model]
A collective of ``n`` bytes (all-to-all: what a rank sends; all-reduce: the tensor;
reduce-scatter: the input; all-gather: the output) over ``W`` ranks takes
``steps(W) * step_latency + n * bus_factor(W) / bus_bw`` ms: the bytes at the bus bandwidth of
nccl-tests (``bus_factor`` is ``2 (W - 1) / W`` for all-reduce and ``(W - 1) / W`` for the
others: what each link carries in a ring, the least any algorithm moves), and a latency that
grows as ``log2 W`` (``steps`` is ``2 ceil(log2 W)`` for all-reduce, ``ceil(log2 W)`` for the
others): what NCCL's trees and recursive halving/doubling reach at scale; a ring's ``W - 1``
steps would give 4,096 GPUs a latency no library has. Calibration fits ``latency + n /
bandwidth`` at each world size it runs; a world size it measured uses its own fit, any other
the fit of the nearest measured size turned into the model's two constants, which hold for any
``W`` on the same links. Across hosts, the bytes that leave a host cross ``inter_host`` links:
see `collective_ms`.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "COLLECTIVE_KINDS",
    "KernelFit",
    "LinkFit",
    "MachineProfile",
    "collective_ms",
    "expected_unique",
    "load_profile",
    "miss_fraction",
]

COLLECTIVE_KINDS = ("all_to_all", "all_reduce", "reduce_scatter", "all_gather")
_SCOPES = ("intra", "inter")
PROFILE_VERSION = 1


def expected_unique(ids: float, rows: int) -> float:
    """Distinct rows ``ids`` uniform draws from ``rows`` rows touch. See
    [Note: calibrated kernel model]."""
    if ids <= 0 or rows <= 0:
        return 0.0
    return rows * -math.expm1(-ids / rows)


def bus_factor(kind: str, world_size: int) -> float:
    """The fraction of a collective's bytes each link carries in a ring (nccl-tests' busbw)."""
    if world_size <= 1:
        return 0.0
    share = (world_size - 1) / world_size
    return 2 * share if kind == "all_reduce" else share


def latency_steps(kind: str, world_size: int) -> int:
    """Latencies a collective over ``world_size`` ranks pays (see
    [Note: calibrated collective model])."""
    if world_size <= 1:
        return 0
    return (2 if kind == "all_reduce" else 1) * math.ceil(math.log2(world_size))


@dataclass(frozen=True)
class KernelFit:
    """The embedding kernel's time for one optimizer (see [Note: calibrated kernel model]).

    Args:
        optimizer: the fused rule, as `EmbOptimType`'s value (``"exact_sgd"``...).
        forward: ``(f0, .., f5)``: ms per call, per id, per id x column, per bag x column, per
            missed id, per missed id x column.
        backward: ``(b0, .., b6)``: ms per call, per id, per id x column, per touched row x
            column, per missed row, per missed row x column, per bag x column (the backward and
            the fused update together); six numbers (a profile before ``b6``) read as ``b6 = 0``.
        miss_curve: ``((working_set_bytes, forward_m, backward_m), ...)``, increasing in size:
            the miss weight ``m`` calibration measured at those working sets (empty: ``m`` from
            the cache size alone, `miss_fraction`).
    """

    optimizer: str
    forward: tuple[float, ...]
    backward: tuple[float, ...]
    miss_curve: tuple[tuple[float, float, float], ...] = ()

    def __post_init__(self) -> None:
        if len(self.backward) == 6:
            object.__setattr__(self, "backward", (*self.backward, 0.0))
        for name, size in (("forward", 6), ("backward", 7)):
            values = tuple(float(v) for v in getattr(self, name))
            if len(values) != size or not all(math.isfinite(v) and v >= 0 for v in values):
                raise ValueError(
                    f"KernelFit({self.optimizer!r}).{name} must be {size} finite numbers >= 0 "
                    f"(see [Note: calibrated kernel model]), got {values}"
                )
            object.__setattr__(self, name, values)
        curve = tuple(tuple(float(v) for v in point) for point in self.miss_curve)
        sizes = [point[0] for point in curve if len(point) == 3]
        if (
            len(sizes) != len(curve)
            or not all(math.isfinite(v) and v >= 0 for point in curve for v in point)
            or any(b <= a for a, b in itertools.pairwise(sizes))
            or (sizes and sizes[0] <= 0)
        ):
            raise ValueError(
                f"KernelFit({self.optimizer!r}).miss_curve must be (bytes, forward m, backward "
                f"m) triples of finite numbers >= 0, bytes > 0 and increasing, got {curve}"
            )
        object.__setattr__(self, "miss_curve", curve)

    def miss(self, working_set: np.ndarray | float, cache_bytes: int) -> tuple[np.ndarray, ...]:
        """(forward m, backward m) at ``working_set`` bytes (arrays of its shape): the curve
        interpolated in log size; below its first size, that size's ``m`` scaled down by the
        working set (none at 0 bytes); beyond its last, that size's ``m`` scaled as
        `miss_fraction` grows. Without a curve, `miss_fraction` for both. See
        [Note: calibrated kernel model]."""
        ws = np.maximum(np.asarray(working_set, dtype=np.float64), 1.0)
        plain = np.where(ws > cache_bytes, 1.0 - cache_bytes / ws, 0.0)
        if not self.miss_curve:
            return plain, plain
        sizes = np.array([p[0] for p in self.miss_curve])
        first, last = sizes[0], sizes[-1]
        at_last = max(1.0 - cache_bytes / last, 1e-9) if last > cache_bytes else 0.0
        growth = np.where(at_last > 0, plain / max(at_last, 1e-9), 1.0)
        out = []
        for column in (1, 2):
            values = np.array([p[column] for p in self.miss_curve])
            m = np.interp(np.log(ws), np.log(sizes), values)
            m = np.where(ws < first, values[0] * ws / first, m)
            m = np.where(ws > last, values[-1] * np.maximum(growth, 1.0), m)
            out.append(m)
        return out[0], out[1]

    def forward_ms(
        self, ids: float, bags: float, cols: int, *, miss: float = 0.0, calls: int = 1
    ) -> float:
        f0, f1, f2, f3, f4, f5 = self.forward
        return (
            calls * f0
            + f1 * ids
            + f2 * ids * cols
            + f3 * bags * cols
            + miss * ids * (f4 + f5 * cols)
        )

    def backward_ms(
        self,
        ids: float,
        unique: float,
        cols: int,
        *,
        miss: float = 0.0,
        calls: int = 1,
        bags: float = 0.0,
    ) -> float:
        b0, b1, b2, b3, b4, b5, b6 = self.backward
        touched = b3 * unique * cols + miss * unique * (b4 + b5 * cols)
        return calls * b0 + b1 * ids + b2 * ids * cols + touched + b6 * bags * cols


def miss_fraction(working_set: float, cache_bytes: int) -> float:
    """Chance that a uniformly drawn row is not in the cache when a kernel call touches
    ``working_set`` bytes (see [Note: calibrated kernel model])."""
    if working_set <= cache_bytes or working_set <= 0:
        return 0.0
    return 1.0 - cache_bytes / working_set


@dataclass(frozen=True)
class LinkFit:
    """One collective's measured time, ``latency_ms + bytes / bytes_per_ms``, among
    ``world_size`` ranks of one host (``scope="intra"``) or spanning hosts (``"inter"``)."""

    kind: str
    world_size: int
    latency_ms: float
    bytes_per_ms: float
    scope: str = "intra"

    def __post_init__(self) -> None:
        if self.kind not in COLLECTIVE_KINDS:
            raise ValueError(
                f"LinkFit.kind must be one of {list(COLLECTIVE_KINDS)}, got {self.kind!r}"
            )
        if self.scope not in _SCOPES:
            raise ValueError(f"LinkFit.scope must be one of {list(_SCOPES)}, got {self.scope!r}")
        if not (isinstance(self.world_size, int) and self.world_size >= 1):
            raise ValueError(f"LinkFit.world_size must be an int >= 1, got {self.world_size!r}")
        if not (self.latency_ms >= 0 and self.bytes_per_ms > 0):
            raise ValueError(
                f"LinkFit({self.kind}, {self.world_size}): latency_ms must be >= 0 and "
                f"bytes_per_ms > 0, got {self.latency_ms} and {self.bytes_per_ms}"
            )

    def ms(self, nbytes: float) -> float:
        return self.latency_ms + nbytes / self.bytes_per_ms

    @property
    def step_latency_ms(self) -> float:
        return self.latency_ms / latency_steps(self.kind, self.world_size)

    @property
    def bus_bytes_per_ms(self) -> float:
        return self.bytes_per_ms * bus_factor(self.kind, self.world_size)


@dataclass(frozen=True, kw_only=True)
class MachineProfile:
    """What ``shardkit bench calibrate`` measured on one machine (one rank's view).

    Args:
        identity: what the machine is (CPU model, family, ISA flags or GPU name; torch and
            backend versions; date), as sorted (key, value) string pairs.
        compute_device: ``"cpu"`` or ``"cuda"``.
        backend: the collectives' backend (``"gloo"``, ``"nccl"``).
        threads_per_rank: intra-op threads each rank ran with.
        cores: CPU cores the machine gave the calibration (ranks x threads beyond this share
            them: compute slows by the ratio).
        memory_bytes: memory of one GPU, or of the host on CPU.
        cache_bytes: the last-level cache tables are read through (L3 on CPUs, L2 on GPUs).
        memory_bw: copy bandwidth of the memory tables live in, bytes/ms (read + write).
        matmul_flops: dense float32 throughput of a linear layer's forward and backward, flop/ms.
        kernels: the embedding kernel per optimizer.
        links: the collectives, per kind, world size and scope.
        step_overhead: what a sharded training step costs beyond its kernels, collectives and
            dense layers (the modules' Python, KJT handling, autograd, the pooled rows'
            copies): ms per step, per feature, per bag and per bag x column of one rank's
            batch.
        switch_wait_ms: what one collective of a step waits, per extra rank sharing a core,
            when the host's ranks x threads exceed its cores: its ranks do not all run at once,
            so a message waits until its receiver is scheduled (see
            [Note: oversubscribed cores]). Calibration measures it when it runs more ranks
            than cores; 0 where it was not measured.
        fresh_buffer_bytes: buffers at least this large get freshly mapped pages every time
            they are allocated (the allocator hands them back to the system when freed: glibc
            does above 32 MiB); 0 where none do (a caching allocator, GPUs). See
            [Note: fresh pages].
        fresh_page_ms_per_byte: what writing such a buffer the first time adds per byte (the
            page faults that map and zero its pages), beyond writing a buffer already mapped.
        bucket_ms_per_id: what grouping one id by the shard that holds its row costs (the
            row-wise input distribution's `shardkit.sharding.bucket_rows`, a counting
            partition over a few shards), ms per id; 0 where it was not measured.
        kernels_together: what the embedding kernel takes when ``min(ranks x threads, cores)``
            ranks of a host run it at once, over what it takes alone (calibrate times a
            memory-bound kernel call in that many ranks together and alone: they share the
            last-level cache and memory bandwidth); 1 where it was not measured or each rank
            has a host of its own. See [Note: ranks computing at once].
        spread: per noisy quantity calibration sampled several times over its run, its
            samples' (lowest, highest, how many): the profile's value is their median (see
            `shardkit.bench.calibrate`); empty in a profile written before it sampled. Keys:
            ``memory_bw``, ``matmul_flops``, ``bucket_ms_per_id``, ``kernels_together`` and
            ``switch_wait_ms`` in the fields' units, ``tiny_step_ms`` (the step overhead's smallest model, ms) and
            ``"<kind> x <world size> (<scope>) latency_ms"`` (its smallest size, ms).
        points: the raw measurements (kept in the file for the record; not compared).

    Example::

        profile = load_profile("profile.json")
        topology = Topology.from_profile(profile, world_size=4)
    """

    identity: tuple[tuple[str, str], ...]
    compute_device: str
    backend: str
    threads_per_rank: int
    cores: int
    memory_bytes: int
    cache_bytes: int
    memory_bw: float
    matmul_flops: float
    kernels: tuple[KernelFit, ...]
    links: tuple[LinkFit, ...]
    step_overhead: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    switch_wait_ms: float = 0.0
    fresh_buffer_bytes: int = 0
    fresh_page_ms_per_byte: float = 0.0
    bucket_ms_per_id: float = 0.0
    kernels_together: float = 1.0
    spread: Mapping[str, tuple[float, float, int]] = field(
        default_factory=dict, compare=False, repr=False
    )
    points: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        spread = {}
        for key, value in dict(self.spread).items():
            low, high, count = value if len(value) == 3 else (math.nan, math.nan, 0)
            if not (math.isfinite(low) and math.isfinite(high) and low <= high and count >= 1):
                raise ValueError(
                    f"MachineProfile.spread[{key!r}] must be (lowest, highest, samples) with "
                    f"lowest <= highest and samples >= 1, got {tuple(value)}"
                )
            spread[str(key)] = (float(low), float(high), int(count))
        object.__setattr__(self, "spread", spread)
        object.__setattr__(
            self, "identity", tuple(sorted((str(k), str(v)) for k, v in self.identity))
        )
        object.__setattr__(self, "kernels", tuple(self.kernels))
        object.__setattr__(self, "links", tuple(self.links))
        overhead = tuple(float(v) for v in self.step_overhead)
        if len(overhead) != 4 or not all(v >= 0 for v in overhead):
            raise ValueError(
                "MachineProfile.step_overhead must be 4 numbers >= 0 (ms per step, per feature, "
                f"per bag, per bag x column), got {self.step_overhead}"
            )
        object.__setattr__(self, "step_overhead", overhead)
        if not (math.isfinite(self.switch_wait_ms) and self.switch_wait_ms >= 0):
            raise ValueError(
                "MachineProfile.switch_wait_ms must be a finite number >= 0 (ms a collective "
                f"waits per extra rank sharing a core), got {self.switch_wait_ms}"
            )
        if not (math.isfinite(self.kernels_together) and self.kernels_together >= 1):
            raise ValueError(
                "MachineProfile.kernels_together must be a finite number >= 1 (the kernel's "
                f"time with a host's ranks at once over alone), got {self.kernels_together}"
            )
        if not (math.isfinite(self.bucket_ms_per_id) and self.bucket_ms_per_id >= 0):
            raise ValueError(
                "MachineProfile.bucket_ms_per_id must be a finite number >= 0 (ms to bucket one "
                f"id by its row's shard), got {self.bucket_ms_per_id}"
            )
        if not (
            isinstance(self.fresh_buffer_bytes, int)
            and self.fresh_buffer_bytes >= 0
            and math.isfinite(self.fresh_page_ms_per_byte)
            and self.fresh_page_ms_per_byte >= 0
        ):
            raise ValueError(
                "MachineProfile.fresh_buffer_bytes must be an int >= 0 and "
                "fresh_page_ms_per_byte a finite number >= 0 (see [Note: fresh pages]), got "
                f"{self.fresh_buffer_bytes!r} and {self.fresh_page_ms_per_byte!r}"
            )
        if self.compute_device not in ("cpu", "cuda"):
            raise ValueError(f"compute_device must be 'cpu' or 'cuda', got {self.compute_device!r}")
        for name in ("memory_bw", "matmul_flops"):
            if not getattr(self, name) > 0:
                raise ValueError(f"MachineProfile.{name} must be > 0, got {getattr(self, name)}")
        if not self.kernels:
            raise ValueError("MachineProfile.kernels is empty: calibrate at least one optimizer")
        for name in ("threads_per_rank", "cores"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise ValueError(
                    f"MachineProfile.{name} must be an int >= 1, got {getattr(self, name)!r}"
                )

    @property
    def name(self) -> str:
        """The machine in a few words (its CPU model or GPU name)."""
        ident = dict(self.identity)
        return ident.get("gpu") or ident.get("cpu_model") or "unknown machine"

    def overhead_ms(self, features: float, bags: float, bag_columns: float) -> float:
        """The sharded step's own cost for a rank's batch of ``features``, ``bags`` and
        ``bag_columns`` (bags x their tables' columns: the pooled values)."""
        per_step, per_feature, per_bag, per_value = self.step_overhead
        return per_step + per_feature * features + per_bag * bags + per_value * bag_columns

    def kernel(self, optimizer: str) -> KernelFit:
        """The fit for ``optimizer``; an optimizer not calibrated takes the calibrated one with
        the most state per row at or below its own (SGD < row-wise Adagrad < Adagrad < Adam)."""
        by_name = {k.optimizer: k for k in self.kernels}
        if optimizer in by_name:
            return by_name[optimizer]
        rank = _STATE_RANK.get(optimizer, 1)
        known = sorted(by_name, key=lambda name: (_STATE_RANK.get(name, 1), name))
        below = [name for name in known if _STATE_RANK.get(name, 1) <= rank]
        return by_name[(below or known)[-1]]

    def oversubscription(self, ranks_per_host: int) -> float:
        """How many ranks share each core: ``ranks x threads / cores`` when that exceeds 1 on a
        CPU host, else 1 (GPUs: each rank has its own device). See
        [Note: oversubscribed cores]."""
        if self.compute_device == "cuda":
            return 1.0
        return max(1.0, ranks_per_host * self.threads_per_rank / self.cores)

    def kernel_slowdown(self, ranks_per_host: int) -> float:
        """What a rank's kernels take over alone when its host's ranks compute at once:
        ``kernels_together`` where 2 or more ranks of a CPU host each have cores of their own
        (ranks x threads within the cores), else 1. See [Note: ranks computing at once]."""
        if (
            self.compute_device == "cuda"
            or ranks_per_host < 2
            or self.oversubscription(ranks_per_host) > 1.0
        ):
            return 1.0
        return self.kernels_together

    def collective_wait_ms(self, ranks_per_host: int) -> float:
        """What each collective of a step waits for its ranks to be scheduled:
        ``switch_wait_ms x (oversubscription - 1)``, 0 on cores that are not shared."""
        return self.switch_wait_ms * (self.oversubscription(ranks_per_host) - 1.0)

    def fresh_page_ms(self, buffers: Sequence[float]) -> float:
        """What the page faults of ``buffers`` (bytes each, allocated once) cost: those at
        least ``fresh_buffer_bytes`` large, at ``fresh_page_ms_per_byte``. See
        [Note: fresh pages]."""
        if self.fresh_buffer_bytes <= 0:
            return 0.0
        big = sum(b for b in buffers if b >= self.fresh_buffer_bytes)
        return big * self.fresh_page_ms_per_byte

    def link(self, kind: str, world_size: int, scope: str = "intra") -> LinkFit | None:
        """The fit measured for (kind, world size, scope), else the nearest world size's of that
        kind and scope, else None."""
        fits = [f for f in self.links if f.kind == kind and f.scope == scope]
        if world_size > 1:  # one rank's "collective" is a copy: no model for more ranks
            fits = [f for f in fits if f.world_size > 1]
        if not fits:
            return None
        return min(fits, key=lambda f: (abs(math.log(f.world_size / world_size)), f.world_size))

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": PROFILE_VERSION,
            "identity": dict(self.identity),
            "compute_device": self.compute_device,
            "backend": self.backend,
            "threads_per_rank": self.threads_per_rank,
            "cores": self.cores,
            "memory_bytes": self.memory_bytes,
            "cache_bytes": self.cache_bytes,
            "memory_bw": self.memory_bw,
            "matmul_flops": self.matmul_flops,
            "step_overhead": list(self.step_overhead),
            "switch_wait_ms": self.switch_wait_ms,
            "fresh_buffer_bytes": self.fresh_buffer_bytes,
            "fresh_page_ms_per_byte": self.fresh_page_ms_per_byte,
            "bucket_ms_per_id": self.bucket_ms_per_id,
            "kernels_together": self.kernels_together,
            "kernels": [
                {
                    "optimizer": k.optimizer,
                    "forward": list(k.forward),
                    "backward": list(k.backward),
                    "miss_curve": [list(p) for p in k.miss_curve],
                }
                for k in self.kernels
            ],
            "links": [
                {
                    "kind": f.kind,
                    "world_size": f.world_size,
                    "scope": f.scope,
                    "latency_ms": f.latency_ms,
                    "bytes_per_ms": f.bytes_per_ms,
                }
                for f in self.links
            ],
            "spread": {key: list(value) for key, value in self.spread.items()},
            "points": dict(self.points),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MachineProfile:
        version = data.get("version")
        if version != PROFILE_VERSION:
            raise ValueError(
                f"profile version {version!r} is not {PROFILE_VERSION}, the one this shardkit "
                "reads; run `shardkit bench calibrate` again"
            )
        try:
            return cls(
                identity=tuple(dict(data["identity"]).items()),
                compute_device=data["compute_device"],
                backend=data["backend"],
                threads_per_rank=int(data["threads_per_rank"]),
                cores=int(data["cores"]),
                memory_bytes=int(data["memory_bytes"]),
                cache_bytes=int(data["cache_bytes"]),
                memory_bw=float(data["memory_bw"]),
                matmul_flops=float(data["matmul_flops"]),
                step_overhead=_four(data.get("step_overhead", (0.0, 0.0, 0.0, 0.0))),
                switch_wait_ms=float(data.get("switch_wait_ms", 0.0)),
                fresh_buffer_bytes=int(data.get("fresh_buffer_bytes", 0)),
                fresh_page_ms_per_byte=float(data.get("fresh_page_ms_per_byte", 0.0)),
                bucket_ms_per_id=float(data.get("bucket_ms_per_id", 0.0)),
                kernels_together=float(data.get("kernels_together", 1.0)),
                kernels=tuple(
                    KernelFit(
                        k["optimizer"],
                        tuple(k["forward"]),
                        tuple(k["backward"]),
                        tuple(tuple(p) for p in k.get("miss_curve", ())),
                    )
                    for k in data["kernels"]
                ),
                links=tuple(
                    LinkFit(
                        f["kind"],
                        int(f["world_size"]),
                        float(f["latency_ms"]),
                        float(f["bytes_per_ms"]),
                        f.get("scope", "intra"),
                    )
                    for f in data.get("links", ())
                ),
                # a profile written before calibrate sampled has none
                spread={k: tuple(v) for k, v in dict(data.get("spread", {})).items()},
                points=dict(data.get("points", {})),
            )
        except KeyError as exc:
            raise ValueError(
                f"profile has no {exc.args[0]!r}; write it with `shardkit bench calibrate`"
            ) from None

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def _four(values: Sequence[float]) -> tuple[float, float, float, float]:
    per_step, per_feature, per_bag, per_value = (float(v) for v in values)
    return per_step, per_feature, per_bag, per_value


def load_profile(path: str | Path) -> MachineProfile:
    """The profile ``shardkit bench calibrate`` wrote at ``path`` (JSON)."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not a profile (invalid JSON: {exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a profile (expected a JSON object)")
    return MachineProfile.from_dict(data)


# Optimizer state per row, in order (for `MachineProfile.kernel`'s fallback).
_STATE_RANK = {
    "exact_sgd": 0,
    "exact_row_wise_adagrad": 1,
    "exact_adagrad": 2,
    "lars_sgd": 2,
    "partial_row_wise_adam": 2,
    "partial_row_wise_lamb": 2,
    "adam": 3,
    "lamb": 3,
}


def collective_ms(
    kind: str,
    nbytes: float,
    *,
    world_size: int,
    local_world_size: int,
    profile: MachineProfile,
) -> float:
    """Milliseconds of one ``kind`` collective of ``nbytes`` among ``world_size`` ranks in hosts
    of ``local_world_size`` (see [Note: calibrated collective model]). One rank's collectives
    (copies of its own bytes) take what calibration measured at world size 1, or nothing.

    Inside one host: the profile's fit for that world size, or the model from the nearest
    measured size. Spanning hosts, the slowest link is a host's exit: the bytes cross the
    profile's ``"inter"`` links (each rank's share of its host's link), at their latency per
    step; an all-to-all sends only the share bound for other hosts over them. One rank alone
    takes no time.
    """
    if world_size <= 1:  # what the backend takes to hand a rank its own bytes, if measured
        alone = profile.link(kind, 1, "intra")
        return alone.ms(nbytes) if alone is not None and alone.world_size == 1 else 0.0
    if world_size <= local_world_size:
        fit = profile.link(kind, world_size, "intra")
        if fit is None:
            raise ValueError(
                f"the profile has no {kind} measurement; run `shardkit bench calibrate` with "
                "--world-sizes 2 or more"
            )
        if fit.world_size == world_size:
            return fit.ms(nbytes)
        steps, factor = latency_steps(kind, world_size), bus_factor(kind, world_size)
        return steps * fit.step_latency_ms + nbytes * factor / fit.bus_bytes_per_ms
    link = profile.link(kind, world_size, "inter")
    if link is None:
        raise ValueError(
            f"planning {world_size} ranks in hosts of {local_world_size} needs the link between "
            "hosts: calibrate under torchrun on 2 or more hosts, or give a cluster shape "
            "(shardkit plan --simulate --cluster)"
        )
    if link.world_size == world_size:
        return link.ms(nbytes)
    intra = profile.link(kind, max(2, local_world_size), "intra")
    steps, factor = latency_steps(kind, world_size), bus_factor(kind, world_size)
    latency = steps * link.step_latency_ms
    wire = nbytes * factor / link.bus_bytes_per_ms
    if kind == "all_to_all" and intra is not None:
        # only the share bound for other hosts crosses their links; the rest stays inside
        outside = (world_size - local_world_size) / (world_size - 1)
        inside = 1 - outside
        wire = max(wire * outside, nbytes * factor * inside / intra.bus_bytes_per_ms)
    return latency + wire
