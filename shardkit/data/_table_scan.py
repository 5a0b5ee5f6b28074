"""`scan_table`: read a user's table once before training: check every row, fit the schema on
the training split, fit the split, and count each piece's rows so each rank can read its own
part; in one process, or in parallel on every rank.

[Note: table scan]
The scan reads every record of the training and validation files, piece by piece (see [Note:
table pieces]), in C++ and vectorized (see [Note: columnar parsing]), and

- refuses bad input with one error naming file, line and column: a file without a needed
  column, an empty file, a ragged row, bytes that are not UTF-8 (in a column the schema uses),
  a label that is not binary (or that the rule cannot read), a dense value that is not a
  number, a time that is not a time; with ``skip_bad_rows`` it counts such rows instead (the
  readers skip them too);
- fits the split (a time split from a fraction: from every good training row's time), then
  the schema on the training rows (`Fitter`), unless given a fitted one (resuming);
- refuses a split with no training or no validation rows, or one label only;
- records each piece's place, records and training and validation rows (`TableData.pieces`),
  so every rank knows every rank's row counts without reading.

With ``parallel=True`` every rank of the process group scans its own pieces (piece ``k`` of
file ``f`` of source ``s`` is rank ``(s + f + k) % W``'s) and the ranks merge what they found
with three all-gathers: an error opening the files (a host may not see one); then the first bad
row or the skipped ones, each piece's records and the times a time split needs; then the fits
(see [Note: fitting in parts]). The
result is the one-process scan's, to the bit, and every rank raises the same error, the one
of the first bad row in file order. Memory: the vocabularies, and for a time split fitted
from a fraction the parsed rows of the rank's pieces until the split is fitted.

Every piece allocates and frees the same temporaries (its text, its columns, the fit's
arrays: tens of MiB), so the scan fixes glibc's heap thresholds first (`steady_heap`, [Note:
a steady heap] in ``shardkit.kernels``, as a training step does): without it glibc handed
much of that memory back to the OS after each piece and faulted it in again for the next,
232k minor faults for 1M rows of a Criteo-shaped TSV against 64k with it (about a sixth of
the scan's CPU time; MovieLens-1M's gzip CSV: 40k against 27k in a process's first scan).

[Note: a scan's first piece]
A process's first scan imports ``pyarrow.compute`` (its checks and fits use it), which takes
50-100 ms of CPU, most of it building the module's Python wrappers and docstrings: about a
tenth of MovieLens-1M's whole first scan. Nothing needs it before the first piece is parsed,
and before that the scan only reads the header and cuts the first piece (a gzip file: 8 MiB
decompressed, one core), so the scan starts the import in a thread (`loading_compute_ahead`) and
imports only ``pyarrow`` and its CSV reader itself (`arrow(compute=False)`: the cut and the
CSV parse need no more); the first worker to need the module (`ColumnParser.pc`) waits for the
import if it is still running. The scan returns (or raises) only once the import is done: no
thread of it outlives it (a fork in the middle of an import would leave the child's import of
the module waiting forever). ``pyarrow`` itself and its CSV reader are imported before the
thread starts, in the scan's thread: the import thread then loads only modules of its own
(``pyarrow.compute``'s, ``numpy.ma``'s), never one the scan's thread may load meanwhile (a
Parquet file's ``pyarrow.parquet``). Two threads importing ``pyarrow`` at once made one of them
see a partly initialized ``pyarrow.lib`` ("cannot import name 'BuildInfo'"): about one fresh
process in 25 refused a Parquet file as if pyarrow were missing.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from shardkit.data._table_columns import BadRow, ColumnParser, Columns
from shardkit.data._table_files import TableFile, list_table_files, open_table_files, record_lines
from shardkit.data._table_fit import Fitter
from shardkit.data._table_fitted import FittedSchema, table_order
from shardkit.data._table_pieces import (
    Piece,
    arrow,
    cut_pieces,
    loading_compute_ahead,
    record_numbers,
)
from shardkit.data._table_schema import TableSchema
from shardkit.data._table_split import TRAIN, SplitRule, fit_times

__all__ = ["PIECE_COLUMNS", "TableData", "scan_table"]

logger = logging.getLogger(__name__)

# columns of `TableData.pieces`
(SOURCE, FILE, INDEX, BEGIN, END, ROW_GROUP, FIRST_RECORD, RECORDS, NUM_TRAIN,
 NUM_VALIDATION) = range(10)  # fmt: skip
PIECE_COLUMNS = 10
_MAX_REPORTED = 5
_SKIP_HINT = " (skip_bad_rows, --skip-bad-rows, skips and counts such rows)"
_LAST = 1 << 62  # a position after every record of a file


@dataclass(frozen=True, eq=False)
class TableData:
    """A scanned table: what every rank needs to read its part (see [Note: table scan]).

    Attributes:
        fitted: the fitted schema (vocabularies, table sizes, transforms).
        files: ``(training files, validation files)``; the second may be empty (validation
            rows are then in the training files).
        pieces: ``[num_pieces, 10]`` int64, in file order: source (0 training, 1 validation
            files), file, piece index, begin and end (bytes of CSV, rows of Parquet), the
            Parquet row group (-1: CSV), the number of its first record over the source's files, its records
            (bad ones too), training rows, validation rows.
        split: the fitted split.
        skipped: bad rows skipped (``skip_bad_rows``), and the first few as "file:line: why".
        seconds: how long the scan took (for its throughput).
    """

    fitted: FittedSchema
    files: tuple[tuple[TableFile, ...], tuple[TableFile, ...]]
    pieces: torch.Tensor
    split: SplitRule
    skip_bad_rows: bool
    skipped: int
    skipped_examples: tuple[str, ...]
    seconds: float

    @property
    def num_rows(self) -> tuple[int, int]:
        """(training rows, validation rows)."""
        return int(self.pieces[:, NUM_TRAIN].sum()), int(self.pieces[:, NUM_VALIDATION].sum())

    def summary(self) -> str:
        train, validation = self.num_rows
        files = len(self.files[0]) + len(self.files[1])
        rows = train + validation + self.skipped
        line = (f"table: {train:,} training and {validation:,} validation rows from {files} "
                f"file(s) ({self.split.describe()}); read {rows:,} rows in {self.seconds:.1f} s "
                f"({rows / max(self.seconds, 1e-9):,.0f} rows/s, parsing and checking)")  # fmt: skip
        if self.skipped:
            line += f"; skipped {self.skipped:,} bad rows, e.g. {self.skipped_examples[0]}"
        return line


def scan_table(
    paths: Sequence[str | Path],
    schema: TableSchema | FittedSchema,
    *,
    validation_paths: Sequence[str | Path] = (),
    seed: int = 0,
    skip_bad_rows: bool = False,
    parallel: bool = False,
    threads: int | None = None,
) -> TableData:
    """Check, fit and index a table (see [Note: table scan]).

    Args:
        paths: the training files or folders (CSV/TSV, plain or gzip; Parquet).
        schema: the schema to fit, or a fitted one to use as it is (resuming).
        validation_paths: validation files or folders (else the schema's ``validation_path``,
            else validation rows come from the training files by the schema's split).
        seed: the seed of a fraction split.
        skip_bad_rows: skip and count bad rows instead of refusing the input.
        parallel: every rank of the default process group scans its share and all get the
            result (a collective: every rank calls it with the same arguments).
        threads: worker threads that parse, check and fit pieces (default: the cores, shared
            by the ranks of this host); the result does not depend on it.
    """
    start = time.perf_counter()
    with loading_compute_ahead():  # see [Note: a scan's first piece]
        from shardkit.kernels import steady_heap

        steady_heap()  # the pieces' temporaries stay mapped (see [Note: table scan])
        fitted = schema if isinstance(schema, FittedSchema) else None
        spec = fitted.schema if fitted is not None else schema
        assert isinstance(spec, TableSchema)
        if not validation_paths and spec.split.validation_path is not None:
            validation_paths = [spec.split.validation_path]
        rank, world_size, gather = _group(parallel)
        error: Exception | None = None
        try:
            train_files, val_files = _open(spec, paths, validation_paths)
            arrow(train_files[0].path, compute=False)  # the table path needs pyarrow: say so
        except (ValueError, FileNotFoundError) as exc:
            if not parallel:
                raise
            error = exc
        if parallel:  # one rank may not see a file (another host): every rank raises its error
            errors = [e for e in gather(error) if e is not None]
            if errors:
                raise errors[0]
        rule = SplitRule.without_times(spec.split, seed=seed, has_validation_files=bool(val_files))
        keys = fitted.keys if fitted is not None else tuple(
            c.name for columns in table_order(spec).values() for c in columns)  # fmt: skip
        fitter = Fitter(spec) if fitted is None else None
        threads = default_threads(parallel) if threads is None else max(int(threads), 1)
        scan = _Scan(spec, keys, skip_bad_rows, None if SplitRule.needs_times(spec.split) else rule,
                     fitter, threads)  # fmt: skip
        files = (train_files, val_files)
        scan.read(files, rank, world_size)
        reports = gather(scan.report())
        pieces = _pieces(files, reports)
        if scan.rule is None:
            scan.rule = _fit_times(spec, reports, pieces)
        scan.fit_held(pieces)
        parts = gather(scan.part())
        for part in parts:
            for position, counts in part["kinds"].items():
                pieces[position][NUM_TRAIN : NUM_VALIDATION + 1] = counts
        if fitter is not None:
            fitted = fitter.merge([part["fit"] for part in parts])
        assert fitted is not None and scan.rule is not None
        examples = sorted(e for report in reports for e in report["examples"])[:_MAX_REPORTED]
        table = torch.tensor([pieces[k] for k in sorted(pieces)], dtype=torch.int64)
        data = TableData(fitted, files, table.view(-1, PIECE_COLUMNS), scan.rule, skip_bad_rows,
                         sum(r["skipped"] for r in reports), tuple(m for _, m in examples),
                         time.perf_counter() - start)  # fmt: skip
        _check_rows(data, spec, fitted if fitter is not None else None)
        logger.info(data.summary())
        return data


def _open(
    spec: TableSchema,
    paths: Sequence[str | Path],
    validation_paths: Sequence[str | Path],
) -> tuple[tuple[TableFile, ...], tuple[TableFile, ...]]:
    open_ = dict(needed=spec.needed, delimiter=spec.delimiter, names=spec.names)
    train_files = open_table_files(list_table_files(paths), **open_)  # type: ignore[arg-type]
    val_files: tuple[TableFile, ...] = ()
    if validation_paths:
        listed = list_table_files(validation_paths, what="validation data")
        val_files = open_table_files(listed, **open_)  # type: ignore[arg-type]
    return train_files, val_files


def _group(parallel: bool) -> tuple[int, int, Callable[[Any], list[Any]]]:
    if not parallel:
        return 0, 1, lambda obj: [obj]
    if not torch.distributed.is_initialized():
        raise ValueError("scan_table(parallel=True) scans on the ranks of a process group: "
                         "start one first (shardkit.launch), or scan in one process")  # fmt: skip
    from shardkit import comm

    return (torch.distributed.get_rank(), torch.distributed.get_world_size(),
            comm.all_gather_object)  # fmt: skip


class _Scan:
    """One process's share of the scan: its pieces read, checked, (fitted), and reported.
    Pieces are parsed, checked and fitted in ``threads`` worker threads (Arrow's and NumPy's
    kernels release the GIL) and taken in file order here, so the result is the same."""

    def __init__(self, schema: TableSchema, keys: Sequence[str], skip_bad_rows: bool,
                 rule: SplitRule | None, fitter: Fitter | None, threads: int) -> None:  # fmt: skip
        self.schema, self.keys, self.skip_bad_rows = schema, keys, skip_bad_rows
        self.rule, self.fitter, self.threads = rule, fitter, threads
        self.stats: dict[tuple[int, ...], list[int]] = {}
        self.error: tuple[tuple[int, ...], str] | None = None
        self.skipped, self.examples = 0, list[tuple[tuple[int, ...], str]]()
        self.held: list[tuple[Piece, Columns]] = []  # until a time split is fitted
        self.kinds: dict[tuple[int, ...], tuple[int, int]] = {}

    def read(self, files: tuple[tuple[TableFile, ...], ...], rank: int, world_size: int) -> None:
        def jobs() -> Iterator[Callable[[], _Piece]]:
            for source, group in enumerate(files):
                for index, file in enumerate(group):
                    parser = ColumnParser(self.schema, self.keys, file.columns)

                    def mine(k: int, first: int = source + index) -> bool:
                        return (first + k) % world_size == rank

                    for piece, load in cut_pieces(
                        file, source, index, mine, parser.dictionary(file.kind)
                    ):
                        yield functools.partial(self._work, file, piece, load, parser)

        for done in _in_order(jobs(), self.threads):
            if not self._accept(done):
                return

    def _work(self, file: TableFile, piece: Piece, load: Callable[[], Any],
              parser: ColumnParser) -> _Piece:  # fmt: skip
        """Parse, check (and split and fit) one piece: in a worker thread."""
        table, ragged = load()
        count = table.num_rows + len(ragged)
        columns, bad = parser.parse(table, record_numbers(table, ragged))
        bad = sorted(bad + [BadRow(r.record, "", f"{r.fields} fields, the header has "
                                   f"{r.expected}; fix or remove the row") for r in ragged],
                     key=lambda b: b.record)  # fmt: skip
        fitted = self._split(piece, columns, None) if self.rule is not None else None
        return _Piece(file, piece, count, columns, bad, fitted)

    def _accept(self, done: _Piece) -> bool:
        """Take a piece's results, in file order; False at a bad row that stops the scan."""
        piece, bad = done.piece, done.bad
        self.stats[piece.position] = [piece.begin, piece.end, piece.row_group, done.records]
        if bad:
            if not self.skip_bad_rows:
                self.error = ((*piece.position, bad[0].record),
                              _name(done.file, piece, bad[:1])[0] + _SKIP_HINT)  # fmt: skip
                return False
            self.skipped += len(bad)
            named = _name(done.file, piece, bad[: _MAX_REPORTED - len(self.examples)])
            self.examples += [((*piece.position, b.record), m) for b, m in zip(bad, named)]
        if done.fitted is None:
            self.held.append((piece, done.columns))
        else:
            self._take_fit(piece, *done.fitted)
        return True

    def report(self) -> dict[str, Any]:
        """What the first all-gather carries (see [Note: table scan])."""
        times = [(piece.position, c.records, c.times, c.users) for piece, c in self.held
                 if piece.source == 0]  # fmt: skip
        return {"stats": self.stats, "error": self.error, "skipped": self.skipped,
                "examples": self.examples, "times": times}  # fmt: skip

    def fit_held(self, pieces: dict[tuple[int, ...], list[int]]) -> None:
        def job(piece: Piece, columns: Columns) -> Callable[[], tuple[Piece, Any]]:
            positions = pieces[piece.position][FIRST_RECORD] + columns.records
            return lambda: (piece, self._split(piece, columns, positions))

        for piece, fitted in _in_order((job(p, c) for p, c in self.held), self.threads):
            self._take_fit(piece, *fitted)
        self.held = []

    def _split(self, piece: Piece, columns: Columns, positions: np.ndarray | None
               ) -> tuple[tuple[int, int], dict[str, Any] | None]:  # fmt: skip
        """A piece's (training, validation) rows and its part of the fit (any thread)."""
        assert self.rule is not None
        keys = piece.first_key + columns.records
        kinds = self.rule.kinds(piece.source, piece.file, keys, columns.times, columns.users,
                                positions)  # fmt: skip
        train = kinds == TRAIN
        counts = (int(train.sum()), int(len(kinds) - train.sum()))
        if self.fitter is None or not train.any():
            return counts, None
        return counts, self.fitter.piece(piece.file, keys, columns, train)

    def _take_fit(self, piece: Piece, counts: tuple[int, int], part: dict[str, Any] | None
                  ) -> None:  # fmt: skip
        self.kinds[piece.position] = counts
        if part is not None:
            assert self.fitter is not None
            self.fitter.accept(piece.position, part)

    def part(self) -> dict[str, Any]:
        """What the second all-gather carries: each piece's split and the fit."""
        return {"kinds": self.kinds, "fit": self.fitter.part() if self.fitter else None}


@dataclass(frozen=True, eq=False)
class _Piece:
    """A piece's results from a worker: its good rows, bad rows, and (split counts, fit part)
    when the split was known."""

    file: TableFile
    piece: Piece
    records: int
    columns: Columns
    bad: list[BadRow]
    fitted: tuple[tuple[int, int], dict[str, Any] | None] | None


T = TypeVar("T")


def _in_order(jobs: Iterator[Callable[[], T]], threads: int) -> Iterator[T]:
    """Each job's result, in the jobs' order, run by ``threads`` worker threads at most
    ``threads`` ahead (1: in this thread). Stopping early cancels the jobs not started."""
    if threads <= 1:
        for job in jobs:
            yield job()
        return
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="shardkit-scan") as pool:
        running: collections.deque[concurrent.futures.Future[T]] = collections.deque()
        try:
            for job in jobs:
                running.append(pool.submit(job))
                if len(running) > threads:
                    yield running.popleft().result()
            while running:
                yield running.popleft().result()
        finally:
            for future in running:
                future.cancel()


