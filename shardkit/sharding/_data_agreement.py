"""Whether every rank still has a batch: the train pipelines' agreement, raised on every rank.

[Note: deferred agreement]
The flags are gathered asynchronously at fetch time and checked when the batch is taken, one
step later, so the tiny all-gather runs beside the step instead of in its way. Every rank
starts it at the same point of its sequence of collectives (a rank without a batch too, which
then finishes the step it has), and every rank waits for it before the batch's first
collective, so ranks that disagree all raise there: never a hang. Where the next batch's input
dist starts at fetch time (the overlapping pipeline) the flags are checked at once instead: a
rank must know before it starts a collective the others may not.

On gloo (CPU) the flags are instead summed by one blocking all-reduce when the batch is taken,
at that same point of every rank's sequence of collectives: gloo runs a collective on its own
threads either way, so an asynchronous one hides nothing on a busy CPU and only costs a wake-up
of those threads (measured: about 0.3 ms of CPU per step for the asynchronous all-gather, 0.1 ms
for the blocking sum; in a pipeline that cannot overlap, `bench_dmp.py`'s tiny steps are 4 ms).
Only when the sum says some ranks have a batch and others not do the ranks gather the flags, to
name the ranks that ran out; every rank sees the same sum, so all of them take that branch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from shardkit import comm

__all__ = ["DataExhaustedError", "Fetched", "Flags", "start_agreement"]


class DataExhaustedError(RuntimeError):
    """Some ranks ran out of batches while others had more."""


class Flags(Protocol):
    """Every rank's "I have a batch" flag, on its way: `wait` returns them ``[W]`` int64."""

    def wait(self) -> torch.Tensor: ...


def start_agreement(have: bool, group: dist.ProcessGroup | None) -> Flags | None:
    """Start gathering every rank's "I have a batch" flag (None without a process group).
    The flags travel on the device the group carries (a GPU's for NCCL); on gloo they are
    summed when taken (see [Note: deferred agreement])."""
    if not dist.is_initialized():
        return None
    if dist.get_backend(group) == "gloo":
        return _SummedOnTake(have, group)
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([int(have)], dtype=torch.int64, device=device)
    handle = comm.all_gather_into_tensor(flag, group=group, async_op=True)
    assert isinstance(handle, comm.Handle)
    return handle


class _SummedOnTake:
    """gloo's flags: one blocking sum when taken; gathered only when the ranks disagree."""

    def __init__(self, have: bool, group: dist.ProcessGroup | None) -> None:
        self._flag = torch.tensor([int(have)], dtype=torch.int64)
        self._group = group

    def wait(self) -> torch.Tensor:
        world = dist.get_world_size(self._group)
        total = comm.all_reduce(self._flag, group=self._group)
        assert isinstance(total, torch.Tensor)
        have = int(total)
        if have in (0, world):
            return torch.full((world,), have // world, dtype=torch.int64)
        gathered = comm.all_gather_into_tensor(self._flag, group=self._group)
        assert isinstance(gathered, torch.Tensor)
        return gathered


def _check_flags(handle: Flags | None, count: int) -> None:
    """Wait for the flags; raise `DataExhaustedError` on every rank if only some have a batch."""
    if handle is None:
        return
    flags = handle.wait().tolist()
    if all(flags) or not any(flags):
        return
    empty = [r for r, f in enumerate(flags) if not f]
    raise DataExhaustedError(
        f"rank(s) {empty} ran out of data after {count} batch(es) while the others have more; "
        "every rank must see the same number of batches (drop the last partial batch, or "
        "split the data evenly across ranks)"
    )


@dataclass
class Fetched:
    """A fetched batch (None: this rank has no more) and the ranks' flags on their way (see
    [Note: deferred agreement])."""

    batch: Any
    flags: Flags | None
    count: int  # batches fetched before this one

    def take(self) -> Any:
        """The batch (None when every rank has run out); raises if only some ranks have one."""
        flags, self.flags = self.flags, None
        _check_flags(flags, self.count)
        return self.batch
