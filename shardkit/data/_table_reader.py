"""`TableReader`: a rank's batches of a scanned table, read from its own part of the files,
shuffled in bounded memory, resumable.

[Note: reading a table on N ranks]
The blocks (see [Note: table scan]) holding rows of the split are cut into ``W`` runs with as
equal row counts as blocks allow: block ``b`` belongs to rank ``floor(W * rows_before_b /
rows)``. Each rank reads only its run (seeking to it in plain CSV, reading only its row groups'
rows in Parquet; a gzip file is decompressed up to the run), so every row is read by exactly
one rank, and ranks on several hosts read in parallel. Every rank knows every rank's row count
from the index, so all agree on the steps of an epoch without talking:

- training (``LastBatch.DROP``): ``min over ranks of rows // B`` steps; each rank drops the
  rest of its rows, which (with the shuffle) are other rows every epoch;
- validation (``LastBatch.PAD``): ``max over ranks of ceil(rows / B)`` steps; every row comes
  once with weight 1, and batches are padded to ``B`` with empty rows of weight 0.

Shuffling (training): each epoch visits the rank's blocks in a seeded order (plain CSV: any
order; Parquet: row groups in any order, blocks within one in any order; gzip: in file order),
then passes the rows through a buffer of ``shuffle_buffer`` rows that emits a random one for
each row read. Memory: the buffer, one Parquet row group, one batch. Unlike `GlobalBatchIterator`
the order depends on the world size: ranks read their own parts.

Resuming: the state is ``(epoch, batches)``; within an epoch it needs the same world size and
batch size, and re-reads the rank's rows up to that point (O(position) time); at an epoch's end
any world size resumes.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Iterator
from typing import Any

import torch

from shardkit.data._batch import Batch
from shardkit.data._global_batch import LastBatch, check_batching, resolve_rank
from shardkit.data._hash import mix_int
from shardkit.data._table_files import ParquetBlocks, Record
from shardkit.data._table_rows import EncodedRow, RowParser, RowProblem, rows_to_batch
from shardkit.data._table_scan import (
    BLOCK_ROWS,
    FILE,
    NUM_TRAIN,
    NUM_VALIDATION,
    RECORD,
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
        shuffle_buffer: rows the shuffle holds (memory: about 0.5 KB per row).
        seed: the shuffle's seed (the same on every rank).
        last_batch: DROP (default for training) or PAD (default for validation).
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
        self.data, self.split, self.batch_size = data, split, batch_size
        self.shuffle = split == "train" if shuffle is None else shuffle
        self.shuffle_buffer, self.seed, self.last_batch = shuffle_buffer, seed, last_batch
        self.want = TRAIN if split == "train" else VALIDATION
        self._blocks, self.rows_per_rank = _partition(data, self.want, self.rank, self.world_size)
        self._steps = self._count_steps()
        self.epoch, self._batches = 0, 0
        self._skip = 0  # batches to pass over silently (resuming mid-epoch)

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
        rows = self._rows(self.epoch)
        fitted = self.data.fitted
        while self._batches < self._steps:
            chunk = list(itertools.islice(rows, self.batch_size))
            if self.last_batch is LastBatch.DROP and len(chunk) < self.batch_size:
                raise RuntimeError(f"TableReader: rank {self.rank} ran out of rows at batch "
                                   f"{self._batches} of {self._steps}: the files changed since "
                                   "they were scanned; start the run again")  # fmt: skip
            self._batches += 1
            if self._skip:
                self._skip -= 1
                continue
            weights = None
            if self.last_batch is LastBatch.PAD:
                weights = torch.zeros(self.batch_size)
                weights[: len(chunk)] = 1.0
                chunk += [_empty_row(fitted)] * (self.batch_size - len(chunk))
            yield rows_to_batch(chunk, keys=fitted.keys, num_dense=len(fitted.dense),
                                weights=weights)  # fmt: skip
        self.epoch, self._batches = self.epoch + 1, 0

    def _rows(self, epoch: int) -> Iterator[EncodedRow]:
        rows = self._encoded(self._order(epoch))
        if not self.shuffle:
            return rows
        seed = mix_int(self.seed, epoch, self.rank, _BUFFER_STREAM)
        return _buffered(rows, self.shuffle_buffer, seed)

    def _order(self, epoch: int) -> list[list[int]]:
        """This rank's blocks in the epoch's order (see [Note: reading a table on N ranks])."""
        blocks = self._blocks.tolist()
        if not self.shuffle:
            return blocks
        segments = _Segments(self.data)

        def key(block: list[int]) -> tuple[int, int]:
            segment, within = segments.of(block)
            return (mix_int(self.seed, epoch, _ORDER_STREAM, *segment), within)

        return sorted(blocks, key=key)

    def _encoded(self, blocks: list[list[int]]) -> Iterator[EncodedRow]:
        """The rows of this split in ``blocks``, parsed and encoded (bad rows skipped)."""
        data = self.data
        parser = RowParser(data.fitted.schema, data.fitted.schema.needed, data.fitted.keys)
        encoder = data.fitted.encoder()
        reader = _BlockReader(data)
        for block in blocks:
            source, file, record = block[SOURCE], block[FILE], block[RECORD]
            kinds = data.split.block_kinds(file, record, BLOCK_ROWS) if source == 0 else None
            for i, (_, _, values, problem) in enumerate(reader.read(block)):
                if problem is not None:
                    continue  # counted by the scan (skip_bad_rows)
                try:
                    parsed = parser.parse(values)
                except RowProblem:
                    continue
                if source == 1:
                    kind = VALIDATION
                elif kinds is not None:
                    kind = kinds[i]
                else:
                    pos = data.first_record[file] + record + i
                    kind = data.split.kind_of(file, record + i, pos, parsed)
                if kind == self.want:
                    yield encoder.encode(parsed)

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
            self.epoch, self._batches, self._skip = epoch, 0, batches
        else:
            self.epoch, self._batches, self._skip = epoch + (batches > 0), 0, 0
        logger.info("TableReader (%s) resumes at epoch %d, batch %d", self.split, epoch, batches)


def _partition(
    data: TableData, want: int, rank: int, world_size: int
) -> tuple[torch.Tensor, list[int]]:
    """This rank's blocks (file order) and every rank's row count."""
    column = NUM_TRAIN if want == TRAIN else NUM_VALIDATION
    blocks = data.blocks[data.blocks[:, column] > 0]
    counts = blocks[:, column]
    total = int(counts.sum())
    owner = (torch.cumsum(counts, 0) - counts) * world_size // max(total, 1)
    rows = torch.zeros(world_size, dtype=torch.int64).index_add_(0, owner, counts)
    return blocks[owner == rank], rows.tolist()


class _Segments:
    """A block's segment (what is read at once: a plain CSV block, a gzip file, a Parquet row
    group) and its rank within the segment in the epoch's order."""

    def __init__(self, data: TableData) -> None:
        self.files = data.files
        self.parquet: dict[tuple[int, int], ParquetBlocks] = {}

    def of(self, block: list[int]) -> tuple[tuple[int, ...], int]:
        source, file, record = block[SOURCE], block[FILE], block[RECORD]
        table_file = self.files[source][file]
        if table_file.kind == "csv.gz":
            return (source, file), record
        if table_file.kind == "parquet":
            blocks = self.parquet.get((source, file)) or ParquetBlocks(table_file)
            self.parquet[source, file] = blocks
            return (source, file, blocks.group_of(record)), mix_int(record, _ORDER_STREAM)
        return (source, file, record), 0


