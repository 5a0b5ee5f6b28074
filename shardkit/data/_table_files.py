"""The files of a table: CSV/TSV (stdlib, plain or gzip) and Parquet (pyarrow, optional), read
as records of the columns a schema needs, each with where it came from.

[Note: table records]
A record is ``(line, offset, values, problem)``: ``line`` the 1-based line of a CSV row's first
line (for Parquet: the 1-based row number), ``offset`` the byte offset where the row starts
(of the decompressed text for gzip; -1 for Parquet; a reader seeks there to start at that
row, which costs decompressing up to it in a gzip file), ``values`` the needed
columns' raw values in the order asked for (strings for CSV; Arrow's Python values for
Parquet), and ``problem`` None or ``(column, message)`` for a row that cannot be read (a ragged
row, bytes that are not UTF-8). Blank lines are not records. Only rows are records: the header
of a CSV file is read by `TableFile.open` (or the schema gives ``names``).
"""

from __future__ import annotations

import bisect
import csv
import gzip
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "ParquetBlocks",
    "Record",
    "TableFile",
    "list_table_files",
    "open_table_files",
    "parquet_row_groups",
]

Record = tuple[int, int, list[Any], "tuple[str, str] | None"]
_PARQUET_MAGIC, _GZIP_MAGIC = b"PAR1", b"\x1f\x8b"
_SURROGATES = re.compile("[\udc80-\udcff]")


