"""Step time on clusters one does not have: a profile, a cluster shape, and the planner's plan at
each size (`simulate`).

[Note: simulated scaling]
For each world size ``W`` (8 to 4,096 by default) the simulation plans the tables for ``W`` ranks
in hosts of ``ranks_per_host`` (one host while ``W`` is smaller) with the profile's measured
kernels and dense throughput, and the cluster's links in place of the profile's: inside a host,
``intra_host_bw`` (bus bandwidth per rank, nccl-tests' busbw) and ``intra_host_latency_ms`` per
latency step (the profile's calibrated links where not given); between hosts, ``inter_host_bw``
per rank and ``inter_host_latency_ms`` per step (see [Note: calibrated collective model]). The
planner chooses the layout at each size by predicted step time (see
[Note: choosing by predicted step]), and the prediction of its plan is the point:

- strong scaling: a fixed global batch, ``global_batch / W`` examples per rank;
- weak scaling: a fixed ``batch_size`` per rank.

Assumptions, beyond those of [Note: step-time model]: every host is alike and every rank has
the profile's compute (its kernels, matmul and memory bandwidth measured on one rank of the
calibrated machine) on cores of its own; collectives follow the latency-bandwidth model of [Note: calibrated collective model]
at any size (no tree algorithms, no congestion in the network between hosts, no contention
from other jobs); a per-rank batch too small to keep the device busy runs as fast as the fit
says (the fits' fixed costs per call remain); memory is the planner's model of each rank's
shards and buffers.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardkit.modules import BaseEmbeddingConfig
from shardkit.planner._core import PlannerSettings, make_plan
from shardkit.planner._errors import PlannerError
from shardkit.planner._inputs import HeuristicalStorageReservation, ParameterConstraints, Topology
from shardkit.planner._profile import (
    COLLECTIVE_KINDS,
    LinkFit,
    MachineProfile,
    bus_factor,
    latency_steps,
)
from shardkit.planner._tables import config_sources

__all__ = ["ClusterShape", "ScalingPoint", "Simulation", "simulate", "world_sizes"]


@dataclass(frozen=True, kw_only=True)
class ClusterShape:
    """Hosts of ``ranks_per_host`` ranks and the links between ranks (bytes/ms, ms).

    Args:
        ranks_per_host: ranks (GPUs, or CPU processes) per host.
        inter_host_bw: each rank's bandwidth to other hosts (its share of its host's network),
            bus bandwidth in nccl-tests' sense, bytes/ms; e.g. one 200 Gb/s NIC per GPU:
            ``25e9 / 1e3``.
        inter_host_latency_ms: latency of one step between hosts (one message).
        intra_host_bw, intra_host_latency_ms: the same inside a host (None: the profile's
            calibrated links), e.g. A100 NVLink ~230 GB/s all-reduce busbw: ``230e9 / 1e3``.
        memory_per_rank: bytes of memory for tables per rank (None: the profile's).

    Example::

        ClusterShape(ranks_per_host=8, intra_host_bw=230e6, intra_host_latency_ms=0.01,
                     inter_host_bw=23e6, inter_host_latency_ms=0.02)
    """

    ranks_per_host: int
    inter_host_bw: float
    inter_host_latency_ms: float
    intra_host_bw: float | None = None
    intra_host_latency_ms: float | None = None
    memory_per_rank: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.ranks_per_host, int) and self.ranks_per_host >= 1):
            raise ValueError(f"ranks_per_host must be an int >= 1, got {self.ranks_per_host!r}")
        for name in ("inter_host_bw", "intra_host_bw"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 bytes/ms, got {value}")
        for name in ("inter_host_latency_ms", "intra_host_latency_ms"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ValueError(f"{name} must be >= 0 ms, got {value}")
        if (self.intra_host_bw is None) != (self.intra_host_latency_ms is None):
            raise ValueError(
                "give intra_host_bw and intra_host_latency_ms together, or neither (then the "
                "profile's calibrated links inside a host are used)"
            )

    def apply(self, profile: MachineProfile) -> MachineProfile:
        """``profile`` with this cluster's links (see [Note: simulated scaling])."""
        links = [f for f in profile.links if f.scope == "intra"]
        if self.intra_host_bw is not None:
            assert self.intra_host_latency_ms is not None
            local = max(2, self.ranks_per_host)
            links = _model_links(local, self.intra_host_bw, self.intra_host_latency_ms, "intra")
        links += _model_links(2, self.inter_host_bw, self.inter_host_latency_ms, "inter")
        memory = profile.memory_bytes if self.memory_per_rank is None else self.memory_per_rank
        if self.memory_per_rank is not None and profile.compute_device == "cpu":
            memory = self.memory_per_rank * self.ranks_per_host  # host memory, shared by its ranks
        # every rank computes as the calibrated one did: on cores of its own
        cores = max(profile.cores, self.ranks_per_host * profile.threads_per_rank)
        return replace(profile, links=tuple(links), memory_bytes=memory, cores=cores)


def _model_links(world: int, bus_bw: float, step_latency_ms: float, scope: str) -> list[LinkFit]:
    """LinkFits at ``world`` ranks whose model constants are ``bus_bw`` and the latency."""
    return [
        LinkFit(
            kind,
            world,
            latency_steps(kind, world) * step_latency_ms,
            bus_bw / bus_factor(kind, world),
            scope,
        )
        for kind in COLLECTIVE_KINDS
    ]


@dataclass(frozen=True)
class ScalingPoint:
    """One world size: the plan's predicted step, throughput, memory, what dominates and which
    sharding types it uses (type -> tables); ``error`` when nothing fits."""

    world_size: int
    num_hosts: int
    batch_size: int
    step_ms: float = 0.0
    samples_per_s: float = 0.0
    max_memory: int = 0
    dominant: str = ""
    phases: tuple[tuple[str, float], ...] = ()
    types: tuple[tuple[str, int], ...] = ()
    error: str = ""

    @property
    def layout(self) -> str:
        """The plan's sharding types, most tables first: ``"row_wise x20, table_wise x6"``."""
        return ", ".join(f"{name} x{count}" for name, count in self.types)


@dataclass(frozen=True)
class Simulation:
    """Strong and weak scaling of one model on one cluster shape."""

    strong: tuple[ScalingPoint, ...]
    weak: tuple[ScalingPoint, ...]
    global_batch: int
    batch_size: int
    profile: str

    def changes(self, curve: str) -> list[tuple[int, str, str]]:
        """(world size, layout before, layout from there) where the chosen layout changes."""
        points = [p for p in getattr(self, curve) if not p.error]
        return [
            (b.world_size, a.layout, b.layout)
            for a, b in itertools.pairwise(points)
            if dict(a.types).keys() != dict(b.types).keys()
        ]


def world_sizes(low: int = 8, high: int = 4096) -> list[int]:
    """Powers of two from ``low`` to ``high``."""
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= 2
    return sizes


def simulate(
    tables: Sequence[BaseEmbeddingConfig],
    profile: MachineProfile,
    cluster: ClusterShape,
    *,
    sizes: Sequence[int] | None = None,
    batch_size: int,
    global_batch: int | None = None,
    constraints: Mapping[str, ParameterConstraints] | None = None,
    storage_reservation: HeuristicalStorageReservation | None = None,
    dense_parameters: int = 0,
    dense_flops_per_example: float | None = None,
    fused_params: Mapping[str, Any] | None = None,
) -> Simulation:
    """Plan and predict ``tables`` at each world size. See [Note: simulated scaling].

    Args:
        tables: the tables' configs (one collection).
        profile: the machine each rank is (``shardkit bench calibrate``, or written by hand).
        cluster: hosts and links.
        sizes: world sizes (default 8 to 4,096, powers of two).
        batch_size: examples per rank (weak scaling).
        global_batch: examples per step in all (strong scaling; default ``batch_size`` times
            the smallest size).
        constraints, storage_reservation, dense_parameters, dense_flops_per_example,
            fused_params: as for `plan_tables`.
    """
    sizes = list(sizes or world_sizes())
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be world sizes >= 1, got {sizes}")
    global_batch = global_batch or batch_size * min(sizes)
    ranked = cluster.apply(profile)
    sources = config_sources(
        tables, compute_device=profile.compute_device, module_path="", is_weighted=False,
        fused_params=fused_params,
    )  # fmt: skip

    def point(world: int, batch: int) -> ScalingPoint:
        return _point(
            sources, ranked, cluster, world, batch, constraints, storage_reservation,
            dense_parameters, dense_flops_per_example,
        )  # fmt: skip

    strong = tuple(point(w, global_batch // w) for w in sizes if global_batch // w >= 1)
    weak = tuple(point(w, batch_size) for w in sizes)
    return Simulation(strong, weak, global_batch, batch_size, profile.name)


def _point(
    tables, profile, cluster, world, batch, constraints, reservation, dense_parameters, flops
) -> ScalingPoint:
    local = min(cluster.ranks_per_host, world)
    if world % local:
        return ScalingPoint(world, 0, batch, error=f"{world} ranks do not fill hosts of {local}")
    topology = Topology.from_profile(profile, world_size=world, local_world_size=local)
    settings = PlannerSettings(
        constraints=constraints,
        batch_size=batch,
        storage_reservation=reservation,
        dense_parameters=dense_parameters,
        dense_flops_per_example=flops,
    )
    hosts = world // local
    try:
        stats = make_plan(tables, topology, settings).stats
    except PlannerError as exc:
        return ScalingPoint(world, hosts, batch, error=str(exc).splitlines()[0])
    prediction = stats.prediction
    assert prediction is not None
    counts = collections.Counter(t.sharding_type for t in stats.tables)
    types = tuple(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    return ScalingPoint(
        world_size=world,
        num_hosts=hosts,
        batch_size=batch,
        step_ms=prediction.step_ms,
        samples_per_s=prediction.samples_per_s,
        max_memory=stats.max_memory,
        dominant=prediction.dominant,
        phases=prediction.phases,
        types=types,
    )
