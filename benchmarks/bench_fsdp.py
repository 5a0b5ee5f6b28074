"""Step time and peak memory per rank of shardkit's FSDP next to torch's DDP, FSDP1 and fully_shard.

    python benchmarks/bench_fsdp.py                                   # both models, all contenders
    python benchmarks/bench_fsdp.py --model ffn --contenders shardkit-full,torch-fsdp1,torch-fully-shard \
        --rounds 5 --json benchmarks/results/fsdp_ffn.json --markdown benchmarks/results/fsdp_ffn.md
    python benchmarks/bench_fsdp.py --model ffn --contenders shardkit-full,torch-fsdp1 --steps 3
    python benchmarks/bench_fsdp.py --json benchmarks/results/fsdp.json --markdown benchmarks/results/fsdp.md
    python benchmarks/bench_fsdp.py --device cuda --json benchmarks/results/fsdp_cuda.json \
        --markdown benchmarks/results/fsdp_cuda.md                   # 2 GPUs, NCCL

Models (issue 6): ``cnn`` is seed 004's CNN (1.2 M parameters), batch 64 images per rank;
``ffn`` is a stack of 12 feed-forward blocks (LayerNorm, 1024 -> 4096 -> 1024, residual) and a
1024 x 1024 head, 101.8 M parameters, batch 2 x 16 tokens per rank. 2 ranks on gloo, Adam, fp32;
with ``--device cuda``, 2 ranks on NCCL, one GPU each (every contender told its GPU: DDP's
``device_ids``, FSDP1's and shardkit's ``device_id``, fully_shard's model moved there first), the
steps timed after ``torch.cuda.synchronize`` and the peak GPU memory reported beside the RSS.

Every contender runs in fresh rank processes (peak RSS is a high-water mark of the process), all
from the same full-size model built on the CPU from the same seed. Per rank it reports the median
step time of the timed steps (after warm-up), the peak resident set size of the process
(``ru_maxrss``: torch, the model as built, and everything training touches), the resident set
size before the model was built (the process itself), and the bytes of parameters, gradients and
optimizer state the rank holds after a step.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from shardkit.bench import machine_info, machine_line
from shardkit.launch import current, spawn

CONTENDERS = (
    "shardkit-full",
    "shardkit-grad-op",
    "shardkit-no-shard",
    "shardkit-offload",
    "torch-ddp",
    "torch-fsdp1",
    "torch-fully-shard",
)


class Block(nn.Module):
    def __init__(self, dim: int = 1024, hidden: int = 4096) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, dim]
        return x + self.down(F.gelu(self.up(self.norm(x))))


class FFN(nn.Module):
    def __init__(self, depth: int = 12, dim: int = 1024) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Net(nn.Module):
    """Seed 004's CNN; its "blocks" for per-block wrapping are fc1 and the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return F.log_softmax(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))), dim=1)


def build(model_name: str) -> tuple[nn.Module, type[nn.Module] | None, tuple, tuple]:
    """The model, the class whose instances become units, and one rank's batch (input, target)."""
    torch.manual_seed(0)
    if model_name == "ffn":
        return FFN(), Block, (2, 16, 1024), (2, 16, 1024)
    return Net(), nn.Linear, (64, 1, 28, 28), (64,)


def loss_of(model_name: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if model_name == "ffn":
        return F.mse_loss(output, target)
    return F.nll_loss(output, target)


def wrap(
    model: nn.Module, unit_cls: type[nn.Module] | None, contender: str, device: torch.device
) -> nn.Module:
    if contender == "torch-ddp":
        ids = [device] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(model.to(device), device_ids=ids)
    if contender == "torch-fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        return FullyShardedDataParallel(
            model, auto_wrap_policy=ModuleWrapPolicy({unit_cls}), device_id=device
        )
    if contender == "torch-fully-shard":
        from torch.distributed.fsdp import fully_shard

        model.to(device)
        for module in list(model.modules()):
            if isinstance(module, unit_cls):
                fully_shard(module)
        fully_shard(model)
        return model
    from shardkit.fsdp import CPUOffload, FullyShardedDataParallel, ShardingStrategy
    from shardkit.fsdp.wrap import ModuleWrapPolicy

    strategy = {
        "shardkit-full": ShardingStrategy.FULL_SHARD,
        "shardkit-offload": ShardingStrategy.FULL_SHARD,
        "shardkit-grad-op": ShardingStrategy.SHARD_GRAD_OP,
        "shardkit-no-shard": ShardingStrategy.NO_SHARD,
    }[contender]
    return FullyShardedDataParallel(
        model,
        sharding_strategy=strategy,
        auto_wrap_policy=ModuleWrapPolicy({unit_cls}),
        cpu_offload=CPUOffload(offload_params=contender == "shardkit-offload"),
        device_id=device,
    )


