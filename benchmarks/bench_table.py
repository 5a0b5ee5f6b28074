"""How fast a user's table is read: the scan (read, parse, check, fit) beside pyarrow's own read
of the same file, one rank's reader (batches), `shardkit train --data table` against the same
model on batches already in memory, and the parallel scan of a Criteo-Kaggle-shaped table.

    # MovieLens-1M (RecBole's ml-1m files, see benchmarks/_movielens.py), scan, reader, training:
    .venv/bin/python benchmarks/bench_table.py --movielens /path/to/ml-1m --train \\
        --out benchmarks/results/table.md
    # a Criteo-Kaggle-shaped table (13 dense, 26 categorical) generated into a temporary folder:
    .venv/bin/python benchmarks/bench_table.py --criteo-rows 45000000 --ranks 2 \\
        --out benchmarks/results/table_criteo.md
    # a generated MovieLens-like log instead of the real one (what the tests run, tiny):
    .venv/bin/python benchmarks/bench_table.py --rows 200000 --out /tmp/table.md
    # a process's first scan against pyarrow's first read, each a fresh process (the files of
    # an earlier --keep DIR; --trees compares checkouts in turns; see _first_scan.py):
    .venv/bin/python benchmarks/bench_table.py --first-scan DIR --rounds 5 \
        --out benchmarks/results/table_first_scan.md

Contenders take turns in ``--rounds`` (interleaved); reports give medians with min-max.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _first_scan
from _movielens import SCHEMA, write_tables

from shardkit.bench import machine_info
from shardkit.data import TableReader, load_schema, scan_table

GENRES = ("Action", "Adventure", "Animation", "Children", "Comedy", "Crime", "Documentary",
          "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi",
          "Thriller", "War", "Western")  # fmt: skip
# Criteo Kaggle's 26 categorical columns' distinct values (its train.txt), the generated ids' ranges
CRITEO_CARDINALITIES = (1460, 583, 10_131_227, 2_202_608, 305, 24, 12_517, 633, 3, 93_145, 5_683,
                        8_351_593, 3_194, 27, 14_992, 5_461_306, 10, 5_652, 2_173, 4, 7_046_547,
                        18, 15, 286_181, 105, 142_572)  # fmt: skip
CRITEO_NAMES = ("label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27)))


def ratings(num_rows: int, *, seed: int = 0) -> list[list[str]]:
    """A MovieLens-like log: users with an age, gender, occupation and zip code, movies with 1-3
    of 18 genres, power-law popularity, a rating from both tastes, growing timestamps."""
    rng = random.Random(seed)
    num_users, num_movies = max(num_rows // 150, 10), max(num_rows // 250, 10)
    users = [(rng.gauss(0, 0.6), {g: rng.gauss(0, 0.5) for g in GENRES}, rng.choice(
        (18, 25, 35, 45, 50, 56)), rng.choice("MF"), rng.randrange(21),
        f"{rng.randrange(10000, 99999)}") for _ in range(num_users)]  # fmt: skip
    movies = [(rng.gauss(0, 0.7), rng.sample(GENRES, rng.randint(1, 3))) for _ in range(num_movies)]
    user_weights = [1 / (k + 1) ** 0.8 for k in range(num_users)]
    movie_weights = [1 / (k + 1) ** 0.9 for k in range(num_movies)]
    who = rng.choices(range(num_users), weights=user_weights, k=num_rows)
    what = rng.choices(range(num_movies), weights=movie_weights, k=num_rows)
    rows = []
    for i, (u, m) in enumerate(zip(who, what)):
        taste, likes, age, gender, occupation, zip_code = users[u]
        quality, genres = movies[m]
        score = 3.4 + taste + quality + sum(likes[g] for g in genres) + rng.gauss(0, 0.7)
        rows.append([str(u), str(m), str(min(5, max(1, round(score)))), str(956_703_932 + 30 * i),
                     "|".join(genres), str(age), gender, str(occupation), zip_code])  # fmt: skip
    return rows


def write_files(folder: Path, rows: list[list[str]]) -> dict[str, Path]:
    numbers = ("user_id", "movie_id", "rating", "timestamp", "age", "occupation")
    return write_tables(folder, "ratings", rows, numbers=numbers, row_group_size=65_536)


def machine() -> dict[str, Any]:
    """What the results were measured on: CPU model, family/model, ISA flags that matter,
    transparent huge pages, threads, and the load while measuring."""
    info = machine_info()
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if ":" in line)  # fmt: skip
        fields = {k.strip(): v.strip() for k, v in fields.items()}
        flags = set(fields.get("flags", "").split())
        info["cpu_model"] = fields.get("model name", platform.processor())
        info["cpu_family_model"] = f"family {fields.get('cpu family')} model {fields.get('model')}"
        info["isa"] = [f for f in ("avx2", "fma", "avx512f", "bmi2") if f in flags]
        info["thp"] = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
        info["load_average"] = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        pass
    info["torch_threads"] = torch.get_num_threads()
    return info


def _timed(fn: Any) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def pyarrow_read(path: Path) -> int:
    """pyarrow's own read of the whole file (CSV: types inferred; Parquet: every column)."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        return pq.read_table(path).num_rows
    return pcsv.read_csv(path).num_rows


