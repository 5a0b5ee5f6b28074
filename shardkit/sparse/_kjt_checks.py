"""The KeyedJaggedTensor's checks: the free ones its constructor runs, and ``validate()``.

The free checks (see [Note: free checks] in `_checks`) tie the host metadata together: how many
bags ``lengths``/``offsets`` describe against keys x stride, ``stride_per_key_per_rank`` (VBE) or
``stride_per_key``, and the per-key sizes against ``len(values)``. `validate_kjt` reads the data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from shardkit.sparse._checks import (
    check_keys,
    check_lengths_and_offsets,
    check_non_negative_ints,
    check_values_and_weights,
    is_index_dtype,
    num_rows,
)
from shardkit.sparse._segments import boundary_diffs, complete_cumsum, cumsum_list
from shardkit.sparse._validate import (
    check_bags,
    check_lengths_match_offsets,
    check_total,
    first_true,
)

if TYPE_CHECKING:
    from shardkit.sparse._kjt import KeyedJaggedTensor

__all__ = ["check_inverse_indices", "check_kjt", "validate_kjt"]

OWNER = "KeyedJaggedTensor"


def check_kjt(
    keys: Any,
    values: Any,
    weights: Any,
    lengths: Any,
    offsets: Any,
    stride: Any,
    stride_per_key_per_rank: Any,
    stride_per_key: Any,
    unique_keys: bool = True,
) -> tuple[list[str], Any, Any, int | None, list[list[int]] | None]:
    """The constructor's free checks; returns keys, lengths, offsets, stride and the VBE strides
    as plain Python values.

    Keys repeat only in what `permute` returns, so ``validate()`` passes ``unique_keys=False``.
    """
    keys = check_keys(OWNER, keys, unique=unique_keys)
    check_values_and_weights(OWNER, values, weights, values_dim=1)
    lengths, offsets = check_lengths_and_offsets(OWNER, lengths, offsets)
    if stride is not None:
        stride = check_non_negative_ints(OWNER, "stride", [stride])[0]
    strides = _stride_lists(keys, stride_per_key_per_rank)
    _check_bag_count(keys, lengths, offsets, stride, strides, stride_per_key)
    return keys, lengths, offsets, stride, strides


def _check_bag_count(
    keys: list[str],
    lengths: torch.Tensor | None,
    offsets: torch.Tensor | None,
    stride: int | None,
    strides: list[list[int]] | None,
    stride_per_key: Any,
) -> None:
    """The number of bags fits the batch description: VBE strides, stride_per_key, stride x
    keys, or (with none of them) a multiple of the number of keys."""
    num_bags = num_rows(lengths, offsets)
    if lengths is not None or offsets is None:
        described = f"lengths have {num_bags} entries"
    else:
        described = f"offsets describe {num_bags} bags ({offsets.numel()} entries)"
    if strides is not None:
        _check_vbe_count(strides, stride_per_key, num_bags, described)
    elif stride_per_key is not None:
        _check_stride_per_key(keys, stride_per_key, num_bags, described)
    elif stride is not None:
        if stride * len(keys) != num_bags:
            raise ValueError(
                f"{OWNER}: stride {stride} x {len(keys)} keys = {stride * len(keys)} bags but "
                f"{described}; lengths hold one entry per (key, example), key-major"
            )
    elif num_bags % max(len(keys), 1) or (not keys and num_bags):
        raise ValueError(
            f"{OWNER}: {described}, which does not split evenly over {len(keys)} keys; "
            "lengths hold one entry per (key, example), key-major, so their number is "
            "len(keys) x batch size (for a different batch size per key pass "
            "stride_per_key_per_rank)"
        )


def _stride_lists(keys: list[str], strides: Any) -> list[list[int]] | None:
    """``stride_per_key_per_rank`` as lists, one list of per-rank batch sizes per key."""
    if strides is None:
        return None
    if isinstance(strides, torch.Tensor):
        strides = strides.tolist() if strides.dim() == 2 else [[] for _ in keys]
    if not isinstance(strides, (list, tuple)) or len(strides) != len(keys):
        got = len(strides) if isinstance(strides, (list, tuple)) else type(strides).__name__
        raise ValueError(
            f"{OWNER}: stride_per_key_per_rank has {got} entries for {len(keys)} keys; give "
            "one list of per-rank batch sizes per key, e.g. [[2, 1], [3, 3]] for 2 keys, 2 ranks"
        )
    return [check_non_negative_ints(OWNER, "stride_per_key_per_rank", row) for row in strides]


def _check_vbe_count(
    strides: list[list[int]], stride_per_key: Any, num_bags: int, described: str
) -> None:
    expected = sum(sum(row) for row in strides)
    if expected != num_bags:
        raise ValueError(
            f"{OWNER}: stride_per_key_per_rank {strides} describes {expected} bags but "
            f"{described}; key k has sum(stride_per_key_per_rank[k]) bags"
        )
    if stride_per_key is not None and list(stride_per_key) != [sum(row) for row in strides]:
        raise ValueError(
            f"{OWNER}: stride_per_key {list(stride_per_key)} does not match "
            f"stride_per_key_per_rank {strides} (key k has sum(stride_per_key_per_rank[k]) "
            "bags); leave stride_per_key out to have it computed"
        )


def _check_stride_per_key(keys: list[str], stride_per_key: Any, num_bags: int, described: str):
    strides = check_non_negative_ints(OWNER, "stride_per_key", stride_per_key)
    if len(strides) != len(keys) or sum(strides) != num_bags or len(set(strides)) > 1:
        raise ValueError(
            f"{OWNER}: stride_per_key {strides} does not fit {len(keys)} keys when {described}; "
            "without stride_per_key_per_rank every key has the same batch size (for different "
            "ones pass stride_per_key_per_rank instead)"
        )


def check_per_key(
    keys: list[str],
    num_values: int,
    num_bags: int,
    length_per_key: Any,
    offset_per_key: Any,
    lengths_offset_per_key: Any,
) -> None:
    """Given per-key metadata has one entry per key and adds up to the tensors' sizes."""
    if length_per_key is not None:
        sizes = check_non_negative_ints(OWNER, "length_per_key", length_per_key)
        if len(sizes) != len(keys) or sum(sizes) != num_values:
            raise ValueError(
                f"{OWNER}: length_per_key {sizes} has {len(sizes)} entries summing to "
                f"{sum(sizes)}, but there are {len(keys)} keys and {num_values} values; give "
                "the number of ids of each key, or leave it out to have it computed"
            )
        if offset_per_key is not None and list(offset_per_key) != cumsum_list(sizes):
            raise ValueError(
                f"{OWNER}: offset_per_key {list(offset_per_key)} is not the cumulative sum of "
                f"length_per_key {sizes} ({cumsum_list(sizes)}); leave it out to have it computed"
            )
    for name, bounds, end in (
        ("offset_per_key", offset_per_key, num_values),
        ("lengths_offset_per_key", lengths_offset_per_key, num_bags),
    ):
        if bounds is not None and (len(bounds) != len(keys) + 1 or bounds[-1] != end):
            raise ValueError(
                f"{OWNER}: {name} {list(bounds)} must have {len(keys) + 1} entries (one per key, "
                f"then the end) and end at {end}; leave it out to have it computed"
            )


