"""A late rank is named: the rank a collective waits for, the collective it has not reached, where
it is instead (its last collective, its stack, or that its function returned), in a warning at a
fraction of the timeout and in every waiting rank's error at the timeout, never 300 s later."""

from __future__ import annotations

import ctypes
import datetime
import logging
import multiprocessing
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.launch import LateRankError, RankFailedError, Watchdog, spawn
from tests.scripts import ROOT

FAST = 3.0  # collective timeout, seconds
# A whole test, ranks' start-up included (up to 30 s on a busy machine): far below the 300 s of
# the default timeout. The wait itself is checked in the message ("after 3.1 s").
WITHIN = 150


def _waited(message: str) -> float:
    """The seconds a rank says it waited, ``... timed out on rank 0 ... after 3.1 s``."""
    return float(re.search(r"timed out on rank \d .*?after (\d+\.\d) s", message).group(1))


def _together() -> None:
    """Collective #1: wait for every rank with a long timeout, since ranks start seconds apart
    on a busy machine (longer than FAST). Then the tests' own collectives are #2, #3, ..."""
    dist.barrier(timeout=datetime.timedelta(seconds=120))


def _sleeps_before_a_collective(rank: int, world_size: int):
    _together()
    comm.broadcast(torch.arange(2))
    if rank == 1:
        time.sleep(60)
    comm.all_reduce(torch.ones(4))


def test_a_rank_that_sleeps_before_a_collective_is_named_with_its_stack():
    before = set(multiprocessing.active_children())
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        spawn(_sleeps_before_a_collective, world_size=2, timeout=FAST)
    assert time.monotonic() - start < WITHIN
    error = info.value
    message = str(error)
    assert message.startswith("rank 1 of 2 kept the others waiting: rank 0 of 2 failed")
    assert re.search(
        r"shardkit.comm.all_reduce timed out on rank 0 \(group of 2 ranks\) after \d+\.\d s: "
        r"rank 1 has not reached collective #3 \(all_reduce \[4\] float32\); it is at #2 "
        r"\(broadcast \[2\] int64\) since \d+\.\d s, running:",
        message,
    ), message
    assert re.search(r"in _sleeps_before_a_collective\n\s+time.sleep\(60\)", message), message
    assert FAST <= _waited(message) < FAST + 2
    assert (error.rank, error.reporting_rank) == (1, 0)
    assert error.exception.late_ranks == (1,)
    assert [p for p in multiprocessing.active_children() if p not in before] == []


