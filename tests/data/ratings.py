"""A small ratings log like MovieLens's, generated (never downloaded), and its schema.

Row ``i``: a user (with age, gender, occupation, zip), a movie (with 1-3 genres), a rating 1-5
that depends on the user's and the movie's taste (so a model can learn it), and a timestamp
``T0 + 64 * i`` (seconds near 2001, as MovieLens's; exact in float32, so a test can read the
row back from a batch's dense features).
"""

from __future__ import annotations

import csv
import gzip
import json
import random
from pathlib import Path

COLUMNS = ("user_id", "movie_id", "rating", "timestamp", "genres", "age", "gender", "occupation",
           "zip")  # fmt: skip
T0 = 978_300_032  # a multiple of 64: float32 holds T0 + 64 * i exactly below 2**30
GENRES = ("Action", "Comedy", "Drama", "Horror", "Romance", "Sci-Fi", "Thriller", "War")

SCHEMA = {
    "label": "rating >= 4",
    "columns": {
        "user_id": {"type": "categorical", "min_count": 2},
        "movie_id": {"type": "categorical"},
        "genres": {"type": "multi_hot", "separator": "|", "pooling": "mean"},
        "occupation": "categorical",
        "gender": "categorical",
        "zip": {"type": "categorical", "ids": "hash", "num_embeddings": 50},
        "age": {"type": "dense", "transform": "standardize"},
        "timestamp": {"type": "dense", "transform": ["log1p", "standardize"]},
    },
    "split": {"validation_fraction": 0.2},
}

# The same schema as a user writes it: TOML.
SCHEMA_TOML = """
label = "rating >= 4"

[columns]
user_id = { type = "categorical", min_count = 2 }
movie_id = { type = "categorical" }
genres = { type = "multi_hot", separator = "|", pooling = "mean" }
occupation = "categorical"
gender = "categorical"
zip = { type = "categorical", ids = "hash", num_embeddings = 50 }
age = { type = "dense", transform = "standardize" }
timestamp = { type = "dense", transform = ["log1p", "standardize"] }

[split]
validation_fraction = 0.2
"""


def ratings_rows(num_rows: int, *, seed: int = 0, num_users: int = 40, num_movies: int = 60):
    """The rows (lists of strings, in `COLUMNS` order)."""
    rng = random.Random(seed)
    users = [(rng.gauss(0, 1), rng.randint(18, 70), rng.choice("MF"), rng.randint(0, 20),
              f"{rng.randint(10000, 99999)}") for _ in range(num_users)]  # fmt: skip
    movies = [(rng.gauss(0, 1), rng.sample(GENRES, rng.randint(1, 3))) for _ in range(num_movies)]
    rows = []
    for i in range(num_rows):
        user, movie = rng.randrange(num_users), rng.randrange(num_movies)
        taste, age, gender, occupation, zip_code = users[user]
        quality, genres = movies[movie]
        score = 3.2 + 0.9 * taste + 0.9 * quality + rng.gauss(0, 0.6)
        rating = min(5, max(1, round(score)))
        rows.append([str(user), str(movie), str(rating), str(T0 + 64 * i),
                     "|".join(genres), str(age), gender, str(occupation), zip_code])  # fmt: skip
    return rows


def write_ratings(path: Path, num_rows: int = 600, *, seed: int = 0, delimiter: str = ",",
                  compress: bool = False) -> Path:  # fmt: skip
    """A CSV (or TSV, or gzip) ratings file with a header."""
    rows = ratings_rows(num_rows, seed=seed)
    opener = gzip.open if compress else open
    with opener(path, "wt", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    return path


def write_ratings_parquet(path: Path, num_rows: int = 600, *, seed: int = 0,
                          row_group_size: int = 128) -> Path:  # fmt: skip
    """The same rows as Parquet: numbers typed, genres a list column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = ratings_rows(num_rows, seed=seed)
    columns = {name: [r[i] for r in rows] for i, name in enumerate(COLUMNS)}
    for name in ("user_id", "movie_id", "rating", "timestamp", "age", "occupation"):
        columns[name] = [int(v) for v in columns[name]]
    columns["genres"] = [v.split("|") for v in columns["genres"]]
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def write_schema(path: Path, schema: dict | None = None) -> Path:
    path.write_text(json.dumps(schema or SCHEMA, indent=1))
    return path
