"""Reading and checking a schema file (TOML, JSON or YAML); see [Note: table schema]."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from shardkit.data._table_schema import (
    COLUMN_KEYS,
    DEFAULT_VALIDATION_FRACTION,
    ColumnSpec,
    ColumnType,
    LabelRule,
    SplitSpec,
    TableSchema,
    parse_time,
)

__all__ = ["load_schema", "schema_from_dict"]

_TABLE_KEYS = {"ids", "num_embeddings", "min_count", "pooling"}
_SPARSE_ONLY = {"table", "ids", "num_embeddings", "min_count", "pooling", "separator"}
_DENSE_ONLY = {"transform", "buckets", "boundaries", "fill"}
_TOP_KEYS = {"label", "columns", "split", "delimiter", "names"}
_SPLIT_KEYS = {"validation_path", "validation_fraction", "time_column", "time_cut", "per"}
_TRANSFORMS = ("log1p", "standardize", "bucketize")


def schema_from_dict(data: Any, *, source: str = "schema", base: Path | None = None) -> TableSchema:
    """Check a schema mapping (as a file holds it); ``base`` resolves relative paths."""
    return _parse(data, source, base or Path("."))


def load_schema(path: str | Path) -> TableSchema:
    """Read a schema file: ``.toml`` (Python >= 3.11, or ``pip install tomli`` on 3.10),
    ``.json``, or ``.yaml``/``.yml`` (``shardkit[yaml]``). See [Note: table schema]."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"schema file {path} does not exist; give --schema a TOML, JSON "
                                "or YAML file (see docs/data.md)")  # fmt: skip
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    errors: tuple[type[BaseException], ...] = (ValueError, *_parse_errors())
    try:
        if suffix == ".toml":
            data = _toml().loads(text)
        elif suffix in (".yaml", ".yml"):
            data = _yaml().safe_load(text)
        elif suffix == ".json":
            data = json.loads(text)
        else:
            raise ValueError(f"{path}: a schema file ends in .toml, .json, .yaml or .yml")
    except errors as exc:
        if str(exc).startswith(str(path)):
            raise
        raise ValueError(f"{path}: not valid {suffix[1:].upper()}: {exc}") from None
    return _parse(data, str(path), path.parent)


def _parse_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = []
    try:
        import yaml

        errors.append(yaml.YAMLError)
    except ImportError:
        pass
    return tuple(errors)


def _toml() -> Any:
    try:
        import tomllib  # Python >= 3.11
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            raise ValueError(
                "reading a TOML schema on Python 3.10 needs tomli: pip install tomli (or give "
                "the schema as JSON)"
            ) from None
    return tomllib


def _yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise ValueError(
            "reading a YAML schema needs PyYAML: pip install 'shardkit[yaml]' (or give the "
            "schema as TOML or JSON)"
        ) from None
    return yaml


def _parse(data: Any, source: str, base: Path) -> TableSchema:
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a schema is a mapping with 'label' and 'columns'")
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"{source}: unknown keys {unknown}; known: {sorted(_TOP_KEYS)}")
    missing = [k for k in ("label", "columns") if k not in data]
    if missing:
        raise ValueError(f"{source}: missing {missing}; a schema needs 'label' and 'columns'")
    columns = data["columns"]
    if not isinstance(columns, dict) or not columns:
        raise ValueError(f"{source}: 'columns' must map column names to their types")
    specs = _columns(source, columns)
    if not any(c.is_sparse for c in specs):
        raise ValueError(f"{source}: no categorical or multi_hot column: the model needs one")
    label = _label(source, data["label"])
    if label.column in columns:
        raise ValueError(f"{source}: the label column {label.column!r} is also in 'columns'; "
                         "a model must not see its label")  # fmt: skip
    names = data.get("names")
    if names is not None and (not isinstance(names, list) or not names):
        raise ValueError(f"{source}: 'names' must be a list of column names, got {names!r}")
    delimiter = data.get("delimiter")
    if delimiter is not None and (not isinstance(delimiter, str) or len(delimiter) != 1):
        raise ValueError(f"{source}: 'delimiter' must be one character, got {delimiter!r}")
    split = _split(source, data.get("split") or {}, base)
    return TableSchema(label=label, columns=specs, split=split, delimiter=delimiter,
                       names=tuple(map(str, names)) if names else None, source=source)  # fmt: skip


