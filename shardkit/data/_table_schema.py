"""`TableSchema`: what the columns of a user's table mean, read from a TOML, JSON or YAML file.

[Note: table schema]
A schema names the label and the columns the model uses; other columns of the file are ignored.
In TOML (JSON and YAML hold the same keys)::

    label = "rating >= 4"            # a 0/1 column ("clicked"), or: column, comparison, value

    [columns]
    user_id  = { type = "categorical", min_count = 2 }       # one table per column by default
    movie_id = { type = "categorical", table = "movies" }    # columns naming one table share it
    genres   = { type = "multi_hot", separator = "|" }       # a bag of ids per example
    zip      = { type = "categorical", ids = "hash", num_embeddings = 1000 }
    age      = { type = "dense", transform = ["log1p", "standardize"] }

    [split]
    time_column = "timestamp"        # validation: the last 10% of each user's rows, by time
    validation_fraction = 0.1
    per = "user_id"

Column keys (all but ``type`` optional):

- ``type``: ``categorical`` (one id per example), ``multi_hot`` (a bag of ids split by
  ``separator``, default ``|``), ``dense`` (a number).
- ``table``: the embedding table (default: the column's name); its settings (``ids``,
  ``num_embeddings``, ``min_count``, ``pooling``) may be given on any of its columns and must
  agree.
- ``ids``: ``vocabulary`` (default): values seen in the training split at least ``min_count``
  (default 1) times get rows 1, 2, ... in order of decreasing frequency (ties: by value); row 0
  is for every other value (unseen or rare); ``num_embeddings``, if given, keeps the
  ``num_embeddings - 1`` most frequent. ``hash``: a value's row is a 64-bit hash of it modulo
  ``num_embeddings`` (required), with no vocabulary to hold.
- ``pooling``: ``sum`` (default) or ``mean``, how a bag's embeddings combine.
- ``missing``: the values that mean "no value" (default ``[""]``): an empty bag for a
  categorical or multi-hot column; for a dense column ``fill`` (a number) or, without it, an
  error.
- ``transform`` (dense): ``log1p`` (of ``max(x, 0)``), then at most one of ``standardize``
  (training split's mean and standard deviation) or ``bucketize`` (``buckets`` quantiles of
  the training split, default 10, or fixed ``boundaries``; the value becomes
  ``bucket / (buckets - 1)`` in ``[0, 1]``). Default: none.

Top-level keys: ``label`` (required), ``columns`` (required), ``split``, ``delimiter`` (default
from the file name: tab for ``.tsv``/``.tab``, else comma), ``names`` (the column names of files
without a header line). ``split`` holds ``validation_path`` (a file or folder, relative to the
schema file), or ``validation_fraction`` (default 0.1: rows chosen by a seeded hash), optionally
with ``time_column`` (the last fraction by time: a global cut, or per ``per`` column) or
``time_cut`` (rows at or after this time are validation). Times are numbers or ISO-8601 dates.
"""

from __future__ import annotations

import datetime
import enum
import math
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "COLUMN_KEYS",
    "DEFAULT_VALIDATION_FRACTION",
    "ColumnSpec",
    "ColumnType",
    "LabelRule",
    "SplitSpec",
    "TableSchema",
    "parse_time",
]


class ColumnType(enum.Enum):
    CATEGORICAL = "categorical"
    MULTI_HOT = "multi_hot"
    DENSE = "dense"


COLUMN_KEYS = (
    "type", "table", "ids", "num_embeddings", "min_count", "pooling", "separator", "missing",
    "transform", "buckets", "boundaries", "fill",
)  # fmt: skip
DEFAULT_VALIDATION_FRACTION = 0.1
_OPS = (">=", "<=", "==", "!=", ">", "<")
_TRUE, _FALSE = ("1", "1.0", "true", "yes"), ("0", "0.0", "false", "no")


@dataclass(frozen=True)
class ColumnSpec:
    """One column the model uses (see [Note: table schema]); built by `load_schema`."""

    name: str
    type: ColumnType
    table: str = ""
    ids: str = "vocabulary"
    num_embeddings: int | None = None
    min_count: int = 1
    pooling: str = "sum"
    separator: str = "|"
    missing: tuple[str, ...] = ("",)
    transform: tuple[str, ...] = ()
    buckets: int = 10
    boundaries: tuple[float, ...] | None = None
    fill: float | None = None

    @property
    def is_sparse(self) -> bool:
        return self.type is not ColumnType.DENSE


