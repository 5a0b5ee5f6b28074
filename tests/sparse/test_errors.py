"""Every error the constructors and ops raise: the value, the rule and the fix, pinned.

Constructors check only what is free (see test_validate.py for the data checks).
"""

from __future__ import annotations

import re

import pytest
import torch

from shardkit.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from tests.sparse.tables import TABLES, make_kjt

V6 = torch.tensor([101, 202, 303, 404, 505, 606])
L6 = torch.tensor([2, 0, 1, 1, 1, 1])
KEYS = ["product", "user"]


def kjt(**overrides):
    args = {"keys": KEYS, "values": V6, "lengths": L6, **overrides}
    return KeyedJaggedTensor(**args)


def _raises(kind, message):
    return pytest.raises(kind, match=re.escape(message))


# (id, call, error type, pinned message)
KJT_CONSTRUCTOR = [
    ("keys_str", lambda: kjt(keys="product"), TypeError,
     "KeyedJaggedTensor: keys must be a list of str, got str 'product'; pass e.g. keys=['product']"),
    ("keys_int", lambda: kjt(keys=["product", 3]), TypeError,
     "keys must be a list of str, got 3 (int) in ['product', 3]; name each feature with a string"),
    ("keys_repeated", lambda: kjt(keys=["user", "user"]), ValueError,
     "keys must be unique, got ['user'] more than once in ['user', 'user']; use permute()"),
    ("values_list", lambda: kjt(values=[1, 2]), TypeError,
     "KeyedJaggedTensor: values must be a torch.Tensor, got list"),
    ("values_2d", lambda: kjt(values=V6.view(2, 3)), ValueError,
     "values must be 1-D, got shape (2, 3); values hold the ids of all bags one after another"),
    ("weights_list", lambda: kjt(weights=[1.0]), TypeError,
     "weights must be a torch.Tensor, got list"),
    ("weights_int", lambda: kjt(weights=V6), TypeError,
     "weights must have a floating dtype, got torch.int64; use weights.float()"),
    ("weights_short", lambda: kjt(weights=torch.ones(5)), ValueError,
     "weights have shape (5,) but values have 6 entries; give exactly one weight per id"),
    ("no_lengths", lambda: kjt(lengths=None), ValueError,
     "needs lengths or offsets to know where each bag starts, got neither"),
    ("lengths_list", lambda: kjt(lengths=[2, 0]), TypeError,
     "lengths must be a torch.Tensor, got list"),
    ("lengths_2d", lambda: kjt(lengths=L6.view(2, 3)), ValueError,
     "lengths must be a 1-D tensor, got shape (2, 3); flatten it key-major"),
    ("lengths_float", lambda: kjt(lengths=L6.float()), TypeError,
     "lengths must have an integer dtype, got torch.float32; use lengths.to(torch.int32)"),
    ("offsets_bool", lambda: kjt(lengths=None, offsets=torch.ones(7, dtype=torch.bool)), TypeError,
     "offsets must have an integer dtype, got torch.bool"),
    ("both_sizes", lambda: kjt(offsets=torch.arange(6)), ValueError,
     "offsets have 6 entries and lengths 6; offsets must have one more entry than lengths"),
    ("not_divisible", lambda: kjt(keys=["a", "b", "c", "d"]), ValueError,
     "lengths have 6 entries, which does not split evenly over 4 keys; lengths hold one entry "
     "per (key, example), key-major, so their number is len(keys) x batch size"),
    ("offsets_not_divisible", lambda: kjt(keys=["a", "b", "c", "d"], lengths=None,
                                          offsets=torch.arange(7)), ValueError,
     "offsets describe 6 bags (7 entries), which does not split evenly over 4 keys"),
    ("no_keys_with_bags", lambda: kjt(keys=[]), ValueError,
     "lengths have 6 entries, which does not split evenly over 0 keys"),
    ("stride", lambda: kjt(stride=2), ValueError,
     "stride 2 x 2 keys = 4 bags but lengths have 6 entries"),
    ("stride_negative", lambda: kjt(stride=-3), ValueError,
     "stride must be integers >= 0, got [-3]"),
    ("vbe_entries", lambda: kjt(stride_per_key_per_rank=[[3]]), ValueError,
     "stride_per_key_per_rank has 1 entries for 2 keys; give one list of per-rank batch sizes"),
    ("vbe_count", lambda: kjt(stride_per_key_per_rank=[[2, 1], [2, 2]]), ValueError,
     "stride_per_key_per_rank [[2, 1], [2, 2]] describes 7 bags but lengths have 6 entries"),
    ("vbe_negative", lambda: kjt(stride_per_key_per_rank=[[7, -1], [0]]), ValueError,
     "stride_per_key_per_rank must be integers >= 0, got [7, -1]"),
    ("vbe_stride_per_key", lambda: kjt(stride_per_key_per_rank=[[2], [4]], stride_per_key=[3, 3]),
     ValueError, "stride_per_key [3, 3] does not match stride_per_key_per_rank [[2], [4]]"),
    ("stride_per_key_uneven", lambda: kjt(stride_per_key=[2, 4]), ValueError,
     "stride_per_key [2, 4] does not fit 2 keys when lengths have 6 entries; without "
     "stride_per_key_per_rank every key has the same batch size"),
    ("length_per_key_sum", lambda: kjt(length_per_key=[3, 4]), ValueError,
     "length_per_key [3, 4] has 2 entries summing to 7, but there are 2 keys and 6 values"),
    ("offset_per_key_cumsum", lambda: kjt(length_per_key=[3, 3], offset_per_key=[0, 2, 6]),
     ValueError, "offset_per_key [0, 2, 6] is not the cumulative sum of length_per_key [3, 3] "
     "([0, 3, 6])"),
    ("offset_per_key_end", lambda: kjt(offset_per_key=[0, 3]), ValueError,
     "offset_per_key [0, 3] must have 3 entries (one per key, then the end) and end at 6"),
    ("lengths_offset_per_key", lambda: kjt(lengths_offset_per_key=[0, 3, 5]), ValueError,
     "lengths_offset_per_key [0, 3, 5] must have 3 entries (one per key, then the end) and end at 6"),
    ("inverse_type", lambda: kjt(inverse_indices=[KEYS, torch.zeros(2, 3)]), TypeError,
     "inverse_indices must be a tuple (keys, tensor), got list"),
    ("inverse_shape", lambda: kjt(inverse_indices=(KEYS, torch.zeros(3, dtype=torch.int64))),
     ValueError, "inverse_indices tensor has shape (3,) for 2 keys; it must be [len(keys), "
     "batch size]"),
    ("inverse_dtype", lambda: kjt(inverse_indices=(KEYS, torch.zeros(2, 3))), TypeError,
     "inverse_indices tensor must have an integer dtype, got torch.float32"),
]  # fmt: skip


