"""`shardkit plan --simulate` checked where it can be: this machine at 1-4 ranks, two torchrun
"hosts" on this machine, and a published figure (TorchRec's DLRM on 8 x A100).

    python benchmarks/bench_simulate.py --profile profile.json \
        --measured benchmarks/results/predict_ranks_1_2.json benchmarks/results/predict_ranks_4.json \
        --two-hosts benchmarks/results/predict_2hosts.json --two-hosts-profile profile_2hosts.json \
        --out benchmarks/results/simulate.md

1. This machine: the simulation (`simulate`, hosts of 4 ranks, the profile's own links) at 1, 2
   and 4 ranks for each case of bench_predict.py, against the planner's choice measured there
   (``--measured``: bench_predict's JSON reports), beside the planner's own prediction where
   more ranks than cores ran (the simulation gives each rank cores of its own).
2. Two hosts: bench_predict.py run under two ``torchrun --nnodes 2`` agents on this machine
   (``--two-hosts``), against this checkout's prediction of each row (the planner's choice:
   the simulation at 2 ranks in hosts of 1) with the links between hosts that ``shardkit
   bench calibrate`` measured under the same torchrun (``--two-hosts-profile``).
3. A published figure: TorchRec's DLRM example (mlcommons/training,
   recommendation_v2/torchrec_dlrm/README.MD, "Preliminary Training Results") trains on 8 x A100
   40GB (AWS p4d.24xlarge) at 2,048 per GPU, global batch 16,384, at ~1,671,168 records/s: 26
   tables of 128 columns (Criteo 1TB's row counts, one id each), dense arch 13-512-256-128,
   over arch 479-1024-1024-512-256-1, SGD. The profile is `benchmarks/profiles/a100_40gb_p4d.json`,
   written from published numbers only: HBM2 1,555 GB/s, L2 40 MB at ~5 TB/s, TF32 matmul 156
   TFLOPS, NVLink 3 at 300 GB/s per direction (5 us per message), 400 Gb/s of EFA per host
   shared by its 8 GPUs (15 us per message); its kernel coefficients are those bandwidths (4 bytes
   per element read from L2 or HBM, a row read and written in backward, 20/40 us per kernel
   call, 0.1 ns per id to sort). The specs say nothing of the host's Python, so the prediction
   is given twice: with none, and with this machine's measured step overhead (``--profile``).
   Then the strong (16,384 per step) and weak (2,048 per GPU) curves of that cluster, 8 to
   4,096 GPUs, with the plot.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_predict import PLANNER, _constraints, configs, dense_parameters, make_plan

from shardkit.bench import machine_info
from shardkit.modules import EmbeddingBagConfig
from shardkit.planner import ClusterShape, MachineProfile, Topology, load_profile, simulate

PUBLISHED_RECORDS_PER_S = 1_671_168
CRITEO_ROWS = (
    45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10,
    2209, 11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35,
)  # fmt: skip
A100 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles", "a100_40gb_p4d.json")


def dlrm_dense() -> tuple[int, float]:
    """(parameters, forward flops per example) of the DLRM example's dense part."""
    layers = [(13, 512), (512, 256), (256, 128)]  # dense arch
    interaction = 128 + 27 * 26 // 2  # dense output and the pairwise dots of 27 vectors
    layers += [(interaction, 1024), (1024, 1024), (1024, 512), (512, 256), (256, 1)]
    params = sum(i * o + o for i, o in layers)
    flops = 2 * sum(i * o for i, o in layers) + 2 * 27 * 27 * 128
    return params, float(flops)


def _point(profile: MachineProfile, case: str, world: int, per_host: int, inter=None):
    link = inter or profile.link("all_to_all", 2, "intra")
    assert link is not None
    cluster = ClusterShape(
        ranks_per_host=per_host,
        inter_host_bw=link.bus_bytes_per_ms,
        inter_host_latency_ms=link.step_latency_ms,
    )
    result = simulate(
        configs(case), profile, cluster, sizes=[world], batch_size=1024,
        constraints=_constraints(case, None), dense_parameters=dense_parameters(case),
        fused_params={"optimizer": "exact_row_wise_adagrad"},
    )  # fmt: skip
    return result.weak[0]


