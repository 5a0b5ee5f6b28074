"""A process's first scan of a table against pyarrow's own first read of the same file, each in
a fresh process, in interleaved rounds (`bench_table.py --first-scan FOLDER`).

Each measurement is one new Python process. The scan's process imports torch, `shardkit.data`
and ``pyarrow`` before the clock starts; pyarrow's imports ``pyarrow`` and its reader
(``pyarrow.csv`` / ``pyarrow.parquet``) before the clock starts. So the scan's time includes
whatever else it loads (``pyarrow.compute``, the CSV or Parquet module) and everything it does
beyond parsing (checking every value, fitting vocabularies and the split); pyarrow's time is its
read alone. Wall seconds (`perf_counter`), CPU seconds of every thread and minor page faults
(`getrusage`) around the one call.

    # a folder written by `_movielens.write` (e.g. bench_table.py --movielens ml-1m --keep DIR):
    python benchmarks/bench_table.py --first-scan DIR --rounds 5 --out first_scan.md
    # two checkouts in turns (each a tree with shardkit/ at its top):
    python benchmarks/bench_table.py --first-scan DIR --trees /tmp/before,. --rounds 5
    # one measurement (what the rounds run):
    python benchmarks/_first_scan.py scan DIR/movielens.csv.gz DIR/movielens.toml
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FILES = ("csv.gz", "parquet")


def _usage() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime + r.ru_stime, r.ru_minflt


def measure(kind: str, path: Path, schema: Path, threads: int | None) -> dict[str, Any]:
    """One first scan (``kind`` "scan") or one pyarrow read ("pyarrow"), in this process."""
    if kind == "pyarrow":
        import pyarrow.csv as pcsv
        import pyarrow.parquet as pq

        def run() -> int:
            if path.suffix == ".parquet":
                return int(pq.read_table(path).num_rows)
            return int(pcsv.read_csv(path).num_rows)
    else:
        import pyarrow  # noqa: F401  (loaded for pyarrow's read too)
        import torch

        from shardkit.data import load_schema, scan_table

        torch.set_num_threads(1)
        spec = load_schema(schema)

        def run() -> int:
            data = scan_table([path], spec, threads=threads)
            return sum(data.num_rows) + data.skipped

    wall, cpu, faults = _usage()
    rows = run()
    wall2, cpu2, faults2 = _usage()
    return {"kind": kind, "file": path.name, "rows": rows, "wall_s": wall2 - wall,
            "cpu_s": cpu2 - cpu, "faults": faults2 - faults,
            "load": os.getloadavg()[0]}  # fmt: skip


def _child(kind: str, path: Path, schema: Path, threads: int | None, tree: str | None
           ) -> dict[str, Any]:  # fmt: skip
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(tree).resolve()),
                                             *filter(None, [env.get("PYTHONPATH")])])  # fmt: skip
    command = [sys.executable, str(Path(__file__).resolve()), kind, str(path), str(schema)]
    if threads is not None:
        command.append(str(threads))
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["tree"] = tree or "."
    return result


def rounds(folder: Path, *, rounds: int, trees: list[str] | None, threads: int | None
           ) -> dict[str, Any]:  # fmt: skip
    """``rounds`` rounds; in each, per file (order alternating), every tree's scan then
    pyarrow's read, each a fresh process. Returns the runs and the stem's schema."""
    schema = next(folder.glob("*.toml"))
    paths = {name: folder / f"{schema.stem}.{name}" for name in FILES}
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        for name in FILES if r % 2 == 0 else FILES[::-1]:
            for tree in trees or [None]:
                runs.append({"round": r, **_child("scan", paths[name], schema, threads, tree)})
                print(runs[-1], flush=True)
            runs.append({"round": r, **_child("pyarrow", paths[name], schema, None, None)})
            print(runs[-1], flush=True)
    return {"folder": str(folder), "threads": threads, "runs": runs}


def markdown(report: dict[str, Any]) -> list[str]:
    """The report's table: per file and contender, wall and CPU seconds, and the scan's time
    over pyarrow's of the same round (medians, min-max)."""
    runs = report["runs"]
    threads = report["threads"] or "the default (a worker per core)"
    lines = [f"First scan of a fresh process ({report['folder']}; scan threads: {threads}) "
             "against pyarrow's first read of the same file in a fresh process "
             "(`pyarrow.csv.read_csv` / `pyarrow.parquet.read_table`, its own threads); "
             "interleaved rounds. Ratios: the scan's over pyarrow's of the same round.", "",
             "| file | contender | wall s | CPU s | faults | wall / pyarrow's | CPU / pyarrow's |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip

    def cell(values: list[float], fmt: str) -> str:
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

    for name in FILES:
        mine = [r for r in runs if r["file"].endswith(name)]
        base = {r["round"]: r for r in mine if r["kind"] == "pyarrow"}
        contenders = [("pyarrow", None)] + [("scan", t) for t in
                                            dict.fromkeys(r["tree"] for r in mine if r["kind"] == "scan")]  # fmt: skip
        for kind, tree in contenders:
            rows = [r for r in mine if r["kind"] == kind and (tree is None or r["tree"] == tree)]
            label = "pyarrow" if kind == "pyarrow" else f"scan ({tree})"
            wall = [r["wall_s"] / base[r["round"]]["wall_s"] for r in rows]
            cpu = [r["cpu_s"] / base[r["round"]]["cpu_s"] for r in rows]
            lines.append(f"| {name} | {label} | {cell([r['wall_s'] for r in rows], '.3f')} | "
                         f"{cell([r['cpu_s'] for r in rows], '.3f')} | "
                         f"{cell([r['faults'] for r in rows], '.0f')} | {cell(wall, '.2f')} | "
                         f"{cell(cpu, '.2f')} |")  # fmt: skip
    return lines


if __name__ == "__main__":
    threads_arg = int(sys.argv[4]) if len(sys.argv) > 4 else None
    print(json.dumps(measure(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), threads_arg)))
