"""KeyedJaggedTensor: construction, metadata, per-key views, devices, against the table reference."""

from __future__ import annotations

import pytest
import torch

from shardkit.sparse import JaggedTensor, KeyedJaggedTensor
from tests.sparse.tables import (
    TABLES,
    VBE_TABLES,
    assert_metadata,
    flatten,
    make_kjt,
    read_table,
    weight_of,
)

GRID = [
    pytest.param(name, dtype, weighted, use_offsets, id=f"{name}-{dtype}-w{weighted:d}-o{use_offsets:d}")
    for name in TABLES
    for dtype in (torch.int32, torch.int64)
    for weighted in (False, True)
    for use_offsets in (False, True)
]  # fmt: skip
VBE_GRID = [
    pytest.param(name, weighted, id=f"{name}-w{weighted:d}")
    for name in VBE_TABLES
    for weighted in (False, True)
]


@pytest.mark.parametrize("name, dtype, weighted, use_offsets", GRID)
def test_metadata_matches_reference(name, dtype, weighted, use_offsets):
    table = TABLES[name]
    kjt = make_kjt(table, weighted=weighted, dtype=dtype, use_offsets=use_offsets)
    flat = flatten(table)
    assert kjt.stride() == len(next(iter(table.values())))
    assert not kjt.variable_stride_per_key()
    assert kjt.stride_per_key_per_rank() == []
    assert kjt.index_per_key() == {key: i for i, key in enumerate(flat.keys)}
    assert_metadata(kjt, flat)
    assert kjt.lengths().dtype == dtype and kjt.offsets().dtype == dtype
    assert read_table(kjt) == table
    assert (kjt.weights_or_none() is not None) == weighted


@pytest.mark.parametrize("name, weighted", VBE_GRID)
def test_vbe_metadata_matches_reference(name, weighted):
    table, strides = VBE_TABLES[name]
    kjt = make_kjt(table, weighted=weighted, stride_per_key_per_rank=strides)
    flat = flatten(table)
    assert kjt.variable_stride_per_key()
    assert kjt.stride_per_key_per_rank() == strides
    assert kjt.stride() == max(flat.stride_per_key)
    assert_metadata(kjt, flat)
    assert read_table(kjt) == table


def test_lengths_and_offsets_are_derived_lazily_and_cached():
    kjt = make_kjt(TABLES["seed002"])
    assert kjt.offsets_or_none() is None
    offsets = kjt.offsets()
    assert kjt.offsets() is offsets and kjt.offsets_or_none() is offsets
    from_offsets = make_kjt(TABLES["seed002"], use_offsets=True)
    assert from_offsets.lengths_or_none() is None
    assert from_offsets.lengths().tolist() == [2, 0, 1, 1, 1, 1]
    assert from_offsets.lengths() is from_offsets.lengths_or_none()


def test_seed002_stride_is_lengths_over_keys():
    kjt = KeyedJaggedTensor(
        keys=["product", "user"],
        values=torch.tensor([101, 202, 303, 404, 505, 606]),
        lengths=torch.tensor([2, 0, 1, 1, 1, 1], dtype=torch.int64),
    )
    assert kjt.stride() == 6 // 2 == 3
    assert kjt.length_per_key() == [3, 3]
    assert kjt.offset_per_key() == [0, 3, 6]


def test_metadata_syncs_once_then_is_cached(monkeypatch):
    kjt = make_kjt(TABLES["seed002"])
    assert kjt.length_per_key_or_none() is None and kjt.offset_per_key_or_none() is None
    assert kjt.sync() is kjt
    lengths_seen = kjt.length_per_key()
    calls = []
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(1) or [])
    kjt["user"], kjt.to_dict(), kjt.split([1, 1]), kjt.permute([1, 0])
    assert calls == [] and kjt.length_per_key() is lengths_seen
    monkeypatch.undo()
    assert kjt.unsync() is kjt and kjt.length_per_key_or_none() is None
    assert kjt.length_per_key() == [3, 3]


@pytest.mark.parametrize("name, dtype, weighted, use_offsets", GRID)
def test_getitem_and_to_dict_give_each_keys_bags(name, dtype, weighted, use_offsets):
    table = TABLES[name]
    kjt = make_kjt(table, weighted=weighted, dtype=dtype, use_offsets=use_offsets)
    as_dict = kjt.to_dict()
    assert list(as_dict) == list(table)
    assert kjt.to_dict() is as_dict  # cached
    for key, bags in table.items():
        for jt in (kjt[key], as_dict[key]):
            assert isinstance(jt, JaggedTensor)
            assert [t.tolist() for t in jt.to_dense()] == bags
            assert jt.lengths().tolist() == [len(bag) for bag in bags]
            expected_weights = [weight_of(v) for bag in bags for v in bag]
            assert (jt.weights().tolist() if weighted else jt.weights_or_none()) == (
                expected_weights if weighted else None
            )
        offsets = as_dict[key].offsets_or_none()
        assert offsets.tolist() == flatten({key: bags}).offsets and offsets.dtype == dtype


@pytest.mark.parametrize("name, weighted", VBE_GRID)
def test_vbe_to_dict_keeps_each_keys_batch_size(name, weighted):
    table, strides = VBE_TABLES[name]
    kjt = make_kjt(table, weighted=weighted, stride_per_key_per_rank=strides)
    for key, jt in kjt.to_dict().items():
        assert [t.tolist() for t in jt.to_dense()] == table[key]
        assert jt.offsets().tolist() == flatten({key: table[key]}).offsets
        assert [t.tolist() for t in kjt[key].to_dense()] == table[key]


