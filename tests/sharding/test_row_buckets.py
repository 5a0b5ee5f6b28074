"""The row bucketing of the input dist: the counting partition equals the sort and the spec."""

from __future__ import annotations

import pytest
import torch

from shardkit import kernels
from shardkit.sharding._dist import _row_buckets
from shardkit.sharding._dist._row_buckets import bucket_rows


def _spec(lengths, values, row_starts):
    """Bag by bag, id by id: each shard's ids in input order, rebased; lengths per shard."""
    bags = torch.repeat_interleave(torch.arange(lengths.numel()), lengths).tolist()
    bounds = [*row_starts[1:], float("inf")]
    shard_of = [next(k for k, end in enumerate(bounds) if v < end) for v in values.tolist()]
    shard_lengths = torch.zeros(len(row_starts), lengths.numel(), dtype=torch.int64)
    order = []
    for k in range(len(row_starts)):
        for i, (bag, shard) in enumerate(zip(bags, shard_of)):
            if shard == k:
                shard_lengths[k, bag] += 1
                order.append(i)
    order = torch.tensor(order, dtype=torch.int64)
    rebased = (
        values[order] - torch.tensor(row_starts)[torch.tensor(shard_of, dtype=torch.long)[order]]
    )
    return shard_lengths, rebased, order


@pytest.mark.parametrize("path", ["partition", "sort", "compiled"])
@pytest.mark.parametrize(
    "row_starts,num_ids",
    [([0], 7), ([0, 4], 9), ([0, 4, 7], 13), ([0, 2, 3, 5, 8], 11), ([0, 5], 0),
     ([0, 3, 3, 6], 12), (list(range(0, 18, 2)), 23),  # an empty shard; 9 shards
     (list(range(0, 36, 3)), 40)],  # 12 shards: the compiled op's binary search
)  # fmt: skip
def test_bucket_rows_matches_the_spec(monkeypatch, path, row_starts, num_ids):
    monkeypatch.setattr(_row_buckets, "PARTITION_MAX_SHARDS", 64 if path == "partition" else 0)
    g = torch.Generator().manual_seed(len(row_starts) + num_ids)
    lengths = torch.zeros(4, dtype=torch.int64)
    if num_ids:
        lengths = torch.tensor([num_ids - 3, 0, 2, 1])  # an empty bag too
    edges = torch.tensor([*row_starts, *(s - 1 for s in row_starts[1:])])  # ids at shard edges
    values = torch.randint(0, row_starts[-1] + 3, (num_ids,), generator=g)
    values[: min(num_ids, edges.numel())] = edges[:num_ids]
    if num_ids:
        values[-1] = -1  # unchecked ids (validate_ids=False) go to shard 0 on every path
    values = values[torch.randperm(num_ids, generator=g)]  # edges in every bag
    for weights, lengths_dtype in ((torch.rand(num_ids, generator=g), torch.int64),
                                   (None, torch.int32)):  # fmt: skip
        shard_lengths, rebased, sorted_weights, order = bucket_rows(
            values, lengths=lengths.to(lengths_dtype), weights=weights, row_starts=row_starts,
            kernel="compiled" if path == "compiled" else "eager",
        )  # fmt: skip
        want_lengths, want_rebased, want_order = _spec(lengths, values, row_starts)
        torch.testing.assert_close(shard_lengths, want_lengths)
        torch.testing.assert_close(rebased, want_rebased)
        torch.testing.assert_close(order, want_order)
        if weights is None:
            assert sorted_weights is None
        else:
            torch.testing.assert_close(sorted_weights, weights[want_order])


def test_compiled_bucket_rows_refuses_what_it_cannot_bucket():
    values = torch.tensor([0, 4, 6])
    with pytest.raises(RuntimeError, match=r"row_starts must ascend \(one first row per shard\), got \[0, 5, 3\]"):  # fmt: skip
        kernels.bucket_rows(values, torch.tensor([3]), [0, 5, 3])
    with pytest.raises(RuntimeError, match=r"row_starts must start at 0, got \[1, 5\]"):
        kernels.bucket_rows(values, torch.tensor([3]), [1, 5])
    with pytest.raises(RuntimeError, match=r"the lengths sum to 4, not 3 ids"):
        kernels.bucket_rows(values, torch.tensor([2, 2]), [0, 5])
    with pytest.raises(RuntimeError, match=r"bag 1 has length -1 < 0"):
        kernels.bucket_rows(values, torch.tensor([4, -1]), [0, 5])


@pytest.mark.parametrize(
    ("row_starts", "partition", "match"),
    [
        ([2, 5], None, r"ascending from 0, got \[2, 5\]"),
        ([0, 5, 3], None, r"ascending from 0, got \[0, 5, 3\]"),
        ([], None, r"ascending from 0, got \[\]"),
        ([0, 5], -1, r"max_partition_shards must be >= 0 \(0: always the sort\), got -1"),
    ],
)
def test_bucket_rows_refuses_starts_the_paths_would_read_differently(row_starts, partition, match):
    values, lengths = torch.tensor([0, 4, 6]), torch.tensor([2, 1])
    with pytest.raises(ValueError, match=match):
        bucket_rows(values, lengths=lengths, weights=None, row_starts=row_starts,
                    max_partition_shards=partition)  # fmt: skip