class _BlockReader:
    """Records of one block at a time; keeps a CSV stream open while blocks follow each other."""

    def __init__(self, data: TableData) -> None:
        self.files = data.files
        self.stream: tuple[tuple[int, int, int], Iterator[Record]] | None = None
        self.parquet: dict[tuple[int, int], ParquetBlocks] = {}

    def read(self, block: list[int]) -> list[Record]:
        source, file, offset, line, record = block[:5]
        table_file = self.files[source][file]
        if table_file.kind == "parquet":
            blocks = self.parquet.get((source, file)) or ParquetBlocks(table_file)
            self.parquet = {(source, file): blocks}
            return blocks.records(record, BLOCK_ROWS)
        if self.stream is None or self.stream[0] != (source, file, record):
            if self.stream is not None:
                self.stream[1].close()  # type: ignore[attr-defined]
            self.stream = ((source, file, record), table_file.records(offset=offset, line=line))
        records = list(itertools.islice(self.stream[1], BLOCK_ROWS))
        self.stream = ((source, file, record + len(records)), self.stream[1])
        return records


def _buffered(rows: Iterator[EncodedRow], size: int, seed: int) -> Iterator[EncodedRow]:
    """A shuffle buffer: once full, each row read replaces (and emits) a random slot's row;
    at the end the rest comes in random order. `random.Random` seeded with an int gives the
    same ``random()`` sequence on every Python (its documented guarantee)."""
    rng = random.Random(seed)
    buffer: list[EncodedRow] = []
    for row in rows:
        if len(buffer) < size:
            buffer.append(row)
            continue
        slot = int(rng.random() * size)
        yield buffer[slot]
        buffer[slot] = row
    keys = [rng.random() for _ in buffer]
    yield from (buffer[j] for j in sorted(range(len(buffer)), key=keys.__getitem__))


def _empty_row(fitted: Any) -> EncodedRow:
    """Padding: no ids, dense zeros, label 0 (weight 0)."""
    return 0.0, [0.0] * len(fitted.dense), [[] for _ in fitted.keys]
