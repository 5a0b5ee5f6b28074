"""Synthetic Criteo-like data: deterministic per example, Terabyte's tables, a power law that
matches its formula, bag lengths in range, and labels a model can learn."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from shardkit.data import (
    TERABYTE_NUM_EMBEDDINGS,
    GlobalBatchIterator,
    SyntheticConfig,
    SyntheticDataset,
)
from shardkit.metrics import auc_score
from tests.data.helpers import assert_batches_equal, concat


def test_terabyte_tables_by_default_and_the_cap():
    config = SyntheticConfig(num_examples=10)
    assert config.num_embeddings_per_feature == TERABYTE_NUM_EMBEDDINGS
    assert len(TERABYTE_NUM_EMBEDDINGS) == 26 and sum(TERABYTE_NUM_EMBEDDINGS) == 177944275
    assert config.keys == tuple(f"cat_{i}" for i in range(26))
    capped = SyntheticConfig(num_examples=10, num_embeddings=1000)
    assert capped.num_embeddings_per_feature[:6] == (1000, 1000, 1000, 1000, 1000, 3)
    batch = SyntheticDataset(SyntheticConfig(num_examples=500)).batch(torch.arange(500))
    for key, size in zip(config.keys, config.num_embeddings_per_feature):
        values = batch.sparse_features[key].values()
        assert int(values.min()) >= 0 and int(values.max()) < size
    assert batch.dense_features.shape == (500, 13) and batch.labels.shape == (500,)


def test_each_example_depends_only_on_seed_and_index():
    data = SyntheticDataset(SyntheticConfig(num_examples=100, min_ids_per_bag=0, max_ids_per_bag=3))
    together = data.batch(torch.tensor([3, 7, 99]))
    apart = concat([data.batch(torch.tensor([i])) for i in (3, 7, 99)])
    assert_batches_equal(together, apart)
    longer = SyntheticDataset(
        SyntheticConfig(num_examples=10**12, min_ids_per_bag=0, max_ids_per_bag=3)
    )
    assert_batches_equal(longer.batch(torch.tensor([3, 7, 99])), together)
    reseeded = SyntheticDataset(SyntheticConfig(num_examples=100, seed=1)).batch(torch.tensor([3]))
    assert not torch.equal(
        reseeded.sparse_features.values(), data.batch(torch.tensor([3])).sparse_features.values()
    )
    # pinned: the same numbers on every machine and torch release
    assert data.batch(torch.tensor([0])).sparse_features.values()[:3].tolist() == [
        31280,
        7754,
        4695,
    ]


def test_ranks_together_read_the_global_batch():
    data = SyntheticDataset(SyntheticConfig(num_examples=50, num_embeddings=100))
    ranks = [
        GlobalBatchIterator(data, batch_size=4, rank=r, world_size=3, shuffle=False)
        for r in range(3)
    ]
    single = GlobalBatchIterator(data, batch_size=12, rank=0, world_size=1, shuffle=False)
    for per_rank, expected in zip(zip(*[list(r) for r in ranks]), list(single)):
        assert_batches_equal(concat(list(per_rank)), expected)


def test_bag_lengths_in_range_and_empty_bags():
    data = SyntheticDataset(SyntheticConfig(num_examples=400, min_ids_per_bag=0, max_ids_per_bag=4))
    lengths = data.batch(torch.arange(400)).sparse_features.lengths()
    assert sorted(set(lengths.tolist())) == [0, 1, 2, 3, 4]
    fixed = SyntheticDataset(SyntheticConfig(num_examples=10, min_ids_per_bag=2, max_ids_per_bag=2))
    assert set(fixed.batch(torch.arange(10)).sparse_features.lengths().tolist()) == {2}


@pytest.mark.parametrize("exponent", [0.0, 0.8, 1.0, 1.2])
def test_id_frequencies_follow_the_power_law(exponent):
    n, samples = 20, 40_000
    config = SyntheticConfig(num_examples=samples, table_sizes=(n,), zipf_exponent=exponent,
                             num_signal_features=0)  # fmt: skip
    ids = SyntheticDataset(config).batch(torch.arange(samples)).sparse_features.values()
    observed = torch.bincount(ids, minlength=n).double().sort(descending=True).values / samples
    edges = torch.arange(1, n + 2, dtype=torch.float64)  # rank k covers [k + 1, k + 2)
    cdf = edges.log() if exponent == 1.0 else edges ** (1 - exponent)
    expected = (cdf[1:] - cdf[:-1]) / (cdf[-1] - cdf[0])
    torch.testing.assert_close(observed, expected, atol=0.006, rtol=0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hot_ids_are_spread_over_the_table(seed):
    """Hot rows land all over the table, as hashed ids do, so row-wise shards (contiguous row
    ranges) share the lookups: each quarter of the table gets a fair share of them, and the 8
    hottest rows are not in one or two quarters. Hot rows packed at the start or the end of the
    table, or in any one range of it, fail both."""
    n, samples = 1000, 20_000
    config = SyntheticConfig(num_examples=samples, table_sizes=(n,), num_signal_features=0,
                             seed=seed)  # fmt: skip
    ids = SyntheticDataset(config).batch(torch.arange(samples)).sparse_features.values()
    quarter = ids * 4 // n  # which row-wise shard of 4 would serve each lookup
    shares = torch.bincount(quarter, minlength=4).double() / samples
    assert bool(((shares > 0.1) & (shares < 0.45)).all()), shares.tolist()
    hottest = torch.bincount(ids, minlength=n).topk(8).indices
    assert len(set((hottest * 4 // n).tolist())) >= 3, hottest.tolist()


def _config(num_examples: int) -> SyntheticConfig:
    return SyntheticConfig(num_examples=num_examples, num_embeddings=50, min_ids_per_bag=0,
                           max_ids_per_bag=2, num_dense=4)  # fmt: skip


def test_held_out_examples_come_from_the_same_world():
    """``first_example`` numbers the examples after the training ones: the same world (row
    effects, hot rows), other examples."""
    train = _config(8_000)
    world = SyntheticDataset(dataclasses.replace(train, num_examples=10_000))
    held_out = SyntheticDataset(dataclasses.replace(train, num_examples=2_000, first_example=8_000))
    assert len(held_out) == 2_000
    assert_batches_equal(
        held_out.batch(torch.arange(2_000)), world.batch(torch.arange(8_000, 10_000))
    )
    with pytest.raises(ValueError, match=r"first_example must be >= 0, got -1"):
        dataclasses.replace(train, first_example=-1)


def test_labels_can_be_learnt():
    """Logistic regression on per-row weights, trained on 8,000 examples, tested on 2,000 more
    of the same world (``first_example``); on another seed's world it learns nothing."""
    config, train_size = _config(8_000), 8_000
    data = SyntheticDataset(config)
    assert 0.15 < float(data.batch(torch.arange(train_size)).labels.mean()) < 0.35
    offsets = torch.tensor([0, *config.num_embeddings_per_feature[:-1]]).cumsum(0)  # [F]
    rows = torch.nn.EmbeddingBag(sum(config.num_embeddings_per_feature), 1, mode="mean")
    torch.nn.init.zeros_(rows.weight)
    optimizer = torch.optim.Adam(rows.parameters(), lr=0.1)

    def logits(batch):
        kjt, size = batch.sparse_features, batch.batch_size
        lengths = kjt.lengths().long()
        shift = torch.repeat_interleave(offsets.repeat_interleave(size), lengths)
        bag_starts = torch.cumsum(lengths, 0) - lengths
        return rows(kjt.values() + shift, bag_starts).view(config.num_features, size).sum(0)

    for _ in range(2):
        for start in range(0, train_size, 500):
            batch = data.batch(torch.arange(start, start + 500))
            loss = F.binary_cross_entropy_with_logits(logits(batch), batch.labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    same_world = dataclasses.replace(config, num_examples=2_000, first_example=train_size)
    other_world = dataclasses.replace(config, num_examples=2_000, seed=1)
    with torch.no_grad():
        held_out = SyntheticDataset(same_world).batch(torch.arange(2_000))
        assert auc_score(logits(held_out), held_out.labels) > 0.7
        elsewhere = SyntheticDataset(other_world).batch(torch.arange(2_000))
        assert abs(auc_score(logits(elsewhere), elsewhere.labels) - 0.5) < 0.05


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_examples": 0}, r"num_examples must be >= 1, got 0"),
        ({"table_sizes": (5, 0)}, r"table_sizes must be a non-empty list of ints >= 1, got \(5, 0\)"),
        ({"num_embeddings": 0}, r"num_embeddings \(the cap\) must be >= 1 or None, got 0"),
        ({"zipf_exponent": -1.0}, r"zipf_exponent must be >= 0 \(0: uniform\), got -1.0"),
        ({"min_ids_per_bag": 3, "max_ids_per_bag": 2}, r"need 0 <= min_ids_per_bag <= max_ids_per_bag, got \(3, 2\)"),
        ({"num_dense": 0}, r"num_dense must be >= 1, got 0"),
        ({"num_signal_features": 27}, r"num_signal_features must be in \[0, 26\] \(the number of features\), got 27"),
        ({"seed": -2}, r"seed must be >= 0, got -2"),
    ],
)  # fmt: skip
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=rf"SyntheticConfig: {match}"):
        SyntheticConfig(**{"num_examples": 10, **kwargs})


def test_out_of_range_indices():
    data = SyntheticDataset(SyntheticConfig(num_examples=10))
    with pytest.raises(IndexError, match=r"indices must be in \[0, 10\), got \[0, 10\]"):
        data.batch(torch.tensor([0, 10]))
