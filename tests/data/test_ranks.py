"""On real ranks: the iterators take rank and world size from the process group, and validation
with `LastBatch.PAD` or `UNEVEN` plus `BinaryMetrics` gives the single-process values."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shardkit.data import (
    CriteoConfig,
    CriteoFormat,
    CriteoReader,
    GlobalBatchIterator,
    LastBatch,
    read_criteo,
)
from shardkit.metrics import BinaryMetrics
from tests.data.helpers import numbered

PADDLE = Path(__file__).parents[1] / "fixtures" / "criteo" / "paddlerec_dnn_criteo_sample_train.txt"
CONFIG = CriteoConfig(num_embeddings=1000, format=CriteoFormat.PADDLEREC)


def _score(dense: torch.Tensor) -> torch.Tensor:
    """A fixed 'model': any deterministic function of the features."""
    return dense.sum(1) * 0.37 - 1.0


def _single(dense: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    metrics = BinaryMetrics()
    metrics.update(_score(dense), labels)
    return metrics.compute()


def _validate(batches) -> dict[str, float]:
    metrics = BinaryMetrics()
    for batch in batches:
        metrics.update(_score(batch.dense_features), batch.labels, batch.weights)
    return metrics.compute()


def _rank_numbered(rank: int, world_size: int, last_batch_name: str):
    it = GlobalBatchIterator(numbered(23), batch_size=4, shuffle=False,
                             last_batch=LastBatch[last_batch_name])  # fmt: skip
    assert (it.rank, it.world_size) == (rank, world_size)
    return _validate(it)


def _rank_criteo(rank: int, world_size: int):
    reader = CriteoReader(PADDLE, config=CONFIG, batch_size=7, last_batch=LastBatch.PAD,
                          chunk_batches=2)  # fmt: skip
    assert (reader.rank, reader.world_size) == (rank, world_size)
    return _validate(reader)


@pytest.mark.parametrize("last_batch", ["PAD", "UNEVEN"])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_validation_over_ranks_equals_one_process(run_ranks, world_size, last_batch):
    data = numbered(23)
    expected = _single(data.dense, data.labels)
    assert (
        run_ranks(_rank_numbered, world_size, last_batch) == [pytest.approx(expected)] * world_size
    )


@pytest.mark.parametrize("world_size", [2, 3])
def test_criteo_validation_over_ranks_equals_one_process(run_ranks, world_size):
    data = read_criteo(PADDLE, config=CONFIG)
    expected = _single(data.dense, data.labels)
    assert expected["num_examples"] == 80
    assert run_ranks(_rank_criteo, world_size) == [pytest.approx(expected)] * world_size
