"""`TableReader`: each rank reads its own part of the files, every row exactly once across
ranks, the same steps on every rank, a shuffle that holds at most its buffer, CSV / gzip /
Parquet giving the same batches, and resuming mid-epoch."""

from __future__ import annotations

import itertools

import pytest
import torch

import shardkit.data._table_reader as table_reader
from shardkit.data import TableReader, scan_table
from shardkit.data._table_schema_load import schema_from_dict
from tests.data.ratings import SCHEMA, T0, write_ratings, write_ratings_parquet

# the row's timestamp (T0 + 64 * row), untransformed, identifies it in a batch
IDENTIFIED = {**SCHEMA, "columns": {**SCHEMA["columns"], "timestamp": "dense"}}
N = 700


def _rows(batch):
    """(row number, weight) of each example of a batch."""
    stamps = batch.dense_features[:, 1].double()
    rows = ((stamps - T0) / 64).round().long().tolist()
    weights = batch.weights.tolist() if batch.weights is not None else [1.0] * len(rows)
    return list(zip(rows, weights))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = write_ratings(tmp_path_factory.mktemp("t") / "r.csv", N)
    return scan_table([path], schema_from_dict(IDENTIFIED), seed=0)


def _split_rows(data, want):
    return {i for i in range(N) if data.split.kind_of(0, i, i, None) == want}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_validation_rows_come_once_each_over_the_ranks(data, world_size):
    readers = [TableReader(data, split="validation", batch_size=16, rank=r, world_size=world_size)
               for r in range(world_size)]  # fmt: skip
    steps = {len(r) for r in readers}
    assert len(steps) == 1, "every rank takes the same number of steps"
    seen = []
    for reader in readers:
        batches = list(reader)
        assert len(batches) == len(reader)
        assert all(b.batch_size == 16 for b in batches)
        seen += [row for b in batches for row, w in _rows(b) if w == 1.0]
    assert sorted(seen) == sorted(_split_rows(data, 1))  # each validation row once


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_training_rows_come_at_most_once_and_the_rest_are_dropped(data, world_size):
    per_rank = [list(TableReader(data, split="train", batch_size=32, rank=r,
                                 world_size=world_size)) for r in range(world_size)]  # fmt: skip
    counts = {len(batches) for batches in per_rank}
    assert len(counts) == 1
    rows = [row for batches in per_rank for b in batches for row, _ in _rows(b)]
    assert len(rows) == len(set(rows)) == counts.pop() * 32 * world_size
    assert set(rows) <= _split_rows(data, 0)
    assert len(_split_rows(data, 0)) - len(rows) < world_size * (32 + 64)  # a batch and a block


def test_each_rank_reads_only_its_own_blocks(data, monkeypatch):
    read = []
    original = table_reader._BlockReader.read

    def spy(self, block):
        records = original(self, block)
        read.extend((block[1], block[4] + i) for i in range(len(records)))
        return records

    monkeypatch.setattr(table_reader._BlockReader, "read", spy)
    per_rank = []
    for rank in range(3):
        read.clear()
        list(TableReader(data, split="validation", batch_size=8, rank=rank, world_size=3))
        per_rank.append(set(read))
        assert len(read) == len(per_rank[-1])  # no record read twice
    assert not (per_rank[0] & per_rank[1]) and not (per_rank[1] & per_rank[2])
    blocks = data.blocks[data.blocks[:, 6] > 0]
    assert set().union(*per_rank) == {(0, int(r) + i) for r in blocks[:, 4] for i in range(64)
                                      if int(r) + i < N}  # fmt: skip


