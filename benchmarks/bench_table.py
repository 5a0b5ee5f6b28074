"""How fast a user's table is read: the scan (read, parse, check, fit) and one rank's reader
(read, parse, encode, shuffle, batch), on a generated MovieLens-like ratings log, as CSV, gzip
CSV and Parquet, taking turns over ``--rounds``.

    .venv/bin/python benchmarks/bench_table.py --rows 200000 --out benchmarks/results/table.md
    # keep the generated log and schema, e.g. to train on them:
    .venv/bin/python benchmarks/bench_table.py --rows 1000000 --keep /tmp/ratings --rounds 0
    shardkit train --data table --data-path /tmp/ratings/ratings.csv --schema /tmp/ratings/ratings.toml

The log: users with an age, gender, occupation and zip code, movies with 1-3 of 18 genres, both
drawn with power-law popularity; a rating 1-5 from the user's and the movie's taste, a user's
liking of genres, and noise; timestamps that grow. The label is ``rating >= 4``; validation is
the last 10% of each user's ratings by time.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from shardkit.bench import machine_info, machine_line
from shardkit.data import TableReader, load_schema, scan_table

GENRES = ("Action", "Adventure", "Animation", "Children", "Comedy", "Crime", "Documentary",
          "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi",
          "Thriller", "War", "Western")  # fmt: skip
COLUMNS = ("user_id", "movie_id", "rating", "timestamp", "genres", "age", "gender", "occupation",
           "zip")  # fmt: skip
SCHEMA = """label = "rating >= 4"

[columns]
user_id    = { type = "categorical", min_count = 2 }
movie_id   = { type = "categorical", min_count = 2 }
genres     = { type = "multi_hot", separator = "|", pooling = "mean" }
age        = { type = "dense", transform = "standardize" }
gender     = "categorical"
occupation = "categorical"
zip        = { type = "categorical", ids = "hash", num_embeddings = 4096 }

[split]
time_column = "timestamp"
validation_fraction = 0.1
per = "user_id"
"""


def ratings(num_rows: int, *, seed: int = 0) -> list[list[str]]:
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
    files = {"csv": folder / "ratings.csv", "csv.gz": folder / "ratings.csv.gz"}
    for name, opener in (("csv", open), ("csv.gz", gzip.open)):
        with opener(files[name], "wt", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            writer.writerows(rows)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return files
    table = {name: [r[i] for r in rows] for i, name in enumerate(COLUMNS)}
    for name in ("user_id", "movie_id", "rating", "timestamp", "age", "occupation"):
        table[name] = [int(v) for v in table[name]]
    table["genres"] = [v.split("|") for v in table["genres"]]
    files["parquet"] = folder / "ratings.parquet"
    pq.write_table(pa.table(table), files["parquet"], row_group_size=65_536)
    return files


def measure(path: Path, schema_path: Path) -> dict[str, float]:
    schema = load_schema(schema_path)
    wall, cpu = time.perf_counter(), time.process_time()
    data = scan_table([path], schema)
    scan_wall, scan_cpu = time.perf_counter() - wall, time.process_time() - cpu
    rows = sum(data.num_rows) + data.skipped
    reader = TableReader(data, split="train", batch_size=1024, rank=0, world_size=1)
    wall, cpu, read = time.perf_counter(), time.process_time(), 0
    for batch in reader:
        read += batch.batch_size
    read_wall, read_cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"rows": rows, "train_rows": data.num_rows[0], "scan_rows_per_s": rows / scan_wall,
            "scan_rows_per_cpu_s": rows / scan_cpu, "read_rows_per_s": read / read_wall,
            "read_rows_per_cpu_s": read / read_cpu}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3, help="turns of every format (median)")
    parser.add_argument("--keep", type=Path, help="write the log and schema here, and keep them")
    parser.add_argument("--out", type=Path, help="a Markdown report (and .json beside it)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench_table_"))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ratings.toml").write_text(SCHEMA)
    files = write_files(folder, ratings(args.rows))
    print(f"wrote {args.rows:,} rows: {', '.join(str(p) for p in files.values())}")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in files}
    for _ in range(args.rounds):
        for name, path in files.items():
            runs[name].append(measure(path, folder / "ratings.toml"))
            print(name, {k: round(v) for k, v in runs[name][-1].items()})
    if args.out and args.rounds:
        _report(args, runs)


def _report(args: argparse.Namespace, runs: dict[str, list[dict[str, float]]]) -> None:
    keys = ("scan_rows_per_s", "scan_rows_per_cpu_s", "read_rows_per_s", "read_rows_per_cpu_s")
    median = {
        name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()
    }
    spread = {name: {k: (min(r[k] for r in rs), max(r[k] for r in rs)) for k in keys}
              for name, rs in runs.items()}  # fmt: skip
    command = f"python benchmarks/bench_table.py --rows {args.rows} --rounds {args.rounds} --out {args.out}"
    lines = ["# Reading a user's table", "", f"    {command}", "",
             f"A MovieLens-like log of {args.rows:,} ratings (9 columns, 7 used), one rank, one "
             "thread; medians of the rounds (min-max in brackets). Scan: read, parse, check and "
             "fit every row (two passes: the split is per user by time). Read: the training "
             "split into batches of 1,024 (parse, encode, shuffle, batch).", "",
             "| file | scan rows/s | scan rows/CPU-s | read rows/s | read rows/CPU-s |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name in runs:
        cells = [f"{median[name][k]:,.0f} ({spread[name][k][0]:,.0f}-{spread[name][k][1]:,.0f})"
                 for k in keys]  # fmt: skip
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"Machine: {machine_line()} (the .json beside this file has the rest)."]
    args.out.write_text("\n".join(lines) + "\n")
    report = {"command": command, "machine": machine_info(), "runs": runs, "median": median}
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
