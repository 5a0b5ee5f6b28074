"""Naming the late rank: compare this rank's records with the others' answers, and say it.

A rank waits in collective #k of a group. Each other member answered how many collectives it
issued on that group (see [Note: flight recorder] in `_flight`): below k, it has not reached #k,
and the report says where it is instead (its last collective, since when, its stack), or that
its function returned. A member at k or beyond reached #k; if its #k is another call, the ranks
disagree on it and the report says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardkit.launch._flight import PeerState, Record, Recorder

__all__ = [
    "HangReport",
    "LateRankError",
    "describe_ranks",
    "diagnose",
    "is_peer_loss",
    "is_timeout",
    "warning_line",
]

# What a backend says when a collective waited longer than the process group's timeout, and
# when the rank at the other end of a connection went away (gloo).
_TIMEOUT_WORDS = ("timed out", "timeout")
PEER_LOSS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def is_timeout(exc: BaseException) -> bool:
    message = str(exc).lower()
    return any(word in message for word in _TIMEOUT_WORDS)


def is_peer_loss(exc: BaseException) -> bool:
    message = str(exc)
    return any(words in message for words in PEER_LOSS)


@dataclass(frozen=True)
class HangReport:
    """Why a collective is waiting, from every rank's answer.

    Attributes:
        late_ranks: ranks that have not reached the collective, then those that did not answer
            (they may not have either).
        silent_ranks: the ranks that did not answer.
        lines: one sentence per late or disagreeing rank, each with the rank's stack indented
            below it when it answered with one.
        waited_s: how long this rank has waited in the collective.
        collective: ``#17 (all_reduce [4] float32)``, the one this rank waits in.
    """

    late_ranks: tuple[int, ...]
    lines: tuple[str, ...]
    waited_s: float
    collective: str
    silent_ranks: tuple[int, ...] = ()

    @property
    def text(self) -> str:
        if not self.lines:
            return (
                f"every rank reached collective {self.collective}; the backend is slow, or a "
                "rank's call differs in a way the records do not show (spawn(..., debug=True) "
                "compares every call)"
            )
        return "\n".join(self.lines)


class LateRankError(RuntimeError):
    """A collective timed out, or a peer closed its connection, while this rank waited; the
    message names the ranks that had not reached the collective and where they were.
    ``late_ranks`` lists them (empty if every rank reached it), ``report`` is the `HangReport`,
    ``backend_message`` what the backend said."""

    def __init__(self, message: str, report: HangReport, backend_message: str = "") -> None:
        super().__init__(message)
        self.report = report
        self.late_ranks = report.late_ranks
        self.silent_ranks = report.silent_ranks
        self.backend_message = backend_message

    def __reduce__(self) -> tuple[type, tuple[str, HangReport, str]]:
        return (LateRankError, (str(self), self.report, self.backend_message))


def diagnose(
    recorder: Recorder,
    answers: dict[int, PeerState],
    waiting: Record | None = None,
    *,
    asked_at: float,
) -> HangReport:
    """Compare this rank's collective ``waiting`` (default: its latest on every group) with the
    ``answers`` of the other ranks, asked for at time ``asked_at`` (`time.monotonic`)."""
    targets = [waiting] if waiting is not None else _latest_per_group(recorder)
    lines: list[str] = []
    late: list[int] = []
    silent: list[int] = []
    for record in targets:
        group = recorder.group(record.group)
        ranks = group.ranks if group is not None else tuple(range(recorder.world_size))
        label = group.label if group is not None else ""
        for rank in ranks:
            if rank == recorder.rank or rank in late or rank in silent:
                continue
            state = answers.get(rank)
            line = _compare(recorder, record, label, rank, state)
            if line is None:
                continue
            lines.append(line)
            if state is None:
                silent.append(rank)
            elif " has not reached " in line:  # not a disagreement: that names no culprit
                late.append(rank)
    main = waiting or recorder.latest
    waited = 0.0 if main is None else asked_at - main.started
    collective = "" if main is None else f"#{main.seq} ({main.describe()})"
    return HangReport(tuple(late + silent), tuple(lines), waited, collective, tuple(silent))


def _compare(
    recorder: Recorder, record: Record, label: str, rank: int, state: PeerState | None
) -> str | None:
    target = f"collective #{record.seq} ({record.describe()}){label}"
    if state is None:
        return (
            f"rank {rank} did not answer (stuck in native code that holds the GIL, or gone), "
            f"so it may not have reached {target}"
        )
    count = state.counts.get(record.group, 0)
    if count >= record.seq:
        theirs = state.record(record.group, record.seq)
        if theirs is None or theirs.description == record.describe():
            return None
        return (
            f"rank {rank} is at collective #{record.seq}{label} too, but it called "
            f"{theirs.description} where this rank called {record.describe()}: every rank must "
            "issue the same collectives in the same order"
        )
    first_missing = recorder.record(record.group, count + 1) or record
    missing = f"collective #{count + 1} ({first_missing.describe()}){label}"
    return f"rank {rank} has not reached {missing}; {_whereabouts(state, record.group)}"


def _whereabouts(state: PeerState, group: str | None, subject: str = "it") -> str:
    """Where the rank of ``state`` is: its last collective on ``group`` (None: on any group) and
    its stack, or that its function returned. ``subject`` names it: "it", or "rank 1"."""
    last = state.last_on(group) if group is not None else (state.records or (None,))[-1]
    whose = "its" if subject == "it" else f"{subject}'s"
    after = "before any collective"
    if last is not None:
        after = f"after collective #{last.seq} ({last.description})"
    if state.exited:
        return f"{whose} program ended, {after}"
    if state.finished_s_ago is not None:
        return f"{whose} function returned {state.finished_s_ago:.1f} s ago, {after}"
    on_group = " on this group" if group is not None else ""
    text = f"{subject} has issued no collective{on_group} yet"
    if last is not None:
        text = f"{subject} is at {last.position()}"
    if state.stack:
        text += ", running:\n" + _indent(state.stack)
    return text


def describe_ranks(answers: dict[int, PeerState], ranks: list[int]) -> str:
    """Where each of ``ranks`` is, one sentence each (with its stack), from their answers."""
    lines = []
    for rank in ranks:
        state = answers.get(rank)
        if state is None:
            lines.append(f"rank {rank} did not answer (stuck in native code that holds the GIL)")
        else:
            lines.append(_whereabouts(state, None, f"rank {rank}"))
    return "\n".join(lines)


def warning_line(recorder: Recorder, report: HangReport) -> str:
    """The early warning: one line, naming the late ranks and their innermost frame."""
    parts = []
    for line in report.lines:
        head, *stack = line.splitlines()
        frame = _innermost(stack)
        parts.append(head.removesuffix(", running:") + (f", in {frame}" if frame else ""))
    return (
        f"rank {recorder.rank}: collective {report.collective} has waited "
        f"{report.waited_s:.1f} s of its {recorder.timeout_s:g} s timeout: " + "; ".join(parts)
    )


def _innermost(stack: list[str]) -> str:
    """``_sleeper (test_hang.py:30)`` from traceback lines ``  File "...", line 30, in _sleeper``."""
    for line in reversed(stack):
        text = line.strip()
        if text.startswith("File "):
            path, _, rest = text[len('File "') :].partition('", line ')
            number, _, function = rest.partition(", in ")
            return f"{function} ({path.rsplit('/', 1)[-1]}:{number})"
    return ""


def _latest_per_group(recorder: Recorder) -> list[Record]:
    return [group.last for group in recorder.groups() if group.last is not None]


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
