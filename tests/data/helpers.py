"""Shared by the data tests: small data sets whose examples can be recognised in a batch."""

from __future__ import annotations

import torch

from shardkit.data import Batch, TabularDataset
from shardkit.sparse import KeyedJaggedTensor

KEYS = ("a", "b", "c")


def numbered(num_examples: int) -> TabularDataset:
    """Example ``i`` has dense ``[i, -i]``, ids ``[i % 7, i % 5 or -1, i]`` and label ``i % 2``."""
    index = torch.arange(num_examples)
    ids = torch.stack([index % 7, index % 5, index], dim=1)
    ids[:, 1][index % 5 == 0] = -1  # some empty bags
    dense = torch.stack([index, -index], dim=1).float()
    return TabularDataset(keys=KEYS, dense=dense, ids=ids, labels=(index % 2).float())


def example_ids(batch: Batch) -> list[int]:
    """The example numbers in a batch of `numbered` (padding included)."""
    return batch.dense_features[:, 0].long().tolist()


def concat(batches: list[Batch]) -> Batch:
    """Batches of the same keys, one after another (what the ranks of one step hold together)."""
    keys = batches[0].sparse_features.keys()
    per_key_values, per_key_lengths = [], []
    for index in range(len(keys)):
        for batch in batches:
            jt = batch.sparse_features[keys[index]]
            per_key_values.append(jt.values())
            per_key_lengths.append(jt.lengths())
    weights = [b.weights for b in batches]
    return Batch(
        dense_features=torch.cat([b.dense_features for b in batches]),
        sparse_features=KeyedJaggedTensor(
            keys=keys,
            values=torch.cat(per_key_values),
            lengths=torch.cat(per_key_lengths),
            stride=sum(b.batch_size for b in batches),
        ),
        labels=torch.cat([b.labels for b in batches]),
        weights=None if weights[0] is None else torch.cat(weights),
    )


def assert_batches_equal(actual: Batch, expected: Batch) -> None:
    torch.testing.assert_close(actual.dense_features, expected.dense_features, rtol=0, atol=0)
    torch.testing.assert_close(actual.labels, expected.labels, rtol=0, atol=0)
    assert actual.sparse_features.keys() == expected.sparse_features.keys()
    assert actual.sparse_features.values().tolist() == expected.sparse_features.values().tolist()
    assert actual.sparse_features.lengths().tolist() == expected.sparse_features.lengths().tolist()
    if expected.weights is None:
        assert actual.weights is None
    else:
        assert actual.weights is not None
        assert actual.weights.tolist() == expected.weights.tolist()