def check_inverse_indices(inverse_indices: Any) -> None:
    """``(keys, tensor)`` with an integer tensor ``[len(keys), B]`` (or an empty tensor)."""
    if inverse_indices is None:
        return
    if (
        not isinstance(inverse_indices, tuple)
        or len(inverse_indices) != 2
        or not isinstance(inverse_indices[1], torch.Tensor)
    ):
        raise TypeError(
            f"{OWNER}: inverse_indices must be a tuple (keys, tensor), got "
            f"{type(inverse_indices).__name__}"
        )
    names = check_keys(f"{OWNER} inverse_indices", inverse_indices[0], unique=False)
    tensor = inverse_indices[1]
    if tensor.numel() and (tensor.dim() != 2 or tensor.size(0) != len(names)):
        raise ValueError(
            f"{OWNER}: inverse_indices tensor has shape {tuple(tensor.shape)} for {len(names)} "
            "keys; it must be [len(keys), batch size]: row k maps each example of the full "
            "batch to its bag of key k"
        )
    if tensor.numel() and not is_index_dtype(tensor.dtype):
        raise TypeError(
            f"{OWNER}: inverse_indices tensor must have an integer dtype, got {tensor.dtype}"
        )


def validate_kjt(kjt: KeyedJaggedTensor) -> None:
    """Everything `check_kjt` checks again, then the data; raises ValueError naming the key."""
    owner = f"{OWNER}.validate"
    keys, lengths, offsets = kjt.keys(), kjt.lengths_or_none(), kjt.offsets_or_none()
    num_values = kjt.values().size(0)
    check_kjt(keys, kjt.values(), kjt.weights_or_none(), lengths, offsets, kjt._stride,
              kjt._stride_per_key_per_rank, None, unique_keys=False)  # fmt: skip
    bounds = kjt.lengths_offset_per_key()
    check_per_key(keys, num_values, num_rows(lengths, offsets), kjt.length_per_key_or_none(),
                  kjt.offset_per_key_or_none(), bounds)  # fmt: skip

    def where(bag: int) -> str:
        index = sum(1 for bound in bounds[1:] if bound <= bag)
        return f"key {keys[index]!r}: " if index < len(keys) else ""

    check_bags(owner, lengths, offsets, where)
    per_key = None
    if offsets is not None and offsets.numel():
        per_key = ("offsets say", boundary_diffs(offsets, bounds))
    if lengths is not None:
        from_lengths = ("lengths sum to", boundary_diffs(complete_cumsum(lengths), bounds))
        _compare_per_key(owner, keys, from_lengths, per_key)
        per_key = from_lengths
    check_lengths_match_offsets(owner, lengths, offsets, where)
    cached = kjt.length_per_key_or_none()
    if cached is not None:
        _compare_per_key(owner, keys, per_key, ("length_per_key says", cached))
    detail = f" (per key: {dict(zip(keys, per_key[1]))})" if keys and per_key else ""
    check_total(owner, lengths, offsets, num_values, detail)
    _validate_inverse_indices(owner, kjt)


