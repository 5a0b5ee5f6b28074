"""A piece of a table (Arrow columns) -> checked columns (`Columns`), vectorized; the rows the
vectorized checks flag are decided by `RowParser`, the row-at-a-time spec.

[Note: columnar parsing]
Every check of [Note: table rows] runs on whole columns with Arrow's and NumPy's kernels: bytes
that are not UTF-8 (a cast that validates), labels (words or a rule), dense values (missing,
a number, finite), times (numbers; dates go to the row parser), bags (split, trimmed, missing
values dropped). A check never decides a row alone where Arrow and Python could differ: it
only *flags* rows it cannot read (``1_000``, `` 4 ``, ``inf``, an ISO date...), and each flagged
row is parsed by `RowParser`, which either refuses it with the same message as ever, naming the
column, or gives its values (patched into the columns). So every accepted value is what the
row parser gives, and every refused row gets the row parser's message; a file of good rows
never reaches Python row by row.

[Note: Parquet dictionaries]
A Parquet file's string columns that are only features (`ColumnParser.dictionary`: not the
label, a dense or the time column), and lists of strings, are read as dictionary arrays
(``read_dictionary``): Parquet stores such columns as a dictionary and codes, so pyarrow
skips making a string per row. A piece's distinct texts are then trimmed and checked once
(`ColumnParser._coded`; a multi-hot text column: split once per text, `ColumnParser._split`),
its bags are a dictionary array of the trimmed texts, and the fit counts each row's code
(`dictionary_parts`), as for a CSV multi-hot column: the same values, so the same counts, the
same vocabularies, and the same ids in the reader. A piece's column holding a null takes the
strings' way (decoded; the null is the text ``""``, as ever). A CSV file's multi-hot text
columns are read as dictionary arrays too (Arrow's CSV reader hashes each text as it converts
it; MovieLens-1M's genres: about 15 ms of a piece's 100, loaded), so their distinct texts are
split once without a second hash pass; one-value columns stay strings (counted as numbers or
packed keys, cheaper than hashing them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardkit.data._table_rows import RowParser, RowProblem
from shardkit.data._table_schema import _FALSE as FALSE_WORDS
from shardkit.data._table_schema import _TRUE as TRUE_WORDS
from shardkit.data._table_schema import ColumnType, TableSchema

__all__ = ["BadRow", "ColumnParser", "Columns", "dictionary_parts"]

_NUMBER = r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$"


@dataclass(frozen=True)
class BadRow:
    """A refused row: its record number in the piece, the column (may be empty) and why."""

    record: int
    column: str
    message: str

    def where(self, place: str) -> str:
        return RowProblem(self.column, self.message).where(place)


@dataclass(frozen=True, eq=False)
class Columns:
    """A piece's good rows: ``records`` int64 ``[n]`` (numbers in the piece), ``labels``
    float64 ``[n]`` (0/1), ``dense`` float64 ``[n, D]`` (raw numbers, untransformed),
    ``bags`` per feature (the fitted schema's key order) ``(values, lengths)``: the bags'
    strings flattened (an Arrow string array; a multi-hot column of few distinct texts: a
    dictionary array of strings, see `dictionary_parts`) and int64 ``[n]`` lengths; ``times`` float64
    ``[n]`` and ``users`` (Arrow strings ``[n]``) when the split needs them."""

    records: np.ndarray
    labels: np.ndarray
    dense: np.ndarray
    bags: tuple[tuple[Any, np.ndarray], ...]
    times: np.ndarray | None
    users: Any

    def __len__(self) -> int:
        return len(self.records)

    def filter(self, keep: np.ndarray) -> Columns:
        """The rows where ``keep`` (bool ``[n]``) holds."""
        if keep.all():
            return self
        bags = tuple((values.filter(np.repeat(keep, lengths)), lengths[keep])
                     for values, lengths in self.bags)  # fmt: skip
        return Columns(self.records[keep], self.labels[keep], self.dense[keep], bags,
                       None if self.times is None else self.times[keep],
                       None if self.users is None else self.users.filter(keep))  # fmt: skip


class ColumnParser:
    """Checks and splits a piece's columns (see [Note: columnar parsing]).

    Args:
        schema: the table schema.
        keys: the sparse columns in feature order (`FittedSchema.keys`).
        columns: the file's columns in file order (to name the first column that is not
            UTF-8, as the row reader did); None: the needed ones.
    """

    def __init__(self, schema: TableSchema, keys: Sequence[str], columns: Sequence[str] | None
                 = None) -> None:  # fmt: skip
        import pyarrow as pa

        self.pa = pa
        self.schema, self.needed = schema, schema.needed
        self.row_parser = RowParser(schema, self.needed, keys)
        by_name = {c.name: c for c in schema.columns}
        self.keys = [by_name[k] for k in keys]
        order = {name: i for i, name in enumerate(columns or self.needed)}
        self.file_order = sorted(self.needed, key=lambda n: order.get(n, len(order)))
        self.words = (pa.array(TRUE_WORDS), pa.array(FALSE_WORDS))
        self.missing = {c.name: pa.array(list(c.missing), pa.string()) for c in schema.columns}
        self.ones = np.ones(0, dtype=np.int64)
        numeric = {schema.label.column, schema.split.time_column, *(c.name for c in schema.dense)}
        self.features = frozenset(c.name for c in self.keys) - numeric
        self.texts = (
            frozenset(c.name for c in self.keys if c.type is ColumnType.MULTI_HOT) - numeric
        )

    def dictionary(self, kind: str) -> frozenset[str]:
        """The columns a piece of a file of ``kind`` (`TableFile.kind`) reads as dictionary
        arrays (see [Note: Parquet dictionaries]): Parquet's feature columns of strings; a
        CSV file's multi-hot text columns (few distinct texts, each split once)."""
        return self.features if kind == "parquet" else self.texts

    @property
    def pc(self) -> Any:
        """pyarrow.compute, imported at first use, in a worker: a scan imports it in a thread
        while its first piece is cut (see [Note: a scan's first piece])."""
        import pyarrow.compute

        return pyarrow.compute

    def parse(self, table: Any, records: np.ndarray) -> tuple[Columns, list[BadRow]]:
        """``table``: the needed columns of a piece (CSV: strings, or binary when not UTF-8);
        ``records``: each row's record number. Returns the good rows and the refused ones (in
        record order)."""
        pa = self.pa
        n = table.num_rows
        raw = {name: _array(table.column(name)) for name in self.needed}
        bad: dict[int, BadRow] = {}
        for name in self.file_order:  # bytes that are not UTF-8
            if pa.types.is_binary(raw[name].type):
                raw[name] = self._utf8(name, raw[name], records, bad)
        flagged = np.zeros(n, dtype=bool)
        labels = self._labels(raw[self.schema.label.column], flagged)
        dense = np.empty((n, len(self.schema.dense)), dtype=np.float64)
        for j, column in enumerate(self.schema.dense):
            dense[:, j] = self._dense(raw[column.name], column, flagged)
        split = self.schema.split
        times = None if split.time_column is None else self._times(raw[split.time_column], flagged)
        texts: dict[str, Any] = {}  # each column's trimmed text, made once
        users = None if split.per is None else self._text(raw[split.per], texts, split.per)
        for row in np.flatnonzero(flagged).tolist():
            if row in bad:
                continue
            values = [raw[name][row].as_py() for name in self.needed]
            try:
                label, numbers, _, time, _ = self.row_parser.parse(values)
            except RowProblem as exc:
                bad[row] = BadRow(int(records[row]), exc.column, exc.message)
                continue
            labels[row] = label
            dense[row] = numbers
            if times is not None:
                times[row] = time
        bags = tuple(self._bag(raw[c.name], c, texts) for c in self.keys)
        columns = Columns(records, labels, dense, bags, times, users)
        if bad:
            keep = np.ones(n, dtype=bool)
            keep[list(bad)] = False
            columns = columns.filter(keep)
        return columns, [bad[row] for row in sorted(bad)]

    def _utf8(self, name: str, column: Any, records: np.ndarray, bad: dict[int, BadRow]) -> Any:
        pa = self.pa
        try:
            return column.cast(pa.string())
        except pa.ArrowInvalid:
            pass
        values = column.to_pylist()
        for row, value in enumerate(values):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                message = f"bytes that are not UTF-8 ({value[:40]!r}); save the file as UTF-8"
                bad.setdefault(row, BadRow(int(records[row]), name, message))
                values[row] = b""
        return pa.array(values, pa.binary()).cast(pa.string())

    def _text(self, column: Any, texts: dict[str, Any] | None = None, name: str = "") -> Any:
        """Python's ``str(value).strip()`` of each value, None as '' (kept in ``texts``)."""
        if texts is not None and name in texts:
            return texts[name]
        text = self._trimmed(column)
        if texts is not None:
            texts[name] = text
        return text

    def _trimmed(self, column: Any) -> Any:
        pa, pc = self.pa, self.pc
        if not pa.types.is_string(column.type):
            column = column.cast(pa.string())
        column = column.fill_null("")
        return pc.utf8_trim_whitespace(column) if _may_have_spaces(column) else column

    def _labels(self, column: Any, flagged: np.ndarray) -> np.ndarray:
        pc, rule = self.pc, self.schema.label
        valid = np.asarray(column.is_valid())
        if rule.op is None:
            words = pc.utf8_lower(self._text(column))
            one = np.asarray(pc.is_in(words, value_set=self.words[0]))
            zero = np.asarray(pc.is_in(words, value_set=self.words[1]))
            flagged |= ~(one | zero) | ~valid
            return one.astype(np.float64)
        if isinstance(rule.value, str):
            text = self._text(column.fill_null("None"))
            same = np.asarray(pc.equal(text, rule.value))
            return (same == (rule.op == "==")).astype(np.float64)
        numbers, unread = self._numbers(column)
        flagged |= unread | np.isnan(numbers)
        compare = {">=": np.greater_equal, "<=": np.less_equal, "==": np.equal,
                   "!=": np.not_equal, ">": np.greater, "<": np.less}[rule.op]  # fmt: skip
        assert isinstance(rule.value, (int, float))
        return compare(numbers, rule.value).astype(np.float64)

    def _numbers(self, column: Any) -> tuple[np.ndarray, np.ndarray]:
        """float64 values and the rows Arrow could not read as numbers (nulls included)."""
        pa, pc = self.pa, self.pc
        n = len(column)
        if pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
            unread = ~np.asarray(column.is_valid())
            return _floats(column.cast(pa.float64()).fill_null(0.0)), unread
        if not pa.types.is_string(column.type):
            return np.zeros(n), np.ones(n, dtype=bool)
        try:
            return _floats(column.cast(pa.float64())), np.zeros(n, dtype=bool)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        text = self._text(column)
        readable = np.asarray(pc.match_substring_regex(text, _NUMBER))
        numbers = _floats(pc.if_else(pa.array(readable), text, "0").cast(pa.float64()))
        return numbers, ~readable

    def _dense(self, column: Any, spec: Any, flagged: np.ndarray) -> np.ndarray:
        pa, pc = self.pa, self.pc
        if pa.types.is_string(column.type):
            text = pc.utf8_trim_whitespace(column) if _may_have_spaces(column) else column
            missing = self._missing(text, spec.name)
            if missing.any():
                column = pc.if_else(pa.array(missing), "0", text)
        else:
            missing = ~np.asarray(column.is_valid()) if "" in spec.missing else np.zeros(
                len(column), dtype=bool)  # fmt: skip
        numbers, unread = self._numbers(column)
        unread &= ~missing
        if spec.fill is not None:
            numbers[missing] = spec.fill
        else:
            unread |= missing
        flagged |= unread | ~np.isfinite(numbers)
        return numbers

    def _times(self, column: Any, flagged: np.ndarray) -> np.ndarray:
        pa = self.pa
        if pa.types.is_timestamp(column.type):
            unit = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[column.type.unit]
            column = column.cast(pa.timestamp(column.type.unit)).cast(pa.int64())
            numbers, unread = _floats(column.fill_null(0).cast(pa.float64())) * unit, ~np.asarray(
                column.is_valid())  # fmt: skip
        elif pa.types.is_date32(column.type):
            days = column.cast(pa.int32())
            numbers = _floats(days.fill_null(0).cast(pa.float64())) * 86400.0
            unread = ~np.asarray(days.is_valid())
        else:
            numbers, unread = self._numbers(column)
        flagged |= unread
        return numbers

    def _missing(self, values: Any, name: str) -> np.ndarray:
        """Whether each string is one of the column's missing values."""
        pc = self.pc
        value_set = self.missing[name]
        if len(value_set) == 1 and value_set[0].as_py() == "" and not values.null_count:
            return _lengths(values) == 0
        return np.asarray(pc.is_in(values, value_set=value_set))

    def _bag(self, column: Any, spec: Any, texts: dict[str, Any]) -> tuple[Any, np.ndarray]:
        """A feature's bags: the kept strings (flattened) and each row's count."""
        pa, pc = self.pa, self.pc
        n = len(column)
        if pa.types.is_dictionary(column.type) and not column.null_count:  # see `dictionary`
            if spec.type is ColumnType.MULTI_HOT:  # texts to split: each distinct one once
                return self._split(column.dictionary, np.asarray(column.indices), spec)
            return self._coded(column, None, n, spec)
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            parents = np.asarray(pc.list_parent_indices(column))
            flat = pc.list_flatten(column)
            if pa.types.is_dictionary(flat.type) and not flat.null_count:
                return self._coded(flat, parents, n, spec)
            values = self._text(flat)
        elif spec.type is ColumnType.MULTI_HOT:
            text = self._text(column)
            encoded = pc.dictionary_encode(text)
            if n and 4 * len(encoded.dictionary) <= n:  # few distinct bags: each split once
                return self._split(encoded.dictionary, np.asarray(encoded.indices), spec)
            parts = pc.split_pattern(text, pattern=spec.separator)
            parents = np.asarray(pc.list_parent_indices(parts))
            values = pc.utf8_trim_whitespace(pc.list_flatten(parts))
        else:  # one value per row: each row's length is whether its value is kept
            values = self._text(column, texts, spec.name)
            keep = ~self._missing(values, spec.name)
            if keep.all():
                return values, self._ones(n)
            return values.filter(pa.array(keep)), keep.astype(np.int64)
        keep = ~self._missing(values, spec.name)
        if not keep.all():
            values, parents = values.filter(pa.array(keep)), parents[keep]
        return values, np.bincount(parents, minlength=n).astype(np.int64)

    def _coded(self, codes: Any, parents: np.ndarray | None, n: int, spec: Any
               ) -> tuple[Any, np.ndarray]:  # fmt: skip
        """`_bag` of values given as a dictionary array without nulls (``parents``: each
        value's row; None: one value per row): the distinct texts trimmed and checked once,
        the kept values a dictionary array of the trimmed texts (see [Note: Parquet
        dictionaries])."""
        pa = self.pa
        texts = self._text(codes.dictionary)
        indices = np.asarray(codes.indices)
        keep = ~self._missing(texts, spec.name)[indices]
        kept = keep.all()
        values = pa.DictionaryArray.from_arrays(
            codes.indices if kept else pa.array(indices[keep]), texts
        )
        if parents is None:  # one value per row: each row's length is whether it is kept
            return values, self._ones(n) if kept else keep.astype(np.int64)
        kept_parents = parents if kept else parents[keep]
        return values, np.bincount(kept_parents, minlength=n).astype(np.int64)

    def _ones(self, n: int) -> np.ndarray:
        """``n`` ones (int64), read-only: the lengths of every categorical column of a piece
        with no missing value (one array, not one per column; any thread)."""
        ones = self.ones
        if len(ones) != n:
            ones = np.ones(n, dtype=np.int64)
            ones.flags.writeable = False
            self.ones = ones
        return ones

    def _split(self, texts: Any, codes: np.ndarray, spec: Any) -> tuple[Any, np.ndarray]:
        """`_bag` of a multi-hot column given as its distinct ``texts`` and each row's code:
        each distinct text split, trimmed and checked once, then each row's values are its
        text's (the same values in the same order as splitting every row), as an Arrow
        dictionary array: the distinct texts' values and each row value's place among them,
        so the fit counts the places and looks up the few values (see `dictionary_parts`)."""
        pa = self.pa
        values, lengths = self._bag(texts, spec, {})
        starts = np.cumsum(lengths) - lengths
        per_row = lengths[codes]
        total = int(per_row.sum())
        first = np.repeat(starts[codes] - (np.cumsum(per_row) - per_row), per_row)
        first += np.arange(total, dtype=first.dtype)
        kind = pa.int32() if len(values) < 1 << 31 else pa.int64()
        return pa.DictionaryArray.from_arrays(pa.array(first, kind), values), per_row


