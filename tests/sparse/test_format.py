"""Printed forms: the strings are TorchRec 1.8's output for the same inputs, pinned verbatim."""

from __future__ import annotations

import torch

from shardkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

SEED_002 = (
    "KeyedJaggedTensor({\n"
    '    "product": [[101, 202], [], [303]],\n'
    '    "user": [[404], [505], [606]]\n'
    "})\n"
)


def _seed_002() -> KeyedJaggedTensor:
    return KeyedJaggedTensor(
        keys=["product", "user"],
        values=torch.tensor([101, 202, 303, 404, 505, 606]),
        lengths=torch.tensor([2, 0, 1, 1, 1, 1], dtype=torch.int64),
    )


def test_seed_002_prints_like_torchrec():
    assert str(_seed_002()) == SEED_002
    assert str(_seed_002().to(torch.device("cpu"))) == SEED_002
    from_offsets = KeyedJaggedTensor(
        ["product", "user"],
        torch.tensor([101, 202, 303, 404, 505, 606], dtype=torch.int32),
        offsets=torch.tensor([0, 2, 2, 3, 4, 5, 6], dtype=torch.int32),
    )
    assert str(from_offsets) == SEED_002


def test_weighted_kjt_prints_values_and_weights_per_key():
    kjt = KeyedJaggedTensor(
        keys=["a", "b"],
        values=torch.tensor([1, 2, 3, 4, 5]),
        weights=torch.tensor([0.5, 1.0, 1.5, 2.0, 2.5]),
        lengths=torch.tensor([1, 1, 0, 3]),
    )
    assert str(kjt) == (
        "KeyedJaggedTensor({\n"
        '    "a": {\n'
        '        "values": [[1], [2]],\n'
        '        "weights": [[0.5], [1.0]]\n'
        "    },\n"
        '    "b": {\n'
        '        "values": [[], [3, 4, 5]],\n'
        '        "weights": [[], [1.5, 2.0, 2.5]]\n'
        "    }\n"
        "})\n"
    )


def test_vbe_kjt_prints_each_keys_own_batch():
    kjt = KeyedJaggedTensor(
        keys=["a", "b"],
        values=torch.tensor([1, 2, 3, 4, 5, 6]),
        lengths=torch.tensor([1, 2, 1, 1, 1]),
        stride_per_key_per_rank=[[1, 1], [2, 1]],
    )
    assert (
        str(kjt) == 'KeyedJaggedTensor({\n    "a": [[1], [2, 3]],\n    "b": [[4], [5], [6]]\n})\n'
    )


def test_empty_forms():
    assert str(KeyedJaggedTensor.empty()) == "KeyedJaggedTensor()\n"
    assert str(_seed_002().split([0, 2])[0]) == "KeyedJaggedTensor()\n"
    assert str(KeyedTensor([], [], torch.empty(2, 0))) == "KeyedTensor()\n"
    assert str(JaggedTensor.empty()) == "JaggedTensor({\n    []\n})\n"


def test_jagged_tensor_prints_like_torchrec():
    jt = JaggedTensor(values=torch.tensor([1.0, 2, 3]), lengths=torch.tensor([2, 0, 1]))
    assert str(jt) == "JaggedTensor({\n    [[1.0, 2.0], [], [3.0]]\n})\n"
    weighted = JaggedTensor(
        values=torch.tensor([1.0, 2, 3, 4]),
        weights=torch.tensor([0.1, 0.2, 0.3, 0.4]),
        offsets=torch.tensor([0, 2, 2, 4]),
    )
    assert str(weighted) == (
        "JaggedTensor({\n"
        '    "values": [[1.0, 2.0], [], [3.0, 4.0]],\n'
        '    "weights": [[0.10000000149011612, 0.20000000298023224], [], '
        "[0.30000001192092896, 0.4000000059604645]]\n"
        "})\n"
    )
    rows = JaggedTensor(torch.tensor([[1.0, 2], [3, 4], [5, 6]]), lengths=torch.tensor([1, 2]))
    assert str(rows) == "JaggedTensor({\n    [[[1.0, 2.0]], [[3.0, 4.0], [5.0, 6.0]]]\n})\n"


def test_keyed_tensor_prints_like_torchrec():
    kt = KeyedTensor.from_tensor_list(["a", "b"], [torch.ones(2, 2), torch.zeros(2, 1)])
    assert (
        str(kt)
        == 'KeyedTensor({\n    "a": [[1.0, 1.0], [1.0, 1.0]],\n    "b": [[0.0], [0.0]]\n})\n'
    )


def test_reprs_show_structure_not_data():
    kjt = _seed_002()
    assert repr(kjt) == (
        "KeyedJaggedTensor(keys=['product', 'user'], stride=3, values=int64[6], weights=None, "
        "lengths=int64[6])"
    )
    vbe = KeyedJaggedTensor(["a"], torch.tensor([1]), lengths=torch.tensor([1]),
                            stride_per_key_per_rank=[[1, 0]])  # fmt: skip
    assert repr(vbe) == (
        "KeyedJaggedTensor(keys=['a'], stride_per_key_per_rank=[[1, 0]], values=int64[1], "
        "weights=None, lengths=int64[1])"
    )
    jt = JaggedTensor(torch.tensor([1.0]), torch.tensor([0.5]), offsets=torch.tensor([0, 1]))
    assert repr(jt) == "JaggedTensor(values=float32[1], weights=float32[1], offsets=int64[2])"
    kt = KeyedTensor(["a"], [2], torch.zeros(3, 2))
    assert (
        repr(kt) == "KeyedTensor(keys=['a'], length_per_key=[2], key_dim=1, values=float32[3, 2])"
    )
