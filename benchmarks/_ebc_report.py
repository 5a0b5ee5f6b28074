"""bench_ebc.py's report: the markdown ratio table, and a chart when matplotlib is importable."""

from __future__ import annotations

from typing import Any

from shardkit.bench import machine_line

SHORT = {
    "shardkit compiled": "compiled",
    "shardkit eager": "eager",
    "torchrec (FBGEMM)": "FBGEMM",
    "naive dense": "naive dense",
    "shardkit compiled, 4 KiB pages": "compiled, 4 KiB pages",
}


def _where(args: dict[str, Any], report: dict[str, Any]) -> str:
    if args.get("device") == "cuda":
        return f"on one GPU ({report.get('gpu')}, CUDA {report['machine'].get('cuda')})"
    return f"{report['threads']} thread(s)"


def _copy_kind(args: dict[str, Any]) -> str:
    return "GPU device-to-device copy" if args.get("device") == "cuda" else "Single-thread copy"


def render(report: dict[str, Any]) -> str:
    """Markdown: the setup, then one row per point with each contender's median ms (25th-75th
    percentile), ratios to FBGEMM and the fraction of the bandwidth floor."""
    args = report["args"]
    names = list(args["contenders"])
    lines = [
        "# Embedding lookup + fused optimizer step (bench_ebc.py)",
        "",
        f"{_where(args, report)}; ~{args['ids_per_bag']} ids per bag; "
        f"{args['rounds']} rounds x {args['iters']} timed steps per contender after "
        f"{args['warmup']} warm-up, contenders taking turns within each round; ids range check "
        f"{'off' if args['no_validate'] else 'on'} for shardkit. {_copy_kind(args)} bandwidth "
        f"{report['copy_gb_per_s']:.1f} GB/s.",
        f"Machine: {machine_line(report['machine'])} (the .json has the rest).",
        "",
        "ms: median step time (25th-75th percentile over all timed steps). x FBGEMM: median / "
        "FBGEMM's median (< 1 is faster). floor: the copy floor's share of the step (bytes a "
        "step must move / copy bandwidth, over the median): the ids read in forward and "
        "backward (8 B each), the unique rows read in forward and read and written in "
        "backward, their row-wise state (4 B) read and written, the pooled rows written and "
        "their gradient read. gather: the gather floor's share (this step's random row reads "
        "timed with torch's F.embedding_bag on one thread, a row per id in forward and a "
        "gradient row per id in backward, plus the unique rows' update at copy bandwidth; "
        "see benchmarks/_ebc_floors.py).",
        "",
        "| point | ids / unique | "
        + " | ".join(f"{SHORT[n]} ms" for n in names)
        + " | compiled x FBGEMM | eager x FBGEMM | floor: compiled | floor: FBGEMM"
        + " | gather: compiled | gather: FBGEMM |",
        "|---|---:|" + "---:|" * (len(names) + 6),
    ]
    lines += [_row(entry, names) for entry in report["points"]]
    lines += ["", _summary(report), _huge_pages(report, names)]
    return "\n".join(lines) + "\n"


def _row(entry: dict[str, Any], names: list[str]) -> str:
    p, results = entry["point"], entry["results"]
    label = (
        f"{p['tables']} x {p['rows']:,} x {p['dim']}, batch {p['batch']:,}, {p['ids']}, "
        f"{p['optimizer']}"
    )
    cells = [label, f"{entry['num_ids']:,.0f} / {entry['unique_rows']:,.0f}"]
    for name in names:
        r = results[name]
        cells.append(
            "skipped" if "ms" not in r else f"{r['ms']:.2f} ({r['p25']:.2f}-{r['p75']:.2f})"
        )
    for name in ("shardkit compiled", "shardkit eager"):
        ratio = results.get(name, {}).get("ratio_to_fbgemm")
        cells.append("-" if ratio is None else f"**{ratio:.2f}**" if ratio > 1 else f"{ratio:.2f}")
    for key in ("floor_fraction", "gather_fraction"):
        for name in ("shardkit compiled", "torchrec (FBGEMM)"):
            fraction = results.get(name, {}).get(key)
            cells.append("-" if fraction is None else f"{fraction:.0%}")
    return "| " + " | ".join(cells) + " |"


def _summary(report: dict[str, Any]) -> str:
    ratios = [
        e["results"]["shardkit compiled"]["ratio_to_fbgemm"]
        for e in report["points"]
        if "ratio_to_fbgemm" in e["results"].get("shardkit compiled", {})
    ]
    if not ratios:
        return "No FBGEMM contender in this run (torchrec not importable): no ratios."
    losses = sum(r > 1 for r in ratios)
    return (
        f"compiled / FBGEMM over {len(ratios)} points: median {sorted(ratios)[len(ratios) // 2]:.2f}, "
        f"best {min(ratios):.2f}, worst {max(ratios):.2f}; slower than FBGEMM (in bold) at "
        f"{losses} point(s)."
    )


def _huge_pages(report: dict[str, Any], names: list[str]) -> str:
    """Each shardkit contender's share of table bytes on 2 MiB pages after its steps, over points."""
    parts = []
    for name in names:
        shares = [e["results"][name].get("huge_page_share") for e in report["points"]]
        shares = [s for s in shares if s is not None]
        if shares:
            parts.append(f"{SHORT[name]} {min(shares):.0%}-{max(shares):.0%}")
    return (
        f"Tables on 2 MiB pages (share of bytes, over points): {'; '.join(parts)}." if parts else ""
    )


def chart(report: dict[str, Any], path: str) -> bool:
    """Bars of each contender's ratio to FBGEMM per point; False (no file) without matplotlib
    or without an FBGEMM contender."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    points = [e for e in report["points"] if "ms" in e["results"].get("torchrec (FBGEMM)", {})]
    if not points:
        return False
    names = [
        n for n in ("shardkit compiled", "shardkit eager") if n in report["args"]["contenders"]
    ]
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(points)), 5))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        values = [e["results"][name].get("ratio_to_fbgemm", 0) for e in points]
        xs = [i + k * width for i in range(len(points))]
        ax.bar(xs, values, width=width, label=SHORT[name])
    ax.axhline(1.0, color="black", linewidth=1)
    labels = [
        f"{e['point']['tables']}x{e['point']['rows']:.0e} d{e['point']['dim']} "
        f"b{e['point']['batch']} {e['point']['ids'][:3]} {e['point']['optimizer'][:3]}"
        for e in points
    ]
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(points))], labels, rotation=90, fontsize=7
    )
    ax.set_ylabel("step time / FBGEMM's (lower is faster)")
    ax.set_title(f"EBC training step, {report['threads']} thread(s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
