"""The machine's speed points re-sampled after calibration: `MachineSampler` times, at a later
moment, the points of ``shardkit bench calibrate`` whose speed a shared machine changes
(memory copy bandwidth, matmul, the row-wise bucketing, the kernel at its in-cache points, the
sharded step's overhead, the collectives of a world size) by calibrate's own code, and
`resampled_profile` gives the calibrated profile as those samples say the machine runs now.

[Note: re-sampled profile]
A profile is one calibration's view of the machine; on a shared VM the same steps run 1.3-1.6x
apart within an hour (issue 29), so a prediction from a profile taken an hour before the
steps it is checked against mixes the model's error with the machine's drift. The re-sampled
profile keeps everything calibrate fitted (the kernel's coefficients and miss curve, the
cache size, the collectives' fits of the world sizes not re-sampled, the fresh-page cost,
``kernels_together``) and only moves the speeds:

- ``memory_bw``, ``matmul_flops`` and ``bucket_ms_per_id``: the samples' median, in place of
  the calibration's;
- each kernel: its forward and backward coefficients scaled by what its in-cache points take
  now over what calibration measured at the very same points (the profile's ``points``; the
  miss curve's weights are ratios and stay);
- the collectives of each world size re-sampled: their rows in place of calibration's, refitted
  as calibrate fits them (`fit_links`), with the scheduling wait (`fit_switch_wait`);
- the step overhead: refitted (`fit_overhead`) from the tiny models' steps re-sampled, with the
  scaled kernel and the refitted links.

Nothing in it is fitted to the steps being predicted: the samples time calibrate's own probes,
so a re-sampled profile is "the profile calibrate would write if it ran now". Needs a profile
written with its points (every ``shardkit bench calibrate`` profile has them).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from shardkit.bench._calibrate import (
    CalibrationConfig,
    _kernel_point,
    bucket_cost,
    matmul_throughput,
    memory_bandwidth,
)
from shardkit.bench._links import SCHEDULING_WAIT, collective_rank, fit_links, fit_switch_wait
from shardkit.bench._overhead import fit_overhead, overhead_rank
from shardkit.launch import RankPool
from shardkit.planner import KernelFit, MachineProfile

__all__ = ["MachineSampler", "kernel_base_points", "resampled_profile"]


def kernel_base_points(profile: MachineProfile, optimizer: str) -> list[dict]:
    """The in-cache points of ``optimizer``'s kernel that calibration timed (table no larger
    than its ids, not on the miss curve) at the middle dim among them: the points a re-sample
    times again."""
    points = [
        p
        for p in profile.points.get(f"kernel:{optimizer}", ())
        if not p.get("curve") and p["rows"] <= p["ids"]
    ]
    if not points:
        return []
    dims = sorted({p["dim"] for p in points})
    middle = dims[len(dims) // 2]
    return [p for p in points if p["dim"] == middle]


def _scaled(fit: KernelFit, forward: float, backward: float) -> KernelFit:
    return replace(
        fit,
        forward=tuple(c * forward for c in fit.forward),
        backward=tuple(c * backward for c in fit.backward),
    )


def resampled_profile(profile: MachineProfile, samples: Sequence[dict]) -> MachineProfile:
    """``profile`` with its speed points as ``samples`` (from `MachineSampler.sample`) measured
    them; see [Note: re-sampled profile]."""
    if not samples:
        return profile
    if "collectives" not in profile.points or "step_overhead" not in profile.points:
        raise ValueError(
            "resampled_profile needs the profile's calibration points (points['collectives'] "
            "and points['step_overhead']); this profile has none: write it again with "
            "`shardkit bench calibrate`"
        )
    scalars = {
        name: statistics.median(s["scalars"][name] for s in samples)
        for name in samples[0]["scalars"]
    }
    kernels = []
    for fit in profile.kernels:
        base = {
            (p["ids"], p["rows"], p["dim"]): p for p in kernel_base_points(profile, fit.optimizer)
        }
        now = [p for s in samples for p in s["kernels"].get(fit.optimizer, ())]
        ratios = []
        for key in ("forward_ms", "backward_ms"):
            old = [base[(p["ids"], p["rows"], p["dim"])][key] for p in now
                   if (p["ids"], p["rows"], p["dim"]) in base]  # fmt: skip
            new = [p[key] for p in now if (p["ids"], p["rows"], p["dim"]) in base]
            ratios.append(sum(new) / sum(old) if old and sum(old) > 0 else 1.0)
        kernels.append(_scaled(fit, *ratios))
    new_rows = [r for s in samples for r in s["collectives"]]
    worlds = {r["world_size"] for r in new_rows}
    rows = [
        r
        for r in profile.points["collectives"]
        if not (r.get("scope", "intra") == "intra" and r["world_size"] in worlds)
    ] + new_rows
    timed = [r for r in rows if r["kind"] != SCHEDULING_WAIT]
    fresh = (profile.fresh_buffer_bytes, profile.fresh_page_ms_per_byte)
    share = profile.threads_per_rank / profile.cores
    intra = fit_links(
        [r for r in timed if r.get("scope", "intra") == "intra"], "intra", fresh, share
    )
    links = (*intra, *(link for link in profile.links if link.scope == "inter"))
    steps = [r for s in samples for r in s["steps"]] or list(profile.points["step_overhead"])
    overhead = fit_overhead(steps, kernels[0], links)
    return replace(
        profile,
        memory_bw=scalars.get("memory_bw", profile.memory_bw),
        matmul_flops=scalars.get("matmul_flops", profile.matmul_flops),
        bucket_ms_per_id=scalars.get("bucket_ms_per_id", profile.bucket_ms_per_id),
        kernels=tuple(kernels),
        links=links,
        step_overhead=overhead,
        switch_wait_ms=fit_switch_wait([r for r in rows if r["kind"] == SCHEDULING_WAIT]),
        points={**profile.points, "collectives": rows, "step_overhead": steps},
    )


def _collective_sizes(profile: MachineProfile) -> tuple[int, ...]:
    sizes = {int(r["bytes"]) for r in profile.points.get("collectives", ()) if "bytes" in r}
    return tuple(sorted(sizes)) or CalibrationConfig().sizes


class MachineSampler:
    """Re-samples ``profile``'s speed points with calibrate's code and settings (its default
    repeats; the collectives' sizes the profile was calibrated at), keeping the ranks it times
    the step overhead and the collectives in up between samples (`RankPool`s, one per world
    size, started at the first sample of it). Close it (or use it as a context manager).

    Args:
        profile: the calibrated profile (with its points).
        optimizers: the kernels to re-time (default: all the profile has).
        config: calibrate's settings to sample with (default: its defaults).
    """

    def __init__(
        self,
        profile: MachineProfile,
        *,
        optimizers: Sequence[str] | None = None,
        config: CalibrationConfig | None = None,
    ) -> None:
        if profile.compute_device != "cpu":
            raise ValueError(
                f"MachineSampler re-samples CPU profiles; this one is {profile.compute_device!r}"
            )
        self.profile = profile
        self.config = config or CalibrationConfig(threads_per_rank=profile.threads_per_rank)
        self.optimizers = tuple(optimizers or (k.optimizer for k in profile.kernels))
        self.sizes = _collective_sizes(profile)
        self._pools: dict[int, RankPool] = {}
        self._count = 0

    def __enter__(self) -> MachineSampler:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()

    def _pool(self, world: int) -> RankPool:
        if world not in self._pools:
            self._pools[world] = RankPool(
                world, backend="gloo", threads_per_rank=self.config.threads_per_rank, timeout=300
            )
        return self._pools[world]

    def sample(self, world_sizes: Sequence[int] = (1,)) -> dict[str, Any]:
        """One sample of every speed point, with the collectives of ``world_sizes`` (1 is
        always included: the step overhead's fit reads one rank's collectives)."""
        config, device = self.config, torch.device("cpu")
        torch.set_num_threads(config.threads_per_rank)
        k = self._count
        self._count += 1
        out: dict[str, Any] = {
            "scalars": {
                "memory_bw": memory_bandwidth(config, device),
                "matmul_flops": matmul_throughput(config, device),
                "bucket_ms_per_id": bucket_cost(config, device),
            },
            "kernels": {},
            "collectives": [],
        }
        fresh = (self.profile.fresh_buffer_bytes, self.profile.fresh_page_ms_per_byte)
        for name in self.optimizers:
            out["kernels"][name] = [
                _kernel_point(config, name, device, p["ids"], p["rows"], p["dim"],
                              max(1, p["ids"] // p["bags"]), fresh)
                for p in kernel_base_points(self.profile, name)
            ]  # fmt: skip
        (steps,) = self._pool(1).run(overhead_rank, config.threads_per_rank, config.repeats, k)
        out["steps"] = steps
        for world in sorted({1, *world_sizes}):
            rows = self._pool(world).run(collective_rank, self.sizes, config.sample_repeats, k)[0]
            out["collectives"] += [{**row, "scope": "intra"} for row in rows]
        return out