@dataclass(frozen=True)
class LabelRule:
    """How a row's label is made: ``column`` as 0/1, or ``column op value`` (``rating >= 4``)."""

    column: str
    op: str | None = None
    value: float | str | None = None

    def __str__(self) -> str:
        return self.column if self.op is None else f"{self.column} {self.op} {self.value}"

    def apply(self, text: Any) -> float:
        """The label (0.0 or 1.0) of a raw value; ValueError with the rule if it has none."""
        if self.op is None:
            word = str(text).strip().lower()
            if word in _TRUE:
                return 1.0
            if word in _FALSE:
                return 0.0
            raise ValueError(
                f"label {text!r} is not binary (0/1, true/false); give a rule such as "
                f"label = '{self.column} >= 4'"
            )
        if isinstance(self.value, str):
            return float((str(text).strip() == self.value) == (self.op == "=="))
        try:
            number = float(text)
        except (TypeError, ValueError):
            number = math.nan
        if math.isnan(number):
            raise ValueError(f"{text!r} is not a number, which the label rule '{self}' needs")
        assert isinstance(self.value, (int, float))
        return float(_COMPARE[self.op](number, self.value))


_COMPARE = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">": operator.gt, "<": operator.lt}  # fmt: skip


@dataclass(frozen=True)
class SplitSpec:
    """Which rows validate (see [Note: table schema])."""

    validation_path: Path | None = None
    validation_fraction: float = DEFAULT_VALIDATION_FRACTION
    time_column: str | None = None
    time_cut: float | None = None
    per: str | None = None


@dataclass(frozen=True)
class TableSchema:
    """A parsed, checked schema. ``source`` names the file it came from (for messages)."""

    label: LabelRule
    columns: tuple[ColumnSpec, ...]
    split: SplitSpec = field(default_factory=SplitSpec)
    delimiter: str | None = None
    names: tuple[str, ...] | None = None
    source: str = "schema"

    @property
    def sparse(self) -> tuple[ColumnSpec, ...]:
        return tuple(c for c in self.columns if c.is_sparse)

    @property
    def dense(self) -> tuple[ColumnSpec, ...]:
        return tuple(c for c in self.columns if not c.is_sparse)

    @property
    def needed(self) -> tuple[str, ...]:
        """Every column the data must have: the label's, the model's, the split's."""
        names = [self.label.column, *(c.name for c in self.columns)]
        names += [n for n in (self.split.time_column, self.split.per) if n]
        return tuple(dict.fromkeys(names))

    def to_dict(self) -> dict[str, Any]:
        """The schema as plain data (``from_dict`` reads it back); paths become strings."""
        columns = {}
        for c in self.columns:
            entry: dict[str, Any] = {"type": c.type.value}
            for key in COLUMN_KEYS[1:]:
                value = getattr(c, key)
                if value != getattr(_DEFAULT_COLUMN, key) and not (
                    key == "table" and value == c.name
                ):
                    entry[key] = list(value) if isinstance(value, tuple) else value
            columns[c.name] = entry
        split = {k: v for k, v in vars(self.split).items() if v is not None}
        if "validation_path" in split:
            split = {"validation_path": str(split["validation_path"])}
        elif "time_cut" in split:
            del split["validation_fraction"]
        out = {"label": str(self.label), "columns": columns, "split": split}
        if self.delimiter is not None:
            out["delimiter"] = self.delimiter
        if self.names is not None:
            out["names"] = list(self.names)
        return out


_DEFAULT_COLUMN = ColumnSpec(name="", type=ColumnType.DENSE)


def parse_time(value: Any, *, where: str) -> float:
    """A time as seconds: a number, or an ISO-8601 date or date-time (UTC unless it says)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, datetime.datetime):
        stamp = value if value.tzinfo else value.replace(tzinfo=datetime.timezone.utc)
        return stamp.timestamp()
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    try:
        stamp = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{where}: {value!r} is not a time (a number of seconds or an ISO-8601 "
                         "date such as 2024-05-01 or 2024-05-01T12:30:00)") from None  # fmt: skip
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.timezone.utc)
    return stamp.timestamp()