def dictionary_parts(values: Any) -> tuple[Any, np.ndarray] | None:
    """An Arrow dictionary array's values and indices (int64 NumPy), None for another array:
    a multi-hot column's bags (`ColumnParser._split`) come as one."""
    if not hasattr(values, "dictionary"):
        return None
    return values.dictionary, np.asarray(values.indices).astype(np.int64, copy=False)


def _offsets(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """A string array's offsets (``[n + 1]``) and bytes, as NumPy views of its buffers."""
    _, offsets, data = values.buffers()
    kind = np.int64 if str(values.type) == "large_string" else np.int32
    at = np.frombuffer(offsets, dtype=kind)[values.offset : values.offset + len(values) + 1]
    text = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
    return at, text


def _lengths(values: Any) -> np.ndarray:
    """Each string's length in bytes."""
    offsets, _ = _offsets(values)
    return np.diff(offsets)


def _may_have_spaces(values: Any) -> bool:
    """Whether a string may start or end with whitespace (a byte <= 32, or >= 128: a
    non-ASCII character may be Unicode whitespace), so trimming may change it. Each string's
    first and last byte are read without a mask: an empty string reads its neighbours' edge
    bytes, which are checked anyway (at worst a needless trim). When no byte of the strings
    is one (Criteo's hex ids and counts), no string has one at an edge: two contiguous passes,
    faster than gathering every string's edges."""
    if not len(values):
        return False
    offsets, text = _offsets(values)
    if not len(text):
        return False
    used = text[int(offsets[0]) : int(offsets[-1])]
    if not len(used) or (int(used.min()) > 32 and int(used.max()) < 128):
        return False
    first = text[np.minimum(offsets[:-1], len(text) - 1)]
    last = text[np.maximum(offsets[1:] - 1, 0)]
    first -= np.uint8(33)  # bytes 33..126 (printable ASCII but the space) become 0..93
    last -= np.uint8(33)
    return bool(first.max() > 93 or last.max() > 93)


def _array(column: Any) -> Any:
    """One Arrow array of a (chunked) column (a column of one chunk: that chunk, not a copy)."""
    if not hasattr(column, "combine_chunks"):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _floats(column: Any) -> np.ndarray:
    return np.array(column.to_numpy(zero_copy_only=False), dtype=np.float64)
