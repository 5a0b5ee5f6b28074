"""The files of a table: which they are, their kind (CSV/TSV plain or gzip, Parquet), header
and needed columns; and, for naming a bad row, the standard library's reading of CSV records.

[Note: table records]
The scan and the readers read pieces of files in C++ (see [Note: table pieces]). Naming a bad
CSV row reads records here, as ``(line, offset, values, problem)``: ``line`` the 1-based line of
a row's first line, ``offset`` the byte offset where it starts (of the decompressed text for
gzip), ``values`` the needed columns' raw strings, ``problem`` None or ``(column, message)``.
Blank lines are not records; ragged rows are. The header of a CSV file is read by
`TableFile.open` (or the schema gives ``names``).
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

__all__ = [
    "Record",
    "TableFile",
    "list_table_files",
    "open_table_files",
    "parquet",
    "pyarrow_installed",
    "record_lines",
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
                tuple(parquet(path).ParquetFile(path).schema_arrow.names),
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


def pyarrow_installed(*modules: str) -> bool:
    """Whether pyarrow's ``modules`` (default: pyarrow) are installed: an ImportError from an
    installed one is its own error (a broken install, a partly imported module), not a
    missing extra, and is raised as it is."""
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules or ("pyarrow",))
    except (ImportError, ValueError):
        return False


def parquet(path: Path) -> Any:
    """pyarrow.parquet, or an error naming the extra."""
    try:
        import pyarrow.parquet
    except ImportError:
        if pyarrow_installed("pyarrow.parquet"):
            raise  # installed but broken: its own error says how
        raise ValueError(f"{path} is a Parquet file: reading it needs pyarrow, pip install "
                         "'shardkit[parquet]'") from None  # fmt: skip
    return pyarrow.parquet


def record_lines(file: TableFile, begin: int, records: set[int]) -> dict[int, int]:
    """The 1-based first line of each of ``records`` (numbers of the CSV records from byte
    ``begin``, a line start): for naming bad rows, read with the standard library's `csv`."""
    lines = 0
    with _binary(file.path, file.kind) as f:
        left = begin
        while left:  # the lines before `begin`
            chunk = f.read(min(left, 1 << 22))
            if not chunk:
                break
            lines += chunk.count(b"\n")
            left -= len(chunk)
    found, last = {}, max(records)
    for number, (line, _, _, _) in enumerate(_csv_records(file, begin, lines)):
        if number in records:
            found[number] = line
        if number >= last:
            break
    return found
