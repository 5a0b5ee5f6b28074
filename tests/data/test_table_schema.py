"""Table schemas: the same schema read from TOML, JSON and YAML; every rule refused with the
schema file, the column and the fix."""

from __future__ import annotations

import json
import sys

import pytest

from shardkit.data import ColumnType, load_schema
from shardkit.data._table_schema_load import schema_from_dict
from tests.data.ratings import SCHEMA
from tests.data.ratings import SCHEMA_TOML as TOML

YAML = """
label: rating >= 4
columns:
  user_id: {type: categorical, min_count: 2}
  movie_id: {type: categorical}
  genres: {type: multi_hot, separator: "|", pooling: mean}
  occupation: categorical
  gender: categorical
  zip: {type: categorical, ids: hash, num_embeddings: 50}
  age: {type: dense, transform: standardize}
  timestamp: {type: dense, transform: [log1p, standardize]}
split:
  validation_fraction: 0.2
"""


def test_toml_json_and_yaml_read_the_same(tmp_path):
    (tmp_path / "s.toml").write_text(TOML)
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "s.yaml").write_text(YAML)
    schemas = [load_schema(tmp_path / name) for name in ("s.toml", "s.json", "s.yaml")]
    assert schemas[0].to_dict() == schemas[1].to_dict() == schemas[2].to_dict()
    schema = schemas[0]
    assert str(schema.label) == "rating >= 4.0"
    assert [c.name for c in schema.columns] == list(SCHEMA["columns"])
    genres = schema.columns[2]
    assert (genres.type, genres.separator, genres.pooling) == (ColumnType.MULTI_HOT, "|", "mean")
    assert schema.columns[5].ids == "hash" and schema.columns[5].num_embeddings == 50
    assert schema.columns[7].transform == ("log1p", "standardize")
    assert schema.needed == ("rating", *SCHEMA["columns"])
    again = schema_from_dict(schema.to_dict(), source="again")
    assert again.to_dict() == schema.to_dict()


def test_label_rules():
    def label(rule, value):
        return schema_from_dict({**SCHEMA, "label": rule}).label.apply(value)

    assert [label("rating >= 4", v) for v in ("3", "4", " 5 ", 4.5)] == [0.0, 1.0, 1.0, 1.0]
    assert [label("rating < 2", v) for v in ("1", "2")] == [1.0, 0.0]
    assert [label("income == >50K", v) for v in (">50K", "<=50K")] == [1.0, 0.0]
    assert [label("clicked", v) for v in ("0", "1", "true", "False", 1, True)] == [
        0.0, 1.0, 1.0, 0.0, 1.0, 1.0
    ]  # fmt: skip
    with pytest.raises(
        ValueError, match=r"label '3' is not binary .* such as label = 'clicked >= 4'"
    ):
        label("clicked", "3")
    with pytest.raises(
        ValueError, match=r"'x' is not a number, which the label rule 'rating >= 4.0'"
    ):
        label("rating >= 4", "x")


def _bad(**changes):
    return {**SCHEMA, **changes}


def _columns(**changes):
    return _bad(columns={**SCHEMA["columns"], **changes})


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (_columns(age={"type": "numeric"}), r"s.json: column 'age': unknown column type 'numeric'; known: \['categorical', 'multi_hot', 'dense'\]"),
        (_columns(age={"type": "dense", "scale": 2}), r"column 'age': unknown keys \['scale'\]"),
        (_columns(age={"type": "dense", "separator": ","}), r"column 'age': \['separator'\] do not apply to a dense column"),
        (_columns(age={"type": "dense", "transform": ["standardize", "log1p"]}), r"transform \['standardize', 'log1p'\] is not 'log1p', then at most one of"),
        (_columns(age={"type": "dense", "transform": "normalize"}), r"transform \['normalize'\] is not"),
        (_columns(age={"type": "dense", "boundaries": [3, 1]}), r"boundaries must increase, got \[3.0, 1.0\]"),
        (_columns(zip={"type": "categorical", "ids": "hash"}), r"column 'zip': ids = 'hash' needs num_embeddings"),
        (_columns(zip={"type": "categorical", "min_count": 0}), r"column 'zip': min_count must be an integer >= 1, got 0"),
        (_columns(zip={"type": "categorical", "pooling": "max"}), r"pooling must be 'sum' or 'mean', got 'max'"),
        (_columns(zip={"type": "categorical", "table": "movie_id", "num_embeddings": 9}, movie_id={"type": "categorical", "num_embeddings": 8}),
         r"columns 'movie_id' and 'zip' share table 'movie_id' but give it num_embeddings 8 and 9"),
        (_columns(rating={"type": "dense"}), r"the label column 'rating' is also in 'columns'"),
        (_bad(columns={"age": "dense"}), r"no categorical or multi_hot column"),
        (_bad(label="rating >= high"), r"label rule 'rating >= high': >= needs a number, got 'high'"),
        (_bad(extra=1), r"unknown keys \['extra'\]"),
        (_bad(delimiter="::"), r"'delimiter' must be one character"),
        (_bad(split={"validation_fraction": 1.5}), r"validation_fraction must be in \(0, 1\), got 1.5"),
        (_bad(split={"time_cut": 5}), r"time_cut and per need time_column"),
        (_bad(split={"validation_path": "v.csv", "validation_fraction": 0.1}), r"validation_path \(a file or folder\) goes alone"),
        (_bad(split={"time_column": "timestamp", "time_cut": "yesterday"}), r"time_cut: 'yesterday' is not a time"),
    ],
)  # fmt: skip
def test_schema_errors_name_the_file_and_column(tmp_path, data, match):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match):
        load_schema(path)


def test_unreadable_files(tmp_path, monkeypatch):
    (tmp_path / "s.toml").write_text("label = ")
    with pytest.raises(ValueError, match=r"s.toml: not valid TOML"):
        load_schema(tmp_path / "s.toml")
    (tmp_path / "s.txt").write_text("{}")
    with pytest.raises(
        ValueError, match=r"s.txt: a schema file ends in .toml, .json, .yaml or .yml"
    ):
        load_schema(tmp_path / "s.txt")
    with pytest.raises(FileNotFoundError, match=r"schema file .*nope.toml does not exist"):
        load_schema(tmp_path / "nope.toml")
    (tmp_path / "s.yaml").write_text(YAML)
    monkeypatch.setitem(sys.modules, "yaml", None)  # PyYAML not installed
    with pytest.raises(ValueError, match=r"needs PyYAML: pip install 'shardkit\[yaml\]'"):
        load_schema(tmp_path / "s.yaml")
    (tmp_path / "s.toml").write_text(TOML)
    monkeypatch.setitem(sys.modules, "tomllib", None)  # Python 3.10 ...
    monkeypatch.setitem(sys.modules, "tomli", None)  # ... without tomli
    with pytest.raises(ValueError, match=r"on Python 3.10 needs tomli: pip install tomli"):
        load_schema(tmp_path / "s.toml")


def test_times_parse_as_seconds_or_iso_dates():
    from shardkit.data._table_schema import parse_time

    assert parse_time("86400", where="t") == 86400.0
    assert parse_time("1970-01-02", where="t") == 86400.0
    assert parse_time("1970-01-02T01:00:00+01:00", where="t") == 86400.0
    with pytest.raises(ValueError, match=r"t: '2024-13-01' is not a time"):
        parse_time("2024-13-01", where="t")