def _one_step_fewer(rank: int, world_size: int):
    """A training loop in which the last rank runs one step fewer; each other rank returns the
    error its own collective raised."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 3 if rank < world_size - 1 else 2
    _together()
    try:
        for _ in range(steps):
            model(torch.randn(8, 4)).pow(2).mean().backward()
            grads = torch.cat([p.grad.flatten() for p in model.parameters()])  # [5]
            comm.all_reduce(grads, op=dist.ReduceOp.AVG)
            optimizer.step()
            optimizer.zero_grad()
    except comm.CollectiveError as exc:
        return str(exc), exc.late_ranks
    return None


def test_a_rank_that_runs_one_step_fewer_is_named_in_every_waiting_rank():
    start = time.monotonic()
    results = spawn(_one_step_fewer, world_size=3, timeout=FAST)
    assert time.monotonic() - start < WITHIN
    assert results[2] is None
    for rank in (0, 1):
        message, late = results[rank]
        assert late == (2,)
        assert re.search(
            rf"shardkit.comm.all_reduce timed out on rank {rank} \(group of 3 ranks\) after "
            r"\d+\.\d s: rank 2 has not reached collective #4 \(all_reduce \[5\] float32\); its "
            r"function returned \d+\.\d s ago, after collective #3 \(all_reduce \[5\] float32\)",
            message,
        ), message
        assert FAST <= _waited(message) < FAST + 2


def _raw_sleeper(rank: int, world_size: int, async_op: bool):
    _together()
    dist.broadcast(torch.zeros(2, 3), src=0)
    if rank == 1:
        time.sleep(60)
    work = dist.all_reduce(torch.ones(4, dtype=torch.float64), async_op=async_op)
    if async_op:
        work.wait()


@pytest.mark.parametrize(
    "async_op",
    [False, pytest.param(True, marks=pytest.mark.slow)],  # each waits out a timeout: one by default
    ids=["blocking", "async"],
)
def test_raw_torch_distributed_calls_are_recorded_too(async_op):
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        spawn(_raw_sleeper, world_size=2, args=(async_op,), timeout=FAST)
    assert time.monotonic() - start < WITHIN
    call = "collective #3 \\(all_reduce \\[4\\] float64\\)" if async_op else "torch.distributed"
    assert re.search(
        rf"{call}.* timed out on rank 0 after \d+\.\d s \(timeout 3 s\): rank 1 has not reached "
        r"collective #3 \(all_reduce \[4\] float64\); it is at #2 \(broadcast \[2, 3\] float32\) "
        r"since \d+\.\d s, running:\n.*in _raw_sleeper\n\s+time.sleep\(60\)",
        str(info.value),
    ), str(info.value)
    assert FAST <= _waited(str(info.value)) < FAST + 2
    assert info.value.rank == 1
    # a blocking call raises the explained error; an async one's wait() raises torch's, which
    # the rank explains when it reports it
    assert isinstance(info.value.exception, LateRankError) != async_op


def _late_by_two_seconds(rank: int, world_size: int):
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("shardkit.launch").addHandler(handler)
    _together()
    comm.broadcast(torch.arange(2))
    if rank == 1:
        time.sleep(2.0)
    comm.all_reduce(torch.ones(4))
    logging.getLogger("shardkit.launch").removeHandler(handler)
    return records


def test_a_warning_names_the_late_rank_before_the_timeout():
    results = spawn(
        _late_by_two_seconds, world_size=2, timeout=10, watchdog=Watchdog(warn_fraction=0.05)
    )
    # (#1 may warn too, when the ranks start more than half a second apart)
    assert [line for line in results[1] if "collective #3" in line] == []
    warnings = [line for line in results[0] if "collective #3" in line]
    assert len(warnings) == 1, results[0]
    assert re.fullmatch(
        r"rank 0: collective #3 \(all_reduce \[4\] float32\) has waited \d+\.\d s of its 10 s "
        r"timeout: rank 1 has not reached collective #3 \(all_reduce \[4\] float32\); it is at "
        r"#2 \(broadcast \[2\] int64\) since \d+\.\d s, in _late_by_two_seconds "
        r"\(test_hang.py:\d+\)",
        warnings[0],
    ), warnings[0]


@pytest.mark.slow  # waits out a timeout to show an absence; the watchdog's presence is tested by default
def test_without_the_watchdog_nothing_is_recorded():
    with pytest.raises(RankFailedError, match=r"another rank did not call all_reduce") as info:
        spawn(_sleeps_before_a_collective, world_size=2, timeout=FAST, watchdog=None)
    assert info.value.rank == 0 and "has not reached" not in str(info.value)


def _holds_the_gil(rank: int, world_size: int):
    _together()
    if rank == 1:
        ctypes.PyDLL(None).sleep(30)  # native code that keeps the GIL: the rank cannot answer
    dist.barrier()


def test_a_rank_too_stuck_to_answer_is_named_with_its_faulthandler_stack():
    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        spawn(_holds_the_gil, world_size=2, timeout=FAST, watchdog=Watchdog(answer_s=1.0))
    assert time.monotonic() - start < WITHIN
    message = str(info.value)
    assert "rank 1 did not answer (stuck in native code that holds the GIL, or gone)" in message
    assert "--- stack of rank 1 (faulthandler, sent by spawn) ---" in message
    assert re.search(r'File ".*test_hang.py", line \d+ in _holds_the_gil', message), message
    assert info.value.rank == 1


TORCHRUN_JOB = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from shardkit.launch import init_from_env, shutdown

    info = init_from_env(timeout=3)
    try:
        for step in range(3 - info.rank):  # rank 1 runs one step fewer, then its program ends
            dist.all_reduce(torch.ones(4))
    except RuntimeError as exc:
        print("ERROR", exc, flush=True)
    shutdown()
    """
)


def test_under_torchrun_a_rank_whose_program_ended_is_named(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(TORCHRUN_JOB)
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script)],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert re.search(
        r"ERROR collective #3 \(all_reduce \[4\] float32\)|ERROR torch.distributed.all_reduce",
        result.stdout,
    ), result.stdout + result.stderr
    assert re.search(
        r"rank 1 has not reached collective #3 \(all_reduce \[4\] float32\); its program ended, "
        r"after collective #2 \(all_reduce \[4\] float32\)",
        result.stdout,
    ), result.stdout + result.stderr


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"warn_fraction": 1.0}, r"warn_fraction must be in \(0, 1\) .* got 1.0"),
        ({"warn_fraction": 0}, r"warn_fraction must be in \(0, 1\) .* got 0"),
        ({"answer_s": 0}, r"answer_s must be > 0 seconds, got 0"),
    ],
)
def test_bad_watchdog(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        Watchdog(**kwargs)


def test_a_program_without_shardkit_ranks_gets_no_report():
    from shardkit.launch import hang_report

    assert hang_report() is None
