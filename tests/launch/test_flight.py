"""The flight recorder's records and the report built from the ranks' answers, without processes:
numbering per group, late, disagreeing and silent ranks, and how each is said."""

from __future__ import annotations

import pytest
import torch

from shardkit.launch._flight import PeerState, Recorder, RecordView, _Group
from shardkit.launch._hang import diagnose, warning_line

WORLD, PAIR = "0", "1"


def _recorder(rank: int = 0) -> Recorder:
    """A recorder of rank ``rank`` of 3 that knows the world and the group of ranks [0, 2]."""
    recorder = Recorder(rank=rank, world_size=3, timeout_s=20)
    recorder._groups[None] = _Group(WORLD, (0, 1, 2), True, "")
    recorder._groups["pair"] = _Group(PAIR, (0, 2), True, " of group [0, 2]")
    return recorder


def _peer(rank: int, counts: dict[str, int], *records: RecordView, **kwargs) -> PeerState:
    return PeerState(rank=rank, answered=1, counts=counts, records=records, **kwargs)


def test_sequence_numbers_count_per_group():
    recorder = _recorder()
    first = recorder.enter("all_reduce", None, torch.ones(4), True)
    pair = recorder.enter("broadcast", "pair", torch.ones(2, 3, dtype=torch.int64), False)
    second = recorder.enter("barrier", None, None, True)
    assert (first.seq, pair.seq, second.seq) == (1, 1, 2)
    assert [r.describe() for r in recorder.ring] == [
        "all_reduce [4] float32",
        "broadcast [2, 3] int64",
        "barrier",
    ]
    assert recorder.enter("all_reduce", None, torch.tensor(1.0), True).describe() == (
        "all_reduce [] float32"
    )


def test_a_late_rank_on_a_subgroup_is_named_with_the_group():
    recorder = _recorder()
    recorder.enter("all_reduce", "pair", torch.ones(4), True)
    waiting = recorder.enter("all_reduce", "pair", torch.ones(8), True)
    behind = RecordView(PAIR, 1, "all_reduce [4] float32", 7.0, 6.5)
    answers = {2: _peer(2, {PAIR: 1, WORLD: 5}, behind, stack='  File "a.py", line 3, in f')}
    report = diagnose(recorder, answers, waiting, asked_at=waiting.started + 2.0)
    assert report.late_ranks == (2,)
    assert report.lines == (
        "rank 2 has not reached collective #2 (all_reduce [8] float32) of group [0, 2]; it is "
        'at #1 (all_reduce [4] float32) since 6.5 s, running:\n      File "a.py", line 3, in f',
    )
    assert warning_line(recorder, report) == (
        "rank 0: collective #2 (all_reduce [8] float32) has waited 2.0 s of its 20 s timeout: "
        "rank 2 has not reached collective #2 (all_reduce [8] float32) of group [0, 2]; it is "
        "at #1 (all_reduce [4] float32) since 6.5 s, in f (a.py:3)"
    )


def test_a_rank_that_called_another_collective_is_a_disagreement_not_a_late_rank():
    recorder = _recorder()
    waiting = recorder.enter("all_reduce", None, torch.ones(4), True)
    other = RecordView(WORLD, 1, "broadcast [4] float32", 1.0, None)
    answers = {1: _peer(1, {WORLD: 1}, other), 2: _peer(2, {WORLD: 1}, other)}
    report = diagnose(recorder, answers, waiting, asked_at=waiting.started)
    assert report.late_ranks == ()
    assert report.lines[0] == (
        "rank 1 is at collective #1 too, but it called broadcast [4] float32 where this rank "
        "called all_reduce [4] float32: every rank must issue the same collectives in the same "
        "order"
    )


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ({"finished_s_ago": 4.0}, "its function returned 4.0 s ago, after collective #1 (barrier)"),
        ({"exited": True}, "its program ended, after collective #1 (barrier)"),
    ],
)
def test_a_rank_whose_function_returned_is_named_as_such(state, said):
    recorder = _recorder()
    recorder.enter("barrier", None, None, True)
    waiting = recorder.enter("all_reduce", None, torch.ones(4), True)
    done = RecordView(WORLD, 1, "barrier", 9.0, 8.0)
    answers = {1: _peer(1, {WORLD: 2}, done), 2: _peer(2, {WORLD: 1}, done, **state)}
    report = diagnose(recorder, answers, waiting, asked_at=waiting.started)
    assert report.lines == (
        f"rank 2 has not reached collective #2 (all_reduce [4] float32); {said}",
    )


def test_ranks_that_did_not_answer_come_after_the_late_ones():
    recorder = _recorder()
    waiting = recorder.enter("all_reduce", None, torch.ones(4), True)
    report = diagnose(recorder, {2: _peer(2, {})}, waiting, asked_at=waiting.started)
    assert report.late_ranks == (2, 1) and report.silent_ranks == (1,)
    assert report.lines[0].startswith("rank 1 did not answer (stuck in native code")
    assert report.lines[1] == (
        "rank 2 has not reached collective #1 (all_reduce [4] float32); it has issued no "
        "collective on this group yet"
    )


def test_when_every_rank_reached_it_the_report_says_so():
    recorder = _recorder()
    waiting = recorder.enter("all_reduce", None, torch.ones(4), True)
    same = RecordView(WORLD, 1, "all_reduce [4] float32", 1.0, None)
    answers = {1: _peer(1, {WORLD: 1}, same), 2: _peer(2, {WORLD: 1}, same)}
    report = diagnose(recorder, answers, waiting, asked_at=waiting.started)
    assert report.late_ranks == () and report.lines == ()
    assert report.text.startswith("every rank reached collective #1 (all_reduce [4] float32)")
