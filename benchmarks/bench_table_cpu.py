"""CPU-seconds of reading one table file, one thread, for comparing two checkouts in turns on a
loaded machine (CPU time, unlike wall time, is little changed by other jobs): pyarrow's own
read of the file (a TSV streamed, a CSV read whole; multithreaded, and in the scan mode also
with ``use_threads=False``; wall seconds beside), the scan (`scan_table(threads=1)`), and
rank 0 of 2's training batches of 1,024 from the files and from the cache (`prefetch=0`). One
JSON line per run.

    # interleaved rounds of two checkouts (each a tree with shardkit/ at its top):
    for r in 1 2 3; do for tree in /tmp/before /tmp/after; do
        PYTHONPATH=$tree python benchmarks/bench_table_cpu.py criteo.tsv criteo.json; done; done
    # criteo.tsv and its schema: bench_table.write_criteo / criteo_schema
    # the scan only, and a second scan in the same process (pyarrow's compute module and
    # memory already loaded): a third argument "scan"
    PYTHONPATH=$tree python benchmarks/bench_table_cpu.py movielens.parquet movielens.toml scan
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import shardkit
from shardkit.data import TableReader, load_schema, scan_table


def _cpu(fn: Any) -> tuple[Any, float]:
    start = time.process_time()
    result = fn()
    return result, time.process_time() - start


def _timed(fn: Any) -> tuple[Any, float, float]:
    """The result, CPU-seconds (every thread of the process) and wall seconds."""
    wall, start = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.process_time() - start, time.perf_counter() - wall


def _pyarrow(path: Path, threads: bool = True) -> int:
    import pyarrow.csv as pcsv

    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return int(pq.read_table(path, use_threads=threads).num_rows)
    options = pcsv.ReadOptions(use_threads=threads)
    if path.suffix in (".tsv", ".tab"):
        options.autogenerate_column_names = True
        reader = pcsv.open_csv(path, read_options=options,
                               parse_options=pcsv.ParseOptions(delimiter="\t"))  # fmt: skip
    else:  # read whole: a streaming read infers types from its first block only
        return int(pcsv.read_csv(path, read_options=options).num_rows)
    return sum(batch.num_rows for batch in reader)


def main() -> None:
    path, schema = Path(sys.argv[1]), sys.argv[2]
    torch.set_num_threads(1)
    rows, pyarrow_cpu, pyarrow_wall = _timed(lambda: _pyarrow(path))
    data, scan_cpu, scan_wall = _timed(lambda: scan_table([path], load_schema(schema), threads=1))
    if sys.argv[3:] == ["scan"]:
        _, again_cpu, again_wall = _timed(
            lambda: scan_table([path], load_schema(schema), threads=1)
        )
        _, one_cpu, one_wall = _timed(lambda: _pyarrow(path, threads=False))
        print(json.dumps({"tree": str(Path(shardkit.__file__).parent.parent), "file": path.name,
                          "rows": rows, "pyarrow_cpu_s": pyarrow_cpu, "scan_cpu_s": scan_cpu,
                          "scan_again_cpu_s": again_cpu, "pyarrow_wall_s": pyarrow_wall,
                          "scan_wall_s": scan_wall, "scan_again_wall_s": again_wall,
                          "pyarrow_1thread_cpu_s": one_cpu, "pyarrow_1thread_wall_s": one_wall,
                          "load": Path("/proc/loadavg").read_text().split()[0]}), flush=True)  # fmt: skip
        return

    def read(cache: Path | None = None) -> int:
        reader = TableReader(data, split="train", batch_size=1024, rank=0, world_size=2,
                             prefetch=0, cache=cache)  # fmt: skip
        return sum(batch.batch_size for batch in reader)

    read_rows, files_cpu = _cpu(read)
    folder = Path(tempfile.mkdtemp(prefix="bench_table_cpu_"))
    try:
        read(folder)  # writes the cache
        _, cache_cpu = _cpu(lambda: read(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps({"tree": str(Path(shardkit.__file__).parent.parent), "file": path.name,
                      "rows": rows, "pyarrow_cpu_s": pyarrow_cpu, "scan_cpu_s": scan_cpu,
                      "read_rows": read_rows, "read_files_cpu_s": files_cpu,
                      "read_cache_cpu_s": cache_cpu,
                      "load": Path("/proc/loadavg").read_text().split()[0]}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