def _cpu_s() -> float:
    """CPU seconds this process used (all its threads: compute and gloo's)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _state_mb(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Bytes of parameters, gradients and optimizer state held by this rank (DTensors: the local
    shard)."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()]
    tensors += [v for state in optimizer.state.values() for v in state.values()]
    total = 0
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            total += local.numel() * local.element_size()
    return total / 2**20


def run_rank(
    rank: int, world_size: int, model_name: str, contender: str, warmup: int, steps: int
) -> dict:
    # torch's fully_shard warns that the model's output is a view (the head's [B, T, D] matmul)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    device = current().device  # spawn chose it: cuda:<rank> under NCCL, else the CPU
    before_model_mb = _rss_mb()
    model, unit_cls, input_shape, target_shape = build(model_name)
    model = wrap(model, unit_cls, contender, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(1 + rank)
    x = torch.randn(input_shape, generator=generator)
    if model_name == "ffn":
        y = torch.randn(target_shape, generator=generator)
    else:
        y = torch.randint(0, 10, target_shape, generator=generator)
    x, y = x.to(device), y.to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times, cpu_times = [], []
    for step in range(warmup + steps):
        sync()
        dist.barrier()
        start, cpu_start = time.perf_counter(), _cpu_s()
        optimizer.zero_grad()
        loss_of(model_name, model(x), y).backward()
        optimizer.step()
        sync()
        if step >= warmup:
            times.append(time.perf_counter() - start)
            cpu_times.append(_cpu_s() - cpu_start)
    return {
        "step_s": statistics.median(times),
        "step_s_all": times,
        "cpu_s": statistics.median(cpu_times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "process_rss_mb": before_model_mb,
        "state_mb": _state_mb(model, optimizer),
        "peak_gpu_mb": (
            torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        ),
    }


def measure(
    model_name: str, contender: str, warmup: int, steps: int, device: str, threads: int = 1
) -> list[dict]:
    return spawn(
        run_rank,
        world_size=2,
        args=(model_name, contender, warmup, steps),
        backend="nccl" if device == "cuda" else "gloo",
        timeout=900,
        threads_per_rank=threads,
    )


def environment(device: str = "cpu", threads: int = 1) -> dict:
    import os

    return {
        "device": device,
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cores": os.cpu_count(),
        "threads_per_rank": threads,
        "machine": machine_info(threads=threads),
    }


def _transport(env: dict) -> str:
    if env.get("device") == "cuda":
        return f"NCCL on one {env.get('gpu')} each"
    return "gloo"


def _machine(env: dict) -> str:
    """The report's machine line (reports written before it recorded `machine_info`: the CPU
    name and cores it did record)."""
    if "machine" in env:
        return machine_line(env["machine"])
    return f"{env['cpu']}, {env['cores']} cores, {env['threads_per_rank']} thread(s)"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("cnn", "ffn", "both"), default="both")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeat", "--rounds", type=int, default=1, dest="repeat",
                        help="rounds: runs per contender, interleaved")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: 2 ranks on NCCL, one GPU each")  # fmt: skip
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None, help="write the results file")
    parser.add_argument("--from-json", type=Path, default=None, help="only rewrite --markdown")
    args = parser.parse_args()
    if args.from_json:
        write_markdown(json.loads(args.from_json.read_text()), args.markdown)
        return
    models = ("cnn", "ffn") if args.model == "both" else (args.model,)
    contenders = [c for c in args.contenders.split(",") if c]
    unknown = set(contenders) - set(CONTENDERS)
    if unknown:
        parser.error(f"unknown contenders {sorted(unknown)}; choose from {', '.join(CONTENDERS)}")
    results: dict = {
        "command": "python " + " ".join(sys.argv),
        "environment": environment(args.device, args.threads),
        "repeat": args.repeat,
        "warmup": args.warmup,
        "steps": args.steps,
        "runs": [],
    }
    for model_name in models:
        for repeat in range(args.repeat):
            for contender in contenders:
                ranks = measure(
                    model_name, contender, args.warmup, args.steps, args.device, args.threads
                )
                results["runs"].append(
                    {"model": model_name, "contender": contender, "repeat": repeat, "ranks": ranks}
                )
                print(_line(model_name, contender, ranks), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.markdown:
        write_markdown(results, args.markdown)


def _line(model_name: str, contender: str, ranks: list[dict]) -> str:
    steps = ", ".join(f"{r['step_s']:.3f}" for r in ranks)
    cpu = ", ".join(f"{r['cpu_s']:.3f}" for r in ranks)
    peaks = ", ".join(f"{r['peak_rss_mb'] / 1024:.2f}" for r in ranks)
    base = ", ".join(f"{r['process_rss_mb'] / 1024:.2f}" for r in ranks)
    state = ", ".join(f"{r['state_mb'] / 1024:.3f}" for r in ranks)
    gpu = [r.get("peak_gpu_mb") for r in ranks]
    gpu_text = (
        "" if None in gpu else " | peak GPU " + ", ".join(f"{m / 1024:.2f}" for m in gpu) + " GB"
    )
    return (
        f"{model_name:4s} {contender:18s} step {steps} s (CPU {cpu} s) | peak RSS {peaks} GB | "
        f"process {base} GB | params+grads+Adam {state} GB{gpu_text}"
    )


# ---- the results file ---------------------------------------------------------------------------

LABELS = {
    "shardkit-full": "shardkit FULL_SHARD (per-block units)",
    "shardkit-grad-op": "shardkit SHARD_GRAD_OP",
    "shardkit-no-shard": "shardkit NO_SHARD",
    "shardkit-offload": "shardkit FULL_SHARD + CPUOffload",
    "torch-ddp": "torch DDP",
    "torch-fsdp1": "torch FSDP1 (FULL_SHARD, per-block units)",
    "torch-fully-shard": "torch fully_shard (per block + root)",
}
MODELS = {
    "cnn": "(a) seed 004's CNN, 1.2 M parameters, batch 64 images per rank",
    "ffn": "(b) 12 feed-forward blocks (1024 -> 4096 -> 1024) + head, 101.8 M parameters, "
    "batch 2 x 16 tokens per rank",
}


def summarize(results: dict) -> dict:
    """Per (model, contender): medians over runs of the ranks' worst step time, CPU time and
    peak RSS, the best run's step time, and process/state sizes."""
    table: dict = {}
    for run in results["runs"]:
        key = (run["model"], run["contender"])
        entry = table.setdefault(
            key, {"step": [], "cpu": [], "peak": [], "process": [], "state": []}
        )
        ranks = run["ranks"]
        entry["step"].append(max(r["step_s"] for r in ranks))
        entry["cpu"].append(max(r["cpu_s"] for r in ranks))
        entry["peak"].append(max(r["peak_rss_mb"] for r in ranks) / 1024)
        entry["process"].append(max(r["process_rss_mb"] for r in ranks) / 1024)
        entry["state"].append(max(r["state_mb"] for r in ranks) / 1024)
    return {
        key: {
            "step": statistics.median(v["step"]),
            "step_min": min(v["step"]),
            "step_max": max(v["step"]),
            "cpu": statistics.median(v["cpu"]),
            "cpu_min": min(v["cpu"]),
            "cpu_max": max(v["cpu"]),
            "peak": statistics.median(v["peak"]),
            "process": statistics.median(v["process"]),
            "state": statistics.median(v["state"]),
            "runs": len(v["step"]),
        }
        for key, v in table.items()
    }


