"""The main job on a user's table: learns, checkpoints its fitted schema, resumes
bit-identically; under torchrun-like ranks (no launching process) rank 0 scans and a refusal
reaches every rank."""

from __future__ import annotations

import dataclasses

import pytest

from shardkit.checkpoint import export_checkpoint, read_extra
from shardkit.data import FittedSchema
from shardkit.launch import RankFailedError
from shardkit.metrics import read_jsonl
from shardkit.train import TrainConfig, train_rank
from tests.data.ratings import SCHEMA, write_ratings, write_schema


def _config(tmp_path, **changes) -> TrainConfig:
    tmp_path.mkdir(exist_ok=True)
    data = write_ratings(tmp_path / "ratings.csv", 1600)
    schema = write_schema(tmp_path / "schema.json")
    base = TrainConfig(data="table", data_path=data, schema=schema, batch_size=32, epochs=1,
                       checkpoint_dir=tmp_path / "ckpt", progress=False, log_every=1)  # fmt: skip
    return dataclasses.replace(base, **changes)


def test_a_table_is_learnt_and_resumes_bit_identically(run_ranks, tmp_path):
    straight = _config(tmp_path / "a", epochs=2)
    history = run_ranks(train_rank, 2, straight)[0]["history"]
    assert history[-1]["auc"] > 0.75, history
    # The epoch's training rate covers the whole epoch, its first steps (the shuffle buffer's
    # fill) included, as reading's does: at most the rate so far at its last step (logged,
    # log_every=1), and reading where training waited, part of the epoch, is not slower.
    so_far = {r["epoch"]: r["samples_per_s"] for r in read_jsonl(straight.metrics_file)
              if r["kind"] == "train"}  # fmt: skip
    for epoch in history:
        assert epoch["epoch_samples_per_s"] <= so_far[epoch["epoch"]], (epoch, so_far)
        assert epoch["data_samples_per_s"] >= epoch["epoch_samples_per_s"] > 0, epoch
        assert 0 < epoch["data_time_share"] <= 1, epoch
    first = _config(tmp_path / "b")
    run_ranks(train_rank, 2, first)
    # a resumed run maps values with the checkpoint's fitted schema, not the file's now
    zip_rows = {"type": "categorical", "ids": "hash", "num_embeddings": 60}  # the table had 50
    write_schema(first.schema, {**SCHEMA, "columns": {**SCHEMA["columns"], "zip": zip_rows}})
    run_ranks(train_rank, 2, dataclasses.replace(first, epochs=2, resume=True))

    def losses(config):
        return [
            (r["kind"], r["step"], r.get("loss"), r.get("auc"))
            for r in read_jsonl(config.metrics_file)
        ]

    assert losses(first) == losses(straight)  # every logged loss and AUC, to the last bit
    saved = read_extra(first.checkpoint_dir)["schema"]
    assert FittedSchema.from_dict(saved).keys == ("user_id", "movie_id", "genres", "occupation",
                                                 "gender", "zip")  # fmt: skip
    a = export_checkpoint(straight.checkpoint_dir, tmp_path / "a.pt")
    b = export_checkpoint(first.checkpoint_dir, tmp_path / "b.pt")
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].equal(b[key]), key


def test_without_a_launching_process_rank_0_scans_and_every_rank_refuses(run_ranks, tmp_path):
    config = _config(tmp_path)
    with config.data_path[0].open("a") as f:
        f.write("7,8,5,978300000,Drama,forty,M,3,12345\n")
    with pytest.raises(
        RankFailedError, match=r"ratings.csv:1602: column 'age': 'forty' is not a finite number"
    ):
        run_ranks(train_rank, 2, config)
    assert not config.checkpoint_dir.exists()
