"""Batches with a batch size per feature (VBE) and the plain batches they stand for."""

from __future__ import annotations

import torch

from shardkit import KeyedJaggedTensor
from tests.sharding.common import FEATURES, LIMITS


def kjt_of(bags: dict, *, strides=None, inverse_indices=None) -> KeyedJaggedTensor:
    """The KJT of ``{key: [ids [n]] per bag}`` in FEATURES order."""
    return KeyedJaggedTensor(
        keys=FEATURES,
        values=torch.cat([b for k in FEATURES for b in bags[k]]),
        lengths=torch.tensor([len(b) for k in FEATURES for b in bags[k]]),
        stride_per_key_per_rank=strides,
        inverse_indices=inverse_indices,
    )


def vbe_batch(seed: int, size: int, *, unique: dict | None = None, unused: bool = False):
    """``(vbe, plain bags)``: feature "a" (and "c") deduplicated to ``unique`` bags that the
    ``size`` examples share through ``inverse_indices``; the plain bags give every example its
    own copy, built in Python (independently of the code under test). ``unused``: no example
    picks "a"'s last bag (ids 2 and 5), where "a" has more than one."""
    unique = unique if unique is not None else {"a": 2, "c": 1}
    g = torch.Generator().manual_seed(seed)
    bags, inverse = {}, []
    for key in FEATURES:
        count = unique.get(key, size)
        lengths = torch.randint(0, 4, (count,), generator=g).tolist()
        bags[key] = [torch.randint(0, LIMITS[key], (n,), generator=g) for n in lengths]
        shared = key in unique
        if unused and key == "a" and count > 1:
            bags[key][-1] = torch.tensor([2, 5])
            count -= 1
        inverse.append(
            torch.randint(0, count, (size,), generator=g) if shared else torch.arange(size)
        )
    bags["a"][0] = torch.tensor([1, 1, 3])  # a repeated id in a deduplicated bag
    bags["b"][0] = torch.tensor([], dtype=torch.int64)  # an empty bag
    index = torch.stack(inverse)
    vbe = kjt_of(
        bags, strides=[[len(bags[k])] for k in FEATURES], inverse_indices=(FEATURES, index)
    )
    plain = {k: [bags[k][i] for i in index[f].tolist()] for f, k in enumerate(FEATURES)}
    return vbe, plain
