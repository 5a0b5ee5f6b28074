"""The independent reference: a batch as a plain table ``{key: [bag, bag, ...]}`` of Python ints.

Expected values, lengths, offsets and per-key metadata are computed here with list arithmetic
only (no torch, no shardkit), so tests compare shardkit against something it cannot share a bug
with. ``read_table`` goes the other way, from a KJT back to a table, using only ``tolist()``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from shardkit.sparse import KeyedJaggedTensor

Table = dict[str, list[list[int]]]

# The grid every KJT test runs over. Keys map to bags; a key's number of bags is its batch size.
TABLES: dict[str, Table] = {
    "seed002": {"product": [[101, 202], [], [303]], "user": [[404], [505], [606]]},
    "batch_size_1": {"a": [[1]], "b": [[2, 3]], "c": [[]]},
    "key_without_ids": {"a": [[1], [2]], "none": [[], []], "c": [[3, 4], []]},
    "only_empty_bags": {"a": [[], []], "b": [[], []]},
    "one_key": {"only": [[5, 6, 7], [8]]},
}
# Different batch size per key (VBE): key -> bags, and how those bags came from 2 ranks.
VBE_TABLES: dict[str, tuple[Table, list[list[int]]]] = {
    "vbe": ({"a": [[1]], "b": [[2, 3], [], [4]], "c": [[5], [6]]}, [[1, 0], [2, 1], [1, 1]]),
    "vbe_empty_key": ({"a": [[7, 8]], "b": []}, [[1, 0], [0, 0]]),
}


@dataclass(frozen=True)
class Flat:
    keys: list[str]
    values: list[int]
    lengths: list[int]
    offsets: list[int]
    stride_per_key: list[int]
    length_per_key: list[int]
    offset_per_key: list[int]
    lengths_offset_per_key: list[int]


def flatten(table: Table) -> Flat:
    keys = list(table)
    bags = [bag for key in keys for bag in table[key]]
    lengths = [len(bag) for bag in bags]
    length_per_key = [sum(len(bag) for bag in table[key]) for key in keys]
    stride_per_key = [len(table[key]) for key in keys]
    return Flat(
        keys=keys,
        values=[v for bag in bags for v in bag],
        lengths=lengths,
        offsets=list(itertools.accumulate(lengths, initial=0)),
        stride_per_key=stride_per_key,
        length_per_key=length_per_key,
        offset_per_key=list(itertools.accumulate(length_per_key, initial=0)),
        lengths_offset_per_key=list(itertools.accumulate(stride_per_key, initial=0)),
    )


def weight_of(value: int) -> float:
    """Every id's weight is a function of the id, so tests know the weights of any output."""
    return value / 8 + 0.25  # exact in float32 for the ids used here


def make_kjt(
    table: Table,
    *,
    weighted: bool = False,
    dtype: torch.dtype = torch.int64,
    use_offsets: bool = False,
    stride_per_key_per_rank: list[list[int]] | None = None,
) -> KeyedJaggedTensor:
    flat = flatten(table)
    bag_sizes = flat.offsets if use_offsets else flat.lengths
    return KeyedJaggedTensor(
        keys=flat.keys,
        values=torch.tensor(flat.values, dtype=dtype),
        weights=torch.tensor([weight_of(v) for v in flat.values]) if weighted else None,
        **{"offsets" if use_offsets else "lengths": torch.tensor(bag_sizes, dtype=dtype)},
        stride_per_key_per_rank=stride_per_key_per_rank,
    )


def read_bags(kjt: KeyedJaggedTensor) -> list[tuple[str, list[list[int]]]]:
    """(key, bags) pairs read from the raw tensors, not from the per-key metadata; keys may
    repeat (after `permute`). Checks on the way that every weight is ``weight_of`` its id."""
    values, lengths = kjt.values().tolist(), kjt.lengths().tolist()
    weights = None if kjt.weights_or_none() is None else kjt.weights().tolist()
    out, position, bag = [], 0, 0
    for key, stride in zip(kjt.keys(), kjt.stride_per_key()):
        bags = []
        for _ in range(stride):
            end = position + lengths[bag]
            bags.append(values[position:end])
            if weights is not None:
                assert weights[position:end] == [weight_of(v) for v in values[position:end]]
            position, bag = end, bag + 1
        out.append((key, bags))
    assert position == len(values) and bag == len(lengths)
    return out


def read_table(kjt: KeyedJaggedTensor) -> Table:
    pairs = read_bags(kjt)
    assert len({key for key, _ in pairs}) == len(pairs), "repeated keys: use read_bags"
    return dict(pairs)


def assert_metadata(kjt: KeyedJaggedTensor, flat: Flat) -> None:
    """Every host-side list of the KJT equals the reference."""
    assert kjt.keys() == flat.keys
    assert kjt.stride_per_key() == flat.stride_per_key
    assert kjt.length_per_key() == flat.length_per_key
    assert kjt.offset_per_key() == flat.offset_per_key
    assert kjt.lengths_offset_per_key() == flat.lengths_offset_per_key
    assert kjt.lengths().tolist() == flat.lengths
    assert kjt.offsets().tolist() == flat.offsets
    assert kjt.values().tolist() == flat.values
