"""[Note: gloo at exit]: the collectives remember what they hand to gloo, and `drain` waits until
no C++ holder is left on those tensors (a view's base stands in for a gloo worker here); so do
torch.distributed's own collectives once `watch_torch_collectives` wrapped them. The exit itself
(a worker that lets go while the interpreter finalizes aborts the process) is tested under
``shardkit run`` in tests/compat/test_run.py."""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

from shardkit import comm
from shardkit.comm import _exit


@pytest.fixture(autouse=True)
def _forget():
    _exit._RECENT.clear()
    yield
    _exit._RECENT.clear()


def test_drain_waits_until_a_holder_taken_after_the_hand_over_lets_go():
    tensor = torch.ones(4)
    _exit.remember(tensor)
    holder = [tensor.view(4)]  # holds the tensor from C++, as a worker holding its work does
    del tensor
    releaser = threading.Timer(0.3, holder.clear)
    start = time.monotonic()
    releaser.start()
    assert _exit.drain(wait_s=10.0)
    waited = time.monotonic() - start
    releaser.join()
    assert 0.25 < waited < 5.0, waited
    assert not _exit._RECENT


def test_drain_gives_up_after_its_wait_when_a_holder_stays():
    tensor = torch.ones(4)
    _exit.remember(tensor)
    kept = tensor.view(4)
    start = time.monotonic()
    assert not _exit.drain(wait_s=0.2)
    assert 0.15 < time.monotonic() - start < 5.0
    del kept


def test_drain_does_not_wait_for_holders_that_were_there_before_the_hand_over():
    tensor = torch.ones(4)
    before = tensor.view(4)  # e.g. a parameter's hook: not the backend's
    _exit.remember(tensor)
    start = time.monotonic()
    assert _exit.drain(wait_s=10.0)
    assert time.monotonic() - start < 1.0
    del before


def test_drain_skips_tensors_that_are_gone():
    _exit.remember(torch.ones(4))
    assert _exit.drain(wait_s=10.0)


def _collectives_remember(rank: int, world_size: int) -> list[int]:
    _exit._RECENT.clear()
    x = torch.arange(2.0 * 2 * world_size).view(-1, 2)[:, 0]  # not contiguous: gloo gets a copy
    counts = []
    for call in (
        lambda: comm.all_to_all_single(x),  # even split: 2 rows a rank
        lambda: comm.all_gather_into_tensor(x),
        lambda: comm.reduce_scatter_tensor(x.repeat(world_size)),
        lambda: comm.all_reduce(x),
        lambda: comm.broadcast(x, src=0),
    ):
        before = len(_exit._RECENT)
        call()
        counts.append(len(_exit._RECENT) - before)
    assert _exit.drain(wait_s=10.0)
    return counts


@pytest.mark.parametrize("world_size", [1, 2])
def test_every_collective_remembers_the_tensors_it_hands_to_gloo(run_ranks, world_size):
    for counts in run_ranks(_collectives_remember, world_size):
        assert all(n >= 1 for n in counts), counts


def _torch_collectives_remember(rank: int, world_size: int) -> dict[str, bool]:
    """Which of torch's own collectives left their tensors to wait for at exit, once watched;
    whether a second watch wrapped nothing twice and unwatching gave torch its own back."""
    torchs = dist.all_reduce  # (the launcher's recording wrapper in these ranks)
    _exit._RECENT.clear()
    comm.watch_torch_collectives()
    comm.watch_torch_collectives()
    try:
        checks = {"wrapped once": getattr(dist.all_reduce, "__wrapped__", None) is torchs}
        summed, mine = torch.ones(3), torch.ones(2)
        gathered = [torch.zeros(2) for _ in range(world_size)]
        calls = {
            "all_reduce": (lambda: dist.all_reduce(summed), [summed]),
            "all_gather": (lambda: dist.all_gather(gathered, mine), [*gathered, mine]),
            "broadcast": (lambda: dist.broadcast(summed, src=0), [summed]),
            "all_gather_object": (lambda: dist.all_gather_object([None] * world_size, rank), []),
        }
        for name, (call, tensors) in calls.items():
            before = len(_exit._RECENT)
            call()
            new = [ref() for ref, _ in list(_exit._RECENT)[before:]]
            checks[name] = bool(new) and all(any(t is n for n in new) for t in tensors)
        assert _exit.drain(wait_s=10.0)
    finally:
        _exit.unwatch_torch_collectives()
    checks["torch's own back"] = dist.all_reduce is torchs
    return checks


def test_torchs_own_collectives_remember_their_tensors_once_watched(run_ranks):
    for checks in run_ranks(_torch_collectives_remember, 2):
        assert all(checks.values()), checks
