"""Printed forms of the jagged types, character for character the same as TorchRec's.

Numbers print as Python prints them after ``tensor.tolist()``, so a float32 ``0.1`` prints as
``0.10000000149011612``, as in TorchRec (which prints ``tensor.item()``). Each tensor is read
once with ``tolist()``; there is no per-element device access.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["describe", "jagged_tensor_string", "kjt_string", "kt_string", "tolist"]


def tolist(tensor: torch.Tensor) -> list[Any]:
    """A tensor's entries as (nested) Python numbers: one device->host copy."""
    return tensor.detach().cpu().tolist()


def _nested(items: Any) -> str:
    """``[1, 2]``, ``[[1.0, 2.0], [3.0]]``: a (nested) list of numbers in brackets."""
    if isinstance(items, list):
        return "[" + ", ".join(_nested(item) for item in items) + "]"
    return str(items)


def _bags(values: list[Any], offsets: list[int], first: int, last: int) -> str:
    """Bags ``first .. last - 1``, e.g. ``[[101, 202], [], [303]]``."""
    return _nested([values[offsets[i] : offsets[i + 1]] for i in range(first, last)])


def jagged_tensor_string(
    values: torch.Tensor, weights: torch.Tensor | None, offsets: torch.Tensor
) -> str:
    """``JaggedTensor({ [[1.0, 2.0], [], [3.0]] })`` over lines; values and weights if weighted."""
    offsets_list = tolist(offsets)
    num_bags = max(len(offsets_list) - 1, 0)
    bags = _bags(tolist(values), offsets_list, 0, num_bags)
    if weights is None:
        return "JaggedTensor({\n    " + bags + "\n})\n"
    bag_weights = _bags(tolist(weights), offsets_list, 0, num_bags)
    return f'JaggedTensor({{\n    "values": {bags},\n    "weights": {bag_weights}\n}})\n'


def kjt_string(
    keys: Sequence[str],
    values: torch.Tensor,
    weights: torch.Tensor | None,
    offsets: torch.Tensor,
    lengths_offset_per_key: list[int],
) -> str:
    """One line (or block, if weighted) per key: ``"user": [[404], [505], [606]]``."""
    offsets_list = tolist(offsets)
    values_list = tolist(values)
    weights_list = None if weights is None else tolist(weights)
    entries = []
    for index, key in enumerate(keys):
        first, last = lengths_offset_per_key[index], lengths_offset_per_key[index + 1]
        bags = _bags(values_list, offsets_list, first, last)
        if weights_list is None:
            entries.append(f'    "{key}": {bags}')
            continue
        bag_weights = _bags(weights_list, offsets_list, first, last)
        entries.append(
            f'    "{key}": {{\n        "values": {bags},\n        "weights": {bag_weights}\n    }}'
        )
    return "KeyedJaggedTensor({\n" + ",\n".join(entries) + "\n})\n"


def kt_string(keys: Sequence[str], tensors: Sequence[torch.Tensor]) -> str:
    """One line per key with that key's tensor as nested lists: ``"a": [[1.0, 1.0], [1.0, 1.0]]``."""
    lines = [f'    "{key}": {_nested(tolist(t))}' for key, t in zip(keys, tensors)]
    return "KeyedTensor({\n" + ",\n".join(lines) + "\n})\n"


def describe(**fields: torch.Tensor | None) -> str:
    """``values=int64[6], weights=None, lengths=int32[6]``: dtypes and shapes, never data.

    For reprs, which must stay cheap and must not sync with a device. Fields that are None and
    derived (lengths, offsets) are left out; a missing ``weights`` prints as None.
    """
    parts = []
    for name, tensor in fields.items():
        if tensor is None:
            if name == "weights":
                parts.append("weights=None")
            continue
        dtype = str(tensor.dtype).removeprefix("torch.")
        parts.append(f"{name}={dtype}{list(tensor.shape)}")
    return ", ".join(parts)
