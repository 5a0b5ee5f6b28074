"""How a failure inside a rank reaches the parent process."""

from __future__ import annotations

import os
import pickle
import traceback
from dataclasses import dataclass

__all__ = ["RankFailedError", "RendezvousTimeoutError", "describe_exception"]


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
    return RankFailure(
        rank=rank,
        phase=phase,
        exc_type=type(exc).__qualname__,
        message=_explain_timeout(exc),
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        pickled_exception=pickled,
        secondary=bool(getattr(exc, "reports_other_rank", False)),
    )


_C10D_FILE = os.path.join("torch", "distributed", "distributed_c10d.py")


def _explain_timeout(exc: BaseException) -> str:
    """Name the torch.distributed call that timed out; gloo's own message does not."""
    message = str(exc)
    if "timed out" not in message.lower():
        return message
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


class RankFailedError(RuntimeError):
    """A rank started by `spawn` or `RankPool` failed; carries that rank's traceback.

    Attributes:
        rank: the rank whose failure is reported (the first to fail in its own code).
        world_size: number of ranks in the job.
        exc_type: name of the exception class raised in the rank.
        remote_traceback: the traceback text printed in the rank.
        exception: the exception object itself when it could be pickled, else None.
        other_failures: the failures of other ranks seen at the same time.
    """

    def __init__(self, failure: RankFailure, world_size: int, others: list[RankFailure]) -> None:
        self.rank = failure.rank
        self.world_size = world_size
        self.exc_type = failure.exc_type
        self.remote_traceback = failure.traceback
        self.exception = failure.exception()
        self.other_failures = others
        super().__init__(_format(failure, world_size, others))


def _format(failure: RankFailure, world_size: int, others: list[RankFailure]) -> str:
    where = {
        "join": "while joining the process group",
        "fn": "in the function it ran",
        "finish": "while waiting for the other ranks to finish",
        "result": "while sending its result to the parent",
        "exit": "",
    }[failure.phase]
    head = f"rank {failure.rank} of {world_size} failed {where}: {failure.exc_type}: "
    head = head.replace("failed : ", "failed: ") + failure.message
    lines = [head]
    if failure.traceback:
        lines += ["", f"--- traceback of rank {failure.rank} ---", failure.traceback.rstrip()]
    for other in others:
        lines.append(f"(rank {other.rank} also failed: {other.exc_type}: {_first_line(other)})")
    return "\n".join(lines)


def _first_line(failure: RankFailure) -> str:
    return failure.message.splitlines()[0] if failure.message else ""
