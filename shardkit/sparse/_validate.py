"""Data-dependent checks behind ``validate()``: each reads tensors, so each may sync with the device.

Constructors never call these (see [Note: free checks] in `_checks`). A check names the first
offending position, and through ``where`` the key it belongs to, so that the message points at
the bag to fix. `validate_kjt` is a KeyedJaggedTensor's ``validate()``: its free checks again
(its ops build KJTs without them), then the data.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import torch

from shardkit.sparse._checks import check_inverse_indices, check_kjt, check_per_key, num_rows
from shardkit.sparse._segments import boundary_diffs, complete_cumsum, host_list_to

__all__ = [
    "check_bags",
    "check_lengths_match_offsets",
    "check_total",
    "first_true",
    "validate_kjt",
]

Where = Callable[[int], str]  # bag index -> "key 'user': " (KJT) or "" (JT)


def first_true(mask: torch.Tensor) -> int | None:
    """Index of the first True in a 1-D mask, or None (one device->host sync)."""
    hits = torch.nonzero(mask)
    return None if hits.numel() == 0 else int(hits[0, 0])


def check_bags(
    owner: str, lengths: torch.Tensor | None, offsets: torch.Tensor | None, where: Where
) -> None:
    """Lengths >= 0; offsets start at 0 and never go down."""
    if lengths is not None:
        bad = first_true(lengths < 0)
        if bad is not None:
            raise ValueError(
                f"{owner}: {where(bad)}lengths[{bad}] = {int(lengths[bad])} is negative; "
                "a bag holds 0 or more ids"
            )
    if offsets is None or offsets.numel() == 0:
        return
    if int(offsets[0]) != 0:
        raise ValueError(
            f"{owner}: offsets start at {int(offsets[0])}, not 0; offsets[i] is where bag i "
            "starts in values, so the first is 0 (subtract offsets[0] to rebase them)"
        )
    bad = first_true(torch.diff(offsets) < 0)
    if bad is not None:
        raise ValueError(
            f"{owner}: {where(bad)}offsets go down from offsets[{bad}] = {int(offsets[bad])} to "
            f"offsets[{bad + 1}] = {int(offsets[bad + 1])}; offsets must be non-decreasing "
            "(the cumulative sum of lengths)"
        )


def check_lengths_match_offsets(
    owner: str, lengths: torch.Tensor | None, offsets: torch.Tensor | None, where: Where
) -> None:
    """When both are given, ``lengths == diff(offsets)`` bag by bag."""
    if lengths is None or offsets is None or offsets.numel() == 0:
        return
    steps = torch.diff(offsets)
    bad = first_true(steps != lengths)
    if bad is not None:
        raise ValueError(
            f"{owner}: {where(bad)}lengths[{bad}] = {int(lengths[bad])} but offsets[{bad + 1}] - "
            f"offsets[{bad}] = {int(steps[bad])}; pass lengths and offsets of the same bags, or "
            "only one of them"
        )


def check_total(
    owner: str,
    lengths: torch.Tensor | None,
    offsets: torch.Tensor | None,
    num_values: int,
    detail: str = "",
) -> None:
    """The bags cover ``values`` exactly: ``sum(lengths) == offsets[-1] == len(values)``."""
    if lengths is not None:
        total = int(lengths.sum())
        if total != num_values:
            raise ValueError(
                f"{owner}: lengths sum to {total}{detail} but values have {num_values} entries; "
                "each id belongs to exactly one bag, so sum(lengths) must equal len(values)"
            )
        return
    assert offsets is not None
    end = int(offsets[-1]) if offsets.numel() else 0
    if end != num_values:
        raise ValueError(
            f"{owner}: offsets end at {end}{detail} but values have {num_values} entries; "
            "the last offset must equal len(values)"
        )


def validate_kjt(
    owner: str,
    keys: list[str],
    values: torch.Tensor,
    weights: torch.Tensor | None,
    lengths: torch.Tensor | None,
    offsets: torch.Tensor | None,
    *,
    stride: int | None,
    stride_per_key_per_rank: list[list[int]] | None,
    length_per_key: list[int] | None,
    offset_per_key: list[int] | None,
    lengths_offset_per_key: list[int],
    stride_per_key: list[int],
    inverse_indices: tuple[list[str], torch.Tensor] | None,
) -> list[int] | None:
    """A KeyedJaggedTensor's fields (as it holds them: metadata None if not computed), then its
    data against them; data messages start with ``<owner>.validate`` and name the key.

    Args:
        lengths_offset_per_key: ``[F + 1]`` the first bag of each key, then the number of bags.
        stride_per_key: the bags of each key, the range of its ``inverse_indices`` row.

    Returns:
        The ids of each key as the data say (``length_per_key``, checked), or None when there
        are no bags to count.
    """
    check_kjt(owner, keys, values, weights, lengths, offsets, stride, stride_per_key_per_rank,
              None, unique_keys=False)  # fmt: skip
    check_per_key(owner, keys, values.size(0), num_rows(lengths, offsets), length_per_key,
                  offset_per_key, lengths_offset_per_key)  # fmt: skip
    check_inverse_indices(owner, inverse_indices)
    per_key = _check_keyed_bags(f"{owner}.validate", keys, values.size(0), lengths, offsets,
                                lengths_offset_per_key, length_per_key)  # fmt: skip
    if inverse_indices is not None:
        _check_inverse_range(f"{owner}.validate", dict(zip(keys, stride_per_key)),
                             *inverse_indices)  # fmt: skip
    return per_key


def _check_keyed_bags(
    owner: str,
    keys: list[str],
    num_values: int,
    lengths: torch.Tensor | None,
    offsets: torch.Tensor | None,
    lengths_offset_per_key: list[int],
    length_per_key: list[int] | None,
) -> list[int] | None:
    """The bags of every key agree however they are described; messages name the key. Returns
    the ids of each key (None when there are no bags to count)."""
    bounds = lengths_offset_per_key

    def where(bag: int) -> str:
        index = sum(1 for bound in bounds[1:] if bound <= bag)
        return f"key {keys[index]!r}: " if index < len(keys) else ""

    if offsets is None and lengths is not None and _lengths_only(bounds, lengths):
        return _check_lengths_only(owner, keys, num_values, lengths, bounds, length_per_key, where)
    check_bags(owner, lengths, offsets, where)
    per_key = None
    if offsets is not None and offsets.numel():
        per_key = ("offsets say", boundary_diffs(offsets, bounds))
    if lengths is not None:
        from_lengths = ("lengths sum to", boundary_diffs(complete_cumsum(lengths), bounds))
        _compare_per_key(owner, keys, from_lengths, per_key)
        per_key = from_lengths
    check_lengths_match_offsets(owner, lengths, offsets, where)
    if length_per_key is not None:
        _compare_per_key(owner, keys, per_key, ("length_per_key says", length_per_key))
    detail = f" (per key: {dict(zip(keys, per_key[1]))})" if keys and per_key else ""
    check_total(owner, lengths, offsets, num_values, detail)
    return None if per_key is None else per_key[1]


def _lengths_only(bounds: list[int], lengths: torch.Tensor) -> bool:
    """Whether `_check_lengths_only` serves: keys, bags, and key bounds that end at the last bag
    (the free checks make them so; anything else takes the general path)."""
    return len(bounds) >= 2 and lengths.numel() > 0 and bounds[-1] == lengths.numel()


def _check_lengths_only(
    owner: str,
    keys: list[str],
    num_values: int,
    lengths: torch.Tensor,
    bounds: list[int],
    length_per_key: list[int] | None,
    where: Where,
) -> list[int]:
    """`_check_keyed_bags` for bags given by lengths alone (a batch's usual form) with one
    device->host read: the smallest length and each key's ids. The checks, their order and
    their messages are the general path's (negative lengths first, then ``length_per_key``,
    then the total); a failing one re-runs the general check for its message."""
    smallest = lengths.amin().view(1).long()
    stride = bounds[1]
    if stride and bounds == list(range(0, bounds[-1] + 1, stride)):  # one batch size: [F, B]
        counts = lengths.view(len(bounds) - 1, stride).sum(1, dtype=torch.int64)
        read = torch.cat([smallest, counts]).tolist()
        per_key = read[1:]
    else:  # a batch size per key (VBE): the cumulative sum at each key's first bag
        cumsum = lengths.new_zeros(lengths.numel() + 1, dtype=torch.int64)  # int64: no wrap
        torch.cumsum(lengths, 0, dtype=torch.int64, out=cumsum[1:])
        index = host_list_to(bounds, lengths.device)
        read = torch.cat([smallest, cumsum.index_select(0, index)]).tolist()
        per_key = [end - start for start, end in itertools.pairwise(read[1:])]
    if read[0] < 0:
        check_bags(owner, lengths, None, where)  # raises, naming the first negative length
    if length_per_key is not None:
        _compare_per_key(owner, keys, ("lengths sum to", per_key),
                         ("length_per_key says", length_per_key))  # fmt: skip
    if sum(per_key) != num_values:
        detail = f" (per key: {dict(zip(keys, per_key))})"
        check_total(owner, lengths, None, num_values, detail)  # raises
    return per_key


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


def _check_inverse_range(
    owner: str, stride_of: dict[str, int], names: list[str], inverse: torch.Tensor
) -> None:
    """Row k of ``inverse`` ``[len(names), B]`` points at bags of key ``names[k]``."""
    if inverse.numel() == 0:
        return
    for row, name in enumerate(names):
        if name not in stride_of:
            continue  # a key the model dedups but this KJT does not carry
        limit = stride_of[name]
        indices = inverse[row]
        bad = first_true((indices < 0) | (indices >= limit))
        if bad is not None:
            raise ValueError(
                f"{owner}: key {name!r}: inverse_indices[{row}][{bad}] = {int(indices[bad])} "
                f"is not one of the key's {limit} bags; each entry of row {row} must be in "
                f"[0, {limit})"
            )
