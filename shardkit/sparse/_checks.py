"""Checks that cost nothing: types, ranks, dtypes and sizes, read from tensor metadata only.

Constructors run these and nothing else (see [Note: free checks]); anything that needs the data
(a negative length, offsets that go down) waits for an explicit ``validate()`` (`_validate`).
Every check takes the ``owner`` that prefixes its message ("KeyedJaggedTensor: ...") and raises
TypeError for a wrong type or dtype, ValueError for a wrong value. Besides the pieces every jagged
type shares, `check_kjt` ties a KeyedJaggedTensor's host metadata together: how many bags
``lengths``/``offsets`` describe against keys x stride, ``stride_per_key_per_rank`` (VBE) or
``stride_per_key``, and the per-key sizes against ``len(values)``.

[Note: free checks]
A KJT is built once per batch on the input pipeline's hot path, often from tensors that live on a
GPU. Reading a tensor's data there costs a device->host sync, so constructors look only at what
the host already knows: ``dim()``, ``dtype``, ``numel()``, Python lists. Every check here is one of
those, which is why the constructors can afford to run all of them every time.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "check_ids",
    "check_index_tensor",
    "check_inverse_indices",
    "check_keys",
    "check_kjt",
    "check_lengths_and_offsets",
    "check_non_negative_ints",
    "check_per_key",
    "check_values_and_weights",
    "is_index_dtype",
    "num_rows",
]


def is_index_dtype(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` can hold lengths, offsets or ids (any integer type, not bool)."""
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def check_keys(owner: str, keys: Any, *, unique: bool = True) -> list[str]:
    """Return ``keys`` as a new list; raise unless it is a list/tuple of distinct strings."""
    if isinstance(keys, str) or not isinstance(keys, (list, tuple)):
        raise TypeError(
            f"{owner}: keys must be a list of str, got {type(keys).__name__} {keys!r}; "
            f"pass e.g. keys=[{keys!r}] for a single key"
        )
    bad = [key for key in keys if not isinstance(key, str)]
    if bad:
        raise TypeError(
            f"{owner}: keys must be a list of str, got {bad[0]!r} ({type(bad[0]).__name__}) "
            f"in {list(keys)!r}; name each feature with a string"
        )
    if unique and len(set(keys)) != len(keys):
        repeated = sorted({key for key in keys if keys.count(key) > 1})
        raise ValueError(
            f"{owner}: keys must be unique, got {repeated} more than once in {list(keys)}; "
            "use permute() to repeat a key's data under the same name"
        )
    return list(keys)


