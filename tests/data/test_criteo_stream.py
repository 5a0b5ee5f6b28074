"""`CriteoReader`: ranks together read the single-process global batch, in file order across
files; resuming yields the rest; memory stays bounded by a chunk."""

from __future__ import annotations

import tracemalloc

import pytest
import torch

from shardkit.data import CriteoConfig, CriteoReader, LastBatch, read_criteo
from shardkit.data import _criteo as criteo_module
from tests.data.criteo_files import write_days
from tests.data.helpers import assert_batches_equal, concat

CONFIG = CriteoConfig(num_embeddings=97)
SIZES = [17, 11, 9]  # 37 examples over three files (the first ends with a blank line)


@pytest.fixture
def days(tmp_path):
    write_days(tmp_path / "days", SIZES)
    return tmp_path / "days"


def _readers(path, world_size: int, batch_size: int, **kwargs) -> list[CriteoReader]:
    return [
        CriteoReader(
            path, config=CONFIG, batch_size=batch_size, rank=rank, world_size=world_size, **kwargs
        )
        for rank in range(world_size)
    ]


def _epoch(readers) -> list[tuple]:
    return list(zip(*[list(reader) for reader in readers]))


def test_files_in_natural_order_gzip_detected(days):
    (days / "day_10").write_text("")  # natural order: after day_2
    reader = CriteoReader(days, config=CONFIG, batch_size=4)
    assert [p.name for p in reader.files] == ["day_0", "day_1.gz", "day_2", "day_10"]


