"""Recompute bench_predict's predictions for the rows of a committed report with this checkout's
model and any profile, beside what those rows measured (no ranks started: seconds).

    python benchmarks/repredict.py benchmarks/results/predict.json --profile P [--world-sizes 4]
    python benchmarks/repredict.py benchmarks/results/predict.json --median-of P1 P2 P3

Prints per row: measured (wall), alone (CPU), the report's prediction, this checkout's, and
both errors; then how many rows each is within 20% of the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    from bench_predict import make_plan

    from shardkit.planner import Topology, load_profile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="a bench_predict .json")
    parser.add_argument("--profile")
    parser.add_argument(
        "--median-of",
        nargs="+",
        metavar="PROFILE",
        help="profiles calibrated on this machine with the same settings, as one: each of "
        "their points taken as the samples of one calibration (their median) and refitted as "
        "calibrate fits its samples",
    )
    parser.add_argument("--world-sizes", nargs="+", type=int)
    parser.add_argument("--cases", nargs="+")
    parser.add_argument(
        "--fresh-pages",
        action="store_true",
        help="a profile written before fresh pages were measured: measure them here (one "
        "thread) and refit its links from its own points as calibrate now does",
    )
    parser.add_argument(
        "--fresh-ms-per-mib",
        type=float,
        help="with --fresh-pages: this cost instead of measuring it here",
    )
    parser.add_argument(
        "--without-fresh-pages",
        action="store_true",
        help="the model before fresh pages were charged: the profile's links refitted from its "
        "points as they were timed, and no fresh-page cost",
    )
    parser.add_argument(
        "--bucket-ns-per-id",
        type=float,
        help="a profile written before the row-wise bucketing was measured: this cost per id",
    )
    parser.add_argument(
        "--kernels-together",
        type=float,
        help="a profile written before it was measured: this kernel slowdown with a host's "
        "ranks computing at once",
    )
    args = parser.parse_args()
    if (args.profile is None) == (args.median_of is None):
        parser.error("give --profile or --median-of")
    profile = _median_profile(args.median_of) if args.median_of else load_profile(args.profile)
    if args.kernels_together is not None:
        from dataclasses import replace

        profile = replace(profile, kernels_together=args.kernels_together)
    if args.bucket_ns_per_id is not None:
        from dataclasses import replace

        profile = replace(profile, bucket_ms_per_id=args.bucket_ns_per_id * 1e-6)
    if args.fresh_pages and args.fresh_ms_per_mib is not None:
        from shardkit.bench._calibrate import FRESH_BUFFER_BYTES

        profile = _refit(profile, FRESH_BUFFER_BYTES, args.fresh_ms_per_mib / (1 << 20))
    elif args.fresh_pages:
        profile = _with_fresh_pages(profile)
    if args.without_fresh_pages:
        profile = _refit(profile, 0, 0.0)
    with open(args.report) as f:
        report = json.load(f)
    print(
        "| case | ranks | type | measured | alone (CPU) | report's pred. | err | now | err | now's phases |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---|")
    within = [0, 0, 0]
    for row in report["rows"]:
        world = row["world"]
        if not row.get("rounds") or (args.world_sizes and world not in args.world_sizes):
            continue
        if args.cases and row["case"] not in args.cases:
            continue
        local = world // row.get("hosts", 1)
        topology = Topology.from_profile(profile, world_size=world, local_world_size=local)
        _, prediction = make_plan(
            row["case"], row["type"], world, topology, report["args"]["batch"]
        )
        measured, alone = min(row["rounds"]), min(row["cpu_rounds"])
        before, now = row["predicted_ms"] / measured - 1, prediction.step_ms / measured - 1
        within = [within[0] + 1, within[1] + (abs(before) <= 0.2), within[2] + (abs(now) <= 0.2)]
        phases = ", ".join(f"{k[:6]} {v:.1f}" for k, v in prediction.phases)
        print(
            f"| {row['case']} | {world} | {row['type']} | {measured:.1f} | {alone:.1f} | "
            f"{row['predicted_ms']:.1f} | {100 * before:+.0f}% | {prediction.step_ms:.1f} | "
            f"{100 * now:+.0f}% | {phases} |"
        )
    print(f"\nwithin 20% of the wall: report {within[1]} of {within[0]}, now {within[2]}")


def _median_profile(paths):
    """The profiles at ``paths`` (calibrated here with the same settings) as one calibration
    whose samples they are: `fit_profile` over their points, each point's median."""
    import statistics

    from shardkit.bench._calibrate import CalibrationConfig, fit_profile
    from shardkit.planner import load_profile

    profiles = [load_profile(p) for p in paths]
    first = profiles[0]
    kernel_rows = {}
    for key in (k for k in first.points if k.startswith("kernel:")):
        runs = [p.points[key] for p in profiles]
        assert len({len(r) for r in runs}) == 1, f"{key}: the profiles timed different points"
        kernel_rows[key.removeprefix("kernel:")] = [
            {**same[0], **{f: statistics.median(r[f] for r in same)
                           for f in ("forward_ms", "backward_ms")}}
            for same in zip(*runs)
        ]  # fmt: skip
    collectives, steps = [], []
    for i, p in enumerate(profiles):
        collectives += [{**r, "sample": i} for r in p.points.get("collectives", [])]
        steps += [{**r, "sample": i} for r in p.points.get("step_overhead", [])]
    scalars = {
        name: [getattr(p, name) for p in profiles]
        for name in ("memory_bw", "matmul_flops", "bucket_ms_per_id")
    }
    fresh = (
        first.fresh_buffer_bytes,
        statistics.median(p.fresh_page_ms_per_byte for p in profiles),
    )
    config = CalibrationConfig(
        threads_per_rank=first.threads_per_rank, device=first.compute_device,
        optimizers=tuple(kernel_rows),
    )  # fmt: skip
    nominal = int(dict(first.identity).get("llc_bytes", first.cache_bytes))
    profile = fit_profile(
        config=config, nominal_cache=nominal, fresh=fresh, kernel_rows=kernel_rows,
        collectives=collectives, steps=steps, scalars=scalars, log=print,
    )  # fmt: skip
    return profile


def _with_fresh_pages(profile):
    """``profile`` with this machine's fresh-page cost and its links refitted without it (see
    [Note: fresh pages])."""
    import torch

    from shardkit.bench._calibrate import CalibrationConfig, fresh_pages

    torch.set_num_threads(profile.threads_per_rank)
    threshold, cost = fresh_pages(CalibrationConfig(), torch.device("cpu"))
    print(f"fresh pages from {threshold >> 20} MiB: {cost * (1 << 20):.3f} ms per MiB")
    return _refit(profile, threshold, cost)


def _refit(profile, threshold: int, cost: float):
    """``profile`` with fresh pages from ``threshold`` bytes at ``cost`` ms per byte (0: none)
    and its links fitted from its own points as calibrate fits them with that cost."""
    from dataclasses import replace

    from shardkit.bench._links import fit_links

    rows = [r for r in profile.points.get("collectives", []) if r["kind"] != "scheduling_wait"]
    links = tuple(
        link
        for scope in ("intra", "inter")
        for link in fit_links(
            [r for r in rows if r["scope"] == scope],
            scope,
            (threshold, cost),
            profile.threads_per_rank / profile.cores,
        )
    )
    return replace(
        profile,
        links=links or profile.links,
        fresh_buffer_bytes=threshold,
        fresh_page_ms_per_byte=cost,
    )


if __name__ == "__main__":
    main()
