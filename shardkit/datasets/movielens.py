"""MovieLens 20M/25M's local CSV files row by row (``torchrec.datasets.movielens``).

``root`` holds ``ratings.csv`` (``userId,movieId,rating,timestamp``) and, for
``include_movies_data=True``, ``movies.csv`` (``movieId,title,genres``) joined on ``movieId``.
Each row becomes ``{"userId": int, "movieId": int, "rating": float, "timestamp": int}`` (plus
``"title"``, ``"genres"``), or whatever ``row_mapper`` makes of the list of strings. Nothing is
downloaded.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.utils.data.datapipes as dp
from torch.utils.data import IterDataPipe

from shardkit.datasets.utils import LoadFiles, ReadLinesFromCSV, safe_cast

__all__ = [
    "COLUMN_TYPE_CASTERS",
    "DEFAULT_COLUMN_NAMES",
    "DEFAULT_MOVIES_COLUMN_NAMES",
    "DEFAULT_RATINGS_COLUMN_NAMES",
    "MOVIES_FILENAME",
    "RATINGS_FILENAME",
    "movielens_20m",
    "movielens_25m",
]

RATINGS_FILENAME = "ratings.csv"
MOVIES_FILENAME = "movies.csv"
DEFAULT_RATINGS_COLUMN_NAMES: list[str] = ["userId", "movieId", "rating", "timestamp"]
DEFAULT_MOVIES_COLUMN_NAMES: list[str] = ["movieId", "title", "genres"]
DEFAULT_COLUMN_NAMES: list[str] = DEFAULT_RATINGS_COLUMN_NAMES + DEFAULT_MOVIES_COLUMN_NAMES[1:]
COLUMN_TYPE_CASTERS: list[Callable[[Any], Any]] = [
    lambda v: safe_cast(v, int, 0),
    lambda v: safe_cast(v, int, 0),
    lambda v: safe_cast(v, float, 0.0),
    lambda v: safe_cast(v, int, 0),
    lambda v: safe_cast(v, str, ""),
    lambda v: safe_cast(v, str, ""),
]


def _default_row_mapper(example: list[str]) -> dict[str, Any]:
    return {DEFAULT_COLUMN_NAMES[i]: COLUMN_TYPE_CASTERS[i](v) for i, v in enumerate(example)}


def _rows(path: str, **open_kw: Any) -> IterDataPipe:
    return ReadLinesFromCSV(LoadFiles((path,), mode="r", **open_kw), skip_first_line=True,
                            delimiter=",")  # fmt: skip


def _movielens(root: str, *, include_movies_data: bool = False,
               row_mapper: Callable[[list[str]], Any] | None = _default_row_mapper,
               **open_kw: Any) -> IterDataPipe:  # fmt: skip
    ratings = os.path.join(root, RATINGS_FILENAME)
    if not os.path.isfile(ratings):
        raise FileNotFoundError(
            f"no {RATINGS_FILENAME} in {root!r}; download and unpack MovieLens there (shardkit "
            "reads local files and never downloads)"
        )
    rows = _rows(ratings, **open_kw)
    if include_movies_data:
        movies = {row[0]: row[1:] for row in _rows(os.path.join(root, MOVIES_FILENAME))}

        def join(row: list[str]) -> list[str]:
            if row[1] not in movies:
                raise ValueError(f"{MOVIES_FILENAME} has no movieId {row[1]} (rated in {ratings})")
            return row + movies[row[1]]

        rows = dp.iter.Mapper(rows, join)
    return dp.iter.Mapper(rows, row_mapper) if row_mapper else rows


def movielens_20m(root: str, *, include_movies_data: bool = False,
                  row_mapper: Callable[[list[str]], Any] | None = _default_row_mapper,
                  **open_kw: Any) -> IterDataPipe:  # fmt: skip
    """The ratings of MovieLens 20M in ``root`` (see the module's docstring)."""
    return _movielens(root, include_movies_data=include_movies_data, row_mapper=row_mapper,
                      **open_kw)  # fmt: skip


def movielens_25m(root: str, *, include_movies_data: bool = False,
                  row_mapper: Callable[[list[str]], Any] | None = _default_row_mapper,
                  **open_kw: Any) -> IterDataPipe:  # fmt: skip
    """The ratings of MovieLens 25M in ``root`` (see the module's docstring)."""
    return _movielens(root, include_movies_data=include_movies_data, row_mapper=row_mapper,
                      **open_kw)  # fmt: skip