def _label(source: str, text: Any) -> LabelRule:
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{source}: 'label' must be a column name or a rule such as "
                         f"'rating >= 4', got {text!r}")  # fmt: skip
    match = re.fullmatch(r"\s*(.+?)\s*(>=|<=|==|!=|>|<)\s*(.+?)\s*", text)
    if match is None:
        return LabelRule(column=text.strip())
    column, op, raw = match.groups()
    try:
        value: float | str = float(raw)
    except ValueError:
        if op not in ("==", "!="):
            raise ValueError(
                f"{source}: label rule {text!r}: {op} needs a number, got {raw!r}"
            ) from None
        value = raw.strip("'\"")
    return LabelRule(column=column, op=op, value=value)


def _columns(source: str, columns: dict[str, Any]) -> tuple[ColumnSpec, ...]:
    entries = {str(name): _entry(source, str(name), entry) for name, entry in columns.items()}
    shared = _table_settings(source, entries)
    specs = []
    for name, (kind, values) in entries.items():
        if kind is not ColumnType.DENSE:
            values = {**values, **shared[values["table"]]}
        spec = ColumnSpec(name=name, type=kind, **values)
        _check_column(f"{source}: column {name!r}", spec)
        specs.append(spec)
    return tuple(specs)


def _entry(source: str, name: str, entry: Any) -> tuple[ColumnType, dict[str, Any]]:
    where = f"{source}: column {name!r}"
    if isinstance(entry, str):
        entry = {"type": entry}
    if not isinstance(entry, dict) or "type" not in entry:
        raise ValueError(f'{where}: give its type, e.g. {name} = {{ type = "categorical" }}')
    unknown = sorted(set(entry) - set(COLUMN_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {sorted(COLUMN_KEYS)}")
    try:
        kind = ColumnType(entry["type"])
    except ValueError:
        raise ValueError(f"{where}: unknown column type {entry['type']!r}; known: "
                         f"{[t.value for t in ColumnType]}") from None  # fmt: skip
    wrong = sorted(set(entry) & (_DENSE_ONLY if kind is not ColumnType.DENSE else _SPARSE_ONLY))
    if wrong:
        raise ValueError(f"{where}: {wrong} do not apply to a {kind.value} column")
    values = {k: v for k, v in entry.items() if k != "type"}
    if kind is not ColumnType.DENSE:
        values.setdefault("table", name)
    _coerce(where, values)
    return kind, values


def _table_settings(
    source: str, entries: dict[str, tuple[ColumnType, dict[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """Each table's settings, given on any of its columns; columns that give one agree."""
    settings: dict[str, dict[str, Any]] = {}
    given_by: dict[tuple[str, str], str] = {}
    for name, (kind, values) in entries.items():
        if kind is ColumnType.DENSE:
            continue
        table = settings.setdefault(values["table"], {})
        for key in _TABLE_KEYS & set(values):
            if key in table and table[key] != values[key]:
                raise ValueError(
                    f"{source}: columns {given_by[values['table'], key]!r} and {name!r} share "
                    f"table {values['table']!r} but give it {key} {table[key]!r} and "
                    f"{values[key]!r}; give it once (or the same on both)"
                )
            table[key] = values[key]
            given_by[values["table"], key] = name
    dense = {name for name, (kind, _) in entries.items() if kind is ColumnType.DENSE}
    clash = sorted(set(settings) & dense)
    if clash:
        raise ValueError(f"{source}: {clash} names both a table and a dense column")
    return settings


def _coerce(where: str, values: dict[str, Any]) -> None:
    for key in ("missing", "transform"):
        if isinstance(values.get(key), str):
            values[key] = [values[key]]
    for key, kind in (("missing", str), ("transform", str), ("boundaries", (int, float))):
        if key in values:
            if not isinstance(values[key], list) or not all(
                isinstance(v, kind) for v in values[key]
            ):
                raise ValueError(f"{where}: {key} must be a list, got {values[key]!r}")
            values[key] = tuple(float(v) if key == "boundaries" else v for v in values[key])
    for key in ("num_embeddings", "min_count", "buckets"):
        if key in values and (not isinstance(values[key], int) or isinstance(values[key], bool)
                              or values[key] < 1):  # fmt: skip
            raise ValueError(f"{where}: {key} must be an integer >= 1, got {values[key]!r}")
    if "fill" in values and not isinstance(values["fill"], (int, float)):
        raise ValueError(f"{where}: fill must be a number, got {values['fill']!r}")


def _check_column(where: str, spec: ColumnSpec) -> None:
    if spec.ids not in ("vocabulary", "hash"):
        raise ValueError(f"{where}: ids must be 'vocabulary' or 'hash', got {spec.ids!r}")
    if spec.ids == "hash" and spec.num_embeddings is None:
        raise ValueError(f"{where}: ids = 'hash' needs num_embeddings (the rows to hash into)")
    if spec.pooling not in ("sum", "mean"):
        raise ValueError(f"{where}: pooling must be 'sum' or 'mean', got {spec.pooling!r}")
    if not spec.separator:
        raise ValueError(f"{where}: separator must not be empty")
    steps = spec.transform
    unknown = [s for s in steps if s not in _TRANSFORMS]
    fitted = [s for s in steps if s != "log1p"]
    if (
        unknown
        or len(fitted) > 1
        or steps.count("log1p") > 1
        or (fitted and steps[-1] != fitted[0])
    ):
        raise ValueError(
            f"{where}: transform {list(steps)} is not 'log1p', then at most one of "
            "'standardize' or 'bucketize' (e.g. [\"log1p\", \"standardize\"])"
        )
    if spec.boundaries is not None and list(spec.boundaries) != sorted(set(spec.boundaries)):
        raise ValueError(f"{where}: boundaries must increase, got {list(spec.boundaries)}")
    if spec.fill is not None and not math.isfinite(spec.fill):
        raise ValueError(f"{where}: fill must be a finite number, got {spec.fill!r}")


def _split(source: str, data: Any, base: Path) -> SplitSpec:
    where = f"{source}: split"
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping, got {data!r}")
    unknown = sorted(set(data) - _SPLIT_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown}; known: {sorted(_SPLIT_KEYS)}")
    fraction = data.get("validation_fraction", DEFAULT_VALIDATION_FRACTION)
    if not isinstance(fraction, (int, float)) or not 0.0 < fraction < 1.0:
        raise ValueError(f"{where}: validation_fraction must be in (0, 1), got {fraction!r}")
    path = data.get("validation_path")
    if path is not None and (len(data) > 1 or not isinstance(path, str)):
        raise ValueError(f"{where}: validation_path (a file or folder) goes alone; got "
                         f"{sorted(data)}")  # fmt: skip
    cut = data.get("time_cut")
    if cut is not None and not isinstance(cut, (int, float, str)):
        raise ValueError(f"{where}: time_cut must be a number or an ISO-8601 date, got {cut!r}")
    time_column, per = data.get("time_column"), data.get("per")
    if (cut is not None or per is not None) and time_column is None:
        raise ValueError(f"{where}: time_cut and per need time_column (the column of times)")
    if cut is not None and (per is not None or "validation_fraction" in data):
        raise ValueError(f"{where}: time_cut is a global cut; it goes without "
                         "validation_fraction and per")  # fmt: skip
    return SplitSpec(
        validation_path=(base / path) if path is not None else None,
        validation_fraction=float(fraction),
        time_column=time_column,
        time_cut=parse_time(cut, where="time_cut") if cut is not None else None,
        per=per,
    )
