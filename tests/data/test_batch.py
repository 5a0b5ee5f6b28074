"""`Batch` and `batch_from_ids`: the worked examples of their docstrings, moves, errors."""

from __future__ import annotations

import pytest
import torch

from shardkit.data import Batch, TabularDataset, batch_from_ids
from shardkit.sparse import KeyedJaggedTensor


def _batch() -> Batch:
    return batch_from_ids(
        torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]),
        ids=torch.tensor([[4, 1], [7, -1]]),
        labels=torch.tensor([1.0, 0.0]),
        keys=["color", "size"],
    )


def test_docstring_example():
    batch = _batch()
    assert batch.batch_size == 2
    assert batch.sparse_features.keys() == ["color", "size"]
    assert batch.sparse_features.values().tolist() == [4, 7, 1]
    assert batch.sparse_features.lengths().tolist() == [1, 1, 1, 0]
    assert batch.sparse_features.stride() == 2
    assert batch.weights is None


def test_batch_from_ids_without_missing_ids_is_a_reshape():
    batch = batch_from_ids(
        torch.zeros(2, 1), ids=torch.tensor([[3, 9], [5, 8]]), labels=torch.zeros(2), keys="ab"
    )
    assert batch.sparse_features.values().tolist() == [3, 5, 9, 8]
    assert batch.sparse_features.lengths().tolist() == [1, 1, 1, 1]


def test_empty_batch_keeps_its_keys():
    batch = batch_from_ids(
        torch.zeros(0, 2), ids=torch.zeros(0, 2, dtype=torch.long), labels=torch.zeros(0),
        keys=["a", "b"],
    )  # fmt: skip
    assert batch.batch_size == 0
    assert batch.sparse_features.stride() == 0
    assert batch.sparse_features.keys() == ["a", "b"]


def test_is_frozen():
    batch = _batch()
    with pytest.raises(AttributeError):
        batch.labels = torch.zeros(2)  # type: ignore[misc]


def test_to_keeps_everything():
    batch = _batch()
    moved = batch.to("cpu", non_blocking=True)
    assert moved is not batch
    assert moved.sparse_features.values().tolist() == [4, 7, 1]
    torch.testing.assert_close(moved.dense_features, batch.dense_features)
    weighted = Batch(
        dense_features=batch.dense_features, sparse_features=batch.sparse_features,
        labels=batch.labels, weights=torch.tensor([1.0, 0.0]),
    )  # fmt: skip
    assert weighted.to(torch.device("cpu")).weights.tolist() == [1.0, 0.0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pin_memory_and_record_stream():
    batch = _batch().pin_memory()
    assert batch.dense_features.is_pinned() and batch.labels.is_pinned()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        on_gpu = batch.to("cuda", non_blocking=True)
    on_gpu.record_stream(torch.cuda.current_stream())
    assert on_gpu.sparse_features.values().is_cuda


def _kjt(batch_size: int) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(
        keys=["a"],
        values=torch.arange(batch_size),
        lengths=torch.ones(batch_size, dtype=torch.int32),
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"dense_features": [[1.0]]}, TypeError, r"dense_features must be a torch.Tensor, got list"),
        ({"dense_features": torch.zeros(2)}, ValueError, r"dense_features must be a 2-D floating tensor, got shape \(2,\)"),
        ({"labels": torch.zeros(2, dtype=torch.long)}, ValueError, r"labels must be a 1-D floating tensor.*torch.int64; convert with .float\(\)"),
        ({"sparse_features": {"a": 1}}, TypeError, r"sparse_features must be a KeyedJaggedTensor, got dict"),
        ({"labels": torch.zeros(3)}, ValueError, r"batch size of dense_features \(2\), got \{'labels': 3\}"),
        ({"sparse_features": _kjt(3)}, ValueError, r"got \{'sparse_features.stride\(\)': 3\}"),
        ({"weights": torch.ones(2, 1)}, ValueError, r"weights must be a 1-D floating tensor, got shape \(2, 1\)"),
        ({"weights": torch.ones(4)}, ValueError, r"got \{'weights': 4\}"),
    ],
)  # fmt: skip
def test_errors(kwargs, error, match):
    parts = {
        "dense_features": torch.zeros(2, 3),
        "sparse_features": _kjt(2),
        "labels": torch.zeros(2),
    }
    parts.update(kwargs)
    with pytest.raises(error, match=match):
        Batch(**parts)


def test_batch_from_ids_checks_its_columns():
    with pytest.raises(
        ValueError, match=r"ids must be \[B, F\] with F = len\(keys\) = 3, got shape \(2, 2\)"
    ):
        batch_from_ids(
            torch.zeros(2, 1),
            ids=torch.zeros(2, 2, dtype=torch.long),
            labels=torch.zeros(2),
            keys="abc",
        )


def test_tabular_dataset_checks_rows():
    with pytest.raises(
        ValueError, match=r"same number of rows, got \{'dense': 2, 'ids': 3, 'labels': 3\}"
    ):
        TabularDataset(
            keys=("a",),
            dense=torch.zeros(2, 1),
            ids=torch.zeros(3, 1, dtype=torch.long),
            labels=torch.zeros(3),
        )
    with pytest.raises(ValueError, match=r"ids must be \[N, len\(keys\)=2\], got \(3, 1\)"):
        TabularDataset(
            keys=("a", "b"),
            dense=torch.zeros(3, 1),
            ids=torch.zeros(3, 1, dtype=torch.long),
            labels=torch.zeros(3),
        )
