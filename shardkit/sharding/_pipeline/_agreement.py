"""Whether every rank still has a batch: the train pipelines' agreement, raised on every rank.

[Note: deferred agreement]
Ranks must agree, batch by batch, on whether each still has one: a rank that ran out must not
leave the others waiting in a collective it never calls. Two ways, chosen per pipeline:

* By header (a model with a sharded collection, the default group): the flag rides the step's
  first collective, which the pipeline itself starts, the input dist of the model's first
  sharded collection a batch's KJT can feed (the lead; not one nested inside another sharded
  module, such as a managed-collision collection's, which sees remapped ids). A rank with a
  batch starts that input dist (its header says "ok"), one without joins the same header
  exchange with an "exhausted" header (`ShardedCollection.join_without_input`), and every
  rank reads every header before the ids' all-to-all: if only some ran out, every rank raises
  `DataExhaustedError` there; if all did, the pipeline stops. So the lead's header exchange
  must be every rank's first collective of the batch: the pipeline decides whether the batch
  feeds the lead before it starts any other collection's input dist. The input dist starts
  where the pipeline takes the batch: at fetch where it overlaps (the next batch's ids travel
  during this step; the other collections' start right after the lead's), else just before
  the batch's forward, which then uses it (the same collectives, in the same order, as a
  plain loop; only the lead's starts early, the others start in their forwards). Where the
  batch feeds the lead, that costs no collective of its own. A batch that feeds the lead
  nothing joins with a "no input" header: a header-only exchange per batch, the one cost of
  its own where the pipeline overlaps. Synchronous, after the first step, the ranks decide
  once, by one all-reduce, whether the lead's forward left its prefetched input unused on any
  rank (a model that builds its own KJT); if so every rank falls back to the flags below from
  the next fetch on, and never switches again (overlapping, the same after the first step
  for every collection prefetched: [Note: prefetches no forward uses] in `_feeds`).
  Assumes what a prefetch does: every rank's batches hold the same features (checked where
  the pipeline overlaps: [Note: prefetch mask]). The lead must be sharded over the whole world (a DMP's
  collections are by default); one sharded over a subgroup, or a pipeline given ``group=``,
  agrees by flags.
* By flags (no lead: a pure dense model, one whose collections all sit inside other sharded
  modules, or another group): the flags are gathered asynchronously at fetch time and checked
  when the batch is taken, one step later, so the tiny all-gather runs beside the step
  instead of in its way. Every rank starts it at the same point of its sequence of
  collectives (a rank without a batch too, which then finishes the step it has), and every
  rank waits for it before the batch's first collective, so ranks that disagree all raise
  there: never a hang. Where the next batch's input dist starts at fetch time (the
  overlapping pipeline) the flags are checked at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.sharding._dist._header import TagMismatchError
from shardkit.sharding._dist._input import RanksExhaustedError

__all__ = ["DataExhaustedError", "Fetched", "any_rank", "any_rank_each", "start_agreement"]


class DataExhaustedError(RuntimeError):
    """Some ranks ran out of batches while others had more."""


def _flag(value: bool | list[int], group: dist.ProcessGroup | None) -> torch.Tensor:
    """``value`` (a flag, or numbers) as a tensor on the device the group carries (a GPU's
    for NCCL)."""
    values = value if isinstance(value, list) else [int(value)]
    return torch.tensor(values, dtype=torch.int64, device=comm.group_device(group))


def start_agreement(
    have: bool, group: dist.ProcessGroup | None, *, tag: int = 0
) -> comm.Handle | None:
    """Start gathering every rank's "I have a batch" flag, and ``tag``, a number every rank
    must send alike ([Note: prefetch mask] in `_feeds`); None without a process
    group."""
    if not dist.is_initialized():
        return None
    mine = _flag([int(have), tag], group)  # [2]
    handle = comm.all_gather_into_tensor(mine, group=group, async_op=True)
    assert isinstance(handle, comm.Handle)
    return handle


def any_rank(value: bool, group: dist.ProcessGroup | None) -> bool:
    """Whether ``value`` holds on any rank of ``group`` (one all-reduce; every rank must call
    it at the same point); ``value`` itself without a process group."""
    if not dist.is_initialized():
        return value
    count = comm.all_reduce(_flag(value, group), group=group)  # how many ranks say so
    assert isinstance(count, torch.Tensor)
    return bool(count.item())


def any_rank_each(values: list[bool], group: dist.ProcessGroup | None) -> list[bool]:
    """`any_rank` of each of ``values`` (one all-reduce; every rank passes as many)."""
    if not dist.is_initialized() or not values:
        return values
    count = comm.all_reduce(_flag([int(v) for v in values], group), group=group)
    assert isinstance(count, torch.Tensor)
    return [n > 0 for n in count.tolist()]


def _exhausted(empty: list[int], count: int) -> DataExhaustedError:
    return DataExhaustedError(
        f"rank(s) {empty} ran out of data after {count} batch(es) while the others have more; "
        "every rank must see the same number of batches (drop the last partial batch, or "
        "split the data evenly across ranks)"
    )


def _check_flags(handle: comm.Handle | None, count: int) -> None:
    """Wait for the flags; raise `DataExhaustedError` on every rank if only some have a batch,
    `TagMismatchError` if the ranks sent other tags."""
    if handle is None:
        return
    gathered = handle.wait().tolist()  # [W * 2]: (flag, tag) per rank
    flags, tags = gathered[0::2], gathered[1::2]
    if not (all(flags) or not any(flags)):
        raise _exhausted([r for r, f in enumerate(flags) if not f], count)
    if len(set(tags)) > 1:
        raise TagMismatchError(tags)


@dataclass
class Fetched:
    """A fetched batch (None: this rank has no more) and how the ranks agree on it (see
    [Note: deferred agreement]): its flags on their way, or ``carry``, which starts the
    batch's input dist with the flag in its header (called with None: joins exhausted)."""

    batch: Any
    flags: comm.Handle | None
    count: int  # batches fetched before this one
    carry: Callable[[Any], None] | None = None

    def take(self) -> Any:
        """The batch (None when every rank has run out); raises if only some ranks have one.
        Agrees once: a second call returns the batch without a collective."""
        flags, self.flags = self.flags, None
        _check_flags(flags, self.count)
        carry, self.carry = self.carry, None
        if carry is not None:
            try:
                carry(self.batch)
            except RanksExhaustedError as error:
                raise _exhausted(error.ranks, self.count) from None
        return self.batch