def test_the_shuffle_changes_each_epoch_and_holds_at_most_its_buffer(data, monkeypatch):
    held = []
    original = table_reader._buffered

    def counting(rows, size, seed):
        consumed = 0

        def source():
            nonlocal consumed
            for row in rows:
                consumed += 1
                yield row

        for emitted, row in enumerate(original(source(), size, seed), start=1):
            held.append(consumed - emitted)
            yield row

    monkeypatch.setattr(table_reader, "_buffered", counting)
    reader = TableReader(data, split="train", batch_size=32, rank=0, world_size=1,
                         shuffle_buffer=50)  # fmt: skip
    epochs = [[row for b in reader for row, _ in _rows(b)] for _ in range(2)]
    assert max(held) <= 50
    assert epochs[0] != epochs[1] and epochs[0] != sorted(epochs[0])
    again = TableReader(data, split="train", batch_size=32, rank=0, world_size=1, shuffle_buffer=50)
    assert [row for b in again for row, _ in _rows(b)] == epochs[0]  # seeded
    plain = TableReader(data, split="train", batch_size=32, rank=0, world_size=1, shuffle=False)
    rows = [row for b in plain for row, _ in _rows(b)]
    assert rows == sorted(rows)


def test_gzip_and_parquet_give_the_same_batches_as_csv(tmp_path):
    """Unshuffled (a shuffle visits blocks in an order that suits each format)."""
    schema = schema_from_dict(IDENTIFIED)
    paths = [write_ratings(tmp_path / "r.csv", N), write_ratings(tmp_path / "r.csv.gz", N, compress=True),
             write_ratings_parquet(tmp_path / "r.parquet", N, row_group_size=100)]  # fmt: skip
    batches = []
    for path in paths:
        data = scan_table([path], schema)
        batches.append([list(TableReader(data, split=s, batch_size=24, rank=1, world_size=2,
                                         shuffle=False)) for s in ("train", "validation")])  # fmt: skip
    for other in batches[1:]:
        for mine, theirs in zip(batches[0], other):
            assert len(mine) == len(theirs)
            for a, b in zip(mine, theirs):
                torch.testing.assert_close(a.dense_features, b.dense_features)
                assert a.sparse_features.values().tolist() == b.sparse_features.values().tolist()
                assert a.sparse_features.lengths().tolist() == b.sparse_features.lengths().tolist()
                torch.testing.assert_close(a.labels, b.labels)


def test_resuming_mid_epoch_yields_the_rest(data):
    reader = TableReader(data, split="train", batch_size=16, rank=1, world_size=2)
    whole = [_rows(b) for b in reader]
    first = TableReader(data, split="train", batch_size=16, rank=1, world_size=2)
    batches = iter(first)
    head = [_rows(next(batches)) for _ in range(5)]
    state = first.state_dict()
    resumed = TableReader(data, split="train", batch_size=16, rank=1, world_size=2)
    resumed.load_state_dict(state)
    assert head + [_rows(b) for b in resumed] == whole
    assert resumed.epoch == 1
    with pytest.raises(
        ValueError,
        match=r"stopped inside an epoch with \{'world_size': 2, 'batch_size': 16, 'seed': 0\}; resume it with the same, not \{'world_size': 3",
    ):
        TableReader(data, split="train", batch_size=16, rank=0, world_size=3).load_state_dict(state)
    ended = TableReader(data, split="train", batch_size=16, rank=0, world_size=3)
    ended.load_state_dict(reader.state_dict())  # at an epoch's end: any world size
    assert ended.epoch == 1


def test_too_little_data_for_one_batch(data):
    with pytest.raises(
        ValueError,
        match=r"the train split has \d+ rows, \d+ on the rank with the fewest of 4: not one batch of 200",
    ):
        TableReader(data, split="train", batch_size=200, rank=0, world_size=4)


def test_the_shuffle_buffer_mixes_within_its_window():
    """Every row comes out once; a row leaves at most `size` rows late... and the order is not
    the input's with a delay (a buffer that always emitted the same slot would be)."""
    out = list(table_reader._buffered(iter(range(2000)), 100, 7))
    assert sorted(out) == list(range(2000))
    early = out[:1800]  # before the final drain
    assert all(row < position + 101 for position, row in enumerate(early))
    ascents = sum(a < b for a, b in itertools.pairwise(early)) / len(early)
    assert 0.35 < ascents < 0.65, ascents  # about half, as in a random order
    assert out == list(table_reader._buffered(iter(range(2000)), 100, 7))  # seeded
    assert out != list(table_reader._buffered(iter(range(2000)), 100, 8))
