"""`TableReader`: each rank reads its own part of the files, every row exactly once across
ranks, the same steps on every rank, a shuffle that holds at most its buffer, CSV / gzip /
Parquet giving the same batches, and resuming mid-epoch."""

from __future__ import annotations

import itertools

import pytest
import torch

import shardkit.data._table_pieces as table_pieces
import shardkit.data._table_reader as table_reader
from shardkit.data import TableReader, scan_table
from shardkit.data._table_encoded import EncodedRows, shuffle_buffer
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


def _whole(batch):
    """Everything a batch holds, as lists."""
    sparse = batch.sparse_features
    return (batch.labels.tolist(), batch.dense_features.tolist(), sparse.keys(),
            sparse.values().tolist(), sparse.lengths().tolist(), sparse.lengths().dtype,
            None if batch.weights is None else batch.weights.tolist())  # fmt: skip


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


def test_each_rank_reads_only_the_pieces_of_its_rows(tmp_path, monkeypatch):
    """Pieces of 2 KiB: a rank parses the pieces that hold its rows (a run of them) and no
    other; neighbours share at most the piece at their edge."""
    monkeypatch.setattr(table_pieces, "PIECE_BYTES", 2048)
    path = write_ratings(tmp_path / "r.csv", N)
    data = scan_table([path], schema_from_dict(IDENTIFIED))
    read = []
    original = table_reader.read_pieces

    def spy(*args):
        for piece, table, ragged in original(*args):
            read.append(piece.index)
            yield piece, table, ragged

    monkeypatch.setattr(table_reader, "read_pieces", spy)
    with_rows = [i for i, n in enumerate(data.pieces[:, 9].tolist()) if n]
    assert len(with_rows) > 6
    per_rank = []
    for rank in range(3):
        read.clear()
        list(TableReader(data, split="validation", batch_size=8, rank=rank, world_size=3,
                         prefetch=0))  # fmt: skip
        per_rank.append(list(read))
        assert read == sorted(set(read)) and read == list(range(read[0], read[-1] + 1))
    assert sorted(set().union(*per_rank)) == with_rows
    for mine, next_rank in itertools.pairwise(per_rank):
        assert len(set(mine) & set(next_rank)) <= 1


def test_the_shuffle_changes_each_epoch_and_holds_its_buffer_and_a_piece(data, monkeypatch):
    held, pieces = [], []  # rows read but not yet emitted; each piece's rows
    original = table_reader.shuffle_buffer

    def counting(chunks, size, seed):
        consumed = emitted = 0

        def source():
            nonlocal consumed
            for chunk in chunks:
                consumed += len(chunk)
                pieces.append(len(chunk))
                yield chunk

        for rows in original(source(), size, seed):
            emitted += len(rows)
            held.append(consumed - emitted)
            yield rows

    monkeypatch.setattr(table_reader, "shuffle_buffer", counting)
    reader = TableReader(data, split="train", batch_size=32, rank=0, world_size=1,
                         shuffle_buffer=50, prefetch=0)  # counted in this process  # fmt: skip
    epochs = [[row for b in reader for row, _ in _rows(b)] for _ in range(2)]
    assert held and max(held) <= 50 + max(pieces)  # the buffer and the piece being read
    assert max(held) >= 50  # the buffer holds rows back
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


def _numbered(start, stop):
    """Rows ``start .. stop - 1`` whose label is their number (and one id each)."""
    n = stop - start
    ids = torch.arange(start, stop)
    return EncodedRows(ids.float(), torch.zeros(n, 0), ids.view(n, 1), (), (), (0,))


def test_the_shuffle_buffer_mixes_within_its_window():
    """Every row comes out once, with its ids; while rows come in, a row leaves at most about
    `size` rows late... and the order is not the input's with a delay."""

    def shuffled(seed):
        chunks = (_numbered(a, min(a + 70, 2000)) for a in range(0, 2000, 70))
        out = EncodedRows.cat(list(shuffle_buffer(chunks, 100, seed)))
        assert out.single[:, 0].tolist() == out.labels.long().tolist()  # rows keep their ids
        return out.labels.long().tolist()

    out = shuffled(7)
    assert sorted(out) == list(range(2000))
    early = out[:1800]  # before the final drain
    assert all(row < position + 171 for position, row in enumerate(early))  # buffer + a chunk
    ascents = sum(a < b for a, b in itertools.pairwise(early)) / len(early)
    assert 0.35 < ascents < 0.65, ascents  # about half, as in a random order
    assert out == shuffled(7)  # seeded
    assert out != shuffled(8)