def this_machine(profile: MachineProfile, measured: dict) -> list[str]:
    cores = profile.cores // profile.threads_per_rank
    lines = [
        "## 1. This machine, one host: simulated vs measured (the planner's choice)",
        "",
        "The simulation gives every rank cores of its own; where more ranks ran than this "
        f"machine's {profile.cores} cores, they shared them, which the prediction (`Topology."
        "from_profile`, the planner's own model, beside) charges and the simulation does not: "
        "those rows' simulated error is the sharing, not a miss.",
        "",
        "| case | ranks | simulated ms | measured ms | error | predicted (cores shared) ms | "
        "its error | simulated layout |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in measured["rows"]:
        if row["type"] != PLANNER or not row.get("rounds"):
            continue
        point = _point(profile, row["case"], row["world"], per_host=4)
        truth = min(row["rounds"])
        topology = Topology.from_profile(profile, world_size=row["world"])
        predicted = make_plan(row["case"], PLANNER, row["world"], topology, 1024)[1].step_ms
        shared = f"{predicted:.1f}" if row["world"] > cores else "-"
        shared_error = f"{100 * (predicted / truth - 1):+.0f}%" if row["world"] > cores else "-"
        lines.append(
            f"| {row['case']} | {row['world']} | {point.step_ms:.1f} | {truth:.1f} | "
            f"{100 * (point.step_ms / truth - 1):+.0f}% | {shared} | {shared_error} | "
            f"{point.layout} |"
        )
    return lines


def two_hosts(profile: MachineProfile, measured: dict) -> list[str]:
    inter = profile.link("all_to_all", 2, "inter")
    lines = [
        "",
        "## 2. Two torchrun hosts on this machine (2 agents x 1 rank, gloo over loopback)",
        "",
        "| case | type | simulated ms | measured ms | error |",
        "|---|---|---:|---:|---:|",
    ]
    for row in measured["rows"]:
        if not row.get("rounds"):
            continue
        truth = min(row["rounds"])
        # this checkout's model, not the prediction stored with the measurement
        topology = Topology.from_profile(profile, world_size=row["world"], local_world_size=1)
        simulated = make_plan(row["case"], row["type"], row["world"], topology, 1024)[1].step_ms
        if row["type"] == PLANNER and inter is not None:
            simulated = _point(profile, row["case"], row["world"], 1, inter).step_ms
        lines.append(
            f"| {row['case']} | {row['type']} | {simulated:.1f} | {truth:.1f} | "
            f"{100 * (simulated / truth - 1):+.0f}% |"
        )
    return lines


def dlrm(host_overhead: tuple[float, float, float], png: str | None) -> list[str]:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=128, num_embeddings=rows,
                           feature_names=[f"f{i}"])
        for i, rows in enumerate(CRITEO_ROWS)
    ]  # fmt: skip
    spec = load_profile(A100)
    params, flops = dlrm_dense()
    inter = spec.link("all_to_all", 2, "inter")
    assert inter is not None
    cluster = ClusterShape(
        ranks_per_host=8,
        inter_host_bw=inter.bus_bytes_per_ms,
        inter_host_latency_ms=inter.step_latency_ms,
    )
    common = dict(
        batch_size=2048, global_batch=16384, dense_parameters=params,
        dense_flops_per_example=flops, fused_params={"optimizer": "exact_sgd"},
    )  # fmt: skip
    lines = [
        "",
        "## 3. A published figure: TorchRec's DLRM on 8 x A100 40GB (p4d), 16,384 per step",
        "",
        f"Dense part: {params:,} parameters, {flops / 1e6:.2f} MFLOP per example forward.",
        "",
        "| profile | predicted step ms | predicted records/s | published records/s | error "
        "| dominant | layout |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for label, profile in (
        ("published specs only", spec),
        ("specs + this machine's step overhead", replace(spec, step_overhead=host_overhead)),
    ):
        point = simulate(tables, profile, cluster, sizes=[8], **common).strong[0]
        error = point.samples_per_s / PUBLISHED_RECORDS_PER_S - 1
        lines.append(
            f"| {label} | {point.step_ms:.2f} | {point.samples_per_s:,.0f} | "
            f"{PUBLISHED_RECORDS_PER_S:,} | {100 * error:+.0f}% | {point.dominant} | "
            f"{point.layout} |"
        )
    curves = simulate(tables, spec, cluster, **common)
    from shardkit.cli._simulate import draw_simulation, format_simulation

    lines += [
        "",
        "Scaling on p4d hosts (specs only):",
        "",
        "```",
        format_simulation(curves, cluster),
        "```",
    ]
    if png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        draw_simulation(curves, png, plt)
        lines += ["", f"![scaling]({os.path.basename(png)})"]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--profile", required=True, help="this machine's (shardkit bench calibrate)"
    )
    parser.add_argument(
        "--measured", nargs="+", help="bench_predict.py's JSON reports (1-4 ranks here)"
    )
    parser.add_argument("--two-hosts", help="bench_predict.py's JSON under 2 torchrun agents")
    parser.add_argument("--two-hosts-profile", help="calibrate's profile under the same torchrun")
    parser.add_argument("--out", help="markdown report (a .png of the DLRM curves beside it)")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    ident = dict(profile.identity)
    lines = [
        "# Simulated step times checked (bench_simulate.py)",
        "",
        "Command: `benchmarks/bench_simulate.py --profile PROFILE --measured "
        f"{' '.join(os.path.basename(m) for m in args.measured or [])} --two-hosts "
        f"{os.path.basename(args.two_hosts or '-')} --two-hosts-profile "
        f"{os.path.basename(args.two_hosts_profile or '-')}` "
        "(`benchmarks/predict_checks.sh simulate`).",
        f"Machine: {ident.get('cpu_model')} ({ident.get('cpu_family_model')}; {ident.get('isa')}), "
        f"{ident.get('cores')} cores, host {machine_info()['host']}.",
        "",
    ]
    if args.measured:
        rows = []
        for path in args.measured:
            with open(path) as f:
                rows += json.load(f)["rows"]
        lines += this_machine(profile, {"rows": rows})
    if args.two_hosts and args.two_hosts_profile:
        with open(args.two_hosts) as f:
            lines += two_hosts(load_profile(args.two_hosts_profile), json.load(f))
    png = os.path.splitext(args.out)[0] + ".png" if args.out else None
    lines += dlrm(profile.step_overhead, png)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
