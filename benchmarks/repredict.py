"""Recompute bench_predict's predictions for the rows of a committed report with this checkout's
model and any profile, beside what those rows measured (no ranks started: seconds).

    python benchmarks/repredict.py benchmarks/results/predict.json --profile P [--world-sizes 4]

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
    parser.add_argument("--profile", required=True)
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
    args = parser.parse_args()
    profile = load_profile(args.profile)
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
