"""bench_dmp.py's report: step times per (sharding type, library, loop), the ratio table (each
loop kind against the same loop kind), and a chart when matplotlib is importable."""

from __future__ import annotations

import statistics
from typing import Any

from shardkit.bench import machine_line

LOOPS = ("plain", "pipeline", "compiled")
DEFAULT_LOOPS = ("plain", "pipeline")  # "compiled" on request: each turn compiles (seconds)
LIBRARIES = ("shardkit", "torchrec")


def summarize(
    times: dict[tuple, list[float]], failed: dict[tuple, str], types: list[str]
) -> dict[str, list]:
    """``times[(type, library, loop)]``: ms per round (round k of every contender ran in turn).

    Returns ``rows`` (one per contender: median, rounds) and ``ratios`` (one per type and loop:
    shardkit / torchrec of the medians, and the range of the per-round ratios).
    """
    rows, ratios = [], []
    for kind in types:
        for loop in LOOPS:
            for library in LIBRARIES:
                key = (kind, library, loop)
                row = {"type": kind, "library": library, "loop": loop}
                if key in failed:
                    row["skipped"] = failed[key]
                elif key in times:
                    row["ms_per_step"] = statistics.median(times[key])
                    row["ms_rounds"] = times[key]
                else:
                    continue
                rows.append(row)
            ours, theirs = times.get((kind, "shardkit", loop)), times.get((kind, "torchrec", loop))
            if ours and theirs:
                per_round = [a / b for a, b in zip(ours, theirs)]
                ratios.append(
                    {
                        "type": kind,
                        "loop": loop,
                        "ratio": statistics.median(ours) / statistics.median(theirs),
                        "ratio_rounds": per_round,
                    }
                )
    return {"rows": rows, "ratios": ratios, "compiled": _compiled_ratios(times, types)}


def _compiled_ratios(times: dict[tuple, list[float]], types: list[str]) -> list[dict]:
    """Per type and library: the compiled step against the same library's plain (eager) one,
    round by round (both ran in the same round, in turn)."""
    ratios = []
    for kind in types:
        for library in LIBRARIES:
            compiled, eager = (
                times.get((kind, library, "compiled")),
                times.get((kind, library, "plain")),
            )
            if compiled and eager:
                ratios.append(
                    {
                        "type": kind,
                        "library": library,
                        "ratio": statistics.median(compiled) / statistics.median(eager),
                        "ratio_rounds": [a / b for a, b in zip(compiled, eager)],
                    }
                )
    return ratios


def render(report: dict[str, Any]) -> str:
    args = report["args"]
    lines = [
        "# DistributedModelParallel training step (bench_dmp.py)",
        "",
        f"{args['world_size']} ranks on gloo, **{args['threads']} thread(s) per rank**, "
        f"{args['tables']} tables x {args['rows']:,} x {args['dim']}, batch {args['batch']} per "
        f"rank, ~{args['ids_per_bag']} ids per bag, MLP {args['tables'] * args['dim']}-256-1, BCE, "
        "Adam for the MLP; tables: fused row-wise Adagrad, or fused SGD in the rows marked "
        "(sgd). Data-parallel tables (*data_parallel*): planned DENSE by each library's planner "
        "(dense gradients, stepped by torch's Adagrad or SGD after the backward), shardkit's "
        "DENSE path against TorchRec's; *data_parallel_fused*, a second row: shardkit's FUSED "
        "replicas (only the rows a batch touched exchanged and updated, with exact Adagrad or "
        "SGD: the same trained weights) against TorchRec's DENSE tables. *column_wise*: each "
        "planner's own column blocks (shardkit: 2 x 32 columns per table, as the seed "
        "tutorial; TorchRec 1.8: one 64-column shard, its blocks being 128 wide); "
        "*column_wise_32*: min_partition=32 in both, 2 x 32 on both sides. Each "
        f"contender: median of {args['iters']} steps (the slower rank's) after {args['warmup']} "
        f"warm-up, in fresh processes; contenders take turns in {args['rounds']} round(s). "
        "*plain*: zero_grad, forward, backward, step; *pipeline*: each library's "
        "`TrainPipelineSparseDist.progress`. Each loop is compared with the same loop of the "
        "other library, never the better of the two. *compiled*: the plain loop with the DMP "
        "model under `torch.compile(dmp, dynamic=True)` (Inductor), compiled in the warm-up.",
        f"Machine: {machine_line(report['machine'])} (the .json has the rest).",
        "",
    ]
    lines += _ratio_table("shardkit / TorchRec, wall time per step (< 1 is faster)", report)
    if "cpu" in report:
        lines += _ratio_table(
            "shardkit / TorchRec, CPU time per step of all ranks (< 1 is less work)", report["cpu"]
        )
    if report.get("compiled"):
        lines += _compiled_table(report["compiled"])
    lines += _times_table("Step times (wall ms, the slower rank)", report)
    if "cpu" in report:
        lines += _times_table("CPU ms per step, all ranks' processes", report["cpu"])
    return "\n".join(lines) + "\n"


