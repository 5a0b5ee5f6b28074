"""Whether every rank still has a batch: the train pipelines' agreement, raised on every rank.

[Note: deferred agreement]
The flags are gathered asynchronously at fetch time and checked when the batch is taken, one
step later, so the tiny all-gather runs beside the step instead of in its way. Every rank
starts it at the same point of its sequence of collectives (a rank without a batch too, which
then finishes the step it has), and every rank waits for it before the batch's first
collective, so ranks that disagree all raise there: never a hang. Where the next batch's input
dist starts at fetch time (the overlapping pipeline) the flags are checked at once instead: a
rank must know before it starts a collective the others may not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shardkit import comm

__all__ = ["DataExhaustedError", "Fetched", "start_agreement"]


class DataExhaustedError(RuntimeError):
    """Some ranks ran out of batches while others had more."""


def start_agreement(have: bool, group: dist.ProcessGroup | None) -> comm.Handle | None:
    """Start gathering every rank's "I have a batch" flag (None without a process group).
    The flags travel on the device the group carries (a GPU's for NCCL)."""
    if not dist.is_initialized():
        return None
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([int(have)], dtype=torch.int64, device=device)
    handle = comm.all_gather_into_tensor(flag, group=group, async_op=True)
    assert isinstance(handle, comm.Handle)
    return handle


def _check_flags(handle: comm.Handle | None, count: int) -> None:
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
    flags: comm.Handle | None
    count: int  # batches fetched before this one

    def take(self) -> Any:
        """The batch (None when every rank has run out); raises if only some ranks have one."""
        flags, self.flags = self.flags, None
        _check_flags(flags, self.count)
        return self.batch
