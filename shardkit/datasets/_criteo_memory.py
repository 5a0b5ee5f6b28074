"""`InMemoryBinaryCriteoIterDataPipe`: batches from Criteo's ``.npy`` files held in memory
(TorchRec's class, its arguments and its batching).

[Note: in-memory Criteo batches]
Rows are the files' rows in order (``stage="val"``: the first half of the first file, rounded up;
``"test"``: the second half). Batches of ``batch_size`` rows are dealt round-robin: global batch
``i`` goes to rank ``i % world_size``; every rank gets the same number of full batches. The rows
left over (unless ``drop_last``) are split into one last batch per rank, the first ``remainder %
world_size`` ranks one row bigger; if fewer rows are left than ranks, the last full round is
split with them instead. Each rank keeps (or, with ``mmap_mode``, maps) only what it reads.
``shuffle_training_set`` (train stage) shuffles all rows once (``np.random.seed``) and gives each
rank a contiguous share, then batches that share alone; ``shuffle_batches`` permutes the rows
inside each batch. ``hashes`` folds each sparse column's ids modulo its table size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import numpy as np
import torch
from torch.utils.data import IterableDataset

from shardkit.datasets._criteo_binary import local
from shardkit.datasets._criteo_rows import CAT_FEATURE_COUNT, DEFAULT_CAT_NAMES
from shardkit.datasets.utils import PATH_MANAGER_KEY, Batch
from shardkit.sparse import KeyedJaggedTensor

__all__ = ["InMemoryBinaryCriteoIterDataPipe"]


class InMemoryBinaryCriteoIterDataPipe(IterableDataset):
    """One rank's batches of Criteo's ``.npy`` files; see [Note: in-memory Criteo batches].

    Args:
        stage: ``"train"``, ``"val"`` or ``"test"``.
        dense_paths, sparse_paths, labels_paths: the files, one of each per day.
        batch_size: rows per batch.
        rank, world_size: this rank and how many read together.
        drop_last: drop the rows that do not fill a round of full batches.
        shuffle_batches: permute the rows inside each batch.
        shuffle_training_set: shuffle all training rows once (``stage="train"``).
        shuffle_training_set_random_seed: the seed of both shuffles (``np.random.seed``).
        mmap_mode: map the files instead of reading them.
        hashes: the 26 tables' sizes; ids are taken modulo them.
        path_manager_key: accepted for TorchRec's signature (local files only).
    """

    def __init__(self, stage: str, dense_paths: list[str], sparse_paths: list[str],
                 labels_paths: list[str], batch_size: int, rank: int, world_size: int,
                 drop_last: bool | None = False, shuffle_batches: bool = False,
                 shuffle_training_set: bool = False, shuffle_training_set_random_seed: int = 0,
                 mmap_mode: bool = False, hashes: list[int] | None = None,
                 path_manager_key: str = PATH_MANAGER_KEY) -> None:  # fmt: skip
        if stage not in ("train", "val", "test"):
            raise ValueError(f"stage must be 'train', 'val' or 'test', got {stage!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.stage, self.batch_size = stage, batch_size
        self.rank, self.world_size = rank, world_size
        self.drop_last, self.shuffle_batches, self.mmap_mode = drop_last, shuffle_batches, mmap_mode
        np.random.seed(shuffle_training_set_random_seed)
        self.hashes = None if hashes is None else np.array(hashes).reshape(1, CAT_FEATURE_COUNT)
        paths = (dense_paths, sparse_paths, labels_paths)
        if shuffle_training_set and stage == "train":
            self.arrays = _shuffled_share(paths, rank, world_size)
            self.rank, self.world_size = 0, 1
        else:
            mode: Literal["r"] | None = "r" if mmap_mode else None
            self.arrays = [[np.load(local(f), mmap_mode=mode) for f in p] for p in paths]
        self._split_stage()
        if not mmap_mode and self.hashes is not None:
            for sparse in self.arrays[1]:
                sparse %= self.hashes
        self.num_rows_per_file = [len(a) for a in self.arrays[0]]
        self._plan_batches(sum(self.num_rows_per_file))

    def _split_stage(self) -> None:
        if self.stage == "train":
            return
        half = (len(self.arrays[0][0]) + 1) // 2
        for arrays in self.arrays:
            arrays[0] = arrays[0][:half] if self.stage == "val" else arrays[0][half:]

    def _plan_batches(self, total_rows: int) -> None:
        w, b = self.world_size, self.batch_size
        self.num_full_batches = total_rows // b // w * w
        self.last_batch_sizes = np.zeros(w, dtype=np.int64)
        remainder = total_rows % (w * b)
        if not self.drop_last and remainder > 0:
            if remainder < w:  # too few rows for one per rank: split the last round with them
                self.num_full_batches -= w
                self.last_batch_sizes += b
            else:
                self.last_batch_sizes += remainder // w
            self.last_batch_sizes[: remainder % w] += 1

    def __len__(self) -> int:
        return self.num_full_batches // self.world_size + int(self.last_batch_sizes[0] > 0)

    def _batch_sizes(self) -> Iterator[int]:
        """The size of every global batch, in order."""
        yield from [self.batch_size] * self.num_full_batches
        if self.last_batch_sizes[0] > 0:
            yield from (int(s) for s in self.last_batch_sizes)

    def __iter__(self) -> Iterator[Batch]:
        rows = _RowCursor(self.arrays, self.num_rows_per_file)
        for index, size in enumerate(self._batch_sizes()):
            mine = index % self.world_size == self.rank
            parts = rows.take(size, keep=mine)
            if mine:
                yield self._to_batch(*parts)

    def _to_batch(self, dense: np.ndarray, sparse: np.ndarray, labels: np.ndarray) -> Batch:
        if self.mmap_mode and self.hashes is not None:
            sparse = sparse % self.hashes
        if self.shuffle_batches:
            order = np.random.permutation(len(dense))
            dense, sparse, labels = dense[order], sparse[order], labels[order]
        batch = len(dense)
        values = torch.from_numpy(np.ascontiguousarray(sparse.transpose(1, 0)).reshape(-1))
        return Batch(
            dense_features=torch.from_numpy(np.ascontiguousarray(dense)),  # [B, 13]
            sparse_features=KeyedJaggedTensor(
                keys=DEFAULT_CAT_NAMES,
                values=values,  # one id per bag, key-major
                lengths=torch.ones(CAT_FEATURE_COUNT * batch, dtype=torch.int32),
            ),
            labels=torch.from_numpy(np.ascontiguousarray(labels).reshape(-1)),  # [B]
        )


class _RowCursor:
    """Walks the files' rows in order, handing out runs of rows."""

    def __init__(self, arrays: list[list[np.ndarray]], rows_per_file: list[int]) -> None:
        self.arrays, self.rows_per_file = arrays, rows_per_file
        self.file, self.row = 0, 0

    def take(self, count: int, *, keep: bool) -> tuple[np.ndarray, ...]:
        """The next ``count`` rows of dense, sparse, labels (read only when ``keep``)."""
        pieces: list[list[np.ndarray]] = [[], [], []]
        while count > 0 and self.file < len(self.rows_per_file):
            n = min(count, self.rows_per_file[self.file] - self.row)
            if keep:
                for piece, arrays in zip(pieces, self.arrays):
                    piece.append(arrays[self.file][self.row : self.row + n])
            count -= n
            self.row += n
            if self.row >= self.rows_per_file[self.file]:
                self.file, self.row = self.file + 1, 0
        return tuple(np.concatenate(p) if p else np.empty((0,)) for p in pieces)


def _shuffled_share(paths: tuple[list[str], ...], rank: int, world_size: int) -> list[list]:
    """All rows shuffled (row ``i`` moves to ``np.random.permutation(total)[i]``, TorchRec's
    order); this rank's contiguous share of the shuffled rows."""
    arrays = [[np.load(local(f), mmap_mode="r") for f in p] for p in paths]
    total = sum(len(a) for a in arrays[0])
    permutation = np.random.permutation(total)
    per_rank = np.full(world_size, total // world_size)
    per_rank[: total % world_size] += 1
    start, end = int(np.sum(per_rank[:rank])), int(np.sum(per_rank[: rank + 1]))
    shares = []
    for files in arrays:
        full = np.concatenate([np.asarray(f) for f in files])
        shuffled = np.empty_like(full)
        shuffled[permutation] = full
        shares.append([shuffled[start:end]])
    return shares