def _compiled_table(ratios: list[dict]) -> list[str]:
    lines = ["", "## compiled / eager (plain loop), each library, wall time per step", ""]
    lines += ["| sharding type | library | compiled / eager | rounds |", "|---|---|---:|---|"]
    for r in ratios:
        rounds = ", ".join(f"{x:.2f}" for x in r["ratio_rounds"])
        lines.append(f"| {r['type']} | {r['library']} | {r['ratio']:.2f} | {rounds} |")
    return lines


def _ratio_table(title: str, summary: dict[str, Any]) -> list[str]:
    ran = [loop for loop in LOOPS if any(r["loop"] == loop for r in summary["rows"])]
    ran = ran or list(DEFAULT_LOOPS)
    names = {"plain": "plain loop", "pipeline": "pipeline", "compiled": "compiled"}
    lines = ["", f"## {title}", "", "| sharding type | " + " | ".join(names[x] for x in ran) + " |"]
    lines.append("|---|" + "---:|" * len(ran))
    by_key = {(r["type"], r["loop"]): r for r in summary["ratios"]}
    for kind in dict.fromkeys(r["type"] for r in summary["rows"] if r["type"] != "-"):
        cells = [kind]
        for loop in ran:
            r = by_key.get((kind, loop))
            if r is None:
                cells.append("-")
                continue
            spread = f"{min(r['ratio_rounds']):.2f}-{max(r['ratio_rounds']):.2f}"
            value = f"**{r['ratio']:.2f}**" if r["ratio"] > 1 else f"{r['ratio']:.2f}"
            cells.append(f"{value} (rounds {spread})")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _times_table(title: str, summary: dict[str, Any]) -> list[str]:
    lines = ["", f"## {title}", "", "| sharding type | library | loop | ms/step | rounds (ms) |"]
    lines.append("|---|---|---|---:|---|")
    for row in summary["rows"]:
        head = f"| {row['type']} | {row['library']} | {row['loop']} |"
        if "skipped" in row:
            lines.append(f"{head} skipped: {row['skipped']} | |")
            continue
        rounds = ", ".join(f"{ms:.1f}" for ms in row["ms_rounds"])
        lines.append(f"{head} {row['ms_per_step']:.1f} | {rounds} |")
    return lines


def chart(report: dict[str, Any], path: str) -> bool:
    """Bars of shardkit / TorchRec per sharding type, plain loop and pipeline side by side;
    False (no file) without matplotlib or without ratios."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    if not report["ratios"]:
        return False
    cases = report.get("cases", report["args"]["types"])
    types = [t for t in cases if any(r["type"] == t for r in report["ratios"])]
    by_key = {(r["type"], r["loop"]): r["ratio"] for r in report["ratios"]}
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(types)), 4))
    loops = [loop for loop in LOOPS if any(r["loop"] == loop for r in report["ratios"])]
    width = 0.8 / len(loops)
    for k, loop in enumerate(loops):
        xs = [i + k * width for i in range(len(types))]
        ax.bar(xs, [by_key.get((t, loop), 0) for t in types], width=width, label=loop)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(types))], types, rotation=30)
    ax.set_ylabel("shardkit step / TorchRec's (lower is faster)")
    ax.set_title(f"DMP step, {report['args']['threads']} thread(s) per rank")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