@pytest.mark.parametrize(
    "call, kind, message", [pytest.param(*case[1:], id=case[0]) for case in KJT_CONSTRUCTOR]
)
def test_kjt_constructor_errors(call, kind, message):
    with _raises(kind, message):
        call()


def test_empty_float_lengths_are_accepted_as_int32():
    empty = KeyedJaggedTensor([], torch.tensor([]), lengths=torch.tensor([]))
    assert empty.lengths().dtype == torch.int32


OPS = [
    ("weights_missing", lambda: make_kjt(TABLES["seed002"]).weights(), ValueError,
     "KeyedJaggedTensor has no weights; build it with weights=..., or call weights_or_none()"),
    ("inverse_missing", lambda: make_kjt(TABLES["seed002"]).inverse_indices(), ValueError,
     "KeyedJaggedTensor has no inverse_indices; pass inverse_indices=(keys, tensor)"),
    ("getitem", lambda: make_kjt(TABLES["seed002"])["ads"], KeyError,
     "'ads' is not a key of this KeyedJaggedTensor; its keys are ['product', 'user']"),
    ("split_too_many", lambda: make_kjt(TABLES["seed002"]).split([1, 2]), ValueError,
     "KeyedJaggedTensor.split: segments [1, 2] take 3 keys but there are 2 (['product', 'user'])"),
    ("split_negative", lambda: make_kjt(TABLES["seed002"]).split([3, -1]), ValueError,
     "KeyedJaggedTensor.split: segments must be integers >= 0, got [3, -1]"),
    ("permute_range", lambda: make_kjt(TABLES["seed002"]).permute([1, 2]), ValueError,
     "KeyedJaggedTensor.permute: indices [1, 2] include 2, which is not a key position; this KJT "
     "has 2 keys, so each index must be in [0, 2)"),
    ("concat_empty", lambda: KeyedJaggedTensor.concat([]), ValueError,
     "KeyedJaggedTensor.concat: got no KeyedJaggedTensors; pass a non-empty list"),
    ("concat_weighted", lambda: KeyedJaggedTensor.concat(
        [make_kjt({"a": [[1]]}), make_kjt({"b": [[2]]}, weighted=True)]), ValueError,
     "KeyedJaggedTensor.concat: the KJTs differ in being weighted ([False, True], in list order)"),
    ("concat_stride", lambda: KeyedJaggedTensor.concat(
        [make_kjt({"a": [[1]]}), make_kjt({"b": [[2], []]})]), ValueError,
     "the KJTs differ in stride (batch size) ([1, 2], in list order)"),
    ("concat_vbe", lambda: KeyedJaggedTensor.concat(
        [make_kjt({"a": [[1]]}), make_kjt({"b": [[2]]}, stride_per_key_per_rank=[[1]])]),
     ValueError, "the KJTs differ in variable batch size per key ([False, True], in list order)"),
    ("concat_inverse", lambda: KeyedJaggedTensor.concat(
        [KeyedJaggedTensor(["a"], V6[:1], lengths=L6[2:3],
                           inverse_indices=(["a"], torch.zeros(1, 1, dtype=torch.int64))),
         make_kjt({"b": [[2]]})]),
     ValueError, "the KJTs differ in having inverse_indices ([True, False], in list order)"),
    ("from_jt_dict_weighted", lambda: KeyedJaggedTensor.from_jt_dict({
        "a": JaggedTensor(V6[:1], torch.ones(1), lengths=L6[2:3]),
        "b": JaggedTensor(V6[:1], lengths=L6[2:3])}), ValueError,
     "KeyedJaggedTensor.from_jt_dict: keys ['a'] have weights but ['b'] do not; give every "
     "JaggedTensor weights, or none"),
    ("jt_weights_missing", lambda: JaggedTensor(V6, lengths=L6).weights(), ValueError,
     "JaggedTensor has no weights; build it with weights=..., or call weights_or_none()"),
    ("jt_no_lengths", lambda: JaggedTensor(V6), ValueError,
     "JaggedTensor: needs lengths or offsets to know where each bag starts, got neither"),
    ("jt_values_0d", lambda: JaggedTensor(torch.tensor(1), lengths=L6), ValueError,
     "JaggedTensor: values must be at least 1-D, got shape ()"),
    ("jt_from_dense_weights", lambda: JaggedTensor.from_dense([V6], weights=[]), ValueError,
     "JaggedTensor.from_dense: 1 value tensors but 0 weight tensors; give one weight tensor per bag"),
    ("jt_from_dense_lengths", lambda: JaggedTensor.from_dense_lengths(V6, L6), ValueError,
     "JaggedTensor.from_dense_lengths: values have shape (6,) and lengths (6,); values must be "
     "[B, L, *] padded rows and lengths [B], one entry per row"),
    ("jt_padded_negative", lambda: JaggedTensor(V6, lengths=L6).to_padded_dense(-1), ValueError,
     "JaggedTensor.to_padded_dense: desired_length is -1; it must be >= 0 (or None for the "
     "longest bag)"),
]  # fmt: skip