def write_markdown(results: dict, path: Path) -> None:
    summary = summarize(results)
    env = results["environment"]
    lines = [
        "# FSDP: shardkit next to torch's DDP, FSDP1 and fully_shard",
        "",
        "Written by `benchmarks/bench_fsdp.py`; the raw numbers are in `fsdp.json` beside it.",
        "",
        f"- command: `{results['command']}`",
        f"- machine: {_machine(env)} per rank, shared with other jobs; {env['platform']}",
        f"- versions: Python {env['python']}, torch {env['torch']}; 2 ranks, "
        f"{_transport(env)}, Adam (lr 1e-4), "
        "float32; every contender starts from the same full model built on the CPU",
        f"- method: each run starts fresh rank processes (peak RSS is a per-process high-water "
        f"mark); {results.get('repeat', 1)} run(s) per contender, interleaved; "
        f"{results.get('warmup', 2)} warm-up and {results.get('steps', 5)} timed steps per run.",
        "  *step* is the median step time of the slower rank, median over runs (the runs' range "
        "in brackets); *CPU* is the CPU seconds one rank process spends per step (all its threads): "
        "the machine's other jobs stretch wall time but hardly CPU time, so CPU compares the work "
        "done. *peak* is the larger rank's `ru_maxrss`, *process* the RSS before the model was "
        "built (torch and the process group), *state* the parameters, gradients and Adam state a "
        "rank holds.",
        "",
    ]
    for model in ("cnn", "ffn"):
        rows = [(c, summary[(model, c)]) for c in CONTENDERS if (model, c) in summary]
        if not rows:
            continue
        reference = summary.get((model, "torch-fsdp1"))
        lines += [f"## {MODELS[model]}", ""]
        lines += [
            "| | step (s) [range] | CPU (s/step) [range] | peak RSS (GiB) | peak / torch FSDP1 | process (GiB) | state (GiB) |",
            "|---|---|---|---|---|---|---|",
        ]
        for contender, row in rows:
            ratio = f"{row['peak'] / reference['peak']:.2f}" if reference else "-"
            lines.append(
                f"| {LABELS[contender]} | {row['step']:.3f} [{row['step_min']:.3f}-"
                f"{row.get('step_max', row['step_min']):.3f}] | {row['cpu']:.3f} "
                f"[{row.get('cpu_min', row['cpu']):.3f}-{row.get('cpu_max', row['cpu']):.3f}] | "
                f"{row['peak']:.2f} | {ratio} | {row['process']:.2f} | "
                f"{row['state']:.3f} |"
            )
        lines.append("")
    lines += _memory_section(summary)
    lines += _targets_section(summary)
    path.write_text("\n".join(lines) + "\n")


