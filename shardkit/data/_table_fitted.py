"""`FittedSchema`: a schema with what was learnt from the training split (vocabularies, table
sizes, transform statistics), as plain data saved with checkpoints and exports, so evaluation and
serving map raw values exactly as training did. `Fitter` (`_table_fit`) learns it.

[Note: fitted schema]
Features are the sparse columns, grouped by table in the order tables first appear in the
schema (the order of the model's embedding configs and of every batch's keys). A vocabulary
table maps value ``vocabulary[k]`` to row ``k + 1`` and everything else to row 0; its size is
``num_embeddings`` if the schema gives it, else ``len(vocabulary) + 1``. A hashed table maps a
value to `hash_id` (no vocabulary). A dense column is ``log1p(max(x, 0))`` if asked, then
standardised with the training split's mean and population standard deviation (1 when it is
0), or bucketised: ``bisect_right(boundaries, x) / len(boundaries)``. Quantile boundaries are
fitted on a sample of at most 65,536 training values: those of the rows with the smallest
hash keys, so the same file gives the same boundaries everywhere (see [Note: fitting in
parts]).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shardkit.data._batch import Batch
from shardkit.data._table_rows import RowEncoder, RowParser, RowProblem, rows_to_batch
from shardkit.data._table_schema import ColumnSpec, TableSchema
from shardkit.data._table_schema_load import schema_from_dict

__all__ = ["DenseFit", "FittedSchema", "TableFit", "table_order"]

_FORMAT = 1


@dataclass(frozen=True)
class TableFit:
    """One embedding table: its features (columns), how ids are made, its rows."""

    name: str
    features: tuple[str, ...]
    ids: str
    num_embeddings: int
    pooling: str = "sum"
    vocabulary: tuple[str, ...] = ()


@dataclass(frozen=True)
class DenseFit:
    """One dense column's transform, with its fitted statistics."""

    name: str
    log1p: bool = False
    mean: float | None = None
    std: float | None = None
    boundaries: tuple[float, ...] | None = None


@dataclass(frozen=True, eq=False)
class FittedSchema:
    """A `TableSchema` fitted on a training split (see [Note: fitted schema])::

        fitted = FittedSchema.load("runs/ratings/schema.json")     # what `shardkit export` writes
        batch = fitted.batch([{"user_id": "42", "genres": "Drama|War", "age": "31"}])

    Attributes:
        schema: the declared schema.
        tables: the embedding tables, in feature order.
        dense: the dense columns' transforms, in the schema's order.
        stats: what the fit saw (rows, positives) for the log.
    """

    schema: TableSchema
    tables: tuple[TableFit, ...]
    dense: tuple[DenseFit, ...]
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def keys(self) -> tuple[str, ...]:
        """The features (sparse columns), grouped by table: every batch's keys, in order."""
        return tuple(f for t in self.tables for f in t.features)

    @property
    def num_embeddings_per_feature(self) -> tuple[int, ...]:
        rows = {f: t.num_embeddings for t in self.tables for f in t.features}
        return tuple(rows[k] for k in self.keys)

    @property
    def dense_names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dense)

    def encoder(self) -> RowEncoder:
        return RowEncoder(self)

    def batch(self, records: Sequence[Mapping[str, Any]]) -> Batch:
        """Raw records (column -> value, as in the files) as a `Batch`, mapped as in training;
        the label column may be absent (label 0). For evaluation and serving."""
        needed = (self.schema.label.column, *(c.name for c in self.schema.columns))
        parser, encoder = RowParser(self.schema, needed, self.keys), self.encoder()
        rows = []
        for number, record in enumerate(records):
            values = [record.get(name, "0" if i == 0 else None) for i, name in enumerate(needed)]
            try:
                rows.append(encoder.encode(parser.parse(values)))
            except RowProblem as exc:
                raise ValueError(exc.where(f"record {number}")) from None
        return rows_to_batch(rows, keys=self.keys, num_dense=len(self.dense))

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON), read back by `from_dict`."""
        return {
            "format": _FORMAT,
            "schema": self.schema.to_dict(),
            "tables": [_table_dict(t) for t in self.tables],
            "dense": [_dense_dict(d) for d in self.dense],
            "stats": dict(self.stats),
        }

    @staticmethod
    def from_dict(data: Mapping[str, Any], *, source: str = "fitted schema") -> FittedSchema:
        if not isinstance(data, Mapping) or data.get("format") != _FORMAT:
            raise ValueError(f"{source}: not a fitted schema of format {_FORMAT} (as "
                             "FittedSchema.to_dict writes)")  # fmt: skip
        tables = tuple(TableFit(**{**t, "features": tuple(t["features"]),
                                   "vocabulary": tuple(t["vocabulary"])}) for t in data["tables"])  # fmt: skip
        dense = tuple(DenseFit(**{**d, "boundaries": None if d["boundaries"] is None
                                  else tuple(d["boundaries"])}) for d in data["dense"])  # fmt: skip
        schema = schema_from_dict(data["schema"], source=source)
        return FittedSchema(schema, tables, dense, dict(data.get("stats", {})))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")

    @staticmethod
    def load(path: str | Path) -> FittedSchema:
        return FittedSchema.from_dict(json.loads(Path(path).read_text(encoding="utf-8")),
                                      source=str(path))  # fmt: skip


def _table_dict(table: TableFit) -> dict[str, Any]:
    return {**vars(table), "features": list(table.features), "vocabulary": list(table.vocabulary)}


def _dense_dict(dense: DenseFit) -> dict[str, Any]:
    bounds = None if dense.boundaries is None else list(dense.boundaries)
    return {**vars(dense), "boundaries": bounds}


def table_order(schema: TableSchema) -> dict[str, list[ColumnSpec]]:
    """Tables in order of first appearance, each with its columns (the features)."""
    tables: dict[str, list[ColumnSpec]] = {}
    for column in schema.sparse:
        tables.setdefault(column.table, []).append(column)
    return tables
