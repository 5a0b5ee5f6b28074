"""TorchRec's `Batch`, the line pipes and splits of ``datasets.utils``, and `RandomRecDataset`
(against TorchRec's own batches in the optional tier)."""

from __future__ import annotations

import pytest
import torch

from shardkit import KeyedJaggedTensor
from shardkit.data import Batch as DataBatch
from shardkit.datasets.random import RandomRecDataset
from shardkit.datasets.utils import (
    Batch,
    Limit,
    LoadFiles,
    ParallelReadConcat,
    ReadLinesFromCSV,
    idx_split_train_val,
    rand_split_train_val,
    safe_cast,
)
from shardkit.streamable import Pipelineable
from tests.compat.peers import run_in_torchrec


def _kjt(batch: int) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(
        keys=["a"], values=torch.arange(batch), lengths=torch.ones(batch, dtype=torch.int64)
    )


def test_batch_takes_integer_labels_and_keeps_them_on_to():
    batch = Batch(dense_features=torch.randn(3, 2), sparse_features=_kjt(3),
                  labels=torch.tensor([0, 1, 1]))  # fmt: skip
    assert isinstance(batch, DataBatch) and isinstance(batch, Pipelineable)
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and moved.labels.dtype == torch.int64
    assert isinstance(_kjt(1), Pipelineable)
    with pytest.raises(ValueError, match=r"every part must have the batch size of dense_features"):
        Batch(torch.randn(3, 2), _kjt(3), torch.tensor([0, 1]))
    with pytest.raises(
        ValueError, match=r"labels must be a 1-D tensor, got Tensor of shape \(3, 1\)"
    ):
        Batch(torch.randn(3, 2), _kjt(3), torch.zeros(3, 1))


def test_splits_partition_the_rows():
    rows = list(range(100))
    train, val = idx_split_train_val(rows, 0.7)
    assert list(train) == [i for i in rows if i % 100 < 70] and list(val) == list(range(70, 100))
    train, val = rand_split_train_val(rows, 0.6, random_seed=3)
    train, val = list(train), list(val)
    assert sorted(train + val) == rows and 40 < len(train) < 80
    assert list(rand_split_train_val(rows, 0.6, random_seed=3)[0]) == train  # reproducible
    with pytest.raises(ValueError, match=r"train_perc must be in \(0.0, 1.0\), got 1.0"):
        idx_split_train_val(rows, 1.0)


def test_line_pipes(tmp_path):
    for name, text in (("a.csv", "x,y\n1,2\n3,\n"), ("b.csv", "x,y\n5,6\n")):
        (tmp_path / name).write_text(text)
    paths = [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    rows = list(ReadLinesFromCSV(LoadFiles(paths, mode="r"), skip_first_line=True))
    assert rows == [["1", "2"], ["3", ""], ["5", "6"]]
    assert [safe_cast(r[1], int, -1) for r in rows] == [2, -1, 6]
    assert list(Limit(rows, 2)) == rows[:2]
    assert list(ParallelReadConcat([1, 2], [3])) == [1, 2, 3]
    with pytest.raises(ValueError, match=r"'s3://bucket/x' is not a local file; .* iopath"):
        next(iter(LoadFiles(["s3://bucket/x"])))
    with pytest.raises(ValueError, match=r"mode 'w' is not one of b, t, rb, rt, r"):
        LoadFiles(paths, mode="w")


def test_random_batches_follow_the_arguments():
    ds = RandomRecDataset(["a", "b"], batch_size=4, hash_sizes=[5, 7], ids_per_features=[3, 1],
                          min_ids_per_features=[1, 1], num_dense=6, manual_seed=0,
                          num_batches=5, num_generated_batches=2)  # fmt: skip
    batches = list(ds)
    assert len(batches) == len(ds) == 5
    assert batches[2] is batches[0]  # two generated batches, cycled
    kjt = batches[1].sparse_features.to_dict()
    assert kjt["a"].lengths().min() >= 1 and kjt["a"].lengths().max() <= 3
    assert kjt["a"].values().max() < 5 and (kjt["b"].lengths() == 1).all()
    assert batches[1].dense_features.shape == (4, 6)
    with pytest.raises(ValueError, match=r"hash_sizes has 1 entries for 2 keys"):
        RandomRecDataset(["a", "b"], batch_size=2, hash_sizes=[3])
    with pytest.raises(TypeError, match=r"has no length: it never ends"):
        len(RandomRecDataset(["a"], batch_size=2))


_TORCHREC = """
from torchrec.datasets.random import RandomRecDataset
ds = RandomRecDataset(["a", "b", "c"], batch_size=5, hash_sizes=[10, 20, 30], ids_per_feature=3,
                      num_dense=4, manual_seed=7, num_batches=3, num_generated_batches=-1)
outputs["batches"] = [(b.dense_features, b.sparse_features.values(), b.sparse_features.lengths(),
                       b.labels) for b in ds]
"""


def test_same_seed_same_batches_as_torchrec(tmp_path):
    theirs = run_in_torchrec(_TORCHREC, {}, tmp_path)["batches"]
    ours = RandomRecDataset(["a", "b", "c"], batch_size=5, hash_sizes=[10, 20, 30],
                            ids_per_feature=3, num_dense=4, manual_seed=7, num_batches=3,
                            num_generated_batches=-1)  # fmt: skip
    for mine, (dense, values, lengths, labels) in zip(ours, theirs):
        torch.testing.assert_close(mine.dense_features, dense)
        torch.testing.assert_close(mine.sparse_features.values(), values)
        torch.testing.assert_close(mine.sparse_features.lengths(), lengths)
        torch.testing.assert_close(mine.labels, labels)
