"""Awaitables: a value that is being computed (usually a collective in flight), TorchRec's names.

`Awaitable.wait()` returns the value, passed through its `callbacks` in order. A
`LazyAwaitable` waits by itself the first time its value is used: as an argument of a torch
function (``torch.cat([awaitable, x])``), through an attribute (``awaitable.values()``) or an
operator (``awaitable + 1``), and keeps the result. Example::

    pending = LazyNoWait(torch.ones(2))
    pending.callbacks.append(lambda t: t * 3)
    torch.sum(pending)          # tensor(6.): waited here, the callback applied
"""

from __future__ import annotations

import abc
import operator
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import torch
from torch.fx.node import map_aggregate

__all__ = [
    "Awaitable",
    "DeviceToHostTensorAwaitable",
    "GenericMeta",
    "GetItemLazyAwaitable",
    "LazyAwaitable",
    "LazyGetItemMixin",
    "LazyNoWait",
    "NoWait",
    "scope",
]

W = TypeVar("W")
KT = TypeVar("KT")
VT = TypeVar("VT")

# TorchRec keeps this name from Python 3.6's typing; on any Python >= 3.7 it is `type`.
GenericMeta = type

_NOT_WAITED = object()


class Awaitable(abc.ABC, Generic[W]):
    """A value that `wait()` returns once it is ready; subclasses implement `_wait_impl`."""

    def __init__(self) -> None:
        self._callbacks: list[Callable[[W], W]] = []

    @abc.abstractmethod
    def _wait_impl(self) -> W:
        """Block until the value is ready and return it."""

    def wait(self) -> W:
        """The value, after each of `callbacks` in turn."""
        with torch.profiler.record_function(f"## {type(self).__name__} wait() ##"):
            value = self._wait_impl()
            for callback in self._callbacks:
                value = callback(value)
        return value

    @property
    def callbacks(self) -> list[Callable[[W], W]]:
        """Functions applied to the value by `wait()`, in order (append to add one)."""
        return self._callbacks


class NoWait(Awaitable[W]):
    """An awaitable of a value that is already there."""

    def __init__(self, obj: W) -> None:
        super().__init__()
        self._obj = obj

    def _wait_impl(self) -> W:
        return self._obj


class LazyAwaitable(Awaitable[W]):
    """An awaitable that waits the first time its value is used, and keeps the result."""

    def __init__(self) -> None:
        super().__init__()
        self._result: Any = _NOT_WAITED

    @staticmethod
    def _wait_async(obj: Any) -> Any:
        """``obj``'s value if it is a LazyAwaitable (waited once), else ``obj``."""
        if not isinstance(obj, LazyAwaitable):
            return obj
        if obj._result is _NOT_WAITED:
            obj._result = obj.wait()
        return obj._result

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        args = map_aggregate(args, LazyAwaitable._wait_async)
        kwargs = map_aggregate(kwargs or {}, LazyAwaitable._wait_async)
        return func(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name == "_result":
            raise RuntimeError(
                f"{type(self).__name__} was not initialised: its __init__ must call "
                "super().__init__()"
            )
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # copy/pickle probe these: do not wait for them
        return getattr(LazyAwaitable._wait_async(self), name)


def scope(method: str) -> None:
    """Give `LazyAwaitable` the operator ``__<method>__`` and its reflection ``__r<method>__``:
    both wait on their awaitable operands and apply ``operator.<method>``."""
    op = getattr(operator, method, None) or getattr(operator, f"{method}_")

    def forward(*args: Any) -> Any:
        return op(*(LazyAwaitable._wait_async(a) for a in args))

    def reflected(self: Any, other: Any) -> Any:
        return op(LazyAwaitable._wait_async(other), LazyAwaitable._wait_async(self))

    forward.__name__ = f"__{method}__"
    reflected.__name__ = f"__r{method}__"
    setattr(LazyAwaitable, forward.__name__, forward)
    if method in _REFLECTABLE:
        setattr(LazyAwaitable, reflected.__name__, reflected)


_REFLECTABLE = ("add", "sub", "mul", "floordiv", "truediv", "mod", "pow", "lshift", "rshift",
                "and", "or", "xor", "matmul")  # fmt: skip
for _method in (*_REFLECTABLE, "eq", "ne", "lt", "gt", "le", "ge", "neg", "pos", "invert"):
    scope(_method)
del _method


class LazyNoWait(LazyAwaitable[W]):
    """A lazy awaitable of a value that is already there."""

    def __init__(self, obj: W) -> None:
        super().__init__()
        self._obj = obj

    def _wait_impl(self) -> W:
        return self._obj


class DeviceToHostTensorAwaitable(LazyAwaitable[torch.Tensor]):
    """A tensor being copied to host memory; `wait()` returns the copy once it is complete."""

    def __init__(self, tensor_on_device: torch.Tensor) -> None:
        super().__init__()
        self._tensor = tensor_on_device.to("cpu", non_blocking=True)
        self._event = None
        if tensor_on_device.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()

    def _wait_impl(self) -> torch.Tensor:
        if self._event is not None:
            self._event.synchronize()
        return self._tensor


class LazyGetItemMixin(Generic[KT, VT]):
    """``awaitable[key]`` is another awaitable instead of a wait (put it before
    `LazyAwaitable` among the bases)."""

    def __getitem__(self, key: KT) -> LazyAwaitable[VT]:
        return GetItemLazyAwaitable(self, key)  # type: ignore[arg-type]


class GetItemLazyAwaitable(LazyAwaitable[W]):
    """``parent[key]``, computed when used: waits on ``parent`` first."""

    def __init__(self, parent: LazyAwaitable[Any], key: Any) -> None:
        super().__init__()
        self._parent = parent
        self._key = key

    def _wait_impl(self) -> W:
        return LazyAwaitable._wait_async(self._parent)[self._key]
