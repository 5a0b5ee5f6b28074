"""How a failure inside a rank reaches the parent process."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import time
import traceback
from dataclasses import dataclass

from shardkit.launch._intercept import explain

__all__ = [
    "STACK_SIGNAL",
    "RankFailedError",
    "RendezvousTimeoutError",
    "describe_exception",
    "dump_stacks",
    "stack_file",
]

# The signal on which a rank started by spawn dumps its Python stack into `stack_file`.
STACK_SIGNAL = signal.SIGUSR1
# How long the parent gives faulthandler to write the stacks it asked for.
_DUMP_WAIT_S = 0.5


class RendezvousTimeoutError(TimeoutError):
    """Some ranks did not reach a synchronisation point before the timeout."""


@dataclass(frozen=True)
class RankFailure:
    """One rank's failure, as sent from the rank to the parent.

    ``phase`` is where it happened: ``"join"`` (process group set-up), ``"fn"`` (the user's
    function), ``"finish"`` (waiting for the other ranks to finish), ``"exit"`` (the process died
    without a word, e.g. killed by a signal).
    """

    rank: int
    phase: str
    exc_type: str
    message: str
    traceback: str
    pickled_exception: bytes | None = None
    # The error only reports that another rank failed (the exception class sets
    # `reports_other_rank = True`); the other rank's failure is the one to show.
    secondary: bool = False
    # A collective timed out waiting for these ranks (the exception's `late_ranks`, see
    # `_hang`); the first is the one `RankFailedError` blames. `silent_ranks` did not answer.
    late_ranks: tuple[int, ...] = ()
    silent_ranks: tuple[int, ...] = ()

    def exception(self) -> BaseException | None:
        if self.pickled_exception is None:
            return None
        try:
            return pickle.loads(self.pickled_exception)
        except Exception:
            return None


def describe_exception(exc: BaseException, *, rank: int, phase: str) -> RankFailure:
    """Capture ``exc`` (being handled now) in a form that crosses process boundaries."""
    try:
        pickled = pickle.dumps(exc)
        pickle.loads(pickled)
    except Exception:
        pickled = None
    explained = _explain_timeout(exc)
    return RankFailure(
        rank=rank,
        phase=phase,
        exc_type=type(exc).__qualname__,
        message=str(explained),
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        pickled_exception=pickled,
        secondary=bool(getattr(exc, "reports_other_rank", False)),
        late_ranks=tuple(getattr(explained, "late_ranks", ())),
        silent_ranks=tuple(getattr(explained, "silent_ranks", ())),
    )


_C10D_FILE = os.path.join("torch", "distributed", "distributed_c10d.py")


def _explain_timeout(exc: BaseException) -> str | BaseException:
    """A timeout (or a peer's connection closed) named by the late ranks in its message and
    ``late_ranks`` (``exc`` itself if it is already): from the flight recorder where the rank has
    one (an async collective fails in ``work.wait()``, outside the recorder's wrappers), else a
    message with the name of the torch.distributed call (gloo's own lacks it)."""
    message = str(exc)
    if hasattr(exc, "late_ranks"):
        return exc
    explained = explain(exc)
    if explained is not None:
        return explained
    if "timed out" not in message.lower():
        return exc
    collective = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename.endswith(_C10D_FILE) and code.co_name != "wrapper":
            collective = code.co_name
            break
        tb = tb.tb_next
    if collective is None:
        return message
    return (
        f"torch.distributed.{collective} timed out: another rank did not call {collective}. "
        "Every rank must issue the same collectives in the same order (spawn(..., debug=True) "
        f"checks each one). Backend said: {message}"
    )


def stack_file(store_path: str, rank: int) -> str:
    """Where rank ``rank`` dumps its stack on `STACK_SIGNAL` (beside the rendezvous store)."""
    return os.path.join(os.path.dirname(store_path), f"stack-{rank}")


def dump_stacks(pids: dict[int, int], store_path: str) -> dict[int, str]:
    """Ask the ranks ``{rank: pid}`` for their stacks (faulthandler needs no GIL, so this works
    where a rank is too stuck to answer the flight recorder's question) and read them."""
    for pid in pids.values():
        with contextlib.suppress(OSError):
            os.kill(pid, STACK_SIGNAL)
    time.sleep(_DUMP_WAIT_S)
    stacks = {}
    for rank in pids:
        with contextlib.suppress(OSError), open(stack_file(store_path, rank)) as dump:
            stacks[rank] = dump.read().strip()
    return {rank: stack for rank, stack in stacks.items() if stack}


class RankFailedError(RuntimeError):
    """A rank started by `spawn` or `RankPool` failed; carries that rank's traceback.

    Attributes:
        rank: the rank to blame: the first to fail in its own code, or, when a collective timed
            out, the first rank that had not reached it (``reporting_rank`` then timed out).
        reporting_rank: the rank whose exception and traceback these are.
        world_size: number of ranks in the job.
        exc_type: name of the exception class raised in the rank.
        remote_traceback: the traceback text printed in the rank.
        exception: the exception object itself when it could be pickled, else None.
        other_failures: the failures of other ranks seen at the same time.
        stacks: the Python stacks of late ranks that did not answer, dumped by `faulthandler`
            when `spawn` signalled them, by rank.
    """

    def __init__(
        self,
        failure: RankFailure,
        world_size: int,
        others: list[RankFailure],
        stacks: dict[int, str] | None = None,
    ) -> None:
        self.rank = failure.late_ranks[0] if failure.late_ranks else failure.rank
        self.reporting_rank = failure.rank
        self.world_size = world_size
        self.exc_type = failure.exc_type
        self.remote_traceback = failure.traceback
        self.exception = failure.exception()
        self.other_failures = others
        self.stacks = stacks or {}
        super().__init__(_format(failure, world_size, others, self.stacks))


def _format(
    failure: RankFailure, world_size: int, others: list[RankFailure], stacks: dict[int, str]
) -> str:
    where = {
        "join": "while joining the process group",
        "fn": "in the function it ran",
        "finish": "while waiting for the other ranks to finish",
        "result": "while sending its result to the parent",
        "exit": "",
    }[failure.phase]
    head = f"rank {failure.rank} of {world_size} failed {where}: {failure.exc_type}: "
    head = head.replace("failed : ", "failed: ") + failure.message
    if failure.late_ranks:
        late = ", ".join(str(r) for r in failure.late_ranks)
        late = f"ranks {late}" if len(failure.late_ranks) > 1 else f"rank {late}"
        head = f"{late} of {world_size} kept the others waiting: {head}"
    lines = [head]
    for rank, stack in sorted(stacks.items()):
        lines += ["", f"--- stack of rank {rank} (faulthandler, sent by spawn) ---", stack.rstrip()]
    if failure.traceback:
        lines += ["", f"--- traceback of rank {failure.rank} ---", failure.traceback.rstrip()]
    for other in others:
        lines.append(f"(rank {other.rank} also failed: {other.exc_type}: {_first_line(other)})")
    return "\n".join(lines)


def _first_line(failure: RankFailure) -> str:
    return failure.message.splitlines()[0] if failure.message else ""
