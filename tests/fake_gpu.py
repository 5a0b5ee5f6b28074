"""A second device that is not the CPU, for proving device placement on machines without a GPU.

[Note: the fake GPU]
A tensor on ``fakegpu:0`` is a `FakeGpuTensor`: a wrapper subclass (its device is ``fakegpu``,
torch's PrivateUse1 backend renamed) that holds a real CPU tensor. Every op runs on the inner
CPU tensors, so values are exactly the CPU run's, while torch's cross-device rule is enforced as
CUDA enforces it: an op that mixes fake-GPU tensors with CPU tensors raises `DeviceMismatch`
(0-dim CPU tensors may mix, as Python scalars; ``copy_`` and ``.to()`` move data between the
devices). Inside `FakeGpuMode` (which autograd carries into backward) factory calls that name
the fake device (``torch.zeros(n, device=x.device)``) make fake-GPU tensors, and factory calls
that name no device make CPU tensors, as on a GPU machine: a forgotten ``device=`` fails at the
first op that mixes the two. ``torch.tensor(data, device=...)``, which hides itself from modes,
reaches kernels registered for the backend instead.

Collectives (torch's ``c10d`` ops) are handed the inner CPU tensors, so gloo carries the fake
GPU's data and a test runs on the same process groups as the CPU tests. Storage tricks that
FSDP plays on the unsharded parameters (``untyped_storage().resize_``) act on the inner storage.

Host syncs are counted (`host_syncs`): ``.item()``, ``.tolist()`` and ``bool()`` of a fake-GPU
tensor, and copies from it to the CPU, each of which waits for the GPU on a real one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = [
    "DEVICE_TYPE",
    "DeviceMismatch",
    "FakeGpuMode",
    "FakeGpuTensor",
    "HostSyncs",
    "fake_gpu",
    "host_syncs",
    "install",
    "to_cpu",
]

DEVICE_TYPE = "fakegpu"

aten = torch.ops.aten

# Ops that move data between devices on purpose (torch allows them across devices too).
_TRANSFERS = {
    aten.copy_.default,
    aten._to_copy.default,
    aten._copy_from.default,
    aten._copy_from_and_resize.default,
}
# Ops whose result lives on the host: a device-to-host sync on a real GPU.
_SYNCS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default}

_installed = False
_lock = threading.Lock()
_libraries: list[torch.library.Library] = []


class DeviceMismatch(RuntimeError):
    """An op mixed fake-GPU and CPU tensors (a real GPU would refuse it too)."""


def install() -> None:
    """Register the ``fakegpu`` device in this process (once; torch allows one rename)."""
    global _installed
    with _lock:
        if _installed:
            return
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(DEVICE_TYPE, backend_module=_Module())
        _library = torch.library.Library("_", "IMPL")
        _library.fallback(_fallback, "PrivateUse1")
        # torch looks up a kernel by op name, not the fallback, when an argument is a Python
        # subclass: name the ops that reach the backend with fake-GPU arguments.
        aten_impl = torch.library.Library("aten", "IMPL")
        for op in _TRANSFERS:
            name = op.name().split("::")[1]
            aten_impl.impl(name, _kernel(op), "PrivateUse1")
        _libraries.extend([_library, aten_impl])
        _installed = True


class _Stream:
    """The fake GPU runs everything in order on the CPU: its one stream is always done."""

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Stream)

    def __hash__(self) -> int:
        return 0


class _Module:
    """``torch.fakegpu``: what torch's libraries ask a device module (e.g. the checkpoint
    writer, for the stream it copies to the host on)."""

    _stream = _Stream()

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def _is_in_bad_fork(self) -> bool:
        return False

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, device: Any) -> None:
        pass

    def manual_seed_all(self, seed: int) -> None:
        pass

    def synchronize(self, device: Any = None) -> None:
        pass

    def current_stream(self, device: Any = None) -> _Stream:
        return self._stream

    def Stream(self, *args: Any, **kwargs: Any) -> _Stream:
        return self._stream

    def stream(self, stream: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


def _kernel(op):
    return lambda *args, **kwargs: _run(op, args, kwargs)


def _fallback(func, *args: Any, **kwargs: Any) -> Any:
    """Every op that reaches the backend itself: factories naming the device, and ops on
    `FakeGpuTensor`s run where torch hides the Python key (``torch.tensor(..., device=)``)."""
    return _run(func, args, kwargs)


class HostSyncs:
    """How many times fake-GPU data was read by the host (see [Note: the fake GPU])."""

    def __init__(self) -> None:
        self.count = 0
        self.ops: dict[str, int] = {}

    def add(self, name: str) -> None:
        self.count += 1
        self.ops[name] = self.ops.get(name, 0) + 1


_syncs = HostSyncs()


def host_syncs() -> HostSyncs:
    """The counter of this process (reset it with ``host_syncs().__init__()``)."""
    return _syncs


class FakeGpuTensor(torch.Tensor):
    """A tensor on ``fakegpu:0`` whose data is the CPU tensor ``inner``."""

    inner: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> FakeGpuTensor:
        assert type(inner) is torch.Tensor and inner.device.type == "cpu", type(inner)
        return torch.Tensor._make_wrapper_subclass(
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            layout=inner.layout,
            device=torch.device(DEVICE_TYPE, 0),
            requires_grad=inner.requires_grad,
        )

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"FakeGpuTensor({self.inner!r})"

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["inner"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict, meta: Any, outer_size: Any, outer_stride: Any) -> Any:
        return FakeGpuTensor(inner["inner"])

    # ``param.data = value`` swaps the tensor's metadata in C++: swap the inner tensor too.
    def _set_data(self, value: torch.Tensor) -> None:
        torch._C.TensorBase.data.__set__(self, value)
        assert isinstance(value, FakeGpuTensor)
        self.inner = value.inner

    data = property(torch._C.TensorBase.data.__get__, _set_data)  # type: ignore[assignment]

    # Storage-level calls bypass the dispatcher: send them to the inner tensor.
    def untyped_storage(self) -> torch.UntypedStorage:
        return self.inner.untyped_storage()

    def data_ptr(self) -> int:
        return self.inner.data_ptr()

    # Python-level reads of the values that torch refuses for subclasses; on a GPU each is a sync.
    def tolist(self) -> Any:
        _syncs.add("tolist")
        return self.inner.tolist()

    def numpy(self, *, force: bool = False) -> Any:
        raise TypeError(
            "can't convert fakegpu tensor to numpy: use tensor.cpu() first (as for cuda)"
        )

    def __format__(self, format_spec: str) -> str:
        if self.dim() == 0:
            _syncs.add("format")
        return self.inner.__format__(format_spec)

    def __reduce_ex__(self, protocol: int) -> Any:
        raise TypeError(
            "a fakegpu tensor cannot be pickled, as a CUDA tensor cannot cross to a process "
            "without a GPU: move it to the CPU first (tensor.cpu())"
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


@contextlib.contextmanager
def fake_gpu() -> Iterator[torch.device]:
    """Install the device, enter `FakeGpuMode`, and give the device to compute on."""
    install()
    with FakeGpuMode():
        yield torch.device(DEVICE_TYPE, 0)


class FakeGpuMode(TorchDispatchMode):
    """Sees every op before torch decomposes it, factories included (a factory of the fake
    device that reached the backend would decompose into an ``out=`` op that cannot resize a
    wrapper)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