def measure(path: Path, schema_path: Path) -> dict[str, float]:
    """One round on one file: pyarrow's read, the scan, one rank's reader (of 2)."""
    schema = load_schema(schema_path)
    rows, pa_wall, pa_cpu = _timed(lambda: pyarrow_read(path))
    data, scan_wall, scan_cpu = _timed(lambda: scan_table([path], schema))
    scanned = sum(data.num_rows) + data.skipped
    reader = TableReader(data, split="train", batch_size=1024, rank=0, world_size=2, prefetch=0)
    read, read_wall, read_cpu = _timed(lambda: sum(b.batch_size for b in reader))
    return {"rows": scanned, "train_rows": data.num_rows[0],
            "pyarrow_rows_per_s": rows / pa_wall, "pyarrow_rows_per_cpu_s": rows / pa_cpu,
            "scan_rows_per_s": scanned / scan_wall, "scan_rows_per_cpu_s": scanned / scan_cpu,
            "scan_over_pyarrow": scan_wall / pa_wall,
            "read_rows_per_s": read / read_wall, "read_rows_per_cpu_s": read / read_cpu}  # fmt: skip


class _InMemory:
    """A reader's batches of one epoch, read before training (not timed), replayed each epoch:
    the same model's speed with no reading at all."""

    def __init__(self, reader: Any) -> None:
        self.reader, self.batches = reader, list(reader)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Any:
        return iter(self.batches)

    def state_dict(self) -> dict[str, Any]:
        return self.reader.state_dict()


def _train_rank(rank: int, world_size: int, config: Any, prepared: Any, in_memory: bool) -> Any:
    import shardkit.train._loop as loop
    from shardkit.train import train_rank

    torch.set_num_threads(1)
    if in_memory:
        build = loop.build_data

        def materialized(*args: Any) -> Any:
            data = build(*args)
            return dataclasses.replace(data, train=_InMemory(data.train),
                                       validation=_InMemory(data.validation))  # fmt: skip

        loop.build_data = materialized  # type: ignore[assignment]
    try:
        return train_rank(rank, world_size, config, prepared)["history"]
    finally:
        if in_memory:
            loop.build_data = build  # type: ignore[assignment]


