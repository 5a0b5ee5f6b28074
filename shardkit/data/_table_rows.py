"""A table row's raw values -> checked values (`RowParser`) -> ids and numbers (`RowEncoder`)
-> `Batch` (`rows_to_batch`).

[Note: table rows]
Parsing needs only the schema and checks everything a row can get wrong: the label (0/1, or a
number for the rule), every dense value (a finite number, or missing with a ``fill``), the
time (a number or an ISO-8601 date). A `RowProblem` names the column. The parsed row is
``(label, dense, items, time, per)``: ``dense`` the raw numbers, ``items`` one tuple of strings
per feature (in the fitted schema's key order; empty for a missing value). Encoding needs the
fitted schema: items become rows of their tables (vocabulary or hash), dense numbers are
transformed. An encoded row is ``(label, dense, bags)``: what `rows_to_batch` stacks.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from shardkit.data._batch import Batch
from shardkit.data._table_schema import ColumnSpec, ColumnType, TableSchema, parse_time
from shardkit.sparse import KeyedJaggedTensor

__all__ = ["EncodedRow", "ParsedRow", "RowEncoder", "RowParser", "RowProblem", "hash_id",
           "rows_to_batch"]  # fmt: skip

ParsedRow = tuple[float, list[float], list[tuple[str, ...]], "float | None", "str | None"]
EncodedRow = tuple[float, list[float], list[list[int]]]
_HASH_CACHE = 1 << 16  # values whose hashed row each hashed feature remembers


class RowProblem(ValueError):
    """A row that cannot be used: ``column`` (may be empty: the whole row) and what is wrong."""

    def __init__(self, column: str, message: str) -> None:
        super().__init__(message)
        self.column, self.message = column, message

    def where(self, place: str) -> str:
        column = f" column {self.column!r}:" if self.column else ""
        return f"{place}:{column} {self.message}"


def hash_id(value: str, num_embeddings: int) -> int:
    """A value's row in a hashed table: a 64-bit BLAKE2b of its UTF-8 bytes, modulo the rows
    (the same in every process and release, unlike Python's ``hash``)."""
    digest = hashlib.blake2b(value.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % num_embeddings


class RowParser:
    """Checks and splits a record's values (in ``needed`` order) into a `ParsedRow`.

    Args:
        schema: the table schema.
        needed: the column order of the records' values (`TableSchema.needed`).
        keys: the sparse columns in the order of the features (`FittedSchema.keys`).
    """

    def __init__(self, schema: TableSchema, needed: Sequence[str], keys: Sequence[str]) -> None:
        at = {name: i for i, name in enumerate(needed)}
        by_name = {c.name: c for c in schema.columns}
        self.label_rule, self.label_at = schema.label, at[schema.label.column]
        self.dense = [(at[c.name], c) for c in schema.dense]
        # (index, multi-hot, separator, missing values) per feature: the hot loop reads these
        self.sparse = [(at[k], by_name[k].type is ColumnType.MULTI_HOT, by_name[k].separator,
                        frozenset(by_name[k].missing)) for k in keys]  # fmt: skip
        self.time_column = schema.split.time_column or ""
        self.time_at = at.get(self.time_column)
        self.per_at = at.get(schema.split.per or "")

    def parse(self, values: Sequence[Any]) -> ParsedRow:
        try:
            label = self.label_rule.apply(values[self.label_at])
        except ValueError as exc:
            raise RowProblem(self.label_rule.column, str(exc)) from None
        dense = [_number(values[i], c) for i, c in self.dense]
        items: list[tuple[str, ...]] = []
        for i, multi, separator, missing in self.sparse:
            value = values[i]
            if type(value) is not str:
                value = _text(value) if not isinstance(value, (list, tuple)) else value
            if not multi:
                value = value.strip()
                items.append(() if value in missing else (value,))
            elif type(value) is str:
                parts = (part.strip() for part in value.split(separator))
                items.append(tuple(p for p in parts if p not in missing))
            else:  # a Parquet list column
                items.append(tuple(t for t in map(_text, value) if t not in missing))
        time = None
        if self.time_at is not None:
            value = values[self.time_at]
            try:
                time = parse_time(value, where="time")
            except ValueError:
                raise RowProblem(self.time_column, f"{value!r} is not a time (a number of "
                                 "seconds, or an ISO-8601 date)") from None  # fmt: skip
        per = None if self.per_at is None else _text(values[self.per_at])
        return label, dense, items, time, per


def _text(value: Any) -> str:
    return "" if value is None else (value.strip() if isinstance(value, str) else str(value))


def _number(value: Any, column: ColumnSpec) -> float:
    text = _text(value)
    if text in column.missing:
        if column.fill is None:
            raise RowProblem(column.name, f"missing value {text!r}; give the column a fill "
                             "value in the schema (fill = 0) or skip such rows")  # fmt: skip
        return column.fill
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise RowProblem(column.name, f"{text!r} is not a finite number (a dense column)")
    return number


class RowEncoder:
    """Parsed rows -> encoded rows with a fitted schema's vocabularies and transforms."""

    def __init__(self, fitted: Any) -> None:  # a FittedSchema (it imports this module)
        table_of = {f: t for t in fitted.tables for f in t.features}
        self.lookups: list[tuple[dict[str, int], int]] = []  # (value -> row, hashed rows or 0)
        for key in fitted.keys:
            table = table_of[key]
            if table.ids == "hash":
                self.lookups.append(({}, table.num_embeddings))  # a cache of hashed values
            else:
                vocabulary = {value: row for row, value in enumerate(table.vocabulary, start=1)}
                self.lookups.append((vocabulary, 0))
        self.transforms = [_transform(d.log1p, d.mean, d.std, d.boundaries) for d in fitted.dense]

    def encode(self, row: ParsedRow) -> EncodedRow:
        bags = []
        for (lookup, hashed), values in zip(self.lookups, row[2]):
            if not hashed:
                bags.append([lookup.get(v, 0) for v in values])
                continue
            bag = []
            for v in values:
                found = lookup.get(v)
                if found is None:
                    found = hash_id(v, hashed)
                    if len(lookup) < _HASH_CACHE:
                        lookup[v] = found
                bag.append(found)
            bags.append(bag)
        return row[0], [f(x) for f, x in zip(self.transforms, row[1])], bags


def _transform(
    log1p: bool, mean: float | None, std: float | None, bounds: tuple[float, ...] | None
) -> Callable[[float], float]:
    """One dense column's transform (see [Note: fitted schema])."""

    def log(x: float) -> float:
        return math.log1p(max(x, 0.0)) if log1p else x

    if mean is not None and std is not None:
        return lambda x: (log(x) - mean) / std
    if bounds is not None:
        cuts, scale = list(bounds), 1.0 / max(len(bounds), 1)
        return lambda x: bisect.bisect_right(cuts, log(x)) * scale
    return log


def rows_to_batch(
    rows: Sequence[EncodedRow], *, keys: Sequence[str], num_dense: int,
    weights: torch.Tensor | None = None,
) -> Batch:  # fmt: skip
    """Stack encoded rows: dense ``[B, D]``, a KJT of ``F`` keys (key-major), labels ``[B]``."""
    size = len(rows)
    labels = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    dense = torch.tensor([r[1] for r in rows], dtype=torch.float32).reshape(size, num_dense)
    features = range(len(keys))
    lengths = [len(r[2][f]) for f in features for r in rows]
    values = [i for f in features for r in rows for i in r[2][f]]
    sparse = KeyedJaggedTensor(keys=list(keys), values=torch.tensor(values, dtype=torch.int64),
                               lengths=torch.tensor(lengths, dtype=torch.int32), stride=size)  # fmt: skip
    return Batch(dense_features=dense, sparse_features=sparse, labels=labels, weights=weights)
