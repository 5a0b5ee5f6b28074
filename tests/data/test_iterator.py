"""`GlobalBatchIterator`: ranks together read the single-process global batch; every example
once per epoch; resuming after any number of batches yields exactly the rest."""

from __future__ import annotations

import pytest
import torch

from shardkit.data import GlobalBatchIterator, LastBatch, epoch_order
from tests.data.helpers import assert_batches_equal, concat, example_ids, numbered

NUM_EXAMPLES = 23  # prime: no batch size divides it


def _iterators(world_size: int, batch_size: int, **kwargs) -> list[GlobalBatchIterator]:
    data = numbered(NUM_EXAMPLES)
    return [
        GlobalBatchIterator(data, batch_size=batch_size, rank=rank, world_size=world_size, **kwargs)
        for rank in range(world_size)
    ]


def _real(batch) -> list[int]:
    ids = example_ids(batch)
    if batch.weights is None:
        return ids
    return [i for i, w in zip(ids, batch.weights.tolist()) if w == 1.0]


def _epoch(ranks: list[GlobalBatchIterator]) -> list[tuple]:
    """One epoch of every rank (each runs its own loop to the end): [step][rank]."""
    return list(zip(*[list(it) for it in ranks]))


@pytest.mark.parametrize("last_batch", list(LastBatch))
@pytest.mark.parametrize(
    ("world_size", "batch_size"), [(1, 4), (2, 3), (3, 2), (4, 1), (4, 5), (3, 7)]
)
def test_ranks_together_read_the_global_batch(world_size, batch_size, last_batch):
    ranks = _iterators(world_size, batch_size, seed=5, last_batch=last_batch)
    single = GlobalBatchIterator(numbered(NUM_EXAMPLES), batch_size=batch_size * world_size,
                                 rank=0, world_size=1, seed=5, last_batch=last_batch)  # fmt: skip
    assert len(ranks[0]) == len(single)
    for epoch in range(2):
        steps, expected = _epoch(ranks), list(single)
        assert len(steps) == len(expected) == len(single)
        for per_rank, global_batch in zip(steps, expected):
            together = concat(list(per_rank))
            if last_batch is LastBatch.PAD:  # same real examples; padding differs per rank
                assert _real(together) == _real(global_batch)
                assert all(b.batch_size == batch_size for b in per_rank)
            else:
                assert_batches_equal(together, global_batch)
        assert {it.epoch for it in ranks} == {epoch + 1}


@pytest.mark.parametrize("last_batch", [LastBatch.PAD, LastBatch.UNEVEN])
@pytest.mark.parametrize(("world_size", "batch_size"), [(1, 4), (2, 3), (3, 2), (4, 5), (3, 30)])
def test_every_example_once_per_epoch(world_size, batch_size, last_batch):
    ranks = _iterators(world_size, batch_size, shuffle=False, last_batch=last_batch)
    seen = [i for it in ranks for batch in it for i in _real(batch)]
    assert sorted(seen) == list(range(NUM_EXAMPLES))


def test_pad_gives_every_rank_the_same_shape_and_zero_weight_padding():
    ranks = _iterators(3, 4, shuffle=False, last_batch=LastBatch.PAD)  # 23 = 12 + 11
    last = [list(it)[-1] for it in ranks]
    assert [b.batch_size for b in last] == [4, 4, 4]
    assert [b.weights.tolist() for b in last] == [[1.0] * 4, [1.0] * 4, [1.0, 1.0, 1.0, 0.0]]
    assert example_ids(last[2]) == [20, 21, 22, 12]  # padded from the global batch's start


def test_uneven_splits_the_remainder_near_evenly():
    ranks = _iterators(4, 5, shuffle=False, last_batch=LastBatch.UNEVEN)  # 23 = 20 + 3
    assert [example_ids(list(it)[-1]) for it in ranks] == [[20], [21], [22], []]
    assert list(_iterators(2, 5, shuffle=False, last_batch=LastBatch.UNEVEN)[0])[-1].weights is None


def test_drop_skips_the_partial_batch():
    (it,) = _iterators(1, 5, shuffle=False)
    assert [example_ids(b) for b in it] == [list(range(i, i + 5)) for i in range(0, 20, 5)]


def test_shuffle_is_seeded_per_epoch_and_stable():
    (it,) = _iterators(1, 23, seed=3)
    first = example_ids(list(it)[0])  # noqa: RUF015 (runs the whole epoch)
    second = example_ids(list(it)[0])  # noqa: RUF015
    assert sorted(first) == sorted(second) == list(range(23))
    assert first != second  # a new order each epoch
    assert example_ids(next(iter(_iterators(1, 23, seed=3)[0]))) == first
    assert example_ids(next(iter(_iterators(1, 23, seed=4)[0]))) != first
    # pinned: the order is a hash of (seed, epoch, index), the same on every torch release
    assert epoch_order(8, seed=0, epoch=0, shuffle=True).tolist() == [2, 5, 3, 4, 0, 1, 7, 6]
    assert epoch_order(4, seed=0, epoch=0, shuffle=False).tolist() == [0, 1, 2, 3]