def train(args: argparse.Namespace, path: Path, schema: Path, folder: Path) -> dict[str, Any]:
    """`shardkit train --data table` on 2 ranks: reading the files, from the cache, and the same
    model on batches in memory, taking turns."""
    from shardkit.launch import spawn
    from shardkit.train import TrainConfig
    from shardkit.train._prepare import prepare

    base = TrainConfig(data="table", data_path=path, schema=schema, batch_size=1024,
                       epochs=args.epochs, progress=False, nproc=2)  # fmt: skip
    contenders = {"files": {}, "cache": {"table_cache": folder / "cache"}, "in_memory": {}}
    contenders = {k: contenders[k] for k in args.train_contenders.split(",")}  # in this order
    runs: dict[str, list[Any]] = {name: [] for name in contenders}
    for round_ in range(args.train_rounds):
        for name, changes in contenders.items():
            config = dataclasses.replace(base, checkpoint_dir=folder / f"run-{name}-{round_}",
                                         **changes)  # fmt: skip
            prepared = prepare(config, 2)
            history = spawn(_train_rank, world_size=2,
                            args=(config, prepared, name == "in_memory"))[0]  # fmt: skip
            runs[name].append([{k: h[k] for k in ("epoch", "auc", "epoch_samples_per_s",
                                                  "samples_per_s", "data_time_share",
                                                  "data_samples_per_s")}
                               for h in history])  # fmt: skip
            last = history[-1]
            print(f"train {name}: AUC {last['auc']:.4f}, {last['epoch_samples_per_s']:,.0f} "
                  f"samples/s, reading {last['data_time_share']:.1%}", flush=True)  # fmt: skip
    return runs


def criteo_schema(folder: Path) -> Path:
    dense = {f"I{i}": {"type": "dense", "transform": ["log1p", "standardize"], "fill": 0}
             for i in range(1, 14)}  # fmt: skip
    cats = {f"C{i}": {"type": "categorical", "min_count": 5} for i in range(1, 27)}
    schema = {"label": "label", "names": list(CRITEO_NAMES), "columns": {**dense, **cats},
              "split": {"validation_fraction": 0.1}}  # fmt: skip
    path = folder / "criteo.json"
    path.write_text(json.dumps(schema, indent=1))
    return path


