"""``shardkit train --data table`` as a user types it: a ratings log and a schema file, 2 ranks;
export with the fitted schema; refused input reported once, before ranks start, with nothing
written."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from shardkit.data import FittedSchema
from shardkit.train import table_model
from tests.data.ratings import SCHEMA_TOML as TOML
from tests.data.ratings import write_ratings, write_ratings_parquet
from tests.scripts import run_script

QUICK = ["--epochs", "1", "--max-steps-per-epoch", "6", "--batch-size", "32", "--no-progress"]


def _shardkit(*args, cwd):
    return run_script("-m", "shardkit", *map(str, args), cwd=cwd)


def _refused(*args, cwd):
    result = subprocess.run([sys.executable, "-m", "shardkit", *map(str, args)], cwd=cwd,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "(rank" not in result.stderr, result.stderr
    return result.stderr


def test_train_export_and_serve_a_csv_log(shardkit_here, tmp_path):
    data = write_ratings(tmp_path / "ratings.csv", 1500)
    schema = tmp_path / "ratings.toml"
    schema.write_text(TOML)
    run = tmp_path / "run"
    out = _shardkit("train", "--data", "table", "--data-path", data, "--schema", schema,
                    "--nproc", "2", "--checkpoint-dir", run, *QUICK, cwd=tmp_path)  # fmt: skip
    assert "table: 1,193 training and 307 validation rows from 1 file(s)" in out
    assert "rows/s, parsing and checking" in out
    assert "validation AUC" in out and "samples/s over the epoch (" in out
    assert "after warm-up); waiting for data " in out and "of the epoch's time (reading" in out
    assert f"draw them with: shardkit plot {run}" in out
    model_file = tmp_path / "model.pt"
    # in this process: the train above went through the entry point
    code, out, _ = shardkit_here("export", run, model_file)
    assert code == 0
    assert f"fitted schema (vocabularies, transforms) to {tmp_path / 'model.schema.json'}" in out
    code, out, _ = shardkit_here("export", run, tmp_path / "int8.pt", "--quantize", "int8")
    assert code == 0
    assert f"to {tmp_path / 'int8.schema.json'}" in out  # a quantized export maps values alike
    fitted = FittedSchema.load(tmp_path / "model.schema.json")
    assert FittedSchema.load(tmp_path / "int8.schema.json").to_dict() == fitted.to_dict()
    model = table_model(fitted)
    model.load_state_dict(torch.load(model_file, weights_only=True))  # strict: the same model
    batch = fitted.batch([{"user_id": "3", "movie_id": "7", "genres": "Drama|War", "zip": "12345",
                           "occupation": "4", "gender": "F", "age": "31", "timestamp": "978300000"}])  # fmt: skip
    with torch.no_grad():
        _, (_, logits, _) = model(batch)
    assert logits.shape == (1,) and bool(torch.isfinite(logits).all())


@pytest.mark.slow
def test_parquet_with_a_validation_file_and_skipped_rows(tmp_path):
    train = write_ratings_parquet(tmp_path / "train.parquet", 1200, row_group_size=200)
    validation = write_ratings(tmp_path / "val.csv", 300, seed=1)
    with validation.open("a") as f:
        f.write("1,2,5,978300000,Drama,old,M,3,12345\n")
    schema = tmp_path / "ratings.toml"
    schema.write_text(TOML)
    out = _shardkit("train", "--data", "table", "--data-path", train, "--data-val-path", validation,
                    "--schema", schema, "--skip-bad-rows", "--checkpoint-dir", tmp_path / "run",
                    *QUICK, cwd=tmp_path)  # fmt: skip
    assert "table: 1,200 training and 300 validation rows from 2 file(s)" in out
    assert "skipped 1 bad rows, e.g." in out and "val.csv:302: column 'age': 'old'" in out
    assert "validation AUC" in out


def _refused_here(shardkit_here, *args) -> str:
    """`_refused` in this process (`shardkit_here`), for a test's refusals after its first."""
    code, out, error = shardkit_here(*args)
    assert code == 2, out + error
    assert "Traceback" not in error and "(rank" not in error, error
    return error


def test_bad_input_is_refused_once_before_ranks_start(shardkit_here, tmp_path):
    data = write_ratings(tmp_path / "ratings.csv", 300)
    with data.open("a") as f:
        f.write("1,2,5,978300000,Drama\n")
    schema = tmp_path / "ratings.toml"
    schema.write_text(TOML)
    run = tmp_path / "run"
    table = ["train", "--data", "table", "--schema", schema, "--checkpoint-dir", run, *QUICK]
    error = _refused(*table, "--data-path", data, cwd=tmp_path)
    assert error.count("ratings.csv:302: 5 fields, the header has 9; fix or remove the row") == 1
    assert not run.exists(), "nothing is written on refused input"
    error = _refused_here(shardkit_here, *table, "--data-path", tmp_path / "missing.csv")
    assert "missing.csv does not exist" in error and not run.exists()
    schema.write_text(TOML.replace('"categorical", min_count', '"category", min_count'))
    error = _refused_here(shardkit_here, *table, "--data-path", data)
    assert "ratings.toml: column 'user_id': unknown column type 'category'" in error
    error = _refused_here(shardkit_here, "train", "--model", "deepfm", "--plan-only")
    assert "argument --model: invalid choice: 'deepfm'" in error
