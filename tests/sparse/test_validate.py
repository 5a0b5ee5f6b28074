"""validate(): the data-dependent checks, each message pinned with the key and numbers it names.

Every broken input here passes its constructor (which reads no data) and fails validate().
"""

from __future__ import annotations

import re

import pytest
import torch

from shardkit.sparse import JaggedTensor, KeyedJaggedTensor
from tests.sparse.tables import TABLES, VBE_TABLES, make_kjt

KEYS = ["product", "user"]
VALUES = torch.tensor([101, 202, 303, 404, 505, 606])


def kjt(**overrides):
    args = {"keys": KEYS, "values": VALUES, "lengths": torch.tensor([2, 0, 1, 1, 1, 1])}
    args.update(overrides)
    return KeyedJaggedTensor(**args)


T = torch.tensor
V = "KeyedJaggedTensor.validate: "
KJT_CASES = [
    ("negative_length", lambda: kjt(lengths=T([2, 0, 1, 1, 3, -1])),
     V + "key 'user': lengths[5] = -1 is negative; a bag holds 0 or more ids"),
    ("offsets_start", lambda: kjt(lengths=None, offsets=T([1, 2, 2, 3, 4, 5, 6])),
     V + "offsets start at 1, not 0; offsets[i] is where bag i starts in values, so the first is 0"),
    ("offsets_go_down", lambda: kjt(lengths=None, offsets=T([0, 2, 2, 3, 5, 4, 6])),
     V + "key 'user': offsets go down from offsets[4] = 5 to offsets[5] = 4; offsets must be "
     "non-decreasing"),
    ("lengths_vs_offsets_per_key", lambda: kjt(lengths=T([2, 0, 1, 2, 1, 1]),
                                               offsets=T([0, 2, 2, 3, 4, 5, 6])),
     V + "key 'user': lengths sum to 4 but offsets say 3; every description of key 'user''s "
     "bags must agree"),
    ("lengths_vs_offsets_per_bag", lambda: kjt(lengths=T([2, 0, 1, 2, 0, 1]),
                                               offsets=T([0, 2, 2, 3, 4, 5, 6])),
     V + "key 'user': lengths[3] = 2 but offsets[4] - offsets[3] = 1; pass lengths and offsets "
     "of the same bags, or only one of them"),
    ("length_per_key", lambda: kjt(length_per_key=[4, 2]),
     V + "key 'product': lengths sum to 3 but length_per_key says 4"),
    ("offsets_vs_length_per_key", lambda: kjt(lengths=None, offsets=T([0, 2, 2, 3, 4, 5, 6]),
                                              length_per_key=[2, 4]),
     V + "key 'product': offsets say 3 but length_per_key says 2"),
    ("lengths_total", lambda: kjt(lengths=T([2, 0, 1, 1, 1, 2])),
     V + "lengths sum to 7 (per key: {'product': 3, 'user': 4}) but values have 6 entries; each "
     "id belongs to exactly one bag, so sum(lengths) must equal len(values)"),
    ("offsets_total", lambda: kjt(lengths=None, offsets=T([0, 2, 2, 3, 4, 5, 5])),
     V + "offsets end at 5 (per key: {'product': 3, 'user': 2}) but values have 6 entries; the "
     "last offset must equal len(values)"),
    ("vbe_negative", lambda: kjt(lengths=T([3, 0, 1, 1, 2, -1]), stride_per_key_per_rank=[[1, 1], [3, 1]]),
     V + "key 'user': lengths[5] = -1 is negative"),
    ("vbe_total", lambda: kjt(lengths=T([3, 0, 1, 1, 2, 0]), stride_per_key_per_rank=[[1, 1], [3, 1]]),
     V + "lengths sum to 7 (per key: {'product': 3, 'user': 4}) but values have 6 entries"),
    ("inverse_range", lambda: kjt(lengths=T([3, 3]), stride_per_key_per_rank=[[1], [1]],
                                  inverse_indices=(KEYS, T([[0, 0, 0], [0, 1, 0]]))),
     V + "key 'user': inverse_indices[1][1] = 1 is not one of the key's 1 bags; each entry of "
     "row 1 must be in [0, 1)"),
]  # fmt: skip


