"""Recording every collective of a rank started by shardkit.launch, and explaining its timeouts.

`install` (called by `spawn`'s ranks and `init_from_env`) replaces the collectives of the
``torch.distributed`` namespace by wrappers that number and record each call (see
[Note: flight recorder] in `_flight`), starts the rank's watchdog thread (see
[Note: asking the peers] in `_watch`), and turns the timeout of a blocking call into a
`LateRankError` that names the late ranks. User code calling ``dist.all_reduce`` or
``torch.distributed.all_reduce`` is recorded, and so is shardkit.comm, which calls them the same
way; a name imported before the rank started (``from torch.distributed import all_reduce`` at
the top of the main script) keeps torch's function and is not recorded.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from shardkit.launch._flight import Record, Recorder
from shardkit.launch._hang import (
    HangReport,
    LateRankError,
    describe_ranks,
    diagnose,
    is_peer_loss,
    is_timeout,
    warning_line,
)
from shardkit.launch._watch import Channel, Watchdog, WatchdogThread

__all__ = [
    "explain",
    "finish_run",
    "hang_report",
    "install",
    "start_run",
    "uninstall",
    "whereabouts",
]

logger = logging.getLogger(__name__)

# The collectives recorded -> the position of the argument whose shape and dtype describe a call
# (None: it has no single tensor to show, e.g. lists or objects).
_COLLECTIVES: dict[str, int | None] = {
    "all_reduce": 0,
    "broadcast": 0,
    "reduce": 0,
    "gather": 0,
    "scatter": 0,
    "all_gather": 1,
    "all_gather_into_tensor": 1,
    "all_gather_single": 1,
    "reduce_scatter": 0,
    "reduce_scatter_tensor": 1,
    "reduce_scatter_single": 1,
    "all_to_all_single": 1,
    "all_to_all": None,
    "all_reduce_coalesced": None,
    "all_gather_coalesced": None,
    "barrier": None,
    "monitored_barrier": None,
    "all_gather_object": None,
    "broadcast_object_list": None,
    "gather_object": None,
    "scatter_object_list": None,
}


class _Session:
    def __init__(self, recorder: Recorder, channel: Channel, originals: dict[str, Any]) -> None:
        self.recorder = recorder
        self.channel = channel
        self.originals = originals
        self.thread = WatchdogThread(channel, functools.partial(_warn, channel))


_session: _Session | None = None


def install(
    store: dist.Store, *, rank: int, world_size: int, timeout_s: float, watchdog: Watchdog
) -> None:
    """Record this process's collectives and start its watchdog (once per process group)."""
    global _session
    if _session is not None:
        uninstall()
    recorder = Recorder(rank=rank, world_size=world_size, timeout_s=timeout_s)
    channel = Channel(store, recorder, watchdog)
    originals = {name: getattr(dist, name) for name in _COLLECTIVES if hasattr(dist, name)}
    _session = _Session(recorder, channel, originals)
    for name, fn in originals.items():
        setattr(dist, name, _wrap(name, fn))


def uninstall(*, ended: bool = False) -> None:
    """Stop recording; ``ended``: the program is over, tell the ranks that may still wait."""
    global _session
    session, _session = _session, None
    if session is None:
        return
    session.thread.stop()
    for name, fn in session.originals.items():
        setattr(dist, name, fn)
    if ended:
        try:
            session.channel.last_word()
        except Exception as exc:  # the store's host is gone: nobody is left to tell
            logger.debug("rank %d could not leave its last word: %s", session.recorder.rank, exc)


def start_run() -> None:
    if _session is not None:
        _session.recorder.start_run()


def finish_run() -> None:
    if _session is not None:
        _session.recorder.finish_run()


def hang_report(group: dist.ProcessGroup | None = None) -> HangReport | None:
    """Ask every rank where it is and say which have not reached this rank's latest collective
    (on ``group``; None: on every group). None when this process records no collectives (it was
    not started by shardkit.launch, or with ``watchdog=None``)."""
    session = _session
    if session is None:
        return None
    record = None
    if group is not None:
        state = session.recorder.group(str(group.group_name))
        record = state.last if state is not None else None
    asked_at = time.monotonic()
    return diagnose(session.recorder, session.channel.ask(), record, asked_at=asked_at)


def whereabouts(ranks: list[int]) -> str:
    """Where each of ``ranks`` is now (their last collective and stack); empty when this process
    records no collectives."""
    session = _session
    if session is None:
        return ""
    return describe_ranks(session.channel.ask(), ranks)


def explain(exc: BaseException, record: Record | None = None) -> LateRankError | None:
    """``exc`` as a `LateRankError` naming the late ranks, if it is a timeout (or a peer's
    connection closed: a rank whose program ended) and this process records its collectives;
    else None."""
    session = _session
    if session is None or isinstance(exc, LateRankError) or session.recorder.latest is None:
        return None  # (nothing recorded: what waited was a call the recorder does not see)
    timed_out = is_timeout(exc)
    if not timed_out and not is_peer_loss(exc):
        return None
    asked_at = time.monotonic()
    report = diagnose(session.recorder, session.channel.ask(), record, asked_at=asked_at)
    if not timed_out and not report.late_ranks:
        return None  # every rank reached it: a peer's failure, not lateness, closed the connection
    call = (
        f"collective {report.collective}" if record is None else f"torch.distributed.{record.name}"
    )
    rank, timeout = session.recorder.rank, session.recorder.timeout_s
    if timed_out:
        what = f"timed out on rank {rank} after {report.waited_s:.1f} s (timeout {timeout:g} s)"
    else:
        what = f"failed on rank {rank} after {report.waited_s:.1f} s: a peer closed its connection"
    message = f"{call} {what}: {report.text}\nBackend said: {exc}"
    return LateRankError(message, report, str(exc))


def _warn(channel: Channel, record: Record) -> None:
    asked_at = time.monotonic()
    answers = channel.ask(meanwhile=channel.answer_if_asked)
    report = diagnose(channel.recorder, answers, record, asked_at=asked_at)
    if report.lines:
        logger.warning(warning_line(channel.recorder, report))


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    params = list(inspect.signature(fn).parameters)
    described = _COLLECTIVES[name]
    described_name = params[described] if described is not None else ""
    group_at = params.index("group")
    async_at = params.index("async_op") if "async_op" in params else len(params)

    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        session = _session
        if session is None:
            return fn(*args, **kwargs)
        group = args[group_at] if len(args) > group_at else kwargs.get("group")
        is_async = args[async_at] if len(args) > async_at else kwargs.get("async_op", False)
        if described is None:
            tensor = None
        else:
            tensor = args[described] if len(args) > described else kwargs.get(described_name)
        record = session.recorder.enter(name, group, tensor, not is_async)
        if record is None:
            return fn(*args, **kwargs)
        try:
            result = fn(*args, **kwargs)
        except RuntimeError as exc:
            better = explain(exc, record)
            if better is None:
                raise
            raise better from exc
        if not is_async:
            record.returned = time.monotonic()
        return result

    return recorded
