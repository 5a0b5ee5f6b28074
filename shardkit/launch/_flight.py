"""The flight recorder: what collectives this rank issued, numbered per process group.

[Note: flight recorder]
In a rank started by shardkit.launch, every collective of the ``torch.distributed`` namespace
(shardkit.comm's go through it too, see `_intercept`) on a group this rank belongs to takes the
next sequence number of that group and leaves a `Record`: the call's name, the shape and dtype of
its input, when it started and, for a blocking call, when it returned. Every rank of a group
issues that group's collectives in the same order, so the numbers compare across ranks: a rank
whose count on a group is below the number another rank waits in has not reached that collective.
The records stay in this process (a ring of the last `RING_SIZE`); nothing is sent while all
goes well. A rank tells the others its `PeerState` only when one of them asks (see
[Note: asking the peers] in `_watch`). Point-to-point calls (send, recv) are not numbered: they
pair two ranks, not a group.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["PeerState", "Record", "RecordView", "Recorder"]

RING_SIZE = 64
# Innermost frames of a rank's stack shown in a report; enough to see the caller of the caller.
STACK_FRAMES = 8
# Frames of no interest in a rank's stack: the rank's main loop (and what started it), and the
# recorder's wrapper around each collective.
_WORKER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_worker.py")
_WRAPPER_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_intercept.py")


class Record:
    """One collective call on this rank. Slots, and no formatting until a report needs it: one is
    made per collective (see the overhead in docs/launch-and-comm.md)."""

    __slots__ = ("blocking", "dtype", "group", "name", "returned", "seq", "shape", "started")

    def __init__(
        self, seq: int, name: str, group: str, tensor: Any, blocking: bool, started: float
    ) -> None:
        self.seq = seq
        self.name = name
        self.group = group
        is_tensor = isinstance(tensor, torch.Tensor)
        self.shape = tensor.shape if is_tensor else None
        self.dtype = tensor.dtype if is_tensor else None
        self.blocking = blocking
        self.started = started
        self.returned: float | None = None

    def describe(self) -> str:
        """``all_reduce [4] float32``; the name alone when the call has no tensor input."""
        if self.shape is None:
            return self.name
        dims = ", ".join(str(d) for d in self.shape)
        return f"{self.name} [{dims}] {str(self.dtype).removeprefix('torch.')}"

    def view(self, now: float) -> RecordView:
        returned = None if self.returned is None else now - self.returned
        return RecordView(self.group, self.seq, self.describe(), now - self.started, returned)


@dataclass(frozen=True)
class RecordView:
    """A `Record` as another rank sees it: ages in seconds, measured by the rank that made it."""

    group: str
    seq: int
    description: str
    started_s_ago: float
    returned_s_ago: float | None  # None: still in it, or launched with async_op=True

    def position(self) -> str:
        """``#16 (broadcast [2] int64) since 20.1 s``."""
        since = self.started_s_ago if self.returned_s_ago is None else self.returned_s_ago
        return f"#{self.seq} ({self.description}) since {since:.1f} s"


@dataclass(frozen=True)
class PeerState:
    """What one rank answers when asked where it is (see [Note: asking the peers] in `_watch`).

    ``counts`` maps a group's name to the number of collectives this rank issued on it;
    ``records`` are its last ones, oldest first; ``stack`` the innermost frames of its main
    thread; ``finished_s_ago`` is set when its function returned (spawn) or its program ended.
    """

    rank: int
    answered: int
    counts: dict[str, int]
    records: tuple[RecordView, ...]
    stack: str = ""
    finished_s_ago: float | None = None
    exited: bool = False

    def last_on(self, group: str) -> RecordView | None:
        for view in reversed(self.records):
            if view.group == group:
                return view
        return None

    def record(self, group: str, seq: int) -> RecordView | None:
        for view in self.records:
            if view.group == group and view.seq == seq:
                return view
        return None


class _Group:
    """This rank's view of one process group: its name (the same on every rank), members, count."""

    __slots__ = ("is_member", "label", "last", "name", "ranks", "seq")

    def __init__(self, name: str, ranks: tuple[int, ...], is_member: bool, label: str) -> None:
        self.name = name
        self.ranks = ranks
        self.is_member = is_member
        self.label = label
        self.seq = 0
        self.last: Record | None = None


class Recorder:
    """The records of this process. `enter` is the only method on the path of a collective."""

    def __init__(self, *, rank: int, world_size: int, timeout_s: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.ring: deque[Record] = deque(maxlen=RING_SIZE)
        self.latest: Record | None = None
        self.finished_at: float | None = None
        self._groups: dict[Any, _Group] = {}
        self._main_thread = threading.main_thread().ident

    def enter(self, name: str, group: Any, tensor: Any, blocking: bool) -> Record | None:
        """Number and record a collective on ``group``; None if this rank is not a member."""
        state = self._groups.get(group)
        if state is None:
            state = self._groups[group] = self._resolve(group)
        if not state.is_member:
            return None
        state.seq += 1
        record = Record(state.seq, name, state.name, tensor, blocking, time.monotonic())
        state.last = record
        self.ring.append(record)
        self.latest = record
        return record

    def start_run(self) -> None:
        self.finished_at = None

    def finish_run(self) -> None:
        self.finished_at = time.monotonic()

    def group(self, name: str) -> _Group | None:
        for state in list(self._groups.values()):
            if state.name == name and state.is_member:
                return state
        return None

    def groups(self) -> list[_Group]:
        """The groups this rank issued collectives on, each once."""
        unique = {state.name: state for state in list(self._groups.values()) if state.is_member}
        return list(unique.values())

    def record(self, group: str, seq: int) -> Record | None:
        for record in list(self.ring):
            if record.group == group and record.seq == seq:
                return record
        return None

    def state(self, answered: int, *, exited: bool = False) -> PeerState:
        now = time.monotonic()
        finished = None if self.finished_at is None else now - self.finished_at
        return PeerState(
            rank=self.rank,
            answered=answered,
            counts={state.name: state.seq for state in self.groups()},
            records=tuple(record.view(now) for record in list(self.ring)),
            stack="" if exited or finished is not None else self.main_stack(),
            finished_s_ago=finished,
            exited=exited,
        )

    def main_stack(self) -> str:
        """The innermost frames of the main thread, from the rank's function on (in spawn)."""
        frame = sys._current_frames().get(self._main_thread or 0)
        if frame is None:
            return ""
        stack = traceback.extract_stack(frame)
        start = max((i + 1 for i, f in enumerate(stack) if f.filename == _WORKER_FILE), default=0)
        frames = [f for f in stack[start:] if f.filename != _WRAPPER_FILE]
        return "".join(traceback.format_list(frames[-STACK_FRAMES:])).rstrip()

    def _resolve(self, group: Any) -> _Group:
        pg = dist.group.WORLD if group is None else group
        if pg is None:
            return _Group("", (), False, "")
        try:
            ranks = tuple(dist.get_process_group_ranks(pg))
            name = str(pg.group_name)
        except (RuntimeError, ValueError, AttributeError):
            return _Group("", (), False, "")  # torch's marker for "not in this group"
        is_world = len(ranks) == self.world_size and pg is dist.group.WORLD
        label = "" if is_world else f" of group {list(ranks)}"
        return _Group(name, ranks, self.rank in ranks, label)