def default_threads(parallel: bool) -> int:
    """Worker threads of a scan: the machine's cores shared by the ranks on this host."""
    ranks = 1
    if parallel and torch.distributed.is_initialized():
        world_size = torch.distributed.get_world_size()
        ranks = min(int(os.environ.get("LOCAL_WORLD_SIZE", world_size)), world_size)
    return max(1, min(8, (os.cpu_count() or 1) // max(ranks, 1)))


def _name(file: TableFile, piece: Piece, bad: list[BadRow]) -> list[str]:
    """Each bad row's message, placed "file:line" (Parquet: the row's number)."""
    if not bad:
        return []
    if piece.parquet:
        return [b.where(f"{file.path}:{piece.begin + b.record + 1}") for b in bad]
    lines = record_lines(file, piece.begin, {b.record for b in bad})
    return [b.where(f"{file.path}:{lines.get(b.record, '?')}") for b in bad]


def _pieces(
    files: tuple[tuple[TableFile, ...], ...], reports: list[dict[str, Any]]
) -> dict[tuple[int, ...], list[int]]:
    """Every piece's row of `TableData.pieces` (split counts still 0); raises the first error
    of any rank (the first bad row in file order, or a file with no rows)."""
    stats = {k: v for report in reports for k, v in report["stats"].items()}
    errors = [report["error"] for report in reports if report["error"] is not None]
    records: dict[tuple[int, int], int] = {}
    for (source, file, _), (_, _, _, count) in stats.items():
        records[source, file] = records.get((source, file), 0) + count
    for source, group in enumerate(files):
        for index, table_file in enumerate(group):
            if not records.get((source, index)):
                errors.append(((source, index, _LAST, 0), f"{table_file.path}: no rows after the "
                               "header; give a file with rows (or leave this one out)"))  # fmt: skip
    if errors:
        raise ValueError(min(errors)[1])
    pieces, first = {}, [0, 0]
    for position in sorted(stats):
        begin, end, row_group, count = stats[position]
        source = position[0]
        pieces[position] = [*position, begin, end, row_group, first[source], count, 0, 0]
        first[source] += count
    return pieces


def _fit_times(
    schema: TableSchema, reports: list[dict[str, Any]], pieces: dict[tuple[int, ...], list[int]]
) -> SplitRule:
    """The time split from every rank's training rows' times (in file order)."""
    import pyarrow as pa

    held = sorted((entry for report in reports for entry in report["times"]), key=lambda e: e[0])
    times = np.concatenate([e[2] for e in held]) if held else np.zeros(0)
    positions = np.concatenate([pieces[e[0]][FIRST_RECORD] + e[1] for e in held]) if held else (
        np.zeros(0, dtype=np.int64))  # fmt: skip
    users = None
    if schema.split.per is not None:
        users = pa.concat_arrays([e[3] for e in held]) if held else pa.array([], pa.string())
    return fit_times(schema.split, times, users, positions)


def _check_rows(data: TableData, schema: TableSchema, fitted: FittedSchema | None) -> None:
    train, validation = data.num_rows
    if not train or not validation:
        raise ValueError(f"{schema.source}: the split leaves {train} training and {validation} "
                         f"validation rows ({data.split.describe()}); both need rows: change "
                         "the split (validation_fraction, time_cut) or the data")  # fmt: skip
    if fitted is not None and fitted.stats["train_positives"] in (0, fitted.stats["train_rows"]):
        value = int(fitted.stats["train_positives"] > 0)
        raise ValueError(f"{schema.source}: label '{schema.label}' is {value} on all {train} "
                         "training rows: a model needs both labels; change the rule or the "
                         "split")  # fmt: skip
