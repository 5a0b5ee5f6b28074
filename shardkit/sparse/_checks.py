"""Checks that cost nothing: types, ranks, dtypes and sizes, read from tensor metadata only.

Constructors run these and nothing else (see [Note: free checks]); anything that needs the data
(a negative length, offsets that go down) waits for an explicit ``validate()``.

[Note: free checks]
A KJT is built once per batch on the input pipeline's hot path, often from tensors that live on a
GPU. Reading a tensor's data there costs a device->host sync, so constructors look only at what
the host already knows: ``dim()``, ``dtype``, ``numel()``, Python lists. Every check here is one of
those, which is why the constructors can afford to run all of them every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "check_index_tensor",
    "check_keys",
    "check_lengths_and_offsets",
    "check_non_negative_ints",
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
    """A list of Python ints >= 0 (tensor scalars become ints)."""
    out = []
    for number in numbers:
        if isinstance(number, torch.Tensor):
            number = number.item()
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise ValueError(
                f"{owner}: {name} must be integers >= 0, got {list(numbers)!r}; "
                "they count bags or ids"
            )
        out.append(number)
    return out
