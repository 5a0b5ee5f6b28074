"""One TorchRec program, unchanged, on TorchRec and on shardkit: DMP step times side by side.

    ~/.cache/shardkit-peers/venv/bin/python benchmarks/bench_dmp_as_written.py \
        --out benchmarks/results/dmp_as_written.md

``dmp_as_written.py`` is written against TorchRec's API only, as its users write one (fused
optimizer through the sharder's ``fused_params``, ``construct_module_sharding_plan`` or the
planner with ``ParameterConstraints``, ``CombinedOptimizer``, ``TrainPipelineSparseDist``). This
runs it under ``torchrun`` on TorchRec + FBGEMM and under ``shardkit run`` (its ``torchrec``
imports resolving to shardkit), with the same Python and torch, 2 ranks x 1 thread, for each
sharding type and loop, the two libraries taking turns in each round (fresh processes every
run). bench_dmp.py measures the same model with each library's own set-up code; this one
measures what a TorchRec user gets by changing only the launcher. Both libraries' first losses
are printed beside the times: alike, not equal (each library initialises its shards from its own
random stream; tests/programs/ checks equal figures from equal weights).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAM = HERE / "dmp_as_written.py"
TYPES = ["table_wise", "row_wise", "column_wise", "table_row_wise", "data_parallel"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_once(library: str, case: tuple[str, str, str], args, scratch: Path) -> dict:
    kind, loop, optimizer = case
    out = scratch / f"{library}_{kind}_{loop}_{optimizer}.json"
    program = [str(PROGRAM), str(out), "--type", kind, "--loop", loop, "--plan", args.plan,
               "--optimizer", optimizer, "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--rows", str(args.rows), "--batch", str(args.batch)]  # fmt: skip
    if library == "torchrec":
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                    str(args.world_size), "--master-port", str(_port())]  # fmt: skip
    else:
        launcher = [
            sys.executable,
            "-m",
            "shardkit",
            "run",
            "--nproc-per-node",
            str(args.world_size),
        ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        launcher + program, capture_output=True, text=True, timeout=900, cwd=scratch, env=env
    )
    if done.returncode != 0:
        tail = " / ".join(done.stderr.strip().splitlines()[-3:])[-300:]
        try:  # rank 0 writes its figures after the last step, before the processes exit
            got = json.loads(out.read_text())
        except (OSError, ValueError):
            return {"failed": tail}
        # Every step ran and was timed; the launcher then saw a rank die on the way out (torch's
        # gloo-at-exit abort, `shardkit.comm.watch_torch_collectives`): kept, and said so
        return {**got, "exit_abort": tail}
    return json.loads(out.read_text())


def ms(runs: list[dict]) -> str:
    medians = [r["median_ms"] for r in runs]
    return f"{statistics.median(medians):.1f} ({min(medians):.1f}-{max(medians):.1f})"


def render(results: dict, args, machine: str) -> str:
    lines = [
        "# One TorchRec program, unchanged, on TorchRec and on shardkit (bench_dmp_as_written.py)",
        "",
        f"`benchmarks/dmp_as_written.py` (TorchRec's API only): 8 tables x {args.rows:,} x 64, batch "
        f"{args.batch:,} per rank, ~20 ids per bag, MLP 512-256-1, BCE; tables fused ({', '.join(args.optimizers)}) "
        f"through `fused_params`, Adam for the rest through `CombinedOptimizer`; plan: `{args.plan}`. "
        f"{args.world_size} ranks x 1 thread on gloo; `torchrun` (TorchRec 1.8 + FBGEMM) against "
        f"`shardkit run` (the same file), same Python and torch; {args.rounds} round(s), the two "
        f"taking turns, fresh processes each run; {args.warmup} warm-up + {args.steps} timed steps. "
        "ms: median over the timed steps of the slower rank's step (quartiles over all rounds' "
        "steps pooled: the medians of each round); CPU: the median CPU ms per step of the busier "
        "rank. ratio: shardkit / TorchRec (< 1 is faster), per round.",
        "",
        f"Machine: {machine}",
        "",
        "| type | loop | optimizer | TorchRec ms | shardkit ms | wall ratio (rounds) | CPU ratio (rounds) | first loss (TorchRec / shardkit) |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    exits: list[str] = []
    for case, runs in results.items():
        kind, loop, optimizer = case
        theirs, ours = runs["torchrec"], runs["shardkit"]
        failed = [r["failed"] for r in theirs + ours if "failed" in r]
        if not theirs and not failed:  # TorchRec not installed: shardkit's times alone
            lines.append(f"| {kind} | {loop} | {optimizer} | - | {ms(ours)} | - | - | - |")
            continue
        if failed:
            lines.append(f"| {kind} | {loop} | {optimizer} | - | - | - | - | failed: {failed[0]} |")
            continue
        walls = [o["median_ms"] / t["median_ms"] for o, t in zip(ours, theirs)]
        cpus = [max(o["cpu_ms_per_rank"]) / max(t["cpu_ms_per_rank"]) for o, t in zip(ours, theirs)]

        def spread(xs: list[float]) -> str:  # the median in bold where shardkit is slower
            median = f"{statistics.median(xs):.2f}"
            shown = f"**{median}**" if statistics.median(xs) > 1 else median
            return f"{shown} ({min(xs):.2f}-{max(xs):.2f})"

        lines.append(
            f"| {kind} | {loop} | {optimizer} | {ms(theirs)} | {ms(ours)} | {spread(walls)} | "
            f"{spread(cpus)} | {theirs[0]['losses'][0]:.4f} / {ours[0]['losses'][0]:.4f} |"
        )  # fmt: skip
        for library, runs_of in (("TorchRec", theirs), ("shardkit", ours)):
            aborted = [r["exit_abort"] for r in runs_of if "exit_abort" in r]
            if aborted:
                exits.append(
                    f"- {kind} {loop} {optimizer}: {library}'s run finished its steps and wrote its "
                    f"figures, then a rank aborted at exit in {len(aborted)} of {len(runs_of)} "
                    f"round(s) ({aborted[0]})"
                )
    lines += per_round(results)
    if exits:
        lines += ["", "Runs kept though a process aborted after the last step:", *exits]
    return "\n".join(lines) + "\n"


def per_round(results: dict) -> list[str]:
    """Each round's pair of step times (wall and CPU), in the order run: the row's spread says
    how far the rounds differ, this says whether the two libraries moved together (the machine
    changed between rounds: both slower in the same round) or one alone (a state of that
    library's run). The medians above pool the rounds and hide which."""
    rows, rounds = [], 0
    for (kind, loop, optimizer), runs in results.items():
        theirs, ours = runs["torchrec"], runs["shardkit"]
        if not theirs or any("failed" in r for r in theirs + ours):
            continue
        cells = [
            f"{t['median_ms']:.1f} / {o['median_ms']:.1f} ({o['median_ms'] / t['median_ms']:.2f}); "
            f"CPU {max(t['cpu_ms_per_rank']):.1f} / {max(o['cpu_ms_per_rank']):.1f}"
            for t, o in zip(theirs, ours)
        ]
        rows.append(f"| {kind} | {loop} | {optimizer} | " + " | ".join(cells) + " |")
        rounds = max(rounds, len(cells))
    if not rows:
        return []
    return [
        "",
        "Per round, in the order run: wall ms TorchRec / shardkit (ratio); CPU ms of the busier "
        "rank. Both slower in the same round is the machine; one alone is that library's run.",
        "",
        "| type | loop | optimizer | " + " | ".join(f"round {k + 1}" for k in range(rounds)) + " |",
        "|---|---|---|" + "---:|" * rounds,
        *rows,
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--types", nargs="+", choices=TYPES, default=TYPES)
    parser.add_argument(
        "--loops", nargs="+", choices=["plain", "pipeline"], default=["plain", "pipeline"]
    )
    parser.add_argument(
        "--optimizers", nargs="+", choices=["rowwise_adagrad", "sgd"], default=["rowwise_adagrad"]
    )
    parser.add_argument("--plan", choices=["constructed", "planner"], default="constructed")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rows", type=int, default=100_000, help="rows per table")
    parser.add_argument("--batch", type=int, default=1024, help="per rank")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    from shardkit.bench import machine_info, machine_line

    machine = machine_info(threads=1)
    try:
        import torchrec  # noqa: F401  (the real one: this process has no import aliases)

        libraries = ["torchrec", "shardkit"]
    except ImportError:
        print("torchrec is not importable here: shardkit's side only", flush=True)
        libraries = ["shardkit"]
    cases = [(k, lp, o) for o in args.optimizers for k in args.types for lp in args.loops]
    results: dict = {case: {"torchrec": [], "shardkit": []} for case in cases}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            for case in cases:
                order = libraries if round_ % 2 == 0 else libraries[::-1]
                for library in order:
                    got = run_once(library, case, args, Path(scratch))
                    results[case][library].append(got)
                    shown = (
                        got.get("failed")
                        or f"{got['median_ms']:.1f} ms, CPU {max(got['cpu_ms_per_rank']):.1f} ms"
                    )
                    print(
                        f"round {round_ + 1}: {' '.join(case):40s} {library:9s} {shown}", flush=True
                    )
    report = render(results, args, machine_line(machine))
    print(report)
    if args.out:
        Path(args.out).write_text(report)
        Path(args.out).with_suffix(".json").write_text(
            json.dumps(
                {
                    "machine": machine,
                    "results": [{"case": list(case), **runs} for case, runs in results.items()],
                },
                indent=1,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
