"""split, permute, concat and the dict round trip, checked against the same ops on plain tables."""

from __future__ import annotations

import pytest
import torch

from shardkit.sparse import KeyedJaggedTensor
from tests.sparse.tables import (
    TABLES,
    VBE_TABLES,
    assert_metadata,
    flatten,
    make_kjt,
    read_bags,
    read_table,
)


def _cases(with_vbe: bool = True):
    """(id, table, stride_per_key_per_rank or None) for every table, weighted or not."""
    tables = [(name, table, None) for name, table in TABLES.items()]
    if with_vbe:
        tables += [(name, table, strides) for name, (table, strides) in VBE_TABLES.items()]
    return [
        pytest.param(table, strides, weighted, id=f"{name}-w{weighted:d}")
        for name, table, strides in tables
        for weighted in (False, True)
    ]


def _segmentations(num_keys: int) -> list[list[int]]:
    out = [[num_keys], [0, num_keys], [num_keys, 0], [1] * num_keys, [0] * 3]
    if num_keys > 1:
        out += [[1, num_keys - 1], [num_keys - 1, 0, 1]]
    return out


@pytest.mark.parametrize("table, strides, weighted", _cases())
def test_split_gives_consecutive_key_groups(table, strides, weighted):
    kjt = make_kjt(table, weighted=weighted, stride_per_key_per_rank=strides).sync()
    keys = list(table)
    for segments in _segmentations(len(keys)):
        parts = kjt.split(segments)
        assert len(parts) == len(segments)
        start = 0
        for segment, part in zip(segments, parts):
            expected = {key: table[key] for key in keys[start : start + segment]}
            assert read_table(part) == expected
            assert part.variable_stride_per_key() == (strides is not None)
            assert part.length_per_key_or_none() == flatten(expected).length_per_key
            if segment == len(keys):
                assert part is kjt  # as TorchRec: no copy when one piece holds every key
            if segment == 0:  # as TorchRec: empty int32 lengths and offsets, the same stride
                assert part.stride() == kjt.stride() and part.offsets().tolist() == []
                assert part.lengths().dtype == part.offsets().dtype == torch.int32
            else:
                assert_metadata(part, flatten(expected))
            start += segment


def test_split_carries_metadata_without_a_sync(monkeypatch):
    kjt = make_kjt(TABLES["key_without_ids"]).sync()
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("synced"))
    parts = kjt.split([1, 2])
    assert [p.length_per_key() for p in parts] == [[2], [0, 2]]
    assert [p.offset_per_key() for p in parts] == [[0, 2], [0, 0, 2]]
    assert parts[1]["c"].values().data_ptr() == kjt.values()[2:].data_ptr()  # views


PERMUTATIONS = {
    "reverse": lambda n: list(range(n))[::-1],
    "repeat_first": lambda n: [0, 0, *list(range(1, n))],
    "drop_all_but_last": lambda n: [n - 1],
    "twice": lambda n: list(range(n)) * 2,
    "none": lambda n: [],
}


@pytest.mark.parametrize("table, strides, weighted", _cases())
@pytest.mark.parametrize("how", sorted(PERMUTATIONS))
def test_permute_reorders_and_repeats_keys(table, strides, weighted, how):
    kjt = make_kjt(table, weighted=weighted, stride_per_key_per_rank=strides)
    keys = list(table)
    indices = PERMUTATIONS[how](len(keys))
    out = kjt.permute(indices)
    expected = [(keys[i], table[keys[i]]) for i in indices]
    assert read_bags(out) == expected  # weights checked inside read_bags
    flat_lengths = [len(bag) for _, bags in expected for bag in bags]
    assert out.lengths().tolist() == flat_lengths and out.lengths().dtype == kjt.lengths().dtype
    assert out.length_per_key_or_none() == [sum(map(len, bags)) for _, bags in expected]
    assert out.stride() == kjt.stride()
    if strides is not None:
        assert out.stride_per_key_per_rank() == [strides[i] for i in indices]


def test_permute_with_indices_tensor_and_repeated_key_lookup():
    kjt = make_kjt(TABLES["seed002"])
    out = kjt.permute([1, 0, 1], indices_tensor=torch.tensor([1, 0, 1], dtype=torch.int32))
    assert out.keys() == ["user", "product", "user"]
    assert out.index_per_key() == {"user": 2, "product": 1}  # the last one wins, as in TorchRec
    assert out["user"].values().tolist() == [404, 505, 606]
    assert out.validate() is out


@pytest.mark.parametrize("weighted", [False, True])
def test_concat_puts_keys_side_by_side(weighted):
    a = make_kjt(TABLES["seed002"], weighted=weighted).sync()
    b = make_kjt({"x": [[1], [], [2, 3]]}, weighted=weighted)
    out = KeyedJaggedTensor.concat([a, b])
    assert read_table(out) == {**TABLES["seed002"], "x": [[1], [], [2, 3]]}
    assert out.stride() == 3 and out.length_per_key_or_none() is None  # b was not synced
    b.sync()
    assert KeyedJaggedTensor.concat([a, b]).length_per_key_or_none() == [3, 3, 3]
    # A KJT without keys joins anything (its stride does not count).
    assert read_table(KeyedJaggedTensor.concat([KeyedJaggedTensor.empty(is_weighted=weighted), b]))


@pytest.mark.parametrize("table, strides, weighted", _cases())
def test_concat_of_split_is_the_original(table, strides, weighted):
    kjt = make_kjt(table, weighted=weighted, stride_per_key_per_rank=strides)
    for segments in _segmentations(len(table)):
        if sum(segments) != len(table):
            continue
        again = KeyedJaggedTensor.concat(kjt.split(segments))
        assert read_table(again) == table
        assert again.stride_per_key_per_rank() == kjt.stride_per_key_per_rank()


def test_concat_with_inverse_indices_stacks_them():
    def vbe(key: str, rows: list[int]) -> KeyedJaggedTensor:
        inverse = ([key], torch.tensor([rows]))
        return KeyedJaggedTensor([key], torch.tensor([1]), lengths=torch.tensor([1]),
                                 stride_per_key_per_rank=[[1]], inverse_indices=inverse)  # fmt: skip

    out = KeyedJaggedTensor.concat([vbe("a", [0, 0]), vbe("b", [0, 0])])
    names, tensor = out.inverse_indices()
    assert names == ["a", "b"] and tensor.tolist() == [[0, 0], [0, 0]]


@pytest.mark.parametrize("table, strides, weighted", _cases())
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_from_jt_dict_of_to_dict_round_trips(table, strides, weighted, dtype):
    kjt = make_kjt(table, weighted=weighted, dtype=dtype, stride_per_key_per_rank=strides)
    again = KeyedJaggedTensor.from_jt_dict(kjt.to_dict())
    assert read_table(again) == table
    assert again.values().dtype == dtype and again.lengths().dtype == dtype
    assert again.length_per_key_or_none() == flatten(table).length_per_key  # synced
    stride_per_key = flatten(table).stride_per_key
    assert again.variable_stride_per_key() == (len(set(stride_per_key)) > 1)
    assert again.stride_per_key() == stride_per_key


def test_from_jt_dict_of_nothing_is_empty():
    assert KeyedJaggedTensor.from_jt_dict(KeyedJaggedTensor.empty().to_dict()).keys() == []