def _take(it: GlobalBatchIterator, num_batches: int, num_epochs: int) -> list:
    """The training loop ``for epoch: for batch in it`` stopped after ``num_batches`` batches."""
    taken: list = []
    for _ in range(num_epochs):
        if len(taken) == num_batches:
            return taken
        for batch in it:
            taken.append(batch)
            if len(taken) == num_batches:
                return taken
    return taken


@pytest.mark.parametrize("last_batch", list(LastBatch))
@pytest.mark.parametrize(("world_size", "batch_size"), [(1, 4), (3, 2)])
def test_resume_after_any_number_of_batches(world_size, batch_size, last_batch):
    kwargs = {"seed": 11, "last_batch": last_batch}
    epochs = 2
    reference = [_take(it, -1, epochs) for it in _iterators(world_size, batch_size, **kwargs)]
    steps_per_epoch = len(reference[0]) // epochs
    for stop in range(len(reference[0]) + 1):
        for rank, it in enumerate(_iterators(world_size, batch_size, **kwargs)):
            taken = _take(it, stop, epochs)
            resumed = _iterators(world_size, batch_size, **kwargs)[rank]
            resumed.load_state_dict(it.state_dict())
            # the loop resumes at the saved epoch (an epoch ended by its last batch leaves an
            # empty rest: see [Note: resuming])
            assert resumed.epoch == max(stop - 1, 0) // steps_per_epoch
            rest = _take(resumed, -1, epochs - resumed.epoch)
            assert len(taken) + len(rest) == len(reference[rank])
            for got, want in zip(taken + rest, reference[rank]):
                assert_batches_equal(got, want)


def test_resume_on_another_world_size_with_the_same_global_batch():
    reference = _epoch(_iterators(2, 3, seed=2))  # global batch 6
    ranks = _iterators(2, 3, seed=2)
    for it in ranks:
        _take(it, 2, 1)
    state = ranks[0].state_dict()
    resumed = _iterators(3, 2, seed=2)
    for it in resumed:
        it.load_state_dict(state)
    rest = [concat(list(step)) for step in zip(*resumed)]
    assert len(rest) == len(reference) - 2
    for got, want in zip(rest, reference[2:]):
        assert_batches_equal(got, concat(list(want)))


def test_state_dict_is_plain_data():
    (it,) = _iterators(1, 4, seed=9)
    next(iter(it))
    assert it.state_dict() == {
        "epoch": 0, "examples": 4, "num_examples": 23, "seed": 9, "shuffle": True,
        "global_batch_size": 4,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"seed": 1}, r"saved with seed=1 but this iterator has seed=0; build the iterator as it was"),
        ({"num_examples": 99}, r"saved with num_examples=99 but this iterator has num_examples=23"),
        ({"epoch": -1}, r"epoch and examples must be >= 0, got -1, 4"),
        ({"examples": 30}, r"at example 30 of a data set of 23"),
        ({"global_batch_size": 2, "examples": 2}, r"stopped after 2 examples, not a multiple of this iterator's global batch size 4 .*e.g. the saved one \(2\)"),
    ],
)  # fmt: skip
def test_load_state_dict_refuses_a_foreign_state(change, match):
    (it,) = _iterators(1, 4)
    next(iter(it))
    state = {**it.state_dict(), **change}
    with pytest.raises(ValueError, match=match):
        it.load_state_dict(state)
    with pytest.raises(
        ValueError,
        match=r"the state lacks \['seed'\]; pass what GlobalBatchIterator.state_dict\(\) returned",
    ):
        it.load_state_dict({k: v for k, v in it.state_dict().items() if k != "seed"})


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, r"batch_size must be an int >= 1, got 0"),
        ({"batch_size": 2.0}, ValueError, r"batch_size must be an int >= 1, got 2.0"),
        ({"seed": -1}, ValueError, r"seed must be an int >= 0, got -1"),
        ({"last_batch": "pad"}, TypeError, r"last_batch must be a LastBatch, got 'pad'; use LastBatch.DROP"),
        ({"rank": 1}, ValueError, r"give both rank and world_size, or neither.*rank=1, world_size=None"),
        ({"rank": 2, "world_size": 2}, ValueError, r"0 <= rank < world_size, got rank=2, world_size=2"),
        ({"batch_size": 12, "rank": 0, "world_size": 2}, ValueError, r"23 examples make no full global batch of batch_size \* world_size = 24 and last_batch is DROP; use a smaller batch_size, or last_batch=LastBatch.PAD"),
    ],
)  # fmt: skip
def test_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        GlobalBatchIterator(numbered(NUM_EXAMPLES), **{"batch_size": 2, **kwargs})


def test_empty_data_set_is_refused():
    with pytest.raises(ValueError, match=r"the data set is empty; give it examples"):
        GlobalBatchIterator(numbered(0), batch_size=1, last_batch=LastBatch.PAD)


def test_defaults_to_a_single_process():
    it = GlobalBatchIterator(numbered(4), batch_size=2, shuffle=False)
    assert (it.rank, it.world_size, len(it)) == (0, 1, 2)
    assert torch.equal(next(iter(it)).labels, torch.tensor([0.0, 1.0]))
