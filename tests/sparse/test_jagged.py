"""JaggedTensor: lengths/offsets, dense conversions and padding, against lists of bags."""

from __future__ import annotations

import itertools

import pytest
import torch

from shardkit.sparse import JaggedTensor

BAGS = {
    "typical": [[1, 2], [], [3], [4], [5], [6, 7, 8]],
    "batch_size_1": [[9, 10, 11]],
    "all_empty": [[], [], []],
    "no_bags": [],
}


def _jt(bags, *, dtype=torch.int64, weighted=False, use_offsets=False, lengths_dtype=torch.int32):
    lengths = [len(bag) for bag in bags]
    values = torch.tensor([v for bag in bags for v in bag], dtype=dtype)
    weights = values.double().float() / 4 if weighted else None
    if use_offsets:
        offsets = torch.tensor(list(itertools.accumulate(lengths, initial=0)), dtype=lengths_dtype)
        return JaggedTensor(values, weights, offsets=offsets)
    return JaggedTensor(values, weights, lengths=torch.tensor(lengths, dtype=lengths_dtype))


def _padded(bags, width, pad):
    return [bag[:width] + [pad] * (width - len(bag[:width])) for bag in bags]


GRID = [
    pytest.param(name, use_offsets, lengths_dtype, id=f"{name}-o{use_offsets:d}-{lengths_dtype}")
    for name in BAGS
    for use_offsets in (False, True)
    for lengths_dtype in (torch.int32, torch.int64)
]


@pytest.mark.parametrize("name, use_offsets, lengths_dtype", GRID)
def test_lengths_offsets_and_dense_match_the_bags(name, use_offsets, lengths_dtype):
    bags = BAGS[name]
    jt = _jt(bags, weighted=True, use_offsets=use_offsets, lengths_dtype=lengths_dtype)
    assert jt.lengths().tolist() == [len(b) for b in bags]
    assert jt.offsets().tolist() == list(itertools.accumulate(map(len, bags), initial=0))
    assert jt.lengths().dtype == jt.offsets().dtype == lengths_dtype
    assert [t.tolist() for t in jt.to_dense()] == bags
    assert [t.tolist() for t in jt.to_dense_weights()] == [[v / 4 for v in b] for b in bags]
    assert jt.validate() is jt


@pytest.mark.parametrize("name, use_offsets, lengths_dtype", GRID)
@pytest.mark.parametrize("width", [None, 0, 1, 2, 5])
@pytest.mark.parametrize("pad", [0.0, -1.0])
def test_to_padded_dense_pads_and_truncates(name, use_offsets, lengths_dtype, width, pad):
    bags = BAGS[name]
    jt = _jt(bags, weighted=True, use_offsets=use_offsets, lengths_dtype=lengths_dtype)
    longest = max(map(len, bags), default=0)
    expected_width = longest if width is None else width
    dense = jt.to_padded_dense(desired_length=width, padding_value=pad)
    assert dense.shape == (len(bags), expected_width) and dense.dtype == torch.int64
    assert dense.tolist() == _padded(bags, expected_width, int(pad))
    weights = jt.to_padded_dense_weights(desired_length=width, padding_value=pad)
    expected = _padded([[v / 4 for v in b] for b in bags], expected_width, pad)
    assert weights.tolist() == expected and weights.dtype == torch.float32


def test_to_padded_dense_of_rows_keeps_trailing_dims():
    jt = JaggedTensor(torch.tensor([[1.0, 2], [3, 4], [5, 6]]), lengths=torch.tensor([1, 0, 2]))
    dense = jt.to_padded_dense(desired_length=1, padding_value=9.0)
    assert dense.tolist() == [[[1.0, 2.0]], [[9.0, 9.0]], [[3.0, 4.0]]]


def test_unweighted_has_no_weight_views():
    jt = _jt(BAGS["typical"])
    assert jt.weights_or_none() is None
    assert jt.to_dense_weights() is None and jt.to_padded_dense_weights() is None


def test_lengths_and_offsets_are_derived_once():
    jt = _jt(BAGS["typical"])
    assert jt.offsets_or_none() is None
    assert jt.offsets() is jt.offsets() is jt.offsets_or_none()
    jt = _jt(BAGS["typical"], use_offsets=True)
    assert jt.lengths_or_none() is None
    assert jt.lengths() is jt.lengths_or_none()


@pytest.mark.parametrize("weighted", [False, True])
def test_from_dense_and_from_dense_lengths(weighted):
    bags = [[1.0], [], [7.0, 8.0], [10.0, 11.0, 12.0]]
    tensors = [torch.tensor(b) for b in bags]
    jt = JaggedTensor.from_dense(tensors, weights=[t * 2 for t in tensors] if weighted else None)
    assert jt.values().tolist() == [1.0, 7.0, 8.0, 10.0, 11.0, 12.0]
    assert jt.lengths().tolist() == [1, 0, 2, 3] and jt.lengths().dtype == torch.int32
    if weighted:
        assert jt.weights().tolist() == [2.0, 14.0, 16.0, 20.0, 22.0, 24.0]
    padded = torch.arange(12.0).view(3, 4)
    jt = JaggedTensor.from_dense_lengths(
        padded, torch.tensor([2, 0, 4]), weights=padded / 2 if weighted else None
    )
    assert [t.tolist() for t in jt.to_dense()] == [[0.0, 1.0], [], [8.0, 9.0, 10.0, 11.0]]
    if weighted:
        assert jt.weights().tolist() == [0.0, 0.5, 4.0, 4.5, 5.0, 5.5]
    assert JaggedTensor.from_dense([]).lengths().tolist() == []


@pytest.mark.parametrize("weighted", [False, True])
def test_empty_and_empty_like(weighted):
    jt = JaggedTensor.empty(is_weighted=weighted, values_dtype=torch.int64)
    assert jt.values().dtype == torch.int64 and jt.lengths().dtype == torch.int32
    assert jt.offsets().tolist() == [] and jt.to_dense() == []
    assert jt.to_padded_dense().shape == (0, 0)
    assert (jt.weights_or_none() is not None) == weighted
    source = _jt(BAGS["typical"], weighted=weighted, dtype=torch.int32)
    like = JaggedTensor.empty_like(source)
    assert like.values().dtype == torch.int32 and like.lengths().numel() == 0
    shaped = JaggedTensor.empty_like(source, device=torch.device("cpu"))
    assert shaped.values().shape == source.values().shape


def test_to_pin_memory_and_record_stream(monkeypatch):
    jt = _jt(BAGS["typical"], weighted=True)
    jt.offsets()
    moved = jt.to(torch.device("cpu"))
    assert [t.tolist() for t in moved.to_dense()] == BAGS["typical"]
    assert moved.offsets_or_none() is not None and moved.device() == torch.device("cpu")
    recorded = []
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, s: recorded.append(s))
    jt.record_stream("stream")
    assert recorded == ["stream"] * 4  # values, weights, lengths, offsets
    if torch.cuda.is_available():
        assert jt.pin_memory().values().is_pinned()
