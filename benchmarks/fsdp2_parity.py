"""Run examples/fsdp2_titan.py (an FSDP2 program written for torch) on torch's FSDP2 and, after
the import rewrite ``torch.distributed.fsdp`` -> ``shardkit.fsdp``, on shardkit; compare the
gradient norms and losses step by step.

    python benchmarks/fsdp2_parity.py                                  # 2 ranks, 20 steps
    python benchmarks/fsdp2_parity.py --json benchmarks/results/fsdp2_parity.json \\
        --markdown benchmarks/results/fsdp2_parity.md

Each run is ``torchrun --standalone --nproc-per-node N`` on CPU (gloo), one thread per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from shardkit.bench import machine_info, machine_line

PROGRAM = Path(__file__).resolve().parents[1] / "examples" / "fsdp2_titan.py"
REWRITE = ("torch.distributed.fsdp", "shardkit.fsdp")


def run(source: str, nproc: int, steps: int, ckpt_at: int, workdir: Path) -> list[dict]:
    """Run ``source`` under torchrun; rank 0's per-step records."""
    script = workdir / "program.py"
    script.write_text(source)
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [
        str(torchrun), "--standalone", f"--nproc-per-node={nproc}", str(script),
        "--steps", str(steps), "--ckpt-at", str(ckpt_at), "--ckpt-dir", str(workdir / "ckpt"),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return [line for line in lines if "step" in line]


def compare(nproc: int, steps: int, ckpt_at: int) -> dict:
    source = PROGRAM.read_text()
    rewritten = source.replace(*REWRITE)
    assert rewritten != source and "torch.distributed.fsdp" not in rewritten
    with tempfile.TemporaryDirectory() as scratch:
        torch_dir, shardkit_dir = Path(scratch, "torch"), Path(scratch, "shardkit")
        torch_dir.mkdir()
        shardkit_dir.mkdir()
        torch_steps = run(source, nproc, steps, ckpt_at, torch_dir)
        shardkit_steps = run(rewritten, nproc, steps, ckpt_at, shardkit_dir)
    rows = [
        {
            "step": a["step"],
            "torch_loss": a["loss"],
            "shardkit_loss": b["loss"],
            "torch_grad_norm": a["grad_norm"],
            "shardkit_grad_norm": b["grad_norm"],
        }
        for a, b in zip(torch_steps, shardkit_steps)
    ]
    return {
        "command": " ".join(sys.argv),
        "machine": machine_info(),
        "nproc": nproc,
        "steps": steps,
        "ckpt_at": ckpt_at,
        "rows": rows,
        "max_loss_difference": max(abs(r["torch_loss"] - r["shardkit_loss"]) for r in rows),
        "max_grad_norm_difference": max(
            abs(r["torch_grad_norm"] - r["shardkit_grad_norm"]) for r in rows
        ),
    }


def markdown(report: dict) -> str:
    lines = [
        "# An FSDP2 program on torch's FSDP2 and on shardkit",
        "",
        "Written by `benchmarks/fsdp2_parity.py`; the raw numbers are in `fsdp2_parity.json`.",
        "`examples/fsdp2_titan.py` (torchtitan's style: per-block and root `fully_shard`, bf16 "
        "parameters and float32 reduction, AdamW, `clip_grad_norm_(..., 1.0)`, DCP save and load "
        f"after step {report['ckpt_at']}) on {report['nproc']} CPU ranks (gloo), as written and "
        "after the rewrite `torch.distributed.fsdp` -> `shardkit.fsdp`.",
        "",
        f"Command: `{report['command']}`; torch {report['machine']['torch']}, "
        f"{report['machine']['date']}; {machine_line(report['machine'])}.",
        "",
        "| step | loss (torch) | loss (shardkit) | grad norm (torch) | grad norm (shardkit) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['step']} | {row['torch_loss']:.6f} | {row['shardkit_loss']:.6f} | "
            f"{row['torch_grad_norm']:.6f} | {row['shardkit_grad_norm']:.6f} |"
        )
    lines += [
        "",
        f"Largest difference: loss {report['max_loss_difference']:.2e}, gradient norm "
        f"{report['max_grad_norm_difference']:.2e}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--ckpt-at", type=int, default=10)
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--markdown", help="write the table here")
    args = parser.parse_args(argv)
    report = compare(args.nproc, args.steps, args.ckpt_at)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