@pytest.mark.parametrize("build, message", [pytest.param(*c[1:], id=c[0]) for c in KJT_CASES])
def test_kjt_validate_names_the_key_and_numbers(build, message):
    broken = build()  # the constructor reads no data, so it accepts all of these
    with pytest.raises(ValueError, match=re.escape(message)):
        broken.validate()


J = "JaggedTensor.validate: "
JT_CASES = [
    ("negative", lambda: JaggedTensor(VALUES[:3], lengths=T([4, -1, 0])),
     J + "lengths[1] = -1 is negative; a bag holds 0 or more ids"),
    ("offsets_start", lambda: JaggedTensor(VALUES[:3], offsets=T([2, 3])),
     J + "offsets start at 2, not 0"),
    ("offsets_go_down", lambda: JaggedTensor(VALUES[:3], offsets=T([0, 2, 1, 3])),
     J + "offsets go down from offsets[1] = 2 to offsets[2] = 1"),
    ("mismatch", lambda: JaggedTensor(VALUES[:3], lengths=T([1, 2]), offsets=T([0, 2, 3])),
     J + "lengths[0] = 1 but offsets[1] - offsets[0] = 2"),
    ("lengths_total", lambda: JaggedTensor(VALUES[:3], lengths=T([1, 1])),
     J + "lengths sum to 2 but values have 3 entries"),
    ("offsets_total", lambda: JaggedTensor(VALUES[:3], offsets=T([0, 1, 4])),
     J + "offsets end at 4 but values have 3 entries; the last offset must equal len(values)"),
]  # fmt: skip


@pytest.mark.parametrize("build, message", [pytest.param(*c[1:], id=c[0]) for c in JT_CASES])
def test_jt_validate_names_the_numbers(build, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build().validate()


@pytest.mark.parametrize("name", sorted(TABLES))
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("use_offsets", [False, True])
def test_valid_kjts_pass(name, weighted, use_offsets):
    kjt = make_kjt(TABLES[name], weighted=weighted, use_offsets=use_offsets)
    assert kjt.validate() is kjt
    both = KeyedJaggedTensor(kjt.keys(), kjt.values(), kjt.weights_or_none(),
                             lengths=kjt.lengths(), offsets=kjt.offsets())  # fmt: skip
    assert both.sync().validate() is both
    for part in [*kjt.split([1, len(kjt.keys()) - 1]), kjt.permute([0, 0])]:
        assert part.validate() is part


@pytest.mark.parametrize("name", sorted(VBE_TABLES))
def test_valid_vbe_kjts_pass(name):
    table, strides = VBE_TABLES[name]
    kjt = make_kjt(table, weighted=True, stride_per_key_per_rank=strides)
    assert kjt.validate().permute([1, 0]).validate().to_dict()


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("use_offsets", [False, True])
def test_validate_leaves_length_per_key_computed(dtype, use_offsets):
    # validate() counts each key's ids anyway; the module's length_per_key() then reuses them
    vbe_table, strides = VBE_TABLES[sorted(VBE_TABLES)[0]]
    cases = [(TABLES[name], None) for name in sorted(TABLES)] + [(vbe_table, strides)]
    for table, vbe in cases:
        case = make_kjt(table, dtype=dtype, use_offsets=use_offsets, stride_per_key_per_rank=vbe)
        expected = make_kjt(table, dtype=dtype, stride_per_key_per_rank=vbe).length_per_key()
        assert case.length_per_key_or_none() is None
        assert case.validate().length_per_key_or_none() == expected
    given = kjt(length_per_key=[3, 3])
    assert given.validate().length_per_key_or_none() == [3, 3]