def _memory_section(summary: dict) -> list[str]:
    full = summary.get(("ffn", "shardkit-full"))
    if full is None:
        return []
    with torch.device("meta"):
        model = FFN()
    params = sum(p.numel() for p in model.parameters())
    replica = 16 * params / 2**30  # fp32 parameters + gradients + Adam's two moments
    unit = 4 * sum(p.numel() for p in model.blocks[0].parameters()) / 2**30
    n = 2
    working = full["peak"] - full["process"] - full["state"]
    lines = [
        "## Memory per rank, measured, next to ZeRO's formula",
        "",
        f"Model (b): Psi = {params / 1e6:.1f} M parameters; parameters + gradients + Adam = 16 Psi "
        f"bytes = {replica:.2f} GiB per replica; one unit (block) U = {unit * 1024:.0f} MiB of "
        "fp32 parameters; N = 2 ranks.",
        "",
        "| | ZeRO's formula | value here | measured, GiB (state column) |",
        "|---|---|---|---|",
        f"| DDP, NO_SHARD | (4 + 4 + 8) Psi | {replica:.2f} GiB | "
        f"{summary.get(('ffn', 'shardkit-no-shard'), {}).get('state', float('nan')):.2f} |",
        f"| ZeRO-2, SHARD_GRAD_OP | 4 Psi + (4 + 8) Psi / N between steps (all parameters "
        f"gathered from forward to backward) | {replica / n:.2f} GiB + {4 * params / 2**30:.2f} GiB "
        f"in the step | {summary.get(('ffn', 'shardkit-grad-op'), {}).get('state', float('nan')):.2f} |",
        f"| ZeRO-3, FULL_SHARD | (4 + 4 + 8) Psi / N | {replica / n:.2f} GiB | {full['state']:.2f} |",
        "",
        f"Peak RSS of shardkit FULL_SHARD = process + 16 Psi / N + working set = "
        f"{full['process']:.2f} + {full['state']:.2f} + {working:.2f} = {full['peak']:.2f} GiB. "
        f"The working set ({working * 1024:.0f} MB = {working / unit:.1f} U) is what backward "
        "holds at its peak: the unit computing and the prefetched one, the re-gather's buffer, "
        "the unit's full gradients and its reduction buffer, the previous unit's reduction in "
        "flight, activations, and heap the allocator has not handed back yet. The ideal 2-way "
        f"full shard of the issue is process + {replica / n:.2f} GiB + one block.",
        "",
    ]
    return lines


ISSUE_FSDP1_GB = 2.06  # torch FSDP1's peak on (b) as the issue measured it