def write_criteo(path: Path, num_rows: int, *, seed: int = 0, chunk: int = 1 << 20) -> None:
    """A Criteo-Kaggle-shaped TSV without a header: label, 13 counts, 26 8-digit hex ids with
    Kaggle's cardinalities and power-law popularity, about 5% empty values."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pcsv

    hex_digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    shifts = np.arange(28, -1, -4, dtype=np.uint64)
    options = pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    with pa.OSFile(str(path), "wb") as sink:
        for start in range(0, num_rows, chunk):
            n = min(chunk, num_rows - start)
            rng = np.random.default_rng([seed, start])
            columns = {"label": pa.array((rng.random(n) < 0.26).astype(np.int8))}
            for i in range(1, 14):
                counts = np.floor(np.expm1(rng.exponential(1.5, n))).astype(np.int64)
                columns[f"I{i}"] = pa.array(counts, mask=rng.random(n) < 0.05)
            for i, cardinality in enumerate(CRITEO_CARDINALITIES, start=1):
                ids = np.floor(cardinality * rng.random(n) ** 3).astype(np.uint64)
                ids = (ids * np.uint64(2_654_435_761) + np.uint64(i)) & np.uint64(0xFFFFFFFF)
                chars = hex_digits[((ids[:, None] >> shifts) & np.uint64(15)).astype(np.int64)]
                text = pa.array(chars.reshape(-1).view("S8")).cast(pa.string())
                columns[f"C{i}"] = pc_where_missing(text, rng.random(n) < 0.05)
            pcsv.write_csv(pa.table(columns), sink, write_options=options)


def pc_where_missing(values: Any, missing: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.if_else(pa.array(missing), pa.scalar(None, pa.string()), values)


def _criteo_scan_rank(rank: int, world_size: int, path: Path, schema: Path) -> dict[str, Any]:
    import resource

    import shardkit.comm
    from shardkit.data import _table_fit

    torch.set_num_threads(1)
    merging: dict[str, list[float]] = {}  # the parts' merge: wall and CPU seconds

    def timed(owner: Any, name: str) -> None:
        fn = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result, wall, cpu = _timed(lambda: fn(*args, **kwargs))
            merging.setdefault(name, [0.0, 0.0])
            merging[name][0] += wall
            merging[name][1] += cpu
            return result

        setattr(owner, name, wrapper)

    timed(shardkit.comm, "all_gather_object")  # the scan's 3 all-gathers (waits included)
    timed(_table_fit.Fitter, "part")  # a rank's value counts summed per value
    timed(_table_fit.Fitter, "merge")  # all ranks' parts -> the fitted schema
    data, wall, cpu = _timed(lambda: scan_table([path], load_schema(schema), parallel=True))
    result = {"wall_s": wall, "cpu_s": cpu, "rows": sum(data.num_rows) + data.skipped,
              "train_rows": data.num_rows[0], "pieces": len(data.pieces),
              "vocabulary_rows": sum(t.num_embeddings for t in data.fitted.tables),
              "merging": merging,
              "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # fmt: skip
    if rank == 0:  # one rank's reader: the first batches of its part of the training split
        reader = TableReader(data, split="train", batch_size=4096, rank=0, world_size=world_size,
                             prefetch=0)  # fmt: skip
        batches = iter(reader)
        next(batches)  # the encoder's vocabularies are built once per run
        steps = min(200, len(reader) - 1)
        count, read_wall, read_cpu = _timed(
            lambda: sum(next(batches).batch_size for _ in range(steps))
        )
        result.update(read_rows_per_s=count / read_wall, read_rows_per_cpu_s=count / read_cpu)
        batches.close()  # type: ignore[attr-defined]
    return result


def pyarrow_stream(path: Path, names: tuple[str, ...]) -> int:
    """pyarrow's own streaming read of a headerless TSV (batches dropped as read)."""
    import pyarrow.csv as pcsv

    reader = pcsv.open_csv(path, read_options=pcsv.ReadOptions(column_names=list(names)),
                           parse_options=pcsv.ParseOptions(delimiter="\t"))  # fmt: skip
    return sum(batch.num_rows for batch in reader)


