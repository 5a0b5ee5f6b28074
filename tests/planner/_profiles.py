"""A machine profile written by hand, with round numbers, so that every predicted millisecond
in the planner's and the CLI's tests is arithmetic anyone can redo (see [Note: step-time model])."""

from __future__ import annotations

from shardkit.planner import COLLECTIVE_KINDS, KernelFit, LinkFit, MachineProfile

LAT, BW = 0.5, 1e6  # every collective at 2 ranks: 0.5 ms + bytes / 1e6 bytes/ms


def profile(
    *, latency: float = LAT, bandwidth: float = BW, cores: int = 4, switch_wait_ms: float = 0.0
) -> MachineProfile:
    return MachineProfile(
        identity=(("cpu_model", "hand-written"), ("torch", "x")),
        compute_device="cpu",
        backend="gloo",
        threads_per_rank=1,
        cores=cores,
        memory_bytes=64 << 30,
        cache_bytes=1 << 40,  # nothing misses: no miss terms in the arithmetic
        memory_bw=1e7,
        matmul_flops=1e9,
        kernels=(KernelFit("exact_sgd", (0.1, 0, 1e-6, 0, 0, 0), (0.2, 1e-5, 0, 0, 0, 0)),),
        links=tuple(LinkFit(kind, 2, latency, bandwidth) for kind in COLLECTIVE_KINDS),
        step_overhead=(1.0, 0.0, 0.0, 0.0),
        switch_wait_ms=switch_wait_ms,
    )
