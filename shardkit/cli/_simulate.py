"""``shardkit plan --simulate``: the planner's plan and predicted step at 8 to 4,096 ranks of a
profiled machine, strong and weak scaling, as a table (and a chart with matplotlib)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shardkit.cli._units import rate, size
from shardkit.planner import (
    ClusterShape,
    HeuristicalStorageReservation,
    MachineProfile,
    ParameterConstraints,
    ScalingPoint,
    Simulation,
    simulate,
)

__all__ = ["add_simulate_arguments", "format_simulation", "run_simulation"]

ASSUMPTIONS = (
    "[Note: simulated scaling] every rank computes as the profiled one did, on cores of its own; "
    "collectives move their bytes at the bus bandwidth and pay log2(ranks) latencies, no congestion "
    "between hosts; the step is bulk-synchronous (each phase waits for its slowest rank), the "
    "DDP all-reduce is not overlapped; ids are uniform over rows. docs/planner.md has the rest."
)


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("simulation (--simulate, needs --profile)")
    group.add_argument(
        "--simulate", action="store_true", help="plan and predict 8 to 4,096 ranks of the profile"
    )
    group.add_argument("--ranks-per-host", type=int, help="default: --local-world-size, else 8")
    group.add_argument("--intra-bw", type=rate, help="bus bandwidth per rank in a host, e.g. 230G")
    group.add_argument("--intra-latency-us", type=float, help="latency of one message in a host")
    group.add_argument(
        "--inter-bw", type=rate, help="bus bandwidth per rank between hosts, e.g. 23G"
    )
    group.add_argument(
        "--inter-latency-us", type=float, help="latency of one message between hosts"
    )
    group.add_argument("--memory-per-rank", type=size, help="memory per rank (default: profile)")
    group.add_argument("--sizes", type=int, nargs="+", help="world sizes (default 8 16 ... 4096)")
    group.add_argument(
        "--global-batch", type=int, help="strong scaling's examples per step (default: batch x 8)"
    )
    group.add_argument("--simulation-json", type=Path, help="write the curves here (JSON)")


def cluster_of(args: argparse.Namespace, profile: MachineProfile) -> ClusterShape:
    """The cluster the flags describe; the links between hosts are the profile's ``"inter"``
    ones (calibrated under torchrun) when the flags do not give them."""
    per_host = args.ranks_per_host or args.local_world_size or 8
    inter_bw, inter_latency = args.inter_bw, args.inter_latency_us
    if inter_bw is None or inter_latency is None:
        measured = profile.link("all_to_all", 2 * per_host, "inter")
        if measured is None:
            raise ValueError(
                "--simulate needs the links between hosts: --inter-bw and --inter-latency-us "
                "(e.g. 23G and 20 for a 200 Gb/s NIC per GPU), or a profile calibrated under "
                "torchrun on 2 or more hosts"
            )
        inter_bw = measured.bus_bytes_per_ms if inter_bw is None else inter_bw
        inter_latency = measured.step_latency_ms * 1e3 if inter_latency is None else inter_latency
    intra_latency = args.intra_latency_us
    if (args.intra_bw is None) != (intra_latency is None):
        raise ValueError("give --intra-bw and --intra-latency-us together, or neither")
    return ClusterShape(
        ranks_per_host=per_host,
        inter_host_bw=inter_bw,
        inter_host_latency_ms=inter_latency / 1e3,
        intra_host_bw=args.intra_bw,
        intra_host_latency_ms=None if intra_latency is None else intra_latency / 1e3,
        memory_per_rank=args.memory_per_rank,
    )


def run_simulation(
    args: argparse.Namespace,
    tables: Sequence[Any],
    constraints: Mapping[str, ParameterConstraints],
    reservation: HeuristicalStorageReservation,
    profile: MachineProfile | None,
    batch_size: int,
    matplotlib: Callable[[], Any],
) -> int:
    """Simulate, print the curves, write the JSON and the chart if asked."""
    if profile is None:
        raise ValueError("--simulate needs --profile (from `shardkit bench calibrate`)")
    cluster = cluster_of(args, profile)
    result = simulate(
        tables,
        profile,
        cluster,
        sizes=args.sizes,
        batch_size=batch_size,
        global_batch=args.global_batch,
        constraints=constraints,
        storage_reservation=reservation,
        dense_parameters=args.dense_params,
        dense_flops_per_example=args.dense_flops,
        fused_params={"optimizer": args.optimizer},
    )
    print(format_simulation(result, cluster))
    if args.simulation_json:
        args.simulation_json.write_text(json.dumps(_as_dict(result), indent=1) + "\n")
        print(f"wrote {args.simulation_json}")
    if args.png:
        draw_simulation(result, args.png, matplotlib())
        print(f"drew {args.png}")
    return 0


def format_simulation(result: Simulation, cluster: ClusterShape) -> str:
    lines = [
        f"simulated on {result.profile}, {cluster.ranks_per_host} ranks per host; "
        f"strong scaling at {result.global_batch} examples per step, weak at "
        f"{result.batch_size} per rank",
    ]
    for curve, title in (("strong", "strong scaling"), ("weak", "weak scaling")):
        lines += ["", title, *_rows(getattr(result, curve))]
        changes = result.changes(curve)
        for world, before, after in changes:
            lines.append(f"  the plan changes at {world} ranks: {before} -> {after}")
        if not changes:
            lines.append("  the plan keeps its sharding types at every size")
    lines += ["", ASSUMPTIONS]
    return "\n".join(lines)


def _rows(points: Sequence[ScalingPoint]) -> list[str]:
    header = ("ranks", "hosts", "batch/rank", "step ms", "samples/s", "memory/rank", "dominant")
    rows = [header]
    for p in points:
        if p.error:
            rows.append((str(p.world_size), str(p.num_hosts), str(p.batch_size), "-", "-", "-",
                         f"does not fit: {p.error[:60]}"))  # fmt: skip
            continue
        rows.append(
            (
                str(p.world_size),
                str(p.num_hosts),
                str(p.batch_size),
                f"{p.step_ms:.4g}",
                f"{p.samples_per_s:,.0f}",
                f"{p.max_memory / 2**30:.2f} GiB",
                f"{p.dominant} ({p.layout})",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return [
        "  " + "  ".join(c.rjust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1] for r in rows
    ]


def _as_dict(result: Simulation) -> dict:
    def point(p: ScalingPoint) -> dict:
        return {
            "world_size": p.world_size, "num_hosts": p.num_hosts, "batch_size": p.batch_size,
            "step_ms": p.step_ms, "samples_per_s": p.samples_per_s, "max_memory": p.max_memory,
            "dominant": p.dominant, "phases": dict(p.phases), "types": dict(p.types),
            "error": p.error,
        }  # fmt: skip

    return {
        "profile": result.profile,
        "global_batch": result.global_batch,
        "batch_size": result.batch_size,
        "strong": [point(p) for p in result.strong],
        "weak": [point(p) for p in result.weak],
    }


def draw_simulation(result: Simulation, path: Path, plt: Any) -> None:
    """Samples/s and step ms against ranks, strong and weak, log-log."""
    fig, (rate, step) = plt.subplots(1, 2, figsize=(12, 4.5))
    for curve, style in (("strong", "o-"), ("weak", "s--")):
        points = [p for p in getattr(result, curve) if not p.error]
        ranks = [p.world_size for p in points]
        rate.plot(ranks, [p.samples_per_s for p in points], style, label=curve)
        step.plot(ranks, [p.step_ms for p in points], style, label=curve)
        for p in points:
            step.annotate(p.dominant, (p.world_size, p.step_ms), fontsize=6, rotation=30)
    for ax, label in ((rate, "samples/s"), (step, "predicted step (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks")
        ax.set_ylabel(label)
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(
        f"{result.profile}: strong ({result.global_batch}/step) and weak "
        f"({result.batch_size}/rank) scaling",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