def _targets_section(summary: dict) -> list[str]:
    ours, torch_fsdp1 = summary.get(("ffn", "shardkit-full")), summary.get(("ffn", "torch-fsdp1"))
    if ours is None or torch_fsdp1 is None:
        return []
    ratio = ours["peak"] / torch_fsdp1["peak"]
    floor = ours["process"] + ours["state"]
    step_ratio = ours["step"] / torch_fsdp1["step"]
    cpu_ratio = ours["cpu"] / torch_fsdp1["cpu"]
    memory_met = "met" if ratio <= 0.7 else "missed"
    speed_met = "met" if step_ratio <= 1.0 else "missed"
    if step_ratio <= 1.0 < cpu_ratio:
        speed_met = "met on wall time, missed on CPU time"
    elif cpu_ratio <= 1.0 < step_ratio:
        speed_met = "met on CPU time, missed on wall time"
    with torch.device("meta"):
        unit = 4 * sum(p.numel() for p in FFN().blocks[0].parameters()) / 2**30
    headroom = 0.7 * torch_fsdp1["peak"] - floor
    fsdp2 = summary.get(("ffn", "torch-fully-shard"))
    fsdp2_row = []
    if fsdp2 is not None:
        wall2, cpu2 = ours["step"] / fsdp2["step"], ours["cpu"] / fsdp2["cpu"]
        fsdp2_row = [
            f"| step time <= torch fully_shard (FSDP2) | {ours['step']:.2f} vs {fsdp2['step']:.2f} "
            f"s wall ({wall2:.2f} x); CPU {ours['cpu']:.2f} vs {fsdp2['cpu']:.2f} s/step "
            f"({cpu2:.2f} x); peak {ours['peak'] / fsdp2['peak']:.2f} x | "
            f"{'met' if max(wall2, cpu2) <= 1.0 else 'missed'} |"
        ]
    return [
        "## The issue's targets on (b)",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| peak RSS per rank <= 0.7 x torch FSDP1 | {ours['peak']:.2f} vs {torch_fsdp1['peak']:.2f} "
        f"GiB: {ratio:.2f} x | {memory_met} |",
        f"| step time <= torch FSDP1 | {ours['step']:.2f} vs {torch_fsdp1['step']:.2f} s wall "
        f"({step_ratio:.2f} x); CPU {ours['cpu']:.2f} vs {torch_fsdp1['cpu']:.2f} s/step "
        f"({cpu_ratio:.2f} x) | {speed_met} |",
        f"| peak RSS no worse than before issue 11 (0.87-0.93 x torch FSDP1) | {ratio:.2f} x | "
        f"{'met' if ratio <= 0.93 else 'missed'} |",
        *fsdp2_row,
        "",
        f"Memory: torch FSDP1 peaks at {torch_fsdp1['peak']:.2f} GiB here, not the "
        f"{ISSUE_FSDP1_GB} GB the issue measured, so 0.7 x is {0.7 * torch_fsdp1['peak']:.2f} GiB, "
        f"while the process ({ours['process']:.2f}) and the shards of parameters, gradients and "
        f"Adam state ({ours['state']:.2f}) alone take {floor:.2f} GiB, "
        + (
            f"which leaves {headroom * 1024:.0f} MiB ({headroom / unit:.1f} U) for everything a "
            "step gathers and allocates"
            if headroom > 0
            else "more than the target itself, before anything is gathered"
        )
        + "; a FULL_SHARD backward holds at least one unit's gathered parameters and "
        f"gradients (2 U = {2 * unit * 1024:.0f} MiB) besides activations and the collectives' "
        "buffers. "
        f"shardkit's peak is {ours['peak'] - floor:.2f} GiB above that floor (torch FSDP1: "
        f"{torch_fsdp1['peak'] - floor:.2f}), and {ours['peak'] / ISSUE_FSDP1_GB:.2f} x the "
        "issue's torch figure.",
        "",
        "Speed: each large parameter whose rows split evenly over the ranks (the blocks' two "
        "weights here) is gathered straight into its place in the unit's unsharded buffer and "
        "its gradient reduce-scattered straight into the shard's gradient buffer (`out=` in "
        "`shardkit.comm`), so no copy between rank order and parameter order remains for them "
        "(only the biases and norms go through one small packed gather); the unsharded "
        "buffers of freed units are handed to the next gather instead of being unmapped and "
        "faulted in again (see [Note: direct parameters] and [Note: unsharded memory pool] in "
        "`shardkit/fsdp`). On gloo both libraries still pay gloo's own copy: its all-gather "
        "receives into a buffer of its own and copies the result out.",
        "",
    ]


if __name__ == "__main__":
    main()
