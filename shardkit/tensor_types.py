"""TorchRec's ``torchrec.tensor_types``: uint8 tensors whose elements are 4 or 2 bits.

TorchRec keeps INT4 and INT2 quantized tables in ``UInt4Tensor``/``UInt2Tensor`` buffers: uint8
data (``.elem``, ``[rows, bytes]``) whose last size counts values (``[rows, 2 * bytes]`` for 4
bits). shardkit has them so that a state dict TorchRec saved (``torch.save`` pickles these
classes by TorchRec's path) loads under ``shardkit run`` or after `shardkit.compat.install_aliases`,
and so that code handing one to a shardkit module works; shardkit's own quantized tables are
plain uint8 (see [Note: TorchRec's quantized rows] in ``shardkit.quant``).

The operations a state dict needs work on the bytes: ``t.view(torch.uint8)`` (the bytes),
``detach``, ``clone``, ``copy_`` and moves (``.to``, ``.cpu``); others are refused by name.

Example::

    t = UInt4Tensor(torch.zeros(3, 8, dtype=torch.uint8))   # 16 four-bit values a row
    t.shape                                                  # torch.Size([3, 16])
    t.view(torch.uint8).shape                                # torch.Size([3, 8])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

__all__ = [
    "UInt2Tensor",
    "UInt4Tensor",
    "UIntXTensor",
    "down_size",
    "fill_defaults",
    "find_arg_of_type",
    "up_size",
]

_aten = torch.ops.aten


def down_size(N: int, size: Sequence[int]) -> tuple[int, ...]:
    """``size`` in bytes for ``N`` values a byte: its last entry divided by ``N``."""
    if size[-1] % N:
        raise ValueError(f"the last size of {list(size)} must be a multiple of {N}")
    return (*size[:-1], size[-1] // N)


def up_size(N: int, size: Sequence[int]) -> tuple[int, ...]:
    """``size`` in values for ``N`` values a byte: its last entry times ``N``."""
    return (*size[:-1], size[-1] * N)


def fill_defaults(args: Sequence[Any], n: int, defaults_tail: Sequence[Any]) -> list[Any]:
    """``args`` padded to ``n`` entries with the last ones of ``defaults_tail`` (the defaults of
    the last ``len(defaults_tail)`` arguments)."""
    if n - len(defaults_tail) > len(args):
        raise RuntimeError(f"{len(args)} arguments and {len(defaults_tail)} defaults make no {n}")
    return [*args, *defaults_tail[len(defaults_tail) - (n - len(args)) :]]


def find_arg_of_type(it: Iterable[Any], t: type) -> Any:
    """The first entry of ``it`` that is a ``t``, or None."""
    return next((x for x in it if isinstance(x, t)), None)


class UIntXTensor(torch.Tensor):
    """uint8 data ``elem`` holding ``N`` values a byte, shaped in values (see the module)."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]
    N: int
    elem: torch.Tensor

    @staticmethod
    def __new__(cls, N: int, elem: torch.Tensor) -> UIntXTensor:
        if elem.dtype != torch.uint8:
            raise TypeError(f"{cls.__name__} holds uint8 data, got {elem.dtype}")
        return torch.Tensor._make_wrapper_subclass(
            cls, up_size(N, elem.shape), dtype=torch.uint8, device=elem.device
        )

    def __init__(self, N: int, elem: torch.Tensor) -> None:
        self.N = N
        self.elem = elem

    def _like(self, elem: torch.Tensor) -> UIntXTensor:
        if type(self) is UIntXTensor:
            return UIntXTensor(self.N, elem)
        return type(self)(elem)  # type: ignore[call-arg,arg-type]

    def tolist(self) -> list:
        return self.elem.tolist()

    def __repr__(self) -> str:  # type: ignore[override]
        return f"{type(self).__name__}(shape={self.shape}, elem={self.elem})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self = args[0]
        if func in (_aten.detach.default, _aten.clone.default, _aten._to_copy.default):
            return self._like(func(self.elem, *args[1:], **kwargs))
        if func is _aten.copy_.default:
            source = args[1]
            self.elem.copy_(source.elem if isinstance(source, UIntXTensor) else source)
            return self
        if func is _aten.view.dtype and args[1] == torch.uint8:
            return self.elem
        raise NotImplementedError(
            f"{cls.__name__} supports view(torch.uint8), detach, clone, copy_ and moves; not "
            f"{func}: take its bytes with .view(torch.uint8) first"
        )


class UInt4Tensor(UIntXTensor):
    """Two 4-bit values a byte."""

    N = 2

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> Any:
        return UIntXTensor.__new__(cls, 2, elem)

    def __init__(self, elem: torch.Tensor) -> None:
        super().__init__(2, elem)


class UInt2Tensor(UIntXTensor):
    """Four 2-bit values a byte."""

    N = 4

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> Any:
        return UIntXTensor.__new__(cls, 4, elem)

    def __init__(self, elem: torch.Tensor) -> None:
        super().__init__(4, elem)
