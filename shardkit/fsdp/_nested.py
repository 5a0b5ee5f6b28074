"""Tensors inside a module's nested inputs and outputs (tuples, lists, dicts, dataclasses)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["cast_floats", "tensors_in"]


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """Every tensor inside nested tuples, lists, dicts and dataclasses."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in tensors_in(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in tensors_in(item)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in tensors_in(getattr(obj, f.name))]
    return []


def cast_floats(obj: Any, dtype: torch.dtype) -> Any:
    cast: Callable[[Any], Any] = lambda item: cast_floats(item, dtype)  # noqa: E731
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*map(cast, obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(map(cast, obj))
    if isinstance(obj, dict):
        return {key: cast(value) for key, value in obj.items()}
    return obj
