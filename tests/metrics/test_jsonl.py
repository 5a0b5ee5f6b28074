"""`JsonlWriter`: one strict-JSON object per line, rank 0 only, appended across runs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from shardkit.metrics import JsonlWriter, read_jsonl


def test_records_round_trip(tmp_path):
    path = tmp_path / "runs" / "metrics.jsonl"
    with JsonlWriter(path) as log:
        log.write({"epoch": 0, "split": "validation", "auc": 0.91, "loss": torch.tensor(0.25)})
        log.write({"epoch": 1, "auc": math.nan, "extra": {"ne": math.inf, "steps": [1, 2]}})
    assert read_jsonl(path) == [
        {"epoch": 0, "split": "validation", "auc": 0.91, "loss": 0.25},
        {"epoch": 1, "auc": None, "extra": {"ne": None, "steps": [1, 2]}},
    ]
    for line in path.read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    with JsonlWriter(path) as log:  # a resumed job appends
        log.write({"epoch": 2})
    assert [r["epoch"] for r in read_jsonl(path)] == [0, 1, 2]


def test_only_rank_zero_writes(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonlWriter(path, rank=1) as log:
        log.write({"epoch": 0})
    assert not path.exists()


def test_each_line_is_flushed_at_once(tmp_path):
    path = tmp_path / "m.jsonl"
    log = JsonlWriter(path)
    log.write({"step": 1})
    assert read_jsonl(path) == [{"step": 1}]  # readable while the job runs
    log.close()
    log.close()  # idempotent


@pytest.mark.parametrize(
    ("record", "error", "match"),
    [
        ([1, 2], TypeError, r"record must be a mapping \(dict\), got list"),
        ({"w": torch.ones(2)}, TypeError, r"record\['w'\] is a tensor of shape \(2,\); write numbers"),
        ({"x": {"y": object()}}, TypeError, r"record\['x'\]\['y'\] is a object, which JSON cannot hold"),
    ],
)  # fmt: skip
def test_errors(tmp_path, record, error, match):
    with JsonlWriter(tmp_path / "m.jsonl") as log, pytest.raises(error, match=match):
        log.write(record)


def test_read_names_the_bad_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(ValueError, match=r"m.jsonl:3: not a JSON object"):
        read_jsonl(path)
