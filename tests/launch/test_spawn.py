"""spawn: results by rank, failures surfaced within seconds with the rank's traceback, no rank
left behind, and every way a job can stall ending in an error that says why."""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import platform
import re
import signal
import time

import pytest
import torch
import torch.distributed as dist

from shardkit.launch import RankFailedError, current, set_start_method, spawn

FAST = 3.0  # collective timeout for the failure tests, seconds


def _new_children(before: set) -> list:
    """Rank processes started since ``before`` that are still alive (the session's rank pools
    used by other tests are older)."""
    return [p for p in multiprocessing.active_children() if p not in before]


def _identity(rank: int, world_size: int, tag: str):
    info = current()
    return {
        "rank": rank,
        "world_size": world_size,
        "tag": tag,
        "dist_rank": dist.get_rank(),
        "backend": dist.get_backend(),
        "env": (os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["LOCAL_WORLD_SIZE"]),
        "host": info.host_index,
        "threads": torch.get_num_threads(),
        "death_signal": _death_signal(),
    }


def _death_signal() -> int | None:
    """The signal this process gets when its parent dies (Linux's PR_GET_PDEATHSIG), read
    without shardkit's loader; None where there is no glibc."""
    if platform.libc_ver()[0] != "glibc":
        return None
    signal_number = ctypes.c_int()
    ctypes.CDLL("libc.so.6").prctl(2, ctypes.byref(signal_number))  # PR_GET_PDEATHSIG
    return signal_number.value


def test_returns_values_by_rank():
    results = spawn(_identity, world_size=3, args=("x",), timeout=30)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["world_size"] == 3 and r["tag"] == "x" for r in results)
    assert [r["dist_rank"] for r in results] == [0, 1, 2]
    assert {r["backend"] for r in results} == {"gloo"}
    assert [r["env"] for r in results] == [("0", "0", "3"), ("1", "1", "3"), ("2", "2", "3")]
    if platform.libc_ver()[0] == "glibc":  # a rank dies with its parent: none outlives its job
        assert [r["death_signal"] for r in results] == [signal.SIGKILL] * 3


@pytest.mark.slow
def test_simulated_hosts():
    results = spawn(_identity, world_size=4, args=("h",), local_world_size=2, timeout=30)
    assert [r["host"] for r in results] == [0, 0, 1, 1]
    assert [r["env"][1] for r in results] == ["0", "1", "0", "1"]


@pytest.mark.slow
def test_lambda_and_closure_run_by_value():
    offset = 10
    assert spawn(lambda rank, ws: rank + offset, world_size=2, timeout=30) == [10, 11]


def _raise_on_rank_1(rank: int, world_size: int):
    if rank == 1:
        raise ValueError("bad batch on rank 1")
    dist.all_reduce(torch.ones(1))  # rank 0 waits here until it is stopped


def test_a_raising_rank_fails_the_job_fast_with_its_traceback():
    before = set(multiprocessing.active_children())
    start = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 of 2 failed in the function it ran") as info:
        spawn(_raise_on_rank_1, world_size=2, timeout=60)
    assert time.monotonic() - start < 20, "must not wait for rank 0's collective timeout"
    error = info.value
    assert error.rank == 1 and error.exc_type == "ValueError"
    assert "bad batch on rank 1" in str(error)
    assert "in _raise_on_rank_1" in error.remote_traceback
    assert isinstance(error.exception, ValueError)
    assert _new_children(before) == []


def _skip_collective(rank: int, world_size: int):
    if rank == 0:
        dist.all_reduce(torch.ones(1))


def test_a_rank_that_never_joins_a_collective_times_out_naming_it():
    before = set(multiprocessing.active_children())
    start = time.monotonic()
    with pytest.raises(RankFailedError, match=r"torch.distributed.all_reduce timed out"):
        spawn(_skip_collective, world_size=2, timeout=FAST)
    assert time.monotonic() - start < FAST + 20
    assert _new_children(before) == []


def _stuck_in_python(rank: int, world_size: int):
    if rank == 1:
        time.sleep(600)