def test_taking_rows_keeps_their_bags():
    """`EncodedRows.take` and `slice` of multi-hot rows (empty bags too) and of categorical
    rows (one id, or -1: empty), and the batch's key-major KJT with the features interleaved
    (categorical, multi-hot, categorical, categorical)."""
    rows = EncodedRows(torch.arange(4.0), torch.arange(4.0).view(4, 1),
                       torch.tensor([[7, 10, 20], [8, -1, 21], [9, 12, -1], [6, 13, 23]]),
                       (torch.tensor([1, 2, 3, 4, 5]),), (torch.tensor([2, 0, 3, 0]),),
                       (0, ~0, 1, 2))  # fmt: skip
    taken = rows.take(torch.tensor([2, 1, 0, 2]))
    assert taken.ids[0].tolist() == [3, 4, 5, 1, 2, 3, 4, 5]
    assert taken.lengths[0].tolist() == [3, 0, 2, 3]
    assert taken.single[:, 0].tolist() == [9, 8, 7, 9]
    assert taken.dense[:, 0].tolist() == [2, 1, 0, 2]
    assert rows.slice(1, 3).ids[0].tolist() == [3, 4, 5]
    assert rows.slice(1, 3).single[:, 1].tolist() == [-1, 12]
    kjt = rows.slice(1, 4).batch(["a", "genres", "b", "c"]).sparse_features
    assert kjt.lengths().tolist() == [1, 1, 1, 0, 3, 0, 0, 1, 1, 1, 0, 1]
    assert kjt.values().tolist() == [8, 9, 6, 3, 4, 5, 12, 13, 21, 23]
    assert kjt.lengths().dtype == torch.int32 and kjt.values().dtype == torch.int64


def test_prefetched_batches_are_the_batches_made_in_the_caller(data):
    """Made in a background thread (the second epoch's started when the first ended), or in
    the caller's thread: the same batches, in the same order."""

    def two_epochs(prefetch):
        reader = TableReader(data, split="train", batch_size=32, rank=1, world_size=2,
                             prefetch=prefetch)  # fmt: skip
        return [[_whole(b) for b in reader] for _ in range(2)]

    ahead = two_epochs(4)
    assert ahead == two_epochs(0) and ahead[0] != ahead[1]


def test_start_makes_the_first_epoch_ahead_and_a_resume_drops_it(data, monkeypatch):
    """`start` makes the first epoch's batches in the background before `iter` asks (what
    `shardkit train` does while it builds the model): the same batches as made on demand; a
    resume to another position afterwards drops them and reads from there."""
    import threading

    read, began = TableReader._read, threading.Event()

    def reading(self, runs):
        began.set()
        yield from read(self, runs)

    monkeypatch.setattr(TableReader, "_read", reading)

    def reader(prefetch):
        return TableReader(data, split="train", batch_size=32, rank=1, world_size=2,
                           prefetch=prefetch)  # fmt: skip

    expected = [_whole(b) for b in reader(0)]
    began.clear()
    early = reader(4)
    assert not began.is_set()
    early.start()
    assert began.wait(timeout=60)  # reading before any iter()
    assert [_whole(b) for b in early] == expected
    moved = reader(4)
    moved.start()
    moved.load_state_dict({**moved.state_dict(), "batches": 2})
    assert [_whole(b) for b in moved] == expected[2:]


def test_an_error_while_prefetching_is_raised_to_the_caller(data, monkeypatch):
    def broken(self, runs):
        raise OSError("the disk went away")
        yield

    monkeypatch.setattr(TableReader, "_read", broken)
    reader = TableReader(data, split="validation", batch_size=8, rank=0, world_size=1)
    with pytest.raises(OSError, match="the disk went away"):
        list(reader)