@pytest.mark.parametrize("last_batch", list(LastBatch))
@pytest.mark.parametrize(("world_size", "batch_size"), [(1, 5), (2, 3), (3, 4), (4, 2)])
def test_ranks_together_read_the_stream_in_order(days, world_size, batch_size, last_batch):
    everything = read_criteo(days, config=CONFIG)  # the single-process spec, all in memory
    global_size = world_size * batch_size
    single = _epoch(_readers(days, 1, global_size, last_batch=last_batch, chunk_batches=2))
    steps = _epoch(_readers(days, world_size, batch_size, last_batch=last_batch, chunk_batches=2))
    assert len(steps) == len(single) == (37 // global_size if last_batch is LastBatch.DROP
                                         else -(-37 // global_size))  # fmt: skip
    for step, (per_rank, (global_batch,)) in enumerate(zip(steps, single)):
        together = concat(list(per_rank))
        start = step * global_size
        real = min(global_size, 37 - start)
        expected = everything.batch(torch.arange(start, start + real))
        if last_batch is LastBatch.PAD:
            assert all(b.batch_size == batch_size for b in per_rank)
            mask = together.weights == 1
            torch.testing.assert_close(together.dense_features[mask], expected.dense_features)
            torch.testing.assert_close(together.labels[mask], expected.labels)
            mask = global_batch.weights == 1
            torch.testing.assert_close(global_batch.dense_features[mask], expected.dense_features)
        else:
            assert_batches_equal(together, expected)
            assert_batches_equal(global_batch, expected)


def _take(reader, num_batches: int, num_epochs: int) -> list:
    taken: list = []
    for _ in range(num_epochs):
        if len(taken) == num_batches:
            return taken
        for batch in reader:
            taken.append(batch)
            if len(taken) == num_batches:
                return taken
    return taken


@pytest.mark.parametrize("last_batch", [LastBatch.DROP, LastBatch.PAD])
def test_resume_after_any_number_of_batches(days, last_batch):
    kwargs = {"last_batch": last_batch, "chunk_batches": 3}
    world_size, batch_size, epochs = 2, 4, 2
    reference = [_take(r, -1, epochs) for r in _readers(days, world_size, batch_size, **kwargs)]
    for stop in range(len(reference[0]) + 1):
        for rank, reader in enumerate(_readers(days, world_size, batch_size, **kwargs)):
            taken = _take(reader, stop, epochs)
            resumed = _readers(days, world_size, batch_size, **kwargs)[rank]
            resumed.load_state_dict(reader.state_dict())
            rest = _take(resumed, -1, epochs - resumed.epoch)
            assert len(taken) + len(rest) == len(reference[rank])
            for got, want in zip(taken + rest, reference[rank]):
                assert_batches_equal(got, want)


def test_resume_refuses_other_files(days, tmp_path):
    reader = CriteoReader(days, config=CONFIG, batch_size=4)
    next(iter(reader))
    state = reader.state_dict()
    assert state == {"epoch": 0, "examples": 4, "global_batch_size": 4,
                     "files": ["day_0", "day_1.gz", "day_2"]}  # fmt: skip
    other = CriteoReader(days / "day_0", config=CONFIG, batch_size=4)
    with pytest.raises(
        ValueError,
        match=r"saved with files=\['day_0', 'day_1.gz', 'day_2'\] but this iterator has files=\['day_0'\]",
    ):
        other.load_state_dict(state)


class _CountingFile:
    """A text file that counts the lines handed out."""

    read = 0

    def __init__(self, f):
        self.f = f

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def __iter__(self):
        for line in self.f:
            _CountingFile.read += 1
            yield line


def test_reads_at_most_a_chunk_ahead(tmp_path, monkeypatch):
    """Bounded memory, counted: when batch k is handed out, the reader has read no more than
    ``chunk_batches`` global batches past it."""
    write_days(tmp_path / "many", [400, 300, 300])
    opened = criteo_module._open_text
    monkeypatch.setattr(criteo_module, "_open_text", lambda path: _CountingFile(opened(path)))
    _CountingFile.read = 0
    batch_size, world_size, chunk = 8, 2, 3
    reader = CriteoReader(tmp_path / "many", config=CONFIG, batch_size=batch_size, rank=1,
                          world_size=world_size, chunk_batches=chunk)  # fmt: skip
    ahead = []
    for k, _ in enumerate(reader):
        ahead.append(_CountingFile.read - (k + 1) * batch_size * world_size)
    assert len(ahead) == 1000 // 16
    assert max(ahead) <= chunk * batch_size * world_size + 1  # + the blank line of day_0


def _peak_bytes(path, **kwargs) -> int:
    tracemalloc.start()
    try:
        for _ in CriteoReader(path, config=CONFIG, **kwargs):
            pass
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_does_not_grow_with_the_file(tmp_path):
    write_days(tmp_path / "small", [300])
    write_days(tmp_path / "large", [1500])  # 5x the lines: ~380 KB of text
    kwargs = {"batch_size": 16, "rank": 0, "world_size": 2, "chunk_batches": 2}
    small, large = (
        _peak_bytes(tmp_path / "small", **kwargs),
        _peak_bytes(tmp_path / "large", **kwargs),
    )
    text_bytes = (tmp_path / "large" / "day_0").stat().st_size
    assert large < 1.3 * small + 32_000, (small, large)
    assert large < text_bytes / 2, (large, text_bytes)


def test_a_wrong_field_count_stops_every_rank_at_the_same_batch(days):
    lines = (days / "day_2").read_text().splitlines()
    lines[3] = "1\t2"  # example 31 of the stream: rank 0's share of the last global batch
    (days / "day_2").write_text("\n".join(lines) + "\n")
    for reader in _readers(days, 2, 4):  # rank 1 never parses it, but checks its field count
        with pytest.raises(
            ValueError,
            match=r"day_2:4: expected 40 tab-separated fields \(label, 13 integer, 26 categorical\), got 2",
        ):
            list(reader)


def test_a_bad_value_is_reported_by_the_rank_that_parses_it(days):
    lines = (days / "day_0").read_text().splitlines()
    lines[0] = "7" + lines[0][1:]  # a label 7 in rank 0's first batch
    (days / "day_0").write_text("\n".join(lines) + "\n")
    owner, other = _readers(days, 2, 4)
    with pytest.raises(ValueError, match=r"day_0:1: field 1 \(label\) must be 0 or 1, got '7'"):
        next(iter(owner))
    assert next(iter(other)).batch_size == 4


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"chunk_batches": 0}, ValueError, r"chunk_batches must be an int >= 1, got 0"),
        ({"config": "tsv"}, TypeError, r"config must be a CriteoConfig, got str"),
        ({"batch_size": -1}, ValueError, r"CriteoReader: batch_size must be an int >= 1, got -1"),
    ],
)  # fmt: skip
def test_argument_errors(days, kwargs, error, match):
    with pytest.raises(error, match=match):
        CriteoReader(days, **{"config": CONFIG, "batch_size": 4, **kwargs})


def test_too_little_data_is_an_error_not_an_empty_epoch(days):
    reader = CriteoReader(days, config=CONFIG, batch_size=20, rank=0, world_size=2)
    with pytest.raises(
        ValueError,
        match=r"hold no full global batch of batch_size \* world_size = 40 examples and last_batch is DROP",
    ):
        list(reader)
    assert (
        len(list(CriteoReader(days, config=CONFIG, batch_size=40, last_batch=LastBatch.PAD))) == 1
    )
    (days / "blank").write_text("\n\n")
    blank = CriteoReader(days / "blank", config=CONFIG, batch_size=1, last_batch=LastBatch.PAD)
    with pytest.raises(
        ValueError, match=r"blank'\] hold no examples; give files with Criteo lines"
    ):
        list(blank)
