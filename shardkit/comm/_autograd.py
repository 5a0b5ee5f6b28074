"""Run an op from `_ops` synchronously or asynchronously, with or without autograd.

[Note: async autograd]
A differentiable collective is two autograd nodes sharing one `_Request`. `_Start` launches the
collective and returns its (not yet filled) buffer; `_Wait`, applied when the caller waits, blocks
and returns the finished output. In backward the order flips: `_Wait.backward` launches the
adjoint collective (see [Note: adjoints]) and returns at once, so the autograd engine can run the
backward of whatever was computed between launch and wait while the adjoint is in flight;
`_Start.backward` then waits for it. Overlap in forward therefore becomes overlap in backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.autograd.function import once_differentiable

from shardkit.comm import _debug
from shardkit.comm._label import label
from shardkit.comm._ops import Launched

__all__ = ["Handle", "Op", "run"]


class Op(Protocol):
    name: str

    def launch(self, x: torch.Tensor, async_op: bool = True) -> Launched: ...

    def adjoint(self) -> Op: ...


class Handle:
    """An asynchronous collective. `wait()` blocks until it is done and returns its output."""

    def __init__(self, launched: Launched, finish: Callable[[], torch.Tensor]) -> None:
        self._launched = launched
        self._finish: Callable[[], torch.Tensor] | None = finish
        self._result: torch.Tensor | None = None

    def is_completed(self) -> bool:
        """Whether the data has arrived (`wait()` would not block)."""
        return self._result is not None or self._launched.is_completed()

    def wait(self) -> torch.Tensor:
        """Block until the collective is done; returns the output (the same one every call)."""
        if self._finish is not None:
            self._result = self._finish()
            self._finish = None
        assert self._result is not None
        return self._result

    def __repr__(self) -> str:
        state = "done" if self.is_completed() else "in flight"
        return f"Handle({self._launched.name}, {state})"


def run(
    op: Any, x: torch.Tensor, *, async_op: bool, out: torch.Tensor | None = None
) -> torch.Tensor | Handle:
    """Launch ``op`` on ``x``; return its output, or a `Handle` when ``async_op``. ``out``
    (not differentiable): the tensor to write the output into."""
    if torch.is_grad_enabled() and x.requires_grad:
        assert out is None, "out= is refused for differentiable calls before this"
        request = _Request(op)
        buffer = _Start.apply(request, x)
        assert request.forward is not None
        handle = Handle(request.forward, lambda: _Wait.apply(request, buffer))
    else:
        # A blocking call lets the backend skip the hand-off to its worker thread.
        launched = op.launch(x, async_op) if out is None else op.launch(x, async_op, out=out)
        handle = Handle(launched, launched.finish)
    return handle if async_op else handle.wait()


class _Request:
    """What `_Start` and `_Wait` share. See [Note: async autograd]."""

    __slots__ = ("backward", "forward", "op")

    def __init__(self, op: Any) -> None:
        self.op = op
        self.forward: Launched | None = None
        self.backward: Launched | None = None


class _Start(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, request: _Request, x: torch.Tensor) -> torch.Tensor:
        ctx.request = request
        request.forward = request.op.launch(x)
        return request.forward.buffer

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, _placeholder: torch.Tensor) -> tuple[None, torch.Tensor]:
        launched = ctx.request.backward
        ctx.request = None
        return None, launched.finish()


class _Wait(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, request: _Request, buffer: torch.Tensor) -> torch.Tensor:
        ctx.request = request
        ctx.buffer_meta = (buffer.dtype, buffer.device, buffer.shape)
        assert request.forward is not None, "_Start launches the request before _Wait runs"
        return request.forward.finish()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        request = ctx.request
        adjoint = request.op.adjoint()
        with label(f"shardkit::{request.op.name}.backward"):
            if _debug.enabled():
                _debug.check(adjoint, grad)
            request.backward = adjoint.launch(grad.contiguous())
        dtype, device, shape = ctx.buffer_meta
        # `_Start.backward` ignores this gradient and waits for the adjoint instead; an expanded
        # scalar has the right shape and costs no memory.
        return None, torch.empty((), dtype=dtype, device=device).expand(shape)
