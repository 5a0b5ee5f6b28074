"""The collectives as plain ops: each one launches asynchronously and knows its adjoint.

[Note: adjoints]
In SPMD autograd every rank computes its own loss and the gradient of a rank's input sums the
contributions of all ranks' losses. So the adjoint of all-gather is a SUM reduce-scatter, of a
SUM reduce-scatter an all-gather, of all-to-all the all-to-all with the split sizes swapped, of
all-reduce(SUM) all-reduce(SUM), and of broadcast a SUM reduce to the source. AVG is SUM with
``scale = 1 / group size``, and a scale carries over to the adjoint unchanged.

[Note: uneven sizes]
Backends want equal chunks for all-gather and reduce-scatter. Uneven chunks are padded to the
largest one, moved with the native op, and trimmed: extra bytes are ``(max - min) * world size``
rows at most, and one native call beats ``world_size`` smaller ones. A backend without a native
reduce-scatter gets the same result from an all-to-all followed by a local reduction.

[Note: out buffers]
All-gather and reduce-scatter take an ``out`` tensor to write into instead of allocating one
(FSDP reuses its gather and gradient buffers step after step: no freshly mapped memory to fault
in, no copy afterwards). Only with equal chunks on every rank, where the backend writes straight
into it; uneven chunks would need a padded buffer and a copy, which is what ``out`` avoids. The
caller checks ``out`` (`shardkit.comm`'s functions do) and must not read it before the wait.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from shardkit.comm._errors import collective_error
from shardkit.comm._exit import remember
from shardkit.comm._label import label
from shardkit.comm._placement import check_placement

__all__ = ["AllGather", "AllReduce", "AllToAll", "Broadcast", "Launched", "Reduce", "ReduceScatter"]

Group = dist.ProcessGroup | None
# torch's stubs type ``dist.ReduceOp.SUM`` and its kin as ``ReduceOp.RedOpType``, the enum that
# ``dist.all_reduce`` and friends take alongside a ``ReduceOp`` instance.
ReduceOpLike = dist.ReduceOp | dist.ReduceOp.RedOpType


# torch 2.13's single-tensor collectives, or, before them, the names that NCCL (and gloo's
# all-gather) already served: the GPU machines' images may hold an older torch than the CPU
# set-up pins (see scripts/gpu_run.sh). Looked up at each call, as tests patch them.
def _all_gather_single(*args: Any, **kwargs: Any) -> dist.Work | None:
    return getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(*args, **kwargs)


def _reduce_scatter_single(*args: Any, **kwargs: Any) -> dist.Work | None:
    return getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(*args, **kwargs)


# Backends with a reduce_scatter_single of their own; any other uses the all-to-all fallback.
# (gloo's came with torch 2.13's reduce_scatter_single.)
_HAS_REDUCE_SCATTER = frozenset(
    {"gloo", "nccl"} if hasattr(dist, "reduce_scatter_single") else {"nccl"}
)
# Those whose own beats an all-to-all plus a local sum. gloo's costs about an all-reduce:
# measured on CPU with 2-4 ranks, 256 KiB to 16 MiB, the all-to-all path took 0.4-0.6x its
# time (same sums, in rank order). NCCL's is a ring that moves each byte once.
_FASTER_REDUCE_SCATTER = frozenset({"nccl"})


@dataclass
class Launched:
    """A collective in flight (``work`` is None once done, or if it ran synchronously).
    `finish` waits for it and returns its output."""

    name: str
    group: Group
    work: dist.Work | None
    buffer: torch.Tensor
    post: Callable[[torch.Tensor], torch.Tensor] | None = None

    def is_completed(self) -> bool:
        return self.work is None or self.work.is_completed()

    def finish(self) -> torch.Tensor:
        if self.work is not None:
            with label(f"shardkit::{self.name}.wait"):
                try:
                    self.work.wait()
                except RuntimeError as exc:
                    raise collective_error(self.name, self.group, exc) from exc
            self.work = None
        return self.buffer if self.post is None else self.post(self.buffer)


def _launch(
    name: str, group: Group, call: Callable[[], dist.Work | None], *handed: torch.Tensor
) -> dist.Work | None:
    """``call()`` (the backend's collective on the ``handed`` tensors), errors named."""
    check_placement(name, group, _backend_for(group, torch.device("cpu")), handed)
    remember(*handed)  # See [Note: gloo at exit]
    with label(f"shardkit::{name}"):
        try:
            return call()
        except RuntimeError as exc:
            raise collective_error(name, group, exc) from exc


def _scaled(scale: float) -> Callable[[torch.Tensor], torch.Tensor] | None:
    if scale == 1.0:
        return None
    return lambda t: t.mul_(scale)


@dataclass(frozen=True)
class AllToAll:
    """Rank ``r`` sends rows ``input_split_sizes[j]`` to rank ``j``, receives per source rank."""

    group: Group
    input_split_sizes: tuple[int, ...]
    output_split_sizes: tuple[int, ...]
    name: ClassVar[str] = "all_to_all_single"

    def launch(self, x: torch.Tensor, async_op: bool = True) -> Launched:
        out = x.new_empty((sum(self.output_split_sizes), *x.shape[1:]))
        src = x.contiguous()
        work = _launch(
            self.name,
            self.group,
            lambda: dist.all_to_all_single(
                out,
                src,
                list(self.output_split_sizes),
                list(self.input_split_sizes),
                group=self.group,
                async_op=async_op,
            ),
            out,
            src,
        )
        return Launched(self.name, self.group, work, out)

    def adjoint(self) -> AllToAll:
        return AllToAll(self.group, self.output_split_sizes, self.input_split_sizes)


@dataclass(frozen=True)
class AllGather:
    """Concatenate every rank's rows in rank order; rank ``r`` gives ``output_split_sizes[r]``."""

    group: Group
    output_split_sizes: tuple[int, ...]
    scale: float = 1.0
    name: ClassVar[str] = "all_gather_into_tensor"

    def launch(
        self, x: torch.Tensor, async_op: bool = True, out: torch.Tensor | None = None
    ) -> Launched:
        """``out``: where to gather (equal sizes only; see [Note: out buffers])."""
        sizes = self.output_split_sizes
        chunk = max(sizes)
        if x.size(0) < chunk:  # See [Note: uneven sizes]
            x = torch.cat([x, x.new_zeros((chunk - x.size(0), *x.shape[1:]))])
        if out is None:
            out = x.new_empty((len(sizes) * chunk, *x.shape[1:]))
        src = x.contiguous()
        work = _launch(
            self.name,
            self.group,
            lambda: _all_gather_single(out, src, group=self.group, async_op=async_op),
            out,
            src,
        )
        post = _scaled(self.scale)
        if min(sizes) != chunk:
            post = _compose(_trim_chunks(sizes, chunk), post)
        return Launched(self.name, self.group, work, out, post)

    def adjoint(self) -> ReduceScatter:
        return ReduceScatter(self.group, dist.ReduceOp.SUM, self.output_split_sizes, self.scale)


@dataclass(frozen=True)
class ReduceScatter:
    """Reduce the inputs of all ranks and keep chunk ``r`` (``input_split_sizes[r]`` rows) on r."""

    group: Group
    op: ReduceOpLike
    input_split_sizes: tuple[int, ...]
    scale: float = 1.0
    via_all_to_all: bool | None = None  # None: by backend (_NATIVE_REDUCE_SCATTER)
    name: ClassVar[str] = "reduce_scatter_tensor"

    def launch(
        self, x: torch.Tensor, async_op: bool = True, out: torch.Tensor | None = None
    ) -> Launched:
        """``out``: where this rank's chunk goes (equal sizes only; see [Note: out buffers])."""
        backend = _backend_for(self.group, x.device)
        via = self.via_all_to_all
        if via is None:
            via = backend not in _FASTER_REDUCE_SCATTER
        elif not via and backend not in _HAS_REDUCE_SCATTER:
            via = True  # the backend has none of its own
        if via:
            return self._launch_via_all_to_all(x, async_op, out)
        sizes = self.input_split_sizes
        chunk = max(sizes)
        tail = x.shape[1:]
        if min(sizes) != chunk:  # See [Note: uneven sizes]
            padded = x.new_zeros((len(sizes), chunk, *tail))
            for r, piece in enumerate(torch.split(x, list(sizes))):
                padded[r, : piece.size(0)] = piece
            x = padded.view(len(sizes) * chunk, *tail)
        if out is None:
            out = x.new_empty((chunk, *tail))
        src = x.contiguous()
        work = _launch(
            self.name,
            self.group,
            lambda: _reduce_scatter_single(
                out, src, op=self.op, group=self.group, async_op=async_op
            ),
            out,
            src,
        )
        mine = sizes[dist.get_rank(self.group)]
        post = _scaled(self.scale)
        if mine != chunk:
            post = _compose(lambda t: t[:mine], post)
        return Launched(self.name, self.group, work, out, post)

    def _launch_via_all_to_all(
        self, x: torch.Tensor, async_op: bool, out: torch.Tensor | None
    ) -> Launched:
        sizes = self.input_split_sizes
        num_ranks = len(sizes)
        mine = sizes[dist.get_rank(self.group)]
        exchange = AllToAll(self.group, sizes, (mine,) * num_ranks).launch(x, async_op)
        reduce = _LOCAL_REDUCTIONS[_op_name(self.op)]
        scale = self.scale

        def post(received: torch.Tensor) -> torch.Tensor:
            result = reduce(received.view(num_ranks, mine, *received.shape[1:]))
            if out is not None:
                result = out.copy_(result)
            return result.mul_(scale) if scale != 1.0 else result

        return Launched(self.name, self.group, exchange.work, exchange.buffer, post)

    def adjoint(self) -> AllGather:
        return AllGather(self.group, self.input_split_sizes, self.scale)


@dataclass(frozen=True)
class AllReduce:
    """Every rank gets the reduction of all ranks' tensors."""

    group: Group
    op: ReduceOpLike
    scale: float = 1.0
    inplace: bool = False
    name: ClassVar[str] = "all_reduce"

    def launch(self, x: torch.Tensor, async_op: bool = True) -> Launched:
        out = x if self.inplace else x.clone(memory_format=torch.contiguous_format)
        work = _launch(
            self.name,
            self.group,
            lambda: dist.all_reduce(out, op=self.op, group=self.group, async_op=async_op),
            out,
        )
        return Launched(self.name, self.group, work, out, _scaled(self.scale))

    def adjoint(self) -> AllReduce:
        return AllReduce(self.group, dist.ReduceOp.SUM, self.scale)


@dataclass(frozen=True)
class Broadcast:
    """Every rank gets the tensor of global rank ``src``."""

    group: Group
    src: int
    inplace: bool = False
    name: ClassVar[str] = "broadcast"

    def launch(self, x: torch.Tensor, async_op: bool = True) -> Launched:
        if self.inplace:
            out = x
        elif dist.get_rank() == self.src:
            out = x.clone(memory_format=torch.contiguous_format)
        else:
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
        work = _launch(
            self.name,
            self.group,
            lambda: dist.broadcast(out, src=self.src, group=self.group, async_op=async_op),
            out,
        )
        return Launched(self.name, self.group, work, out)

    def adjoint(self) -> Reduce:
        return Reduce(self.group, self.src)


@dataclass(frozen=True)
class Reduce:
    """Global rank ``dst`` gets the SUM of all ranks' tensors; the others get zeros."""

    group: Group
    dst: int
    name: ClassVar[str] = "reduce"

    def launch(self, x: torch.Tensor, async_op: bool = True) -> Launched:
        out = x.clone(memory_format=torch.contiguous_format)
        work = _launch(
            self.name,
            self.group,
            lambda: dist.reduce(out, dst=self.dst, group=self.group, async_op=async_op),
            out,
        )
        post = None if dist.get_rank() == self.dst else torch.zeros_like
        return Launched(self.name, self.group, work, out, post)

    def adjoint(self) -> Broadcast:
        return Broadcast(self.group, self.dst)


def _backend_for(group: Group, device: torch.device) -> str:
    """The backend that carries ``device``'s tensors in ``group`` (one name, or one per device
    type in a group made with, e.g., ``backend="cpu:gloo,cuda:nccl"``)."""
    name = str(dist.get_backend(group))
    if ":" not in name:
        return name
    for part in name.split(","):
        device_type, _, backend = part.partition(":")
        if device_type.strip() == device.type:
            return backend.strip()
    return name


def _trim_chunks(sizes: tuple[int, ...], chunk: int) -> Callable[[torch.Tensor], torch.Tensor]:
    def trim(out: torch.Tensor) -> torch.Tensor:
        return torch.cat([out[r * chunk : r * chunk + size] for r, size in enumerate(sizes)])

    return trim


def _compose(
    first: Callable[[torch.Tensor], torch.Tensor],
    then: Callable[[torch.Tensor], torch.Tensor] | None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    if then is None:
        return first
    return lambda t: then(first(t))


def _op_name(op: ReduceOpLike) -> str:
    for name in ("SUM", "MAX", "MIN", "PRODUCT"):
        if op == getattr(dist.ReduceOp, name):
            return name
    raise ValueError(f"unsupported reduce op {op}; use SUM, AVG, MAX, MIN or PRODUCT")


_LOCAL_REDUCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "SUM": lambda t: t.sum(0),
    "MAX": lambda t: t.amax(0),
    "MIN": lambda t: t.amin(0),
    "PRODUCT": lambda t: t.prod(0),
}
