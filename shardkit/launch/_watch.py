"""Each rank's watchdog thread: answers the other ranks' questions, warns about late ranks.

[Note: asking the peers]
A rank that wants to know where the others are (its collective has waited a while, or timed out)
adds 1 to the store's counter ``shardkit/flight/asks`` and reads every rank's answer under
``shardkit/flight/answer/<rank>``. Each rank's watchdog thread polls the counter every `poll_s`
and, when it moved, writes its `PeerState` (records, counts, its main thread's stack) marked with
the counter's value; the asker takes the answers marked with its own number or later. So nothing
is written while all goes well, one answer per rank serves every rank that asks at once, and a
rank answers while its main thread sleeps, computes or waits in a collective (all of them let
the thread run). A rank whose program ended leaves a last answer that satisfies every later
question. A rank that does not answer in time (stuck in native code that holds the GIL, or gone)
is named as such.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from shardkit.launch._flight import PeerState, Record, Recorder

__all__ = ["Channel", "Watchdog", "WatchdogThread"]

logger = logging.getLogger(__name__)

_ASKS = "shardkit/flight/asks"
_ANSWER = "shardkit/flight/answer/{}"
_LAST_WORD = 2**62  # the `answered` mark of a rank whose program ended: later than any question


@dataclass(frozen=True)
class Watchdog:
    """How ranks started by shardkit.launch name the rank a collective waits for.

    Every rank records its collectives (see docs/launch-and-comm.md, "When a rank is late"); a
    timeout then says which rank has not reached the collective and where it is instead.

    Args:
        warn_fraction: once a collective has waited this fraction of the collective timeout,
            log a warning naming the ranks that have not reached it (None: no warning).
        answer_s: the longest a rank waits for the others' answers before it reports (those
            that did not answer are named as such).
    """

    warn_fraction: float | None = 0.25
    answer_s: float = 3.0

    def __post_init__(self) -> None:
        if self.warn_fraction is not None and not 0 < self.warn_fraction < 1:
            raise ValueError(
                f"Watchdog.warn_fraction must be in (0, 1) (a fraction of the collective "
                f"timeout) or None for no warning, got {self.warn_fraction}"
            )
        if self.answer_s <= 0:
            raise ValueError(f"Watchdog.answer_s must be > 0 seconds, got {self.answer_s}")

    def poll_s(self, timeout_s: float) -> float:
        """How often a rank looks for questions: a fiftieth of the timeout, 20 ms to 1 s."""
        return min(1.0, max(0.02, timeout_s / 50))


class Channel:
    """The questions and answers of one rank, through the job's store."""

    def __init__(self, store: dist.Store, recorder: Recorder, watchdog: Watchdog) -> None:
        self.store = store
        self.recorder = recorder
        self.watchdog = watchdog
        self.poll_s = watchdog.poll_s(recorder.timeout_s)
        self._answered = 0
        self._lock = threading.Lock()
        store.add(_ASKS, 0)  # creates the counter, so that polling never blocks

    def answer_if_asked(self) -> None:
        asked = int(self.store.get(_ASKS))
        if asked > self._answered:
            self._answer(asked)

    def last_word(self) -> None:
        """This rank's program ended: leave an answer that satisfies every later question."""
        self._answer(_LAST_WORD, exited=True)

    def ask(self, *, meanwhile: Callable[[], None] | None = None) -> dict[int, PeerState]:
        """Every rank's state; ranks that did not answer within `Watchdog.answer_s` are left out
        (their last word is used if their program ended)."""
        asked = self.store.add(_ASKS, 1)
        me = self.recorder.rank
        answers = {me: self.recorder.state(asked)}
        pending = [r for r in range(self.recorder.world_size) if r != me]
        deadline = time.monotonic() + self.watchdog.answer_s
        while pending:
            for rank in list(pending):
                state = self._read(rank)
                if state is not None and state.answered >= asked:
                    answers[rank] = state
                    pending.remove(rank)
            if not pending or time.monotonic() > deadline:
                break
            if meanwhile is not None:
                meanwhile()
            time.sleep(self.poll_s)
        return answers

    def _answer(self, asked: int, *, exited: bool = False) -> None:
        with self._lock:
            if asked <= self._answered:
                return
            state = self.recorder.state(asked, exited=exited)
            answer = pickle.dumps(state)  # (a store takes bytes too, whatever its stub says)
            self.store.set(_ANSWER.format(self.recorder.rank), answer)  # type: ignore[arg-type]
            self._answered = asked

    def _read(self, rank: int) -> PeerState | None:
        key = _ANSWER.format(rank)
        if not self.store.check([key]):
            return None
        return pickle.loads(self.store.get(key))


class WatchdogThread:
    """Answers questions and, once per collective, warns when it has waited too long for a rank.

    ``warn`` builds and logs the warning (see `_hang.warn_if_late`); it runs on this thread.
    """

    def __init__(self, channel: Channel, warn: Callable[[Record], None]) -> None:
        self.channel = channel
        self._warn = warn
        fraction = channel.watchdog.warn_fraction
        self._warn_after = None if fraction is None else fraction * channel.recorder.timeout_s
        self._checked: Record | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shardkit-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * self.channel.poll_s + 1)

    def _loop(self) -> None:
        while not self._stop.wait(self.channel.poll_s):
            try:
                self.channel.answer_if_asked()
                self._check()
            except Exception as exc:  # the store went away: the job is ending
                logger.debug("watchdog of rank %d stops: %s", self.channel.recorder.rank, exc)
                return

    def _check(self) -> None:
        """Warn once per collective that has waited `_warn_after` seconds."""
        recorder = self.channel.recorder
        latest = recorder.latest
        if self._warn_after is None or latest is None or latest is self._checked:
            return
        if recorder.finished_at is not None:
            return
        if time.monotonic() - latest.started < self._warn_after:
            return
        self._checked = latest
        with contextlib.suppress(Exception):
            self._warn(latest)
