"""A KJT's values are ids, row numbers: any integer dtype works, anything else is refused with
its dtype (and key, where known) instead of being truncated to a row (issue 14, item 2)."""

from __future__ import annotations

import re

import pytest
import torch

from shardkit.sparse import JaggedTensor, KeyedJaggedTensor

KEYS = ["product", "user"]
LENGTHS = torch.tensor([1, 0, 0, 1])
NOT_IDS = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.bool]
IDS = [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]


def _message(dtype: torch.dtype, key: str = "") -> str:
    return re.escape(
        f"{key}values must have an integer dtype (int32 or int64), got {dtype}; ids are row "
        "numbers, and a lookup would silently truncate a float id (1.7 -> row 1). Pass integer "
        "ids, e.g. values.long() if they are whole numbers"
    )


@pytest.mark.parametrize("dtype", NOT_IDS, ids=str)
def test_the_constructors_refuse_ids_that_are_not_integers(dtype):
    values = torch.tensor([1.7, 2.2]).to(dtype)
    with pytest.raises(TypeError, match="^KeyedJaggedTensor: " + _message(dtype)):
        KeyedJaggedTensor(KEYS, values, lengths=LENGTHS)
    with pytest.raises(TypeError, match=_message(dtype)):
        KeyedJaggedTensor.from_lengths_sync(KEYS, values, LENGTHS)
    with pytest.raises(TypeError, match=_message(dtype)):
        KeyedJaggedTensor.from_offsets_sync(KEYS, values, torch.tensor([0, 1, 1, 1, 2]))


def test_from_jt_dict_names_the_key_whose_ids_are_floats():
    jt_dict = {
        "product": JaggedTensor(torch.tensor([3]), lengths=torch.tensor([1, 0])),
        "user": JaggedTensor(torch.tensor([1.7, 2.2]), lengths=torch.tensor([0, 2])),
    }
    prefix = re.escape("KeyedJaggedTensor.from_jt_dict: key 'user': ")
    with pytest.raises(TypeError, match="^" + prefix + _message(torch.float32)):
        KeyedJaggedTensor.from_jt_dict(jt_dict)


@pytest.mark.parametrize("dtype", IDS, ids=str)
def test_every_integer_dtype_is_accepted_and_kept(dtype):
    kjt = KeyedJaggedTensor(KEYS, torch.tensor([3, 4], dtype=dtype), lengths=LENGTHS)
    assert kjt.validate().values().dtype == dtype
    assert kjt.permute([1, 0]).values().tolist() == [4, 3]
    assert KeyedJaggedTensor.from_jt_dict(kjt.to_dict()).values().dtype == dtype


def test_empty_values_of_any_dtype_hold_no_id_and_pass():
    # torch.tensor([]) is float32; so are the values of TorchRec's KeyedJaggedTensor.empty()
    no_ids = KeyedJaggedTensor(KEYS, torch.tensor([]), lengths=torch.zeros(4, dtype=torch.int64))
    assert no_ids.validate().length_per_key() == [0, 0]
    assert KeyedJaggedTensor.empty().values().dtype == torch.float32


def test_empty_float_values_do_not_turn_ids_into_floats():
    """torch.cat promotes int64 ids next to an empty float32 tensor to float32; ids above 2**24
    would then lose their last bits."""
    big = 2**24 + 1  # not a float32
    no_ids = KeyedJaggedTensor(["a"], torch.tensor([]), lengths=torch.zeros(2, dtype=torch.int64))
    ids = KeyedJaggedTensor(["b"], torch.tensor([big]), lengths=torch.tensor([1, 0]))
    joined = KeyedJaggedTensor.concat([no_ids, ids])
    assert joined.values().dtype == torch.int64 and joined.values().tolist() == [big]
    from_dict = KeyedJaggedTensor.from_jt_dict({**no_ids.to_dict(), **ids.to_dict()})
    assert from_dict.values().dtype == torch.int64 and from_dict.values().tolist() == [big]