def test_a_rank_stuck_outside_collectives_is_named_with_its_stack():
    before = set(multiprocessing.active_children())
    # the finished ranks wait 2 * timeout + 5 s: collective timeouts, more telling, come first;
    # no collective here, so the shortest timeout (joining has its own start-up allowance)
    with pytest.raises(RankFailedError) as info:
        spawn(_stuck_in_python, world_size=2, timeout=1.0)
    assert re.match(
        r"rank 1 of 2 kept the others waiting: .*rank\(s\) \[1\] did not finish within 7 s: "
        r".*:\nrank 1 has issued no collective yet, running:\n.*in _stuck_in_python\n\s+"
        r"time.sleep\(600\)",
        str(info.value),
        re.DOTALL,
    ), str(info.value)
    assert info.value.rank == 1
    assert _new_children(before) == []


def _exit_hard(rank: int, world_size: int):
    if rank == 0:
        os._exit(7)
    dist.barrier()


def test_a_rank_that_dies_is_reported_as_the_cause():
    with pytest.raises(RankFailedError, match=r"rank 0 of 2 failed: .*exited with code 7"):
        spawn(_exit_hard, world_size=2, timeout=FAST)


def test_join_failure_is_reported():
    with pytest.raises(RankFailedError, match=r"while joining the process group.*backend='nccl'"):
        spawn(_identity, world_size=2, args=("x",), backend="nccl", timeout=FAST)


def _unpicklable_result(rank: int, world_size: int):
    return lambda: rank


def test_unpicklable_result_is_an_error():
    with pytest.raises(RankFailedError, match=r"while sending its result to the parent"):
        spawn(_unpicklable_result, world_size=1, timeout=FAST)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"world_size": 0}, r"world_size must be >= 1, got 0"),
        (
            {"world_size": 3, "local_world_size": 2},
            r"local_world_size \(2\) must divide world_size \(3\)",
        ),
        ({"world_size": 2, "timeout": 0}, r"timeout must be > 0 seconds, got 0"),
    ],
)
def test_bad_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        spawn(_identity, args=("x",), **kwargs)


def _parent_pid(rank: int, world_size: int) -> int:
    return os.getppid()


def test_the_start_method_is_the_processs_setting():
    """The suite forks its ranks from a server (tests/conftest.py sets it): a forked rank's
    parent is the server, a spawned one's this process."""
    previous = set_start_method("forkserver")
    try:
        assert previous == "forkserver"
        assert spawn(_parent_pid, world_size=1, timeout=30) != [os.getpid()]
    finally:
        set_start_method(previous)


@pytest.mark.parametrize(
    ("method", "available", "pattern"),
    [
        ("fork", None, r"start method 'fork' is not one shardkit starts ranks with \(a rank "
         r"forked from a parent running torch's threads can deadlock\): it must be 'spawn'"),
        ("threads", None, r"start method 'threads' is not one .*: it must be 'spawn' \(the "
         r"default: .*\) or 'forkserver' .*; use set_start_method\('spawn'\)"),
        ("forkserver", ["spawn"], r"start method 'forkserver' is not available on \w+ \(it "
         r"offers \['spawn'\]\); use set_start_method\('spawn'\)"),
    ],
)  # fmt: skip
def test_a_start_method_shardkit_cannot_use_is_refused(method, available, pattern, monkeypatch):
    before = set_start_method("spawn")
    try:
        with monkeypatch.context() as patch, pytest.raises(ValueError, match=pattern):
            if available is not None:
                patch.setattr(multiprocessing, "get_all_start_methods", lambda: available)
            set_start_method(method)
        assert set_start_method(before) == "spawn"  # a refused method changes nothing
    finally:
        set_start_method(before)


class _Echo(RuntimeError):
    reports_other_rank = True


def _one_cause_one_echo(rank: int, world_size: int):
    if rank == 0:
        time.sleep(0.2)  # the cause arrives second
        raise ValueError("the real problem, on rank 0")
    raise _Echo("rank 0 failed, so rank 1 stops too")


def test_the_cause_is_reported_not_the_echo():
    with pytest.raises(
        RankFailedError,
        match=r"rank 0 of 2 failed in the function it ran: ValueError: the real problem",
    ) as info:
        spawn(_one_cause_one_echo, world_size=2, timeout=FAST)
    assert "rank 1 also failed: _Echo" in str(info.value)