def criteo(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    from shardkit.launch import spawn

    path = args.criteo_path or folder / "criteo.tsv"
    generated = None
    if not path.exists():
        _, generated, _ = _timed(lambda: write_criteo(path, args.criteo_rows))
        print(f"wrote {args.criteo_rows:,} rows ({path.stat().st_size / 2**30:.1f} GiB) in "
              f"{generated:.0f} s: {path}", flush=True)  # fmt: skip
    schema = criteo_schema(folder)
    runs: dict[str, list[Any]] = {"pyarrow": [], "one": [], "scan": []}
    contenders = args.criteo_contenders.split(",")
    for _ in range(args.rounds):
        if "pyarrow" in contenders:
            rows, wall, cpu = _timed(lambda: pyarrow_stream(path, CRITEO_NAMES))
            runs["pyarrow"].append({"rows": rows, "wall_s": wall, "cpu_s": cpu})
            print(f"pyarrow read: {rows:,} rows in {wall:.1f} s", flush=True)
        if "one" in contenders:
            data, wall, cpu = _timed(lambda: scan_table([path], load_schema(schema)))
            runs["one"].append({"rows": sum(data.num_rows) + data.skipped, "wall_s": wall,
                                "cpu_s": cpu})  # fmt: skip
            print(f"scan in one process: {runs['one'][-1]['rows']:,} rows in {wall:.1f} s",
                  flush=True)  # fmt: skip
            del data
        per_rank = spawn(_criteo_scan_rank, world_size=args.ranks, args=(path, schema),
                         timeout=7200)  # fmt: skip
        runs["scan"].append(per_rank)
        cpu_s = ", ".join(f"{r['cpu_s']:.1f}" for r in per_rank)
        print(f"scan on {args.ranks} ranks: {per_rank[0]['rows']:,} rows in "
              f"{max(r['wall_s'] for r in per_rank):.1f} s, CPU {cpu_s} s; reader "
              f"{per_rank[0]['read_rows_per_s']:,.0f} rows/s on rank 0", flush=True)  # fmt: skip
    out = {"path": str(path), "bytes": path.stat().st_size, "generated_s": generated,
           "runs": runs}  # fmt: skip
    if args.train:
        out["train"] = train(args, path, schema, folder)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="generated MovieLens-like rows")
    parser.add_argument("--movielens", type=Path, help="RecBole's ml-1m folder: the real data")
    parser.add_argument("--rounds", type=int, default=3, help="turns of every contender")
    parser.add_argument("--train", action="store_true", help="also time shardkit train")
    parser.add_argument("--train-rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train-contenders", default="files,cache,in_memory",
                        help="which of files, cache, in_memory train (in_memory: the reference)")  # fmt: skip
    parser.add_argument("--criteo-rows", type=int, default=0, help="a Criteo-shaped table instead")
    parser.add_argument("--criteo-path", type=Path, help="an existing Criteo-shaped TSV to reuse")
    parser.add_argument("--ranks", type=int, default=2, help="ranks of the Criteo scan")
    parser.add_argument("--criteo-contenders", default="pyarrow,one,scan",
                        help="which of pyarrow, one (the scan in one process) and scan (on "
                        "--ranks ranks) run on the Criteo-shaped table")  # fmt: skip
    parser.add_argument("--first-scan", type=Path, help="a folder of movielens.{csv.gz,parquet,"
                        "toml} (an earlier --keep): time a fresh process's first scan against "
                        "pyarrow's first read, in rounds, and nothing else")  # fmt: skip
    parser.add_argument("--trees", help="with --first-scan: checkouts (comma-separated) whose "
                        "scans take turns, e.g. /tmp/before,.")  # fmt: skip
    parser.add_argument("--threads", type=int, help="with --first-scan: the scan's threads "
                        "(default: scan_table's)")  # fmt: skip
    parser.add_argument("--keep", type=Path, help="write the data here, and keep it")
    parser.add_argument("--out", type=Path, help="a Markdown report (and .json beside it)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench_table_"))
    folder.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"command": _command(args, parser.parse_args([])),
                              "machine": machine()}  # fmt: skip
    try:
        if args.first_scan is not None:
            trees = args.trees.split(",") if args.trees else None
            report["first_scan"] = _first_scan.rounds(args.first_scan, rounds=args.rounds,
                                                      trees=trees, threads=args.threads)  # fmt: skip
        elif args.criteo_rows or args.criteo_path:
            report["criteo"] = criteo(args, folder)
            if "train" in report["criteo"]:
                report["train"] = report["criteo"].pop("train")
                report["train_file"] = "the Criteo-shaped TSV below"
        else:
            report.update(movielens(args, folder))
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)
    report["machine"]["load_average_after"] = os.getloadavg()
    if args.out and (args.rounds or args.train):
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        args.out.write_text(_markdown(report))
        print(f"wrote {args.out}")


def _command(args: argparse.Namespace, defaults: argparse.Namespace) -> str:
    """The command line that re-runs this (the arguments given, data paths as given)."""
    words = ["python benchmarks/bench_table.py"]
    for key, value in vars(args).items():
        flag = f"--{key.replace('_', '-')}"
        if value == getattr(defaults, key) or key == "keep":
            continue
        words.append(flag if value is True else f"{flag} {value}")
    return " ".join(words)


