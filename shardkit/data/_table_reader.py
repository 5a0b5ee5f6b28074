"""`TableReader`: a rank's batches of a scanned table, read from its own part of the files in
pieces (C++ parsing, vectorized encoding), shuffled in bounded memory, prefetched in a
background thread, resumable; optionally from a cache of the encoded split.

[Note: reading a table on N ranks]
The split's rows, in file order, are cut into ``W`` runs of as equal size as can be (the first
``rows % W`` ranks get one more): rank ``r`` reads rows ``[r * N // W, (r + 1) * N // W)`` of the
split, which lie in a run of pieces (see [Note: table pieces]); it reads those pieces only
(seeking to them in plain CSV, reading their row groups in Parquet; a gzip file is decompressed
up to them) and keeps its rows of them, so every row is read by exactly one rank (a piece at a
run's edge is parsed by the two ranks that share it), and ranks on several hosts read in
parallel. Every rank knows every rank's row count from the pieces' counts, so all agree on the
steps of an epoch without talking:

- training (``LastBatch.DROP``): ``min over ranks of rows // B`` steps; each rank drops the
  rest of its rows, which (with the shuffle) are other rows every epoch;
- validation (``LastBatch.PAD``): ``max over ranks of ceil(rows / B)`` steps; every row comes
  once with weight 1, and batches are padded to ``B`` with empty rows of weight 0.

Shuffling (training): each epoch visits the rank's pieces in a seeded order (a gzip file's
pieces in file order, since reaching one decompresses the file up to it; a Parquet row group's
pieces one after the other, so it is read once), then passes the
rows through a buffer of ``shuffle_buffer`` rows (`shuffle_buffer`). Memory: the buffer, a
piece or two, and the prefetched batches. The order depends on the world size (unlike
`GlobalBatchIterator`): ranks read their own parts.

Batches are made in a background thread, ``prefetch`` batches ahead (0: in the caller's
thread), so reading overlaps training (Arrow's, NumPy's and torch's kernels release the GIL; a
reading process forked per epoch was measured against the thread under a training step and
gained nothing: removed, see benchmarks/results/table_zen3_scan_strings.md). When an
epoch's last batch is taken, the next epoch's reading starts, so its first batches (a piece
read, the shuffle buffer filled) are ready while the caller validates and checkpoints.

Resuming: the state is ``(epoch, batches)``; within an epoch it needs the same world size and
batch size, and re-reads the rank's rows up to that point (O(position) time); at an epoch's end
any world size resumes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shardkit.data._batch import Batch
from shardkit.data._global_batch import LastBatch, check_batching, resolve_rank
from shardkit.data._hash import mix_int
from shardkit.data._table_columns import ColumnParser
from shardkit.data._table_encoded import ColumnEncoder, EncodedRows, shuffle_buffer
from shardkit.data._table_pieces import arrow, read_pieces, record_numbers
from shardkit.data._table_scan import (
    FILE,
    FIRST_RECORD,
    INDEX,
    NUM_TRAIN,
    NUM_VALIDATION,
    ROW_GROUP,
    SOURCE,
    TableData,
)
from shardkit.data._table_split import TRAIN, VALIDATION

__all__ = ["TableReader"]

logger = logging.getLogger(__name__)

_ORDER_STREAM, _BUFFER_STREAM = 0x0D3E, 0xB0F


class TableReader:
    """This rank's batches of one split of a scanned table (see [Note: reading a table on N
    ranks])::

        data = scan_table(["ratings.csv"], load_schema("ratings.toml"))
        train = TableReader(data, split="train", batch_size=256)          # rank from the group
        validation = TableReader(data, split="validation", batch_size=256)
        for epoch in range(3):
            for batch in train:      # len(train) batches on every rank
                ...

    Args:
        data: the scanned table (`scan_table`).
        split: ``"train"`` or ``"validation"``.
        batch_size: ``B``, examples per rank per step.
        rank, world_size: this rank and the number of ranks; both None: from torch.distributed.
        shuffle: shuffle each epoch (default: for training only).
        shuffle_buffer: rows the shuffle holds.
        seed: the shuffle's seed (the same on every rank).
        last_batch: DROP (default for training) or PAD (default for validation).
        prefetch: batches made ahead in the background (0: none, read when asked).
        cache: a folder for the encoded split (see [Note: table cache]); None: none.
    """

    def __init__(
        self,
        data: TableData,
        *,
        split: str = "train",
        batch_size: int,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool | None = None,
        shuffle_buffer: int = 16_384,
        seed: int = 0,
        last_batch: LastBatch | None = None,
        prefetch: int = 4,
        cache: str | Path | None = None,
    ) -> None:
        if split not in ("train", "validation"):
            raise ValueError(f"TableReader: split must be 'train' or 'validation', got {split!r}")
        self.rank, self.world_size = resolve_rank("TableReader", rank, world_size)
        last_batch = last_batch or (LastBatch.DROP if split == "train" else LastBatch.PAD)
        check_batching("TableReader", batch_size, last_batch)
        if last_batch is LastBatch.UNEVEN:
            raise ValueError("TableReader: last_batch must be DROP or PAD (every rank steps "
                             "with the same batch size)")  # fmt: skip
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
            raise ValueError(
                f"TableReader: shuffle_buffer must be an int >= 1, got {shuffle_buffer!r}"
            )
        if not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"TableReader: prefetch must be an int >= 0, got {prefetch!r}")
        self.data, self.split, self.batch_size = data, split, batch_size
        self.shuffle = split == "train" if shuffle is None else shuffle
        self.shuffle_buffer, self.seed, self.last_batch = shuffle_buffer, seed, last_batch
        self.prefetch = prefetch
        self.want = TRAIN if split == "train" else VALIDATION
        self._runs, self.rows_per_rank = _partition(data, self.want, self.rank, self.world_size)
        self._steps = self._count_steps()
        self.epoch, self._batches = 0, 0
        self._skip = 0  # batches to pass over silently (resuming mid-epoch)
        # the prefetcher started ahead: (epoch, batches it passes over, prefetcher)
        self._ahead: tuple[int, int, Any] | None = None
        arrow()  # pyarrow's modules, and the vocabularies' hash tables: loaded and made now,
        _encoder(data)  # not in the first step
        self._cache: Any = None
        if cache is not None:
            from shardkit.data._table_cache import SplitCache

            self._cache = SplitCache(Path(cache), data, self.want)

    @property
    def keys(self) -> tuple[str, ...]:
        return self.data.fitted.keys

    def __len__(self) -> int:
        """Steps per epoch (the same on every rank)."""
        return self._steps

    def _count_steps(self) -> int:
        rows, size = self.rows_per_rank, self.batch_size
        if self.last_batch is LastBatch.PAD:
            return -(-max(rows) // size)
        steps = min(rows) // size
        if steps == 0:
            raise ValueError(
                f"TableReader: the {self.split} split has {sum(rows):,} rows, {min(rows):,} on the "
                f"rank with the fewest of {self.world_size}: not one batch of {size}; use a "
                "smaller batch size, fewer ranks, or more data"
            )
        return steps

    def __iter__(self) -> Iterator[Batch]:
        batches = self._start(self.epoch, self._skip)
        try:
            while self._batches < self._steps:
                batch = next(batches, None)
                if batch is None:
                    raise RuntimeError(f"TableReader: rank {self.rank} ran out of rows at batch "
                                       f"{self._batches} of {self._steps}: the files changed "
                                       "since they were scanned; start the run again")  # fmt: skip
                self._batches += 1
                yield batch
        finally:
            batches.close()  # type: ignore[attr-defined]
        self.epoch, self._batches, self._skip = self.epoch + 1, 0, 0
        self.start()  # the next epoch's first batches are made while the caller validates

    def start(self) -> None:
        """Start making the next epoch's first batches in the background now (with
        ``prefetch``; else nothing), e.g. while the model is built: the first epoch then does
        not begin by waiting for its first piece and the shuffle buffer, as later epochs do not
        (their reading starts when the previous epoch ends). `iter` takes them;
        `load_state_dict` to another position drops them."""
        if self.prefetch and self._ahead is None:
            batches = self._make(self.epoch, self._skip)
            self._ahead = (self.epoch, self._skip, self._prefetcher(batches))

    def _start(self, epoch: int, skip: int) -> Iterator[Batch]:
        """The epoch's batches: prefetched ahead at the last epoch's end, or started now."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            if ahead[:2] == (epoch, skip):
                return ahead[2]
            ahead[2].close()
        batches = self._make(epoch, skip)
        return self._prefetcher(batches) if self.prefetch else batches

    def _prefetcher(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        return _Prefetcher(batches, self.prefetch)

    def _make(self, epoch: int, skip: int) -> Iterator[Batch]:
        """The epoch's batches from the ``skip``-th on (made in the background)."""
        fitted = self.data.fitted
        layout = _encoder(self.data).layout
        chunks = self._chunks(epoch)
        if self.shuffle:
            chunks = shuffle_buffer(chunks, self.shuffle_buffer,
                                    mix_int(self.seed, epoch, self.rank, _BUFFER_STREAM))  # fmt: skip
        size, made = self.batch_size, 0
        pending: list[EncodedRows] = []
        held = 0
        for chunk in chunks:
            pending.append(chunk)
            held += len(chunk)
            if held < size:
                continue
            rows = EncodedRows.cat(pending)
            start = 0
            while held - start >= size and made < self._steps:
                if made >= skip:
                    yield rows.slice(start, start + size).batch(fitted.keys)
                made, start = made + 1, start + size
            pending, held = [rows.slice(start, len(rows))], held - start
            if made >= self._steps:
                return
        if made < self._steps and self.last_batch is LastBatch.PAD:
            rest: EncodedRows | None = EncodedRows.cat(pending) if pending else None
            while made < self._steps:
                real = 0 if rest is None else min(len(rest), size)
                part = EncodedRows.empty(len(fitted.dense), layout, size - real)
                if real:
                    assert rest is not None
                    part = EncodedRows.cat([rest.slice(0, real), part])
                    rest = rest.slice(real, len(rest))
                weights = torch.zeros(size)
                weights[:real] = 1.0
                if made >= skip:
                    yield part.batch(fitted.keys, weights)
                made += 1

    def _chunks(self, epoch: int) -> Iterator[EncodedRows]:
        """This rank's rows of the split, a piece at a time, in the epoch's order."""
        if self._cache is not None:
            yield from self._cache.chunks(self._order(epoch), self._read)
            return
        for group in self._groups(self._order(epoch)):
            yield from self._read(group)

    def _order(self, epoch: int) -> list[tuple[int, int, int]]:
        """This rank's runs ``(piece, skip, take)`` in the epoch's order."""
        if not self.shuffle:
            return self._runs
        pieces = self.data.pieces

        def key(run: tuple[int, int, int]) -> tuple[int, int]:
            row = pieces[run[0]].tolist()
            at = (row[SOURCE], row[FILE])
            if self.data.files[at[0]][at[1]].kind == "csv.gz":  # in file order within the file
                return (mix_int(self.seed, epoch, _ORDER_STREAM, *at), run[0])
            within = row[ROW_GROUP] if row[ROW_GROUP] >= 0 else row[INDEX]
            return (mix_int(self.seed, epoch, _ORDER_STREAM, *at, within), run[0])

        return sorted(self._runs, key=key)

    def _groups(self, runs: list[tuple[int, int, int]]) -> Iterator[list[tuple[int, int, int]]]:
        """Runs read in one pass: consecutive runs of one gzip file (one decompression) or of
        one Parquet row group (read once)."""
        group: list[tuple[int, int, int]] = []
        for run in runs:
            if group and self._part(group[-1][0]) != self._part(run[0]):
                yield group
                group = []
            group.append(run)
        if group:
            yield group

    def _part(self, piece: int) -> tuple[int, ...]:
        """What a piece is read with: its gzip file, its Parquet row group, or itself."""
        row = self.data.pieces[piece].tolist()
        if self.data.files[row[SOURCE]][row[FILE]].kind == "csv.gz":
            return (row[SOURCE], row[FILE])
        if row[ROW_GROUP] >= 0:
            return (row[SOURCE], row[FILE], -1, row[ROW_GROUP])
        return (row[SOURCE], row[FILE], row[INDEX])

    def _read(self, runs: list[tuple[int, int, int]]) -> Iterator[EncodedRows]:
        """The encoded rows of runs of one file (see `_groups`), in the runs' order."""
        data = self.data
        rows = [data.pieces[run[0]].tolist() for run in runs]
        source, file = rows[0][SOURCE], rows[0][FILE]
        table_file = data.files[source][file]
        parser = ColumnParser(data.fitted.schema, data.fitted.keys, table_file.columns)
        encoder = _encoder(data)
        wanted = {row[INDEX]: (run, row) for run, row in zip(runs, rows)}
        for piece, table, ragged in read_pieces(
            table_file, source, file, wanted.__contains__, parser.dictionary(table_file.kind)
        ):
            (_, skip, take), row = wanted[piece.index]
            columns, _ = parser.parse(
                table, record_numbers(table, ragged)
            )  # bad rows: counted by the scan
            kinds = data.split.kinds(source, file, piece.first_key + columns.records,
                                     columns.times, columns.users,
                                     row[FIRST_RECORD] + columns.records)  # fmt: skip
            mine = np.flatnonzero(kinds == self.want)[skip : skip + take]
            keep = np.zeros(len(columns), dtype=bool)
            keep[mine] = True
            yield encoder.encode(columns.filter(keep))

    def state_dict(self) -> dict[str, Any]:
        """Where the reader is: ``epoch`` and ``batches`` handed out in it, and what the order
        depends on (see [Note: reading a table on N ranks])."""
        return {"epoch": self.epoch, "batches": self._batches, "steps": self._steps,
                "world_size": self.world_size, "batch_size": self.batch_size, "seed": self.seed,
                "rows": sum(self.rows_per_rank)}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` left off (the next ``iter()`` yields the batches after)."""
        if state.get("rows") != sum(self.rows_per_rank):
            raise ValueError(f"TableReader.load_state_dict: the state is of a split of "
                             f"{state.get('rows')} rows, this one has {sum(self.rows_per_rank)}: "
                             "the data changed; resume with the same files")  # fmt: skip
        epoch, batches = state["epoch"], state["batches"]
        if 0 < batches < state["steps"]:
            same = {k: state[k] for k in ("world_size", "batch_size", "seed")}
            mine = {"world_size": self.world_size, "batch_size": self.batch_size, "seed": self.seed}
            if same != mine:
                raise ValueError(f"TableReader.load_state_dict: the state stopped inside an epoch "
                                 f"with {same}; resume it with the same, not {mine} (or resume "
                                 "from a checkpoint at the end of an epoch)")  # fmt: skip
            self.epoch, self._batches, self._skip = epoch, batches, batches
        else:
            self.epoch, self._batches, self._skip = epoch + (batches > 0), 0, 0
        logger.info("TableReader (%s) resumes at epoch %d, batch %d", self.split, epoch, batches)


def _encoder(data: TableData) -> ColumnEncoder:
    """The table's encoder, made once per scanned table (its vocabularies as Arrow arrays)."""
    encoder = data.__dict__.get("_encoder")
    if encoder is None:
        encoder = ColumnEncoder(data.fitted)
        data.__dict__["_encoder"] = encoder
    return encoder


def _partition(
    data: TableData, want: int, rank: int, world_size: int
) -> tuple[list[tuple[int, int, int]], list[int]]:
    """This rank's runs ``(piece, skip, take)`` in file order, and every rank's row count."""
    column = NUM_TRAIN if want == TRAIN else NUM_VALIDATION
    counts = data.pieces[:, column].tolist()
    total = sum(counts)
    bounds = [r * total // world_size for r in range(world_size + 1)]
    first, last = bounds[rank], bounds[rank + 1]
    runs, before = [], 0
    for piece, count in enumerate(counts):
        lo, hi = max(first, before), min(last, before + count)
        if hi > lo:
            runs.append((piece, lo - before, hi - lo))
        before += count
    return runs, [b - a for a, b in itertools.pairwise(bounds)]


class _Prefetcher:
    """``batches`` made in a background thread started now, up to ``depth`` ahead; an error
    there is raised in the caller's `__next__`; `close` (or losing the last reference) stops
    the thread."""

    _DONE = object()

    def __init__(self, batches: Iterator[Batch], depth: int) -> None:
        self.slots: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._produce, args=(batches, self.slots,
                                       self.stop), name="shardkit-table-reader", daemon=True)  # fmt: skip
        self.thread.start()

    @staticmethod
    def _produce(batches: Iterator[Batch], slots: queue.Queue[Any], stop: threading.Event) -> None:
        try:
            for batch in batches:
                while not stop.is_set():
                    try:
                        slots.put((batch, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put((_Prefetcher._DONE, None))
        except BaseException as exc:  # handed to the consumer, raised there
            slots.put((_Prefetcher._DONE, exc))

    def __iter__(self) -> _Prefetcher:
        return self

    def __next__(self) -> Batch:
        if self.stop.is_set():
            raise StopIteration
        item, error = self.slots.get()
        if error is not None:
            self.close()
            raise error
        if item is _Prefetcher._DONE:
            self.stop.set()
            raise StopIteration
        return item

    def close(self) -> None:
        self.stop.set()
        while self.thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self.slots.get(timeout=0.1)
        self.thread.join()

    def __del__(self) -> None:
        self.stop.set()