@pytest.mark.parametrize("call, kind, message", [pytest.param(*c[1:], id=c[0]) for c in OPS])
def test_op_errors(call, kind, message):
    with _raises(kind, message):
        call()


def _kts():
    return [KeyedTensor(["a", "b"], [1, 2], torch.zeros(2, 3)), KeyedTensor(["c"], [1], torch.zeros(2, 1))]  # fmt: skip


KEYED = [
    ("values_list", lambda: KeyedTensor(["a"], [1], [[1.0]]), TypeError,
     "KeyedTensor: values must be a torch.Tensor, got list"),
    ("key_dim", lambda: KeyedTensor(["a"], [1], torch.zeros(2, 1), key_dim=2), ValueError,
     "KeyedTensor: key_dim 2 is not a dimension of values with shape (2, 1); pass key_dim in [0, 2)"),
    ("lengths", lambda: KeyedTensor(["a", "b"], [1, 1], torch.zeros(2, 3)), ValueError,
     "KeyedTensor: length_per_key [1, 1] for keys ['a', 'b'] must have one entry per key summing "
     "to values.shape[1] = 3"),
    ("lengths_negative", lambda: KeyedTensor(["a"], [-1], torch.zeros(2, 1)), ValueError,
     "KeyedTensor: length_per_key must be integers >= 0, got [-1]"),
    ("keys_repeated", lambda: KeyedTensor(["a", "a"], [1, 1], torch.zeros(2, 2)), ValueError,
     "KeyedTensor: keys must be unique, got ['a'] more than once in ['a', 'a']"),
    ("from_tensor_list", lambda: KeyedTensor.from_tensor_list(["a", "b"], [torch.zeros(2, 1)]),
     ValueError, "KeyedTensor.from_tensor_list: 2 keys for 1 tensors; give one key per tensor"),
    ("getitem", lambda: _kts()[0]["z"], KeyError,
     "'z' is not a key of this KeyedTensor; its keys are ['a', 'b']"),
    ("regroup_none", lambda: KeyedTensor.regroup([], [["a"]]), ValueError,
     "KeyedTensor.regroup: got no KeyedTensors; pass at least one"),
    ("regroup_missing", lambda: KeyedTensor.regroup(_kts(), [["a", "x"], ["y"]]), ValueError,
     "KeyedTensor.regroup: groups name ['x', 'y'], which no KeyedTensor has; the keys are "
     "['a', 'b', 'c']"),
    ("regroup_key_dim", lambda: KeyedTensor.regroup(
        [_kts()[0], KeyedTensor(["c"], [2], torch.zeros(2, 1), key_dim=0)], [["a"]]), ValueError,
     "KeyedTensor.regroup: the KeyedTensors have key_dim [1, 0]; they must share one"),
    ("regroup_twice", lambda: KeyedTensor.regroup(
        [_kts()[0], KeyedTensor(["a"], [1], torch.zeros(2, 1))], [["a"]]), ValueError,
     "KeyedTensor.regroup: key 'a' is in more than one KeyedTensor (again in number 1); each key "
     "must come from exactly one"),
    ("regroup_as_dict", lambda: KeyedTensor.regroup_as_dict(_kts(), [["a"], ["c"]], ["g"]),
     ValueError, "KeyedTensor.regroup_as_dict: 2 groups but 1 keys ['g']; give one name per group"),
]  # fmt: skip


@pytest.mark.parametrize("call, kind, message", [pytest.param(*c[1:], id=c[0]) for c in KEYED])
def test_keyed_tensor_errors(call, kind, message):
    with _raises(kind, message):
        call()