def movielens(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    if args.movielens is not None:
        from _movielens import write

        files = write(args.movielens, folder)  # the same columns and schema as generated
        schema = folder / "movielens.toml"
        source = f"MovieLens-1M ({args.movielens})"
    else:
        (folder / "ratings.toml").write_text(SCHEMA)
        files, schema = write_files(folder, ratings(args.rows)), folder / "ratings.toml"
        source = f"a generated MovieLens-like log of {args.rows:,} ratings"
    print(f"{source}: {', '.join(str(p) for p in files.values())}", flush=True)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in files}
    for _ in range(args.rounds):
        for name, path in files.items():
            runs[name].append(measure(path, schema))
            print(name, {k: round(v, 2) for k, v in runs[name][-1].items()}, flush=True)
    out: dict[str, Any] = {"source": source, "runs": runs} if args.rounds else {"source": source}
    if args.train:
        out["train"] = train(args, files["csv.gz"], schema, folder)
        out["train_file"] = f"{source}, gzip CSV"
    return out


def _cell(values: list[float], fmt: str = ",.0f") -> str:
    return (f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"
            if values else "-")  # fmt: skip


def _markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = ["# Reading a user's table", "", f"    {report['command']}", "",
             f"Machine: {m.get('cpu_model')} ({m.get('cpu_family_model')}; {', '.join(m.get('isa', []))}), "
             f"{m.get('cpu_count')} cores, transparent huge pages `{m.get('thp')}`, torch {m['torch']}; "
             f"load average {' '.join(m.get('load_average', []))} before, "
             f"{' '.join(f'{x:.2f}' for x in m['load_average_after'])} after (a shared machine: "
             "other engineers' jobs ran beside it, so absolute rates are loose; each round "
             "timed the contenders one after the other). Medians of the rounds, min-max in "
             "brackets.", ""]  # fmt: skip
    if "first_scan" in report:
        lines += _first_scan.markdown(report["first_scan"])
    if "runs" in report:
        lines += [f"Data: {report['source']}. Scan: read, parse, check every row and fit the "
                  "schema and the split (one process, a worker thread per core); pyarrow: "
                  "`pyarrow.csv.read_csv` / `pyarrow.parquet.read_table` of the same file "
                  "(every column, multithreaded). Reader: rank 0 of 2's training batches of "
                  "1,024 (parse, encode, shuffle, batch), no prefetch, one thread.", "",
                  "| file | scan rows/s | pyarrow read rows/s | scan time / pyarrow's | scan rows/CPU-s | reader rows/s | reader rows/CPU-s |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for name, runs in report["runs"].items():
            cells = [_cell([r[k] for r in runs]) for k in ("scan_rows_per_s", "pyarrow_rows_per_s")]
            cells.append(_cell([r["scan_over_pyarrow"] for r in runs], ".2f"))
            cells += [_cell([r[k] for r in runs]) for k in
                      ("scan_rows_per_cpu_s", "read_rows_per_s", "read_rows_per_cpu_s")]  # fmt: skip
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if "train" in report:
        lines += ["", f"`shardkit train --data table` ({report.get('train_file', 'gzip CSV')}, "
                  "2 ranks x 1 thread, batch 1,024 "
                  "per rank, DLRM): reading the files (prefetched in a background thread), from "
                  "the cache of the encoded splits (`--table-cache`, written by the first "
                  "round), and the same model on each epoch's batches read into memory first. "
                  "Per epoch: training samples/s over the whole epoch (all ranks), the share "
                  "of the epoch a rank waited for data, the rate of reading where training "
                  "waited (the epoch's samples over the time spent waiting), validation AUC.", "",
                  "| contender | epoch | samples/s | / in memory, same round | waiting for data | reading where waited, samples/s | AUC |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        memory = report["train"]["in_memory"]
        for name, rounds in report["train"].items():
            for epoch in range(len(rounds[0])):
                rates = [r[epoch]["epoch_samples_per_s"] for r in rounds]
                ratios = [r[epoch]["epoch_samples_per_s"] / m[epoch]["epoch_samples_per_s"]
                          for r, m in zip(rounds, memory)]  # fmt: skip
                shares = [100 * r[epoch]["data_time_share"] for r in rounds]
                aucs = [r[epoch]["auc"] for r in rounds]
                per_round = ", ".join(f"{x:.2f}" for x in ratios)
                alone = [r[epoch]["data_samples_per_s"] for r in rounds
                         if name != "in_memory" and "data_samples_per_s" in r[epoch]]  # fmt: skip
                lines.append(f"| {name} | {epoch} | {_cell(rates)} | {per_round} | "
                             f"{_cell(shares, '.1f')}% | {_cell(alone)} | "
                             f"{_cell(aucs, '.4f')} |")  # fmt: skip
    if "criteo" in report:
        c = report["criteo"]
        runs = c["runs"]
        scan_wall = [max(r["wall_s"] for r in ranks) for ranks in runs["scan"]]
        one_wall = [r["wall_s"] for r in runs.get("one", [])]
        pa_wall = [r["wall_s"] for r in runs["pyarrow"]]
        rows = runs["scan"][0][0]["rows"]
        lines += ["", f"A Criteo-Kaggle-shaped table generated by this script: {rows:,} rows, "
                  f"{c['bytes'] / 2**30:.1f} GiB of TSV (label, 13 counts, 26 hex ids with "
                  "Kaggle's cardinalities, power-law popularity, 5% empty), schema: 13 dense "
                  "`log1p` + `standardize`, 26 categorical vocabularies (`min_count = 5`), a "
                  f"seeded 10% validating. Scan on {len(runs['scan'][0])} ranks "
                  "(`scan_table(parallel=True)`, each rank its own pieces, one thread each); "
                  "pyarrow: `pyarrow.csv.open_csv` streaming the same file (one process, "
                  "multithreaded, batches dropped). Scan in one process: "
                  "`scan_table` with a worker thread per core. Time / pyarrow's: per round.", "",
                  "| | seconds | rows/s | time / pyarrow's |", "|---|---|---|---|",
                  f"| scan, one process | {_cell(one_wall, '.1f')} | "
                  f"{_cell([rows / s for s in one_wall])} | "
                  f"{_cell([a / b for a, b in zip(one_wall, pa_wall)], '.2f')} |",
                  f"| scan, {len(runs['scan'][0])} ranks | {_cell(scan_wall, '.1f')} | "
                  f"{_cell([rows / s for s in scan_wall])} | "
                  f"{_cell([a / b for a, b in zip(scan_wall, pa_wall)], '.2f')} |",
                  f"| pyarrow's streaming read | {_cell(pa_wall, '.1f')} | "
                  f"{_cell([r['rows'] / r['wall_s'] for r in runs['pyarrow']])} | 1 |",
                  f"| reader, rank 0 of {len(runs['scan'][0])} (batches of 4,096) | - | "
                  f"{_cell([ranks[0]['read_rows_per_s'] for ranks in runs['scan']])} | - |",
                  "", f"Vocabulary rows fitted: {runs['scan'][0][0]['vocabulary_rows']:,}; "
                  f"pieces: {runs['scan'][0][0]['pieces']:,}."]  # fmt: skip
        lines += ["", "Per rank and round: the scan's wall and CPU seconds (process start "
                  "excluded), the 3 all-gathers (wall, waits for the other ranks included; "
                  "CPU), summing a rank's value counts (`Fitter.part`) and merging all ranks' "
                  "parts (`Fitter.merge`), peak memory.", "",
                  "| round | rank | wall s | CPU s | rows/CPU-s | all-gathers wall (CPU) s | "
                  "part wall (CPU) s | merge wall (CPU) s | peak RSS MiB |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for round_, ranks in enumerate(runs["scan"]):
            for rank, r in enumerate(ranks):
                m = r.get("merging", {})
                cells = [f"{m[k][0]:.1f} ({m[k][1]:.1f})" if k in m else "-"
                         for k in ("all_gather_object", "part", "merge")]  # fmt: skip
                lines.append(f"| {round_} | {rank} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | "
                             f"{r['rows'] / len(ranks) / r['cpu_s']:,.0f} | {' | '.join(cells)} "
                             f"| {r.get('max_rss_mib', 0):,.0f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
