"""Errors raised by shardkit's collectives."""

from __future__ import annotations

import torch.distributed as dist

from shardkit.launch import HangReport, hang_report

__all__ = ["CollectiveError", "collective_error"]


class CollectiveError(RuntimeError):
    """A collective failed or timed out; the message names it, the rank and the group size.

    After a timeout in a rank started by shardkit.launch, ``report`` says which ranks had not
    reached the collective and where they were (``late_ranks``); else it is None.
    """

    def __init__(self, message: str, report: HangReport | None = None) -> None:
        super().__init__(message)
        self.report = report
        self.late_ranks = report.late_ranks if report is not None else ()
        self.silent_ranks = report.silent_ranks if report is not None else ()


def collective_error(name: str, group: dist.ProcessGroup | None, exc: BaseException) -> Exception:
    """Wrap a backend error so that it says which collective broke, where and why."""
    if isinstance(exc, CollectiveError):
        return exc
    rank = dist.get_rank()
    size = dist.get_world_size(group)
    backend = getattr(exc, "backend_message", str(exc))
    timed_out = "timed out" in backend.lower() or "timeout" in backend.lower()
    # A blocking call's failure comes explained by the flight recorder (a `LateRankError` with
    # its report); an asynchronous one's (it fails in `wait()`) is explained here.
    report = getattr(exc, "report", None)
    if report is None and timed_out:
        report = hang_report(group if group is not None else dist.group.WORLD)
    where = f"shardkit.comm.{name} {'timed out' if timed_out else 'failed'} on rank {rank}"
    where += f" (group of {size} ranks)"
    if report is not None:
        return CollectiveError(
            f"{where} after {report.waited_s:.1f} s: {report.text}\nBackend said: {backend}",
            report,
        )
    message = str(exc)
    if timed_out:
        return CollectiveError(
            f"{where}: another rank did not call {name}, or called a different collective first. "
            "Every rank must issue the same collectives in the same order; SHARDKIT_DEBUG=1 (or "
            f"spawn(..., debug=True)) checks each call. Backend said: {message}"
        )
    return CollectiveError(f"{where}: {message}")
