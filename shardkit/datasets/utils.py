"""TorchRec's dataset building blocks (``torchrec.datasets.utils``): `Batch`, and the data pipes
that read local files line by line and split them into training and validation.

Files are opened with Python's ``open``: TorchRec goes through iopath's ``PathManager``, which
shardkit does not depend on, so a remote path (``scheme://...``) is refused with that reason.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import IO, Any, TypeVar

import torch
from torch.utils.data import IterDataPipe, functional_datapipe, get_worker_info

from shardkit.data import Batch as _DataBatch
from shardkit.streamable import Pipelineable

__all__ = [
    "PATH_MANAGER_KEY",
    "Batch",
    "Limit",
    "LoadFiles",
    "ParallelReadConcat",
    "ReadLinesFromCSV",
    "idx_split_train_val",
    "rand_split_train_val",
    "safe_cast",
    "train_filter",
    "val_filter",
]

PATH_MANAGER_KEY = "torchrec"  # accepted for TorchRec's signatures; files open with open()


@dataclass(frozen=True, eq=False)
class Batch(_DataBatch, Pipelineable):
    """TorchRec's batch: ``dense_features`` ``[B, N]``, ``sparse_features`` (a KJT of stride B),
    ``labels`` ``[B]``, and shardkit's optional ``weights`` ``[B]``.

    It is `shardkit.data.Batch` (so shardkit's pipelines and models take it) with TorchRec's
    looser labels: any 1-D numeric tensor (TorchRec's random and Criteo data give integer
    labels; ``DLRMTrain`` converts them with ``.float()``).
    """

    def __post_init__(self) -> None:
        if not isinstance(self.labels, torch.Tensor) or self.labels.dim() != 1:
            raise ValueError(
                f"Batch: labels must be a 1-D tensor, got {type(self.labels).__name__} of shape "
                f"{tuple(getattr(self.labels, 'shape', ()))}"
            )
        # shardkit.data.Batch's checks (types, dims, batch sizes), on float labels
        _DataBatch(self.dense_features, self.sparse_features,
                   self.labels.float() if not self.labels.is_floating_point() else self.labels,
                   self.weights)  # fmt: skip

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        moved = _DataBatch.to(_as_data(self), device, non_blocking)
        return Batch(moved.dense_features, moved.sparse_features,
                     self.labels.to(device, non_blocking=non_blocking), moved.weights)  # fmt: skip

    def pin_memory(self) -> Batch:
        pinned = _DataBatch.pin_memory(_as_data(self))
        return Batch(pinned.dense_features, pinned.sparse_features, self.labels.pin_memory(),
                     pinned.weights)  # fmt: skip


def _as_data(batch: Batch) -> _DataBatch:
    labels = batch.labels if batch.labels.is_floating_point() else batch.labels.float()
    return _DataBatch(batch.dense_features, batch.sparse_features, labels, batch.weights)


T = TypeVar("T")


def safe_cast(val: T, dest_type: Callable[[T], T], default: T) -> T:
    """``dest_type(val)``, or ``default`` when that raises ValueError (an empty field)."""
    try:
        return dest_type(val)
    except ValueError:
        return default


def train_filter(key_fn: Callable[[int], int], train_perc: float, decimal_places: int,
                 idx: int) -> bool:  # fmt: skip
    """Whether row ``idx`` is a training row: ``key_fn(idx) % 10^p < round(train_perc * 10^p)``."""
    return (key_fn(idx) % 10**decimal_places) < round(train_perc * 10**decimal_places)


def val_filter(key_fn: Callable[[int], int], train_perc: float, decimal_places: int,
               idx: int) -> bool:  # fmt: skip
    """Whether row ``idx`` is a validation row (not a training row)."""
    return not train_filter(key_fn, train_perc, decimal_places, idx)


class _IdxFilter(IterDataPipe):
    def __init__(self, datapipe: Iterable[Any], filter_fn: Callable[[int], bool]) -> None:
        super().__init__()
        self.datapipe = datapipe
        self.filter_fn = filter_fn

    def __iter__(self) -> Iterator[Any]:
        for idx, data in enumerate(self.datapipe):
            if self.filter_fn(idx):
                yield data


def _check_perc(train_perc: float) -> None:
    if not 0.0 < train_perc < 1.0:
        raise ValueError(f"train_perc must be in (0.0, 1.0), got {train_perc}")


def idx_split_train_val(
    datapipe: Iterable[Any],
    train_perc: float,
    decimal_places: int = 2,
    key_fn: Callable[[int], int] = lambda idx: idx,
) -> tuple[IterDataPipe, IterDataPipe]:
    """Training and validation pipes by row index (`train_filter` / `val_filter`)."""
    _check_perc(train_perc)
    return (
        _IdxFilter(datapipe, partial(train_filter, key_fn, train_perc, decimal_places)),
        _IdxFilter(datapipe, partial(val_filter, key_fn, train_perc, decimal_places)),
    )


class _RandFilter(IterDataPipe):
    def __init__(self, datapipe: Iterable[Any], keep: Callable[[float], bool], seed: int) -> None:
        super().__init__()
        self.datapipe = datapipe
        self.keep = keep
        self.seed = seed

    def __iter__(self) -> Iterator[Any]:
        generator = random.Random(self.seed)  # the same draws on every pass
        for data in self.datapipe:
            if self.keep(generator.random()):
                yield data


def rand_split_train_val(
    datapipe: Iterable[Any], train_perc: float, random_seed: int = 0
) -> tuple[IterDataPipe, IterDataPipe]:
    """Training and validation pipes by a seeded coin per row (``random.Random(random_seed)``:
    the two pipes draw the same coins, so every row lands in exactly one)."""
    _check_perc(train_perc)
    return (
        _RandFilter(datapipe, lambda draw: draw < train_perc, random_seed),
        _RandFilter(datapipe, lambda draw: draw >= train_perc, random_seed),
    )


class Limit(IterDataPipe):
    """The first ``limit`` items of ``datapipe`` (also ``datapipe.limit(n)``)."""

    def __init__(self, datapipe: Iterable[Any], limit: int) -> None:
        super().__init__()
        self.datapipe = datapipe
        self.limit = limit

    def __iter__(self) -> Iterator[Any]:
        for idx, data in enumerate(self.datapipe):
            if idx >= self.limit:
                break
            yield data


if "limit" not in IterDataPipe.functions:  # TorchRec registers the same name when imported
    functional_datapipe("limit")(Limit)


class ReadLinesFromCSV(IterDataPipe):
    """Rows (lists of strings) of the ``(path, file)`` pairs of ``datapipe``, through
    ``csv.reader(file, **kw)`` (e.g. ``delimiter="\\t"``)."""

    def __init__(self, datapipe: Iterable[tuple[str, IO[str]]], skip_first_line: bool = False,
                 **kw: Any) -> None:  # fmt: skip
        super().__init__()
        self.datapipe = datapipe
        self.skip_first_line = skip_first_line
        self.kw = kw

    def __iter__(self) -> Iterator[list[str]]:
        for _, data in self.datapipe:
            with data:
                reader = csv.reader(data, **self.kw)
                if self.skip_first_line:
                    next(reader, None)
                yield from reader


class LoadFiles(IterDataPipe):
    """``(path, open file)`` for each local path of ``datapipe``.

    Args:
        datapipe: the paths.
        mode: ``"b"``/``"rb"`` binary, ``"t"``/``"rt"``/``"r"`` text.
        length: what ``len()`` reports (-1: unknown).
        path_manager_key: accepted for TorchRec's signature (no iopath here).
        open_kw: passed to ``open``.
    """

    def __init__(self, datapipe: Iterable[str], mode: str = "b", length: int = -1,
                 path_manager_key: str = PATH_MANAGER_KEY, **open_kw: Any) -> None:  # fmt: skip
        super().__init__()
        if mode not in ("b", "t", "rb", "rt", "r"):
            raise ValueError(f"LoadFiles: mode {mode!r} is not one of b, t, rb, rt, r")
        self.datapipe = datapipe
        self.mode = "r" + mode if mode in ("b", "t") else mode
        self.length = length
        self.open_kw = open_kw

    def __iter__(self) -> Iterator[tuple[str, IO[Any]]]:
        for path in self.datapipe:
            if not isinstance(path, str):
                raise TypeError(f"LoadFiles: paths must be str, got {type(path).__name__}")
            if "://" in path:
                raise ValueError(
                    f"LoadFiles: {path!r} is not a local file; TorchRec opens remote paths with "
                    "iopath's PathManager, which shardkit does not use: copy the file locally"
                )
            yield path, open(path, self.mode, **self.open_kw)  # noqa: SIM115 (the reader closes it)

    def __len__(self) -> int:
        if self.length == -1:
            raise TypeError("LoadFiles: length unknown (pass length=...)")
        return self.length


def _split_evenly(datapipes: Sequence[Any]) -> Sequence[Any]:
    """The data pipes this DataLoader worker reads (all of them outside a worker)."""
    worker = get_worker_info()
    if worker is None:
        return datapipes
    if worker.num_workers > len(datapipes):
        raise ValueError(
            f"ParallelReadConcat: {worker.num_workers} DataLoader workers for "
            f"{len(datapipes)} data pipes; use at most {len(datapipes)} workers"
        )
    offsets = [0]
    for remaining_workers in reversed(range(1, worker.num_workers + 1)):
        offsets.append(offsets[-1] + math.ceil((len(datapipes) - offsets[-1]) / remaining_workers))
    return datapipes[offsets[worker.id] : offsets[worker.id + 1]]


class ParallelReadConcat(IterDataPipe):
    """The data pipes one after another; under a DataLoader with several workers each worker
    reads its contiguous share of them (``dp_selector``)."""

    def __init__(
        self,
        *datapipes: Iterable[Any],
        dp_selector: Callable[[Sequence[Any]], Sequence[Any]] = _split_evenly,
    ) -> None:
        super().__init__()
        self.datapipes = datapipes
        self.dp_selector = dp_selector

    def __iter__(self) -> Iterator[Any]:
        for datapipe in self.dp_selector(self.datapipes):
            yield from datapipe