def check_index_tensor(owner: str, name: str, tensor: Any) -> torch.Tensor:
    """Lengths or offsets: a 1-D integer tensor (an empty tensor of any dtype becomes int32)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{owner}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dim() != 1:
        raise ValueError(
            f"{owner}: {name} must be a 1-D tensor, got shape {tuple(tensor.shape)}; flatten it "
            "key-major (all of the first key's bags, then the next key's)"
        )
    if not is_index_dtype(tensor.dtype):
        if tensor.numel() == 0:  # torch.tensor([]) is float; TorchRec accepts it too
            return tensor.to(torch.int32)
        raise TypeError(
            f"{owner}: {name} must have an integer dtype, got {tensor.dtype}; "
            f"use {name}.to(torch.int32) or torch.int64"
        )
    return tensor


def check_values_and_weights(
    owner: str, values: Any, weights: Any, *, values_dim: int | None
) -> None:
    """Values are a tensor (1-D when ``values_dim`` is 1); weights, if any, float and aligned."""
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"{owner}: values must be a torch.Tensor, got {type(values).__name__}")
    if values.dim() == 0 or (values_dim is not None and values.dim() != values_dim):
        want = "1-D" if values_dim == 1 else "at least 1-D"
        raise ValueError(
            f"{owner}: values must be {want}, got shape {tuple(values.shape)}; "
            "values hold the ids of all bags one after another"
        )
    if weights is None:
        return
    if not isinstance(weights, torch.Tensor):
        raise TypeError(f"{owner}: weights must be a torch.Tensor, got {type(weights).__name__}")
    if not weights.dtype.is_floating_point:
        raise TypeError(
            f"{owner}: weights must have a floating dtype, got {weights.dtype}; "
            "use weights.float() (one weight per id)"
        )
    if weights.dim() == 0 or weights.size(0) != values.size(0):
        raise ValueError(
            f"{owner}: weights have shape {tuple(weights.shape)} but values have "
            f"{values.size(0)} entries; give exactly one weight per id"
        )


def check_ids(owner: str, values: torch.Tensor, *, key: str | None = None) -> None:
    """Ids (a KJT's values) have an integer dtype: a lookup would truncate a float id to a row.

    Empty values of any dtype pass: they hold no id (``torch.tensor([])`` is float32, and so are
    the values of TorchRec's ``KeyedJaggedTensor.empty()``).
    """
    if is_index_dtype(values.dtype) or values.numel() == 0:  # dtype first: the usual case
        return
    where = "" if key is None else f"key {key!r}: "
    raise TypeError(
        f"{owner}: {where}values must have an integer dtype (int32 or int64), got "
        f"{values.dtype}; ids are row numbers, and a lookup would silently truncate a float id "
        "(1.7 -> row 1). Pass integer ids, e.g. values.long() if they are whole numbers"
    )


def num_rows(lengths: torch.Tensor | None, offsets: torch.Tensor | None) -> int:
    """How many bags ``lengths``/``offsets`` describe (empty offsets describe none)."""
    if lengths is not None:
        return lengths.numel()
    assert offsets is not None
    return max(offsets.numel() - 1, 0)


def check_lengths_and_offsets(
    owner: str, lengths: Any, offsets: Any
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """At least one of them, each 1-D integer; both given: ``len(offsets) == len(lengths) + 1``."""
    if lengths is None and offsets is None:
        raise ValueError(
            f"{owner}: needs lengths or offsets to know where each bag starts, got neither; "
            "pass lengths=[number of ids in each bag]"
        )
    if lengths is not None:
        lengths = check_index_tensor(owner, "lengths", lengths)
    if offsets is not None:
        offsets = check_index_tensor(owner, "offsets", offsets)
    if (
        lengths is not None
        and offsets is not None
        and offsets.numel() != lengths.numel() + 1
        and (lengths.numel() or offsets.numel())  # both empty: no bags, as in empty()
    ):
        raise ValueError(
            f"{owner}: offsets have {offsets.numel()} entries and lengths {lengths.numel()}; "
            "offsets must have one more entry than lengths (they start at 0), or pass only one"
        )
    return lengths, offsets


def check_non_negative_ints(owner: str, name: str, numbers: Sequence[Any]) -> list[int]:
    """A list of Python ints >= 0 (tensor scalars become ints; a traced size, a ``SymInt``
    under torch.compile or torch.export, is kept as it is)."""
    out: list[Any] = []
    for number in numbers:
        if isinstance(number, torch.SymInt):
            out.append(number)
            continue
        if isinstance(number, torch.Tensor):
            number = number.item()
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise ValueError(
                f"{owner}: {name} must be integers >= 0, got {list(numbers)!r}; "
                "they count bags or ids"
            )
        out.append(number)
    return out


def check_kjt(
    owner: str,
    keys: Any,
    values: Any,
    weights: Any,
    lengths: Any,
    offsets: Any,
    stride: Any,
    stride_per_key_per_rank: Any,
    stride_per_key: Any,
    *,
    unique_keys: bool = True,
) -> tuple[list[str], Any, Any, int | None, list[list[int]] | None]:
    """A KeyedJaggedTensor's arguments; returns keys, lengths, offsets, stride and the VBE strides
    as plain Python values.

    Keys repeat only in what `permute` returns, so ``validate()`` passes ``unique_keys=False``.
    """
    keys = check_keys(owner, keys, unique=unique_keys)
    check_values_and_weights(owner, values, weights, values_dim=1)
    check_ids(owner, values)
    lengths, offsets = check_lengths_and_offsets(owner, lengths, offsets)
    if stride is not None:
        stride = check_non_negative_ints(owner, "stride", [stride])[0]
    strides = _stride_lists(owner, keys, stride_per_key_per_rank)
    num_bags = num_rows(lengths, offsets)
    if lengths is not None or offsets is None:
        described = f"lengths have {num_bags} entries"
    else:
        described = f"offsets describe {num_bags} bags ({offsets.numel()} entries)"
    if strides is not None:
        _check_vbe_count(owner, strides, stride_per_key, num_bags, described)
    elif stride_per_key is not None:
        _check_stride_per_key(owner, keys, stride_per_key, num_bags, described)
    else:
        _check_fixed_count(owner, keys, stride, num_bags, described)
    return keys, lengths, offsets, stride, strides


def _check_fixed_count(
    owner: str, keys: list[str], stride: int | None, num_bags: int, described: str
) -> None:
    """One batch size for all keys: ``stride x keys`` bags, or a multiple of the keys."""
    if stride is not None:
        if stride * len(keys) != num_bags:
            raise ValueError(
                f"{owner}: stride {stride} x {len(keys)} keys = {stride * len(keys)} bags but "
                f"{described}; lengths hold one entry per (key, example), key-major"
            )
    elif num_bags % max(len(keys), 1) or (not keys and num_bags):
        raise ValueError(
            f"{owner}: {described}, which does not split evenly over {len(keys)} keys; "
            "lengths hold one entry per (key, example), key-major, so their number is "
            "len(keys) x batch size (for a different batch size per key pass "
            "stride_per_key_per_rank)"
        )


def _stride_lists(owner: str, keys: list[str], strides: Any) -> list[list[int]] | None:
    """``stride_per_key_per_rank`` as lists, one list of per-rank batch sizes per key."""
    if strides is None:
        return None
    if isinstance(strides, torch.Tensor):
        strides = strides.tolist() if strides.dim() == 2 else [[] for _ in keys]
    if not isinstance(strides, (list, tuple)) or len(strides) != len(keys):
        got = len(strides) if isinstance(strides, (list, tuple)) else type(strides).__name__
        raise ValueError(
            f"{owner}: stride_per_key_per_rank has {got} entries for {len(keys)} keys; give "
            "one list of per-rank batch sizes per key, e.g. [[2, 1], [3, 3]] for 2 keys, 2 ranks"
        )
    return [check_non_negative_ints(owner, "stride_per_key_per_rank", row) for row in strides]


def _check_vbe_count(
    owner: str, strides: list[list[int]], stride_per_key: Any, num_bags: int, described: str
) -> None:
    expected = sum(sum(row) for row in strides)
    if expected != num_bags:
        raise ValueError(
            f"{owner}: stride_per_key_per_rank {strides} describes {expected} bags but "
            f"{described}; key k has sum(stride_per_key_per_rank[k]) bags"
        )
    if stride_per_key is not None and list(stride_per_key) != [sum(row) for row in strides]:
        raise ValueError(
            f"{owner}: stride_per_key {list(stride_per_key)} does not match "
            f"stride_per_key_per_rank {strides} (key k has sum(stride_per_key_per_rank[k]) "
            "bags); leave stride_per_key out to have it computed"
        )


def _check_stride_per_key(
    owner: str, keys: list[str], stride_per_key: Any, num_bags: int, described: str
) -> None:
    strides = check_non_negative_ints(owner, "stride_per_key", stride_per_key)
    if len(strides) != len(keys) or sum(strides) != num_bags or len(set(strides)) > 1:
        raise ValueError(
            f"{owner}: stride_per_key {strides} does not fit {len(keys)} keys when {described}; "
            "without stride_per_key_per_rank every key has the same batch size (for different "
            "ones pass stride_per_key_per_rank instead)"
        )


def check_per_key(
    owner: str,
    keys: list[str],
    num_values: int,
    num_bags: int,
    length_per_key: Any,
    offset_per_key: Any,
    lengths_offset_per_key: Any,
) -> None:
    """Given per-key metadata has one entry per key and adds up to the tensors' sizes."""
    if length_per_key is not None:
        sizes = check_non_negative_ints(owner, "length_per_key", length_per_key)
        if len(sizes) != len(keys) or sum(sizes) != num_values:
            raise ValueError(
                f"{owner}: length_per_key {sizes} has {len(sizes)} entries summing to "
                f"{sum(sizes)}, but there are {len(keys)} keys and {num_values} values; give "
                "the number of ids of each key, or leave it out to have it computed"
            )
        if offset_per_key is not None and list(offset_per_key) != _cumsum(sizes):
            raise ValueError(
                f"{owner}: offset_per_key {list(offset_per_key)} is not the cumulative sum of "
                f"length_per_key {sizes} ({_cumsum(sizes)}); leave it out to have it computed"
            )
    for name, bounds, end in (
        ("offset_per_key", offset_per_key, num_values),
        ("lengths_offset_per_key", lengths_offset_per_key, num_bags),
    ):
        if bounds is not None and (len(bounds) != len(keys) + 1 or bounds[-1] != end):
            raise ValueError(
                f"{owner}: {name} {list(bounds)} must have {len(keys) + 1} entries (one per key, "
                f"then the end) and end at {end}; leave it out to have it computed"
            )


def _cumsum(numbers: list[int]) -> list[int]:
    return list(itertools.accumulate(numbers, initial=0))


def check_inverse_indices(owner: str, inverse_indices: Any) -> None:
    """``(keys, tensor)`` with an integer tensor ``[len(keys), B]`` (or an empty tensor)."""
    if inverse_indices is None:
        return
    if (
        not isinstance(inverse_indices, tuple)
        or len(inverse_indices) != 2
        or not isinstance(inverse_indices[1], torch.Tensor)
    ):
        raise TypeError(
            f"{owner}: inverse_indices must be a tuple (keys, tensor), got "
            f"{type(inverse_indices).__name__}"
        )
    names = check_keys(f"{owner} inverse_indices", inverse_indices[0], unique=False)
    tensor = inverse_indices[1]
    if tensor.numel() and (tensor.dim() != 2 or tensor.size(0) != len(names)):
        raise ValueError(
            f"{owner}: inverse_indices tensor has shape {tuple(tensor.shape)} for {len(names)} "
            "keys; it must be [len(keys), batch size]: row k maps each example of the full "
            "batch to its bag of key k"
        )
    if tensor.numel() and not is_index_dtype(tensor.dtype):
        raise TypeError(
            f"{owner}: inverse_indices tensor must have an integer dtype, got {tensor.dtype}"
        )