def to_cpu(value: Any) -> Any:
    """``value`` with every tensor moved to the CPU (for returning results to the test)."""
    return tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, value)


def _is_fake_device(device: Any) -> bool:
    return device is not None and torch.device(device).type == DEVICE_TYPE


def _run(func, args: tuple, kwargs: dict) -> Any:
    if func.namespace == "c10d":
        return _collective(func, args, kwargs)
    leaves, _ = tree_flatten((args, kwargs))
    fakes = [x for x in leaves if isinstance(x, FakeGpuTensor)]
    if fakes and func not in _TRANSFERS:
        _check_devices(func, leaves)
    if fakes and (func in _SYNCS or (func in _TRANSFERS and _to_cpu(func, args, kwargs))):
        _syncs.add(str(func))
    target = kwargs.get("device")
    kwargs = {**kwargs, "device": torch.device("cpu")} if _is_fake_device(target) else kwargs
    wrappers = {id(x.inner): x for x in fakes}
    out = func(*_unwrap(args), **_unwrap(kwargs))
    if "device" in kwargs and target is not None:
        wrap = _is_fake_device(target)
    elif func is aten.copy_.default:
        wrap = isinstance(args[0], FakeGpuTensor)
    else:
        wrap = bool(fakes)
    if not wrap:
        return out
    out = tree_map(lambda x: _wrap(x, wrappers), out)
    for x in tree_flatten(out)[0]:
        if isinstance(x, FakeGpuTensor) and x.shape != x.inner.shape:
            raise AssertionError(f"fake GPU: {func} resized a wrapper; run it in FakeGpuMode")
    return out


def _wrap(x: Any, wrappers: dict[int, FakeGpuTensor]) -> Any:
    """``x`` as a fake-GPU tensor: the argument it is (in-place ops return their input), or new."""
    if type(x) is not torch.Tensor or x.device.type != "cpu":
        return x
    known = wrappers.get(id(x))
    return known if known is not None else FakeGpuTensor(x)


def _to_cpu(func, args: tuple, kwargs: dict) -> bool:
    """Whether a transfer op copies fake-GPU data to the CPU."""
    if func is aten.copy_.default:
        return not isinstance(args[0], FakeGpuTensor)
    device = kwargs.get("device")
    return device is not None and torch.device(device).type == "cpu"


def _check_devices(func, leaves: list) -> None:
    cpu = [
        tuple(x.shape)
        for x in leaves
        if type(x) is torch.Tensor and x.device.type == "cpu" and x.dim() > 0
    ]
    if cpu:
        raise DeviceMismatch(
            f"{func} mixes tensors on {DEVICE_TYPE}:0 with CPU tensors of shapes {cpu}; every "
            "tensor of an op must be on one device (a GPU refuses this too): create the tensor "
            "on its data's device (device=x.device) or move it explicitly"
        )


def _unwrap(tree: Any) -> Any:
    return tree_map(lambda x: x.inner if isinstance(x, FakeGpuTensor) else x, tree)


def _collective(func, args: tuple, kwargs: dict) -> Any:
    """Run a c10d op on the inner CPU tensors; give back the wrappers it returns."""
    leaves, _ = tree_flatten((args, kwargs))
    wrappers = {id(x.inner): x for x in leaves if isinstance(x, FakeGpuTensor)}
    out = func(*_unwrap(args), **_unwrap(kwargs))
    return tree_map(lambda x: wrappers.get(id(x), x) if isinstance(x, torch.Tensor) else x, out)
