"""A table's files cut into pieces and read with pyarrow: the unit of the scan's and the
readers' work.

[Note: table pieces]
A file is read in pieces, each read whole by one process, in C++ (pyarrow) as columns:

- plain CSV: byte ranges: piece ``k`` starts at the first line start at or after
  ``header_end + k * PIECE_BYTES`` and ends where piece ``k + 1`` starts (an empty piece, inside
  a line longer than a piece, is left out). A process finds a piece by seeking, without reading
  what comes before it;
- gzip CSV: the same cut of the decompressed text (reaching piece ``k`` decompresses the file up
  to it);
- Parquet: slices of ``PARQUET_ROWS`` (131,072) rows of the row groups, numbered over the file
  (a reader of several slices of a row group reads it once).

The cut depends on the file alone, so a piece is the same in every process and world size. A
record (a row; blank lines are not records) is known by its file and its key: for CSV
``(k << 32) + r``, ``r`` the record's number in piece ``k`` (ragged rows count); for Parquet its
row number in the file. A file of one piece (CSV under 8 MiB) keys its records 0, 1, 2, ...
A quoted value holding a line break is read within a piece; one that spans a cut is refused
with the byte where the file was cut (save such files as Parquet).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardkit.data._table_files import TableFile, parquet, pyarrow_installed

__all__ = [
    "PARQUET_ROWS",
    "PIECE_BYTES",
    "Piece",
    "RaggedRow",
    "arrow",
    "cut_pieces",
    "loading_compute_ahead",
    "read_pieces",
    "record_numbers",
]

PIECE_BYTES = 8 << 20
PARQUET_ROWS = 1 << 17
_PROBE = 1 << 16


def arrow(path: Path | str = "", *, compute: bool = True) -> Any:
    """pyarrow (with its CSV reader, and unless ``compute=False`` its compute module), or an
    error naming the extra that installs it."""
    try:
        import pyarrow
        import pyarrow.csv

        if compute:
            import pyarrow.compute
    except ImportError:
        if pyarrow_installed("pyarrow", "pyarrow.csv", *(["pyarrow.compute"] if compute else [])):
            raise  # installed but broken: its own error says how
        where = f"{path}: " if path else ""
        raise ValueError(f"{where}reading a table needs pyarrow: pip install 'shardkit[data]' (make "
                         "installs it)") from None  # fmt: skip
    return pyarrow


@contextlib.contextmanager
def loading_compute_ahead() -> Iterator[None]:
    """Import ``pyarrow.compute`` in a thread (unless imported) while the block runs, so that
    a process's first scan cuts its first piece meanwhile; the block ends when the import is
    done (see [Note: a scan's first piece])."""
    if "pyarrow.compute" in sys.modules:
        yield
        return
    try:  # in this thread first: the import thread then loads modules no other thread loads
        import pyarrow.csv  # noqa: F401  (see [Note: a scan's first piece])
    except ImportError:  # the scan's own import says which extra is missing
        yield
        return
    thread = threading.Thread(target=_import_compute, name="shardkit-import-compute")
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _import_compute() -> None:
    try:
        import numpy.ma  # noqa: F401  (pyarrow loads it at its first NumPy array in)
        import pyarrow.compute  # noqa: F401
    except ImportError:  # the scan's own import says which extra is missing
        pass


@dataclass(frozen=True)
class Piece:
    """One piece of a file (see [Note: table pieces]): ``source`` 0 for the training files, 1
    for validation files; ``file`` its index there; ``index`` k (the row group for Parquet);
    ``begin``/``end`` its bytes (CSV) or rows (Parquet); ``row_group`` its Parquet row group."""

    source: int
    file: int
    index: int
    begin: int
    end: int
    row_group: int = -1  # Parquet: the row group holding the piece; CSV: -1

    @property
    def parquet(self) -> bool:
        return self.row_group >= 0

    @property
    def first_key(self) -> int:
        return self.begin if self.parquet else self.index << 32

    @property
    def position(self) -> tuple[int, int, int]:
        return (self.source, self.file, self.index)


@dataclass(frozen=True)
class RaggedRow:
    """A CSV record with another number of fields than the header (pyarrow leaves it out)."""

    record: int
    fields: int
    expected: int


def record_numbers(table: Any, ragged: list[RaggedRow]) -> np.ndarray:
    """Each row's record number in its piece: ragged rows are records that pyarrow left out."""
    records = np.arange(table.num_rows + len(ragged), dtype=np.int64)
    return np.delete(records, [r.record for r in ragged]) if ragged else records


def read_pieces(
    file: TableFile, source: int, index: int, wanted: Callable[[int], bool],
    dictionary: Collection[str] = (),
) -> Iterator[tuple[Piece, Any, list[RaggedRow]]]:  # fmt: skip
    """The wanted pieces of a file, in order, each as ``(piece, Arrow table of the needed
    columns, ragged rows)``; CSV columns are strings, or binary in a piece that is not UTF-8
    (the parser names the bad rows); Parquet string columns named in ``dictionary``
    (`ColumnParser.dictionary`) come as dictionary arrays (see [Note: Parquet dictionaries])."""
    for piece, load in cut_pieces(file, source, index, wanted, dictionary):
        yield piece, *load()


Loaded = tuple[Any, list[RaggedRow]]


def cut_pieces(
    file: TableFile, source: int, index: int, wanted: Callable[[int], bool],
    dictionary: Collection[str] = (),
) -> Iterator[tuple[Piece, Callable[[], Loaded]]]:  # fmt: skip
    """`read_pieces`, with each piece's parsing left to a function (for a worker thread):
    ``(piece, load)``, ``load()`` giving the table and the ragged rows."""
    if file.kind == "parquet":
        for piece, table in _parquet_pieces(file, source, index, wanted, dictionary):
            yield piece, functools.partial(_loaded, table)
        return
    cut = _gzip_cut if file.kind == "csv.gz" else _plain_cut
    for k, begin, end, data in cut(file, wanted):
        if data is not None:
            yield (
                Piece(source, index, k, begin, end),
                functools.partial(_parse_csv, file, data, begin, dictionary),
            )


def _loaded(table: Any) -> Loaded:
    return table, []


def _plain_cut(
    file: TableFile, wanted: Callable[[int], bool]
) -> Iterator[tuple[int, int, int, Any]]:
    pa = arrow(file.path, compute=False)
    start = file.start[0]
    with file.path.open("rb") as f:
        size = f.seek(0, 2)
        count = max(-(-(size - start) // PIECE_BYTES), 0)

        def boundary(k: int) -> int:
            if k == 0:
                return start
            target = start + k * PIECE_BYTES
            if target >= size:
                return size
            f.seek(target - 1)
            at = target - 1
            while True:
                chunk = f.read(_PROBE)
                if not chunk:
                    return size
                found = chunk.find(b"\n")
                if found >= 0:
                    return at + found + 1
                at += len(chunk)

        for k in range(count):
            if not wanted(k):
                continue
            begin, end = boundary(k), boundary(k + 1)
            if end > begin:
                f.seek(begin)
                data, got = pa.allocate_buffer(end - begin), 0  # Arrow's pool: no fresh pages
                with memoryview(data) as view:
                    while got < end - begin and (read := f.readinto(view[got:])):
                        got += read
                yield k, begin, end, data.slice(0, got)


def _gzip_cut(
    file: TableFile, wanted: Callable[[int], bool]
) -> Iterator[tuple[int, int, int, Any]]:
    pa = arrow(file.path, compute=False)
    start = file.start[0]
    with pa.input_stream(str(file.path), compression="gzip") as stream:
        skipped = 0
        while skipped < start:
            skipped += len(stream.read(min(start - skipped, PIECE_BYTES)))
        text = _Text(pa, stream)
        base, k = start, 0
        while not text.done:
            target = start + (k + 1) * PIECE_BYTES
            if target <= base:  # piece k lies inside a long line: empty
                k += 1
                continue
            found = text.newline(max(target - 1 - base, 0))
            end = base + found + 1 if found >= 0 else base + text.size
            if end > base:
                yield k, base, end, text.take(end - base, wanted(k))
                base = end
            k += 1


class _Text:
    """A gzip stream's text from the current piece's start on, decompressed straight into a
    buffer of Arrow's pool that becomes the piece: no copy but of the bytes after the piece's
    last line. Arrow's pool reuses its pages from piece to piece; a piece copied into a
    ``bytearray`` and then ``bytes`` (glibc's heap) took two copies and about 13k fresh pages
    (page faults) of MovieLens-1M's 16k in cutting and parsing (see [Note: table scan])."""

    def __init__(self, pa: Any, stream: Any) -> None:
        self.pa, self.stream = pa, stream
        self.buffer = pa.allocate_buffer(0)
        self.size, self.eof = 0, False

    @property
    def done(self) -> bool:
        return self.eof and not self.size

    def newline(self, at: int) -> int:
        """The place of the first line break at or after ``at``, decompressing as needed; -1
        when the text ends first."""
        while True:
            with memoryview(self.buffer) as view:
                window = _PROBE
                while at < self.size:
                    found = view[at : min(at + window, self.size)].tobytes().find(b"\n")
                    if found >= 0:
                        return at + found
                    at, window = at + window, window * 2
            if self.eof:
                return -1
            self._fill(max(at + _PROBE, self.size + _PROBE))

    def _fill(self, want: int) -> None:
        """Decompress until ``want`` bytes are held, or the stream ends."""
        if want > self.buffer.size:  # a fresh buffer (the first, or past a long line)
            grown = self.pa.allocate_buffer(max(want, 2 * self.buffer.size))
            with memoryview(grown) as new, memoryview(self.buffer) as old:
                new[: self.size] = old[: self.size]
            self.buffer = grown
        with memoryview(self.buffer) as view:
            while self.size < want and not self.eof:
                got = self.stream.readinto(view[self.size : want])
                self.eof = not got
                self.size += got

    def take(self, n: int, keep: bool) -> Any:
        """The first ``n`` bytes as a piece (an Arrow buffer; None unless ``keep``); the rest
        moves to the front of a fresh buffer that has room for the next piece."""
        piece = self.buffer.slice(0, n) if keep else None
        rest = self.size - n
        fresh = self.pa.allocate_buffer(max(PIECE_BYTES + 2 * _PROBE, rest + _PROBE))
        with memoryview(fresh) as new, memoryview(self.buffer) as old:
            new[:rest] = old[n : self.size]
        self.buffer, self.size = fresh, rest
        return piece


def _stringy(pa: Any, kind: Any) -> bool:
    """Whether a Parquet column's type is strings, or a list of strings."""
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        kind = kind.value_type
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _parse_csv(file: TableFile, data: Any, begin: int, dictionary: Collection[str] = ()
               ) -> tuple[Any, list[RaggedRow]]:  # fmt: skip
    """A CSV piece's needed columns as strings (pyarrow checks UTF-8 as it converts: no
    second pass); a piece that is not UTF-8 (or not read) is read again as binary columns,
    which the parser checks value by value to name the bad row."""
    pa = arrow(file.path, compute=False)
    try:
        return _read_csv(file, data, pa.string(), dictionary)
    except pa.ArrowInvalid:
        pass
    try:
        return _read_csv(file, data, pa.binary())
    except pa.ArrowInvalid as exc:
        raise ValueError(
            f"{file.path}: the piece from byte {begin} cannot be read ({exc}); a quoted value "
            f"that holds a line break across byte {begin} or {begin + len(data)} (where the "
            "file is cut into pieces of 8 MiB) is not read: remove the line breaks from values, "
            "or save the table as Parquet"
        ) from None


def _read_csv(file: TableFile, data: Any, kind: Any, dictionary: Collection[str] = ()
              ) -> tuple[Any, list[RaggedRow]]:  # fmt: skip
    pa = arrow(file.path, compute=False)
    ragged: list[RaggedRow] = []

    def invalid(row: Any) -> str:
        ragged.append(RaggedRow(row.number - 1, row.actual_columns, row.expected_columns))
        return "skip"

    types = dict.fromkeys(file.needed, kind)
    for name in set(dictionary) & set(file.needed):  # their few distinct texts, hashed once
        types[name] = pa.dictionary(pa.int32(), kind)
    table = pa.csv.read_csv(
        data if isinstance(data, pa.Buffer) else pa.py_buffer(data),
        read_options=pa.csv.ReadOptions(column_names=list(file.columns), use_threads=False,
                                        block_size=max(len(data) + 1, 1 << 20)),
        parse_options=pa.csv.ParseOptions(delimiter=file.delimiter, newlines_in_values=True,
                                          invalid_row_handler=invalid),
        convert_options=pa.csv.ConvertOptions(column_types=types,
                                              include_columns=list(file.needed),
                                              strings_can_be_null=False,
                                              quoted_strings_can_be_null=False),
    )  # fmt: skip
    return table, ragged


def _parquet_pieces(
    file: TableFile, source: int, index: int, wanted: Callable[[int], bool],
    dictionary: Collection[str],
) -> Iterator[tuple[Piece, Any]]:  # fmt: skip
    pq = parquet(file.path)
    pa = arrow(file.path, compute=False)
    names = set(dictionary) & set(file.needed)
    reader = pq.ParquetFile(file.path)
    if names:  # string columns (or lists of strings) only: others are read as they are
        names = {n for n in names if _stringy(pa, reader.schema_arrow.field(n).type)}
        paths = (reader.schema.column(i).path for i in range(len(reader.schema)))
        leaves = [path for path in paths if path.split(".")[0] in names]  # a list's: its items
        if leaves:  # the footer read once: its metadata passed on
            reader = pq.ParquetFile(file.path, metadata=reader.metadata, read_dictionary=leaves)
    first, k = 0, 0
    for group in range(reader.metadata.num_row_groups):
        rows = reader.metadata.row_group(group).num_rows
        slices = [(k + j, start) for j, start in enumerate(range(0, rows, PARQUET_ROWS))]
        k += len(slices)
        mine = [(piece, start) for piece, start in slices if wanted(piece)]
        if mine:  # the row group is read once for all its wanted pieces
            table = reader.read_row_group(group, columns=list(file.needed))
            for piece, start in mine:
                end = min(start + PARQUET_ROWS, rows)
                part = table.slice(start, end - start)
                yield Piece(source, index, piece, first + start, first + end, group), part
        first += rows
