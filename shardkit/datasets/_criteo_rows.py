"""Criteo's columns and its TSV files read row by row (TorchRec's ``criteo_kaggle`` /
``criteo_terabyte``): each row a dict ``{"label": int, "int_0".."int_12": int, "cat_0".."cat_25":
str}``, empty fields as 0 or ``""``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.utils.data.datapipes as dp
from torch.utils.data import IterDataPipe

from shardkit.datasets.utils import LoadFiles, ReadLinesFromCSV, safe_cast

__all__ = [
    "CAT_FEATURE_COUNT",
    "COLUMN_TYPE_CASTERS",
    "DAYS",
    "DEFAULT_CAT_NAMES",
    "DEFAULT_COLUMN_NAMES",
    "DEFAULT_INT_NAMES",
    "DEFAULT_LABEL_NAME",
    "FREQUENCY_THRESHOLD",
    "INT_FEATURE_COUNT",
    "TOTAL_TRAINING_SAMPLES",
    "CriteoIterDataPipe",
    "criteo_kaggle",
    "criteo_terabyte",
]

FREQUENCY_THRESHOLD = 3
INT_FEATURE_COUNT = 13
CAT_FEATURE_COUNT = 26
DAYS = 24
DEFAULT_LABEL_NAME = "label"
DEFAULT_INT_NAMES: list[str] = [f"int_{i}" for i in range(INT_FEATURE_COUNT)]
DEFAULT_CAT_NAMES: list[str] = [f"cat_{i}" for i in range(CAT_FEATURE_COUNT)]
DEFAULT_COLUMN_NAMES: list[str] = [DEFAULT_LABEL_NAME, *DEFAULT_INT_NAMES, *DEFAULT_CAT_NAMES]
TOTAL_TRAINING_SAMPLES = 4195197692  # the Terabyte data set's days 0-22 (day 23: validation)


def _as_int(value: Any) -> Any:
    return safe_cast(value, int, 0)


def _as_str(value: Any) -> Any:
    return safe_cast(value, str, "")


COLUMN_TYPE_CASTERS: list[Callable[[Any], Any]] = [
    _as_int,
    *[_as_int] * INT_FEATURE_COUNT,
    *[_as_str] * CAT_FEATURE_COUNT,
]


def _default_row_mapper(example: list[str]) -> dict[str, Any]:
    """Columns named from the right, so Kaggle's test file (no label column) maps too."""
    names, casters = DEFAULT_COLUMN_NAMES[::-1], COLUMN_TYPE_CASTERS[::-1]
    return {names[i]: casters[i](value) for i, value in enumerate(reversed(example))}


class CriteoIterDataPipe(IterDataPipe):
    """The rows of Criteo TSV files, through ``row_mapper`` (None: the raw lists of strings).
    Under a DataLoader with several workers, worker ``w`` reads files ``w, w + n, ...``.

    Args:
        paths: local TSV files.
        row_mapper: a row (list of 40 strings) to what the pipe yields.
        open_kw: passed to ``open``.
    """

    def __init__(self, paths: Iterable[str], *,
                 row_mapper: Callable[[list[str]], Any] | None = _default_row_mapper,
                 **open_kw: Any) -> None:  # fmt: skip
        self.paths = paths
        self.row_mapper = row_mapper
        self.open_kw = open_kw

    def __iter__(self) -> Iterator[Any]:
        worker = torch.utils.data.get_worker_info()
        paths: Iterable[str] = self.paths
        if worker is not None:
            paths = [p for i, p in enumerate(paths) if i % worker.num_workers == worker.id]
        lines = ReadLinesFromCSV(LoadFiles(paths, mode="r", **self.open_kw), delimiter="\t")
        yield from dp.iter.Mapper(lines, self.row_mapper) if self.row_mapper else lines


def criteo_terabyte(paths: Iterable[str], *,
                    row_mapper: Callable[[list[str]], Any] | None = _default_row_mapper,
                    **open_kw: Any) -> IterDataPipe:  # fmt: skip
    """The rows of the Terabyte data set's day files (``day_0.tsv`` ...)."""
    return CriteoIterDataPipe(paths, row_mapper=row_mapper, **open_kw)


def criteo_kaggle(path: str, *,
                  row_mapper: Callable[[list[str]], Any] | None = _default_row_mapper,
                  **open_kw: Any) -> IterDataPipe:  # fmt: skip
    """The rows of the Kaggle data set's ``train.txt`` (or ``test.txt``: no label)."""
    return CriteoIterDataPipe((path,), row_mapper=row_mapper, **open_kw)