def list_table_files(paths: Sequence[str | Path], *, what: str = "--data-path") -> tuple[Path, ...]:
    """Files of ``paths`` (files, or folders: their visible files in natural order, ``part_2``
    before ``part_10``), in the order given."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")]
            if not found:
                raise FileNotFoundError(f"{what}: the folder {path} has no files")
            files += sorted(found, key=_natural_key)
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"{what}: {path} does not exist (give a CSV, TSV or Parquet "
                                    "file, plain or gzip, or a folder of them)")  # fmt: skip
    if not files:
        raise FileNotFoundError(f"{what}: no files given")
    return tuple(files)


def _natural_key(path: Path) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def open_table_files(
    files: Sequence[Path],
    *,
    needed: Sequence[str],
    delimiter: str | None,
    names: Sequence[str] | None,
) -> tuple[TableFile, ...]:
    """Each file's layout, header and the index of every needed column, checked now: a
    missing column or an empty file is an error naming the file."""
    return tuple(
        TableFile.open(path, needed=needed, delimiter=delimiter, names=names) for path in files
    )


@dataclass(frozen=True)
class TableFile:
    """One file: its kind (``csv``, ``csv.gz``, ``parquet``), delimiter, columns, and where the
    needed columns are. ``start`` is the byte offset and line after the header (CSV)."""

    path: Path
    kind: str
    delimiter: str
    columns: tuple[str, ...]
    needed: tuple[str, ...]
    index: tuple[int, ...]
    start: tuple[int, int] = (0, 0)

    @property
    def seekable(self) -> bool:
        """Whether a reader can start at a row's offset (plain CSV, Parquet), or must read
        from the start of the file (gzip)."""
        return self.kind != "csv.gz"

    @staticmethod
    def open(
        path: Path, *, needed: Sequence[str], delimiter: str | None, names: Sequence[str] | None
    ) -> TableFile:
        with path.open("rb") as f:
            magic = f.read(4)
        if magic == _PARQUET_MAGIC:
            columns, start, kind, sep = (
                tuple(_parquet(path).ParquetFile(path).schema_arrow.names),
                (0, 0),
                "parquet",
                "",
            )
        else:
            kind = "csv.gz" if magic[:2] == _GZIP_MAGIC else "csv"
            sep = delimiter or _delimiter(path)
            columns, start = _header(path, kind, sep, names)
        missing = [name for name in needed if name not in columns]
        if missing:
            where = f"{path}:1" if names is None and kind != "parquet" else str(path)
            raise ValueError(f"{where}: no column {missing[0]!r} (the schema needs {missing}); "
                             f"the file has {list(columns)}")  # fmt: skip
        index = tuple(columns.index(name) for name in needed)
        return TableFile(path, kind, sep, columns, tuple(needed), index, start)

    def records(
        self, *, offset: int | None = None, line: int = 0, row: int = 0
    ) -> Iterator[Record]:
        """Records from a row on: for CSV the row at byte ``offset`` (after line ``line``), by
        default the first; for Parquet row ``row`` (0-based). See [Note: table records]."""
        if self.kind == "parquet":
            yield from _parquet_records(self, row)
            return
        if offset is None:
            offset, line = self.start
        yield from _csv_records(self, offset, line)


def _delimiter(path: Path) -> str:
    name = path.name.lower().removesuffix(".gz")
    return "\t" if name.endswith((".tsv", ".tab")) else ","


def _binary(path: Path, kind: str) -> IO[bytes]:
    return gzip.open(path, "rb") if kind == "csv.gz" else path.open("rb")  # type: ignore[return-value]


class _Lines:
    """A file's lines as text for `csv.reader`, counting lines and bytes, and remembering the
    lines that were not UTF-8 (decoded with surrogates so the row can still be split)."""

    def __init__(self, f: IO[bytes], offset: int, line: int) -> None:
        self.f, self.offset, self.line = f, offset, line
        self.bad: set[int] = set()

    def __iter__(self) -> Iterator[str]:
        for raw in self.f:
            self.offset += len(raw)
            self.line += 1
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError:
                self.bad.add(self.line)
                yield raw.decode("utf-8", "surrogateescape")


def _header(
    path: Path, kind: str, delimiter: str, names: Sequence[str] | None
) -> tuple[tuple[str, ...], tuple[int, int]]:
    if names is not None:
        return tuple(names), (0, 0)
    with _binary(path, kind) as f:
        lines = _Lines(f, 0, 0)
        for fields in csv.reader(lines, delimiter=delimiter):
            if not fields:
                continue
            if lines.bad:
                raise ValueError(f"{path}:{lines.line}: the header has bytes that are not UTF-8")
            return tuple(name.strip() for name in fields), (lines.offset, lines.line)
    raise ValueError(f"{path}: the file is empty (no header line with the column names)")


def _csv_records(file: TableFile, offset: int, line: int) -> Iterator[Record]:
    width, index = len(file.columns), file.index
    with _binary(file.path, file.kind) as f:
        if offset:
            f.seek(offset)  # gzip: by decompressing up to there
        lines = _Lines(f, offset, line)
        reader = csv.reader(lines, delimiter=file.delimiter)
        start, first = lines.offset, lines.line + 1
        for fields in reader:
            if not fields:  # a blank line
                start, first = lines.offset, lines.line + 1
                continue
            problem = None
            if len(fields) != width:
                problem = (
                    "",
                    f"{len(fields)} fields, the header has {width}; fix or remove the row",
                )
            elif lines.bad:
                problem = _encoding_problem(file, fields)
            lines.bad.clear()
            values = [fields[i] for i in index] if problem is None else []
            yield first, start, values, problem
            start, first = lines.offset, lines.line + 1


def _encoding_problem(file: TableFile, fields: list[str]) -> tuple[str, str]:
    for name, text in zip(file.columns, fields):
        if _SURROGATES.search(text):
            raw = text.encode("utf-8", "surrogateescape")
            return name, f"bytes that are not UTF-8 ({raw[:40]!r}); save the file as UTF-8"
    return "", "bytes that are not UTF-8; save the file as UTF-8"


def _parquet(path: Path) -> Any:
    try:
        import pyarrow.parquet
    except ImportError:
        raise ValueError(f"{path} is a Parquet file: reading it needs pyarrow, pip install "
                         "'shardkit[parquet]'") from None  # fmt: skip
    return pyarrow.parquet


def parquet_row_groups(file: TableFile) -> list[tuple[int, int]]:
    """``(first row, rows)`` of each row group of a Parquet file."""
    metadata = _parquet(file.path).ParquetFile(file.path).metadata
    groups, first = [], 0
    for g in range(metadata.num_row_groups):
        rows = metadata.row_group(g).num_rows
        groups.append((first, rows))
        first += rows
    return groups


def _parquet_records(file: TableFile, row: int) -> Iterator[Record]:
    """Rows from ``row`` on, one row group in memory at a time (the needed columns only)."""
    blocks = ParquetBlocks(file)
    while True:
        records = blocks.records(row, 4096)
        if not records:
            return
        yield from records
        row += len(records)


class ParquetBlocks:
    """Rows of a Parquet file by number, one row group in memory (as Python values) at a time:
    a reader that visits a row group's blocks one after another reads it once."""

    def __init__(self, file: TableFile) -> None:
        self.file = file
        self.groups = parquet_row_groups(file)
        self.starts = [first for first, _ in self.groups]
        self._cached: tuple[int, list[tuple[Any, ...]]] | None = None

    def group_of(self, row: int) -> int:
        return max(bisect.bisect_right(self.starts, row) - 1, 0)

    def records(self, row: int, count: int) -> list[Record]:
        """Records ``row .. row + count - 1`` (fewer at the end of the file)."""
        out: list[Record] = []
        while len(out) < count:
            group = self.group_of(row)
            first, size = self.groups[group]
            if row >= first + size:
                break
            rows = self._group(group)
            take = rows[row - first : row - first + count - len(out)]
            out += [(row + i + 1, -1, list(values), None) for i, values in enumerate(take)]
            row += len(take)
        return out

    def _group(self, group: int) -> list[tuple[Any, ...]]:
        if self._cached is None or self._cached[0] != group:
            reader = _parquet(self.file.path).ParquetFile(self.file.path)
            table = reader.read_row_group(group, columns=list(self.file.needed))
            columns = [table.column(name).to_pylist() for name in self.file.needed]
            self._cached = (group, list(zip(*columns)))
        return self._cached[1]