def _compare_per_key(
    owner: str,
    keys: list[str],
    ours: tuple[str, list[int]] | None,
    theirs: tuple[str, list[int]] | None,
) -> None:
    """Two per-key id counts, each with how it is described: the first key where they differ."""
    if ours is None or theirs is None:
        return
    for key, mine, other in zip(keys, ours[1], theirs[1]):
        if mine != other:
            raise ValueError(
                f"{owner}: key {key!r}: {ours[0]} {mine} but {theirs[0]} {other}; every "
                f"description of key {key!r}'s bags must agree (pass only lengths to have the "
                "rest derived)"
            )


def _validate_inverse_indices(owner: str, kjt: KeyedJaggedTensor) -> None:
    inverse = kjt.inverse_indices_or_none()
    check_inverse_indices(inverse)
    if inverse is None or inverse[1].numel() == 0:
        return
    stride_of = dict(zip(kjt.keys(), kjt.stride_per_key()))
    for row, name in enumerate(inverse[0]):
        if name not in stride_of:
            continue  # a key the model dedups but this KJT does not carry
        limit = stride_of[name]
        indices = inverse[1][row]
        bad = first_true((indices < 0) | (indices >= limit))
        if bad is not None:
            raise ValueError(
                f"{owner}: key {name!r}: inverse_indices[{row}][{bad}] = {int(indices[bad])} "
                f"is not one of the key's {limit} bags; each entry of row {row} must be in "
                f"[0, {limit})"
            )
