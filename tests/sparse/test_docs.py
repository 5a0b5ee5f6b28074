"""The worked examples in the class docstrings hold, number for number."""

from __future__ import annotations

import torch

import shardkit
from shardkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor


def test_jagged_tensor_example():
    jt = JaggedTensor(torch.tensor([101, 202, 303]), lengths=torch.tensor([2, 0, 1]))
    assert jt.offsets().tolist() == [0, 2, 2, 3]
    assert [t.tolist() for t in jt.to_dense()] == [[101, 202], [], [303]]


def test_keyed_jagged_tensor_example():
    kjt = KeyedJaggedTensor(
        ["product", "user"],
        torch.tensor([101, 202, 303, 404, 505, 606]),
        lengths=torch.tensor([2, 0, 1, 1, 1, 1]),
    )
    assert kjt.offsets().tolist() == [0, 2, 2, 3, 4, 5, 6]
    assert kjt.stride() == 3 and kjt.length_per_key() == [3, 3]
    assert kjt.offset_per_key() == [0, 3, 6]
    vbe = KeyedJaggedTensor(
        ["a", "b"],
        torch.tensor([1, 2, 3]),
        lengths=torch.tensor([1, 0, 2]),
        stride_per_key_per_rank=[[1], [2]],
    )
    assert [t.tolist() for t in vbe["a"].to_dense()] == [[1]]
    assert [t.tolist() for t in vbe["b"].to_dense()] == [[], [2, 3]]
    assert vbe.stride_per_key() == [1, 2] and vbe.stride() == 2


def test_keyed_tensor_example():
    kt = KeyedTensor.from_tensor_list(
        ["product", "user"], [torch.tensor([[1, 1], [3, 3]]), torch.tensor([[2, 2, 2], [4, 4, 4]])]
    )
    assert kt.length_per_key() == [2, 3] and kt.offset_per_key() == [0, 2, 5]
    assert kt.values().tolist() == [[1, 1, 2, 2, 2], [3, 3, 4, 4, 4]]
    assert kt["user"].tolist() == [[2, 2, 2], [4, 4, 4]]


def test_torchrec_import_paths():
    from shardkit.sparse.jagged_tensor import KeyedJaggedTensor as FromTorchRecPath

    assert FromTorchRecPath is KeyedJaggedTensor is shardkit.KeyedJaggedTensor