def test_to_dict_without_offsets():
    jts = make_kjt(TABLES["seed002"]).to_dict(compute_offsets=False)
    assert all(jt.offsets_or_none() is None for jt in jts.values())


def test_getitem_views_share_storage():
    kjt = make_kjt(TABLES["seed002"])
    user = kjt["user"]
    assert user.values().data_ptr() == kjt.values()[3:].data_ptr()


def test_explicit_stride_and_stride_per_key_per_rank_as_tensor():
    kjt = KeyedJaggedTensor(["a", "b"], torch.tensor([1, 2]), lengths=torch.tensor([1, 0, 0, 1]), stride=2)  # fmt: skip
    assert kjt.stride() == 2 and read_table(kjt) == {"a": [[1], []], "b": [[], [2]]}
    vbe = KeyedJaggedTensor(
        ["a", "b"], torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1]),
        stride_per_key_per_rank=torch.tensor([[1], [2]], dtype=torch.int32),
    )  # fmt: skip
    assert vbe.stride_per_key_per_rank() == [[1], [2]] and vbe.stride_per_key() == [1, 2]
    assert read_table(vbe) == {"a": [[1]], "b": [[2], [3]]}


def test_vbe_stride_comes_from_inverse_indices():
    inverse = (["a", "b"], torch.tensor([[0, 0, 0, 0], [0, 1, 1, 0]]))
    kjt = KeyedJaggedTensor(
        ["a", "b"], torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1]),
        stride_per_key_per_rank=[[1], [2]], inverse_indices=inverse,
    )  # fmt: skip
    assert kjt.stride() == 4
    assert kjt.inverse_indices() is inverse and kjt.inverse_indices_or_none() is inverse
    assert kjt.validate() is kjt


@pytest.mark.parametrize("weighted", [False, True])
def test_empty_kjt_has_no_keys(weighted):
    kjt = KeyedJaggedTensor.empty(is_weighted=weighted, values_dtype=torch.int64)
    assert kjt.keys() == [] and kjt.stride() == 0 and kjt.length_per_key() == []
    assert kjt.offset_per_key() == [0] and kjt.to_dict() == {}
    assert kjt.lengths().dtype == torch.int32 and kjt.values().dtype == torch.int64
    assert (kjt.weights_or_none() is not None) == weighted
    assert kjt.split([0])[0].keys() == [] and kjt.permute([]).keys() == []
    assert kjt.validate() is kjt


def test_empty_like_keeps_dtypes_and_stride():
    kjt = make_kjt(TABLES["seed002"], weighted=True, dtype=torch.int32)
    empty = KeyedJaggedTensor.empty_like(kjt)
    assert empty.keys() == [] and empty.stride() == 3
    assert empty.values().dtype == torch.int32 and empty.weights().dtype == torch.float32
    table, strides = VBE_TABLES["vbe"]
    vbe_empty = KeyedJaggedTensor.empty_like(make_kjt(table, stride_per_key_per_rank=strides))
    assert vbe_empty.variable_stride_per_key() and vbe_empty.stride_per_key_per_rank() == strides
    on_cpu = KeyedJaggedTensor.empty_like(kjt.sync(), device=torch.device("cpu"))
    assert on_cpu.keys() == kjt.keys() and on_cpu.values().shape == kjt.values().shape
    assert on_cpu.length_per_key_or_none() == [3, 3]  # carried over, not read from the data


@pytest.mark.parametrize("use_offsets", [False, True])
def test_from_lengths_and_offsets_sync_compute_metadata_now(use_offsets):
    flat = flatten(TABLES["key_without_ids"])
    values = torch.tensor(flat.values)
    if use_offsets:
        kjt = KeyedJaggedTensor.from_offsets_sync(flat.keys, values, torch.tensor(flat.offsets))
    else:
        kjt = KeyedJaggedTensor.from_lengths_sync(flat.keys, values, torch.tensor(flat.lengths))
    assert kjt.length_per_key_or_none() == flat.length_per_key
    assert kjt.offset_per_key_or_none() == flat.offset_per_key


def test_to_and_pin_memory_keep_data_and_metadata():
    kjt = make_kjt(TABLES["seed002"], weighted=True).sync()
    kjt.to_dict()
    moved = kjt.to(torch.device("cpu"), dtype=torch.float64)
    assert moved is not kjt and read_table(moved) == TABLES["seed002"]
    assert moved.weights().dtype == torch.float64 and moved.values().dtype == torch.int64
    assert moved.length_per_key_or_none() == [3, 3]
    assert moved._jt_dict is None  # a cached dict would hold tensors of the old device
    if torch.cuda.is_available():  # pinning needs an accelerator
        pinned = kjt.pin_memory()
        assert pinned.values().is_pinned() and read_table(pinned) == TABLES["seed002"]


def test_flatten_lengths_keeps_everything():
    kjt = make_kjt(TABLES["seed002"], weighted=True)
    flat = kjt.flatten_lengths()
    assert read_table(flat) == TABLES["seed002"] and flat.length_per_key_or_none() == [3, 3]


def test_device_and_values():
    kjt = make_kjt(TABLES["seed002"])
    assert kjt.device() == torch.device("cpu")
    assert kjt.values().tolist() == [101, 202, 303, 404, 505, 606]
